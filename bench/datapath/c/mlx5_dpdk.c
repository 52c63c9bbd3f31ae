/* SPDX-License-Identifier: MIT OR Apache-2.0
 *
 * mlx5_dpdk: what DPDK's net/mlx5 datapath costs per packet, with a device that costs
 * nothing: mlx5_rx_burst (scalar), mlx5_rx_burst_vec (SSE) and mlx5_tx_burst_none_empw (the
 * eMPW routine DPDK's own selection picks for a ConnectX-5/6 queue without offloads and
 * without inlining, i.e. fewer than 8 TX queues), linked from DPDK's own static
 * librte_net_mlx5 as the DPDK build compiled it.
 *
 * Harness code only: no DPDK code is copied here. Queue structures are filled the way
 * mlx5_rx_queue_setup / mlx5_rxq_new, the DevX queue creation (mlx5_devx.c), rxq_alloc_elts_sprq
 * and mlx5_tx_queue_setup / mlx5_txq_new / txq_alloc_elts leave them for one queue of 256
 * descriptors, over memory this program owns: RQ 256 x 16 B, RX CQ 256 x 64 B (CQE
 * compression off: the device double writes plain CQEs), SQ 256 WQEBBs, TX CQ 32 entries
 * (256/32 + 1 + 8 rounded up), doorbell records and a UAR page of ordinary memory. The RQ's
 * WQEs are written by DPDK's own mlx5_rxq_initialize. Memory keys: one MR covering every
 * address with lkey 0x00abcdef sits in each queue's per-queue MR cache, so DPDK's inline
 * lookup finds it (as after warm-up on hardware).
 *
 * The device double is the same logic as bench/src/bin/datapath/mlx5.rs: TX: a requester CQE
 * for every WQE whose control segment asks for one (CE = 2); RX: frame + responder CQE for
 * every WQE the RQ doorbell record covers. Only the burst calls are timed (lfence; rdtsc; lfence).
 *
 * Usage: mlx5_dpdk [EAL args] -- [--bursts N] [--warmup N] [--paths tx,rx,rxv]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include <sys/mman.h>

#include <rte_eal.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_malloc.h>
#include <ethdev_driver.h>

#include "mlx5.h"
#include "mlx5_rx.h"
#include "mlx5_tx.h"
#include "mlx5_rxtx.h"

#define RING 256u
#define BURST 32u
#define RX_CQ_N 256u
#define TX_CQ_N 32u
#define CQE_B 64u
#define SQN 0x1234u
#define LKEY 0x00abcdefu
#define RX_HASH 0x9e3779b9u
#define POOL_MBUFS 8192u
#define POOL_CACHE 512u

#include "harness.h"

uint16_t mlx5_rx_burst_vec(void *dpdk_rxq, struct rte_mbuf **pkts, uint16_t pkts_n);

static uint32_t
be32(const uint8_t *p)
{
	return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

static void
put_be32(uint8_t *p, uint32_t v)
{
	p[0] = v >> 24;
	p[1] = v >> 16;
	p[2] = v >> 8;
	p[3] = v;
}

/* A CQ as created: every entry op_own = 0xf1 (opcode INVALID, owner 1), byte 62 = 0xff. */
static uint8_t *
new_cq(unsigned int n)
{
	uint8_t *cq = anon(n * CQE_B);
	for (unsigned int i = 0; i < n; i++) {
		cq[i * CQE_B + 62] = 0xff;
		cq[i * CQE_B + 63] = 0xf1;
	}
	return cq;
}

/* ---------------------------------------------------------------------------------------- */
/* The device double (identical logic in bench/src/bin/datapath/mlx5.rs) */

struct cq_writer {
	uint8_t *mem;
	uint32_t count;
	uint64_t n;
};

/* Bytes 0..59 first, then dword 60..63 (WQE counter, signature, op_own with the lap's owner
 * bit) with a release store. */
