//! `pmd-devices --check SPEC`: every condition for opening one port on this machine, each
//! checked, with a status, one line of detail and the exact fix.
//!
//! | id | for | read from |
//! |---|---|---|
//! | `modules` | `mana:` / `mlx5:` | `<sysfs>/module/NAME`, `<proc>/modules` (`mana_ib` or `mlx5_ib`, and `ib_uverbs`) |
//! | `uverbs_access` | `mana:` / `mlx5:` | `<sysfs>/class/infiniband_verbs/uverbsN/ibdev`, then an open of `<dev>/infiniband/uverbsN` for reading and writing |
//! | `rdma_core` | `mana:` / `mlx5:` | `dlopen` of `libibverbs.so.1` and `libmana.so.1` / `libmlx5.so.1`, the versions in their file names, libibverbs' device list |
//! | `selection` | all | the ports the spec's keys match in sysfs (`pmd::devices::resolve_ports`) |
//! | `cap_net_raw` | `mana:` / `mlx5:`, `afpacket:` wires | `CapEff` of `<proc>/self/status` |
//! | `memlock` | all | `Max locked memory` of `<proc>/self/limits` (or `CAP_IPC_LOCK`) against the pool the tools make |
//! | `hugepages` | all | `<sysfs>/kernel/mm/hugepages/hugepages-2048kB`, hugetlbfs in `<proc>/self/mounts` |
//! | `shm_dir` | `shm:` wires | where the cable file goes (`pmd::emu::wire::shm_path`), and whether a file can be made there |
//! | `netdev` | all with a netdev | its `flags` (IFF_UP) and master in sysfs, the spec's `busy=` |
//! | `port_lock` | `mana:`, model ports with `netdev=` | the port's lock file (`pmd::port::lock`), taken and let go at once |
//! | `mtu` | ports with a netdev | its `mtu` in sysfs, its largest over rtnetlink |
//!
//! A `fail` means opening the port fails; a `warn` that it opens but not as well as it could
//! (4 KiB pages, unlocked memory, a `busy=wait`); a `skip` that the item does not apply.
//! `<sysfs>` is `--sysfs-root` / `PMD_SYSFS_ROOT`; `<proc>` and `<dev>` are `/proc` and `/dev`
//! unless the test hooks [`PROC_ROOT_ENV`] and [`DEV_ROOT_ENV`] move them.
#![deny(unsafe_code)]

mod checks;
pub mod host;

pub use host::{Host, DEV_ROOT_ENV, PROC_ROOT_ENV};

use crate::cli::Failure;
use crate::common::{port_config, PoolPlan};
use pmd::devices::{Family, Netdev, PortSelector};
use pmd::emu::wire::WireSpec;
use pmd::port::{PortConfig, PortKind, PortSpec};
use serde_json::{json, Value};
use std::fmt::Write;

/// Every item's id, in the order they are reported.
pub const IDS: [&str; 11] = [
    "modules",
    "uverbs_access",
    "rdma_core",
    "selection",
    "cap_net_raw",
    "memlock",
    "hugepages",
    "shm_dir",
    "netdev",
    "port_lock",
    "mtu",
];

/// The ring size the tools use unless told (`l2fwd --ring-size`).
pub const DEFAULT_RING_SIZE: u16 = 512;
/// The MTU the tools use unless told (`--mtu`).
pub const DEFAULT_MTU: u16 = 1500;

/// What an item found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Holds.
    Pass,
    /// The port opens, but not as well as it could.
    Warn,
    /// Does not apply to this port.
    Skip,
    /// Opening the port fails.
    Fail,
}

impl Status {
    /// `pass`, `warn`, `skip`, `fail`.
    pub fn name(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Warn => "warn",
            Status::Skip => "skip",
            Status::Fail => "fail",
        }
    }

    /// The text report's tag: `[pass]`, `[warn]`, `[skip]`, `[FAIL]`.
    pub fn tag(self) -> &'static str {
        match self {
            Status::Pass => "[pass]",
            Status::Warn => "[warn]",
            Status::Skip => "[skip]",
            Status::Fail => "[FAIL]",
        }
    }
}

/// One item of the preflight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Its stable id (one of [`IDS`]).
    pub id: &'static str,
    /// What it found.
    pub status: Status,
    /// One line: what was found, and where.
    pub detail: String,
    /// What to do about a `fail` or `warn`.
    pub fix: Option<String>,
}

