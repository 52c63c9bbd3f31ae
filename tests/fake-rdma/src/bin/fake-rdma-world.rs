//! Writes the fake rdma-core's world (devices, ports, MACs, wires, netdevs) as a sysfs tree,
//! and says what it created. `scripts/fake-rdma.sh` runs it; see `--help`.

#[path = "../world.rs"]
#[allow(dead_code)]
mod world;

use std::path::PathBuf;
use std::process::ExitCode;

const HELP: &str = "\
usage: fake-rdma-world --sysfs DIR

Writes the fake rdma-core's devices as a sysfs tree under DIR (which must not exist yet):
the files pmd-devices and the fake libibverbs both read. The world comes from
FAKE_RDMA_PORTS, a ';'-separated list of
    mana_N/PORT:mac=MAC,wire=WIRE[,netdev=IFNAME][,vp_offset=N][,coalesce=1]
                [,netdev_up_after_reset=1]
    mlx5_N/1:mac=MAC,wire=WIRE[,netdev=IFNAME][,part=ID][,netdev_up_after_reset=1]
  mana_N   a MANA device; PORT is its IB port, 1..8, numbered without gaps
  mlx5_N   an mlx5 (ConnectX) device: one port per device, port 1
  WIRE     the device model's wire for the port: none, shm:NAME, loop:NAME, afpacket:IF
  IFNAME   a real Linux interface that plays the port's kernel netdev: on MANA, while it
           is up it holds the port, and raw QPs fail with ENODEV; on mlx5 the netdev and
           the raw queues share the port
  N        (vp_offset, MANA) the TX vPort offset the kernel reports
  coalesce=1  (MANA) a newer kernel: its mana_ib turns RX CQE coalescing on for RSS QPs,
           so the device completes up to four packets per RX_COALESCED_4 CQE
  ID       (part, mlx5) the PCI device id = vendor_part_id: 0x1017 ConnectX-5 (default),
           0x1013 ConnectX-4 (needs an 18-byte inline header in every send WQE), ...
  netdev_up_after_reset=1  (with netdev=IFNAME) when the device comes back from a host
           servicing (`service SECONDS` in its fake_rdma_fatal), IFNAME is brought up, as
           hv_netvsc opens a VF that comes back
Without FAKE_RDMA_PORTS: mana_0 with ports 1 and 2, MACs 02:00:00:00:10:01 and
02:00:00:00:10:02, wires shm:fake-mana_0-1 and shm:fake-mana_0-2.";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = match args.as_slice() {
        [flag, dir] if flag == "--sysfs" => PathBuf::from(dir),
        [h] if h == "--help" || h == "-h" => {
            println!("{HELP}");
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!("{HELP}");
            return ExitCode::from(2);
        }
    };
    let spec = std::env::var("FAKE_RDMA_PORTS")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| world::DEFAULT_WORLD.to_string());
    let ports = match world::parse(&spec) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("fake-rdma: {e}");
            return ExitCode::from(2);
        }
    };
    if root.exists() {
        eprintln!(
            "fake-rdma: {} exists already; give a new directory",
            root.display()
        );
        return ExitCode::from(2);
    }
    if let Err(e) = world::write_sysfs(&root, &ports) {
        eprintln!("fake-rdma: writing {}: {e}", root.display());
        return ExitCode::FAILURE;
    }
    for p in &ports {
        let netdev = match &p.netdev {
            Some(n) if matches!(p.family, world::Family::Mlx5 { .. }) => {
                format!("{n} (a real interface: shares the port)")
            }
            Some(n) => format!("{n} (a real interface: holds the port while up)"),
            None if matches!(p.family, world::Family::Mlx5 { .. }) => {
                format!("{} (made up, up)", p.netdev_name())
            }
            None => format!("{} (made up, down)", p.netdev_name()),
        };
        eprintln!(
            "fake-rdma: {} port {}: mac {}, netdev {}, wire {}{}",
            p.dev,
            p.port,
            p.mac,
            netdev,
            p.wire,
            match p.family {
                world::Family::Mlx5 { part } => format!(", part {part:#06x}"),
                world::Family::Mana => String::new(),
            }
        );
    }
    ExitCode::SUCCESS
}
