/* The mlx5 bring-up a DPDK-like PMD does on rdma-core direct verbs (DPDK net/mlx5's Verbs
 * order, spec mlx5.md §1): context, capabilities, buffer allocators, PD, MR, RX CQs + WQs +
 * indirection table + RSS QP + flow rules, TX CQ + raw QP through RESET → INIT → RTR → RTS,
 * mlx5dv_init_obj, then teardown in DPDK's order (§1.10). Built against the real rdma-core
 * headers and linked against the real libibverbs/libmlx5: when it runs on the fake, the
 * loader picked the fake.
 *
 * usage: mlx5_bringup bringup   the bring-up, every returned field checked
 *        mlx5_bringup errno     one case per rule of the errno table
 *        mlx5_bringup traffic   bring-up, then frames out and in through the queues, with a
 *                               peer on the port's wire (the Rust test; protocol below)
 *        mlx5_bringup kicked    as traffic, with the engine inline: kick handles on the SQ and
 *                               both RQs (fake_rdma_kick_open), the device's work done by
 *                               this thread's kicks, through the queues' resets too
 *        mlx5_bringup inline0   bring-up, then one SEND WQE without an inline header; prints
 *                               the TX CQE's opcode
 *        mlx5_bringup manadv    manadv_set_context_attr(BUF_ALLOCATORS) on an mlx5 context
 *                               (real libmana writes into the mlx5 context: the fake aborts)
 * Every mode prints "allocs A frees F live L" at the end (L = the fake's live objects, -1
 * when not on the fake), and "OK" when every check passed. */
#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <endian.h>
#include <errno.h>
#include <infiniband/manadv.h>
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "check.h"

static int fails;



/* a call that returns NULL and leaves errno as it was (libmlx5 sets none there) */
#define WANT_NULL_ERRNO_KEPT(call)                                                        \
	do {                                                                              \
		void *p_;                                                                 \
		int e_;                                                                   \
		errno = 4242;                                                             \
		p_ = (void *)(call);                                                      \
		e_ = errno;                                                               \
		CHECK(!p_ && e_ == 4242, "%s -> %p errno %d (want NULL, errno untouched)", \
		      #call, p_, e_);                                                     \
	} while (0)


/* ---- the application's queue-buffer allocator (mlx5dv_ctx_allocators) ---------------- */

struct rec {
	void *p;
	size_t size;
	int freed;
};
static struct rec recs[512];
static int allocs, frees, alloc_null, bad_frees, wrong_data;
static void *cur_data = (void *)0x5;

/* page-aligned, filled with 0xa5 so the provider's zeroing (or its absence) shows */
static void *q_alloc(size_t size, void *data)
{
	void *p;
	if (data != cur_data)
		wrong_data++;
	if (alloc_null)
		return NULL;
	if (posix_memalign(&p, 4096, size + 4096))
		return NULL;
	memset(p, 0xa5, size + 4096);
	if (allocs < 512)
		recs[allocs] = (struct rec){ p, size, 0 };
	allocs++;
	return p;
}

static void q_free(void *p, void *data)
{
	int i;
	if (data != cur_data)
		wrong_data++;
	if (!p) /* what a zero-byte allocation may have returned: free(NULL) is fine */
		return;
	for (i = 0; i < allocs && i < 512; i++)
		if (recs[i].p == p && !recs[i].freed) {
			recs[i].freed = 1;
			frees++;
			free(p);
			return;
		}
	bad_frees++;
}

/* the allocation holding `p`, or -1 */
static int rec_of(const void *p)
{
	int i;
	for (i = 0; i < allocs && i < 512; i++)
		if (!recs[i].freed && (const char *)p >= (char *)recs[i].p &&
		    (const char *)p < (char *)recs[i].p + (recs[i].size ? recs[i].size : 1))
			return i;
	return -1;
}

static size_t last_size(int back)
{
	return allocs - 1 - back >= 0 ? recs[allocs - 1 - back].size : (size_t)-1;
}

static int live(void)
{
	int (*f)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "fake_rdma_live_objects");
	return f ? f() : -1;
}

static int engines(void)
{
	int (*f)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "fake_rdma_engines");
	return f ? f() : -1;
}

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

