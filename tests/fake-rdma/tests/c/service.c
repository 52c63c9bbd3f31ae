/* A host servicing of a device on the fake rdma-core (the `service SECONDS` value of the
 * device's fake_rdma_fatal knob), the way an application sees it through the real
 * libibverbs API: its context gets IBV_EVENT_DEVICE_FATAL and its event channel closes;
 * commands on the context and its objects fail with EIO while destroys succeed and give
 * every queue buffer back to the application's allocator; the device leaves the device
 * list and the sysfs tree, its old ibv_device no longer opens; it comes back healthy after
 * the time given, under a new ibv_device, and a new context works (and can be serviced
 * again).
 *
 * usage: service mana|mlx5 IBDEV_DIR [traffic|quit|once]
 *   IBDEV_DIR  the device's sysfs directory (where the knob is), <root>/class/infiniband/DEV
 *   traffic    (mana) after the device is back: one frame out of port 1 and one in, with a
 *              peer on port 1's wire (the Rust test); "ready for traffic" says when
 *   traffic-inline  (mana) as traffic, with the engine inline: kick handles on the queues
 *              (fake_rdma_kick_open) before the servicing and on the new ones after it, the
 *              device's work done by this thread's kicks; during the servicing the queueless
 *              engine has a thread again
 *   quit       asks for a 60 s service and exits as soon as its context got DEVICE_FATAL
 *   once       stops once the device is back (no new context: its netdev may hold it)
 * Prints "ok ..." / "FAIL ..." per check, then "allocs A frees F live L" (F: buffers given
 * back; free(NULL) calls are counted apart) and "OK" when
 * every check passed. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/manadv.h>
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "check.h"

static int fails, allocs, frees, null_frees;
static const char *dir, *name;




/* the application's queue-buffer allocator (manadv / mlx5dv BUF_ALLOCATORS) */
static void *q_alloc(size_t size, void *data)
{
	void *p;
	(void)data;
	if (posix_memalign(&p, 4096, size + 4096))
		return NULL;
	memset(p, 0, size + 4096);
	allocs++;
	return p;
}

/* NULL (libmana gives an RSS QP's send buffer back, which is NULL: rdma-core v44
 * providers/mana/qp.c:169) is counted apart from the buffers handed out */
static void q_free(void *p, void *data)
{
	(void)data;
	if (!p) {
		null_frees++;
		return;
	}
	frees++;
	free(p);
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

/* the fake's engines that run on a thread of their own (not inline) */
static int fake_threads(void)
{
	int (*f)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "fake_rdma_engine_threads");
	return f ? f() : -1;
}

/* The fake's inline engines (fake-only symbols): handles on the MANA queues, kicked
 * wherever the program waits for the device. */
static int inl, nkicks;
static void *kicks[3];

static void kick_all(void)
{
	void (*kick)(void *) = (void (*)(void *))dlsym(RTLD_DEFAULT, "fake_rdma_kick");
	int i;
	for (i = 0; kick && i < nkicks; i++)
		kick(kicks[i]);
}

