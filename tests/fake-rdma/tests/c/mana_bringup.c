/* The MANA bring-up a DPDK-like PMD does (DPDK net/mana's order: context, allocators, PD,
 * parent domain, MR, RX CQs + WQs + indirection table + RSS QP, TX CQ + QP, manadv_init_obj),
 * then teardown. Built against the real rdma-core headers and linked against the real
 * libibverbs/libmana/libmlx5: when it runs on the fake, the loader picked the fake.
 *
 * usage: mana_bringup bringup   full sequence; exit 0 OK, 2 no device, 1 a step failed
 *        mana_bringup errno     the error table: every check prints "ok" or "FAIL"
 *        mana_bringup traffic   bring-up, then one frame out and one in through the queues
 *                               (the peer end of port 1's wire answers the frame it sees)
 *        mana_bringup inline    as traffic, with the engine inline: kick handles on the three
 *                               queues (fake_rdma_kick_open), the device's work done by this
 *                               thread's kicks; the handles are kicked and closed after the
 *                               queues and the context are gone
 *        mana_bringup fork      ibv_fork_init first, then registrations: which pages are
 *                               MADV_DONTFORK (VmFlags "dc" in /proc/self/smaps) as they come
 *                               and go
 *        mana_bringup forkenv   the same without calling ibv_fork_init (RDMAV_FORK_SAFE=1 in
 *                               the environment does it at the first ibv_get_device_list)
 *        mana_bringup nofree    bring-up, then the RSS QP destroyed with the context's free
 *                               callback reset to NULL (v44: -EINVAL; main calls it: a crash)
 * Every mode prints "allocs A frees F null_frees N live L" at the end (frees = buffers given
 * back, null_frees = free(NULL) calls: libmana frees an RSS QP's send buffer, which is NULL;
 * live = the fake's live objects, -1 when not on the fake), and before that "engines E
 * threads T" after the teardown (the fake's device-model engines and their threads). */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/manadv.h>
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "check.h"

static int allocs, frees, null_frees, alloc_null, alloc_misaligned, fails;
static size_t sizes[32];

static void *q_alloc(size_t size, void *data)
{
	void *p;
	(void)data;
	if (alloc_null)
		return NULL;
	if (posix_memalign(&p, 4096, size + 4096))
		return NULL;
	memset(p, 0, size + 4096);
	if (allocs < 32)
		sizes[allocs] = size;
	allocs++;
	printf("  alloc(%zu)\n", size);
	return alloc_misaligned ? (char *)p + 64 : p;
}

static void q_free(void *p, void *data)
{
	(void)data;
	if (!p) {
		null_frees++;
		return;
	}
	frees++;
	if (((uintptr_t)p & 4095) == 64)
		p = (char *)p - 64;
	free(p);
}

static int live(void)
{
	int (*f)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "fake_rdma_live_objects");
	return f ? f() : -1;
}

/* the fake's running device-model engines, -1 when not on the fake */
static int engines(void)
{
	int (*f)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "fake_rdma_engines");
	return f ? f() : -1;
}

/* threads of this process named like the fake's engine threads ("fakenic-D-P") */
static int engine_threads(void)
{
	char path[300], comm[32];
	struct dirent *e;
	int n = 0;
	DIR *d = opendir("/proc/self/task");
	if (!d)
		return -1;
	while ((e = readdir(d))) {
		FILE *f;
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
		f = fopen(path, "r");
		if (!f)
			continue;
		if (fgets(comm, sizeof(comm), f) && strncmp(comm, "fakenic-", 8) == 0)
			n++;
		fclose(f);
	}
	closedir(d);
	return n;
}

/* the fake's engines that run on a thread of their own (not inline), -1 when not on the fake */
static int fake_threads(void)
{
	int (*f)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "fake_rdma_engine_threads");
	return f ? f() : -1;
}

/* The fake's inline engines (fake-only symbols: real rdma-core has none). With handles
 * open, every wait for the device kicks them, as a PMD's bursts do. */
static void *(*kick_open)(struct ibv_context *, int, uint32_t);
static void (*kick)(void *);
static void (*kick_close)(void *);
static void *kicks[3];
static int nkicks;

static void kick_all(void)
{
	int i;
	for (i = 0; i < nkicks; i++)
		kick(kicks[i]);
}

static const char *profile(void)
{
	const char *p = getenv("FAKE_RDMA_PROFILE");
	return p && *p ? p : "v44";
}

/* 1 when the mapping holding `p` is MADV_DONTFORK ("dc" in its VmFlags), 0 when not, -1
 * when /proc/self/smaps does not show it */
static int dontfork(const void *p)
{
	char line[512];
	int found = 0, ret = -1;
	FILE *f = fopen("/proc/self/smaps", "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 && strchr(line, '-') < strchr(line, ' ')) {
			found = (uintptr_t)p >= lo && (uintptr_t)p < hi;
			continue;
		}
		if (found && strncmp(line, "VmFlags:", 8) == 0) {
			ret = strstr(line, " dc") != NULL;
			break;
		}
	}
	fclose(f);
	return ret;
}