impl Check {
    fn pass(id: &'static str, detail: impl Into<String>) -> Self {
        Self::new(id, Status::Pass, detail, None)
    }
    fn skip(id: &'static str, detail: impl Into<String>) -> Self {
        Self::new(id, Status::Skip, detail, None)
    }
    fn warn(id: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self::new(id, Status::Warn, detail, Some(fix.into()))
    }
    fn fail(id: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Self {
        Self::new(id, Status::Fail, detail, Some(fix.into()))
    }
    fn new(
        id: &'static str,
        status: Status,
        detail: impl Into<String>,
        fix: Option<String>,
    ) -> Self {
        Check {
            id,
            status,
            detail: detail.into(),
            fix,
        }
    }
}

/// What a spec names, as the checks see it.
enum Target {
    /// A `mana:` or `mlx5:` port: the ports its keys match, or why none does.
    Hw {
        family: Family,
        found: Result<Vec<(String, u32, Option<Netdev>)>, String>,
    },
    /// A device-model port.
    Model { kind: &'static str, wire: WireSpec },
    /// A `null` port.
    Null,
}

/// The one port a hardware spec selects.
#[derive(Debug, Clone)]
struct Selected {
    /// Its RDMA device; two when a MANA function is listed as its RDMA and its raw-packet
    /// device (the provider opens the raw-packet one).
    devs: Vec<String>,
    /// IB port.
    port: u32,
    /// Its kernel netdev.
    netdev: Option<Netdev>,
}

/// What to check.
#[derive(Debug, Clone)]
pub struct Options {
    /// The port.
    pub spec: PortSpec,
    /// Where this machine is read.
    pub host: Host,
    /// The tools' `--ring-size` (RX and TX descriptors per queue).
    pub ring_size: u16,
    /// The tools' `--pool-size`, if given.
    pub pool_size: Option<u32>,
    /// The tools' `--mtu`.
    pub mtu: u16,
}

/// The pool a tool would make for the port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolInfo {
    /// The plan: buffers and data room.
    pub plan: PoolPlan,
    /// Bytes it maps, rounded up to whole 2 MiB pages.
    pub bytes: u64,
    /// The ring size it was sized for.
    pub ring_size: u16,
    /// The MTU.
    pub mtu: u16,
}

/// Every item for one port.
#[derive(Debug, Clone)]
pub struct Report {
    /// The spec, in its canonical form.
    pub spec: String,
    /// The port it selects, when one: `mana_0 port 1 (netdev eth1, 00:..)`.
    pub port: Option<String>,
    /// The pool the tools would make for it.
    pub pool: PoolInfo,
    /// The items, in [`IDS`] order.
    pub checks: Vec<Check>,
}

/// Checks everything `opts.spec` needs.
///
/// # Errors
/// A usage error for a `--pool-size` smaller than the rings need (the tools refuse it too).
pub fn run(opts: &Options) -> Result<Report, Failure> {
    let spec = &opts.spec;
    let base = PortConfig::default()
        .with_ring_sizes(opts.ring_size, opts.ring_size)
        .with_mtu(opts.mtu);
    // As l2fwd sizes it with its defaults: one polling core, so one TX queue per port.
    let cfg = port_config(spec, &base);
    let plan = PoolPlan::new(&[cfg], 1, opts.pool_size, opts.mtu)?;
    let bytes = plan
        .memory_bytes()
        .map_or(u64::MAX, |b| b as u64)
        .div_ceil(checks::HUGEPAGE_BYTES)
        .saturating_mul(checks::HUGEPAGE_BYTES);
    let pool = PoolInfo {
        plan,
        bytes,
        ring_size: opts.ring_size,
        mtu: opts.mtu,
    };
    let target = target_of(spec, &opts.host);
    let mut ctx = checks::Ctx {
        spec,
        host: &opts.host,
        target,
        selected: None,
        pool_bytes: bytes,
        pool_what: format!("{} mbufs of {} data bytes", plan.count, plan.data_room),
        mtu: opts.mtu,
    };
    let (selection, selected) = checks::selection(&ctx);
    ctx.selected = selected;
    let port = ctx
        .selected
        .as_ref()
        .map(|s| checks::port_label(&s.devs.join("/"), s.port, s.netdev.as_ref()));
    let checks = vec![
        checks::modules(&ctx),
        checks::uverbs_access(&ctx),
        checks::rdma_core(&ctx),
        selection,
        checks::cap_net_raw(&ctx),
        checks::memlock(&ctx),
        checks::hugepages(&ctx),
        checks::shm_dir(&ctx),
        checks::netdev(&ctx),
        checks::port_lock(&ctx),
        checks::mtu(&ctx),
    ];
    debug_assert!(checks.iter().map(|c| c.id).eq(IDS));
    Ok(Report {
        spec: spec.to_string(),
        port,
        pool,
        checks,
    })
}

fn target_of(spec: &PortSpec, host: &Host) -> Target {
    let hw = |family: Family, mac, dev: &Option<String>, port| {
        let sel = PortSelector {
            dev: dev.clone(),
            port,
            mac,
            netdev: spec.netdev.clone(),
        };
        let found = pmd::devices::resolve_ports(&host.sysfs, family.clone(), &sel);
        Target::Hw { family, found }
    };
    match &spec.kind {
        PortKind::Mana { mac, dev, port } => hw(Family::Mana, *mac, dev, *port),
        PortKind::Mlx5 { mac, dev, port, .. } => hw(Family::Mlx5, *mac, dev, *port),
        PortKind::EmuMana { wire, .. } => Target::Model {
            kind: "emu-mana",
            wire: wire.clone(),
        },
        PortKind::EmuMlx5 { wire, .. } => Target::Model {
            kind: "emu-mlx5",
            wire: wire.clone(),
        },
        PortKind::Null { .. } => Target::Null,
    }
}

impl Report {
    /// Whether nothing failed (warnings and skips allowed): the port should open.
    pub fn ok(&self) -> bool {
        self.checks.iter().all(|c| c.status != Status::Fail)
    }

