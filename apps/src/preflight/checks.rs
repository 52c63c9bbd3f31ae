//! One function per preflight item: what it reads, and what it makes of it.
#![deny(unsafe_code)]

use super::host::{self, Host, Limit, CAP_IPC_LOCK, CAP_NET_ADMIN, CAP_NET_RAW};
use super::{Check, Selected, Target};
use pmd::devices::{Family, Netdev};
use pmd::emu::wire::WireSpec;
use pmd::port::{BusyPolicy, PortSpec};
use pmd::takeover::Holder;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

/// 2 MiB: the hugepage size the pool asks for first.
pub(super) const HUGEPAGE_BYTES: u64 = 2 << 20;

/// The fix for a missing capability, as the README gives it.
const SETCAP: &str =
    "run as root, or setcap cap_net_raw,cap_ipc_lock+ep $(which l2fwd) (and pktgen)";

/// What the checks share: the spec, where the machine is read, what it names, the pool.
pub(super) struct Ctx<'a> {
    pub spec: &'a PortSpec,
    pub host: &'a Host,
    pub target: Target,
    pub selected: Option<Selected>,
    /// The pool's bytes, rounded up to whole 2 MiB pages.
    pub pool_bytes: u64,
    /// What the pool is, for messages: `8191 mbufs of 2048 data bytes`.
    pub pool_what: String,
    /// The tools' `--mtu`.
    pub mtu: u16,
}

/// `18 MiB` (rounded up).
pub(super) fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes.div_ceil(1 << 20))
}

fn skip(id: &'static str, why: impl Into<String>) -> Check {
    Check::skip(id, why)
}

/// The kernel module of a hardware family.
fn ib_module(family: &Family) -> &'static str {
    match family {
        Family::Mlx5 => "mlx5_ib",
        _ => "mana_ib",
    }
}

/// `modprobe NAME` or `modprobe -a A B`.
fn modprobe(names: &[&str]) -> String {
    match names {
        [one] => format!("modprobe {one}"),
        many => format!("modprobe -a {}", many.join(" ")),
    }
}

fn no_port(id: &'static str) -> Check {
    skip(id, "no port selected (see selection)")
}

fn model_note(ctx: &Ctx<'_>) -> &'static str {
    match ctx.target {
        Target::Null => "null port",
        _ => "device model",
    }
}

pub(super) fn modules(ctx: &Ctx<'_>) -> Check {
    let Target::Hw { family, .. } = &ctx.target else {
        return skip(
            "modules",
            format!("{}: no kernel module needed", model_note(ctx)),
        );
    };
    let need = [ib_module(family), "ib_uverbs"];
    let missing: Vec<&str> = need
        .iter()
        .copied()
        .filter(|m| !ctx.host.module_loaded(m))
        .collect();
    if missing.is_empty() {
        Check::pass("modules", format!("{} loaded", need.join(", ")))
    } else {
        Check::fail(
            "modules",
            format!(
                "not loaded: {} (looked in {} and {})",
                missing.join(", "),
                ctx.host.sysfs.join("module").display(),
                ctx.host.proc.join("modules").display()
            ),
            modprobe(&missing),
        )
    }
}

pub(super) fn uverbs_access(ctx: &Ctx<'_>) -> Check {
    const ID: &str = "uverbs_access";
    if !matches!(ctx.target, Target::Hw { .. }) {
        return skip(ID, format!("{}: no uverbs device", model_note(ctx)));
    }
    let Some(sel) = &ctx.selected else {
        return no_port(ID);
    };
    let mut ok = Vec::new();
    for dev in &sel.devs {
        let Some(uverbs) = ctx.host.uverbs_of(dev) else {
            return Check::fail(
                ID,
                format!(
                    "{dev} has no uverbs device under {} (is ib_uverbs loaded?)",
                    ctx.host.sysfs.join("class/infiniband_verbs").display()
                ),
                "modprobe ib_uverbs",
            );
        };
        let node = ctx.host.uverbs_node(&uverbs);
        match host::open_read_write(&node) {
            Ok(()) => ok.push(format!("{} ({dev})", node.display())),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Check::fail(
                    ID,
                    format!("{} ({dev}) does not exist", node.display()),
                    "modprobe ib_uverbs (udev then creates /dev/infiniband/uverbsN); check `ls -l /dev/infiniband`",
                )
            }
            Err(e) => {
                return Check::fail(
                    ID,
                    format!(
                        "{} ({dev}) cannot be opened for reading and writing by uid {}: {e}",
                        node.display(),
                        uid()
                    ),
                    format!(
                        "run as root, or let this user open it: chmod 666 {}, kept across \
                         reboots by a udev rule, e.g. KERNEL==\"uverbs*\", MODE=\"0666\" in \
                         /etc/udev/rules.d/90-pmd.rules",
                        node.display()
                    ),
                )
            }
        }
    }
    Check::pass(ID, format!("{} readable and writable", ok.join(", ")))
}