static int main_profile(void)
{
	const char *p = getenv("FAKE_RDMA_PROFILE");
	return p && strcmp(p, "main") == 0;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static const uint8_t key[40] = { 0x2c, 0xc6, 0x81, 0xd1, 0x5b, 0xdb, 0xf4, 0xf7, 0xfc, 0xa2,
				 0x83, 0x19, 0xdb, 0x1a, 0x3e, 0x94, 0x6b, 0x9e, 0x38, 0xd9,
				 0x2c, 0x9c, 0x03, 0xd1, 0xad, 0x99, 0x44, 0xa7, 0xd9, 0x56,
				 0x3d, 0x59, 0x06, 0x3c, 0x25, 0xf3, 0xfc, 0x1f, 0xdc, 0x2a };

/* the port's MAC in the test worlds */
static const uint8_t port_mac[6] = { 0x02, 0, 0, 0, 0x50, 0x01 };

struct eth_rule {
	struct ibv_flow_attr attr;
	struct ibv_flow_spec_eth eth;
};

/* the specs follow the attr directly, as libibverbs walks them */
_Static_assert(offsetof(struct eth_rule, eth) == sizeof(struct ibv_flow_attr), "spec layout");

static struct ibv_flow *eth_flow(struct ibv_qp *qp, const uint8_t *dst, const uint8_t *mask)
{
	struct eth_rule r;
	memset(&r, 0, sizeof(r));
	r.attr.type = IBV_FLOW_ATTR_NORMAL;
	r.attr.size = sizeof(r);
	r.attr.num_of_specs = 1;
	r.attr.port = 1;
	r.eth.type = IBV_FLOW_SPEC_ETH;
	r.eth.size = sizeof(r.eth);
	memcpy(r.eth.val.dst_mac, dst, 6);
	memcpy(r.eth.mask.dst_mac, mask, 6);
	return ibv_create_flow(qp, &r.attr);
}

struct world {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	uint8_t *mem;
	struct ibv_cq *rx_cq[2], *tx_cq;
	struct ibv_wq *wq[2];
	struct ibv_rwq_ind_table *ind;
	struct ibv_qp *rss, *tx, *tx2;
	struct ibv_flow *flow[2];
	struct mlx5dv_qp mq, mq2;
	struct mlx5dv_cq mc, rc[2];
	struct mlx5dv_rwq mw[2];
};

static struct ibv_cq *dv_cq(struct ibv_context *ctx, int cqe, uint64_t mask, uint8_t fmt,
			    uint16_t cqe_size, uint32_t flags)
{
	struct ibv_cq_init_attr_ex a = { .cqe = cqe };
	struct mlx5dv_cq_init_attr d = { .comp_mask = mask, .cqe_comp_res_format = fmt,
					 .cqe_size = cqe_size, .flags = flags };
	struct ibv_cq_ex *c = mlx5dv_create_cq(ctx, &a, &d);
	return c ? ibv_cq_ex_to_cq(c) : NULL;
}

static struct ibv_wq *wq(struct world *w, struct ibv_cq *c, uint32_t wr, uint32_t sge)
{
	struct ibv_wq_init_attr a = { .wq_type = IBV_WQT_RQ, .max_wr = wr, .max_sge = sge,
				      .pd = w->pd, .cq = c };
	return ibv_create_wq(w->ctx, &a);
}

static struct ibv_rwq_ind_table *ind(struct world *w, struct ibv_wq **wqs, uint32_t log)
{
	struct ibv_rwq_ind_table_init_attr a = { .log_ind_tbl_size = log, .ind_tbl = wqs };
	return ibv_create_rwq_ind_table(w->ctx, &a);
}

static struct ibv_qp *rss_qp(struct world *w, struct ibv_rwq_ind_table *t, uint8_t func,
			     uint8_t key_len, uint64_t fields)
{
	struct ibv_qp_init_attr_ex a = {
		.qp_type = IBV_QPT_RAW_PACKET,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_IND_TABLE |
			     IBV_QP_INIT_ATTR_RX_HASH,
		.pd = w->pd,
		.rwq_ind_tbl = t,
		.rx_hash_conf = { .rx_hash_function = func, .rx_hash_key_len = key_len,
				  .rx_hash_key = (uint8_t *)key, .rx_hash_fields_mask = fields },
	};
	return ibv_create_qp_ex(w->ctx, &a);
}

/* a raw send QP through ibv_create_qp_ex; tso = max TSO header (0: none) */
static struct ibv_qp *tx_qp_ex(struct world *w, struct ibv_cq *c, uint32_t wr, uint32_t sge,
			       uint16_t tso, struct ibv_qp_init_attr_ex *out)
{
	struct ibv_qp_init_attr_ex a = {
		.send_cq = c, .recv_cq = c, .qp_type = IBV_QPT_RAW_PACKET,
		.cap = { .max_send_wr = wr, .max_send_sge = sge },
		.comp_mask = IBV_QP_INIT_ATTR_PD | (tso ? IBV_QP_INIT_ATTR_MAX_TSO_HEADER : 0),
		.pd = w->pd, .max_tso_header = tso,
	};
	struct ibv_qp *q = ibv_create_qp_ex(w->ctx, &a);
	if (out)
		*out = a;
	return q;
}

static int modify(struct ibv_qp *qp, enum ibv_qp_state s, int mask, uint8_t port)
{
	struct ibv_qp_attr a = { .qp_state = s, .port_num = port };
	return ibv_modify_qp(qp, &a, mask);
}

static int to_rts(struct ibv_qp *qp)
{
	return modify(qp, IBV_QPS_INIT, IBV_QP_STATE | IBV_QP_PORT, 1) ||
	       modify(qp, IBV_QPS_RTR, IBV_QP_STATE, 0) || modify(qp, IBV_QPS_RTS, IBV_QP_STATE, 0);
}

static int modify_wq(struct ibv_wq *q, enum ibv_wq_state s)
{
	struct ibv_wq_attr a = { .attr_mask = IBV_WQ_ATTR_STATE, .wq_state = s };
	return ibv_modify_wq(q, &a);
}

#define STEP(what, cond)                                                                  \
	do {                                                                              \
		if (!(cond)) {                                                            \
			printf("FAILED at %s: errno %d (%s)\n", what, errno, strerror(errno)); \
			fails++;                                                          \
			goto out;                                                         \
		}                                                                         \
		printf("%s: ok\n", what);                                                 \
	} while (0)

/* whether `p` is a doorbell record in an allocator page, at a cache-line slot */
static int in_dbr_page(const void *p)
{
	int r = rec_of(p);
	return r >= 0 && recs[r].size == 4096 && (((uintptr_t)p - (uintptr_t)recs[r].p) % 64) == 0;
}

static int dbr_slot(const void *p)
{
	int r = rec_of(p);
	return r < 0 ? -1 : (int)(((uintptr_t)p - (uintptr_t)recs[r].p) / 64);
}

static void teardown(struct world *w)
{
	int i;
	for (i = 0; i < 2; i++)
		if (w->flow[i])
			ibv_destroy_flow(w->flow[i]);
	if (w->rss)
		ibv_destroy_qp(w->rss);
	if (w->ind)
		ibv_destroy_rwq_ind_table(w->ind);
	for (i = 0; i < 2; i++)
		if (w->wq[i])
			ibv_destroy_wq(w->wq[i]);
	for (i = 0; i < 2; i++)
		if (w->rx_cq[i])
			ibv_destroy_cq(w->rx_cq[i]);
	if (w->tx)
		ibv_destroy_qp(w->tx);
	if (w->tx2)
		ibv_destroy_qp(w->tx2);
	if (w->tx_cq)
		ibv_destroy_cq(w->tx_cq);
	if (w->mr)
		ibv_dereg_mr(w->mr);
	if (w->pd)
		ibv_dealloc_pd(w->pd);
	memset(&w->pd, 0, sizeof(*w) - offsetof(struct world, pd));
}

static int bringup(struct world *w, uint16_t part)
{
	struct mlx5dv_ctx_allocators al = { .alloc = q_alloc, .free = q_free, .data = cur_data };
	struct ibv_device_attr_ex dx;
	struct ibv_device_attr da;
	struct ibv_port_attr port;
	struct mlx5dv_context dv;
	struct ibv_qp_init_attr_ex qa;
	struct ibv_qp_init_attr qa2 = { 0 };
	struct mlx5dv_obj obj;
	struct ibv_qp_attr qattr;
	struct ibv_qp_init_attr qinit;
	static const uint8_t ones[6] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };
	int i, k, ok = 0, before;
	unsigned long long bf_flag;

	errno = ibv_query_device_ex(w->ctx, NULL, &dx);
	STEP("ibv_query_device_ex", errno == 0);
	CHECK(dx.orig_attr.vendor_id == 0x2c9 && dx.orig_attr.vendor_part_id == part,
	      "vendor 0x%x part 0x%x", dx.orig_attr.vendor_id, dx.orig_attr.vendor_part_id);
	CHECK(dx.orig_attr.max_qp_wr == 32768 && dx.orig_attr.max_sge == 30 &&
		      dx.orig_attr.phys_port_cnt == 1,
	      "max_qp_wr %d max_sge %d ports %u", dx.orig_attr.max_qp_wr, dx.orig_attr.max_sge,
	      dx.orig_attr.phys_port_cnt);
	CHECK(dx.raw_packet_caps == (IBV_RAW_PACKET_CAP_CVLAN_STRIPPING | IBV_RAW_PACKET_CAP_IP_CSUM) &&
		      (dx.orig_attr.device_cap_flags & IBV_DEVICE_RAW_IP_CSUM),
	      "raw packet caps 0x%x, RAW_IP_CSUM", dx.raw_packet_caps);
	CHECK(dx.tso_caps.max_tso == 65536 &&
		      dx.tso_caps.supported_qpts == (1u << IBV_QPT_RAW_PACKET),
	      "tso caps %u for raw packet QPs", dx.tso_caps.max_tso);
	CHECK(dx.rss_caps.max_rwq_indirection_table_size == 2048 &&
		      dx.rss_caps.rx_hash_function == IBV_RX_HASH_FUNC_TOEPLITZ &&
		      (dx.rss_caps.rx_hash_fields_mask & IBV_RX_HASH_DST_PORT_UDP) &&
		      dx.rss_caps.supported_qpts == (1u << IBV_QPT_RAW_PACKET),
	      "rss caps: table %u, Toeplitz", dx.rss_caps.max_rwq_indirection_table_size);
	WANT_RET(0, ibv_query_device(w->ctx, &da));
	CHECK(da.vendor_part_id == part && strcmp(da.fw_ver, "16.35.2000") == 0,
	      "ibv_query_device: part 0x%x fw %s", da.vendor_part_id, da.fw_ver);

	memset(&dv, 0x5a, sizeof(dv));
	dv.comp_mask = MLX5DV_CONTEXT_MASK_CQE_COMPRESION | MLX5DV_CONTEXT_MASK_STRIDING_RQ |
		       MLX5DV_CONTEXT_MASK_CLOCK_INFO_UPDATE;
	WANT_RET(0, mlx5dv_query_device(w->ctx, &dv));
	CHECK(dv.version == 0 &&
		      dv.comp_mask == (MLX5DV_CONTEXT_MASK_CQE_COMPRESION |
				       MLX5DV_CONTEXT_MASK_STRIDING_RQ),
	      "mlx5dv_query_device: comp_mask out 0x%llx (the groups asked for and filled)",
	      (unsigned long long)dv.comp_mask);
	/* rdma-core main also says BlueFlame (MLX5DV_CONTEXT_FLAGS_BLUEFLAME, 1 << 8) */
	bf_flag = main_profile() ? 1ull << 8 : 0;
	if (part == 0x1013)
		CHECK(dv.flags == (MLX5DV_CONTEXT_FLAGS_CQE_V1 | bf_flag),
		      "ConnectX-4 flags 0x%llx: CQE v1, no MPW", (unsigned long long)dv.flags);
	else
		CHECK(dv.flags == (MLX5DV_CONTEXT_FLAGS_CQE_V1 | MLX5DV_CONTEXT_FLAGS_ENHANCED_MPW | bf_flag),
		      "flags 0x%llx: CQE v1, enhanced MPW", (unsigned long long)dv.flags);
	CHECK(dv.cqe_comp_caps.max_num == 64 &&
		      dv.cqe_comp_caps.supported_format == MLX5DV_CQE_RES_FORMAT_HASH,
	      "cqe compression: max %u, HASH", dv.cqe_comp_caps.max_num);
	CHECK(dv.striding_rq_caps.supported_qpts == 0 &&
		      dv.striding_rq_caps.max_single_stride_log_num_of_bytes == 0,
	      "no striding RQ");
	CHECK(dv.max_clock_info_update_nsec == 0x5a5a5a5a5a5a5a5aull,
	      "groups not filled are left alone");

	errno = ibv_query_port(w->ctx, 1, &port);
	STEP("ibv_query_port", errno == 0 && port.state == IBV_PORT_ACTIVE &&
				       port.link_layer == IBV_LINK_LAYER_ETHERNET);
	CHECK(port.active_mtu == IBV_MTU_1024 && port.gid_tbl_len == 256,
	      "port 1: active mtu %d (netdev 1500), %d GIDs", port.active_mtu, port.gid_tbl_len);

	errno = mlx5dv_set_context_attr(w->ctx, MLX5DV_CTX_ATTR_BUF_ALLOCATORS, &al);
	STEP("mlx5dv_set_context_attr", errno == 0);
	STEP("ibv_alloc_pd", (w->pd = ibv_alloc_pd(w->ctx)) && w->pd->context == w->ctx);
	if (posix_memalign((void **)&w->mem, 4096, 1 << 20))
		goto out;
	memset(w->mem, 0, 1 << 20);
	STEP("ibv_reg_mr", (w->mr = ibv_reg_mr(w->pd, w->mem, 1 << 20, IBV_ACCESS_LOCAL_WRITE)) &&
				   w->mr->addr == w->mem && w->mr->lkey);

	/* RX: two CQs (the first with compressed CQEs) and WQs, the table, the RSS QP */
	STEP("mlx5dv_create_cq(rx, compressed)",
	     (w->rx_cq[0] = dv_cq(w->ctx, 255, MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE,
				  MLX5DV_CQE_RES_FORMAT_HASH, 0, 0)));
	CHECK(w->rx_cq[0]->cqe == 255 && allocs == 2 && last_size(1) == 16384 && last_size(0) == 4096,
	      "rx CQ of 255: 256 entries, the ring (16384) then a doorbell-record page (4096)");
	STEP("ibv_create_wq", (w->wq[0] = wq(w, w->rx_cq[0], 256, 1)));
	CHECK(allocs == 3 && last_size(0) == 4096 && w->wq[0]->state == IBV_WQS_RESET,
	      "WQ of 256 × 1 SGE: a 4096-byte ring, its record in the same page, state RESET");
	STEP("ibv_create_cq(rx)", (w->rx_cq[1] = ibv_create_cq(w->ctx, 255, NULL, NULL, 0)));
	STEP("ibv_create_wq", (w->wq[1] = wq(w, w->rx_cq[1], 100, 3)));
	CHECK(last_size(0) == 8192, "WQ of 100 × 3 SGEs: 128 WQEs of 64 bytes, 8192 (got %zu)",
	      last_size(0));
	for (i = 0; i < 2; i++) {
		WANT_RET(0, modify_wq(w->wq[i], IBV_WQS_RDY));
		CHECK(w->wq[i]->state == IBV_WQS_RDY, "wq%d RDY", i);
		memset(&obj, 0, sizeof(obj));
		obj.rwq.in = w->wq[i];
		obj.rwq.out = &w->mw[i];
		obj.cq.in = w->rx_cq[i];
		obj.cq.out = &w->rc[i];
		STEP("mlx5dv_init_obj(rwq, cq)", mlx5dv_init_obj(&obj, MLX5DV_OBJ_RWQ | MLX5DV_OBJ_CQ) == 0);
	}
	CHECK(w->mw[0].wqe_cnt == 256 && w->mw[0].stride == 16 && w->mw[1].wqe_cnt == 128 &&
		      w->mw[1].stride == 64,
	      "rwq geometry: 256 × 16, 128 × 64");
	CHECK(rec_of(w->mw[0].buf) >= 0 && recs[rec_of(w->mw[0].buf)].p == w->mw[0].buf &&
		      ((uint8_t *)w->mw[0].buf)[0] == 0xa5,
	      "the WQ ring is the allocator's buffer, not zeroed by libmlx5");
	for (i = 0; i < 2; i++) {
		const uint8_t *c = w->rc[i].buf;
		int good = 1;
		for (k = 0; k < 256 * 64; k++)
			if (c[k] != ((k % 64) == 63 ? 0xf0 : 0))
				good = 0;
		CHECK(w->rc[i].cqe_cnt == 256 && w->rc[i].cqe_size == 64 && good &&
			      recs[rec_of(c)].p == c,
		      "rx cq%d: 256 × 64 bytes in the allocator's buffer, zeroed, op_own 0xf0", i);
		CHECK(w->rc[i].cq_uar && ((uintptr_t)w->rc[i].cq_uar & 4095) == 0,
		      "rx cq%d: the CQ UAR is a page", i);
	}
	CHECK(in_dbr_page(w->rc[0].dbrec) && dbr_slot(w->rc[0].dbrec) == 0 &&
		      dbr_slot(w->mw[0].dbrec) == 1 && dbr_slot(w->rc[1].dbrec) == 2 &&
		      dbr_slot(w->mw[1].dbrec) == 3 && rec_of(w->mw[1].dbrec) == rec_of(w->rc[0].dbrec),
	      "doorbell records: cache-line slots 0, 1, 2, 3 of one allocator page");
	CHECK(w->rc[0].dbrec[0] == 0 && w->rc[0].dbrec[1] == 0 && w->mw[0].dbrec[0] == 0,
	      "records start at 0");
	CHECK(w->rc[0].cqn && w->rc[1].cqn && w->rc[0].cqn != w->rc[1].cqn, "two CQ numbers");

	STEP("ibv_create_rwq_ind_table", (w->ind = ind(w, w->wq, 1)));
	STEP("ibv_create_qp_ex(rss)",
	     (w->rss = rss_qp(w, w->ind, IBV_RX_HASH_FUNC_TOEPLITZ, 40,
			      IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4 |
				      IBV_RX_HASH_SRC_PORT_TCP | IBV_RX_HASH_DST_PORT_TCP)));
	CHECK(w->rss->qp_num == 0 && w->rss->state == IBV_QPS_RESET, "RSS QP: no number, RESET");
	WANT_RET(EOPNOTSUPP, modify(w->rss, IBV_QPS_INIT, IBV_QP_STATE | IBV_QP_PORT, 1));
	STEP("ibv_create_flow(dst mac)", (w->flow[0] = eth_flow(w->rss, port_mac, ones)));
	STEP("ibv_create_flow(broadcast)", (w->flow[1] = eth_flow(w->rss, ones, ones)));

	/* TX: a CQ and a raw QP with a TSO header (ibv_create_qp_ex), and one without
	 * (ibv_create_qp) */
	before = allocs;
	STEP("ibv_create_cq(tx)", (w->tx_cq = ibv_create_cq(w->ctx, 63, NULL, NULL, 0)));
	CHECK(w->tx_cq->cqe == 63 && allocs == before + 1 && last_size(0) == 4096,
	      "tx CQ of 63: 64 entries in 4096 bytes (its record in the page)");
	STEP("ibv_create_qp_ex(tx)", (w->tx = tx_qp_ex(w, w->tx_cq, 512, 1, 192, &qa)));
	CHECK(allocs == before + 3 && last_size(1) == 0 && last_size(0) == 131072,
	      "raw QP: the RQ buffer asked for with 0 bytes, then the SQ's 131072");
	CHECK(qa.cap.max_send_wr == 512 && qa.cap.max_inline_data == 204 && qa.cap.max_recv_wr == 0,
	      "caps back: 512 WRs of 256 bytes (TSO header 192), inline %u", qa.cap.max_inline_data);
	STEP("ibv_create_qp(tx2)",
	     (qa2 = (struct ibv_qp_init_attr){ .send_cq = w->tx_cq, .recv_cq = w->tx_cq,
					       .qp_type = IBV_QPT_RAW_PACKET,
					       .cap = { .max_send_wr = 256, .max_send_sge = 1 } },
	      w->tx2 = ibv_create_qp(w->pd, &qa2)));
	CHECK(qa2.cap.max_send_wr == 256 && qa2.cap.max_inline_data == 12 && last_size(0) == 16384,
	      "ibv_create_qp: 256 WRs of one WQEBB, 16384 bytes, inline %u", qa2.cap.max_inline_data);
	WANT_RET(EINVAL, modify(w->tx, IBV_QPS_RTR, IBV_QP_STATE, 0));
	WANT_RET(0, to_rts(w->tx));
	CHECK(w->tx->state == IBV_QPS_RTS, "tx QP in RTS");
	memset(&obj, 0, sizeof(obj));
	w->mq.comp_mask = MLX5DV_QP_MASK_RAW_QP_HANDLES | MLX5DV_QP_MASK_UAR_MMAP_OFFSET;
	obj.qp.in = w->tx;
	obj.qp.out = &w->mq;
	obj.cq.in = w->tx_cq;
	obj.cq.out = &w->mc;
	STEP("mlx5dv_init_obj(qp, cq)", mlx5dv_init_obj(&obj, MLX5DV_OBJ_QP | MLX5DV_OBJ_CQ) == 0);
	memset(&obj, 0, sizeof(obj));
	w->mq2.comp_mask = MLX5DV_QP_MASK_RAW_QP_HANDLES;
	obj.qp.in = w->tx2;
	obj.qp.out = &w->mq2;
	STEP("mlx5dv_init_obj(qp2)", mlx5dv_init_obj(&obj, MLX5DV_OBJ_QP) == 0);
	printf("tx: sq %p wqe_cnt %u stride %u sqn %u tisn %u bf %p size %u | cq cqn %u cqe_cnt %u\n",
	       w->mq.sq.buf, w->mq.sq.wqe_cnt, w->mq.sq.stride, w->mq.sqn, w->mq.tisn, w->mq.bf.reg,
	       w->mq.bf.size, w->mc.cqn, w->mc.cqe_cnt);
	CHECK(w->mq.sq.wqe_cnt == 2048 && w->mq.sq.stride == 64 && w->mq.rq.wqe_cnt == 0 &&
		      recs[rec_of(w->mq.sq.buf)].p == w->mq.sq.buf && recs[rec_of(w->mq.sq.buf)].size == 131072,
	      "sq: 2048 WQEBBs of 64 in the allocator's separate SQ buffer");
	CHECK(((uint8_t *)w->mq.sq.buf)[0] == 0 && ((uint8_t *)w->mq.sq.buf)[131071] == 0,
	      "the SQ buffer is zeroed by libmlx5");
	CHECK(w->mq.comp_mask == (MLX5DV_QP_MASK_RAW_QP_HANDLES | MLX5DV_QP_MASK_UAR_MMAP_OFFSET) &&
		      w->mq.sqn == w->tx->qp_num && w->mq.tisn && !w->mq.rqn && !w->mq.tirn &&
		      w->mq.uar_mmap_offset,
	      "raw QP handles: sqn = qp_num %u, a TIS, no RQ or TIR", w->tx->qp_num);
	if (getenv("MLX5_SHUT_UP_BF") && strcmp(getenv("MLX5_SHUT_UP_BF"), "0") != 0)
		CHECK(w->mq.bf.size == 0 && w->mq2.bf.reg == w->mq.bf.reg &&
			      (uint8_t *)w->mq.bf.reg == (uint8_t *)w->mc.cq_uar + 0x800,
		      "MLX5_SHUT_UP_BF: both QPs ring the non-cached UAR (+ 0x800), no BlueFlame");
	else
		CHECK(((uintptr_t)w->mq.bf.reg & 4095) == 0x800 && w->mq.bf.size == 256 &&
			      (uint8_t *)w->mq2.bf.reg == (uint8_t *)w->mq.bf.reg + 512 &&
			      w->mq2.bf.size == 256 && (uint8_t *)w->mq.bf.reg - 0x800 != w->mc.cq_uar,
		      "BlueFlame registers: UAR page + 0x800 and + 0xa00, 256-byte halves");
	CHECK(in_dbr_page(w->mq.dbrec) && dbr_slot(w->mc.dbrec) == 4 && dbr_slot(w->mq.dbrec) == 5 &&
		      dbr_slot(w->mq2.dbrec) == 6 && w->mq.dbrec[0] == 0 && w->mq.dbrec[1] == 0,
	      "tx records: slots 4 (CQ), 5, 6 (QPs) of the page, zero after RTS");
	CHECK(w->mc.cqe_cnt == 64 && w->mc.cqe_size == 64 && w->mc.cq_uar == w->rc[0].cq_uar &&
		      w->mc.buf == recs[rec_of(w->mc.buf)].p,
	      "tx cq: 64 entries, the context's CQ UAR");
	CHECK(w->mq2.comp_mask == MLX5DV_QP_MASK_RAW_QP_HANDLES && w->mq2.sq.wqe_cnt == 256,
	      "qp2: 256 WQEBBs, handles only");
	WANT_RET(0, ibv_query_qp(w->tx, &qattr, IBV_QP_STATE | IBV_QP_CAP, &qinit));
	CHECK(qattr.qp_state == IBV_QPS_RTS && qinit.cap.max_send_wr == 512 &&
		      qinit.cap.max_inline_data == 204,
	      "ibv_query_qp: RTS, caps as created");

	/* out-of-order teardown is refused, and leaves everything usable */
	WANT_RET(EBUSY, ibv_destroy_cq(w->tx_cq));
	WANT_RET(EBUSY, ibv_destroy_cq(w->rx_cq[0]));
	WANT_RET(EBUSY, ibv_destroy_qp(w->rss));
	WANT_RET(EBUSY, ibv_destroy_rwq_ind_table(w->ind));
	WANT_RET(EBUSY, ibv_destroy_wq(w->wq[0]));
	WANT_RET(EBUSY, ibv_dealloc_pd(w->pd));
	CHECK(wrong_data == 0 && bad_frees == 0, "the allocator always saw its data, frees matched");
	ok = fails == 0;
out:
	return ok;
}

