/* SPDX-License-Identifier: MIT OR Apache-2.0
 *
 * mana_dpdk: what DPDK's net/mana datapath (mana_tx_burst, mana_rx_burst, as compiled from an
 * unmodified DPDK source tree) costs per packet, with a device that costs nothing.
 *
 * Harness code only: no DPDK code is copied here. The driver files gdma.c, tx.c and mr.c are
 * compiled from the DPDK tree as they are; rx.c through mana_rx_tu.c (which includes it, to
 * reach its static refill function for the initial fill that mana_start_rx_queues does).
 *
 * Queue memory and queue structures are set up the way mana_dev_{tx,rx}_queue_setup and
 * mana_start_{tx,rx}_queues set them up, over memory this program owns instead of what
 * rdma-core returns: SQ 64 KiB, RQ 8 KiB, CQs of 256 entries, a 4096-byte doorbell page
 * (the geometry rdma-core gives for 256 descriptors, spec section 1.7). Memory registration
 * uses DPDK's own mr.c caches; ibv_reg_mr (called once per pool chunk, on the first miss) is a
 * stand-in that returns lkey 0x00abcdef.
 *
 * The device double is the same logic as bench/src/bin/datapath/mana.rs (see there): TX CQEs
 * for every WQE whose suppress bit is clear, RX frames + CQEs for every posted WQE (RX_OKAY, or
 * RX_COALESCED_4 with four packets per CQE). Only the burst calls are timed, with
 * lfence; rdtsc; lfence on each side.
 *
 * Written for DPDK v26.07. Older trees (Debian 12's 22.11) lack some queue fields and take no
 * count in the RX refill; bench/compare_datapath.sh finds which in the tree's mana.h and rx.c
 * and passes HARNESS_MANA_QUEUE_IDX (txq_idx / rxq_idx), HARNESS_MANA_RX_BACKLOG (the RX
 * completion backlog), HARNESS_MANA_VLAN_STRIP and HARNESS_MANA_REFILL_COUNT accordingly.
 *
 * Usage: mana_dpdk [EAL args] -- [--bursts N] [--warmup N] [--paths tx,rx,rxc] [--hash-type HEX]
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
#include <rte_log.h>
#include <ethdev_driver.h>

#include "mana.h"

#define RING 256u
#define BURST 32u
#define SQ_BYTES (256u * 256u)
#define RQ_BYTES (256u * 32u)
#define CQ_COUNT 256u
#define CQE 64u
#define DB_SQ 0x000u
#define DB_RQ 0x400u
#define SQ_ID 0x00012345u
#define TX_CQ_ID 0x00000101u
#define RQ_ID 0x00012346u
#define RX_CQ_ID 0x00000102u
#define LKEY 0x00abcdefu
#define RX_HASH 0x9e3779b9u
#define POOL_MBUFS 8192u
#define POOL_CACHE 512u

#include "harness.h"

/* rx.c's static refill (mana_alloc_and_post_rx_wqes), reached through mana_rx_tu.c. */
int perf_rx_initial_post(struct mana_rxq *rxq, uint32_t count);

/* ---------------------------------------------------------------------------------------- */
/* The device double (identical logic in bench/src/bin/datapath/mana.rs) */

struct cq_writer {
	uint8_t *mem;
	uint32_t count;
	uint64_t n;
};

static void
cq_push(struct cq_writer *cq, const uint8_t body[60], uint32_t wq, int is_sq)
{
	size_t slot = (size_t)(cq->n % cq->count) * CQE;
	memcpy(cq->mem + slot, body, 60);
	uint32_t owner = (uint32_t)((cq->n / cq->count + 1) % 8);
	uint32_t info = (wq & 0x00ffffffu) | ((uint32_t)!!is_sq << 24) | (owner << 29);
	__atomic_store_n((uint32_t *)(cq->mem + slot + 60), info, __ATOMIC_RELEASE);
	cq->n++;
}

static inline void
put32(uint8_t *p, uint32_t v)
{
	memcpy(p, &v, 4);
}