static void
cq_push(struct cq_writer *cq, const uint8_t body[64])
{
	uint8_t *e = cq->mem + (size_t)(cq->n % cq->count) * CQE_B;
	memcpy(e, body, 60);
	uint8_t last[4] = { body[60], body[61], body[62], (uint8_t)(body[63] | ((cq->n / cq->count) & 1)) };
	uint32_t v;
	memcpy(&v, last, 4);
	__atomic_store_n((uint32_t *)(e + 60), v, __ATOMIC_RELEASE);
	cq->n++;
}

struct tx_dev {
	uint8_t *sq;
	uint32_t wqe_cnt;
	uint8_t *dbrec; /* send counter at +4 */
	struct cq_writer cq;
	uint16_t pos; /* device consumer, WQEBBs */
	uint64_t wqes;
};

static void
tx_dev_step(struct tx_dev *d)
{
	uint32_t rec = __atomic_load_n((uint32_t *)(d->dbrec + 4), __ATOMIC_ACQUIRE);
	uint16_t prod = (uint16_t)be32((uint8_t *)&rec);
	while (d->pos != prod) {
		uint8_t *w = d->sq + (size_t)(d->pos & (d->wqe_cnt - 1)) * 64;
		uint32_t op = be32(w);
		uint32_t ds = be32(w + 4) & 0x3f;
		uint32_t ce = (w[11] >> 2) & 3;
		if (ce == 2) {
			uint8_t body[64] = { 0 };
			body[56] = (uint8_t)op;
			body[57] = (uint8_t)(SQN >> 16);
			body[58] = (uint8_t)(SQN >> 8);
			body[59] = (uint8_t)SQN;
			body[60] = (uint8_t)(op >> 16);
			body[61] = (uint8_t)(op >> 8);
			body[63] = 0x00; /* REQ, format 0 */
			cq_push(&d->cq, body);
		}
		d->pos += (uint16_t)((ds + 3) / 4);
		d->wqes++;
	}
}

struct rx_dev {
	uint8_t *rq; /* 16-byte WQEs */
	uint32_t wqe_cnt;
	uint8_t *dbrec; /* receive counter at +0 */
	struct cq_writer cq;
	uint16_t pos;
	uint64_t filled;
};

static void
rx_dev_step(struct rx_dev *d)
{
	uint32_t rec = __atomic_load_n((uint32_t *)d->dbrec, __ATOMIC_ACQUIRE);
	uint16_t prod = (uint16_t)be32((uint8_t *)&rec);
	while (d->pos != prod) {
		uint8_t *w = d->rq + (size_t)(d->pos & (d->wqe_cnt - 1)) * 16;
		uint64_t addr = ((uint64_t)be32(w + 8) << 32) | be32(w + 12);
		memcpy((void *)(uintptr_t)addr, FRAME, 60);
		uint8_t body[64] = { 0 };
		put_be32(body + 12, RX_HASH);
		body[16] = 0x84; /* hash over IPv4 + UDP */
		body[28] = 0x07; /* L2, L3, L4 OK */
		body[29] = 0x28; /* IPv4, UDP */
		put_be32(body + 44, 60);
		body[60] = (uint8_t)(d->pos >> 8);
		body[61] = (uint8_t)d->pos;
		body[63] = 0x20; /* RESP_SEND, format 0 */
		cq_push(&d->cq, body);
		d->pos++;
		d->filled++;
	}
}

/* ---------------------------------------------------------------------------------------- */

static uint32_t dev_gen;

/* The per-queue MR cache holding one region over every address (BE lkey, as DPDK stores it). */
static void
mr_ctrl_setup(struct mlx5_mr_ctrl *mr)
{
	if (mlx5_mr_ctrl_init(mr, &dev_gen, rte_socket_id())) {
		fprintf(stderr, "mlx5_mr_ctrl_init failed\n");
		exit(1);
	}
	mr->cache[0].start = 1;
	mr->cache[0].end = UINTPTR_MAX;
	mr->cache[0].lkey = rte_cpu_to_be_32(LKEY);
	mr->mru = 0;
	mr->head = 1;
}