static void close_kicks(void)
{
	void (*kick_close)(void *) = (void (*)(void *))dlsym(RTLD_DEFAULT, "fake_rdma_kick_close");
	int i;
	for (i = 0; kick_close && i < nkicks; i++)
		kick_close(kicks[i]);
	nkicks = 0;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void knob(const char *value)
{
	char path[4096];
	FILE *f;
	snprintf(path, sizeof path, "%s/fake_rdma_fatal", dir);
	f = fopen(path, "w");
	if (!f) {
		perror(path);
		exit(1);
	}
	fprintf(f, "%s\n", value);
	fclose(f);
}

static int exists(const char *rel)
{
	char path[4096];
	snprintf(path, sizeof path, "%s%s", dir, rel);
	return access(path, F_OK) == 0;
}

/* the device named `name` in a fresh device list (kept in *keep, to free later), or NULL */
static struct ibv_device *find(struct ibv_device ***keep)
{
	int n = 0, i;
	struct ibv_device **l = ibv_get_device_list(&n);
	*keep = l;
	for (i = 0; l && i < n; i++)
		if (strcmp(ibv_get_device_name(l[i]), name) == 0)
			return l[i];
	return NULL;
}

static const uint8_t key[40] = { 0x2c, 0xc6, 0x81, 0xd1, 0x5b, 0xdb, 0xf4, 0xf7, 0xfc, 0xa2,
				 0x83, 0x19, 0xdb, 0x1a, 0x3e, 0x94, 0x6b, 0x9e, 0x38, 0xd9,
				 0x2c, 0x9c, 0x03, 0xd1, 0xad, 0x99, 0x44, 0xa7, 0xd9, 0x56,
				 0x3d, 0x59, 0x06, 0x3c, 0x25, 0xf3, 0xfc, 0x1f, 0xdc, 0x2a };

struct world {
	int mlx5;
	uint8_t *mem; /* registered memory, reused by each bring-up */
	/* what a teardown clears: */
	struct ibv_context *ctx;
	struct ibv_pd *pd, *parent;
	struct ibv_mr *mr;
	struct ibv_cq *rx_cq[2], *tx_cq;
	struct ibv_wq *wq[2];
	struct ibv_rwq_ind_table *ind;
	struct ibv_qp *rss, *tx;
	struct ibv_flow *flow;
	/* MANA: what manadv_init_obj said about the queues (for the traffic) */
	struct manadv_qp mq;
	struct manadv_cq mc, rc[2];
	struct manadv_rwq mw[2];
};

struct eth_rule {
	struct ibv_flow_attr attr;
	struct ibv_flow_spec_eth eth;
};

static int to_rts(struct ibv_qp *qp)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PORT))
		return 1;
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		return 1;
	a.qp_state = IBV_QPS_RTS;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

static int wq_rdy(struct ibv_wq *q)
{
	struct ibv_wq_attr a = { .attr_mask = IBV_WQ_ATTR_STATE, .wq_state = IBV_WQS_RDY };
	return ibv_modify_wq(q, &a);
}

static struct ibv_flow *eth_flow(struct ibv_qp *qp)
{
	struct eth_rule r;
	memset(&r, 0, sizeof(r));
	r.attr.type = IBV_FLOW_ATTR_NORMAL;
	r.attr.size = sizeof(r);
	r.attr.num_of_specs = 1;
	r.attr.port = 1;
	r.eth.type = IBV_FLOW_SPEC_ETH;
	r.eth.size = sizeof(r.eth);
	memset(r.eth.val.dst_mac, 0xff, 6);
	memset(r.eth.mask.dst_mac, 0xff, 6);
	return ibv_create_flow(qp, &r.attr);
}

#define STEP(what, cond)                                                                  \
	do {                                                                              \
		if (!(cond)) {                                                            \
			printf("FAIL %s: errno %d (%s)\n", what, errno, strerror(errno)); \
			fails++;                                                          \
			return 0;                                                         \
		}                                                                         \
	} while (0)

/* The queues a PMD creates: PD (and a parent domain on MANA), MR, two RX CQs + WQs, the
 * indirection table, the RSS QP (with a flow rule on mlx5), a TX CQ + raw QP. */
