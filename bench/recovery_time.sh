#!/usr/bin/env bash
# Recovery time of a `mana:` (or `mlx5:`) port through Azure host servicing, on the fake
# rdma-core: l2fwd forwards between two ports on two devices while pktgen (device-model
# ports on the far ends of their shm wires) sends through them; device 0 is serviced RESETS
# times (`service SECONDS` on its fatal knob: DEVICE_FATAL, the device out of the device
# list and sysfs for SECONDS, then back). For every reset, l2fwd's `recovered` event gives
# the port's downtime; the recovery time is downtime - SECONDS: from the device reappearing
# to the port running again (its queues rebuilt on the new device). pktgen's longest gap
# (frames lost in a row, over its send rate) gives the same from the traffic's side: from
# the last frame before the reset to the first one forwarded after it.
#
# Usage: bench/recovery_time.sh [RESETS] [SECONDS] [RATE]      (defaults: 20 0.5 10000)
#        FAMILY=mlx5 bench/recovery_time.sh                     (mlx5 devices)
# Prints one line per reset and the median and maximum.
#
# What the fake adds: its watcher looks at the knobs every 20 ms, so the device comes back
# up to 20 ms after SECONDS; on Azure the kernel's own re-registration (udev, the VF's PCI
# probe) takes its place.
set -euo pipefail
cd "$(dirname "$0")/.."
resets=${1:-20}
secs=${2:-0.5}
rate=${3:-10000}
family=${FAMILY:-mana}
case "$family" in mana | mlx5) ;; *) echo "FAMILY=mana or mlx5" >&2; exit 2 ;; esac
./scripts/setup.sh >/dev/null
cargo build --release --quiet -p apps --bin pktgen --bin l2fwd
cargo build --release --quiet -p fake-rdma
bin=$(pwd)/${CARGO_TARGET_DIR:-target}/release
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
tag="rt$$"
export FAKE_RDMA_PORTS="${family}_0/1:mac=02:00:00:00:10:01,wire=shm:$tag-1;${family}_1/1:mac=02:00:00:00:10:02,wire=shm:$tag-2"
export PMD_SHM_DIR="$tmp/shm"
mkdir -p "$PMD_SHM_DIR"
# Everything below runs inside the fake's world (its sysfs tree is $SYSFS_PATH there).
FAKE_RDMA_LIB="$bin/libfake_rdma.so" ./scripts/fake-rdma.sh bash -c '
set -euo pipefail
tmp=$1; bin=$2; tag=$3; family=$4; resets=$5; secs=$6; rate=$7
ports=(--port "$family:dev=${family}_0" --port "$family:dev=${family}_1")
"$bin/l2fwd" "${ports[@]}" --json --stats-interval 0 >"$tmp/l2.json" 2>"$tmp/l2.err" &
l2=$!
until grep -q "\"event\":\"ready\"" "$tmp/l2.err"; do
    kill -0 $l2 2>/dev/null || { cat "$tmp/l2.err" >&2; exit 1; }
    sleep 0.05
done
# pktgen on the device model only: not on the fake.
run_s=$(awk -v n="$resets" -v s="$secs" "BEGIN { print n * (s + 1.0) + 2 }")
# A runtime directory (telemetry socket) of its own: l2fwd runs at the same time.
env -u LD_LIBRARY_PATH RUNTIME_DIRECTORY="$tmp/run-pktgen" "$bin/pktgen" --port "emu-$family:wire=shm:$tag-1" \
    --port "emu-$family:wire=shm:$tag-2" --rate "$rate" --duration "$run_s" \
    --drain-timeout 2 --json >"$tmp/pg.json" 2>"$tmp/pg.err" &
pg=$!
until grep -q "\"event\":\"ready\"" "$tmp/pg.err"; do sleep 0.05; done
knob="$SYSFS_PATH/class/infiniband/${family}_0/fake_rdma_fatal"
for i in $(seq 1 "$resets"); do
    sleep 0.5
    # The knob is back (it leaves with the device and returns with it).
    until [ -d "$(dirname "$knob")" ]; do sleep 0.01; done
    echo "service $secs" >"$knob"
    until [ "$(grep -c "recovered after" "$tmp/l2.err" || true)" -ge "$i" ]; do
        kill -0 $l2 2>/dev/null || { cat "$tmp/l2.err" >&2; exit 1; }
        sleep 0.02
    done
done
wait $pg || true
kill -INT $l2
wait $l2
' _ "$tmp" "$bin" "$tag" "$family" "$resets" "$secs" "$rate"
python3 - "$tmp/l2.json" "$tmp/pg.json" "$secs" "$resets" <<'EOF'
import json, statistics, sys
l2 = json.load(open(sys.argv[1]))
pg = json.loads([l for l in open(sys.argv[2]) if l.startswith("{")][-1])
secs, resets = float(sys.argv[3]), int(sys.argv[4])
rec = [e["downtime_s"] - secs for e in l2["events"] if e["event"] == "recovered"]
for i, r in enumerate(rec, 1):
    print(f"reset {i:3d}: port running again {r * 1000:7.1f} ms after the device came back")
if len(rec) != resets:
    sys.exit(f"{len(rec)} recoveries for {resets} resets")
print(f"recovery time over {resets} resets of {secs} s: median {statistics.median(rec) * 1000:.1f} ms, "
      f"max {max(rec) * 1000:.1f} ms")
gap = pg.get("longest_gap") or {}
print(f"pktgen: sent {pg['tx_packets']}, received {pg['rx_packets']}, lost {pg['lost']}; "
      f"longest gap {gap.get('frames')} frames = {gap.get('seconds', 0):.3f} s "
      f"({(gap.get('seconds', 0) - secs) * 1000:.1f} ms beyond the service)")
print(f"l2fwd: recoveries {l2['recoveries']}, pool in use at exit {l2['pool_in_use']}, "
      f"down_drops {l2['down_drops']}")
EOF
