#!/usr/bin/env bash
# Our tools over shm cables against dpdk-testpmd over net_memif, by cores, on a machine with
# at least 2 + 2 * max(CORES) cores to spare (a quiet one: nothing else running). Each
# configuration runs ROUNDS times for SECONDS; the medians of the Mpps received are printed
# with every run. 60-byte frames, `KIND` ports (default emu-mana).
#
#   oneway 1+1     pktgen --tx-only (core 0) -> cable -> pktgen --rx-only (core 2)
#   forward 1+1    pktgen on one lcore (core 0: TX and RX) -> l2fwd (core 2) -> pktgen: the
#                  configuration of compare_shm.sh, one lcore each
#   forward 2+N    pktgen on two lcores (TX on core 0, RX on core 1) -> l2fwd on N lcores
#                  (cores 2..), its ports with N RX and TX queues, 256 flows spread by RSS:
#                  what l2fwd forwards when pktgen is not the limit
#   memif oneway   testpmd txonly (core 0) -> net_memif -> testpmd rxonly (core 2)
#   memif N        testpmd txonly on N queues and cores (cores 0..) -> testpmd io forwarding
#                  on N queues and cores (from core max(2, N)): the rate the forwarder receives
#
# Usage: bench/cores_shm.sh BIN_DIR [ROUNDS] [SECONDS] [CORES]   (defaults: 3 rounds of 3 s,
#   CORES "1 2 4"). BIN_DIR holds pktgen and l2fwd (cargo build --release -p apps:
#   target/release). TESTPMD names dpdk-testpmd (default: the one on PATH) and EAL_EXTRA
#   adds EAL arguments (e.g. `-d DIR`, DIR absolute, where DPDK's drivers are not
#   installed). Hugepages are used where they can be had (hugetlbfs mounted, 512 free);
#   otherwise the tools fall back to normal pages and testpmd runs with --no-huge.
set -euo pipefail
if [ $# -lt 1 ]; then
    sed -n '2,22p' "$0" >&2
    exit 2
fi
# Paths given relative to where the script was started from.
bin=$(cd "$1" 2>/dev/null && pwd) || { echo "cores_shm: $1: no such directory" >&2; exit 2; }
if [ -n "${TESTPMD:-}" ] && [ -e "$TESTPMD" ]; then
    TESTPMD=$(cd "$(dirname "$TESTPMD")" && pwd)/$(basename "$TESTPMD")
fi
cd "$(dirname "$0")/.."
rounds=${2:-3}
secs=${3:-3}
cores=${4:-"1 2 4"}
kind=${KIND:-emu-mana}
testpmd=${TESTPMD:-dpdk-testpmd}
read -r -a eal_extra <<<"${EAL_EXTRA:-}"
for t in pktgen l2fwd; do
    [ -x "$bin/$t" ] || { echo "cores_shm: $bin/$t: not an executable" >&2; exit 2; }
done
command -v "$testpmd" >/dev/null || { echo "cores_shm: $testpmd not found" >&2; exit 2; }
max=0
for n in $cores; do [ "$n" -gt "$max" ] && max=$n; done
need=$((2 + 2 * max))
have=$(nproc)
[ "$have" -ge "$need" ] || { echo "cores_shm: needs $need cores for CORES \"$cores\", this machine has $have" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. bench/shm_runs.sh

huge=(--in-memory)
if ! grep -q hugetlbfs /proc/mounts || [ "$(cat /sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages 2>/dev/null || echo 0)" -lt 512 ]; then
    huge=(--no-huge -m 1024)
fi
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $have cores; testpmd ${huge[*]}" >&2

# A comma-separated list of COUNT cores from FIRST.
span() { seq -s, "$1" $(($1 + $2 - 1)); }

# l2fwd on N lcores from core 2, pktgen on LCORES; prints what pktgen receives per second.
forward() {
    local n=$1 pg_lcores=$2 flows=$3 name="cores$$-$RANDOM"
    local q=""
    [ "$n" -gt 1 ] && q=",rxq=$n,txq=$n"
    # A runtime directory (telemetry socket) of its own: two tools run at once.
    RUNTIME_DIRECTORY="$tmp/run-l2fwd" "$bin/l2fwd" --port "$kind:wire=shm:$name-a$q" \
        --port "$kind:wire=shm:$name-b$q" --lcores "$(span 2 "$n")" --stats-interval 0 --json \
        >"$tmp/l2.json" 2>"$tmp/l2.err" &
    local l2=$!
    "$bin/pktgen" --port "$kind:wire=shm:$name-a" --port "$kind:wire=shm:$name-b" \
        --lcores "$pg_lcores" --max --size 60 --flows "$flows" --duration "$secs" --json \
        --link-timeout 20 >"$tmp/pg.json" 2>"$tmp/pg.err"
    kill -INT "$l2"
    wait "$l2" || true
    shm_json rx_pps <"$tmp/pg.json"
}

oneway() {
    local name="cores$$-ow-$RANDOM"
    RUNTIME_DIRECTORY="$tmp/run-rx" "$bin/pktgen" --port "$kind:wire=shm:$name" --lcores 2 \
        --rx-only --duration $((secs + 3)) --link-timeout 20 --json >"$tmp/rx.json" 2>"$tmp/rx.err" &
    local rx=$!
    "$bin/pktgen" --port "$kind:wire=shm:$name" --lcores 0 --max --tx-only --size 60 \
        --duration "$secs" --link-timeout 20 --json >"$tmp/tx.json" 2>"$tmp/tx.err"
    wait "$rx"
    python3 -c "print($(shm_json rx_packets <"$tmp/rx.json") / $(shm_json duration_s <"$tmp/tx.json"))"
}

# testpmd lcore map for N workers from core FIRST: the main lcore shares the first worker's.
lcore_map() {
    local first=$1 n=$2 m="0@$1"
    for i in $(seq 1 "$n"); do m="$m,$i@$((first + i - 1))"; done
    echo "$m"
}

# The median of testpmd's per-second Rx-pps lines (the first left out: the start).
pps_median() {
    python3 -c '
import re, statistics, sys
s = [int(m.group(1)) for m in re.finditer(r"Rx-pps:\s+(\d+)", open(sys.argv[1]).read())]
s = [x for x in s if x > 0][1:]
if not s:
    sys.exit("dpdk-testpmd printed no throughput: does it run here?")
print(statistics.median(s))' "$1"
}

# testpmd txonly on N queues -> net_memif -> testpmd MODE on N queues. With several queues
# testpmd prints one Rx-pps line per port: the sum is what `--stats-period` shows per port
# (one port here), so the per-second lines are the port's rate.
memif() {
    local mode=$1 n=$2 sock="$tmp/memif.sock"
    rm -f "$sock"
    local eal=(-n 1 --no-pci "${huge[@]}" --log-level=lib.eal:error ${eal_extra[@]+"${eal_extra[@]}"})
    local qs=(--rxq="$n" --txq="$n" --nb-cores="$n" --burst 32 --auto-start --stats-period 1)
    timeout -s INT $((secs + 5)) "$testpmd" --lcores "$(lcore_map 0 "$n")" "${eal[@]}" \
        --file-prefix "tx$$" --vdev="net_memif0,role=server,socket=$sock" -- \
        --forward-mode=txonly --txpkts 60 "${qs[@]}" >"$tmp/mtx.log" 2>&1 &
    local tx=$!
    sleep 1
    local first=$((n > 2 ? n : 2))
    timeout -s INT $((secs + 2)) "$testpmd" --lcores "$(lcore_map "$first" "$n")" "${eal[@]}" \
        --file-prefix "rx$$" --vdev="net_memif0,role=client,socket=$sock" -- \
        --forward-mode="$mode" "${qs[@]}" >"$tmp/mrx.log" 2>&1 || true
    wait "$tx" || true
    pps_median "$tmp/mrx.log"
}

declare -A runs
rows=("oneway 1+1" "forward 1+1")
for n in $cores; do rows+=("forward 2+$n"); done
rows+=("memif oneway")
for n in $cores; do rows+=("memif $n"); done
for r in $(seq "$rounds"); do
    for row in "${rows[@]}"; do
        case $row in
        "oneway 1+1") v=$(oneway) ;;
        "forward 1+1") v=$(forward 1 0 1) ;;
        "forward 2+"*) v=$(forward "${row#forward 2+}" 0,1 256) ;;
        "memif oneway") v=$(memif rxonly 1) ;;
        "memif "*) v=$(memif io "${row#memif }") ;;
        esac
        runs[$row]="${runs[$row]:-} $v"
        echo "round $r/$rounds: $row $v" >&2
    done
done

echo "$kind over shm cables vs dpdk-testpmd over net_memif, 60-byte frames, Mpps received"
echo "(medians of $rounds runs of $secs s; every run after the bar)"
for row in "${rows[@]}"; do
    python3 - "$row" ${runs[$row]} <<'PY'
import statistics, sys
row, vals = sys.argv[1], [float(x) for x in sys.argv[2:]]
print(f"{row:16}{statistics.median(vals)/1e6:8.2f}   | " + " ".join(f"{x/1e6:.2f}" for x in vals))
PY
done