static uint8_t key[40] = { 0x2c, 0xc6, 0x81, 0xd1, 0x5b, 0xdb, 0xf4, 0xf7, 0xfc, 0xa2,
			   0x83, 0x19, 0xdb, 0x1a, 0x3e, 0x94, 0x6b, 0x9e, 0x38, 0xd9,
			   0x2c, 0x9c, 0x03, 0xd1, 0xad, 0x99, 0x44, 0xa7, 0xd9, 0x56,
			   0x3d, 0x59, 0x06, 0x3c, 0x25, 0xf3, 0xfc, 0x1f, 0xdc, 0x2a };

struct world {
	struct ibv_context *ctx;
	struct ibv_pd *pd, *parent;
	struct ibv_mr *mr;
	void *mem;
	struct ibv_cq *rx_cq[2], *tx_cq;
	struct ibv_wq *wq[2];
	struct ibv_rwq_ind_table *ind;
	struct ibv_qp *rss, *tx;
	/* what manadv_init_obj said about the queues */
	struct manadv_qp mq;
	struct manadv_cq mc, rc[2];
	struct manadv_rwq mw[2];
};

static struct ibv_cq *cq(struct ibv_context *ctx, int n)
{
	return ibv_create_cq(ctx, n, NULL, NULL, 0);
}

static struct ibv_wq *wq(struct world *w, struct ibv_pd *pd, struct ibv_cq *c, uint32_t wr,
			 uint32_t sge)
{
	struct ibv_wq_init_attr a = { .wq_type = IBV_WQT_RQ, .max_wr = wr, .max_sge = sge,
				      .pd = pd, .cq = c };
	return ibv_create_wq(w->ctx, &a);
}

static struct ibv_qp *tx_qp(struct ibv_pd *pd, struct ibv_cq *c, uint32_t wr, uint32_t sge)
{
	struct ibv_qp_init_attr a = { .send_cq = c, .recv_cq = c, .qp_type = IBV_QPT_RAW_PACKET,
				      .cap = { .max_send_wr = wr, .max_send_sge = sge } };
	return ibv_create_qp(pd, &a);
}

static struct ibv_qp *rss_qp(struct world *w, struct ibv_pd *pd, struct ibv_rwq_ind_table *t,
			     uint8_t func, uint8_t key_len)
{
	struct ibv_qp_init_attr_ex a = {
		.qp_type = IBV_QPT_RAW_PACKET,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_IND_TABLE |
			     IBV_QP_INIT_ATTR_RX_HASH,
		.pd = pd,
		.rwq_ind_tbl = t,
		.rx_hash_conf = { .rx_hash_function = func, .rx_hash_key_len = key_len,
				  .rx_hash_key = key,
				  .rx_hash_fields_mask = IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4 },
	};
	return ibv_create_qp_ex(w->ctx, &a);
}

static struct ibv_rwq_ind_table *ind(struct world *w, struct ibv_wq **wqs, uint32_t log)
{
	struct ibv_rwq_ind_table_init_attr a = { .log_ind_tbl_size = log, .ind_tbl = wqs };
	return ibv_create_rwq_ind_table(w->ctx, &a);
}

static void teardown(struct world *w)
{
	int i;
	if (w->tx)
		ibv_destroy_qp(w->tx);
	if (w->tx_cq)
		ibv_destroy_cq(w->tx_cq);
	if (w->rss)
		ibv_destroy_qp(w->rss);
	if (w->ind)
		ibv_destroy_rwq_ind_table(w->ind);
	for (i = 0; i < 2; i++) {
		if (w->wq[i])
			ibv_destroy_wq(w->wq[i]);
		if (w->rx_cq[i])
			ibv_destroy_cq(w->rx_cq[i]);
	}
	if (w->mr)
		ibv_dereg_mr(w->mr);
	if (w->parent)
		ibv_dealloc_pd(w->parent);
	if (w->pd)
		ibv_dealloc_pd(w->pd);
	memset(&w->pd, 0, sizeof(*w) - offsetof(struct world, pd));
}

#define STEP(what, cond)                                                                  \
	do {                                                                              \
		if (!(cond)) {                                                            \
			printf("FAILED at %s: errno %d (%s)\n", what, errno, strerror(errno)); \
			goto out;                                                         \
		}                                                                         \
		printf("%s: ok\n", what);                                                 \
	} while (0)