/// This process's effective uid (the owner of `/proc/self`).
fn uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map_or(u32::MAX, |m| m.uid())
}

/// The version in a library's file name: `1.0.44.0` of `libmana.so.1.0.44.0`.
pub(super) fn version_of(file: &Path) -> Option<String> {
    let name = file.file_name()?.to_str()?;
    let (_, v) = name.split_once(".so.")?;
    (v.split('.').count() >= 3 && v.split('.').all(|p| p.parse::<u32>().is_ok()))
        .then(|| v.to_string())
}

/// rdma-core's release in a libibverbs or provider library version (`1.14.44.0`: 44).
pub(super) fn rdma_core_release(version: &str) -> Option<u32> {
    version.split('.').nth(2)?.parse().ok()
}

/// The oldest rdma-core the drivers are written against.
const MIN_RDMA_CORE: u32 = 44;

pub(super) fn rdma_core(ctx: &Ctx<'_>) -> Check {
    const ID: &str = "rdma_core";
    let Target::Hw { family, .. } = &ctx.target else {
        return skip(ID, format!("{}: rdma-core not needed", model_note(ctx)));
    };
    let install = "apt-get install ibverbs-providers libibverbs1 (rdma-core v44 or newer)";
    if pmd::sys::RDMA_CORE_VERSION.starts_with("none") {
        return Check::fail(
            ID,
            format!(
                "this build has no rdma-core: {}",
                pmd::sys::RDMA_CORE_VERSION
            ),
            "rebuild pmd with its default features (feature `verbs`)",
        );
    }
    let (dv, symbol) = match family {
        Family::Mlx5 => ("libmlx5.so.1", "mlx5dv_init_obj"),
        _ => ("libmana.so.1", "manadv_init_obj"),
    };
    let mut parts = Vec::new();
    let mut releases = Vec::new();
    for (lib, sym) in [("libibverbs.so.1", "ibv_get_device_list"), (dv, symbol)] {
        match pmd::sys::dl::library_file(lib, sym) {
            Ok(file) => {
                let v = version_of(&file);
                releases.extend(v.as_deref().and_then(rdma_core_release));
                parts.push(match v {
                    Some(v) => format!("{lib} {v} ({})", file.display()),
                    None => format!("{lib} ({}, no version in the name)", file.display()),
                });
            }
            Err(e) => {
                return Check::fail(ID, format!("{lib} cannot be loaded: {e}"), install);
            }
        }
    }
    let release = releases
        .iter()
        .min()
        .map_or_else(|| "rdma-core".to_string(), |r| format!("rdma-core v{r}"));
    let mut detail = format!(
        "{release}: {} load (dlopen; versions from the file names); the bindings were built \
         against libibverbs {}",
        parts.join(", "),
        pmd::sys::RDMA_CORE_VERSION
    );
    let old: Vec<String> = releases
        .iter()
        .filter(|&&r| r < MIN_RDMA_CORE)
        .map(|r| format!("v{r}, older than v{MIN_RDMA_CORE}"))
        .collect();
    if !old.is_empty() {
        return Check::fail(
            ID,
            format!("{detail}; too old: {}", old.join(", ")),
            install,
        );
    }
    // libibverbs reads the tree in SYSFS_PATH, else this machine's: compare its device list
    // with ours only when both read the same.
    let verbs_tree = std::env::var_os("SYSFS_PATH")
        .filter(|v| !v.is_empty())
        .map_or_else(
            || PathBuf::from(pmd::devices::DEFAULT_SYSFS_ROOT),
            PathBuf::from,
        );
    if let Some(sel) = &ctx.selected {
        if verbs_tree == ctx.host.sysfs {
            let seen = pmd::sys::verbs_device_names();
            let missing: Vec<&String> = sel.devs.iter().filter(|d| !seen.contains(d)).collect();
            if !missing.is_empty() {
                let names: Vec<&str> = missing.iter().map(|s| s.as_str()).collect();
                return Check::fail(
                    ID,
                    format!(
                        "{detail}; but libibverbs does not list {} (it lists: {}): its provider \
                         is missing or does not match the device",
                        names.join(", "),
                        if seen.is_empty() {
                            "nothing".to_string()
                        } else {
                            seen.join(", ")
                        }
                    ),
                    install,
                );
            }
            detail.push_str(&format!("; libibverbs lists {}", sel.devs.join(", ")));
        } else {
            detail.push_str(&format!(
                "; libibverbs reads {}, not {}: its device list not compared",
                verbs_tree.display(),
                ctx.host.sysfs.display()
            ));
        }
    }
    Check::pass(ID, detail)
}