/* ---- the datapath: WQEs, doorbells and CQEs (spec mlx5.md §2–5) -------------------------- */

enum { OP_SEND = 0x0a, CQE_REQ = 0, CQE_RESP_SEND = 2, CQE_REQ_ERR = 13, CE_ALWAYS = 0x08 };

static uint8_t tx_frame[60] = { 0x02, 0, 0, 0, 0x50, 0x02, 0x02, 0, 0, 0, 0x50, 0x01,
				0x88, 0xb5, 'f', 'r', 'o', 'm', ' ', 't', 'h', 'e', ' ',
				'C', ' ', 'p', 'r', 'o', 'g', 'r', 'a', 'm', ' ', '#', '0' };

static void put32(uint8_t *p, uint32_t v)
{
	v = htobe32(v);
	memcpy(p, &v, 4);
}

/* one SEND WQE at WQE index `pi`: ctrl, eth segment with `inl` (0 or 18) inline header
 * bytes, one data segment for the rest; returns its size in 16-byte units */
static int send_wqe(struct world *w, uint16_t pi, const uint8_t *frame, uint32_t len, int inl)
{
	uint8_t *wqe = (uint8_t *)w->mq.sq.buf + (pi & (w->mq.sq.wqe_cnt - 1)) * 64;
	int ds = inl ? 4 : 3;
	uint8_t *dseg = wqe + (inl ? 48 : 32);
	uint64_t a = htobe64((uintptr_t)frame + inl);
	memset(wqe, 0, 64);
	put32(wqe, (uint32_t)pi << 8 | OP_SEND);
	put32(wqe + 4, w->mq.sqn << 8 | ds);
	wqe[11] = CE_ALWAYS;
	if (inl) {
		uint16_t sz = htobe16(inl);
		memcpy(wqe + 28, &sz, 2);
		memcpy(wqe + 30, frame, inl);
	}
	put32(dseg, len - inl);
	put32(dseg + 4, w->mr->lkey);
	memcpy(dseg + 8, &a, 8);
	return ds;
}