static int bringup(struct world *w)
{
	struct manadv_ctx_allocators al = { .alloc = q_alloc, .free = q_free, .data = (void *)5 };
	struct ibv_parent_domain_init_attr pa = { .comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT,
						  .pd_context = (void *)(uintptr_t)1 };
	struct ibv_device_attr_ex dx;
	struct ibv_port_attr port;
	struct manadv_obj obj;
	struct manadv_qp mq;
	struct manadv_cq mc, rc[2];
	struct manadv_rwq mw[2];
	int i, ok = 0;

	errno = ibv_query_device_ex(w->ctx, NULL, &dx);
	STEP("ibv_query_device_ex", errno == 0);
	printf("  max_qp_wr %d max_cqe %d ports %u rss table %u\n", dx.orig_attr.max_qp_wr,
	       dx.orig_attr.max_cqe, dx.orig_attr.phys_port_cnt,
	       dx.rss_caps.max_rwq_indirection_table_size);
	errno = ibv_query_port(w->ctx, 1, &port);
	STEP("ibv_query_port", errno == 0 && port.state == IBV_PORT_ACTIVE &&
				       port.link_layer == IBV_LINK_LAYER_ETHERNET);
	errno = manadv_set_context_attr(w->ctx, MANADV_CTX_ATTR_BUF_ALLOCATORS, &al);
	STEP("manadv_set_context_attr", errno == 0);
	STEP("ibv_alloc_pd", (w->pd = ibv_alloc_pd(w->ctx)) && w->pd->context == w->ctx);
	pa.pd = w->pd;
	STEP("ibv_alloc_parent_domain", (w->parent = ibv_alloc_parent_domain(w->ctx, &pa)));
	if (posix_memalign(&w->mem, 4096, 1 << 20))
		goto out;
	STEP("ibv_reg_mr", (w->mr = ibv_reg_mr(w->pd, w->mem, 1 << 20, IBV_ACCESS_LOCAL_WRITE)) &&
				   w->mr->addr == w->mem && w->mr->length == 1 << 20);
	for (i = 0; i < 2; i++) {
		STEP("ibv_create_cq(rx)", (w->rx_cq[i] = cq(w->ctx, 256)));
		STEP("ibv_create_wq", (w->wq[i] = wq(w, w->parent, w->rx_cq[i], 256, 1)));
	}
	WANT_RET(EOPNOTSUPP, ibv_modify_wq(w->wq[0], &(struct ibv_wq_attr){
							     .attr_mask = IBV_WQ_ATTR_STATE,
							     .wq_state = IBV_WQS_RDY }));
	STEP("ibv_create_rwq_ind_table", (w->ind = ind(w, w->wq, 1)));
	STEP("ibv_create_qp_ex(rss)",
	     (w->rss = rss_qp(w, w->parent, w->ind, IBV_RX_HASH_FUNC_TOEPLITZ, 40)));
	STEP("ibv_create_cq(tx)", (w->tx_cq = cq(w->ctx, 256)));
	STEP("ibv_create_qp(tx)", (w->tx = tx_qp(w->parent, w->tx_cq, 256, 1)));
	WANT_RET(EOPNOTSUPP, ibv_modify_qp(w->tx, &(struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS },
					   IBV_QP_STATE));
	CHECK(w->tx->state == IBV_QPS_RESET, "qp->state stays RESET after a failed modify");

	memset(&obj, 0, sizeof(obj));
	obj.qp.in = w->tx;
	obj.qp.out = &mq;
	obj.cq.in = w->tx_cq;
	obj.cq.out = &mc;
	errno = manadv_init_obj(&obj, MANADV_OBJ_QP | MANADV_OBJ_CQ);
	STEP("manadv_init_obj(tx)", errno == 0);
	for (i = 0; i < 2; i++) {
		memset(&obj, 0, sizeof(obj));
		obj.rwq.in = w->wq[i];
		obj.rwq.out = &mw[i];
		obj.cq.in = w->rx_cq[i];
		obj.cq.out = &rc[i];
		errno = manadv_init_obj(&obj, MANADV_OBJ_RWQ | MANADV_OBJ_CQ);
		STEP("manadv_init_obj(rx)", errno == 0);
	}
	printf("tx: sq_buf %p sq_count %u sq_size %u sq_id %u tx_vp_offset %u db_page %p | cq count %u cq_id %u\n",
	       mq.sq_buf, mq.sq_count, mq.sq_size, mq.sq_id, mq.tx_vp_offset, mq.db_page, mc.count,
	       mc.cq_id);
	for (i = 0; i < 2; i++)
		printf("rx%d: wq count %u size %u wq_id %u db_page %p | cq count %u cq_id %u\n", i,
		       mw[i].count, mw[i].size, mw[i].wq_id, mw[i].db_page, rc[i].count, rc[i].cq_id);
	CHECK(mq.sq_count == 256 && mq.sq_size == 8192 && mq.sq_id != 0, "tx queue: 256 WQEs in 8192 bytes, an id");
	CHECK(mc.count == 256 && mc.cq_id != 0, "tx cq: 256 entries, id set by the QP");
	CHECK(mw[0].count == 256 && mw[0].size == 8192 && mw[0].wq_id && mw[1].wq_id &&
		      mw[0].wq_id != mw[1].wq_id,
	      "rx queues: 256 WQEs in 8192 bytes, ids set by the RSS QP");
	CHECK(rc[0].cq_id && rc[1].cq_id && rc[0].cq_id != rc[1].cq_id, "rx cqs: ids set by the RSS QP");
	CHECK(mq.db_page && mq.db_page == mw[0].db_page && mw[0].db_page == mw[1].db_page,
	      "one doorbell page for every queue of the context");
	CHECK(allocs == 6 && sizes[0] == 16384 && sizes[1] == 8192 && sizes[4] == 16384 &&
		      sizes[5] == 8192,
	      "allocator asked for 16384 per 256-entry CQ and 8192 per 256-WQE queue");

	/* out-of-order teardown is refused, and leaves everything usable */
	WANT_RET(EBUSY, ibv_destroy_cq(w->tx_cq));
	WANT_RET(EBUSY, ibv_destroy_rwq_ind_table(w->ind));
	WANT_RET(EBUSY, ibv_destroy_wq(w->wq[0]));
	WANT_RET(EBUSY, ibv_dealloc_pd(w->pd));
	w->mq = mq;
	w->mc = mc;
	for (i = 0; i < 2; i++) {
		w->mw[i] = mw[i];
		w->rc[i] = rc[i];
	}
	ok = fails == 0;
out:
	return ok;
}