static uint32_t *
run_tx(struct rte_mempool *mp, size_t warm, size_t bursts)
{
	int socket = rte_socket_id();
	struct mlx5_txq_ctrl *ctrl = rte_zmalloc_socket("txq", sizeof(*ctrl) + RING * sizeof(struct rte_mbuf *),
							RTE_CACHE_LINE_SIZE, socket);
	struct mlx5_txq_data *txq = &ctrl->txq;
	/* mlx5_txq_new / txq_set_params: no offloads, no inlining, 1 queue, eMPW (mps = 2) */
	txq->elts_n = 8;
	txq->elts_s = RING;
	txq->elts_m = RING - 1;
	txq->port_id = 0;
	txq->idx = 0;
	txq->offloads = 0;
	txq->inlen_send = 0;
	txq->inlen_empw = 0;
	txq->inlen_mode = 0;
	mr_ctrl_setup(&txq->mr_ctrl);
	/* DevX objects (mlx5_txq_devx_obj_new) over our memory */
	uint8_t *cq = new_cq(TX_CQ_N), *sq = anon(RING * 64), *dbrec = anon(4096), *uar = anon(4096);
	txq->cqe_n = 5;
	txq->cqe_s = TX_CQ_N;
	txq->cqe_m = TX_CQ_N - 1;
	txq->cqes = (volatile struct mlx5_cqe *)cq;
	txq->cq_ci = 0;
	txq->cq_pi = 0;
	txq->cq_db = (volatile uint32_t *)(dbrec + 0x40);
	txq->wqe_n = 8;
	txq->wqe_s = RING;
	txq->wqe_m = RING - 1;
	txq->wqes = (struct mlx5_wqe *)sq;
	txq->wqes_end = txq->wqes + txq->wqe_s;
	txq->wqe_ci = 0;
	txq->wqe_pi = 0;
	txq->wqe_comp = 0;
	txq->wqe_thres = txq->wqe_s / MLX5_TX_COMP_THRESH_INLINE_DIV;
	txq->qp_db = (volatile uint32_t *)(dbrec + 4);
	txq->qp_num_8s = SQN << 8;
	txq->db_heu = 0;
	txq->db_nc = 1;
	txq->fcqs = rte_zmalloc_socket("fcqs", txq->cqe_s * sizeof(*txq->fcqs), RTE_CACHE_LINE_SIZE, socket);
	/* txq_alloc_elts */
	txq->elts_head = 0;
	txq->elts_tail = 0;
	txq->elts_comp = 0;
	/* The BlueFlame register: the process's UAR table entry of this queue */
	struct mlx5_proc_priv *pp = rte_zmalloc_socket("proc_priv", sizeof(*pp) + sizeof(struct mlx5_uar_data), 0, socket);
	pp->uar_table_sz = 1;
	pp->uar_table[0].db = (uint64_t *)(uar + 0x800);
	rte_eth_devices[0].process_private = pp;

	struct tx_dev dev = { .sq = sq, .wqe_cnt = RING, .dbrec = dbrec, .cq = { cq, TX_CQ_N, 0 } };
	struct rte_mbuf *pkts[BURST];
	uint32_t *ticks = malloc(sizeof(uint32_t) * bursts);
	for (size_t i = 0; i < warm + bursts; i++) {
		fill_burst(mp, pkts);
		uint64_t t0 = rdtsc();
		uint16_t n = mlx5_tx_burst_none_empw(txq, pkts, BURST);
		uint64_t t1 = rdtsc();
		if (n != BURST) {
			fprintf(stderr, "tx_burst took %u (burst %zu)\n", n, i);
			exit(1);
		}
		tx_dev_step(&dev);
		if (i >= warm)
			ticks[i - warm] = (uint32_t)(t1 - t0);
	}
	if (dev.cq.n == 0) {
		fprintf(stderr, "no completion requested\n");
		exit(1);
	}
	fprintf(stderr, "INFO side=dpdk path=mlx5_tx_empw wqes=%lu cqes=%lu bursts=%zu\n",
		(unsigned long)dev.wqes, (unsigned long)dev.cq.n, warm + bursts);
	return ticks;
}