/// `mana_0 port 1 (netdev eth1, 00:15:5d:..)`.
pub(super) fn port_label(dev: &str, port: u32, netdev: Option<&Netdev>) -> String {
    match netdev {
        Some(n) => format!(
            "{dev} port {port} (netdev {}{})",
            n.name,
            n.mac.map(|m| format!(", {m}")).unwrap_or_default()
        ),
        None => format!("{dev} port {port} (no netdev)"),
    }
}

/// The selection, and the port it names when it names exactly one.
pub(super) fn selection(ctx: &Ctx<'_>) -> (Check, Option<Selected>) {
    const ID: &str = "selection";
    let spec = ctx.spec.to_string();
    let (family, found) = match &ctx.target {
        Target::Hw { family, found, .. } => (family, found),
        Target::Model { kind, wire } => {
            return (
                Check::pass(
                    ID,
                    format!("{spec}: {kind} device model on wire {wire} (no hardware)"),
                ),
                None,
            )
        }
        Target::Null => return (Check::pass(ID, format!("{spec}: no device")), None),
    };
    let name = if *family == Family::Mlx5 {
        "mlx5"
    } else {
        "mana"
    };
    let found = match found {
        Ok(f) => f,
        Err(why) => {
            let none_of_family = pmd::devices::list(&ctx.host.sysfs)
                .is_ok_and(|l| !l.iter().any(|d| d.family == *family));
            let fix = if none_of_family {
                format!(
                    "on a machine with the NIC, load its modules ({}); without one, use the \
                     device model (--port emu-{name}:wire=shm:demo0)",
                    modprobe(&[ib_module(family), "ib_uverbs"])
                )
            } else {
                "name a port that exists: pmd-devices lists each with its --port line".into()
            };
            return (Check::fail(ID, why.clone(), fix), None);
        }
    };
    let labels: Vec<String> = found
        .iter()
        .map(|(d, p, n)| port_label(d, *p, n.as_ref()))
        .collect();
    let (_, port, netdev) = &found[0];
    // Newer kernels list a MANA function twice (its RDMA device and its raw-packet device),
    // with one netdev and so one MAC: one port, told apart when it opens.
    let same = |n: &Option<Netdev>| {
        let (a, b) = (n.as_ref(), netdev.as_ref());
        a.and_then(|n| n.mac).is_some() && a.and_then(|n| n.mac) == b.and_then(|n| n.mac)
            || a.is_some() && a.map(|n| &n.name) == b.map(|n| &n.name)
    };
    let one_function =
        found.len() > 1 && *family == Family::Mana && found.iter().all(|(_, _, n)| same(n));
    if found.len() == 1 || one_function {
        let mut detail = format!("{spec} selects {}", labels[0]);
        if one_function {
            detail = format!(
                "{spec} selects one MANA function listed {} times: {} (newer kernels list its \
                 RDMA device beside its raw-packet device, with one netdev); the port opens \
                 the raw-packet one",
                found.len(),
                labels.join(" and ")
            );
        }
        let sel = Selected {
            devs: found.iter().map(|(d, ..)| d.clone()).collect(),
            port: *port,
            netdev: netdev.clone(),
        };
        return (Check::pass(ID, detail), Some(sel));
    }
    let lines: Vec<String> = found
        .iter()
        .map(|(d, p, _)| format!("{name}:dev={d},port={p}"))
        .collect();
    (
        Check::fail(
            ID,
            format!(
                "{spec} matches {} ports: {} (the tools would take the first)",
                found.len(),
                labels.join("; ")
            ),
            format!("name one: {}", lines.join(" or ")),
        ),
        None,
    )
}