/* The datapath through the fake's device model, as a driver drives the queues that
 * manadv_init_obj describes. Formats from the MANA spec (pmd::hw::mana has the same, as
 * field tables): a WQE is an 8-byte header (dword 1: num_sge [7:0], inline OOB size / 4
 * [10:8]), an 8-byte OOB (TX short OOB: vcq_num [31:8] of dword 0; VSQ_frame = sq_id
 * [23:10] in [23:10] and the vPort offset in [31:24] of dword 1; zero on RX) and 16-byte
 * SGEs (address, memory key, size). A doorbell is one 64-bit store into the context's
 * page, SQ at 0x000, RQ at 0x400: queue id [23:0], producer position in bytes [63:32]. A
 * CQE is 64 bytes: cqe_type [5:0] of dword 0, RX packet length [15:0] at byte 8, and the
 * info dword at byte 60 with wq_num [23:0] and owner bits [31:29] (1 on the first lap). */
enum { WQE_BYTES = 32, SQ_DB = 0x000, RQ_DB = 0x400, CQE_TX_OKAY = 32, CQE_RX_OKAY = 1 };

static const uint8_t tx_frame[60] = { 0x02, 0, 0, 0, 0x10, 0x02, 0x02, 0, 0, 0, 0x10, 0x01,
				      0x88, 0xb5, 'f', 'r', 'o', 'm', ' ', 't', 'h', 'e', ' ',
				      'C', ' ', 'p', 'r', 'o', 'g', 'r', 'a', 'm' };

static void put32(uint8_t *p, uint32_t v)
{
	memcpy(p, &v, 4); /* little-endian hosts only, like the PMD */
}

static void write_wqe(void *ring, uint32_t oob0, uint32_t oob1, void *buf, uint32_t lkey,
		      uint32_t len)
{
	uint8_t wqe[WQE_BYTES] = { 0 };
	uint64_t a = (uintptr_t)buf;
	put32(wqe + 4, 1 | (8 / 4) << 8);
	put32(wqe + 8, oob0);
	put32(wqe + 12, oob1);
	memcpy(wqe + 16, &a, 8);
	put32(wqe + 24, lkey);
	put32(wqe + 28, len);
	memcpy(ring, wqe, sizeof(wqe)); /* the first WQE: at offset 0, no wrap */
}

static void ring_doorbell(void *page, size_t off, uint32_t id, uint32_t tail)
{
	/* the WQE is in memory before the NIC can see the doorbell */
	__atomic_store_n((uint64_t *)((char *)page + off),
			 (uint64_t)(id & 0xffffff) | (uint64_t)tail << 32, __ATOMIC_RELEASE);
}