static uint32_t *
run_rx(struct rte_mempool *mp, size_t warm, size_t bursts, int vec)
{
	int socket = rte_socket_id();
	unsigned int desc_n = RING + (vec ? MLX5_VPMD_DESCS_PER_LOOP : 0);
	struct mlx5_rxq_ctrl *ctrl = rte_zmalloc_socket("rxq", sizeof(*ctrl) + desc_n * sizeof(struct rte_mbuf *),
							RTE_CACHE_LINE_SIZE, socket);
	struct mlx5_rxq_data *rxq = &ctrl->rxq;
	ctrl->socket = socket;
	/* mlx5_rxq_new: one segment per packet, checksum offload, RSS hash, no VLAN strip */
	rxq->rxseg[0].mp = mp;
	rxq->rxseg[0].offset = RTE_PKTMBUF_HEADROOM;
	rxq->rxseg[0].length = rte_pktmbuf_data_room_size(mp) - RTE_PKTMBUF_HEADROOM;
	rxq->rxseg_n = 1;
	rxq->sges_n = 0;
	rxq->csum = 1;
	rxq->hw_timestamp = 0;
	rxq->vlan_strip = 0;
	rxq->crc_present = 0;
	rxq->lro = 0;
	rxq->rss_hash = 1;
	rxq->port_id = 0;
	rxq->mp = mp;
	rxq->elts_n = 8;
	rxq->rq_repl_thresh = MLX5_VPMD_RXQ_RPLNSH_THRESH(desc_n);
	rxq->elts = (struct rte_mbuf *(*)[])(ctrl + 1);
	rxq->idx = 0;
	rxq->byte_mask = UINT32_MAX;
	mr_ctrl_setup(&rxq->mr_ctrl);
	/* DevX objects over our memory */
	uint8_t *cq = new_cq(RX_CQ_N), *rq = anon(RING * 16), *dbrec = anon(4096);
	rxq->cqes = (volatile struct mlx5_cqe(*)[])cq;
	rxq->cq_db = (volatile uint32_t *)(dbrec + 0x40);
	rxq->cqe_n = 8;
	rxq->cqn = 7;
	rxq->cq_ci = 0;
	rxq->wqes = rq;
	rxq->rq_db = (volatile uint32_t *)dbrec;
	/* rxq_alloc_elts_sprq's result: one mbuf per WQE, data_off = headroom, data_len = the
	 * buffer; for the vectorized burst also the rearm template and the padding entries. */
	for (unsigned int i = 0; i < RING; i++) {
		struct rte_mbuf *b = rte_pktmbuf_alloc(mp);
		if (!b) {
			fprintf(stderr, "mbuf alloc failed\n");
			exit(1);
		}
		b->data_off = rxq->rxseg[0].offset;
		b->port = rxq->port_id;
		b->data_len = rxq->rxseg[0].length;
		b->pkt_len = rxq->rxseg[0].length;
		b->nb_segs = 1;
		(*rxq->elts)[i] = b;
	}
	if (vec) {
		struct rte_mbuf *init = &rxq->fake_mbuf;
		init->data_off = RTE_PKTMBUF_HEADROOM;
		rte_mbuf_refcnt_set(init, 1);
		init->nb_segs = 1;
		init->port = rxq->port_id;
		rte_compiler_barrier();
		rxq->mbuf_initializer = *(rte_xmm_t *)&init->rearm_data;
		for (unsigned int j = 0; j < MLX5_VPMD_DESCS_PER_LOOP; j++)
			(*rxq->elts)[RING + j] = &rxq->fake_mbuf;
	}
	if (mlx5_rxq_initialize(rxq)) {
		fprintf(stderr, "mlx5_rxq_initialize failed\n");
		exit(1);
	}

	struct rx_dev dev = { .rq = rq, .wqe_cnt = RING, .dbrec = dbrec, .cq = { cq, RX_CQ_N, 0 } };
	struct rte_mbuf *pkts[BURST];
	uint32_t *ticks = malloc(sizeof(uint32_t) * bursts);
	for (size_t i = 0; i < warm + bursts; i++) {
		rx_dev_step(&dev);
		uint64_t t0 = rdtsc();
		uint16_t n = vec ? mlx5_rx_burst_vec(rxq, pkts, BURST) : mlx5_rx_burst(rxq, pkts, BURST);
		uint64_t t1 = rdtsc();
		if (n != BURST) {
			fprintf(stderr, "rx_burst gave %u (burst %zu)\n", n, i);
			exit(1);
		}
		if (i == 0 || i == warm) {
			struct rte_mbuf *m = pkts[0];
			if (m->data_len != 60 || m->pkt_len != 60 ||
			    memcmp(rte_pktmbuf_mtod(m, void *), FRAME, 60) ||
			    !(m->ol_flags & RTE_MBUF_F_RX_RSS_HASH) || m->hash.rss != RX_HASH ||
			    !(m->ol_flags & RTE_MBUF_F_RX_L4_CKSUM_GOOD)) {
				fprintf(stderr, "bad packet: len %u flags %#lx hash %#x\n", m->data_len,
					(unsigned long)m->ol_flags, m->hash.rss);
				exit(1);
			}
		}
		rte_pktmbuf_free_bulk(pkts, n);
		if (i >= warm)
			ticks[i - warm] = (uint32_t)(t1 - t0);
	}
	fprintf(stderr, "INFO side=dpdk path=%s filled=%lu cqes=%lu bursts=%zu\n", vec ? "mlx5_rx_vec" : "mlx5_rx_scalar",
		(unsigned long)dev.filled, (unsigned long)dev.cq.n, warm + bursts);
	return ticks;
}