pub(super) fn cap_net_raw(ctx: &Ctx<'_>) -> Check {
    const ID: &str = "cap_net_raw";
    let why = match &ctx.target {
        Target::Hw { .. } => "raw packet queues need it",
        Target::Model {
            wire: WireSpec::AfPacket(_),
            ..
        } => "the afpacket: wire's AF_PACKET socket needs it",
        _ => {
            return skip(
                ID,
                format!("{}: no raw packet queues or sockets", model_note(ctx)),
            )
        }
    };
    match ctx.host.has_cap(CAP_NET_RAW) {
        Some(true) => Check::pass(ID, format!("CAP_NET_RAW in the effective set ({why})")),
        Some(false) => Check::fail(ID, format!("no CAP_NET_RAW: {why}"), SETCAP),
        None => Check::warn(
            ID,
            format!(
                "cannot read CapEff from {}: {why}",
                ctx.host.proc.join("self/status").display()
            ),
            SETCAP,
        ),
    }
}

pub(super) fn memlock(ctx: &Ctx<'_>) -> Check {
    const ID: &str = "memlock";
    let need = ctx.pool_bytes;
    let pool = format!("the pool's {} ({})", mib(need), ctx.pool_what);
    if ctx.host.has_cap(CAP_IPC_LOCK) == Some(true) {
        return Check::pass(ID, format!("CAP_IPC_LOCK: no limit applies to {pool}"));
    }
    let fix = "ulimit -l unlimited in the shell that starts the tool (or `* - memlock \
               unlimited` in /etc/security/limits.conf, LimitMEMLOCK=infinity for a systemd \
               service), or give the binary CAP_IPC_LOCK: setcap cap_net_raw,cap_ipc_lock+ep \
               $(which l2fwd)";
    let limit = match ctx.host.memlock_limit() {
        Some(Limit::Unlimited) => {
            return Check::pass(ID, format!("RLIMIT_MEMLOCK unlimited, for {pool}"))
        }
        Some(Limit::Bytes(b)) => b,
        None => {
            return Check::warn(
                ID,
                format!(
                    "cannot read RLIMIT_MEMLOCK from {}, for {pool}",
                    ctx.host.proc.join("self/limits").display()
                ),
                fix,
            )
        }
    };
    if limit >= need {
        return Check::pass(
            ID,
            format!("RLIMIT_MEMLOCK {} holds {pool}", mib_or_bytes(limit)),
        );
    }
    let short = format!("RLIMIT_MEMLOCK {} is less than {pool}", mib_or_bytes(limit));
    if matches!(ctx.target, Target::Hw { .. }) {
        Check::fail(
            ID,
            format!("{short}: registering it (ibv_reg_mr) fails with ENOMEM"),
            fix,
        )
    } else {
        Check::warn(
            ID,
            format!("{short}: the tools run with it unlocked (one warning)"),
            fix,
        )
    }
}