/* the first CQE of `cq` once its owner bits say it is written, into `out`; 0 if none */
static int first_cqe(const struct manadv_cq *cq, uint8_t out[64])
{
	const uint8_t *e = cq->buf;
	uint32_t info = __atomic_load_n((const uint32_t *)(e + 60), __ATOMIC_ACQUIRE);
	if (info >> 29 != 1)
		return 0;
	memcpy(out, e, 64);
	return 1;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static int traffic(struct world *w)
{
	uint8_t *mem = w->mem, cqe[64];
	uint32_t lkey = w->mr->lkey, info, len, k;
	double deadline;
	int i, got = -1;

	if (nkicks)
		CHECK(engines() == 1 && engine_threads() == 0 && fake_threads() == 0,
		      "one device-model engine for port 1, inline (%d, %d, %d)", engines(),
		      engine_threads(), fake_threads());
	else
		CHECK(engines() == 1 && engine_threads() == 1,
		      "one device-model engine for port 1, on its thread (%d, %d)", engines(),
		      engine_threads());
	/* one 2048-byte buffer on each RQ (registered memory at 4 KiB and 8 KiB) */
	for (i = 0; i < 2; i++) {
		write_wqe(w->mw[i].buf, 0, 0, mem + 4096 * (i + 1), lkey, 2048);
		ring_doorbell(w->mw[i].db_page, RQ_DB, w->mw[i].wq_id, WQE_BYTES);
		/* the RQs share the page's RQ slot: an inline device sees each doorbell at the
		 * next kick (a PMD's next burst), before the next queue's overwrites it */
		kick_all();
	}
	/* one frame out of registered memory at 0 */
	memcpy(mem, tx_frame, sizeof(tx_frame));
	write_wqe(w->mq.sq_buf, w->mc.cq_id << 8,
		  ((w->mq.sq_id >> 10) & 0x3fff) << 10 | (w->mq.tx_vp_offset & 0xff) << 24, mem, lkey,
		  sizeof(tx_frame));
	ring_doorbell(w->mq.db_page, SQ_DB, w->mq.sq_id, WQE_BYTES);
	for (deadline = now() + 10; (kick_all(), !first_cqe(&w->mc, cqe)) && now() < deadline;)
		usleep(100);
	memcpy(&info, cqe + 60, 4);
	CHECK((cqe[0] & 0x3f) == CQE_TX_OKAY && (info & 0xffffff) == w->mq.sq_id,
	      "tx: one frame sent, its CQE is TX_OKAY for the SQ (type %d)", cqe[0] & 0x3f);
	/* the peer answers; the frame lands in an RX buffer with a CQE */
	for (deadline = now() + 20; got < 0 && now() < deadline;) {
		kick_all();
		for (i = 0; i < 2 && got < 0; i++)
			if (first_cqe(&w->rc[i], cqe))
				got = i;
		usleep(100);
	}
	CHECK(got >= 0, "rx: a CQE arrived");
	if (got < 0)
		return 0;
	memcpy(&info, cqe + 60, 4);
	memcpy(&len, cqe + 8, 4);
	len &= 0xffff;
	CHECK((cqe[0] & 0x3f) == CQE_RX_OKAY && (info & 0xffffff) == w->mw[got].wq_id && len <= 2048,
	      "rx%d: CQE RX_OKAY for its WQ (type %d)", got, cqe[0] & 0x3f);
	printf("rx%d: %u bytes:", got, len);
	for (k = 0; k < len && k < 2048; k++)
		printf(" %02x", mem[4096 * (got + 1) + k]);
	printf("\n");
	return fails == 0;
}

/* Kick handles on the TX queue and both RX queues: the engine goes inline (its thread
 * stopped), unknown ids get none. */
static int open_kicks(struct world *w)
{
	int i, before = live();

	kick_open = (void *(*)(struct ibv_context *, int, uint32_t))dlsym(RTLD_DEFAULT,
									  "fake_rdma_kick_open");
	kick = (void (*)(void *))dlsym(RTLD_DEFAULT, "fake_rdma_kick");
	kick_close = (void (*)(void *))dlsym(RTLD_DEFAULT, "fake_rdma_kick_close");
	CHECK(kick_open && kick && kick_close, "the fake exports the kick symbols");
	if (!kick_open || !kick || !kick_close)
		return 0;
	CHECK(engines() == 1 && engine_threads() == 1 && fake_threads() == 1,
	      "before any handle the engine runs on its thread (%d, %d, %d)", engines(),
	      engine_threads(), fake_threads());
	WANT_NULL(ENOENT, kick_open(w->ctx, 0, w->mq.sq_id + 1000));
	WANT_NULL(ENOENT, kick_open(w->ctx, 1, w->mq.sq_id));
	WANT_NULL(ENOENT, kick_open(w->ctx, 0, w->mw[0].wq_id));
	WANT_NULL(ENOENT, kick_open(w->ctx, 1, 0));
	WANT_NULL(ENOENT, kick_open(NULL, 0, w->mq.sq_id));
	CHECK(fake_threads() == 1, "no handle, no switch: the engine keeps its thread");
	kicks[0] = kick_open(w->ctx, 0, w->mq.sq_id);
	CHECK(kicks[0] && engines() == 1 && engine_threads() == 0 && fake_threads() == 0,
	      "a TX handle: the engine runs inline, its thread gone (%d, %d, %d)", engines(),
	      engine_threads(), fake_threads());
	for (i = 0; i < 2; i++)
		kicks[1 + i] = kick_open(w->ctx, 1, w->mw[i].wq_id);
	CHECK(kicks[1] && kicks[2] && kicks[1] != kicks[2], "a handle per RX queue");
	CHECK(live() == before + 3, "handles count as live objects (%d, was %d)", live(), before);
	nkicks = 3;
	kick(NULL); /* nothing */
	return kicks[0] && kicks[1] && kicks[2];
}

static void errno_table(struct world *w)
{
	int v44 = strcmp(profile(), "main") != 0;
	struct manadv_ctx_allocators al = { .alloc = q_alloc, .free = q_free };
	struct manadv_ctx_allocators none = { 0 };
	struct ibv_parent_domain_init_attr pa = { .comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT,
						  .pd_context = (void *)(uintptr_t)1 };
	struct ibv_query_device_ex_input in = { .comp_mask = 1 };
	struct ibv_device_attr_ex dx;
	struct ibv_port_attr port;
	struct ibv_wq *wqs[128];
	struct manadv_obj obj;
	struct ibv_cq *c, *c2;
	struct ibv_wq *q;
	struct ibv_qp *qp;
	struct mlx5dv_obj mo;
	int i, before;

	WANT_RET(EINVAL, ibv_query_device_ex(w->ctx, &in, &dx));
	WANT_RET(EINVAL, ibv_query_port(w->ctx, 3, &port));
	WANT_RET(EOPNOTSUPP, manadv_set_context_attr(w->ctx, 1, &al));
	WANT_RET(EINVAL, manadv_init_obj(&obj, 8));
	/* libmlx5 finds the context from the first object named: none → EINVAL */
	memset(&mo, 0, sizeof(mo));
	WANT_RET(EINVAL, mlx5dv_init_obj(&mo, 0));

	/* no allocators yet */
	if (v44) {
		WANT_NULL(EINVAL, cq(w->ctx, 32));
	} else {
		c = cq(w->ctx, 32);
		CHECK(c != NULL, "main: a CQ without allocators gets provider memory");
		if (c)
			WANT_RET(0, ibv_destroy_cq(c));
	}
	w->pd = ibv_alloc_pd(w->ctx);

	/* fork: a registration before ibv_fork_init makes it too late in v44 (EINVAL, memory.c
	 * l. 137-138, too_late set by ibv_dontfork_range l. 715-723); main (v51+) returns 0 at
	 * once on a kernel that copies pinned pages on fork (l. 137-138) */
	{
		void *m = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		struct ibv_mr *mr = ibv_reg_mr(w->pd, m, 8192, IBV_ACCESS_LOCAL_WRITE);
		CHECK(mr && dontfork(m) == 0, "fork: a registration before ibv_fork_init is not marked MADV_DONTFORK");
		WANT_RET(v44 ? EINVAL : 0, ibv_fork_init());
		WANT_RET(IBV_FORK_UNNEEDED, ibv_is_fork_initialized());
		if (mr)
			WANT_RET(0, ibv_dereg_mr(mr));
		CHECK(dontfork(m) == 0, "fork: still unmarked after ibv_fork_init and the deregistration");
		munmap(m, 8192);
	}

	pa.pd = NULL;
	WANT_NULL(EINVAL, ibv_alloc_parent_domain(w->ctx, &pa));
	pa.pd = w->pd;
	pa.comp_mask |= IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS;
	WANT_NULL(v44 ? EINVAL : EOPNOTSUPP, ibv_alloc_parent_domain(w->ctx, &pa));
	pa.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
	w->parent = ibv_alloc_parent_domain(w->ctx, &pa);
	manadv_set_context_attr(w->ctx, MANADV_CTX_ATTR_BUF_ALLOCATORS, &al);

	/* CQs */
	WANT_NULL(EINVAL, cq(w->ctx, 257));
	alloc_null = 1;
	WANT_NULL(ENOMEM, cq(w->ctx, 32));
	alloc_null = 0;
	alloc_misaligned = 1;
	before = frees;
	WANT_NULL(EINVAL, cq(w->ctx, 32));
	CHECK(frees == before + 1, "the kernel's refusal gives the buffer back to the allocator");
	alloc_misaligned = 0;
	/* the uverbs core refuses a completion vector the device does not have (create_cq in
	 * uverbs_cmd.c, UVERBS_METHOD_CQ_CREATE): after libmana allocated, so the buffer goes
	 * back; -1 is 0xffffffff on the wire */
	before = frees;
	WANT_NULL(EINVAL, ibv_create_cq(w->ctx, 32, NULL, NULL, w->ctx->num_comp_vectors));
	WANT_NULL(EINVAL, ibv_create_cq(w->ctx, 32, NULL, NULL, -1));
	CHECK(w->ctx->num_comp_vectors == 1 && frees == before + 2,
	      "comp_vector >= num_comp_vectors (%d): EINVAL from the uverbs core, both buffers back",
	      w->ctx->num_comp_vectors);
	c = cq(w->ctx, 32);
	CHECK(c && c->cqe == 32 && sizes[allocs - 1] == 4096, "32-entry CQ: 4096 bytes");
	/* a MANA object's context has no mlx5 dv ops → EOPNOTSUPP */
	mo.cq.in = c;
	WANT_RET(EOPNOTSUPP, mlx5dv_init_obj(&mo, MLX5DV_OBJ_CQ));
	WANT_RET(EOPNOTSUPP, mlx5dv_query_device(w->ctx, &(struct mlx5dv_context){ 0 }));

	/* WQs */
	if (v44) { /* main moved these caps to the kernel, which has none for WQs */
		WANT_NULL(EINVAL, wq(w, w->parent, c, 257, 1));
		WANT_NULL(EINVAL, wq(w, w->parent, c, 256, 16));
	}
	/* create_flags: libibverbs refuses bits it does not know (cmd_wq.c l. 63-67, after
	 * libmana allocated: the buffer goes back); the known ones reach the kernel, whose
	 * mana_ib_create_wq never reads them */
	{
		struct ibv_wq_init_attr a = { .wq_type = IBV_WQT_RQ, .max_wr = 64, .max_sge = 1,
					      .pd = w->parent, .cq = c,
					      .comp_mask = IBV_WQ_INIT_ATTR_FLAGS,
					      .create_flags = IBV_WQ_FLAGS_RESERVED };
		before = frees;
		WANT_NULL(EOPNOTSUPP, ibv_create_wq(w->ctx, &a));
		CHECK(frees == before + 1, "create_flags: an unknown bit is refused, the buffer back");
		a.create_flags = IBV_WQ_FLAGS_CVLAN_STRIPPING | IBV_WQ_FLAGS_SCATTER_FCS |
				 IBV_WQ_FLAGS_DELAY_DROP | IBV_WQ_FLAGS_PCI_WRITE_END_PADDING;
		q = ibv_create_wq(w->ctx, &a);
		CHECK(q != NULL, "create_flags: the four known flags are taken (errno %d)", q ? 0 : errno);
		if (q)
			WANT_RET(0, ibv_destroy_wq(q));
	}
	q = wq(w, w->parent, c, 64, 1);
	CHECK(q && sizes[allocs - 1] == 4096, "64-WQE RQ: 4096 bytes");
	WANT_RET(EBUSY, ibv_destroy_cq(c));
	for (i = 0; i < 128; i++)
		wqs[i] = q;
	WANT_NULL(EINVAL, ind(w, wqs, 14)); /* uverbs: log size > 13 */

	/* RSS QP: not a parent domain, key length, hash function, table too big */
	w->ind = ind(w, wqs, 0);
	WANT_NULL(EINVAL, rss_qp(w, w->pd, w->ind, IBV_RX_HASH_FUNC_TOEPLITZ, 40));
	WANT_NULL(EINVAL, rss_qp(w, w->parent, w->ind, IBV_RX_HASH_FUNC_TOEPLITZ, 32));
	WANT_NULL(EINVAL, rss_qp(w, w->parent, w->ind, 2, 40));
	{
		struct ibv_rwq_ind_table *big = ind(w, wqs, 7);
		WANT_NULL(EINVAL, rss_qp(w, w->parent, big, IBV_RX_HASH_FUNC_TOEPLITZ, 40));
		ibv_destroy_rwq_ind_table(big);
	}

	/* TX QP */
	c2 = cq(w->ctx, 64);
	WANT_NULL(EINVAL, tx_qp(w->pd, c2, 64, 1));
	WANT_NULL(EINVAL, tx_qp(w->parent, c2, 257, 1));
	WANT_NULL(EINVAL, tx_qp(w->parent, c2, 64, 32)); /* v44: WQE > 512; main: kernel, > 30 SGEs */
	{
		struct ibv_qp_init_attr a = { .send_cq = c2, .recv_cq = c2, .qp_type = IBV_QPT_UD,
					      .cap = { .max_send_wr = 64, .max_send_sge = 1 } };
		WANT_NULL(v44 ? EINVAL : EOPNOTSUPP, ibv_create_qp(w->parent, &a));
	}
	pa.pd_context = (void *)(uintptr_t)3;
	{
		struct ibv_pd *bad_port = ibv_alloc_parent_domain(w->ctx, &pa);
		before = frees;
		WANT_NULL(EINVAL, tx_qp(bad_port, c2, 64, 1));
		CHECK(frees == before + 1, "a refused QP gives its send buffer back");
		ibv_dealloc_pd(bad_port);
	}
	w->rss = rss_qp(w, w->parent, w->ind, IBV_RX_HASH_FUNC_TOEPLITZ, 40);
	CHECK(w->rss != NULL, "an RSS QP over the one-entry table");
	qp = tx_qp(w->parent, c2, 64, 1);
	CHECK(qp != NULL, "64-WQE send queue");
	WANT_NULL(EINVAL, tx_qp(w->parent, c2, 64, 1)); /* the CQ already serves a queue */

	/* verbs this provider does not have */
	{
		struct ibv_cq_init_attr_ex ca = { .cqe = 32 };
		struct ibv_flow_attr fa = { .size = sizeof(fa), .port = 1 };
		WANT_NULL(EOPNOTSUPP, ibv_create_cq_ex(w->ctx, &ca));
		WANT_NULL(EOPNOTSUPP, ibv_create_flow(qp, &fa));
		WANT_RET(EOPNOTSUPP, ibv_req_notify_cq(c2, 0));
	}

	/* teardown quirks: v44 refuses destroy with the free callback unset (-EINVAL for CQ
	 * and QP, EINVAL for WQ) before asking the kernel */
	manadv_set_context_attr(w->ctx, MANADV_CTX_ATTR_BUF_ALLOCATORS, &none);
	if (v44) {
		WANT_RET(-EINVAL, ibv_destroy_qp(qp));
		WANT_RET(-EINVAL, ibv_destroy_qp(w->rss));
		WANT_RET(EINVAL, ibv_destroy_wq(q));
	}
	manadv_set_context_attr(w->ctx, MANADV_CTX_ATTR_BUF_ALLOCATORS, &al);
	/* libmana gives an RSS QP's send buffer back too: NULL (v44 qp.c:169; main qp.c:459) */
	before = frees;
	i = null_frees;
	if (w->rss)
		WANT_RET(0, ibv_destroy_qp(w->rss));
	w->rss = NULL;
	CHECK(frees == before && null_frees == i + 1,
	      "destroying the RSS QP calls free(NULL) once (frees +%d, free(NULL) +%d)", frees - before,
	      null_frees - i);
	WANT_RET(0, ibv_destroy_qp(qp));
	WANT_RET(0, ibv_destroy_cq(c2));
	WANT_RET(0, ibv_destroy_rwq_ind_table(w->ind));
	w->ind = NULL;
	WANT_RET(0, ibv_destroy_wq(q));
	WANT_RET(0, ibv_destroy_cq(c));
}

/* ibv_fork_init (unless `from_env`: RDMAV_FORK_SAFE did it), then registrations: v44 marks
 * each registered range MADV_DONTFORK while a registration covers it (memory.c l. 621-713);
 * main does not initialise on a kernel that copies on fork, so nothing is marked */
static void fork_mode(struct world *w, int from_env)
{
	int v44 = strcmp(profile(), "main") != 0;
	char *m;
	struct ibv_mr *a, *b;

	if (!from_env) {
		WANT_RET(0, ibv_fork_init());
		WANT_RET(0, ibv_fork_init()); /* initialised already */
	}
	WANT_RET(IBV_FORK_UNNEEDED, ibv_is_fork_initialized());
	w->pd = ibv_alloc_pd(w->ctx);
	m = mmap(NULL, 4 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!w->pd || m == MAP_FAILED) {
		CHECK(0, "fork: a PD and four pages");
		return;
	}
	WANT_NULL(EINVAL, ibv_reg_mr(w->pd, m, 4096, IBV_ACCESS_REMOTE_WRITE));
	CHECK(dontfork(m) == 0, "fork: a refused registration leaves its page unmarked");
	a = ibv_reg_mr(w->pd, m, 2 * 4096, IBV_ACCESS_LOCAL_WRITE);     /* pages 0-1 */
	b = ibv_reg_mr(w->pd, m + 4096 + 100, 8192, IBV_ACCESS_LOCAL_WRITE); /* pages 1-3 */
	CHECK(a && b, "fork: two overlapping registrations");
	CHECK(dontfork(m) == v44 && dontfork(m + 4096) == v44 && dontfork(m + 3 * 4096) == v44,
	      "fork: the registered pages are MADV_DONTFORK: %d %d %d (want %d)", dontfork(m),
	      dontfork(m + 4096), dontfork(m + 3 * 4096), v44);
	if (a)
		WANT_RET(0, ibv_dereg_mr(a));
	CHECK(dontfork(m) == 0 && dontfork(m + 4096) == v44,
	      "fork: the first deregistered: its own page unmarked, the shared one still %d (%d)",
	      v44, dontfork(m + 4096));
	if (b)
		WANT_RET(0, ibv_dereg_mr(b));
	CHECK(dontfork(m + 4096) == 0 && dontfork(m + 3 * 4096) == 0,
	      "fork: both deregistered: no page marked");
	munmap(m, 4 * 4096);
}

int main(int argc, char **argv)
{
	struct world w;
	struct ibv_device **list;
	int n = 0, i, ok = 0;
	const char *mode = argc > 1 ? argv[1] : "bringup";

	setvbuf(stdout, NULL, _IOLBF, 0);
	memset(&w, 0, sizeof(w));
	list = ibv_get_device_list(&n);
	printf("ibv_get_device_list: %d device(s)\n", list ? n : 0);
	if (!list || n == 0) {
		if (list)
			ibv_free_device_list(list);
		return 2;
	}
	for (i = 0; i < n; i++)
		printf("device %d: %s\n", i, ibv_get_device_name(list[i]));
	w.ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	if (!w.ctx) {
		printf("FAILED at ibv_open_device: errno %d\n", errno);
		return 1;
	}
	if (strcmp(mode, "errno") == 0) {
		errno_table(&w);
		ok = fails == 0;
	} else if (strcmp(mode, "fork") == 0 || strcmp(mode, "forkenv") == 0) {
		fork_mode(&w, strcmp(mode, "forkenv") == 0);
		ok = fails == 0;
	} else if (strcmp(mode, "nofree") == 0) {
		struct manadv_ctx_allocators none = { 0 },
					     al = { .alloc = q_alloc, .free = q_free, .data = (void *)5 };
		ok = bringup(&w);
		if (ok) {
			manadv_set_context_attr(w.ctx, MANADV_CTX_ATTR_BUF_ALLOCATORS, &none);
			printf("destroying the RSS QP with free unset\n");
			WANT_RET(-EINVAL, ibv_destroy_qp(w.rss));
			manadv_set_context_attr(w.ctx, MANADV_CTX_ATTR_BUF_ALLOCATORS, &al);
			ok = fails == 0;
		}
	} else {
		ok = bringup(&w);
		if (ok && strcmp(mode, "inline") == 0)
			ok = open_kicks(&w);
		if (ok && (strcmp(mode, "traffic") == 0 || strcmp(mode, "inline") == 0))
			ok = traffic(&w);
	}
	teardown(&w);
	kick_all(); /* the queues are gone: nothing to do */
	free(w.mem);
	printf("engines %d threads %d\n", engines(), engine_threads());
	printf("before close: live %d\n", live());
	ibv_close_device(w.ctx);
	printf("after close: engines %d threads %d\n", engines(), engine_threads());
	if (nkicks) {
		/* handles outlive their queues, context and engine; closing them leaves nothing */
		kick_all();
		for (i = 0; i < nkicks; i++)
			kick_close(kicks[i]);
		kick_close(NULL);
		CHECK(live() == 0, "handles closed after the context: nothing alive (%d)", live());
		ok = ok && fails == 0;
	}
	printf("allocs %d frees %d null_frees %d live %d\n", allocs, frees, null_frees, live());
	if (ok && allocs == frees && live() <= 0)
		printf("OK\n");
	return ok ? 0 : 1;
}