/* the doorbell: record (SQ counter after the WQE), then the 8-byte UAR write */
static void ring_sq(struct world *w, uint16_t pi_after, uint16_t pi)
{
	uint8_t *wqe = (uint8_t *)w->mq.sq.buf + (pi & (w->mq.sq.wqe_cnt - 1)) * 64;
	uint64_t ctrl;
	__atomic_thread_fence(__ATOMIC_RELEASE);
	__atomic_store_n(&w->mq.dbrec[MLX5_SND_DBR], htobe32(pi_after), __ATOMIC_RELEASE);
	memcpy(&ctrl, wqe, 8);
	__atomic_store_n((uint64_t *)w->mq.bf.reg, ctrl, __ATOMIC_RELEASE);
}

/* the CQE at consumer counter `ci` of `cq` once it is software-owned, into `out` */
static int cqe_at(const struct mlx5dv_cq *cq, uint32_t ci, uint8_t out[64])
{
	const uint8_t *e = (const uint8_t *)cq->buf + (ci & (cq->cqe_cnt - 1)) * 64;
	uint8_t op_own = __atomic_load_n(e + 63, __ATOMIC_ACQUIRE);
	if ((op_own >> 4) == 0xf || (op_own & 1) != ((ci / cq->cqe_cnt) & 1))
		return 0;
	memcpy(out, e, 64);
	return 1;
}

static int wait_cqe(const struct mlx5dv_cq *cq, uint32_t ci, uint8_t out[64], double secs)
{
	double deadline = now() + secs;
	while (now() < deadline) {
		kick_all();
		if (cqe_at(cq, ci, out))
			return 1;
		usleep(100);
	}
	return 0;
}

static uint32_t be32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, 4);
	return be32toh(v);
}

static uint16_t be16(const uint8_t *p)
{
	uint16_t v;
	memcpy(&v, p, 2);
	return be16toh(v);
}

/* post RQ WQE `slot` of rwq `i`: one 2048-byte buffer of registered memory */
static void post_rx(struct world *w, int i, uint32_t slot, uint8_t *buf)
{
	uint8_t *wqe = (uint8_t *)w->mw[i].buf + slot * w->mw[i].stride;
	uint64_t a = htobe64((uintptr_t)buf);
	uint32_t k;
	memset(wqe, 0, w->mw[i].stride);
	put32(wqe, 2048);
	put32(wqe + 4, w->mr->lkey);
	memcpy(wqe + 8, &a, 8);
	for (k = 16; k < w->mw[i].stride; k += 16)
		put32(wqe + k + 4, 0x100); /* MLX5_INVALID_LKEY ends the list */
}

static void set_rq_record(struct world *w, int i, uint32_t posted)
{
	__atomic_thread_fence(__ATOMIC_RELEASE);
	__atomic_store_n(&w->mw[i].dbrec[MLX5_RCV_DBR], htobe32(posted & 0xffff), __ATOMIC_RELEASE);
}

static void set_cq_ci(struct mlx5dv_cq *cq, uint32_t ci)
{
	__atomic_store_n(&cq->dbrec[0], htobe32(ci & 0xffffff), __ATOMIC_RELEASE);
}

/* Up to `want` receive completions of `cq` from consumer counter *ci on (within `secs`):
 * their WQE counters and lengths. A compressed session of the basic layout (spec mlx5.md
 * §6.2: the title's format 3 and byte_cnt = n, mini arrays of eight 8-byte HASH minis at
 * t + 1 and t + 8k, mini i for WQE title + i) is expanded, then its slots are poisoned
 * (op_own 0xf0) as a driver must. Returns how many; *ci moves past them, SET_CI follows. */
static int rx_poll(struct mlx5dv_cq *cq, uint32_t *ci, int want, uint16_t *wqe, uint32_t *len,
		   int *sessions, double secs)
{
	uint8_t t[64];
	int got = 0;
	double deadline = now() + secs;
	while (got < want && now() < deadline) {
		uint8_t *base = cq->buf;
		uint32_t n, i, mask = cq->cqe_cnt - 1;
		kick_all();
		if (!cqe_at(cq, *ci, t)) {
			usleep(100);
			continue;
		}
		CHECK((t[63] >> 4) == CQE_RESP_SEND && (be32(t + 56) & 0xffffff) == 0,
		      "rx: a responder CQE, no flow tag (opcode %d)", t[63] >> 4);
		if (((t[63] >> 2) & 3) != 3) {
			wqe[got] = be16(t + 60);
			len[got++] = be32(t + 44);
			*ci += 1;
			continue;
		}
		n = be32(t + 44);
		(*sessions)++;
		for (i = 0; i < n; i++) {
			uint32_t slot = *ci + (i < 8 ? 1 : 8 * (i / 8));
			const uint8_t *mini = base + (slot & mask) * 64 + (i % 8) * 8;
			if (got < want) {
				wqe[got] = be16(t + 60) + i;
				len[got++] = be32(mini + 4);
			}
		}
		for (i = 1; i < n; i++)
			base[((*ci + i) & mask) * 64 + 63] = 0xf0;
		*ci += n;
	}
	set_cq_ci(cq, *ci);
	return got;
}

static void print_frame(const char *what, const uint8_t *p, uint32_t len)
{
	uint32_t k;
	printf("%s: %u bytes:", what, len);
	for (k = 0; k < len && k < 2048; k++)
		printf(" %02x", p[k]);
	printf("\n");
}

/* one TX frame (#n) through the SQ at WQE index `pi`; its CQE at `ci` */
static int tx_one(struct world *w, int n, uint16_t pi, uint32_t ci, int inl)
{
	uint8_t cqe[64];
	uint8_t *frame = w->mem + 4096 * 8 + 256 * n;
	memcpy(frame, tx_frame, sizeof(tx_frame));
	frame[34] = '0' + n;
	send_wqe(w, pi, frame, sizeof(tx_frame), inl);
	ring_sq(w, pi + 1, pi);
	CHECK(wait_cqe(&w->mc, ci, cqe, 10), "tx #%d: a CQE", n);
	CHECK((cqe[63] >> 4) == CQE_REQ && be16(cqe + 60) == pi && cqe[56] == OP_SEND &&
		      (be32(cqe + 56) & 0xffffff) == w->mq.sqn,
	      "tx #%d: requester CQE for WQE %u of SQ %u (opcode %d)", n, pi, w->mq.sqn,
	      cqe[63] >> 4);
	set_cq_ci(&w->mc, ci + 1);
	return fails == 0;
}

