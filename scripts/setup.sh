#!/usr/bin/env bash
# Installs what this project needs on a Debian machine that has only Rust, gcc and Python,
# and reserves hugepages where the machine allows it. Idempotent, quiet, and fast (about a
# tenth of a second) when everything is already in place.
#
#   PMD_HUGEPAGES=N   number of 2 MiB hugepages to reserve (default 512 = 1 GiB; 0 = skip)
#   PMD_SETUP_EXTRA   more Debian packages to install (e.g. "dpdk dpdk-dev" for benches)
set -euo pipefail

# libpcap-dev: pmd-dumpcap compiles capture filters with libpcap. tshark and dpdk-dev (for
# DPDK's own dpdk-telemetry.py): the tests read our capture files and telemetry socket with
# other people's tools.
packages=(pkg-config clang libclang-dev libibverbs-dev librdmacm-dev ibverbs-providers
          iproute2 iputils-ping binutils util-linux
          libpcap-dev tshark dpdk-dev ${PMD_SETUP_EXTRA:-})

say() { printf 'setup: %s\n' "$*" >&2; }
as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"
    elif command -v sudo >/dev/null; then sudo "$@"
    else return 1; fi
}

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    log=$(mktemp)
    if ! { as_root apt-get update -qq && as_root apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
        cat "$log" >&2
        say "could not install ${missing[*]} (needs root or sudo, and apt sources)"
        exit 1
    fi
    rm -f "$log"
fi

# Hugepages: reserve 2 MiB pages and mount hugetlbfs. Where the machine does not allow it
# (no root, a container), the project still works on normal pages and says so once.
want=${PMD_HUGEPAGES:-512}
nr=/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
if [ "$want" -gt 0 ] && [ -e "$nr" ]; then
    have=$(cat "$nr")
    if [ "$have" -lt "$want" ]; then
        echo "$want" | as_root tee "$nr" >/dev/null 2>&1 || true
        have=$(cat "$nr")
        [ "$have" -ge "$want" ] || say "warning: only $have of $want 2 MiB hugepages reserved; normal pages will be used where they run out"
    fi
    if ! grep -qs " /dev/hugepages hugetlbfs " /proc/mounts; then
        { as_root mkdir -p /dev/hugepages && as_root mount -t hugetlbfs nodev /dev/hugepages; } >/dev/null 2>&1 \
            || say "warning: could not mount hugetlbfs on /dev/hugepages; shared-memory wires will use /dev/shm"
    fi
elif [ "$want" -gt 0 ]; then
    say "warning: this kernel has no 2 MiB hugepages; normal pages will be used"
fi