struct tx_dev {
	uint8_t *sq;
	uint8_t *db;
	struct cq_writer cq;
	uint32_t pos; /* device consumer position, bytes, free-running */
	uint64_t wqes;
};

static void
tx_dev_step(struct tx_dev *d)
{
	uint32_t prod = (uint32_t)(__atomic_load_n((uint64_t *)(d->db + DB_SQ), __ATOMIC_ACQUIRE) >> 32);
	while (d->pos != prod) {
		size_t off = d->pos & (SQ_BYTES - 1);
		uint32_t d1 = __atomic_load_n((uint32_t *)(d->sq + off + 4), __ATOMIC_RELAXED);
		uint32_t nsge = d1 & 0xff;
		if (nsge < 1)
			nsge = 1;
		uint32_t oob = ((d1 >> 8) & 7) * 4;
		uint32_t bytes = (8 + oob + 16 * nsge + 31) / 32 * 32;
		uint32_t oob0 = __atomic_load_n((uint32_t *)(d->sq + off + 8), __ATOMIC_RELAXED);
		if (!(oob0 & (1u << 7))) {
			uint8_t body[60] = { 0 };
			put32(body, 32u | (1u << 6)); /* TX_OKAY, client type 1 */
			put32(body + 8, (uint32_t)off & ~31u);
			cq_push(&d->cq, body, SQ_ID, 1);
		}
		d->pos += bytes;
		d->wqes++;
	}
}

struct rx_dev {
	uint8_t *rq;
	uint8_t *db;
	struct cq_writer cq;
	uint32_t pos;
	int coalesce;
	uint32_t hash_type;
	uint64_t filled;
};

static void
rx_dev_step(struct rx_dev *d)
{
	uint32_t prod = (uint32_t)(__atomic_load_n((uint64_t *)(d->db + DB_RQ), __ATOMIC_ACQUIRE) >> 32);
	uint32_t group = d->coalesce ? 4 : 1;
	while ((prod - d->pos) / 32 >= group) {
		uint8_t body[60] = { 0 };
		uint32_t ty = d->coalesce ? 2 : 1;
		put32(body, ty | (1u << 6));
		put32(body + 4, (d->hash_type << 16) | (1u << 25) | (1u << 29));
		for (uint32_t k = 0; k < group; k++) {
			size_t off = d->pos & (RQ_BYTES - 1);
			uintptr_t addr = (uintptr_t)__atomic_load_n((uint64_t *)(d->rq + off + 16), __ATOMIC_RELAXED);
			memcpy((void *)addr, FRAME, 60);
			size_t p = 8 + 12 * k;
			put32(body + p, 60);
			put32(body + p + 8, RX_HASH);
			d->pos += 32;
		}
		cq_push(&d->cq, body, RQ_ID, 0);
		d->filled += group;
	}
}

/* ---------------------------------------------------------------------------------------- */

static struct mana_priv priv;
static struct rte_eth_dev_data dev_data;

