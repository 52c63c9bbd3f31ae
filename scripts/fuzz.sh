#!/usr/bin/env bash
# Runs the fuzz targets (tests/fuzz) with cargo-fuzz: libFuzzer, coverage-guided, under
# AddressSanitizer, on the nightly toolchain. See --help.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
    cat <<'HELP'
usage: scripts/fuzz.sh [--help] [SECONDS] [TARGET...]

Fuzzes each TARGET (default: all of them) for SECONDS (default 60), two at a time, and
prints one line per target: executions, executions per second, coverage (libFuzzer's
"cov", edges) and corpus size. Each target starts from its seeds (tests/fuzz/seeds/TARGET)
and keeps what it finds in tests/fuzz/corpus/TARGET (not committed), so long runs build
on each other.

A crash, a failed invariant, an AddressSanitizer report or an input that runs longer than
10 s (a hang) stops that target; its input is
saved under tests/fuzz/artifacts/TARGET/ and the script exits 1 after the others finish.
To keep such an input as a regression test, fix the defect and copy the file to
tests/fuzz/regressions/TARGET/<what-it-found>: `cargo test -p fuzz-harness` replays it.

Installs cargo-fuzz (cargo install cargo-fuzz --locked) when the nightly toolchain lacks it.

Environment:
  FUZZ_JOBS   targets run at once (default 2)
  FUZZ_LOGS   directory for each target's libFuzzer log (default: a temporary one)
HELP
}

[ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ] && { usage; exit 0; }
secs=60
if [ $# -gt 0 ] && [[ "$1" =~ ^[0-9]+$ ]]; then secs=$1; shift; fi
all=(net_parse devargs pcap_file shm_ring telemetry mp_control queue_export shared_pool mana_rx mana_tx mlx5_rx mlx5_mprq mlx5_tx)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
for t in "${targets[@]}"; do
    [ -f "tests/fuzz/fuzz_targets/$t.rs" ] || { echo "fuzz: no target '$t' (targets: ${all[*]})" >&2; exit 2; }
done

if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz (once)" >&2
    cargo install cargo-fuzz --locked --quiet
fi

echo "fuzz: building ${#targets[@]} targets (nightly, AddressSanitizer)" >&2
build_log=$(mktemp)
if ! cargo +nightly fuzz build --fuzz-dir tests/fuzz >"$build_log" 2>&1; then
    cat "$build_log" >&2
    exit 1
fi
rm -f "$build_log"

logs=${FUZZ_LOGS:-$(mktemp -d)}
mkdir -p "$logs"
run_one() {
    local t=$1 secs=$2 logs=$3
    mkdir -p "tests/fuzz/corpus/$t"
    if cargo +nightly fuzz run --fuzz-dir tests/fuzz "$t" "tests/fuzz/corpus/$t" "tests/fuzz/seeds/$t" -- \
        -max_total_time="$secs" -print_final_stats=1 -max_len=8192 -rss_limit_mb=4096 -timeout=10 \
        >"$logs/$t.log" 2>&1; then
        echo ok >"$logs/$t.status"
    else
        echo FAILED >"$logs/$t.status"
    fi
}
export -f run_one
echo "fuzz: ${targets[*]}: ${secs} s each, ${FUZZ_JOBS:-2} at a time; logs in $logs" >&2
printf '%s\n' "${targets[@]}" | xargs -P "${FUZZ_JOBS:-2}" -I{} bash -c 'run_one "$@"' _ {} "$secs" "$logs"

status=0
printf '%-10s %8s %12s %8s %8s %7s  %s\n' target result execs "exec/s" cov corpus seconds
for t in "${targets[@]}"; do
    log=$logs/$t.log
    res=$(cat "$logs/$t.status" 2>/dev/null || echo FAILED)
    stat() { grep -o "stat::$1: *[0-9]*" "$log" | tail -1 | grep -o '[0-9]*$' || echo -; }
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo -)
    corpus=$(find "tests/fuzz/corpus/$t" -type f | wc -l)
    printf '%-10s %8s %12s %8s %8s %7s  %s\n' "$t" "$res" "$(stat number_of_executed_units)" \
        "$(stat average_exec_per_sec)" "$cov" "$corpus" "$secs"
    if [ "$res" != ok ]; then
        status=1
        echo "--- $t: the end of its log ($log):" >&2
        tail -40 "$log" >&2
        ls "tests/fuzz/artifacts/$t" 2>/dev/null | sed "s|^|fuzz: input saved: tests/fuzz/artifacts/$t/|" >&2 || true
    fi
done
exit $status
