#!/usr/bin/env bash
# Driver datapath cost per packet, ours against DPDK's own burst functions, over the same
# zero-cost device double (bench/README.md, "Driver datapath against DPDK on a zero-cost
# device double").
#
#   bench/compare_datapath.sh [DPDK_SOURCE_DIR] [--runs N] [--bursts N] [--warmup N]
#                             [--paths tx,rx,rxc,m5tx,m5rx] [--cpu N] [--max-load L]
#                             [--perf] [--build-only]
#
# DPDK_SOURCE_DIR: an extracted DPDK source tree (the harness targets v26.07, e.g.
#   `git -C <dpdk git dir> archive v26.07 | tar -x -C <dir>`). It is compiled here, never
#   modified. Without it, Debian's `dpdk` source package is fetched with `apt-get source`
#   (deb-src entries are added when the machine has none).
# Paths: tx, rx, rxc (MANA TX, RX, RX with RX_COALESCED_4 CQEs), m5tx (mlx5 TX, eMPW), m5rx
#   (mlx5 RX: against DPDK's scalar and its SSE vector RX); ours only, no DPDK row:
#   m5tx-send, m5rx-cqz, m5rx-mprq, m5rx-mprq-cqz.
# Work folder: $PERF_WORK or ${TMPDIR:-/tmp}/pmd-datapath (DPDK's build is kept there and
#   reused while the source tree and its options stay the same). Builds run niced, one job.
# Installs its missing Debian packages (meson ninja-build python3-pyelftools libibverbs-dev
#   libnuma-dev pkg-config; linux-perf with --perf; dpkg-dev without DPDK_SOURCE_DIR) through
#   scripts/setup.sh, which also reserves hugepages.
# Prints one table (bench/datapath/summarize.py) and leaves every RESULT line in
#   $work/results.txt.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
say() { printf 'compare_datapath: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }
usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit "${1:-2}"; }

dpdk_src="" runs=5 bursts=200000 warmup=20000 paths=tx,rx,rxc,m5tx,m5rx cpu=1 do_perf=0
build_only=0 max_load=1.3
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --bursts) bursts=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --paths) paths=$2; shift 2 ;;
    --cpu) cpu=$2; shift 2 ;;
    --max-load) max_load=$2; shift 2 ;;
    --perf) do_perf=1; shift ;;
    --build-only) build_only=1; shift ;;
    -h|--help) usage 0 ;;
    -*) say "unknown option $1"; usage ;;
    *) [ -z "$dpdk_src" ] || usage; dpdk_src=$1; shift ;;
  esac
done
for n in "$runs" "$bursts" "$warmup" "$cpu"; do
  [[ $n =~ ^[0-9]+$ ]] || die "expected a number, got '$n'"
done
if [ "$runs" -lt 1 ] || [ "$bursts" -lt 1 ]; then die "--runs and --bursts must be at least 1"; fi

# The DPDK side's paths per harness: MANA's keep their names; m5tx -> tx; m5rx -> rx and rxv.
mana_paths=() m5_paths=()
for p in ${paths//,/ }; do
  case $p in
    tx|rx|rxc) mana_paths+=("$p") ;;
    m5tx) m5_paths+=(tx) ;;
    m5rx) m5_paths+=(rx rxv) ;;
    m5tx-send|m5rx-cqz|m5rx-mprq|m5rx-mprq-cqz) ;;
    *) die "unknown path $p" ;;
  esac
done

work=${PERF_WORK:-${TMPDIR:-/tmp}/pmd-datapath}
mkdir -p "$work"
work=$(cd "$work" && pwd -P)
NICE="nice -n 15"