static int bringup(struct world *w)
{
	struct ibv_wq_init_attr wa = { .wq_type = IBV_WQT_RQ, .max_wr = 256, .max_sge = 1 };
	struct ibv_rwq_ind_table_init_attr ia = { .log_ind_tbl_size = 1, .ind_tbl = w->wq };
	struct ibv_qp_init_attr_ex ra = {
		.qp_type = IBV_QPT_RAW_PACKET,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_IND_TABLE |
			     IBV_QP_INIT_ATTR_RX_HASH,
		.rx_hash_conf = { .rx_hash_function = IBV_RX_HASH_FUNC_TOEPLITZ,
				  .rx_hash_key_len = 40, .rx_hash_key = (uint8_t *)key,
				  .rx_hash_fields_mask = IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4 },
	};
	struct ibv_qp_init_attr ta = { .qp_type = IBV_QPT_RAW_PACKET,
				       .cap = { .max_send_wr = 256, .max_send_sge = 1 } };
	struct ibv_pd *qpd;
	int i;

	if (w->mlx5) {
		struct mlx5dv_ctx_allocators al = { .alloc = q_alloc, .free = q_free };
		STEP("mlx5dv_set_context_attr",
		     mlx5dv_set_context_attr(w->ctx, MLX5DV_CTX_ATTR_BUF_ALLOCATORS, &al) == 0);
	} else {
		struct manadv_ctx_allocators al = { .alloc = q_alloc, .free = q_free };
		STEP("manadv_set_context_attr",
		     manadv_set_context_attr(w->ctx, MANADV_CTX_ATTR_BUF_ALLOCATORS, &al) == 0);
	}
	STEP("ibv_alloc_pd", (w->pd = ibv_alloc_pd(w->ctx)));
	qpd = w->pd;
	if (!w->mlx5) {
		struct ibv_parent_domain_init_attr pa = {
			.pd = w->pd, .comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT,
			.pd_context = (void *)(uintptr_t)1 };
		STEP("ibv_alloc_parent_domain", (w->parent = ibv_alloc_parent_domain(w->ctx, &pa)));
		qpd = w->parent;
	}
	if (!w->mem && posix_memalign((void **)&w->mem, 4096, 1 << 20))
		return 0;
	memset(w->mem, 0, 1 << 20);
	STEP("ibv_reg_mr", (w->mr = ibv_reg_mr(w->pd, w->mem, 1 << 20, IBV_ACCESS_LOCAL_WRITE)));
	wa.pd = qpd;
	for (i = 0; i < 2; i++) {
		STEP("ibv_create_cq(rx)", (w->rx_cq[i] = ibv_create_cq(w->ctx, 255, NULL, NULL, 0)));
		wa.cq = w->rx_cq[i];
		STEP("ibv_create_wq", (w->wq[i] = ibv_create_wq(w->ctx, &wa)));
		if (w->mlx5)
			STEP("ibv_modify_wq(RDY)", wq_rdy(w->wq[i]) == 0);
	}
	STEP("ibv_create_rwq_ind_table", (w->ind = ibv_create_rwq_ind_table(w->ctx, &ia)));
	ra.pd = qpd;
	ra.rwq_ind_tbl = w->ind;
	STEP("ibv_create_qp_ex(rss)", (w->rss = ibv_create_qp_ex(w->ctx, &ra)));
	if (w->mlx5)
		STEP("ibv_create_flow", (w->flow = eth_flow(w->rss)));
	STEP("ibv_create_cq(tx)", (w->tx_cq = ibv_create_cq(w->ctx, 255, NULL, NULL, 0)));
	ta.send_cq = ta.recv_cq = w->tx_cq;
	STEP("ibv_create_qp(tx)", (w->tx = ibv_create_qp(qpd, &ta)));
	if (w->mlx5) {
		STEP("tx QP to RTS", to_rts(w->tx) == 0);
	} else {
		struct manadv_obj obj;
		memset(&obj, 0, sizeof(obj));
		obj.qp.in = w->tx;
		obj.qp.out = &w->mq;
		obj.cq.in = w->tx_cq;
		obj.cq.out = &w->mc;
		STEP("manadv_init_obj(tx)", manadv_init_obj(&obj, MANADV_OBJ_QP | MANADV_OBJ_CQ) == 0);
		for (i = 0; i < 2; i++) {
			memset(&obj, 0, sizeof(obj));
			obj.rwq.in = w->wq[i];
			obj.rwq.out = &w->mw[i];
			obj.cq.in = w->rx_cq[i];
			obj.cq.out = &w->rc[i];
			STEP("manadv_init_obj(rx)",
			     manadv_init_obj(&obj, MANADV_OBJ_RWQ | MANADV_OBJ_CQ) == 0);
		}
	}
	return 1;
}

