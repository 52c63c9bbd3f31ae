#!/usr/bin/env bash
# Side-by-side: DPDK's rte_mempool vs our mempool, on this machine, in one go.
#
#   bench/compare_mempool.sh [path/to/dpdk_mempool_perf.c]
#
# The DPDK harness is the C file that prints the cached single-core rows of DPDK's
# mempool_perf_autotest as JSON lines. Its path comes from the first argument, else
# $DPDK_HARNESS, else bench/dpdk_mempool_perf.c (our harness over DPDK's public rte_mempool API).
#
# The script installs what it needs when missing (libdpdk-dev, dpdk-dev, pkg-config; as root,
# idempotent), reserves 2 MiB hugepages and mounts hugetlbfs when it can, builds the harness
# into a temporary directory, runs it and `mempool_perf --json --cache 512 --cores 1` (both on
# core 0, about 1 s per row), joins the rows on (n_get_bulk, n_put_bulk, n_keep) and prints
# ours/DPDK per row. Exit status 1 when a row is below 1.0.
#
# Environment: RUNS=N runs both sides N times, alternating, and compares each side's median
# rate per row (default 3). KEEP_TMP=1 keeps the temporary directory.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
harness=${1:-${DPDK_HARNESS:-$repo_root/bench/dpdk_mempool_perf.c}}
runs=${RUNS:-3}

say() { printf 'compare_mempool: %s\n' "$*" >&2; }
die() { say "$*"; exit 2; }

[[ -f $harness ]] || die "DPDK harness not found at '$harness': pass its path as the first argument or set DPDK_HARNESS"
[[ $runs =~ ^[1-9][0-9]*$ ]] || die "RUNS must be a positive integer, got '$runs'"

# --- tools -------------------------------------------------------------------------------
need_install=()
command -v pkg-config >/dev/null 2>&1 || need_install+=(pkg-config)
if ! pkg-config --exists libdpdk 2>/dev/null; then
    need_install+=(libdpdk-dev dpdk-dev)
fi
command -v cc >/dev/null 2>&1 || need_install+=(gcc)
command -v python3 >/dev/null 2>&1 || need_install+=(python3)
if ((${#need_install[@]})); then
    [[ $(id -u) -eq 0 ]] || die "missing ${need_install[*]}; run as root or install them first"
    say "installing ${need_install[*]}"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -qq "${need_install[@]}" >/dev/null 2>&1; then
        apt-get update -qq >/dev/null
        apt-get install -y -qq "${need_install[@]}" >/dev/null
    fi
fi
pkg-config --exists libdpdk || die "pkg-config cannot find libdpdk even after installing it"

# --- hugepages ---------------------------------------------------------------------------
hp=/sys/kernel/mm/hugepages/hugepages-2048kB
free_pages() { cat "$hp/free_hugepages" 2>/dev/null || echo 0; }
if (($(free_pages) < 128)) && [[ -w $hp/nr_hugepages ]]; then
    total=$(cat "$hp/nr_hugepages")
    echo $((total + 512)) >"$hp/nr_hugepages" 2>/dev/null || true
    say "reserved 2 MiB hugepages: $(free_pages) free"
fi
if ! grep -qs ' /dev/hugepages hugetlbfs ' /proc/mounts && [[ $(id -u) -eq 0 ]]; then
    mkdir -p /dev/hugepages
    mount -t hugetlbfs nodev /dev/hugepages 2>/dev/null || say "could not mount hugetlbfs (DPDK runs --in-memory anyway)"
fi
eal_mem=(--in-memory)
ours_env=()
if (($(free_pages) < 64)); then
    say "no free hugepages: both sides run on 4 KiB pages (DPDK --no-huge, ours PMD_NO_HUGEPAGES=1)"
    eal_mem=(--no-huge -m 256)
    ours_env=(PMD_NO_HUGEPAGES=1)
fi

# --- build -------------------------------------------------------------------------------
tmp=$(mktemp -d "${TMPDIR:-/tmp}/compare_mempool.XXXXXX")
if [[ ${KEEP_TMP:-0} == 1 ]]; then say "keeping $tmp"; else trap 'rm -rf "$tmp"' EXIT; fi

say "building the DPDK harness ($(pkg-config --modversion libdpdk))"
# shellcheck disable=SC2046 # pkg-config output is a list of flags
cc -O3 -march=native -o "$tmp/dpdk_mempool_perf" "$harness" $(pkg-config --cflags --libs libdpdk)
say "building mempool_perf (release)"
(cd "$repo_root" && cargo build --release --quiet -p bench --bin mempool_perf)
ours_bin=$repo_root/target/release/mempool_perf

# --- run ---------------------------------------------------------------------------------
for ((i = 1; i <= runs; i++)); do
    say "run $i/$runs: DPDK (about 20 s)"
    "$tmp/dpdk_mempool_perf" -l 0 --no-pci "${eal_mem[@]}" --file-prefix="mp$$" \
        --log-level=lib.eal:error 2>/dev/null | grep '^{' >>"$tmp/dpdk.jsonl" ||
        die "the DPDK harness failed; run it by hand: $tmp/dpdk_mempool_perf -l 0 --no-pci ${eal_mem[*]}"
    say "run $i/$runs: ours (about 20 s)"
    env "${ours_env[@]}" "$ours_bin" --json --cache 512 --cores 1 >>"$tmp/ours.jsonl"
done

# --- join --------------------------------------------------------------------------------
python3 - "$tmp/dpdk.jsonl" "$tmp/ours.jsonl" "$runs" <<'PY'
import json, statistics, sys

def median(path):
    rows = {}
    for line in open(path):
        r = json.loads(line)
        if r["cache"] != 512 or r["cores"] != 1:
            continue
        key = (r["n_get_bulk"], r["n_put_bulk"], r["n_keep"])
        rows.setdefault(key, []).append(r["rate_persec"])
    return {k: round(statistics.median(v)) for k, v in rows.items()}

dpdk, ours, runs = median(sys.argv[1]), median(sys.argv[2]), int(sys.argv[3])
keys = sorted(set(dpdk) & set(ours), key=lambda k: (k[2], k[0], k[1]))
missing = sorted(set(dpdk) ^ set(ours))
if not keys:
    sys.exit("compare_mempool: no rows in common")
note = f", median of {runs} runs" if runs > 1 else ""
print(f"cache 512, 1 core, objects per second{note}")
print(f"{'n_get_bulk':>10} {'n_put_bulk':>10} {'n_keep':>6} {'DPDK':>15} {'ours':>15} {'ours/DPDK':>9}")
low = []
for k in keys:
    ratio = ours[k] / dpdk[k]
    if ratio < 1.0:
        low.append(k)
    print(f"{k[0]:>10} {k[1]:>10} {k[2]:>6} {dpdk[k]:>15,} {ours[k]:>15,} {ratio:>9.2f}")
ratios = [ours[k] / dpdk[k] for k in keys]
print(f"min {min(ratios):.2f}, max {max(ratios):.2f} over {len(keys)} rows")
if missing:
    print(f"rows only on one side: {missing}")
if low:
    print(f"below 1.0: {low}")
    sys.exit(1)
PY