int
main(int argc, char **argv)
{
	int used = rte_eal_init(argc, argv);
	if (used < 0) {
		fprintf(stderr, "rte_eal_init failed\n");
		return 1;
	}
	argc -= used;
	argv += used;
	size_t bursts = 200000, warm = 20000;
	const char *paths = "tx,rx,rxv";
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--bursts"))
			bursts = strtoul(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--warmup"))
			warm = strtoul(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--paths"))
			paths = argv[i + 1];
		else if (!strcmp(argv[i], "--hash-type"))
			; /* MANA only */
		else {
			fprintf(stderr, "unknown argument %s\n", argv[i]);
			return 1;
		}
	}
	/* Probe-time tables of the datapath (mlx5_set_*_table, as mlx5 probing calls them). */
	mlx5_set_ptype_table();
	mlx5_set_cksum_table();
	mlx5_set_swp_types_table();
	struct rte_mempool *mp = rte_pktmbuf_pool_create("perf", POOL_MBUFS, POOL_CACHE, 0,
							 RTE_MBUF_DEFAULT_BUF_SIZE, rte_socket_id());
	if (!mp) {
		fprintf(stderr, "pool: %s\n", rte_strerror(rte_errno));
		return 1;
	}
	double hz = tsc_hz();
	char buf[64];
	snprintf(buf, sizeof(buf), "%s", paths);
	for (char *p = strtok(buf, ","); p; p = strtok(NULL, ",")) {
		uint32_t *t;
		const char *name;
		if (!strcmp(p, "tx")) {
			t = run_tx(mp, warm, bursts);
			name = "mlx5_tx_empw";
		} else if (!strcmp(p, "rx")) {
			t = run_rx(mp, warm, bursts, 0);
			name = "mlx5_rx_scalar";
		} else if (!strcmp(p, "rxv")) {
			t = run_rx(mp, warm, bursts, 1);
			name = "mlx5_rx_vec";
		} else {
			fprintf(stderr, "unknown path %s\n", p);
			return 1;
		}
		report(name, t, bursts, hz);
		free(t);
	}
	rte_eal_cleanup();
	return 0;
}