    /// The item `id`.
    pub fn get(&self, id: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.id == id)
    }

    fn count(&self, s: Status) -> usize {
        self.checks.iter().filter(|c| c.status == s).count()
    }

    /// The human-readable report: a header, one line per item, a verdict.
    pub fn text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "pmd-devices --check {}", self.spec);
        let _ = writeln!(
            s,
            "  port: {}",
            self.port.as_deref().unwrap_or("none selected")
        );
        let p = &self.pool;
        let _ = writeln!(
            s,
            "  pool: {} mbufs of {} data bytes, {} (l2fwd's sizing: --ring-size {}, one core, --mtu {})",
            p.plan.count,
            p.plan.data_room,
            checks::mib(p.bytes),
            p.ring_size,
            p.mtu
        );
        let width = IDS.iter().map(|i| i.len()).max().unwrap_or(0);
        for c in &self.checks {
            let _ = write!(s, "{} {:<width$} {}", c.status.tag(), c.id, c.detail);
            match (&c.fix, c.status) {
                (Some(fix), Status::Fail | Status::Warn) => {
                    let _ = writeln!(s, " — fix: {fix}");
                }
                _ => s.push('\n'),
            }
        }
        let _ = writeln!(
            s,
            "{}: {} pass, {} fail, {} warn, {} skip",
            if self.ok() { "ready" } else { "not ready" },
            self.count(Status::Pass),
            self.count(Status::Fail),
            self.count(Status::Warn),
            self.count(Status::Skip)
        );
        s
    }

    /// The `--json` document.
    pub fn json(&self) -> Value {
        let p = &self.pool;
        json!({
            "spec": self.spec,
            "ok": self.ok(),
            "port": self.port,
            "pool": {
                "mbufs": p.plan.count,
                "data_room": p.plan.data_room,
                "bytes": p.bytes,
                "ring_size": p.ring_size,
                "mtu": p.mtu,
            },
            "checks": self.checks.iter().map(|c| json!({
                "id": c.id,
                "status": c.status.name(),
                "detail": c.detail,
                "fix": c.fix,
            })).collect::<Vec<_>>(),
            "summary": {
                "pass": self.count(Status::Pass),
                "fail": self.count(Status::Fail),
                "warn": self.count(Status::Warn),
                "skip": self.count(Status::Skip),
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::checks::{rdma_core_release, version_of};
    use super::*;
    use std::path::Path;

    #[test]
    fn library_versions_come_from_file_names() {
        let v = version_of(Path::new("/usr/lib/x86_64-linux-gnu/libmana.so.1.0.44.0"));
        assert_eq!(v.as_deref(), Some("1.0.44.0"));
        assert_eq!(rdma_core_release("1.14.44.0"), Some(44));
        assert_eq!(version_of(Path::new("/tmp/x/lib/libibverbs.so.1")), None);
        assert_eq!(version_of(Path::new("/tmp/libfake_rdma.so")), None);
    }

    #[test]
    fn a_null_port_needs_only_memory() {
        let dir = tempfile::tempdir().unwrap();
        let host = Host {
            sysfs: dir.path().join("sys"),
            proc: dir.path().join("proc"),
            dev: dir.path().join("dev"),
        };
        let r = run(&Options {
            spec: "null".parse().unwrap(),
            host,
            ring_size: DEFAULT_RING_SIZE,
            pool_size: None,
            mtu: DEFAULT_MTU,
        })
        .unwrap();
        let ids: Vec<&str> = r.checks.iter().map(|c| c.id).collect();
        assert_eq!(ids, IDS);
        for id in [
            "modules",
            "uverbs_access",
            "rdma_core",
            "cap_net_raw",
            "shm_dir",
            "netdev",
            "port_lock",
            "mtu",
        ] {
            assert_eq!(r.get(id).unwrap().status, Status::Skip, "{id}");
        }
        // Nothing to read in the empty proc tree: memlock cannot be weighed, but nothing fails.
        assert!(r.ok(), "{}", r.text());
        // l2fwd's defaults: 512 + 512 descriptors, one core: 8191 mbufs of 2304 bytes.
        assert_eq!(r.pool.plan.count, 8191);
        assert_eq!(r.pool.bytes, (8191u64 * 2304).div_ceil(2 << 20) * (2 << 20));
        let t = r.text();
        assert!(
            t.contains("[skip] modules       null port: no kernel module needed"),
            "{t}"
        );
        assert!(t.starts_with("pmd-devices --check null"), "{t}");
    }

    #[test]
    fn a_pool_smaller_than_the_rings_is_a_usage_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = run(&Options {
            spec: "null".parse().unwrap(),
            host: Host::new(dir.path().to_path_buf()),
            ring_size: 1024,
            pool_size: Some(256),
            mtu: DEFAULT_MTU,
        })
        .unwrap_err();
        assert!(
            matches!(&e, Failure::Usage(m) if m.contains("--pool-size 256")),
            "{e:?}"
        );
    }
}