/* The exchange with the peer on the port's wire (tests/mlx5.rs):
 *  1. tx #1; the peer answers with a frame for another MAC, one for ours, a broadcast;
 *  2. ours and the broadcast land on rq 0 (no IP: hash 0, table entry 0), the other is
 *     steered away;
 *  3. the SQ goes RESET → INIT → RTR → RTS and tx #2 starts again at WQE index 0;
 *  4. wq 0 goes RDY → RESET → RDY, one WQE is posted at slot 0 again, tx #3 says so, and
 *     the peer's next frame lands there;
 *  5. the rules give way to one ALL_DEFAULT rule, tx #4 says so, and the peer's frame for
 *     another MAC lands in WQE 1. */
static int traffic(struct world *w)
{
	uint8_t cqe[64];
	uint8_t *rx0 = w->mem + 65536, *rx1 = w->mem + 65536 + 2048, *rx2 = w->mem + 65536 + 4096;
	uint16_t wqe[4];
	uint32_t len[4], ci = 0;
	int i, sessions = 0;

	if (nkicks)
		CHECK(engines() == 1 && engine_threads() == 0 && fake_threads() == 0,
		      "one device-model engine for mlx5_0, inline (%d, %d, %d)", engines(),
		      engine_threads(), fake_threads());
	else
		CHECK(engines() == 1 && engine_threads() == 1,
		      "one device-model engine for mlx5_0, on its thread (%d, %d)", engines(),
		      engine_threads());
	post_rx(w, 0, 0, rx0);
	post_rx(w, 0, 1, rx1);
	set_rq_record(w, 0, 2);
	post_rx(w, 1, 0, rx2);
	set_rq_record(w, 1, 1);
	if (!tx_one(w, 1, 0, 0, 18))
		return 0;
	/* rq 0's CQ has compressed CQEs: both arrive as two CQEs, or as one session */
	CHECK(rx_poll(&w->rc[0], &ci, 2, wqe, len, &sessions, 20) == 2, "two completions on rq 0");
	for (i = 0; i < 2; i++) {
		CHECK(wqe[i] == i, "rx %d: WQE %d", i, wqe[i]);
		print_frame(i ? "rx1" : "rx0", i ? rx1 : rx0, len[i]);
	}
	printf("rx: %d compressed session(s)\n", sessions);
	usleep(100000);
	kick_all();
	CHECK(!cqe_at(&w->rc[0], 2, cqe) && !cqe_at(&w->rc[1], 0, cqe),
	      "the frame for another MAC reached no RQ");

	/* error recovery's path: the SQ through RESET, its counter back to 0 */
	WANT_RET(0, modify(w->tx, IBV_QPS_RESET, IBV_QP_STATE, 0));
	CHECK(w->mq.dbrec[0] == 0 && w->mq.dbrec[1] == 0, "RESET zeroed the QP's records");
	WANT_RET(0, to_rts(w->tx));
	if (!tx_one(w, 2, 0, 1, 18))
		return 0;

	/* the same for wq 0: RDY → RESET → RDY, its counter back to 0 */
	WANT_RET(0, modify_wq(w->wq[0], IBV_WQS_RESET));
	WANT_RET(0, modify_wq(w->wq[0], IBV_WQS_RDY));
	CHECK(w->mw[0].dbrec[0] == 0, "RESET → RDY zeroed the WQ's record");
	post_rx(w, 0, 0, rx0);
	set_rq_record(w, 0, 1);
	if (!tx_one(w, 3, 1, 2, 18))
		return 0;
	CHECK(rx_poll(&w->rc[0], &ci, 1, wqe, len, &sessions, 20) == 1, "rx: a completion on rq 0");
	CHECK(wqe[0] == 0 && ci == 3, "rx 2: WQE 0 again after the reset (counter %u), CQ entry 2",
	      wqe[0]);
	print_frame("rx2", rx0, len[0]);

	/* the leftovers: with only an ALL_DEFAULT rule, a frame for any MAC is taken */
	WANT_RET(0, ibv_destroy_flow(w->flow[0]));
	WANT_RET(0, ibv_destroy_flow(w->flow[1]));
	w->flow[1] = NULL;
	{
		struct ibv_flow_attr a = { .type = IBV_FLOW_ATTR_ALL_DEFAULT, .size = sizeof(a),
					   .port = 1 };
		w->flow[0] = ibv_create_flow(w->rss, &a);
		CHECK(w->flow[0] != NULL, "an ALL_DEFAULT rule");
	}
	post_rx(w, 0, 1, rx1);
	set_rq_record(w, 0, 2);
	if (!tx_one(w, 4, 2, 3, 18))
		return 0;
	CHECK(rx_poll(&w->rc[0], &ci, 1, wqe, len, &sessions, 20) == 1, "rx: the leftover frame");
	CHECK(wqe[0] == 1, "rx 3: WQE 1");
	print_frame("rx3", rx1, len[0]);
	return fails == 0;
}

/* Kick handles on the SQ (by qp_num) and both RQs (by wq_num): the engine goes inline,
 * queues the device does not serve get none. */
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
	CHECK(fake_threads() == 1, "before any handle the engine runs on its thread (%d)",
	      fake_threads());
	WANT_NULL(ENOENT, kick_open(w->ctx, 0, w->tx2->qp_num)); /* never went to RTS */
	WANT_NULL(ENOENT, kick_open(w->ctx, 0, w->tx->qp_num + 1000));
	WANT_NULL(ENOENT, kick_open(w->ctx, 1, w->tx->qp_num));
	WANT_NULL(ENOENT, kick_open(w->ctx, 0, w->wq[0]->wq_num));
	CHECK(fake_threads() == 1, "no handle, no switch: the engine keeps its thread");
	kicks[0] = kick_open(w->ctx, 0, w->tx->qp_num);
	CHECK(kicks[0] && engines() == 1 && engine_threads() == 0 && fake_threads() == 0,
	      "a TX handle: the engine runs inline, its thread gone (%d, %d, %d)", engines(),
	      engine_threads(), fake_threads());
	for (i = 0; i < 2; i++)
		kicks[1 + i] = kick_open(w->ctx, 1, w->wq[i]->wq_num);
	CHECK(kicks[1] && kicks[2] && kicks[1] != kicks[2], "a handle per RX queue");
	CHECK(live() == before + 3, "handles count as live objects (%d, was %d)", live(), before);
	nkicks = 3;
	return kicks[0] && kicks[1] && kicks[2];
}

/* one SEND without an inline header: fine on ConnectX-5, an error on ConnectX-4 */
static int inline0(struct world *w)
{
	uint8_t cqe[64];
	uint8_t *frame = w->mem + 4096 * 8;
	memcpy(frame, tx_frame, sizeof(tx_frame));
	send_wqe(w, 0, frame, sizeof(tx_frame), 0);
	ring_sq(w, 1, 0);
	CHECK(wait_cqe(&w->mc, 0, cqe, 10), "tx: a CQE");
	printf("tx cqe opcode %d syndrome 0x%02x\n", cqe[63] >> 4, cqe[55]);
	return fails == 0;
}

/* ---- the errno table ------------------------------------------------------------------- */

static int pd_allocs, pd_frees, pd_default_dbr;
static uint64_t pd_types[32];
static size_t pd_sizes[32], pd_aligns[32];

static void *pd_alloc(struct ibv_pd *pd, void *ctx, size_t size, size_t align, uint64_t type)
{
	void *p;
	(void)pd;
	(void)ctx;
	if (pd_default_dbr && type == MLX5DV_RES_TYPE_DBR)
		return IBV_ALLOCATOR_USE_DEFAULT;
	if (posix_memalign(&p, 4096, size + 4096))
		return NULL;
	memset(p, 0, size + 4096);
	if (pd_allocs < 32) {
		pd_types[pd_allocs] = type;
		pd_sizes[pd_allocs] = size;
		pd_aligns[pd_allocs] = align;
	}
	pd_allocs++;
	return p;
}

static void pd_free(struct ibv_pd *pd, void *ctx, void *p, uint64_t type)
{
	(void)pd;
	(void)ctx;
	(void)type;
	pd_frees++;
	free(p);
}

struct eth11 {
	struct ibv_flow_attr attr;
	struct ibv_flow_spec_eth eth[11];
};

