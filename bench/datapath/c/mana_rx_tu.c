/* SPDX-License-Identifier: MIT OR Apache-2.0
 *
 * Compiles DPDK's drivers/net/mana/rx.c (included unmodified from the DPDK tree given to
 * bench/compare_datapath.sh) and exposes its static refill, mana_alloc_and_post_rx_wqes, for
 * the initial fill that mana_start_rx_queues performs after its verbs calls (which the harness
 * replaces).
 */
#include "rx.c"

int perf_rx_initial_post(struct mana_rxq *rxq, uint32_t count);

int
perf_rx_initial_post(struct mana_rxq *rxq, uint32_t count)
{
#ifdef HARNESS_MANA_REFILL_COUNT
	return mana_alloc_and_post_rx_wqes(rxq, count);
#else
	/* Older trees (22.11) always fill the whole ring, which is what count asks for here. */
	(void)count;
	return mana_alloc_and_post_rx_wqes(rxq);
#endif
}
