#!/usr/bin/env bash
# Kernel TCP through a forwarder, side by side with DPDK on this machine.
#
#   namespace A             namespace F (the forwarder)              namespace B
#   afA 169.254.91.1 <-veth-> afAf  ==forwarder==  afBf <-veth-> afB 169.254.91.2
#   iperf3 client                                                 iperf3 server
#
#   ours: l2fwd --no-mac-updating on two emu-mana:wire=afpacket:IFACE ports
#   DPDK: dpdk-testpmd --vdev=net_af_packet0,iface=afAf --vdev=net_af_packet1,iface=afBf
#         --forward-mode=io
#
# Same veths and the same cores for both: the forwarder (every thread of it) on CPU
# $FWD_CPU, iperf3's client and server on CPU $PEER_CPU. Offloads are off on all four veth
# ends (ethtool -K IF tx off rx off tso off gso off gro off): TCP through testpmd's
# net_af_packet needs all of them off; ours needs only tso, gso and gro off (README,
# "Kernel peers over veth"). Runs
# alternate ours, DPDK, ours, DPDK, ...; the table is the median of RUNS runs of each.
# Link-local addresses only; the three namespaces are removed on exit (also on Ctrl-C).
#
# Usage: bench/compare_afpacket.sh [SECONDS_PER_RUN] [RUNS]
#   FWD_CPU=1 PEER_CPU=0   cores (default: forwarder on 1, iperf3 on 0)
#   IPERF_ARGS="-P 1"      more iperf3 client arguments
#   L2FWD=path/to/l2fwd    run this l2fwd binary instead of building one
#   KIND=emu-mlx5          l2fwd's ports are this device model (default emu-mana)
#   L2FWD_ARGS, TESTPMD_ARGS   more arguments for either forwarder
#   AFP_DEVARGS=,framecnt=4096 more devargs for testpmd's net_af_packet ports
#   KEEP_LOGS=DIR          keep the forwarders' logs and iperf3's JSON there
#   NICE=-10               run forwarders and iperf3 at this nice level (the same for both
#                          sides: on a machine busy with other work, so that it disturbs less)
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
runs=${2:-3}
fwd_cpu=${FWD_CPU:-1}
peer_cpu=${PEER_CPU:-0}
iperf_args=${IPERF_ARGS:-}
l2fwd_args=${L2FWD_ARGS:-}
testpmd_args=${TESTPMD_ARGS:-}
afp_devargs=${AFP_DEVARGS:-}
prio=(nice -n "${NICE:-0}")
kind=${KIND:-emu-mana}
target=${CARGO_TARGET_DIR:-target}

PMD_SETUP_EXTRA="dpdk dpdk-dev iperf3 ethtool python3" ./scripts/setup.sh
if [ -n "${L2FWD:-}" ]; then
    l2fwd=$L2FWD        # a given build (e.g. an older one, to compare)
else
    cargo build --release --quiet -p apps --bin l2fwd
    l2fwd=$target/release/l2fwd
fi

tag=$$
nsa=pmdafA$tag nsb=pmdafB$tag nsf=pmdafF$tag
work=$(mktemp -d)
pids=()   # what this script started and still runs: stopped on exit
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for ns in "$nsa" "$nsb" "$nsf"; do ip netns del "$ns" 2>/dev/null || true; done
    [ -z "${KEEP_LOGS:-}" ] || { mkdir -p "$KEEP_LOGS" && cp -r "$work"/. "$KEEP_LOGS"/; }
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for ns in "$nsa" "$nsb" "$nsf"; do
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # No IPv6: nothing but the test's traffic (and ARP) crosses the forwarder.
    ip netns exec "$ns" sh -c 'echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6; echo 1 >/proc/sys/net/ipv6/conf/default/disable_ipv6'
done
ip link add afA netns "$nsa" type veth peer name afAf netns "$nsf"
ip link add afB netns "$nsb" type veth peer name afBf netns "$nsf"
ip -n "$nsa" addr add 169.254.91.1/24 dev afA
ip -n "$nsb" addr add 169.254.91.2/24 dev afB
for pair in "$nsa afA" "$nsb afB" "$nsf afAf" "$nsf afBf"; do
    set -- $pair
    ip netns exec "$1" ethtool -K "$2" tx off rx off tso off gso off gro off >/dev/null 2>&1
    ip -n "$1" link set "$2" up
done

