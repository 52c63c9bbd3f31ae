#!/usr/bin/env bash
# Framework overhead, side by side with DPDK on this machine: io forwarding between two null
# ports on one pinned core (core 1; core 0 is the main core), 32-packet bursts, 64-byte frames.
#   ours: bench/src/bin/null_fwd (pmd null ports)
#   DPDK: dpdk-testpmd --vdev net_null0 --vdev net_null1 --forward-mode=io
# Prints the median forwarded packets per second of each and the ratio ours/DPDK.
# Usage: bench/compare_null_fwd.sh [SECONDS_PER_RUN] [RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
runs=${2:-3}
PMD_SETUP_EXTRA="dpdk dpdk-dev" ./scripts/setup.sh
cargo build --release --quiet -p bench --bin null_fwd

ours=()
for _ in $(seq "$runs"); do
    ours+=("$(./target/release/null_fwd --duration "$secs" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["pps"])')")
done

dpdk=()
for _ in $(seq "$runs"); do
    # testpmd prints per-port Tx-pps every second; a sample is the sum over both ports. The
    # first samples (ports starting) are dropped by taking only non-zero ones after the first.
    out=$(timeout -s INT $((secs + 2)) dpdk-testpmd -l 0-1 -n 1 --no-pci --vdev net_null0 --vdev net_null1 \
            --in-memory --log-level=lib.eal:error -- \
            --forward-mode=io --auto-start --stats-period 1 --burst 32 2>&1 || true)
    dpdk+=("$(printf '%s\n' "$out" | python3 -c '
import re, statistics, sys
samples, cur = [], None
for line in sys.stdin:
    if "Port statistics" in line:
        if cur: samples.append(cur)
        cur = 0
    m = re.search(r"Tx-pps:\s+(\d+)", line)
    if m and cur is not None:
        cur += int(m.group(1))
if cur: samples.append(cur)
samples = [s for s in samples[1:] if s > 0]
if not samples:
    sys.exit("dpdk-testpmd printed no throughput: does it run here (hugepages)?")
print(statistics.median(samples))
')")
done

python3 - "${ours[*]}" "${dpdk[*]}" <<'PY'
import statistics, sys
ours = [float(x) for x in sys.argv[1].split()]
dpdk = [float(x) for x in sys.argv[2].split()]
mo, md = statistics.median(ours), statistics.median(dpdk)
print(f"{'':12}{'median Mpps':>12}   runs")
print(f"{'pmd null_fwd':12}{mo/1e6:12.2f}   " + " ".join(f"{x/1e6:.2f}" for x in ours))
print(f"{'dpdk testpmd':12}{md/1e6:12.2f}   " + " ".join(f"{x/1e6:.2f}" for x in dpdk))
print(f"ratio ours/DPDK: {mo/md:.2f}")
PY
