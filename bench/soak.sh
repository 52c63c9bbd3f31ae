#!/usr/bin/env bash
# A soak run: pktgen -> l2fwd -> pktgen for DURATION seconds (default 600) while every fault
# the devices can have keeps happening, then a one-line verdict.
#
# Usage: bench/soak.sh [DURATION] [--parts emu-mana,emu-mlx5,mana,mlx5] [--rate PPS]
#                      [--period SECONDS] [--leg-seconds SECONDS] [--keep]
#
# DURATION is shared by four parts (at least 15 s each: shorter, not every fault gets its
# turn while traffic flows, and the soak refuses it), run one after the other:
#   emu-mana, emu-mlx5  l2fwd on two device-model ports with faults=all (link flaps, frames
#                       dropped on arrival, truncated frames, TX error completions, bad
#                       memory keys, failed queue state changes, slow completions), each
#                       fault in turn for --period seconds (default 0.5) with a clean period
#                       between two;
#   mana, mlx5          l2fwd on mana:/mlx5: ports over the fake rdma-core, whose device
#                       models cycle the same faults, and whose devices get a link flap and a
#                       host servicing (a device reset) in turn, each lasting --period, one
#                       device then the other, each reset waited out.
# In every part pktgen (device-model ports at the far ends of the two shared-memory cables,
# --rate pps, default 20000) runs again every --leg-seconds (default 15): a cable peer that
# goes away and comes back.
#
# At the end of each part it checks, and the verdict says:
#   - nothing was lost uncounted: every frame pktgen sent and did not get back is counted by
#     a device (pktgen's, and the frames a later pktgen run found stale on its cable;
#     l2fwd's; over the fake, what the fake's devices dropped where no driver can see it, as
#     they report at exit) or by l2fwd (its drops, its drops on a port that was down);
#     nothing counted twice; no duplicates;
#   - pktgen received frames in every run (the dataplane kept making progress), and the
#     faults did happen (TX and RX error completions, drops, link events; resets and as
#     many recoveries over the fake);
#   - pools are whole at every exit; l2fwd's open files and anonymous resident memory are
#     the same at the end as after the first pktgen run (a 2 MiB allowance for memory);
#   - no verbs object left (the fake's at-exit report), no file left in PMD_SHM_DIR, no
#     hugepage file left.
# Exit status 0 on PASS, 1 on FAIL (the logs are kept then, and their folder named).
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
./scripts/setup.sh >/dev/null
cargo build --release --quiet -p apps --bin pktgen --bin l2fwd
cargo build --release --quiet -p fake-rdma
bin=$(pwd)/${CARGO_TARGET_DIR:-target}/release
exec python3 bench/soak.py --bin "$bin" "$@"
