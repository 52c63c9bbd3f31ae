#!/usr/bin/env bash
# The README's second command: install what is missing and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec cargo test --workspace --quiet "$@"
