#!/usr/bin/env bash
# Runs the test suites of the crates with unsafe code (mempool: regions, caches, mbufs;
# pmd's unit tests: sys::mem, the shm cable and its rings, the queues, the capture rings)
# under AddressSanitizer with LeakSanitizer, on the nightly toolchain. See --help.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then
    cat <<'HELP'
usage: scripts/sanitize.sh [--help]

Builds mempool's tests and pmd's unit tests with -Zsanitizer=address (nightly; in
target/asan, apart from the normal build) and runs them with leak detection on. A memory
error or a leak fails the run. scripts/lsan.supp lists the leaks that are what a test
checks (a pool dropped with mbufs out, a test that forgets a handle to play a dead
process), by test name, and nothing else.

The fuzz targets run under AddressSanitizer too (scripts/fuzz.sh). Miri is not available on
these machines; the fake rdma-core is a C ABI library loaded into other programs and is
not run under a sanitizer here.
HELP
    exit 0
fi

export RUSTFLAGS="-Zsanitizer=address"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0"
export LSAN_OPTIONS="suppressions=$PWD/scripts/lsan.supp:print_suppressions=0"
target=$(rustc -vV | sed -n 's/^host: //p')
args=(+nightly test --target "$target" --target-dir target/asan --quiet)
echo "sanitize: mempool (unit and integration tests; doctests are not built with the sanitizer), AddressSanitizer + LeakSanitizer" >&2
cargo "${args[@]}" -p mempool --lib --tests
echo "sanitize: pmd unit tests, AddressSanitizer + LeakSanitizer" >&2
cargo "${args[@]}" -p pmd --lib
echo "sanitize: clean" >&2