/* Kick handles on the TX queue and both RX queues of `w` (MANA): the engine runs inline. */
static void open_kicks(struct world *w)
{
	void *(*kick_open)(struct ibv_context *, int, uint32_t) =
		(void *(*)(struct ibv_context *, int, uint32_t))dlsym(RTLD_DEFAULT,
								      "fake_rdma_kick_open");
	int i;
	if (!kick_open) {
		CHECK(0, "the fake exports fake_rdma_kick_open");
		return;
	}
	kicks[0] = kick_open(w->ctx, 0, w->mq.sq_id);
	for (i = 0; i < 2; i++)
		kicks[1 + i] = kick_open(w->ctx, 1, w->mw[i].wq_id);
	nkicks = 3;
	CHECK(kicks[0] && kicks[1] && kicks[2] && fake_threads() == 0,
	      "kick handles on the queues: the engine runs inline (%d engine threads)",
	      fake_threads());
}

/* Every object destroyed (DPDK's order), each destroy returning 0. */
static void teardown(struct world *w)
{
	int i;
	if (w->flow)
		WANT_RET(0, ibv_destroy_flow(w->flow));
	WANT_RET(0, ibv_destroy_qp(w->tx));
	WANT_RET(0, ibv_destroy_cq(w->tx_cq));
	WANT_RET(0, ibv_destroy_qp(w->rss));
	WANT_RET(0, ibv_destroy_rwq_ind_table(w->ind));
	for (i = 0; i < 2; i++) {
		WANT_RET(0, ibv_destroy_wq(w->wq[i]));
		WANT_RET(0, ibv_destroy_cq(w->rx_cq[i]));
	}
	WANT_RET(0, ibv_dereg_mr(w->mr));
	if (w->parent)
		WANT_RET(0, ibv_dealloc_pd(w->parent));
	WANT_RET(0, ibv_dealloc_pd(w->pd));
	memset(&w->ctx, 0, sizeof(*w) - offsetof(struct world, ctx));
}

/* After a disassociation the kernel lets every destroy through (the objects are gone):
 * even out of order, where a live context gets EBUSY. */
static void teardown_out_of_order(struct world *w)
{
	int i;
	WANT_RET(0, ibv_destroy_qp(w->rss)); /* mlx5: its flow rule still exists */
	WANT_RET(0, ibv_destroy_cq(w->tx_cq)); /* its QP still exists */
	if (w->parent)
		WANT_RET(0, ibv_dealloc_pd(w->parent));
	WANT_RET(0, ibv_dealloc_pd(w->pd)); /* its MR, WQs and QP still exist */
	WANT_RET(0, ibv_destroy_qp(w->tx));
	if (w->flow)
		WANT_RET(0, ibv_destroy_flow(w->flow));
	for (i = 0; i < 2; i++)
		WANT_RET(0, ibv_destroy_cq(w->rx_cq[i])); /* its WQ still exists */
	WANT_RET(0, ibv_destroy_wq(w->wq[0])); /* in a table */
	WANT_RET(0, ibv_destroy_rwq_ind_table(w->ind));
	WANT_RET(0, ibv_destroy_wq(w->wq[1]));
	WANT_RET(0, ibv_dereg_mr(w->mr));
	memset(&w->ctx, 0, sizeof(*w) - offsetof(struct world, ctx));
}

/* Waits (at most `secs`) for an async event on `ctx`; its type, or -1. */
static int wait_event(struct ibv_context *ctx, double secs, int *port)
{
	struct pollfd p = { .fd = ctx->async_fd, .events = POLLIN };
	struct ibv_async_event ev;
	int t;
	if (poll(&p, 1, (int)(secs * 1000)) != 1)
		return -1;
	if (ibv_get_async_event(ctx, &ev))
		return -1;
	t = ev.event_type;
	*port = ev.element.port_num;
	ibv_ack_async_event(&ev);
	return t;
}

/* Waits (at most `secs`) for the device to be listed again; its ibv_device, or NULL. */
static struct ibv_device *wait_back(double secs, struct ibv_device ***keep)
{
	double end = now() + secs;
	struct ibv_device *d;
	for (;;) {
		d = find(keep);
		if (d || now() > end)
			return d;
		ibv_free_device_list(*keep);
		*keep = NULL;
		usleep(20 * 1000);
	}
}