static uint32_t *
run_tx(struct rte_mempool *mp, size_t warm, size_t bursts)
{
	int socket = rte_socket_id();
	struct mana_txq *txq = rte_zmalloc_socket("mana_txq", sizeof(*txq), 0, socket);
	txq->socket = socket;
	txq->desc_ring = rte_malloc_socket("mana_tx_desc_ring", sizeof(struct mana_txq_desc) * RING,
					   RTE_CACHE_LINE_SIZE, socket);
	txq->gdma_comp_buf = rte_malloc_socket("mana_txq_comp", sizeof(*txq->gdma_comp_buf) * RING,
					       RTE_CACHE_LINE_SIZE, socket);
	if (mana_mr_btree_init(&txq->mr_btree, MANA_MR_BTREE_PER_QUEUE_N, socket))
		exit(1);
	txq->desc_ring_head = 0;
	txq->desc_ring_tail = 0;
	txq->priv = &priv;
	txq->num_desc = RING;
	/* mana_start_tx_queues, with manadv_init_obj's outputs replaced by our memory */
#ifdef HARNESS_MANA_QUEUE_IDX
	txq->txq_idx = 0;
#endif
	uint8_t *sq = anon(SQ_BYTES), *cq = anon(CQ_COUNT * CQE);
	txq->gdma_sq.buffer = sq;
	txq->gdma_sq.count = RING; /* sq_count = max_send_wr */
	txq->gdma_sq.size = SQ_BYTES;
	txq->gdma_sq.id = SQ_ID;
	txq->tx_vp_offset = 0;
	txq->gdma_cq.buffer = cq;
	txq->gdma_cq.count = CQ_COUNT;
	txq->gdma_cq.size = CQ_COUNT * COMP_ENTRY_SIZE;
	txq->gdma_cq.id = TX_CQ_ID;
	txq->gdma_cq.head = txq->gdma_cq.count;

	struct tx_dev dev = { .sq = sq, .db = priv.db_page, .cq = { cq, CQ_COUNT, 0 } };
	struct rte_mbuf *pkts[BURST];
	uint32_t *ticks = malloc(sizeof(uint32_t) * bursts);
	for (size_t i = 0; i < warm + bursts; i++) {
		fill_burst(mp, pkts);
		uint64_t t0 = rdtsc();
		uint16_t n = mana_tx_burst(txq, pkts, BURST);
		uint64_t t1 = rdtsc();
		if (n != BURST) {
			fprintf(stderr, "tx_burst took %u\n", n);
			exit(1);
		}
		tx_dev_step(&dev);
		if (i >= warm)
			ticks[i - warm] = (uint32_t)(t1 - t0);
	}
	if (dev.wqes != (uint64_t)(warm + bursts) * BURST) {
		fprintf(stderr, "device saw %lu WQEs\n", (unsigned long)dev.wqes);
		exit(1);
	}
	return ticks;
}

