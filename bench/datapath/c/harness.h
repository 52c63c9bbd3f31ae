/* The two DPDK harnesses' shared parts: the frame, the timer and its frequency, queue
 * memory, a TX burst, and the RESULT line (the same statistic as bench/src/bin/datapath/main.rs).
 * Included by mana_dpdk.c and mlx5_dpdk.c, which define BURST first. */
#ifndef PMD_DATAPATH_HARNESS_H
#define PMD_DATAPATH_HARNESS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <sys/mman.h>

#include <rte_mbuf.h>

/* 60-byte UDP/IPv4 frame, right IP and UDP checksums (64 bytes on the wire with the FCS). */
static const uint8_t FRAME[60] = {
	0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x00, 0x00, 0x00, 0xaa, 0x01, 0x08, 0x00, 0x45,
	0x00, 0x00, 0x2e, 0x00, 0x00, 0x00, 0x00, 0x40, 0x11, 0x24, 0xc0, 0xa9, 0xfe, 0x01, 0x01,
	0xa9, 0xfe, 0x01, 0x02, 0x04, 0x00, 0x23, 0x28, 0x00, 0x1a, 0x3a, 0x41, 0x00, 0x01, 0x02,
	0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x11,
};

static inline uint64_t
rdtsc(void)
{
	uint32_t lo, hi;
	__asm__ volatile("lfence\n\trdtsc\n\tlfence" : "=a"(lo), "=d"(hi) : : "memory");
	return ((uint64_t)hi << 32) | lo;
}

static double
tsc_hz(void)
{
	struct timespec a, b, d = { 0, 200000000 };
	clock_gettime(CLOCK_MONOTONIC, &a);
	uint64_t c0 = rdtsc();
	nanosleep(&d, NULL);
	uint64_t c1 = rdtsc();
	clock_gettime(CLOCK_MONOTONIC, &b);
	return (double)(c1 - c0) / ((b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9);
}

static void *
anon(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	return p;
}

static int
cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

static void
report(const char *path, uint32_t *ticks, size_t n, double hz)
{
	uint64_t total = 0, kept_total = 0;
	size_t kept = 0;
	for (size_t i = 0; i < n; i++)
		total += ticks[i];
	qsort(ticks, n, sizeof(*ticks), cmp_u32);
	/* Bursts over 10x the median were interrupted or preempted: left out of the trimmed mean. */
	uint64_t limit = 10 * (uint64_t)ticks[(n - 1) / 2];
	for (size_t i = 0; i < n; i++)
		if (ticks[i] <= limit) {
			kept_total += ticks[i];
			kept++;
		}
	double pkts = (double)n * BURST;
#define Q(f) ((double)ticks[(size_t)((double)(n - 1) * (f))] / BURST)
	printf("RESULT side=dpdk path=%s bursts=%zu pkts=%.0f trim_cyc_pkt=%.3f trimmed_bursts=%zu "
	       "mean_cyc_pkt=%.3f med_cyc_pkt=%.3f "
	       "p10_cyc_pkt=%.3f p90_cyc_pkt=%.3f p99_cyc_pkt=%.3f max_cyc_pkt=%.3f tsc_hz=%.0f\n",
	       path, n, pkts, (double)kept_total / ((double)kept * BURST), n - kept,
	       (double)total / pkts, Q(0.5), Q(0.1), Q(0.9), Q(0.99), Q(1.0), hz);
#undef Q
	fflush(stdout);
}

/* A TX burst: BURST mbufs from the side's pool (through its per-core cache), the frame in each. */
static void
fill_burst(struct rte_mempool *mp, struct rte_mbuf **pkts)
{
	if (rte_pktmbuf_alloc_bulk(mp, pkts, BURST)) {
		fprintf(stderr, "mbuf alloc failed\n");
		exit(1);
	}
	for (unsigned int i = 0; i < BURST; i++) {
		char *d = rte_pktmbuf_append(pkts[i], sizeof(FRAME));
		memcpy(d, FRAME, sizeof(FRAME));
	}
}

#endif