/* The checks while the device is being serviced, on the disassociated context `w`. */
static void while_serviced(struct world *w, struct ibv_device *old)
{
	struct ibv_port_attr pa;
	struct ibv_device_attr da;
	struct ibv_qp_attr qa = { .qp_state = IBV_QPS_RTS };
	struct ibv_qp_init_attr ta = { .qp_type = IBV_QPT_RAW_PACKET, .send_cq = w->tx_cq,
				       .recv_cq = w->tx_cq,
				       .cap = { .max_send_wr = 64, .max_send_sge = 1 } };
	struct ibv_async_event ev;
	struct ibv_device **l;
	union ibv_gid gid;
	void *spare;
	int a0, f0, r;

	/* the channel closed after DEVICE_FATAL: EIO, and it stays readable */
	fcntl(w->ctx->async_fd, F_SETFL, fcntl(w->ctx->async_fd, F_GETFL) | O_NONBLOCK);
	errno = 0;
	r = ibv_get_async_event(w->ctx, &ev);
	CHECK(r == -1 && errno == EIO, "the event channel is closed: ret %d errno %d (want EIO)", r,
	      errno);

	/* gone from the list and from the tree */
	CHECK(!find(&l), "%s is not in the device list during the service", name);
	ibv_free_device_list(l);
	CHECK(!exists(""), "its sysfs directory is gone during the service");
	WANT_NULL(ENOENT, ibv_open_device(old));
	CHECK(engines() == 1, "the device model's engine keeps its wire (%d engine)", engines());

	/* every command fails with EIO; the buffers a provider allocated first go back */
	WANT_RET(EIO, ibv_query_port(w->ctx, 1, &pa));
	WANT_RET(EIO, ibv_query_device(w->ctx, &da));
	WANT_RET(-1, ibv_query_gid(w->ctx, 1, 0, &gid));
	WANT_NULL(EIO, ibv_alloc_pd(w->ctx));
	a0 = allocs;
	f0 = frees;
	WANT_NULL(EIO, ibv_create_cq(w->ctx, 64, NULL, NULL, 0));
	WANT_NULL(EIO, ibv_create_qp(w->parent ? w->parent : w->pd, &ta));
	CHECK(allocs > a0 && allocs - a0 == frees - f0,
	      "the refused CQ and QP gave their buffers back (%d allocs, %d frees)", allocs - a0,
	      frees - f0);
	if (posix_memalign(&spare, 4096, 4096) == 0) {
		WANT_NULL(EIO, ibv_reg_mr(w->pd, spare, 4096, IBV_ACCESS_LOCAL_WRITE));
		free(spare);
	}
	WANT_NULL(EIO, ibv_create_comp_channel(w->ctx));
	if (w->mlx5) {
		WANT_RET(EIO, ibv_modify_qp(w->tx, &qa, IBV_QP_STATE));
		WANT_RET(EIO, wq_rdy(w->wq[0]));
		WANT_NULL(EIO, eth_flow(w->rss));
	}
}

/* MANA datapath (formats as in mana_bringup.c): one frame out of the TX queue, one in. */
static const uint8_t tx_frame[60] = { 0x02, 0, 0, 0, 0x10, 0x02, 0x02, 0, 0, 0, 0x10, 0x01,
				      0x88, 0xb5, 'a', 'f', 't', 'e', 'r', ' ', 't', 'h', 'e',
				      ' ', 's', 'e', 'r', 'v', 'i', 'c', 'e' };

static void put32(uint8_t *p, uint32_t v)
{
	memcpy(p, &v, 4);
}

static void write_wqe(void *ring, uint32_t oob0, uint32_t oob1, void *buf, uint32_t lkey,
		      uint32_t len)
{
	uint8_t wqe[32] = { 0 };
	uint64_t a = (uintptr_t)buf;
	put32(wqe + 4, 1 | (8 / 4) << 8);
	put32(wqe + 8, oob0);
	put32(wqe + 12, oob1);
	memcpy(wqe + 16, &a, 8);
	put32(wqe + 24, lkey);
	put32(wqe + 28, len);
	memcpy(ring, wqe, sizeof(wqe));
}

