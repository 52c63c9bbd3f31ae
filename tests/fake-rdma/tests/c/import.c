/* Sharing a MANA context with another process, through the real libibverbs API: what a
 * secondary gets from the primary's command descriptor (passed with SCM_RIGHTS; here a
 * dup, the same open file).
 *
 *   ibv_import_device(cmd fd)   -> NULL, EOPNOTSUPP (MANA has no import_context)
 *   ibv_import_device(a pipe)   -> NULL, EINVAL (not a character device)
 *   ibv_import_device(/dev/null)-> NULL, ENODEV (no device has its number)
 *   ibv_import_pd / ibv_import_mr on a MANA context -> NULL, EOPNOTSUPP (dummy ops)
 *   mmap(cmd fd, 0) twice       -> the same page (the context's doorbell page)
 *
 * Usage: import DEVICE (e.g. mana_0). Prints one line per check; exits 1 if one failed. */
static int fails;
#include "check.h"

#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	struct ibv_pd *pd;
	int i, n, fd, pipefd[2], null_fd;
	volatile uint64_t *a, *b;

	if (argc != 2)
		return 2;
	list = ibv_get_device_list(&n);
	for (i = 0; list && i < n; i++)
		if (!strcmp(ibv_get_device_name(list[i]), argv[1]))
			ctx = ibv_open_device(list[i]);
	CHECK(ctx != NULL, "open %s", argv[1]);
	if (!ctx)
		return 1;

	fd = dup(ctx->cmd_fd);
	WANT_NULL(EOPNOTSUPP, ibv_import_device(fd));
	CHECK(pipe(pipefd) == 0, "pipe");
	WANT_NULL(EINVAL, ibv_import_device(pipefd[0]));
	null_fd = open("/dev/null", O_RDONLY);
	WANT_NULL(ENODEV, ibv_import_device(null_fd));

	pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL, "alloc pd");
	WANT_NULL(EOPNOTSUPP, ibv_import_pd(ctx, pd->handle));
	WANT_NULL(EOPNOTSUPP, ibv_import_mr(pd, 1));
	ibv_unimport_pd(pd);
	WANT_RET(0, ibv_dealloc_pd(pd));

	a = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	b = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, ctx->cmd_fd, 0);
	CHECK(a != MAP_FAILED && b != MAP_FAILED, "map the command file's page 0 twice");
	if (a != MAP_FAILED && b != MAP_FAILED) {
		a[8] = 0x1234abcd5678ULL;
		CHECK(b[8] == 0x1234abcd5678ULL, "one page: a write through one mapping is seen "
						 "through the other");
		munmap((void *)a, 4096);
		munmap((void *)b, 4096);
	}
	close(fd);
	close(pipefd[0]);
	close(pipefd[1]);
	close(null_fd);
	WANT_RET(0, ibv_close_device(ctx));
	ibv_free_device_list(list);
	return fails ? 1 : 0;
}
