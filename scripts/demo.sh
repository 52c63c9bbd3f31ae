#!/usr/bin/env bash
# The README's first command: install what is missing, build everything, show the devices of
# this machine, then run the demo on the device model, no hardware needed:
#
#   pktgen port 0 --shm cable A--> l2fwd port 0 --> l2fwd port 1 --shm cable B--> pktgen port 1
#
# l2fwd and pktgen are separate processes joined by shared-memory wires; every port is an
# emu-mana device model running the real MANA datapath. The models run inline (the ports'
# default, engine=inline): each does its device's work on the polling core of its process,
# so the demo is two threads on two cores, one per process, and nothing else spins.
# pktgen sends 60-byte frames (64 on the wire) for DEMO_SECONDS (default 5) at DEMO_RATE
# packets/s (default 1000000: five million frames), then both stop cleanly and print their
# summaries (rate, loss, latency, and where any frame was lost). While they run, each answers
# on its telemetry socket: `pmd-telemetry /ethdev/stats,0` asks l2fwd (file prefix rte, the
# default), `pmd-telemetry --file-prefix pktgen /pmd/lcores` asks pktgen.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo build --release --workspace --quiet
bin=${CARGO_TARGET_DIR:-target}/release
"$bin/pmd-devices"
echo

secs=${DEMO_SECONDS:-5}
rate=${DEMO_RATE:-1000000}
name="demo$$"
cores=$(nproc)
# Two cores or more: l2fwd polls on the last core, pktgen on core 0.
l2core=$((cores > 1 ? cores - 1 : 0))

echo "Starting l2fwd first: its ports stay 'link down' (it says so) until pktgen opens the"
echo "other ends of the two cables half a second later."
"$bin/l2fwd" --port "emu-mana:wire=shm:$name-a" --port "emu-mana:wire=shm:$name-b" \
    --lcores "$l2core" --stats-interval 2 --ring-size 2048 &
l2fwd=$!
trap 'kill -TERM $l2fwd 2>/dev/null || true' EXIT
sleep 0.5
"$bin/pktgen" --port "emu-mana:wire=shm:$name-a" --port "emu-mana:wire=shm:$name-b" \
    --lcores 0 --rate "$rate" --duration "$secs" --flows 64 --size 60 --ring-size 2048 \
    --drain-timeout 10 --file-prefix pktgen
kill -INT "$l2fwd"
wait "$l2fwd"
trap - EXIT