static void ring_doorbell(void *page, size_t off, uint32_t id, uint32_t tail)
{
	__atomic_store_n((uint64_t *)((char *)page + off),
			 (uint64_t)(id & 0xffffff) | (uint64_t)tail << 32, __ATOMIC_RELEASE);
}

static int first_cqe(const struct manadv_cq *cq, uint8_t out[64])
{
	const uint8_t *e = cq->buf;
	uint32_t info = __atomic_load_n((const uint32_t *)(e + 60), __ATOMIC_ACQUIRE);
	if (info >> 29 != 1)
		return 0;
	memcpy(out, e, 64);
	return 1;
}

static void traffic(struct world *w)
{
	uint8_t *mem = w->mem, cqe[64];
	uint32_t lkey = w->mr->lkey, len, k;
	double deadline;
	int i, got = -1;

	for (i = 0; i < 2; i++) {
		write_wqe(w->mw[i].buf, 0, 0, mem + 4096 * (i + 1), lkey, 2048);
		ring_doorbell(w->mw[i].db_page, 0x400, w->mw[i].wq_id, 32);
		kick_all(); /* inline: the device sees each RQ doorbell before the next one */
	}
	memcpy(mem, tx_frame, sizeof(tx_frame));
	write_wqe(w->mq.sq_buf, w->mc.cq_id << 8,
		  ((w->mq.sq_id >> 10) & 0x3fff) << 10 | (w->mq.tx_vp_offset & 0xff) << 24, mem, lkey,
		  sizeof(tx_frame));
	printf("ready for traffic\n");
	ring_doorbell(w->mq.db_page, 0, w->mq.sq_id, 32);
	for (deadline = now() + 10; (kick_all(), !first_cqe(&w->mc, cqe)) && now() < deadline;)
		usleep(100);
	CHECK((cqe[0] & 0x3f) == 32, "tx after the service: the frame went out (CQE type %d)",
	      cqe[0] & 0x3f);
	for (deadline = now() + 20; got < 0 && now() < deadline;) {
		kick_all();
		for (i = 0; i < 2 && got < 0; i++)
			if (first_cqe(&w->rc[i], cqe))
				got = i;
		usleep(100);
	}
	CHECK(got >= 0, "rx after the service: a CQE arrived");
	if (got < 0)
		return;
	memcpy(&len, cqe + 8, 4);
	len &= 0xffff;
	printf("rx: %u bytes:", len);
	for (k = 0; k < len && k < 2048; k++)
		printf(" %02x", mem[4096 * (got + 1) + k]);
	printf("\n");
}