# ---------------------------------------------------------------------------------------------
# 0. Packages (idempotent: scripts/setup.sh installs only what dpkg does not have).
extra="meson ninja-build python3-pyelftools libibverbs-dev libnuma-dev pkg-config gcc"
[ "$do_perf" = 1 ] && extra+=" linux-perf"
[ -z "$dpdk_src" ] && extra+=" dpkg-dev"
PMD_SETUP_EXTRA="$extra" "$repo/scripts/setup.sh" || die "missing Debian packages: $extra (install them, as root)"
# DPDK's meson scripts need a python3 with elftools (Debian's); prefer the system one.
export PATH=/usr/bin:$PATH
missing=()
for c in meson ninja cc cargo taskset pkg-config objdump; do command -v "$c" >/dev/null || missing+=("$c"); done
python3 -c 'import elftools' 2>/dev/null || missing+=(python3-pyelftools)
for h in infiniband/manadv.h infiniband/mlx5dv.h numa.h; do [ -f "/usr/include/$h" ] || missing+=("$h"); done
[ "$do_perf" = 1 ] && { command -v perf >/dev/null || missing+=(perf); }
[ ${#missing[@]} -eq 0 ] || die "still missing: ${missing[*]}"

# ---------------------------------------------------------------------------------------------
# 1. The DPDK source: the given tree, or Debian's source package.
debian_source() {
  local d="$work/debian-src"
  local have
  have=$(find "$d" -maxdepth 2 -name VERSION -path '*/dpdk-*/VERSION' 2>/dev/null | head -1)
  if [ -n "$have" ]; then dirname "$have"; return; fi
  if ! apt-get source --print-uris dpdk >/dev/null 2>&1; then
    apt-get update -qq >/dev/null 2>&1 || true
  fi
  if ! apt-get source --print-uris dpdk >/dev/null 2>&1; then
    say "no deb-src entries: adding them (/etc/apt/sources.list.d/pmd-datapath-src.sources)"
    [ "$(id -u)" -eq 0 ] || die "need root to enable deb-src; or pass a DPDK source tree"
    # deb822 files: the same entries with Types: deb-src; one-line sources.list: deb-src lines.
    local src=/etc/apt/sources.list.d/pmd-datapath-src.sources f
    : >"$src.tmp"
    for f in /etc/apt/sources.list.d/*.sources; do
      [ -f "$f" ] || continue
      sed 's/^Types: deb$/Types: deb-src/' "$f" >>"$src.tmp"
      echo >>"$src.tmp"
    done
    if grep -q '^Types: deb-src' "$src.tmp"; then mv "$src.tmp" "$src"; else rm -f "$src.tmp"; fi
    if [ -f /etc/apt/sources.list ] && grep -qE '^deb ' /etc/apt/sources.list; then
      grep -E '^deb ' /etc/apt/sources.list | sed 's/^deb /deb-src /' >/etc/apt/sources.list.d/pmd-datapath-src.list
    fi
    apt-get update -qq >/dev/null 2>&1 || die "apt-get update failed after adding deb-src entries"
  fi
  mkdir -p "$d"
  say "fetching Debian's dpdk source package into $d"
  (cd "$d" && apt-get source -qq dpdk >"$work/apt-source.log" 2>&1) \
    || { tail -5 "$work/apt-source.log" >&2; die "apt-get source dpdk failed (log: $work/apt-source.log)"; }
  have=$(find "$d" -maxdepth 2 -name VERSION -path '*/dpdk-*/VERSION' | head -1)
  [ -n "$have" ] || die "apt-get source dpdk left no source tree in $d"
  dirname "$have"
}
if [ -z "$dpdk_src" ]; then
  dpdk_src=$(debian_source) || exit 1
fi
if [ ! -f "$dpdk_src/VERSION" ] || [ ! -d "$dpdk_src/drivers/net/mana" ]; then
  die "$dpdk_src is not a DPDK source tree with drivers/net/mana"
fi
dpdk_src=$(cd "$dpdk_src" && pwd -P)
dpdk_version=$(cat "$dpdk_src/VERSION")

# ---------------------------------------------------------------------------------------------
# 2. DPDK: static libraries of the given tree, only what the harnesses need.
dbuild="$work/dpdk-build-$dpdk_version"
# Only the libraries the drivers need where the tree knows the option; older trees (22.11)
# can only leave out their optional libraries.
if grep -q "option('enable_libs'" "$dpdk_src/meson_options.txt"; then
  libs=(-Denable_libs=eal)
else
  libs=(-Ddisable_libs='*')
fi
meson_opts=(-Dbuildtype=release -Ddefault_library=static -Dplatform=native "${libs[@]}"
  "-Denable_drivers=net/mana,net/mlx5,common/mlx5,bus/pci,bus/auxiliary,bus/vdev,mempool/ring"
  -Ddisable_apps='*' -Dtests=false -Denable_docs=false -Denable_driver_sdk=true -Dmax_lcores=16)
stamp="$dpdk_src $dpdk_version ${meson_opts[*]}"
cbuild="$work/c-$dpdk_version"
mkdir -p "$cbuild"
hc="$here/datapath/c"

# The compiler command line DPDK's own build uses for FILE of TARGET (compile_commands.json),
# less dependency and output options; relative include paths made absolute.
flags_of() {
  python3 - "$dbuild" "$1" "$2" <<'EOF'
import json, shlex, sys
build, suffix, target = sys.argv[1:]
for e in json.load(open(build + "/compile_commands.json")):
    if e["file"].endswith(suffix) and target in e["command"]:
        args = shlex.split(e["command"])[1:]
        out, skip = [], False
        for a in args:
            if skip:
                skip = False
                continue
            if a in ("-MQ", "-MF", "-o", "-c"):
                skip = True
                continue
            if a == "-MD" or a.startswith("-fdiagnostics-color"):
                continue
            if a.startswith("-I") and not a.startswith("-I/"):
                a = "-I" + e["directory"] + "/" + a[2:]
            out.append(a)
        print(" ".join(shlex.quote(a) for a in out))
        break
EOF
}

# What the tree's net/mana looks like (fields and the RX refill's arguments differ between
# releases; bench/datapath/c/mana_dpdk.c), and whether its RX takes coalesced CQEs at all.
mana_h="$dpdk_src/drivers/net/mana/mana.h" mana_rx="$dpdk_src/drivers/net/mana/rx.c"
hdefs=""
grep -q 'txq_idx;' "$mana_h" && hdefs+=" -DHARNESS_MANA_QUEUE_IDX"
grep -q 'backlog_idx;' "$mana_h" && hdefs+=" -DHARNESS_MANA_RX_BACKLOG"
grep -q 'vlan_strip;' "$mana_h" && hdefs+=" -DHARNESS_MANA_VLAN_STRIP"
grep -Eq '^mana_alloc_and_post_rx_wqes\(struct mana_rxq \*rxq, *uint32_t' "$mana_rx" && hdefs+=" -DHARNESS_MANA_REFILL_COUNT"
dpdk_rxc=yes
grep -q 'RX coalescing is not supported' "$mana_rx" && dpdk_rxc=no
if [ "$dpdk_rxc" = no ] && [[ " ${mana_paths[*]} " == *" rxc "* ]]; then
  say "DPDK $dpdk_version's net/mana drops RX_COALESCED_4 CQEs: rxc runs on our side only"
  keep=()
  for p in "${mana_paths[@]}"; do [ "$p" = rxc ] || keep+=("$p"); done
  mana_paths=("${keep[@]}")
fi

# Compiles the two harness files against the configured tree: right after `meson setup`, so a
# tree whose driver structures the harness does not know fails in seconds, not after the build.
compile_harness() {
  mana_flags=$(flags_of net/mana/tx.c libtmp_rte_net_mana)
  m5flags=$(flags_of net/mlx5/mlx5_rx.c libtmp_rte_net_mlx5)
  if [ -z "$mana_flags" ] || [ -z "$m5flags" ]; then
    die "no compile command for net/mana or net/mlx5 in $dbuild (a driver left out by meson? see $work/dpdk-$dpdk_version-setup.log)"
  fi
  local mana_src="$dpdk_src/drivers/net/mana"
  eval "$NICE cc $mana_flags $hdefs -g -I$mana_src -c $hc/mana_dpdk.c -o $cbuild/mana_dpdk.o" &&
    eval "$NICE cc $mana_flags $hdefs -g -I$mana_src -c $hc/mana_rx_tu.c -o $cbuild/rx_tu.o" &&
    eval "$NICE cc $m5flags -g -c $hc/mlx5_dpdk.c -o $cbuild/mlx5_dpdk.o"
}
harness_mismatch() {
  die "the C harness (bench/datapath/c) does not compile against DPDK $dpdk_version from $dpdk_src
  (errors above, log: $work/harness-compile.log). It is written for DPDK v26.07's net/mana and
  net/mlx5 structures; older trees (Debian 12's 22.11) differ. Pass a v26.07 tree:
    git -C <dpdk git dir> archive v26.07 | tar -x -C <dir>;  $0 <dir>"
}

if [ ! -f "$dbuild/.built" ] || [ "$(cat "$dbuild/.built")" != "$stamp" ]; then
  rm -rf "$dbuild"
  say "DPDK $dpdk_version: meson setup (log: $work/dpdk-$dpdk_version-setup.log)"
  $NICE meson setup "$dbuild" "$dpdk_src" "${meson_opts[@]}" >"$work/dpdk-$dpdk_version-setup.log" 2>&1 \
    || { tail -20 "$work/dpdk-$dpdk_version-setup.log" >&2; die "meson setup failed"; }
  compile_harness >"$work/harness-compile.log" 2>&1 || { grep -m 12 'error' "$work/harness-compile.log" >&2 || true; harness_mismatch; }
  say "DPDK $dpdk_version: ninja -j1, niced (several minutes; log: $work/dpdk-$dpdk_version-build.log)"
  $NICE ninja -j1 -C "$dbuild" >"$work/dpdk-$dpdk_version-build.log" 2>&1 \
    || { tail -20 "$work/dpdk-$dpdk_version-build.log" >&2; die "DPDK build failed"; }
  echo "$stamp" >"$dbuild/.built"
fi

# ---------------------------------------------------------------------------------------------
# 3. The C harnesses. MANA: net/mana's gdma.c, tx.c, mr.c (unmodified) and rx.c (through
#    mana_rx_tu.c), compiled with exactly the flags DPDK's build uses for net/mana. mlx5: DPDK's
#    own librte_net_mlx5.a (the burst routines are not recompiled).
say "C harnesses (DPDK $dpdk_version)"
compile_harness >"$work/harness-compile.log" 2>&1 || { grep -m 12 'error' "$work/harness-compile.log" >&2 || true; harness_mismatch; }
mana_src="$dpdk_src/drivers/net/mana"
for f in gdma tx mr; do
  eval "$NICE cc $mana_flags -g -c $mana_src/$f.c -o $cbuild/$f.o"
done
$NICE cc -O2 -c "$hc/mana_stubs.c" -o "$cbuild/stubs.o"
# External libraries DPDK was configured with (libbsd, libnuma, ...: whatever this machine
# has), from the pkg-config files meson generated, less DPDK's own libraries.
ext=$(export PKG_CONFIG_PATH="$dbuild/meson-private"
  { pkg-config --libs libdpdk; pkg-config --static --libs libdpdk-libs; } | tr ' ' '\n' |
    grep -v -e 'rte_' -e '^-L' -e 'whole-archive' -e 'export-dynamic' -e '^$' | sort -u | tr '\n' ' ')
dlibs=("-Wl,--whole-archive" "$dbuild/drivers/librte_mempool_ring.a" "-Wl,--no-whole-archive" "-Wl,--start-group")
for a in "$dbuild"/lib/librte_*.a "$dbuild"/drivers/librte_bus_*.a; do dlibs+=("$a"); done
dlibs+=("-Wl,--end-group")
# shellcheck disable=SC2086 # $ext is a list of linker flags
$NICE cc -o "$cbuild/mana_dpdk" "$cbuild/mana_dpdk.o" "$cbuild/rx_tu.o" "$cbuild/gdma.o" "$cbuild/tx.o" \
  "$cbuild/mr.o" "$cbuild/stubs.o" "${dlibs[@]}" $ext -libverbs -lmana -lnuma -lpthread -ldl -lm \
  >"$work/link.log" 2>&1 || { cat "$work/link.log" >&2; die "the MANA harness did not link"; }
m5libs=("-Wl,--whole-archive" "$dbuild/drivers/librte_mempool_ring.a" "-Wl,--no-whole-archive" "-Wl,--start-group"
  "$dbuild/drivers/librte_net_mlx5.a" "$dbuild/drivers/librte_common_mlx5.a")
for a in "$dbuild"/drivers/librte_bus_*.a "$dbuild"/lib/librte_*.a; do m5libs+=("$a"); done
m5libs+=("-Wl,--end-group")
# The vector RX object goes in by name: net/mlx5 also defines weak stubs of its vector
# routines (returning 0, for machines without SIMD), and an archive member is only pulled in
# for an undefined symbol, so some trees (22.11) would link the stub.
(cd "$cbuild" && ar x "$dbuild/drivers/librte_net_mlx5.a" net_mlx5_mlx5_rxtx_vec.c.o) \
  || die "no net_mlx5_mlx5_rxtx_vec.c.o in $dbuild/drivers/librte_net_mlx5.a"
# shellcheck disable=SC2086
$NICE cc -o "$cbuild/mlx5_dpdk" "$cbuild/mlx5_dpdk.o" "$cbuild/net_mlx5_mlx5_rxtx_vec.c.o" "${m5libs[@]}" \
  $ext -libverbs -lmlx5 -lnuma -lpthread -ldl -lm >>"$work/link.log" 2>&1 \
  || { cat "$work/link.log" >&2; die "the mlx5 harness did not link"; }
vec_size=$(nm -S "$cbuild/mlx5_dpdk" | awk '$4 == "mlx5_rx_burst_vec" {print $2}')
[ $((16#${vec_size:-0})) -gt 64 ] || die "the mlx5 harness linked a stub of mlx5_rx_burst_vec (0x${vec_size:-0} bytes)"

# The harness's net/mana objects must be DPDK's own code: compare their instructions with the
# objects of DPDK's build.
dis() {
  objdump -d --no-show-raw-insn "$1" | awk -v f="<$2>:" '$2 == f {p=1; next} p && /^$/ {exit} p' |
    sed 's/^ *[0-9a-f]*://; s/<[^>]*>//g; s/#.*//' | md5sum
}
same=yes
for pair in tx:mana_tx_burst rx:mana_rx_burst rx:mana_alloc_and_post_rx_wqes gdma:gdma_post_work_request \
  gdma:gdma_poll_completion_queue mr:mana_alloc_pmd_mr; do
  f=${pair%%:*} fn=${pair#*:}
  mine="$cbuild/$f.o"
  [ "$f" = rx ] && mine="$cbuild/rx_tu.o"
  theirs="$dbuild/drivers/libtmp_rte_net_mana.a.p/net_mana_$f.c.o"
  # (Older trees name their MR functions differently: check what this one has.)
  nm "$theirs" | grep -q " [Tt] $fn\$" || continue
  if [ "$(dis "$theirs" "$fn")" != "$(dis "$mine" "$fn")" ]; then
    same=no
    say "   $fn differs from DPDK's build"
  fi
done
say "   net/mana datapath instructions identical to DPDK's own build: $same"

# ---------------------------------------------------------------------------------------------
# 4. Ours: the `datapath` binary of the bench crate, with the workspace's release profile.
say "ours: cargo build --release -j1 -p bench --bin datapath (log: $work/rust-build.log)"
(cd "$repo" && $NICE cargo build --release -j1 -p bench --bin datapath) >"$work/rust-build.log" 2>&1 \
  || { tail -20 "$work/rust-build.log" >&2; die "cargo build failed"; }
ours="${CARGO_TARGET_DIR:-$repo/target}/release/datapath"
dpdk="$cbuild/mana_dpdk"
dpdk5="$cbuild/mlx5_dpdk"
if [ "$build_only" = 1 ]; then
  say "built: $ours $dpdk $dpdk5"
  exit 0
fi

# ---------------------------------------------------------------------------------------------
# 5. Interleaved runs (odd runs ours first, even runs DPDK first), each started when the
#    1-minute load is below --max-load (at most 10 minutes of waiting per run).
free_hp=$(cat /sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages 2>/dev/null || echo 0)
if [ "$free_hp" -ge 256 ]; then
  eal=(-l "$cpu" --in-memory --no-pci --no-telemetry -m 256 --log-level=lib.eal:error)
  ours_env=()
else
  say "fewer than 256 free 2 MiB hugepages: both sides on 4 KiB pages (DPDK --no-huge, ours PMD_NO_HUGEPAGES=1)"
  eal=(-l "$cpu" --no-huge --no-pci --no-telemetry -m 256 --log-level=lib.eal:error)
  ours_env=(PMD_NO_HUGEPAGES=1)
fi
wait_quiet() {
  local waited=0
  while awk -v m="$max_load" '{exit !($1 >= m)}' /proc/loadavg; do
    if [ $waited -ge 600 ]; then
      say "   (load still $(cut -d' ' -f1 /proc/loadavg) after 10 minutes; running anyway)"
      return
    fi
    sleep 15
    waited=$((waited + 15))
  done
}
join() { local IFS=,; echo "$*"; }
common=(--bursts "$bursts" --warmup "$warmup")
run_ours() { env "${ours_env[@]}" taskset -c "$cpu" "$ours" "${common[@]}" --paths "$paths" 2>>"$work/ours-stderr.log"; }
run_dpdk() {
  if [ ${#mana_paths[@]} -gt 0 ]; then
    "$dpdk" "${eal[@]}" -- "${common[@]}" --paths "$(join "${mana_paths[@]}")" 2>>"$work/dpdk-stderr.log"
  fi
  if [ ${#m5_paths[@]} -gt 0 ]; then
    "$dpdk5" "${eal[@]}" -- "${common[@]}" --paths "$(join "${m5_paths[@]}")" 2>>"$work/dpdk-stderr.log"
  fi
}
res="$work/results.txt"
: >"$res"
: >"$work/ours-stderr.log"
: >"$work/dpdk-stderr.log"
say "$runs interleaved runs per side on CPU $cpu ($bursts bursts of 32 after $warmup warm-up; paths $paths)"
for r in $(seq 1 "$runs"); do
  if [ $((r % 2)) = 1 ]; then order="ours dpdk"; else order="dpdk ours"; fi
  for side in $order; do
    wait_quiet
    say "   run $r $side (load $(cut -d' ' -f1 /proc/loadavg))"
    "run_$side" | tee -a "$res" | sed 's/^/      /' >&2 \
      || die "run $r $side failed (stderr: $work/$side-stderr.log)"
  done
done
echo
rev=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo '?')
git -C "$repo" diff --quiet HEAD -- pmd mempool bench 2>/dev/null || rev="$rev (with uncommitted changes)"
echo "DPDK $dpdk_version ($dpdk_src); ours: commit $rev"
python3 "$here/datapath/summarize.py" "$res"

# ---------------------------------------------------------------------------------------------
# 6. Optional: where the time goes (perf record, DWARF call chains; only samples inside the
#    burst calls count, see bench/datapath/profile.py), per path and side.
if [ "$do_perf" = 1 ]; then
  pb=$((bursts * 5))
  for p in ${paths//,/ }; do
    case $p in
      m5tx) dp=(tx); bin5=$dpdk5 ;;
      m5rx) dp=(rx rxv); bin5=$dpdk5 ;;
      tx|rx|rxc) dp=("$p"); bin5=$dpdk ;;
      *) dp=(); bin5= ;;
    esac
    wait_quiet
    env "${ours_env[@]}" perf record -q -F 2000 -e cpu-clock --call-graph dwarf,8192 -o "$work/perf-ours-$p.data" -- \
      taskset -c "$cpu" "$ours" --bursts "$pb" --warmup "$warmup" --paths "$p" >/dev/null 2>&1
    python3 "$here/datapath/profile.py" "$work/perf-ours-$p.data" "$ours" >"$work/profile-ours-$p.txt" || true
    rm -f "$work/perf-ours-$p.data"
    echo "== profile $p ours ($work/profile-ours-$p.txt)"
    head -22 "$work/profile-ours-$p.txt"
    for q in "${dp[@]}"; do
      wait_quiet
      perf record -q -F 2000 -e cpu-clock --call-graph dwarf,8192 -o "$work/perf-dpdk-$p-$q.data" -- \
        "$bin5" "${eal[@]}" -- --bursts "$pb" --warmup "$warmup" --paths "$q" >/dev/null 2>&1
      python3 "$here/datapath/profile.py" "$work/perf-dpdk-$p-$q.data" "$bin5" >"$work/profile-dpdk-$p-$q.txt" || true
      rm -f "$work/perf-dpdk-$p-$q.data"
      echo "== profile $p dpdk $q ($work/profile-dpdk-$p-$q.txt)"
      head -22 "$work/profile-dpdk-$p-$q.txt"
    done
  done
fi