fn mib_or_bytes(b: u64) -> String {
    if b.is_multiple_of(1 << 20) {
        mib(b)
    } else {
        format!("{b} bytes")
    }
}

pub(super) fn hugepages(ctx: &Ctx<'_>) -> Check {
    const ID: &str = "hugepages";
    let pages = ctx.pool_bytes / HUGEPAGE_BYTES;
    let mounts = ctx.host.hugetlbfs_mounts();
    let mount = if mounts.is_empty() {
        "no hugetlbfs mounted (only shm: cables on hugepages need one)".to_string()
    } else {
        let m: Vec<String> = mounts.iter().map(|m| m.display().to_string()).collect();
        format!("hugetlbfs at {}", m.join(", "))
    };
    let dir = ctx.host.hugepages_dir();
    let setup = |total: u64, free: u64| {
        format!(
            "scripts/setup.sh (PMD_HUGEPAGES={want}), or sysctl vm.nr_hugepages={want}",
            want = total + pages.saturating_sub(free)
        )
    };
    if mempool::region::hugepages_disabled_by_env() {
        return Check::warn(
            ID,
            format!(
                "{} is set: the pool ({}) uses 4 KiB pages; {mount}",
                mempool::NO_HUGEPAGES_ENV,
                mib(ctx.pool_bytes)
            ),
            format!("unset {}", mempool::NO_HUGEPAGES_ENV),
        );
    }
    match ctx.host.hugepages() {
        None => Check::warn(
            ID,
            format!(
                "no 2 MiB hugepages ({} cannot be read): the tools fall back to 4 KiB pages, \
                 with one warning",
                dir.display()
            ),
            setup(0, 0),
        ),
        Some(h) if h.free >= pages => Check::pass(
            ID,
            format!(
                "the pool ({2}) needs {0} of the {1} free 2 MiB hugepages; {mount}",
                pages,
                h.free,
                mib(ctx.pool_bytes)
            ),
        ),
        Some(h) => Check::warn(
            ID,
            format!(
                "{} free 2 MiB hugepages ({} reserved), the pool needs {pages} ({}): the tools \
                 fall back to 4 KiB pages, with one warning; {mount}",
                h.free,
                h.total,
                mib(ctx.pool_bytes)
            ),
            setup(h.total, h.free),
        ),
    }
}

pub(super) fn shm_dir(ctx: &Ctx<'_>) -> Check {
    const ID: &str = "shm_dir";
    let Target::Model {
        wire: WireSpec::Shm(name),
        ..
    } = &ctx.target
    else {
        return skip(ID, "no shm: wire");
    };
    let path = pmd::emu::wire::shm_path(name);
    let dir = path
        .parent()
        .map_or_else(|| PathBuf::from("/dev/shm"), Path::to_path_buf);
    let on_huge = ctx
        .host
        .hugetlbfs_mounts()
        .iter()
        .any(|m| dir.starts_with(m));
    let pages = if on_huge { "hugetlbfs" } else { "normal pages" };
    let existing = if path.exists() {
        " (exists: the other end's, or one left by a dead process, which is taken over)"
    } else {
        ""
    };
    let chosen = std::env::var_os("PMD_SHM_DIR").is_some();
    match host::can_create_in(&dir) {
        Ok(()) => Check::pass(
            ID,
            format!("cable file {}{existing} ({pages})", path.display()),
        ),
        Err(e) if !chosen && host::can_create_in(Path::new("/dev/shm")).is_ok() => Check::warn(
            ID,
            format!(
                "cannot create files in {} ({e}): the cable goes to /dev/shm on normal pages \
                 (one warning)",
                dir.display()
            ),
            "run as root, or set PMD_SHM_DIR to a directory both ends can write (the same for both)",
        ),
        Err(e) => Check::fail(
            ID,
            format!("cannot create files in {}: {e}", dir.display()),
            "set PMD_SHM_DIR to a directory both ends can write (the same for both)",
        ),
    }
}

