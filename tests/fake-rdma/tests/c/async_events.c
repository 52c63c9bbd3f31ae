/* Asynchronous events on the fake rdma-core, the way an application sees them through the
 * real libibverbs API: a non-blocking async fd that is readable exactly while events wait,
 * ibv_get_async_event / ibv_ack_async_event, ibv_query_port following the link, every
 * context of the device getting the device's events, a blocking fetch that waits, and a
 * removal that closes the channel.
 *
 * usage: async_events IBDEV_DIR   (the device's sysfs directory, where the knobs live)
 * Prints one line per observation; exits 0 when every step ran, 1 on a failed call. */
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *dir;

static void knob(const char *rel, const char *value)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", dir, rel);
	FILE *f = fopen(path, "w");
	if (!f) {
		perror(path);
		exit(1);
	}
	fprintf(f, "%s\n", value);
	fclose(f);
}

static int readable(int fd, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	return poll(&p, 1, ms) == 1 && (p.revents & POLLIN);
}

/* Waits (at most 2 s) for one event and prints it; returns its type. */
static int next_event(struct ibv_context *ctx, const char *tag)
{
	struct ibv_async_event ev;
	if (!readable(ctx->async_fd, 2000)) {
		printf("%s: no event within 2 s\n", tag);
		exit(1);
	}
	if (ibv_get_async_event(ctx, &ev)) {
		printf("%s: ibv_get_async_event failed: %s\n", tag, strerror(errno));
		exit(1);
	}
	printf("%s: event %d port %d\n", tag, (int)ev.event_type, ev.element.port_num);
	ibv_ack_async_event(&ev);
	return ev.event_type;
}

static void port_state(struct ibv_context *ctx, int port)
{
	struct ibv_port_attr a;
	if (ibv_query_port(ctx, port, &a)) {
		printf("ibv_query_port failed\n");
		exit(1);
	}
	printf("port %d state %d phys %d\n", port, (int)a.state, (int)a.phys_state);
}

static void *raise_later(void *arg)
{
	(void)arg;
	usleep(150 * 1000);
	knob("ports/2/fake_rdma_link", "up");
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 2)
		return 2;
	dir = argv[1];
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		return 1;
	struct ibv_context *ctx = ibv_open_device(list[0]);
	struct ibv_context *other = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	if (!ctx || !other)
		return 1;
	int fd = ctx->async_fd;
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	fcntl(other->async_fd, F_SETFL, fcntl(other->async_fd, F_GETFL) | O_NONBLOCK);

	struct ibv_async_event ev;
	int r = ibv_get_async_event(ctx, &ev);
	printf("idle: ret %d %s readable %d\n", r, r ? strerror(errno) : "-", readable(fd, 100));

	knob("ports/1/fake_rdma_link", "down");
	next_event(ctx, "p1 down");
	printf("after fetch: readable %d\n", readable(fd, 0));
	port_state(ctx, 1);
	port_state(ctx, 2);

	knob("ports/1/fake_rdma_link", "up");
	next_event(ctx, "p1 up");
	port_state(ctx, 1);
	knob("ports/2/fake_rdma_link", "down");
	next_event(ctx, "p2 down");
	knob("fake_rdma_fatal", "1");
	next_event(ctx, "fatal");

	/* Blocking: the fetch waits until the event comes. */
	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
	pthread_t t;
	pthread_create(&t, NULL, raise_later, NULL);
	if (ibv_get_async_event(ctx, &ev)) {
		printf("blocking fetch failed: %s\n", strerror(errno));
		return 1;
	}
	printf("blocking: event %d port %d\n", (int)ev.event_type, ev.element.port_num);
	ibv_ack_async_event(&ev);
	pthread_join(t, NULL);

	/* The other context of the device got the same events. */
	printf("other:");
	while (ibv_get_async_event(other, &ev) == 0) {
		printf(" %d/%d", (int)ev.event_type, ev.element.port_num);
		ibv_ack_async_event(&ev);
	}
	printf(" (then %s)\n", strerror(errno));

	/* Removal: the channel closes; reads fail with EIO and the fd stays readable. */
	knob("fake_rdma_fatal", "removed");
	int was = readable(fd, 2000);
	r = ibv_get_async_event(ctx, &ev);
	int e1 = errno;
	int still = readable(fd, 0);
	int r2 = ibv_get_async_event(ctx, &ev);
	printf("removed: readable %d, ret %d %s, still readable %d, again %d\n", was, r,
	       strerror(e1), still, r2);
	r = ibv_get_async_event(other, &ev);
	printf("removed other: ret %d %s\n", r, strerror(errno));

	ibv_close_device(other);
	ibv_close_device(ctx);
	printf("done\n");
	return 0;
}