int main(int argc, char **argv)
{
	struct world w;
	struct ibv_device **first, **again = NULL, **third = NULL;
	struct ibv_device *dev, *back;
	struct ibv_context *ctx;
	double t0, took;
	int t, quit, port = -1;

	if (argc < 3)
		return 2;
	setvbuf(stdout, NULL, _IOLBF, 0);
	memset(&w, 0, sizeof(w));
	w.mlx5 = strcmp(argv[1], "mlx5") == 0;
	dir = argv[2];
	name = strrchr(dir, '/') ? strrchr(dir, '/') + 1 : dir;

	/* 1. a context with every kind of queue */
	dev = find(&first);
	if (!dev) {
		printf("FAIL %s: not in the device list\n", name);
		return 1;
	}
	w.ctx = ibv_open_device(dev);
	if (!w.ctx || !bringup(&w)) {
		printf("FAIL bring-up: errno %d\n", errno);
		return 1;
	}
	CHECK(engines() == 1, "one engine serves the queues (%d)", engines());
	inl = argc > 3 && strcmp(argv[3], "traffic-inline") == 0;
	if (inl)
		open_kicks(&w);

	/* 2. the servicing: DEVICE_FATAL, element 0 */
	quit = argc > 3 && strcmp(argv[3], "quit") == 0;
	knob(quit ? "service 60" : "service 1");
	t0 = now();
	t = wait_event(w.ctx, 3, &port);
	CHECK(t == IBV_EVENT_DEVICE_FATAL && port == 0, "service: event %d element %d (want %d 0)",
	      t, port, IBV_EVENT_DEVICE_FATAL);
	if (quit) {
		CHECK(!exists(""), "its sysfs directory is gone during the service");
		printf("quitting during the service\n");
		return fails == 0 ? 0 : 1;
	}
	while_serviced(&w, dev);
	if (inl) {
		/* the queues are gone: nobody kicks the engine that keeps the wire */
		CHECK(fake_threads() == 1,
		      "during the service the queueless inline engine has a thread (%d)",
		      fake_threads());
		kick_all(); /* handles of destroyed queues: harmless */
		close_kicks();
	}

	/* 3. destroys succeed (out of order too), the buffers go back, nothing is left */
	ctx = w.ctx;
	teardown_out_of_order(&w);
	CHECK(live() == 1, "after the destroys only the context is alive (%d)", live());
	CHECK(allocs == frees && null_frees == (w.mlx5 ? 0 : 1),
	      "every queue buffer went back to the allocator (%d allocs, %d frees, %d free(NULL): "
	      "MANA's RSS QP)",
	      allocs, frees, null_frees);
	WANT_RET(0, ibv_close_device(ctx));
	CHECK(live() == 0, "after the close nothing is alive (%d)", live());

	/* 4. back after the time given, healthy, under a new ibv_device */
	back = wait_back(5, &again);
	took = now() - t0;
	CHECK(back != NULL && took > 0.8, "%s is listed again after %.1f s", name, took);
	if (!back)
		return 1;
	CHECK(back != dev, "a new ibv_device for the new registration");
	CHECK(exists("") && !exists("/fake_rdma_fatal"), "back in sysfs, the knob gone");
	if (argc > 3 && strcmp(argv[3], "once") == 0) {
		ibv_free_device_list(first);
		ibv_free_device_list(again);
		free(w.mem);
		printf("allocs %d frees %d live %d\n", allocs, frees, live());
		if (fails == 0 && allocs == frees && live() == 0)
			printf("OK\n");
		return fails == 0 ? 0 : 1;
	}

	/* 5. a new context works */
	w.ctx = ibv_open_device(back);
	CHECK(w.ctx != NULL, "ibv_open_device after the service");
	if (!w.ctx || !bringup(&w))
		return 1;
	CHECK(engines() == 1, "one engine serves the new queues (%d)", engines());
	if (inl) {
		CHECK(fake_threads() == 0, "new queues: the engine is inline again (%d threads)",
		      fake_threads());
		open_kicks(&w);
	}
	if (argc > 3 && (strcmp(argv[3], "traffic") == 0 || inl))
		traffic(&w);

	/* 6. a second service works too; then the context is torn down in order */
	knob("service 0.2");
	t = wait_event(w.ctx, 3, &port);
	CHECK(t == IBV_EVENT_DEVICE_FATAL && port == 0, "second service: event %d element %d", t,
	      port);
	WANT_NULL(EIO, ibv_alloc_pd(w.ctx));
	ctx = w.ctx;
	teardown(&w);
	WANT_RET(0, ibv_close_device(ctx));
	close_kicks(); /* after their queues and context */
	back = wait_back(5, &third);
	CHECK(back != NULL, "listed again after the second service");
	w.ctx = back ? ibv_open_device(back) : NULL;
	CHECK(w.ctx != NULL, "a context after the second service");
	if (w.ctx)
		ibv_close_device(w.ctx);

	ibv_free_device_list(first);
	ibv_free_device_list(again);
	ibv_free_device_list(third);
	free(w.mem);
	printf("allocs %d frees %d live %d\n", allocs, frees, live());
	if (fails == 0 && allocs == frees && live() == 0)
		printf("OK\n");
	return fails == 0 ? 0 : 1;
}