static void errno_table(struct world *w, struct ibv_context *mana)
{
	struct mlx5dv_ctx_allocators al = { .alloc = q_alloc, .free = q_free, .data = cur_data };
	struct ibv_cq_init_attr_ex ca;
	struct ibv_wq_init_attr wa;
	struct mlx5dv_wq_init_attr dwa;
	struct ibv_qp_init_attr_ex qa;
	struct ibv_wq_attr wm;
	struct ibv_parent_domain_init_attr pa;
	struct mlx5dv_obj obj;
	struct mlx5dv_cq dcq;
	struct mlx5dv_context dv = { 0 };
	struct ibv_cq *c, *c2, *c3, *c128;
	struct ibv_wq *q, *q2, *wqs[4096];
	struct ibv_rwq_ind_table *t, *t1;
	struct ibv_qp *tx, *rss;
	struct ibv_pd *parent;
	struct ibv_flow *fl;
	static const uint8_t zeros[6] = { 0 };
	int i, before, fbefore;

	/* the dv entry points on the wrong provider, and their own checks */
	if (mana) {
		WANT_RET(EOPNOTSUPP, mlx5dv_query_device(mana, &dv));
		WANT_RET(EOPNOTSUPP, mlx5dv_set_context_attr(mana, MLX5DV_CTX_ATTR_BUF_ALLOCATORS, &al));
		ca = (struct ibv_cq_init_attr_ex){ .cqe = 16 };
		WANT_NULL(EOPNOTSUPP, mlx5dv_create_cq(mana, &ca, NULL));
		wa = (struct ibv_wq_init_attr){ .wq_type = IBV_WQT_RQ, .max_wr = 16, .max_sge = 1 };
		WANT_NULL(EOPNOTSUPP, mlx5dv_create_wq(mana, &wa, NULL));
		WANT_RET(EOPNOTSUPP, manadv_set_context_attr(w->ctx, 1, &al));
	}
	WANT_RET(ENOTSUP, mlx5dv_set_context_attr(w->ctx, 2, &al));
	memset(&obj, 0, sizeof(obj));
	WANT_RET(EINVAL, mlx5dv_init_obj(&obj, 0));

	w->pd = ibv_alloc_pd(w->ctx);

	/* CQs without allocators get libmlx5's own memory, which goes through
	 * ibv_dontfork_range (buf.c:545-565): a later ibv_fork_init is too late in v44
	 * (libibverbs/memory.c:137-138, EINVAL); main returns 0 on a kernel that copies pinned
	 * pages on fork (memory.c:137-138) */
	c = ibv_create_cq(w->ctx, 15, NULL, NULL, 0);
	CHECK(c && allocs == 0, "a CQ without allocators: provider memory");
	i = ibv_fork_init();
	CHECK(i == (main_profile() ? 0 : EINVAL),
	      "ibv_fork_init after libmlx5 mapped a CQ of its own: EINVAL in v44, 0 in main");
	if (c)
		WANT_RET(0, ibv_destroy_cq(c));

	/* memory regions (the uverbs core's access check, ib_check_mr_access) */
	WANT_NULL(EINVAL, ibv_reg_mr(w->pd, w->mem, 4096, IBV_ACCESS_REMOTE_WRITE));
	WANT_NULL(EINVAL, ibv_reg_mr(w->pd, w->mem, 0, IBV_ACCESS_LOCAL_WRITE));
	mlx5dv_set_context_attr(w->ctx, MLX5DV_CTX_ATTR_BUF_ALLOCATORS, &al);

	/* CQs: mlx5_create_cq, create_cq, the kernel */
	WANT_NULL(EINVAL, ibv_create_cq(w->ctx, 0, NULL, NULL, 0));
	WANT_NULL(EINVAL, ibv_create_cq(w->ctx, -1, NULL, NULL, 0));
	WANT_NULL(EINVAL, ibv_create_cq(w->ctx, 1 << 24, NULL, NULL, 0));
	before = allocs;
	fbefore = frees;
	WANT_NULL(EINVAL, ibv_create_cq(w->ctx, 15, NULL, NULL, 4));
	CHECK(allocs - before == 2 && frees - fbefore == 2,
	      "the kernel's refusal (comp_vector 4 of 4) gives the ring and the record page back");
	alloc_null = 1;
	WANT_NULL_ERRNO_KEPT(ibv_create_cq(w->ctx, 15, NULL, NULL, 0));
	alloc_null = 0;
	ca = (struct ibv_cq_init_attr_ex){ .cqe = 15, .wc_flags = 1ull << 40 };
	WANT_NULL(EOPNOTSUPP, ibv_create_cq_ex(w->ctx, &ca));
	ca = (struct ibv_cq_init_attr_ex){ .cqe = 15, .comp_mask = 1 << 2 };
	WANT_NULL(EINVAL, ibv_create_cq_ex(w->ctx, &ca));
	ca = (struct ibv_cq_init_attr_ex){ .cqe = 15, .comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS,
					   .flags = 1 << 2 };
	WANT_NULL(EINVAL, ibv_create_cq_ex(w->ctx, &ca));
	ca = (struct ibv_cq_init_attr_ex){ .cqe = 15, .comp_mask = IBV_CQ_INIT_ATTR_MASK_PD,
					   .parent_domain = w->pd };
	WANT_NULL(EINVAL, ibv_create_cq_ex(w->ctx, &ca));
	WANT_NULL(EINVAL, dv_cq(w->ctx, 15, 1 << 3, 0, 0, 0));
	WANT_NULL(EINVAL, dv_cq(w->ctx, 15, MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE,
				MLX5DV_CQE_RES_FORMAT_CSUM, 0, 0));
	WANT_NULL(EINVAL, dv_cq(w->ctx, 15, MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE,
				MLX5DV_CQE_RES_FORMAT_HASH | MLX5DV_CQE_RES_FORMAT_CSUM, 0, 0));
	WANT_NULL(EOPNOTSUPP,
		  dv_cq(w->ctx, 15,
			MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE | MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE,
			MLX5DV_CQE_RES_FORMAT_HASH, 128, 0));
	WANT_NULL(EINVAL, dv_cq(w->ctx, 15, MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE, 0, 100, 0));
	WANT_NULL(EINVAL, dv_cq(w->ctx, 15, MLX5DV_CQ_INIT_ATTR_MASK_FLAGS, 0, 0,
				MLX5DV_CQ_INIT_ATTR_FLAGS_CQE_PAD));
	WANT_NULL(EINVAL, dv_cq(w->ctx, 15, MLX5DV_CQ_INIT_ATTR_MASK_FLAGS, 0, 0, 1 << 1));
	c128 = dv_cq(w->ctx, 15, MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE, 0, 128, 0);
	memset(&obj, 0, sizeof(obj));
	obj.cq.in = c128;
	obj.cq.out = &dcq;
	CHECK(c128 && mlx5dv_init_obj(&obj, MLX5DV_OBJ_CQ) == 0 && dcq.cqe_size == 128 &&
		      ((uint8_t *)dcq.buf)[127] == 0xf0 && ((uint8_t *)dcq.buf)[63] == 0,
	      "128-byte CQEs: op_own 0xf0 in the second half");
	if (c128)
		WANT_RET(0, ibv_destroy_cq(c128));
	/* free gets the data of the moment */
	c = ibv_create_cq(w->ctx, 15, NULL, NULL, 0);
	cur_data = (void *)0x6;
	al.data = cur_data;
	mlx5dv_set_context_attr(w->ctx, MLX5DV_CTX_ATTR_BUF_ALLOCATORS, &al);
	WANT_RET(0, ibv_destroy_cq(c));
	CHECK(wrong_data == 0, "free gets the allocators' current data");

	/* parent domains */
	pa = (struct ibv_parent_domain_init_attr){ .pd = NULL };
	WANT_NULL(EINVAL, ibv_alloc_parent_domain(w->ctx, &pa));
	pa = (struct ibv_parent_domain_init_attr){ .pd = w->pd, .comp_mask = 1 << 2 };
	WANT_NULL(EINVAL, ibv_alloc_parent_domain(w->ctx, &pa));
	pa = (struct ibv_parent_domain_init_attr){
		.pd = w->pd, .comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS,
		.alloc = pd_alloc, .free = pd_free };
	parent = ibv_alloc_parent_domain(w->ctx, &pa);
	CHECK(parent != NULL, "a parent domain with allocators");
	WANT_RET(EBUSY, ibv_dealloc_pd(w->pd));
	ca = (struct ibv_cq_init_attr_ex){ .cqe = 63, .comp_mask = IBV_CQ_INIT_ATTR_MASK_PD,
					   .parent_domain = parent };
	before = allocs;
	c = ibv_cq_ex_to_cq(ibv_create_cq_ex(w->ctx, &ca));
	CHECK(c && allocs == before && pd_allocs == 2 && pd_types[0] == MLX5DV_RES_TYPE_CQ &&
		      pd_sizes[0] == 4096 && pd_aligns[0] == 4096 && pd_types[1] == MLX5DV_RES_TYPE_DBR &&
		      pd_sizes[1] == 8 && pd_aligns[1] == 8,
	      "a CQ on a parent domain: its ring (4096, aligned 4096) and record (8, 8) from its allocator");
	WANT_RET(EBUSY, ibv_dealloc_pd(parent));
	pd_default_dbr = 1;
	c2 = ibv_cq_ex_to_cq(ibv_create_cq_ex(w->ctx, &ca));
	CHECK(c2 && pd_allocs == 3 && allocs == before + 1 && last_size(0) == 4096,
	      "USE_DEFAULT for the record: a page from the context's allocator");
	WANT_RET(0, ibv_destroy_cq(c));
	WANT_RET(0, ibv_destroy_cq(c2));
	CHECK(pd_frees == 3, "the parent domain's buffers go back to it");
	WANT_RET(0, ibv_dealloc_pd(parent));

	/* WQs */
	c = ibv_create_cq(w->ctx, 255, NULL, NULL, 0);
	c2 = ibv_create_cq(w->ctx, 255, NULL, NULL, 0);
	wa = (struct ibv_wq_init_attr){ .wq_type = 1, .max_wr = 16, .max_sge = 1, .pd = w->pd, .cq = c };
	WANT_NULL_ERRNO_KEPT(ibv_create_wq(w->ctx, &wa));
	WANT_NULL(EINVAL, wq(w, c, 0, 1));
	WANT_NULL(EINVAL, wq(w, c, 16, 33));
	wa = (struct ibv_wq_init_attr){ .wq_type = IBV_WQT_RQ, .max_wr = 16, .max_sge = 1, .pd = w->pd, .cq = c };
	dwa = (struct mlx5dv_wq_init_attr){ .comp_mask = 1 << 1 };
	WANT_NULL(EINVAL, mlx5dv_create_wq(w->ctx, &wa, &dwa));
	before = allocs;
	fbefore = frees;
	dwa = (struct mlx5dv_wq_init_attr){ .comp_mask = MLX5DV_WQ_INIT_ATTR_MASK_STRIDING_RQ,
					   .striding_rq_attrs = { .single_stride_log_num_of_bytes = 6,
								  .single_wqe_log_num_of_strides = 9 } };
	WANT_NULL(EINVAL, mlx5dv_create_wq(w->ctx, &wa, &dwa));
	CHECK(allocs - before == 1 && frees - fbefore == 1 && recs[allocs - 1].size == 4096,
	      "striding RQ outside the (empty) caps: the 32-byte-stride ring is allocated, then given back");
	dwa.striding_rq_attrs = (struct mlx5dv_striding_rq_init_attr){ 0 };
	WANT_NULL(EOPNOTSUPP, mlx5dv_create_wq(w->ctx, &wa, &dwa));
	wa.comp_mask = 1 << 1;
	WANT_NULL(EINVAL, ibv_create_wq(w->ctx, &wa));
	wa.comp_mask = IBV_WQ_INIT_ATTR_FLAGS;
	wa.create_flags = IBV_WQ_FLAGS_RESERVED;
	WANT_NULL(EOPNOTSUPP, ibv_create_wq(w->ctx, &wa));
	wa.create_flags = IBV_WQ_FLAGS_SCATTER_FCS;
	WANT_NULL(EOPNOTSUPP, ibv_create_wq(w->ctx, &wa));
	WANT_NULL(EINVAL, wq(w, c, 32769, 1));
	alloc_null = 1;
	WANT_NULL(ENOMEM, wq(w, c, 16, 1));
	alloc_null = 0;
	wa.create_flags = IBV_WQ_FLAGS_CVLAN_STRIPPING;
	q = ibv_create_wq(w->ctx, &wa);
	CHECK(q && wa.max_wr == 16 && wa.max_sge == 1, "a C-VLAN stripping WQ; max_wr, max_sge unchanged");
	q2 = wq(w, c2, 16, 1);
	/* WQ states */
	wm = (struct ibv_wq_attr){ .attr_mask = IBV_WQ_ATTR_STATE, .wq_state = IBV_WQS_RESET };
	WANT_RET(EINVAL, ibv_modify_wq(q, &wm));
	wm = (struct ibv_wq_attr){ .attr_mask = IBV_WQ_ATTR_STATE | IBV_WQ_ATTR_CURR_STATE,
				   .wq_state = IBV_WQS_RDY, .curr_wq_state = IBV_WQS_RDY };
	WANT_RET(-EINVAL, ibv_modify_wq(q, &wm));
	wm = (struct ibv_wq_attr){ .attr_mask = 0 };
	WANT_RET(EINVAL, ibv_modify_wq(q, &wm));
	wm = (struct ibv_wq_attr){ .attr_mask = 1 << 3 };
	WANT_RET(EINVAL, ibv_modify_wq(q, &wm));
	WANT_RET(0, modify_wq(q, IBV_WQS_RDY));
	WANT_RET(0, modify_wq(q, IBV_WQS_RDY));
	WANT_RET(0, modify_wq(q, IBV_WQS_ERR));
	WANT_RET(EINVAL, modify_wq(q, IBV_WQS_RDY));
	WANT_RET(0, modify_wq(q, IBV_WQS_RESET));
	WANT_RET(0, modify_wq(q, IBV_WQS_RDY));
	WANT_RET(0, modify_wq(q2, IBV_WQS_RDY));

	/* indirection tables */
	for (i = 0; i < 4096; i++)
		wqs[i] = i % 2 ? q2 : q;
	WANT_NULL(EINVAL, ind(w, wqs, 14));
	WANT_NULL(EINVAL, ind(w, wqs, 12));
	{
		struct ibv_rwq_ind_table_init_attr ia = { .log_ind_tbl_size = 1, .ind_tbl = wqs,
							  .comp_mask = 1 };
		WANT_NULL_ERRNO_KEPT(ibv_create_rwq_ind_table(w->ctx, &ia));
	}
	t = ind(w, wqs, 1);
	t1 = ind(w, wqs, 0);
	WANT_RET(EBUSY, ibv_destroy_wq(q));

	/* RSS QPs: libmlx5, libibverbs, the kernel */
	WANT_NULL(EINVAL, rss_qp(w, t, IBV_RX_HASH_FUNC_TOEPLITZ, 129, IBV_RX_HASH_SRC_IPV4));
	WANT_NULL(EOPNOTSUPP, rss_qp(w, t, 2, 40, IBV_RX_HASH_SRC_IPV4));
	WANT_NULL(EINVAL, rss_qp(w, t, IBV_RX_HASH_FUNC_TOEPLITZ, 32, IBV_RX_HASH_SRC_IPV4));
	WANT_NULL(EINVAL, rss_qp(w, t, IBV_RX_HASH_FUNC_TOEPLITZ, 40, 0));
	WANT_NULL(EINVAL, rss_qp(w, t, IBV_RX_HASH_FUNC_TOEPLITZ, 40,
				 IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV6));
	WANT_NULL(EINVAL, rss_qp(w, t, IBV_RX_HASH_FUNC_TOEPLITZ, 40,
				 IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_SRC_PORT_TCP |
					 IBV_RX_HASH_DST_PORT_UDP));
	WANT_NULL(EOPNOTSUPP, rss_qp(w, t, IBV_RX_HASH_FUNC_TOEPLITZ, 40,
				     IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_INNER));
	rss = rss_qp(w, t1, IBV_RX_HASH_FUNC_TOEPLITZ, 40, 0);
	CHECK(rss != NULL, "no hash fields over a one-entry table: a steering-only TIR");
	if (rss)
		WANT_RET(0, ibv_destroy_qp(rss));
	qa = (struct ibv_qp_init_attr_ex){
		.qp_type = IBV_QPT_RAW_PACKET,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_IND_TABLE | IBV_QP_INIT_ATTR_RX_HASH,
		.pd = w->pd, .rwq_ind_tbl = t, .cap = { .max_recv_wr = 1 },
		.rx_hash_conf = { .rx_hash_function = IBV_RX_HASH_FUNC_TOEPLITZ, .rx_hash_key_len = 40,
				  .rx_hash_key = (uint8_t *)key, .rx_hash_fields_mask = IBV_RX_HASH_SRC_IPV4 } };
	WANT_NULL(EINVAL, ibv_create_qp_ex(w->ctx, &qa));
	qa.cap.max_recv_wr = 0;
	qa.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	WANT_NULL(EINVAL, ibv_create_qp_ex(w->ctx, &qa));
	rss = rss_qp(w, t, IBV_RX_HASH_FUNC_TOEPLITZ, 40, IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4);
	CHECK(rss != NULL, "an RSS QP over two WQs");
	WANT_RET(EBUSY, ibv_destroy_rwq_ind_table(t));
	WANT_RET(EOPNOTSUPP, modify(rss, IBV_QPS_INIT, IBV_QP_STATE | IBV_QP_PORT, 1));
	{
		struct ibv_qp_attr qattr;
		struct ibv_qp_init_attr qinit;
		WANT_RET(EOPNOTSUPP, ibv_query_qp(rss, &qattr, IBV_QP_STATE, &qinit));
	}

	/* flow rules: libibverbs' spec walk, the uverbs core, mlx5_ib */
	{
		struct eth_rule r;
		memset(&r, 0, sizeof(r));
		r.attr.size = sizeof(r);
		r.attr.num_of_specs = 1;
		r.attr.port = 1;
		r.eth.type = 0x99;
		r.eth.size = sizeof(r.eth);
		WANT_NULL(EINVAL, ibv_create_flow(rss, &r.attr));
		r.eth.type = IBV_FLOW_SPEC_ETH;
		r.attr.priority = 16;
		WANT_NULL(ENOMEM, ibv_create_flow(rss, &r.attr));
		r.attr.priority = 0;
		r.attr.port = 2;
		WANT_NULL(EINVAL, ibv_create_flow(rss, &r.attr));
		r.attr.port = 1;
		r.attr.flags = 1 << 3;
		WANT_NULL(EINVAL, ibv_create_flow(rss, &r.attr));
		r.attr.flags = 1 << 0;
		WANT_NULL(EINVAL, ibv_create_flow(rss, &r.attr));
		r.attr.flags = IBV_FLOW_ATTR_FLAGS_DONT_TRAP;
		r.attr.type = IBV_FLOW_ATTR_ALL_DEFAULT;
		WANT_NULL(EINVAL, ibv_create_flow(rss, &r.attr));
		r.attr.flags = 0;
		r.attr.type = IBV_FLOW_ATTR_NORMAL;
	}
	{
		struct eth11 r;
		memset(&r, 0, sizeof(r));
		r.attr.size = sizeof(r);
		r.attr.num_of_specs = 11;
		r.attr.port = 1;
		for (i = 0; i < 11; i++) {
			r.eth[i].type = IBV_FLOW_SPEC_ETH;
			r.eth[i].size = sizeof(r.eth[i]);
		}
		WANT_NULL(EINVAL, ibv_create_flow(rss, &r.attr));
	}
	fl = eth_flow(rss, zeros, zeros);
	CHECK(fl != NULL, "a promiscuous rule (all-zero value and mask)");
	WANT_RET(EBUSY, ibv_destroy_qp(rss));

	/* raw send QPs: create_qp's checks, the geometry, the kernel */
	WANT_NULL_ERRNO_KEPT(
		ibv_create_qp_ex(w->ctx, &(struct ibv_qp_init_attr_ex){
						 .qp_type = IBV_QPT_RAW_PACKET, .send_cq = c, .recv_cq = c,
						 .comp_mask = IBV_QP_INIT_ATTR_PD | (1 << 7), .pd = w->pd,
						 .cap = { .max_send_wr = 16, .max_send_sge = 1 } }));
	WANT_NULL_ERRNO_KEPT(
		ibv_create_qp_ex(w->ctx, &(struct ibv_qp_init_attr_ex){
						 .qp_type = IBV_QPT_UD, .send_cq = c, .recv_cq = c,
						 .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_MAX_TSO_HEADER,
						 .pd = w->pd, .max_tso_header = 64,
						 .cap = { .max_send_wr = 16, .max_send_sge = 1 } }));
	before = allocs;
	WANT_NULL(EINVAL, tx_qp_ex(w, c, 16, 62, 0, NULL));
	WANT_NULL(EINVAL, tx_qp_ex(w, c, 32769, 1, 0, NULL));
	WANT_NULL(EINVAL, tx_qp_ex(w, c, 0x7fffffff / 1024 + 1, 1, 0, NULL));
	{
		struct ibv_qp_init_attr_ex x = {
			.qp_type = IBV_QPT_RAW_PACKET, .send_cq = c, .recv_cq = c,
			.comp_mask = IBV_QP_INIT_ATTR_PD, .pd = w->pd,
			.cap = { .max_send_wr = 16, .max_send_sge = 1, .max_inline_data = 1000 } };
		WANT_NULL(EINVAL, ibv_create_qp_ex(w->ctx, &x));
		x.cap = (struct ibv_qp_cap){ .max_send_wr = 16, .max_send_sge = 1, .max_recv_wr = 32769 };
		WANT_NULL(EINVAL, ibv_create_qp_ex(w->ctx, &x));
		x.cap = (struct ibv_qp_cap){ .max_send_wr = 16, .max_send_sge = 1, .max_recv_wr = 16,
					     .max_recv_sge = 33 };
		WANT_NULL(EINVAL, ibv_create_qp_ex(w->ctx, &x));
	}
	CHECK(allocs == before, "geometry refusals come before any allocation");
	alloc_null = 1;
	WANT_NULL_ERRNO_KEPT(tx_qp_ex(w, c, 16, 1, 0, NULL));
	alloc_null = 0;
	c3 = ibv_create_cq(w->ctx, 15, NULL, NULL, 0); /* the device model serves one queue per CQ */
	tx = tx_qp_ex(w, c3, 16, 1, 0, NULL);
	CHECK(tx != NULL, "a raw send QP");
	{
		struct eth_rule r;
		memset(&r, 0, sizeof(r));
		r.attr.size = sizeof(r);
		r.attr.num_of_specs = 1;
		r.attr.port = 1;
		r.eth.type = IBV_FLOW_SPEC_ETH;
		r.eth.size = sizeof(r.eth);
		WANT_NULL(EINVAL, ibv_create_flow(tx, &r.attr));
	}
	/* the kernel's state machine (ib_modify_qp_is_ok) */
	WANT_RET(EINVAL, modify(tx, IBV_QPS_RTR, IBV_QP_STATE, 0));
	WANT_RET(EINVAL, modify(tx, IBV_QPS_INIT, IBV_QP_STATE, 0));
	WANT_RET(EINVAL, modify(tx, IBV_QPS_INIT, IBV_QP_STATE | IBV_QP_PORT, 2));
	WANT_RET(EINVAL, modify(tx, IBV_QPS_INIT, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_PKEY_INDEX, 1));
	WANT_RET(EINVAL, modify(tx, IBV_QPS_INIT, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_CUR_STATE, 1));
	CHECK(tx->state == IBV_QPS_RESET, "a refused modify leaves qp->state RESET");
	WANT_RET(0, modify(tx, IBV_QPS_RESET, IBV_QP_STATE, 0));
	WANT_RET(0, modify(tx, IBV_QPS_INIT, IBV_QP_STATE | IBV_QP_PORT, 1));
	WANT_RET(EINVAL, modify(tx, IBV_QPS_RTS, IBV_QP_STATE, 0));
	WANT_RET(0, modify(tx, IBV_QPS_RTR, IBV_QP_STATE, 0));
	WANT_RET(EINVAL, modify(tx, IBV_QPS_INIT, IBV_QP_STATE, 0));
	WANT_RET(0, modify(tx, IBV_QPS_RTS, IBV_QP_STATE, 0));
	WANT_RET(0, modify(tx, IBV_QPS_RTS, IBV_QP_STATE, 0));
	WANT_RET(0, modify(tx, IBV_QPS_ERR, IBV_QP_STATE, 0));
	WANT_RET(EINVAL, modify(tx, IBV_QPS_RTS, IBV_QP_STATE, 0));
	WANT_RET(0, modify(tx, IBV_QPS_RESET, IBV_QP_STATE, 0));
	CHECK(tx->state == IBV_QPS_RESET, "qp->state follows successful modifies");
	memset(&obj, 0, sizeof(obj));
	obj.qp.in = tx;
	obj.qp.out = &(struct mlx5dv_qp){ 0 };
	WANT_RET(0, mlx5dv_init_obj(&obj, MLX5DV_OBJ_QP));
	WANT_RET(EBUSY, ibv_destroy_cq(c3));

	/* teardown; frees balance, the record page goes with its last record */
	WANT_RET(0, ibv_destroy_qp(tx));
	WANT_RET(0, ibv_destroy_flow(fl));
	WANT_RET(0, ibv_destroy_qp(rss));
	WANT_RET(0, ibv_destroy_rwq_ind_table(t));
	WANT_RET(0, ibv_destroy_rwq_ind_table(t1));
	WANT_RET(0, ibv_destroy_wq(q));
	WANT_RET(0, ibv_destroy_wq(q2));
	WANT_RET(0, ibv_destroy_cq(c));
	WANT_RET(0, ibv_destroy_cq(c2));
	WANT_RET(0, ibv_destroy_cq(c3));
	CHECK(allocs == frees && bad_frees == 0 && wrong_data == 0,
	      "every buffer and record page back to the allocator (%d of %d)", frees, allocs);
}

