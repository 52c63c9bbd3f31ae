#!/usr/bin/env python3
"""Summarises the RESULT lines of interleaved runs (the `datapath` binary, mana_dpdk,
mlx5_dpdk) into one table.

  summarize.py [RESULTS_FILE] [--all]      (RESULT lines on stdin without a file)

Input: RESULT lines, e.g.
  RESULT side=ours path=mana_tx bursts=200000 pkts=6400000 trim_cyc_pkt=25.9 trimmed_bursts=12
         mean_cyc_pkt=27.1 med_cyc_pkt=26.0 ...
Per (path, side) and statistic: the median over runs of each run's value, with the spread
(min-max over runs). Statistics of one run (TSC ticks of the timed calls per packet):
  trim: mean over the bursts that took at most 10x the run's median burst (a burst hit by an
        interrupt or by preemption is not the driver's cost; how many were left out is shown);
  mean: mean over all bursts;
  med:  median burst / 32.
The table shows trim; --all adds a table for mean and one for med. ns = ticks / TSC GHz
(median of every run's measurement). Ratio = DPDK / ours (> 1: ours is faster).
"""
import statistics
import sys
from collections import defaultdict

# Rows in order: (DPDK path name, our path name, label). DPDK has a scalar and an SSE vector
# mlx5 RX; both compare against our one cyclic mlx5 RX path.
ROWS = [
    ("mana_tx", "mana_tx", "MANA tx"),
    ("mana_rx", "mana_rx", "MANA rx (RX_OKAY CQEs)"),
    ("mana_rx_coalesced4", "mana_rx_coalesced4", "MANA rx coalesced (RX_COALESCED_4 CQEs)"),
    ("mlx5_tx_empw", "mlx5_tx_empw", "mlx5 tx, eMPW"),
    ("mlx5_rx_scalar", "mlx5_rx", "mlx5 rx vs DPDK scalar (`mlx5_rx_burst`)"),
    ("mlx5_rx_vec", "mlx5_rx", "mlx5 rx vs DPDK SSE vector (`mlx5_rx_burst_vec`)"),
]
# Our paths without a DPDK counterpart in the harness.
OURS_ONLY = {
    "mlx5_tx_send": "mlx5 tx, SEND WQEs (min_inline 18), ours only",
    "mlx5_rx_cqz": "mlx5 rx, compressed CQEs, ours only",
    "mlx5_rx_mprq": "mlx5 rx, multi-packet RQ, ours only",
    "mlx5_rx_mprq_cqz": "mlx5 rx, multi-packet RQ + compressed CQEs, ours only",
}
STATS = {
    "trim_cyc_pkt": "trimmed mean per packet (each run: mean of the bursts <= 10x its median burst)",
    "mean_cyc_pkt": "mean per packet (each run: all bursts)",
    "med_cyc_pkt": "per-burst median per packet (each run: median burst / 32)",
}


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--all"]
    show = list(STATS) if "--all" in sys.argv[1:] else ["trim_cyc_pkt"]
    runs = defaultdict(list)
    hz = []
    src = open(args[0]) if args else sys.stdin
    for line in src:
        if not line.startswith("RESULT "):
            continue
        kv = dict(f.split("=", 1) for f in line.split()[1:])
        runs[(kv["path"], kv["side"])].append(kv)
        hz.append(float(kv["tsc_hz"]))
    if not runs:
        sys.exit("no RESULT lines")
    ghz = statistics.median(hz) / 1e9

    rows = [(d, o, label) for d, o, label in ROWS if (d, "dpdk") in runs or (o, "ours") in runs]
    # A DPDK-less run of our mlx5 RX still gets one row.
    if any(o == "mlx5_rx" for _, o, _ in rows) and not any((d, "dpdk") in runs for d in ("mlx5_rx_scalar", "mlx5_rx_vec")):
        rows = [r for r in rows if r[1] != "mlx5_rx"] + [(None, "mlx5_rx", "mlx5 rx")]
    rows += [(None, o, label) for o, label in OURS_ONLY.items() if (o, "ours") in runs]

    def agg(path, side, key):
        v = [float(r[key]) for r in runs.get((path, side), []) if key in r]
        if not v:
            return None
        return statistics.median(v), min(v), max(v), len(v)

    def left_out(path, side):
        rs = runs.get((path, side), [])
        if not rs:
            return "-"
        return f"{sum(int(r['trimmed_bursts']) for r in rs)}/{sum(int(r['bursts']) for r in rs)}"

    def cyc(a):
        return f"{a[0]:.1f} [{a[1]:.1f}-{a[2]:.1f}]" if a else "-"

    def ns(a):
        return f"{a[0] / ghz:.2f}" if a else "-"

    print(f"TSC {ghz:.3f} GHz (median of {len(hz)} measurements); cycles are TSC ticks; "
          "median of runs [min-max]; ratio = DPDK / ours (> 1: ours is faster)")
    for key in show:
        print()
        print(f"{STATS[key]}:")
        print()
        tail = " | bursts left out ours / DPDK" if key == "trim_cyc_pkt" else ""
        print(f"| path | ours cyc/pkt | DPDK cyc/pkt | ratio DPDK/ours | ours ns/pkt | DPDK ns/pkt | runs ours/DPDK{tail} |")
        print("|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if tail else ""))
        for d, o, label in rows:
            a_o = agg(o, "ours", key)
            a_d = agg(d, "dpdk", key) if d else None
            ratio = f"**{a_d[0] / a_o[0]:.2f}**" if a_o and a_d else "-"
            n = f"{a_o[3] if a_o else 0}/{a_d[3] if a_d else 0}"
            extra = f" | {left_out(o, 'ours')} / {left_out(d, 'dpdk') if d else '-'}" if tail else ""
            print(f"| {label} | {cyc(a_o)} | {cyc(a_d)} | {ratio} | {ns(a_o)} | {ns(a_d)} | {n}{extra} |")


if __name__ == "__main__":
    main()
