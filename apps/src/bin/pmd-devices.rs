//! Lists RDMA devices (MANA, mlx5, others), their ports, netdevs and MACs, and the device
//! model that is always available; `--check SPEC` is the preflight of one port
//! (`apps::preflight`).

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;

/// List the NIC ports this framework can drive: real MANA / mlx5 RDMA devices (with each
/// port's kernel netdev and MAC) and the software device model that is always there.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Read devices from this sysfs root instead of /sys (for tests and offline inspection).
    /// Without it, libibverbs' own SYSFS_PATH is used when set, so both see the same tree.
    #[arg(long, env = "PMD_SYSFS_ROOT")]
    sysfs_root: Option<PathBuf>,
    /// Print one JSON document instead of the human-readable report.
    #[arg(long)]
    json: bool,
    /// Preflight: check every condition for opening the port SPEC (a --port devargs string,
    /// e.g. mana:dev=mana_0,port=1) on this machine and print each with pass, FAIL, warn or
    /// skip, what was found and the exact fix: kernel modules (modules), the uverbs device
    /// node (uverbs_access), rdma-core's libraries (rdma_core), which port SPEC selects
    /// (selection), CAP_NET_RAW (cap_net_raw), the locked-memory limit and the free 2 MiB
    /// hugepages against the pool the tools would make (memlock, hugepages), where a shm:
    /// cable goes (shm_dir), the kernel netdev holding the port and its master (netdev), the
    /// port lock (port_lock) and the MTU (mtu). Device-model specs (emu-mana:, emu-mlx5:)
    /// need no kernel module or rdma-core: only memory, the shm directory and, with netdev=,
    /// the netdev and the lock are checked. Exit status 0 when nothing fails (warnings
    /// allowed), 1 when something does, 2 for a bad SPEC.
    #[arg(long, value_name = "SPEC")]
    check: Option<String>,
    /// With --check: the tools' --ring-size the pool is sized for (default 512, l2fwd's).
    #[arg(long, requires = "check", value_parser = apps::cli::ring_size)]
    ring_size: Option<u16>,
    /// With --check: the tools' --pool-size (default: l2fwd's sizing for the port alone).
    #[arg(long, requires = "check", value_parser = apps::cli::pool_size)]
    pool_size: Option<u32>,
    /// With --check: the tools' --mtu (default 1500).
    #[arg(long, requires = "check", value_parser = apps::cli::mtu)]
    mtu: Option<u16>,
}

/// `pmd-devices --check SPEC`: exit 0 when nothing fails, 1 when something does, 2 for a
/// bad spec or option.
fn check(args: &Args, spec: &str, root: PathBuf) -> ExitCode {
    let spec: pmd::port::PortSpec = match spec.parse() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("pmd-devices: --check {spec}: {e}");
            return ExitCode::from(2);
        }
    };
    let opts = apps::preflight::Options {
        spec,
        host: apps::preflight::Host::new(root),
        ring_size: args.ring_size.unwrap_or(apps::preflight::DEFAULT_RING_SIZE),
        pool_size: args.pool_size,
        mtu: args.mtu.unwrap_or(apps::preflight::DEFAULT_MTU),
    };
    let report = match apps::preflight::run(&opts) {
        Ok(r) => r,
        Err(f) => return f.report("pmd-devices"),
    };
    if args.json {
        println!("{}", report.json());
    } else {
        print!("{}", report.text());
    }
    if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    pmd::log::init("warn");
    let args = Args::parse();
    let given = args.sysfs_root.is_some();
    let root = args
        .sysfs_root
        .clone()
        .or_else(|| std::env::var_os("SYSFS_PATH").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(pmd::devices::DEFAULT_SYSFS_ROOT));
    // A root that was asked for and is not there is a mistake, not "no devices".
    if given && !root.is_dir() {
        eprintln!(
            "pmd-devices: --sysfs-root {}: no such directory",
            root.display()
        );
        return ExitCode::from(2);
    }
    if let Some(spec) = &args.check {
        if given {
            // The port lock and the ports themselves look up devices under PMD_SYSFS_ROOT:
            // make them see the tree that was asked for. Nothing else runs yet.
            std::env::set_var(pmd::devices::SYSFS_ROOT_ENV, &root);
        }
        return check(&args, spec, root);
    }
    let devices = match pmd::devices::list(&root) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("pmd-devices: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.json {
        println!(
            "{}",
            apps::devices_json(&devices, &pmd::sys::verbs_device_names())
        );
    } else {
        print!("{}", pmd::devices::report(&devices));
        println!(
            "rdma-core: bindings built against libibverbs {}; libibverbs sees {} device(s)",
            pmd::sys::RDMA_CORE_VERSION,
            pmd::sys::verbs_device_names().len()
        );
        let mp: Vec<String> = pmd::verbs::multi_process_support()
            .into_iter()
            .map(|(k, v)| format!("{k} {}", if v { "yes" } else { "no" }))
            .collect();
        println!(
            "multi-process (pmd::mp): secondaries poll queue pairs of MANA and mlx5 ports, \
             importing nothing (mana: maps the doorbell page from the primary's command fd, \
             as DPDK net/mana; mlx5: maps each send queue's UAR page from it at \
             uar_mmap_offset, as DPDK net/mlx5; MANA has no import, so ibv_import_* fail \
             there with EOPNOTSUPP; the mlx5 export calls share DEVX objects and VARs, which \
             the datapath has none of). rdma-core here: {}",
            mp.join(", ")
        );
    }
    ExitCode::SUCCESS
}
