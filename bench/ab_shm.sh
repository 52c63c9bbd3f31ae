#!/usr/bin/env bash
# Two builds of the tools compared on this machine, in turns: the way to tell whether a
# datapath change helps where a single run moves by a factor of two within minutes.
#
#   loop     pktgen --max sending and receiving on one lcore over an in-process cable
#            (two `emu-mana:wire=loop:` ports): pktgen, the driver and the model, no other
#            process; the ceiling of the forward row
#   oneway   pktgen --max --tx-only (core 0) -> shm cable -> pktgen --rx-only (core 1): the
#            receiver's rate (compare_shm.sh's one-way row)
#   forward  pktgen --max -> cable A -> l2fwd (core 1) -> cable B -> pktgen (core 0): the
#            rate pktgen receives back (compare_shm.sh's forward row)
#
# Each round runs every configuration once with build A, then once with build B; the medians
# (and every run) are printed per build. 60-byte frames, `KIND` ports (default emu-mana).
#
# Usage: bench/ab_shm.sh DIR_A DIR_B [ROUNDS] [SECONDS]        (defaults: 8 rounds of 3 s)
#   DIR_A, DIR_B: directories holding the pktgen and l2fwd binaries of each build, e.g.
#   git worktree add /tmp/base BASE && (cd /tmp/base && cargo build --release -p apps)
#   bench/ab_shm.sh /tmp/base/target/release target/release
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
    sed -n '2,19p' "$0" >&2
    exit 2
fi
a=$1
b=$2
rounds=${3:-8}
secs=${4:-3}
kind=${KIND:-emu-mana}
for d in "$a" "$b"; do
    for t in pktgen l2fwd; do
        [ -x "$d/$t" ] || { echo "ab_shm: $d/$t: not an executable" >&2; exit 2; }
    done
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# shm_oneway, shm_forward: the runs compare_shm.sh makes.
. bench/shm_runs.sh

loop() {
    local n="ab$$-loop-$RANDOM"
    "$1/pktgen" --port "$kind:wire=loop:$n" --port "$kind:wire=loop:$n" --lcores 0 --max \
        --size 60 --duration "$secs" --json 2>"$tmp/err" | shm_json rx_pps
}
oneway() { shm_oneway "$1" "$kind" "$secs" "$tmp"; }
forward() { shm_forward "$1" "$kind" "$secs" "$tmp"; }

declare -A runs
for r in $(seq "$rounds"); do
    for cfg in loop oneway forward; do
        for side in A B; do
            dir=$a
            [ "$side" = B ] && dir=$b
            runs[$cfg$side]+=" $("$cfg" "$dir")"
        done
    done
    echo "round $r/$rounds done" >&2
done

python3 - "$a" "$b" "${runs[loopA]}" "${runs[loopB]}" "${runs[onewayA]}" "${runs[onewayB]}" \
    "${runs[forwardA]}" "${runs[forwardB]}" <<'PY'
import statistics, sys
a, b = sys.argv[1:3]
print(f"A = {a}\nB = {b}\nMpps received, medians of {len(sys.argv[3].split())} runs in turns")
print(f"{'':9}{'A':>7}{'B':>7}{'B/A':>7}   runs A | B")
for i, name in enumerate(["loop", "oneway", "forward"]):
    ra = [float(x) / 1e6 for x in sys.argv[3 + 2 * i].split()]
    rb = [float(x) / 1e6 for x in sys.argv[4 + 2 * i].split()]
    ma, mb = statistics.median(ra), statistics.median(rb)
    print(f"{name:9}{ma:7.2f}{mb:7.2f}{mb / ma:7.2f}   "
          + " ".join(f"{x:.2f}" for x in ra) + " | " + " ".join(f"{x:.2f}" for x in rb))
PY