# One forwarder run: starts it in namespace F, waits for traffic to pass, runs iperf3, stops
# it; prints "bits_per_second retransmits forwarder_drops" on stdout, its log in $work.
run_one() {
    local which=$1 n=$2 log=$work/$1.$2.log fwd
    case $which in
    ours)
        ip netns exec "$nsf" "${prio[@]}" taskset -c "$fwd_cpu" "$l2fwd" \
            --port "$kind:wire=afpacket:afAf" --port "$kind:wire=afpacket:afBf" \
            --lcores "$fwd_cpu" --no-mac-updating --stats-interval 0 --json $l2fwd_args >"$log" 2>&1 &
        ;;
    dpdk)
        # The main lcore (0) and the forwarding lcore (1) both on CPU $fwd_cpu. With
        # --stats-period testpmd forwards until SIGINT, then prints its statistics.
        ip netns exec "$nsf" "${prio[@]}" taskset -c "$fwd_cpu" dpdk-testpmd \
            --lcores "0@$fwd_cpu,1@$fwd_cpu" -n 1 --no-pci --in-memory --log-level=lib.eal:error \
            --vdev=net_af_packet0,iface=afAf$afp_devargs --vdev=net_af_packet1,iface=afBf$afp_devargs -- \
            --forward-mode=io --auto-start --burst 32 --stats-period 3600 $testpmd_args </dev/null >"$log" 2>&1 &
        ;;
    esac
    fwd=$!
    pids=("$fwd")
    # Traffic passes once ARP (forwarded like any frame) resolves through the forwarder.
    local ok=0
    for _ in $(seq 100); do
        if ip netns exec "$nsa" ping -c 1 -W 0.2 169.254.91.2 >/dev/null 2>&1; then ok=1; break; fi
        sleep 0.1
    done
    [ $ok = 1 ] || { echo "$which: no ping through the forwarder" >&2; cat "$log" >&2; kill -INT "$fwd"; exit 1; }
    ip netns exec "$nsb" "${prio[@]}" taskset -c "$peer_cpu" iperf3 -s -1 -p 5201 >/dev/null 2>&1 &
    local srv=$!
    pids=("$fwd" "$srv")
    sleep 0.3
    ip netns exec "$nsa" "${prio[@]}" taskset -c "$peer_cpu" iperf3 -c 169.254.91.2 -p 5201 -t "$secs" \
        $iperf_args -J >"$work/iperf.$which.$n.json" || true
    kill "$srv" 2>/dev/null || true   # gone already unless the client never reached it
    wait "$srv" 2>/dev/null || true
    # SIGINT stops both forwarders cleanly (l2fwd prints its report, testpmd its statistics);
    # `ip netns exec` and taskset exec the forwarder, so $fwd is its pid.
    kill -INT "$fwd" 2>/dev/null || true
    wait "$fwd" 2>/dev/null || true
    pids=()
    python3 - "$which" "$work/iperf.$which.$n.json" "$log" <<'PY'
import json, re, sys
which, ipf, log = sys.argv[1:]
r = json.load(open(ipf))
if "error" in r:
    sys.exit(f"{which}: iperf3: {r['error']}")
bps = r["end"]["sum_received"]["bits_per_second"]
retr = r["end"]["sum_sent"].get("retransmits", 0)
text = open(log).read()
drops = 0
if which == "ours":
    rep = json.loads([l for l in text.splitlines() if l.startswith("{")][-1])
    drops = rep["dropped"] + sum(p.get("imissed", 0) for p in rep["ports"])
else:
    # testpmd's last block, "Accumulated forward statistics for all ports".
    tail = text[text.rfind("Accumulated forward statistics"):]
    drops = sum(int(m.group(2)) for m in re.finditer(r"(RX-dropped|TX-dropped):\s+(\d+)", tail))
print(bps, retr, drops)
PY
}

: >"$work/results"
for n in $(seq "$runs"); do
    for which in ours dpdk; do
        # Not in a subshell: the exit trap must see the forwarder's pid.
        run_one "$which" "$n" >"$work/line"
        echo "$which $(cat "$work/line")" | tee -a "$work/results" >&2
    done
done

python3 - "$work/results" "$secs" "$kind" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    w, bps, retr, drops = line.split()
    rows.setdefault(w, []).append((float(bps), int(retr), int(drops)))
print(f"iperf3 TCP, {sys.argv[2]} s per run, medians of {len(rows['ours'])} runs (alternating)")
print(f"{'':22}{'Gbit/s':>8}{'retransmits':>13}{'fwd drops':>11}   runs (Gbit/s / retransmits / fwd drops)")
med = {}
for w, name in (("ours", "l2fwd " + sys.argv[3]), ("dpdk", "testpmd net_af_packet")):
    r = rows[w]
    g = statistics.median(x[0] for x in r) / 1e9
    med[w] = g
    print(f"{name:22}{g:8.2f}{statistics.median(x[1] for x in r):13.0f}"
          f"{statistics.median(x[2] for x in r):11.0f}   "
          + "  ".join(f"{x[0]/1e9:.2f}/{x[1]}/{x[2]}" for x in r))
print(f"ratio ours/DPDK: {med['ours']/med['dpdk']:.2f}")
PY
