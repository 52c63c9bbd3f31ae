//! Lists RDMA devices (MANA, mlx5, others), their ports, netdevs and MACs, and the device
//! model that is always available.

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
}

fn main() -> ExitCode {
    pmd::log::init("warn");
    let args = Args::parse();
    let given = args.sysfs_root.is_some();
    let root = args
        .sysfs_root
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
            "multi-process groundwork (secondary processes are not supported yet): {}",
            mp.join(", ")
        );
    }
    ExitCode::SUCCESS
}
