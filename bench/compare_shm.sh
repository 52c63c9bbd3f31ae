#!/usr/bin/env bash
# Shared-memory cables between two processes, side by side with DPDK's net_memif, on this
# machine: one polling core per process (core 0 and core 1; each process's main thread shares
# its core), 60-byte frames (64 on the wire with the FCS), bursts of 32.
#
#   one way   ours:  pktgen --max --tx-only  --shm cable-->  pktgen --rx-only
#             DPDK:  testpmd txonly --memif-->  testpmd rxonly
#   forward   ours:  pktgen --max --cable A--> l2fwd --cable B--> pktgen (the demo's topology:
#                    every frame received, rewritten and sent again, and received back)
#             DPDK:  testpmd txonly --memif-->  testpmd io (which sends every frame back on the
#                    same memif; txonly never receives, so those sends are refused: this row
#                    is io's receive rate with a transmit attempt per burst, not a round trip)
#
# Rates are frames received per second by the receiving side: ours, frames received over the
# sender's sending time (pktgen's rx_pps); DPDK's, the median of the receiving testpmd's
# per-second Rx-pps samples (the first and last dropped). Each row is the median of RUNS
# runs, ours and DPDK's alternating, in one session. The ports are `KIND` device models
# (default emu-mana; KIND=emu-mlx5 for the mlx5 model) with their default (inline) engines.
#
# Usage: bench/compare_shm.sh [SECONDS_PER_RUN] [RUNS]      (defaults: 5 3)
# Needs dpdk-testpmd with net_memif (Debian: dpdk) and 2 MiB hugepages (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-5}
runs=${2:-3}
kind=${KIND:-emu-mana}
PMD_SETUP_EXTRA="dpdk" ./scripts/setup.sh
cargo build --release --quiet -p apps --bin pktgen --bin l2fwd
bin=${CARGO_TARGET_DIR:-target}/release
command -v dpdk-testpmd >/dev/null || { echo "dpdk-testpmd not found (apt-get install dpdk)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shm_oneway, shm_forward: our runs (shared with ab_shm.sh).
. bench/shm_runs.sh

# The median of a testpmd's periodic pps samples of one kind (Rx-pps or Tx-pps), the first
# non-zero one (traffic starting within its period) left out. testpmd computes each from the
# time that really passed since the last (its main thread shares a core with the forwarding
# one, so the periods stretch).
pps_median() {
    python3 -c '
import re, statistics, sys
s = [int(m.group(1)) for m in re.finditer(sys.argv[1] + r":\s+(\d+)", open(sys.argv[2]).read())]
s = [x for x in s if x > 0][1:]
if not s:
    sys.exit("dpdk-testpmd printed no throughput: does it run here (hugepages, net_memif)?")
print(statistics.median(s))' "$1" "$2"
}

# DPDK: the server (txonly) first, then the client (rxonly or io) on the other core.
memif() {
    local mode=$1 sock="$tmp/memif.sock"
    rm -f "$sock"
    local eal=(-n 1 --no-pci --in-memory --log-level=lib.eal:error)
    timeout -s INT $((secs + 4)) dpdk-testpmd --lcores 0@0,1@0 "${eal[@]}" \
        --vdev="net_memif0,role=server,socket=$sock" -- \
        --forward-mode=txonly --txpkts 60 --burst 32 --auto-start --stats-period 1 \
        >"$tmp/mtx.log" 2>&1 &
    local tx=$!
    sleep 1
    timeout -s INT $((secs + 2)) dpdk-testpmd --lcores 0@1,1@1 "${eal[@]}" \
        --vdev="net_memif0,role=client,socket=$sock" -- \
        --forward-mode="$mode" --burst 32 --auto-start --stats-period 1 \
        >"$tmp/mrx.log" 2>&1 || true
    wait "$tx" || true
    pps_median Rx-pps "$tmp/mrx.log"
}

declare -a o1 m1 o2 m2
for r in $(seq "$runs"); do
    o1+=("$(shm_oneway "$bin" "$kind" "$secs" "$tmp")")
    m1+=("$(memif rxonly)")
    o2+=("$(shm_forward "$bin" "$kind" "$secs" "$tmp")")
    m2+=("$(memif io)")
    echo "run $r/$runs: one way ours ${o1[-1]} memif ${m1[-1]}; forward ours ${o2[-1]} memif ${m2[-1]}" >&2
done

python3 - "$kind" "${o1[*]}" "${m1[*]}" "${o2[*]}" "${m2[*]}" <<'PY'
import statistics, sys
kind = sys.argv[1]
rows = [("one way", sys.argv[2], sys.argv[3]), ("forward", sys.argv[4], sys.argv[5])]
print(f"{kind} over shm cables vs dpdk-testpmd over net_memif, 60-byte frames, Mpps received")
print(f"{'':10}{'ours':>8}{'memif':>8}{'ours/memif':>12}   runs ours | memif")
for name, o, m in rows:
    o = [float(x) for x in o.split()]
    m = [float(x) for x in m.split()]
    mo, mm = statistics.median(o), statistics.median(m)
    print(f"{name:10}{mo/1e6:8.2f}{mm/1e6:8.2f}{mo/mm:12.2f}   "
          + " ".join(f"{x/1e6:.2f}" for x in o) + " | " + " ".join(f"{x/1e6:.2f}" for x in m))
PY
