#!/usr/bin/env bash
# Instructions per packet of each driver datapath (the `datapath` binary's paths), counted by
# callgrind: exact and the same from run to run, where cycle counts on a busy machine move
# by 10% or more.
#
#   bench/datapath_instructions.sh [--paths tx,rx,...] [--bursts N] [--warmup N] [--keep DIR]
#                                  [--shared-pool]
#
# Each path runs alone under `valgrind --tool=callgrind --toggle-collect='*datapath_call*'`
# (only the timed driver call, `datapath_call_tx` / `datapath_call_rx`, is counted) with
# `--zero-before='*datapath_measure_start*'` (counts restart after the warm-up bursts), so
# the total is the driver's instructions over the measured bursts. Defaults: every path,
# 20000 bursts of 32 packets after 2000 warm-up bursts (about 10 s per path).
# --keep DIR keeps the callgrind files (read them with callgrind_annotate --inclusive=yes).
# --shared-pool runs on a pool shared between processes (a file in /dev/shm), as a
# multi-process dataplane does: its objects carry their owner's tag.
# Installs valgrind through scripts/setup.sh when it is missing.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
say() { printf 'datapath_instructions: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

paths=tx,rx,rxc,m5tx,m5tx-send,m5rx,m5rx-cqz,m5rx-mprq,m5rx-mprq-cqz
bursts=20000 warmup=2000 keep="" shared=()
while [ $# -gt 0 ]; do
  case "$1" in
    --paths) paths=$2; shift 2 ;;
    --bursts) bursts=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --keep) keep=$2; shift 2 ;;
    --shared-pool) shared=(--shared-pool /dev/shm); shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) die "unknown argument $1 (see --help)" ;;
  esac
done
[[ $bursts =~ ^[1-9][0-9]*$ ]] || die "--bursts must be a positive number, got '$bursts'"
[[ $warmup =~ ^[0-9]+$ ]] || die "--warmup must be a number, got '$warmup'"

command -v valgrind >/dev/null || PMD_SETUP_EXTRA=valgrind "$repo/scripts/setup.sh" \
  || die "valgrind is missing (Debian: apt-get install valgrind)"

say "cargo build --release -j1 -p bench --bin datapath"
(cd "$repo" && nice cargo build --release --quiet -j1 -p bench --bin datapath) || die "cargo build failed"
bin="${CARGO_TARGET_DIR:-$repo/target}/release/datapath"
# Unknown paths are refused by the binary itself (it lists the known ones), before valgrind.
"$bin" --paths "$paths" --bursts 1 --warmup 1 >/dev/null || die "bad --paths $paths"

if [ -n "$keep" ]; then
  mkdir -p "$keep"
  out=$(cd "$keep" && pwd)
else
  out=$(mktemp -d "${TMPDIR:-/tmp}/datapath-instructions.XXXXXX")
  trap 'rm -rf "$out"' EXIT
fi

rev=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?')
git -C "$repo" diff --quiet HEAD -- pmd mempool bench 2>/dev/null || rev="$rev (with uncommitted changes)"
echo "driver instructions per packet (callgrind, $bursts bursts of 32 after $warmup warm-up; commit $rev${shared:+; shared pool})"
echo
printf '| %-15s | %-18s | %12s | %10s |\n' path result "instr/burst" "instr/pkt"
printf '|%s|%s|%s|%s|\n' "-----------------" "--------------------" "-------------:" "-----------:"
for p in ${paths//,/ }; do
  f="$out/callgrind.$p.out"
  valgrind --tool=callgrind --callgrind-out-file="$f" --collect-atstart=no \
    --toggle-collect='*datapath_call*' --zero-before='*datapath_measure_start*' \
    "$bin" --paths "$p" --bursts "$bursts" --warmup "$warmup" "${shared[@]}" >"$out/$p.stdout" 2>"$out/$p.stderr" \
    || { tail -5 "$out/$p.stderr" >&2; die "path $p failed under valgrind"; }
  name=$(sed -n 's/^RESULT .* path=\([^ ]*\) .*/\1/p' "$out/$p.stdout")
  total=$(sed -n 's/^totals: \([0-9]*\).*/\1/p' "$f" | tail -1)
  if [ -z "$total" ] || [ "$total" -eq 0 ]; then die "no instructions counted for $p (see $f)"; fi
  awk -v p="$p" -v n="$name" -v t="$total" -v b="$bursts" \
    'BEGIN { printf "| %-15s | %-18s | %12.1f | %10.2f |\n", p, n, t / b, t / (b * 32) }'
done