int main(int argc, char **argv)
{
	struct world w;
	struct ibv_device **list;
	struct ibv_context *mana = NULL;
	int n = 0, i, ok = 0, dev = -1;
	uint16_t part = 0;
	const char *mode = argc > 1 ? argv[1] : "bringup";
	struct ibv_device_attr da;

	setvbuf(stdout, NULL, _IOLBF, 0);
	memset(&w, 0, sizeof(w));
	list = ibv_get_device_list(&n);
	printf("ibv_get_device_list: %d device(s)\n", list ? n : 0);
	if (!list || n == 0) {
		if (list)
			ibv_free_device_list(list);
		return 2;
	}
	for (i = 0; i < n; i++) {
		int sup = mlx5dv_is_supported(list[i]);
		printf("device %d: %s mlx5dv_is_supported %d\n", i, ibv_get_device_name(list[i]), sup);
		if (strncmp(ibv_get_device_name(list[i]), "mlx5_", 5) == 0) {
			CHECK(sup, "%s is an mlx5 device", ibv_get_device_name(list[i]));
			if (dev < 0)
				dev = i;
		} else {
			CHECK(!sup, "%s is not", ibv_get_device_name(list[i]));
			if (strcmp(mode, "errno") == 0)
				mana = ibv_open_device(list[i]);
		}
	}
	if (dev < 0) {
		ibv_free_device_list(list);
		return 2;
	}
	w.ctx = ibv_open_device(list[dev]);
	ibv_free_device_list(list);
	if (!w.ctx) {
		printf("FAILED at ibv_open_device: errno %d\n", errno);
		return 1;
	}
	if (ibv_query_device(w.ctx, &da) == 0)
		part = da.vendor_part_id;
	if (strcmp(mode, "errno") == 0) {
		if (posix_memalign((void **)&w.mem, 4096, 1 << 20) == 0) {
			errno_table(&w, mana);
			if (w.pd)
				ibv_dealloc_pd(w.pd);
			w.pd = NULL;
		}
		ok = fails == 0;
	} else if (strcmp(mode, "manadv") == 0) {
		struct manadv_ctx_allocators al = { 0 };
		printf("manadv_set_context_attr -> %d\n",
		       manadv_set_context_attr(w.ctx, MANADV_CTX_ATTR_BUF_ALLOCATORS, &al));
	} else {
		ok = bringup(&w, part);
		if (ok && strcmp(mode, "kicked") == 0)
			ok = open_kicks(&w);
		if (ok && (strcmp(mode, "traffic") == 0 || strcmp(mode, "kicked") == 0))
			ok = traffic(&w);
		if (ok && strcmp(mode, "inline0") == 0)
			ok = inline0(&w);
	}
	teardown(&w);
	free(w.mem);
	printf("engines %d threads %d\n", engines(), engine_threads());
	printf("before close: live %d\n", live());
	if (mana)
		ibv_close_device(mana);
	ibv_close_device(w.ctx);
	printf("after close: engines %d threads %d\n", engines(), engine_threads());
	if (nkicks) {
		/* handles outlive their queues, context and engine; closing them leaves nothing */
		kick_all();
		for (i = 0; i < nkicks; i++)
			kick_close(kicks[i]);
		CHECK(live() == 0, "handles closed after the context: nothing alive (%d)", live());
		ok = ok && fails == 0;
	}
	printf("allocs %d frees %d live %d\n", allocs, frees, live());
	if (ok && allocs == frees && live() <= 0 && !bad_frees && !wrong_data)
		printf("OK\n");
	return ok ? 0 : 1;
}