/// What holds the port while `holder` is up, by busy policy.
fn held(ctx: &Ctx<'_>, holder: &Holder) -> Check {
    const ID: &str = "netdev";
    let who = holder.describe();
    let cmd = holder.command();
    match ctx.spec.busy {
        BusyPolicy::Fail => Check::fail(
            ID,
            format!(
                "{who} is up and holds the port: raw-packet queue creation would fail \
                 (ENODEV, or EBUSY on newer kernels)"
            ),
            format!(
                "{cmd}; or add busy=takeover to the spec (brings {} down at open, up again at \
                 close) or busy=wait (waits for it to go down)",
                if holder.master.is_some() {
                    "both"
                } else {
                    "it"
                }
            ),
        ),
        BusyPolicy::Wait { timeout } => Check::warn(
            ID,
            format!(
                "{who} is up and holds the port; busy=wait waits up to {} s for it to go down",
                pmd::takeover::Seconds(timeout)
            ),
            cmd,
        ),
        BusyPolicy::Takeover => match ctx.host.has_cap(CAP_NET_ADMIN) {
            Some(false) => Check::fail(
                ID,
                format!("{who} is up; busy=takeover needs CAP_NET_ADMIN to bring it down"),
                format!("run as root, or free the port first: {cmd}"),
            ),
            _ => Check::pass(
                ID,
                format!(
                    "{who} is up; busy=takeover brings it down at open and up again at close \
                     ({})",
                    holder.restore_command()
                ),
            ),
        },
    }
}

pub(super) fn netdev(ctx: &Ctx<'_>) -> Check {
    const ID: &str = "netdev";
    match &ctx.target {
        Target::Hw { family, .. } => {
            let Some(sel) = &ctx.selected else {
                return no_port(ID);
            };
            let Some(nd) = &sel.netdev else {
                return if *family == Family::Mana {
                    Check::fail(
                        ID,
                        format!(
                            "{} port {} has no netdev in sysfs: a MANA port's MAC is its \
                             netdev's",
                            sel.devs[0], sel.port
                        ),
                        "check that the mana driver bound the interface (ip link, dmesg | grep -i mana)",
                    )
                } else {
                    Check::pass(ID, "no netdev in sysfs (informational on mlx5)")
                };
            };
            let holder = Holder::find_in(&ctx.host.sysfs, &nd.name);
            match (family, nd.up) {
                (Family::Mana, true) => held(ctx, &holder),
                (Family::Mana, false) => Check::pass(
                    ID,
                    format!("{} is down: the port is free", holder.describe()),
                ),
                (_, up) => Check::pass(
                    ID,
                    format!(
                        "{} is {}: on mlx5 it shares the port with our queues (informational)",
                        holder.describe(),
                        if up { "up" } else { "down" }
                    ),
                ),
            }
        }
        Target::Model { .. } => {
            let Some(name) = &ctx.spec.netdev else {
                return skip(ID, "device model without netdev=: no kernel netdev");
            };
            match pmd::sys::net::if_flags(name) {
                Ok(f) if f & pmd::sys::net::IFF_UP != 0 => {
                    held(ctx, &Holder::find_in(&ctx.host.sysfs, name))
                }
                Ok(_) => Check::pass(
                    ID,
                    format!("netdev={name} is down: the modelled port is free"),
                ),
                Err(e) => Check::fail(
                    ID,
                    format!("netdev={name}: {e}"),
                    format!("create the interface {name} in this network namespace, or drop netdev= from the spec"),
                ),
            }
        }
        Target::Null => skip(ID, "null port: no kernel netdev"),
    }
}

