#!/usr/bin/env bash
# The README's first command: install what is missing, build everything, and run the main job
# on the embedded default (for now: list real RDMA devices, if any, and the device model).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo build --release --workspace --quiet
exec ./target/release/pmd-devices "$@"