static uint32_t *
run_rx(struct rte_mempool *mp, size_t warm, size_t bursts, int coalesce, uint32_t hash_type)
{
	int socket = rte_socket_id();
	struct mana_rxq *rxq = rte_zmalloc_socket("mana_rxq", sizeof(*rxq), 0, socket);
	rxq->socket = socket;
	rxq->desc_ring = rte_zmalloc_socket("mana_rx_mbuf_ring", sizeof(struct mana_rxq_desc) * RING,
					    RTE_CACHE_LINE_SIZE, socket);
	rxq->desc_ring_head = 0;
	rxq->desc_ring_tail = 0;
	rxq->gdma_comp_buf = rte_malloc_socket("mana_rxq_comp", sizeof(*rxq->gdma_comp_buf) * RING,
					       RTE_CACHE_LINE_SIZE, socket);
	if (mana_mr_btree_init(&rxq->mr_btree, MANA_MR_BTREE_PER_QUEUE_N, socket))
		exit(1);
	rxq->priv = &priv;
	rxq->num_desc = RING;
	rxq->mp = mp;
	/* mana_start_rx_queues, with manadv_init_obj's outputs replaced by our memory */
#ifdef HARNESS_MANA_QUEUE_IDX
	rxq->rxq_idx = 0;
#endif
	uint8_t *rq = anon(RQ_BYTES), *cq = anon(CQ_COUNT * CQE);
	rxq->gdma_cq.buffer = cq;
	rxq->gdma_cq.count = CQ_COUNT;
	rxq->gdma_cq.size = CQ_COUNT * COMP_ENTRY_SIZE;
	rxq->gdma_cq.id = RX_CQ_ID;
	rxq->gdma_cq.head = rxq->gdma_cq.count;
	rxq->gdma_rq.buffer = rq;
	rxq->gdma_rq.count = RING; /* rwq count = max_wr */
	rxq->gdma_rq.size = RQ_BYTES;
	rxq->gdma_rq.id = RQ_ID;
#ifdef HARNESS_MANA_RX_BACKLOG
	rxq->comp_buf_len = 0;
	rxq->comp_buf_idx = 0;
	rxq->backlog_idx = 0;
#endif
	if (perf_rx_initial_post(rxq, rxq->num_desc)) {
		fprintf(stderr, "initial RX post failed\n");
		exit(1);
	}

	struct rx_dev dev = { .rq = rq, .db = priv.db_page, .cq = { cq, CQ_COUNT, 0 },
			      .coalesce = coalesce, .hash_type = hash_type };
	struct rte_mbuf *pkts[BURST];
	uint32_t *ticks = malloc(sizeof(uint32_t) * bursts);
	for (size_t i = 0; i < warm + bursts; i++) {
		rx_dev_step(&dev);
		uint64_t t0 = rdtsc();
		uint16_t n = mana_rx_burst(rxq, pkts, BURST);
		uint64_t t1 = rdtsc();
		if (n != BURST) {
			fprintf(stderr, "rx_burst gave %u\n", n);
			exit(1);
		}
		if (i == 0) {
			if (pkts[0]->data_len != 60 ||
			    memcmp(rte_pktmbuf_mtod(pkts[0], void *), FRAME, 60)) {
				fprintf(stderr, "first packet differs from the frame\n");
				exit(1);
			}
			if (hash_type == 0x1b6 && pkts[0]->hash.rss != RX_HASH) {
				fprintf(stderr, "hash not delivered\n");
				exit(1);
			}
		}
		rte_pktmbuf_free_bulk(pkts, n);
		if (i >= warm)
			ticks[i - warm] = (uint32_t)(t1 - t0);
	}
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
	const char *paths = "tx,rx,rxc";
	uint32_t hash_type = 0x1b6;
	for (int i = 1; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--bursts"))
			bursts = strtoul(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--warmup"))
			warm = strtoul(argv[i + 1], NULL, 0);
		else if (!strcmp(argv[i], "--paths"))
			paths = argv[i + 1];
		else if (!strcmp(argv[i], "--hash-type"))
			hash_type = strtoul(argv[i + 1], NULL, 16);
		else {
			fprintf(stderr, "unknown argument %s\n", argv[i]);
			return 1;
		}
	}
	mana_logtype_driver = rte_log_register("pmd.net.mana.driver");
	mana_logtype_init = rte_log_register("pmd.net.mana.init");
	rte_log_set_level(mana_logtype_driver, RTE_LOG_NOTICE);

	struct rte_mempool *mp = rte_pktmbuf_pool_create("perf", POOL_MBUFS, POOL_CACHE, 0,
							 RTE_MBUF_DEFAULT_BUF_SIZE, rte_socket_id());
	if (!mp) {
		fprintf(stderr, "pool: %s\n", rte_strerror(rte_errno));
		return 1;
	}

	/* The parts of struct mana_priv the datapath reads (mana_pci_probe / mana_dev_configure). */
	priv.dev_data = &dev_data;
	priv.port_id = 0;
	priv.num_queues = 1;
#ifdef HARNESS_MANA_VLAN_STRIP
	priv.vlan_strip = 1;
#endif
	priv.max_send_sge = 30;
	priv.max_recv_sge = 1;
	priv.max_mr_size = UINT64_MAX;
	priv.ib_pd = (struct ibv_pd *)&priv; /* opaque to the stand-in ibv_reg_mr */
	priv.db_page = anon(4096);
	rte_spinlock_init(&priv.mr_btree_lock);
	if (mana_mr_btree_init(&priv.mr_btree, MANA_MR_BTREE_CACHE_N, rte_socket_id()))
		return 1;

	double hz = tsc_hz();
	char buf[64];
	snprintf(buf, sizeof(buf), "%s", paths);
	for (char *p = strtok(buf, ","); p; p = strtok(NULL, ",")) {
		uint32_t *t;
		const char *name;
		if (!strcmp(p, "tx")) {
			t = run_tx(mp, warm, bursts);
			name = "mana_tx";
		} else if (!strcmp(p, "rx")) {
			t = run_rx(mp, warm, bursts, 0, hash_type);
			name = "mana_rx";
		} else if (!strcmp(p, "rxc")) {
			t = run_rx(mp, warm, bursts, 1, hash_type);
			name = "mana_rx_coalesced4";
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