pub(super) fn port_lock(ctx: &Ctx<'_>) -> Check {
    const ID: &str = "port_lock";
    if matches!(ctx.target, Target::Hw { .. }) && ctx.selected.is_none() {
        return no_port(ID);
    }
    let Some(key) = pmd::port::lock::key_for(ctx.spec) else {
        return skip(
            ID,
            match &ctx.target {
                Target::Hw { .. } => {
                    "mlx5 ports take no lock: the netdev and the raw queues share the port"
                }
                _ => "no port lock: this port models nothing exclusive (no netdev=)",
            },
        );
    };
    let dirs = pmd::port::lock::lock_dirs();
    // What the lock files said before we look: a file we can lock was left by a process
    // that is gone.
    let before: Vec<(PathBuf, String)> = dirs
        .iter()
        .filter_map(|d| std::fs::read_dir(d).ok())
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "lock"))
        .map(|p| {
            let s = std::fs::read_to_string(&p).unwrap_or_default();
            (p, s.trim().to_string())
        })
        .collect();
    match pmd::port::PortLock::acquire_in(&dirs, &key, &ctx.spec.to_string()) {
        Ok(lock) => {
            let path = lock.path().to_path_buf();
            drop(lock);
            let stale = before
                .iter()
                .find(|(p, _)| *p == path)
                .map(|(_, pid)| pid.clone());
            match stale {
                Some(pid) => Check::pass(
                    ID,
                    format!(
                        "free; {} was left by pid {} (no longer running): the next open \
                         reuses it",
                        path.display(),
                        if pid.is_empty() { "?" } else { pid.as_str() }
                    ),
                ),
                None => Check::pass(ID, format!("free ({})", path.display())),
            }
        }
        Err(pmd::port::PortError::InUse { pid, lock, .. }) => {
            let who = pid.map_or_else(
                || "a process that has not written its pid yet".to_string(),
                |p| format!("process pid {p}"),
            );
            Check::fail(
                ID,
                format!("held by {who} ({})", lock.display()),
                match pid {
                    Some(p) => format!("stop pid {p} (kill {p}), or use another port"),
                    None => "wait for the other process, or use another port".into(),
                },
            )
        }
        Err(e) => Check::fail(
            ID,
            e.to_string(),
            format!(
                "set {} to a writable directory (every process on the port must use the same)",
                pmd::port::lock::LOCK_DIR_ENV
            ),
        ),
    }
}

pub(super) fn mtu(ctx: &Ctx<'_>) -> Check {
    const ID: &str = "mtu";
    let tools = format!(
        "the tools' --mtu {} (frames up to {} bytes)",
        ctx.mtu,
        pmd::port::max_frame_bytes(ctx.mtu)
    );
    let (netdev_mtu, max, what) = match (&ctx.target, &ctx.selected) {
        (Target::Hw { .. }, Some(sel)) => {
            let Some(nd) = &sel.netdev else {
                return skip(ID, format!("no netdev to compare with; {tools}"));
            };
            let m = ctx.host.netdev_mtu(&sel.devs[0], &nd.name);
            // The largest MTU comes over rtnetlink, so only for this machine's own netdevs.
            let max = if ctx.host.real_sysfs() {
                pmd::sys::net::if_max_mtu(&nd.name).ok().flatten()
            } else {
                None
            };
            (m, max, format!("netdev {}", nd.name))
        }
        (Target::Hw { .. }, None) => return no_port(ID),
        (
            Target::Model {
                wire: WireSpec::AfPacket(ifname),
                ..
            },
            _,
        ) => (
            pmd::sys::net::if_mtu(ifname).ok(),
            pmd::sys::net::if_max_mtu(ifname).ok().flatten(),
            format!("afpacket interface {ifname}"),
        ),
        _ => {
            return skip(
                ID,
                format!(
                    "{}: no netdev MTU to compare with; {tools}",
                    model_note(ctx)
                ),
            )
        }
    };
    let mut detail = format!(
        "{what} mtu {}, device max {}; {tools}",
        netdev_mtu.map_or_else(|| "not in sysfs".into(), |m| m.to_string()),
        max.map_or_else(|| "not known".into(), |m| m.to_string())
    );
    if let Some(max) = max {
        if u32::from(ctx.mtu) > max {
            return Check::warn(
                ID,
                format!("{detail}: above the device's largest"),
                format!("use --mtu {max} or less"),
            );
        }
    }
    if netdev_mtu.is_some_and(|m| u32::from(ctx.mtu) > m) {
        detail.push_str(" (larger than the netdev's)");
    }
    Check::pass(ID, detail)
}
