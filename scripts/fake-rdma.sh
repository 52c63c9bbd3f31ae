#!/usr/bin/env bash
# Runs a command on the fake rdma-core: a stand-in for libibverbs.so.1, libmana.so.1 and
# libmlx5.so.1 with the device model behind its queues. See --help.
set -euo pipefail

usage() {
    cat <<'HELP'
usage: scripts/fake-rdma.sh [--help] COMMAND [ARGS...]

Runs COMMAND, unchanged, against the fake rdma-core instead of the real one. The fake
library is built if needed (cargo build --release -p fake-rdma), installed in a temporary
directory as libibverbs.so.1, libmana.so.1 and libmlx5.so.1, and found first through
LD_LIBRARY_PATH. A fake sysfs tree in the same directory describes the devices; both
libibverbs (SYSFS_PATH) and pmd's discovery (PMD_SYSFS_ROOT) read it; it also shows the
kernel modules loaded, and PMD_DEV_ROOT has a uverbs node per device, so that
`pmd-devices --check SPEC` finds what a VM has. Everything is removed
when COMMAND exits; its exit status is returned. The fake prints a one-line banner on
stderr, and refuses to run next to a real libibverbs.

Environment:
  FAKE_RDMA_PORTS    the world: a ';'-separated list of
                       mana_N/PORT:mac=MAC,wire=WIRE[,netdev=IFNAME][,vp_offset=N]
                         [,coalesce=1][,netdev_up_after_reset=1]
                       mlx5_N/1:mac=MAC,wire=WIRE[,netdev=IFNAME][,part=ID]
                         [,netdev_up_after_reset=1]
                     either also [,faults=KIND[+KIND...]|all][,fault_period=SECONDS]:
                     the device model cycles those faults, as a device-model port's
                     faults= devarg (pmd/README.md, "Ports"): error completions, drops, bad keys
                     WIRE is a device-model wire (none, shm:NAME, loop:NAME, afpacket:IF);
                     netdev=IFNAME names a real interface that plays the port's kernel
                     netdev: on MANA, while it is up it holds the port (raw QPs fail with
                     ENODEV); on mlx5 the port is ACTIVE while it is up. An mlx5 device has
                     one port; part= is its PCI device id (vendor_part_id): 0x1017
                     ConnectX-5 (default), 0x1013 ConnectX-4 (18-byte inline header).
                     coalesce=1 (MANA): RSS QPs coalesce RX CQEs, as newer kernels.
                     netdev_up_after_reset=1 (with netdev=): IFNAME is brought up when
                     the device comes back from a servicing (as hv_netvsc opens a VF).
                     Default: mana_0 with ports 1 and 2, MACs 02:00:00:00:10:01 and
                     02:00:00:00:10:02, wires shm:fake-mana_0-1 and shm:fake-mana_0-2
                     (attach from another process with emu-mana:wire=shm:fake-mana_0-1).
  FAKE_RDMA_PROFILE  v44 (default) or main: which rdma-core the fake behaves as.
  FAKE_RDMA_FAIL     injected failures, CALL[#N]:ERRNO[,...]: the N-th call of CALL (every
                     call without #N) fails with ERRNO (a name like ENOMEM, or a number)
                     where rdma-core would have asked the kernel.
  FAKE_RDMA_TRACE    a file to append a JSON line per call to (call, args, ret, errno).
  FAKE_RDMA_BUSY_ERRNO  ENODEV (default, released kernels) or EBUSY (newer kernels): what a
                     raw QP fails with while the port's netdev is up.
  FAKE_RDMA_LIB      use this libfake_rdma.so instead of building one.

Asynchronous events: while COMMAND runs, files in the tree ($SYSFS_PATH as COMMAND sees it)
raise them on every open context of the device (checked every 20 ms):
  class/infiniband/DEV/ports/N/fake_rdma_link   down | up: IBV_EVENT_PORT_ERR / PORT_ACTIVE
                                                (ibv_query_port then says DOWN / ACTIVE)
  class/infiniband/DEV/fake_rdma_fatal          1: IBV_EVENT_DEVICE_FATAL; removed: a hot
                                                removal, a servicing that never ends;
                                                service SECONDS (e.g. service 2, service
                                                0.5): a host servicing, see below
  A servicing (`echo service 2 > .../fake_rdma_fatal`): every context of DEV open then
  is disassociated: its queues stop at once (the port's wire stays up), every command
  on it fails with EIO, destroys succeed and give the buffers back; it gets
  IBV_EVENT_DEVICE_FATAL and its event channel closes. DEV leaves the device list and
  the tree (libibverbs' and pmd's discovery) for SECONDS (ibv_open_device on its old
  ibv_device: ENOENT), then comes back healthy as a new ibv_device. A process on the
  fake must have listed the devices (its watcher does the work); if it exits first, the
  device comes back then.
  e.g. scripts/fake-rdma.sh sh -c 'l2fwd --port mana:dev=mana_0,port=1 \
         --port mana:dev=mana_0,port=2 --duration 3 & sleep 1;
         echo down > "$SYSFS_PATH/class/infiniband/mana_0/ports/1/fake_rdma_link"; wait'

The device model behind the queues runs on a thread per engine (fakenic-D-P: one per MANA
vPort, one per mlx5 device) until the program asks for kick handles through the fake's own
unversioned symbols (real rdma-core has none; a program finds them with dlsym and uses
them only if present): fake_rdma_kick_open(ctx, is_rx, queue_id) -> handle or NULL,
fake_rdma_kick(handle), fake_rdma_kick_close(handle). From the first handle on an engine
runs inline: its thread stops, and the program's kicks (every burst) do the device's work
on its polling threads, as emu-mana:/emu-mlx5: ports with engine=inline. Queue ids: MANA
sq_id / wq_id (manadv_init_obj); mlx5 qp_num of the send QP / wq_num. See RULES.md.

Example:
  scripts/fake-rdma.sh target/release/pmd-devices
HELP
}

case "${1:-}" in
-h | --help) usage; exit 0 ;;
"") usage >&2; exit 2 ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
lib=${FAKE_RDMA_LIB:-}
if [ -z "$lib" ]; then
    (cd "$root" && cargo build --quiet --release -p fake-rdma)
    lib=$target/release/libfake_rdma.so
    world=$target/release/fake-rdma-world
else
    world=$(dirname "$lib")/fake-rdma-world
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/fake-rdma.XXXXXX")
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/lib"
cp "$lib" "$dir/lib/libibverbs.so.1"
ln -s libibverbs.so.1 "$dir/lib/libmana.so.1"
ln -s libibverbs.so.1 "$dir/lib/libmlx5.so.1"
"$world" --sysfs "$dir/sys"
# What `pmd-devices --check` asks of a machine beyond the tree: the kernel modules (as
# sysfs shows loaded ones) and a uverbs node per device (PMD_DEV_ROOT; the fake opens none).
mkdir -p "$dir/sys/module/ib_uverbs" "$dir/sys/module/mana_ib" "$dir/sys/module/mlx5_ib" \
    "$dir/dev/infiniband"
for u in "$dir"/sys/class/infiniband_verbs/uverbs*; do
    if [ -d "$u" ]; then : >"$dir/dev/infiniband/${u##*/}"; fi
done

status=0
LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    SYSFS_PATH="$dir/sys" PMD_SYSFS_ROOT="$dir/sys" PMD_DEV_ROOT="$dir/dev" "$@" || status=$?
exit "$status"
