//! The `pmd-devices` binary end to end, against an empty fake sysfs tree.

use std::process::Command;

#[test]
fn no_devices_message_and_json() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pmd-devices"))
        .arg("--sysfs-root")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let s = String::from_utf8(out.stdout).unwrap();
    assert!(s.starts_with("No RDMA devices found"), "{s}");
    assert!(s.contains("emu-mana"), "{s}");

    let out = Command::new(env!("CARGO_BIN_EXE_pmd-devices"))
        .args(["--json", "--sysfs-root"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["devices"].as_array().unwrap().len(), 0);
    assert!(v["device_model"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["kind"] == "emu-mana"));
}

#[test]
fn unreadable_root_is_an_error_not_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    // A file where the class directory should be: listing it fails with a clear message.
    std::fs::create_dir_all(dir.path().join("class")).unwrap();
    std::fs::write(dir.path().join("class/infiniband"), "not a directory").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_pmd-devices"))
        .arg("--sysfs-root")
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8(out.stderr).unwrap();
    assert!(
        e.contains("cannot read") && e.contains("class/infiniband"),
        "{e}"
    );
}

#[test]
fn a_sysfs_root_that_does_not_exist_is_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_pmd-devices"))
        .args(["--sysfs-root", "/nonexistent/sysfs"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let e = String::from_utf8(out.stderr).unwrap();
    assert!(
        e.contains("--sysfs-root /nonexistent/sysfs: no such directory"),
        "{e}"
    );
}

// ---- pmd-devices --check: the preflight of one port ----

use std::path::PathBuf;
use std::process::Output;

/// A machine made of files: a sysfs tree with one MANA device (`mana_0`, ports 1 and 2,
/// netdevs `eth1` and `eth2`, both down), its modules and hugepages; a `/proc` with every
/// capability the ports need, a locked-memory limit of 8 MiB and hugetlbfs mounted; a `/dev`
/// with the device's uverbs node; a lock directory. Each test breaks one thing.
struct Machine {
    dir: tempfile::TempDir,
}

/// CAP_NET_ADMIN, CAP_NET_RAW and CAP_IPC_LOCK (bits 12, 13, 14).
const ALL_CAPS: &str = "0000000000007000";

impl Machine {
    fn new() -> Self {
        let m = Machine {
            dir: tempfile::tempdir().unwrap(),
        };
        m.mana(
            "mana_0",
            &[
                (1, "eth1", "02:00:00:00:10:01"),
                (2, "eth2", "02:00:00:00:10:02"),
            ],
            0,
        );
        m.write("sys/module/mana_ib/initstate", "live");
        m.write("sys/module/ib_uverbs/initstate", "live");
        m.write(
            "sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages",
            "64",
        );
        m.write(
            "sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages",
            "64",
        );
        m.caps(ALL_CAPS);
        m.memlock("8388608");
        m.write("proc/modules", "");
        m.write(
            "proc/self/mounts",
            "sysfs /sys sysfs rw 0 0\nnodev /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0",
        );
        std::fs::create_dir_all(m.path("locks")).unwrap();
        m
    }

    /// A MANA device `name` with `ports` (number, netdev, MAC), uverbs device `uverbs`.
    fn mana(&self, name: &str, ports: &[(u32, &str, &str)], uverbs: u32) {
        let d = format!("sys/class/infiniband/{name}");
        self.write(&format!("{d}/device/vendor"), "0x1414");
        // A device id no rdma-core provider claims: a real libibverbs never lists it.
        self.write(&format!("{d}/device/device"), "0x0000");
        for (p, ifname, mac) in ports {
            self.write(&format!("{d}/ports/{p}/state"), "4: ACTIVE");
            self.write(&format!("{d}/ports/{p}/link_layer"), "Ethernet");
            let n = format!("{d}/device/net/{ifname}");
            self.write(&format!("{n}/dev_port"), &(p - 1).to_string());
            self.write(&format!("{n}/address"), mac);
            self.write(&format!("{n}/flags"), "0x1002");
            self.write(&format!("{n}/mtu"), "1500");
        }
        self.write(
            &format!("sys/class/infiniband_verbs/uverbs{uverbs}/ibdev"),
            name,
        );
        self.write(&format!("dev/infiniband/uverbs{uverbs}"), "");
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn write(&self, rel: &str, text: &str) {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, format!("{text}\n")).unwrap();
    }

    fn caps(&self, eff: &str) {
        self.write(
            "proc/self/status",
            &format!("Name:\tpmd-devices\nCapInh:\t0000000000000000\nCapEff:\t{eff}"),
        );
    }

    fn memlock(&self, soft: &str) {
        self.write(
            "proc/self/limits",
            &format!(
                "Limit                     Soft Limit           Hard Limit           Units     \n\
                 Max locked memory         {soft:<20} unlimited            bytes     "
            ),
        );
    }

    /// `pmd-devices --check SPEC ARGS...` on this machine.
    fn command(&self, spec: &str, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_pmd-devices"));
        c.args(["--check", spec])
            .args(args)
            .arg("--sysfs-root")
            .arg(self.path("sys"))
            .env("PMD_PROC_ROOT", self.path("proc"))
            .env("PMD_DEV_ROOT", self.path("dev"))
            .env("PMD_LOCK_DIR", self.path("locks"))
            .env("PMD_SHM_DIR", self.path("shm"));
        for k in [
            "SYSFS_PATH",
            "PMD_SYSFS_ROOT",
            "PMD_NO_HUGEPAGES",
            "PMD_LOG",
        ] {
            c.env_remove(k);
        }
        c
    }

    fn text(&self, spec: &str, args: &[&str]) -> (Option<i32>, String) {
        let o = self.command(spec, args).output().unwrap();
        (o.status.code(), String::from_utf8(o.stdout).unwrap())
    }

    fn json(&self, spec: &str, args: &[&str]) -> (Option<i32>, serde_json::Value) {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        let o = self.command(spec, &a).output().unwrap();
        let v = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", shown(&o)));
        (o.status.code(), v)
    }
}

fn shown(o: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}--- stderr\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The item `id` of a JSON report.
fn item<'a>(v: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no item {id} in {v:#}"))
}

/// Asserts item `id` has `status`, its detail contains `detail` and its fix `fix`.
fn expect(v: &serde_json::Value, id: &str, status: &str, detail: &str, fix: &str) {
    let c = item(v, id);
    assert_eq!(c["status"], status, "{id}: {v:#}");
    let d = c["detail"].as_str().unwrap();
    assert!(d.contains(detail), "{id}: detail {d:?} lacks {detail:?}");
    if !fix.is_empty() {
        let f = c["fix"].as_str().unwrap_or("");
        assert!(f.contains(fix), "{id}: fix {f:?} lacks {fix:?}");
    }
}

/// The items that are not `pass`, as `id=status`.
fn not_passing(v: &serde_json::Value) -> Vec<String> {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] != "pass")
        .map(|c| {
            format!(
                "{}={}",
                c["id"].as_str().unwrap(),
                c["status"].as_str().unwrap()
            )
        })
        .collect()
}

const PORT1: &str = "mana:dev=mana_0,port=1";

#[test]
fn check_passes_on_a_machine_where_everything_is_in_order() {
    let m = Machine::new();
    let (code, v) = m.json(PORT1, &[]);
    assert_eq!(code, Some(0), "{v:#}");
    assert_eq!(v["ok"], true);
    let ids: Vec<&str> = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, apps::preflight::IDS);
    assert_eq!(not_passing(&v), ["shm_dir=skip"], "{v:#}");
    expect(&v, "modules", "pass", "mana_ib, ib_uverbs loaded", "");
    expect(
        &v,
        "uverbs_access",
        "pass",
        "infiniband/uverbs0 (mana_0) readable and writable",
        "",
    );
    expect(&v, "rdma_core", "pass", "libmana.so.1", "");
    expect(
        &v,
        "selection",
        "pass",
        "selects mana_0 port 1 (netdev eth1, 02:00:00:00:10:01)",
        "",
    );
    expect(&v, "memlock", "pass", "CAP_IPC_LOCK", "");
    expect(
        &v,
        "hugepages",
        "pass",
        "needs 9 of the 64 free 2 MiB hugepages",
        "",
    );
    expect(
        &v,
        "netdev",
        "pass",
        "kernel netdev eth1 is down: the port is free",
        "",
    );
    expect(&v, "port_lock", "pass", "free (", "");
    expect(&v, "mtu", "pass", "netdev eth1 mtu 1500", "");
    assert_eq!(v["port"], "mana_0 port 1 (netdev eth1, 02:00:00:00:10:01)");
    // l2fwd's defaults for one port: 512 RX + 512 TX descriptors, one core.
    assert_eq!(v["pool"]["mbufs"], 8191);
    assert_eq!(v["summary"]["fail"], 0);

    let (code, t) = m.text(PORT1, &[]);
    assert_eq!(code, Some(0), "{t}");
    assert!(
        t.starts_with("pmd-devices --check mana:dev=mana_0,port=1\n"),
        "{t}"
    );
    assert!(
        t.contains("\n[pass] modules       mana_ib, ib_uverbs loaded\n"),
        "{t}"
    );
    assert!(t.contains("\n[skip] shm_dir       no shm: wire\n"), "{t}");
    assert!(
        t.ends_with("ready: 10 pass, 0 fail, 0 warn, 1 skip\n"),
        "{t}"
    );
    assert!(!t.contains("fix:"), "{t}");
}

#[test]
fn check_fails_without_the_kernel_modules() {
    let m = Machine::new();
    std::fs::remove_dir_all(m.path("sys/module/mana_ib")).unwrap();
    let (code, v) = m.json(PORT1, &[]);
    assert_eq!(code, Some(1));
    assert_eq!(not_passing(&v), ["modules=fail", "shm_dir=skip"]);
    expect(
        &v,
        "modules",
        "fail",
        "not loaded: mana_ib",
        "modprobe mana_ib",
    );
    // /proc/modules counts too.
    m.write("proc/modules", "mana_ib 45056 0 - Live 0x0000000000000000");
    assert_eq!(m.json(PORT1, &[]).0, Some(0));
    std::fs::remove_dir_all(m.path("sys/module")).unwrap();
    m.write("proc/modules", "");
    let (code, t) = m.text(PORT1, &[]);
    assert_eq!(code, Some(1));
    assert!(
        t.contains("[FAIL] modules       not loaded: mana_ib, ib_uverbs")
            && t.contains(" — fix: modprobe -a mana_ib ib_uverbs\n"),
        "{t}"
    );
}

#[test]
fn check_fails_without_the_uverbs_device() {
    let m = Machine::new();
    std::fs::remove_file(m.path("dev/infiniband/uverbs0")).unwrap();
    let (code, v) = m.json(PORT1, &[]);
    assert_eq!(code, Some(1));
    assert_eq!(not_passing(&v), ["uverbs_access=fail", "shm_dir=skip"]);
    expect(
        &v,
        "uverbs_access",
        "fail",
        "infiniband/uverbs0 (mana_0) does not exist",
        "modprobe ib_uverbs",
    );
    std::fs::remove_dir_all(m.path("sys/class/infiniband_verbs")).unwrap();
    let (_, v) = m.json(PORT1, &[]);
    expect(
        &v,
        "uverbs_access",
        "fail",
        "mana_0 has no uverbs device",
        "modprobe ib_uverbs",
    );
}

#[test]
fn check_names_every_port_an_ambiguous_spec_matches_and_none_for_no_match() {
    let m = Machine::new();
    let (code, v) = m.json("mana:dev=mana_0", &[]);
    assert_eq!(code, Some(1));
    expect(
        &v,
        "selection",
        "fail",
        "matches 2 ports: mana_0 port 1 (netdev eth1, 02:00:00:00:10:01); mana_0 port 2",
        "name one: mana:dev=mana_0,port=1 or mana:dev=mana_0,port=2",
    );
    assert_eq!(v["port"], serde_json::Value::Null);
    for id in ["uverbs_access", "netdev", "port_lock", "mtu"] {
        expect(&v, id, "skip", "no port selected", "");
    }
    // By MAC and by netdev: one port.
    let (code, v) = m.json("mana:mac=02:00:00:00:10:02", &[]);
    assert_eq!(code, Some(0), "{v:#}");
    expect(&v, "selection", "pass", "selects mana_0 port 2", "");
    assert_eq!(m.json("mana:netdev=eth2", &[]).0, Some(0));
    let (code, v) = m.json("mana:dev=mana_9", &[]);
    assert_eq!(code, Some(1));
    expect(
        &v,
        "selection",
        "fail",
        "no MANA port matches dev=mana_9; there is mana_0 port 1",
        "pmd-devices lists",
    );
    let (code, v) = m.json("mlx5:", &[]);
    assert_eq!(code, Some(1));
    expect(
        &v,
        "selection",
        "fail",
        "no mlx5 RDMA device",
        "modprobe -a mlx5_ib ib_uverbs",
    );
    expect(&v, "modules", "fail", "mlx5_ib", "modprobe mlx5_ib");
}

#[test]
fn check_takes_a_function_listed_as_two_devices_as_one_port() {
    // Newer kernels: the function's RDMA device beside its raw-packet device, one netdev.
    let m = Machine::new();
    m.mana("mana_1", &[(1, "eth1", "02:00:00:00:10:01")], 1);
    let (code, v) = m.json("mana:mac=02:00:00:00:10:01", &[]);
    assert_eq!(code, Some(0), "{v:#}");
    expect(
        &v,
        "selection",
        "pass",
        "one MANA function listed 2 times",
        "",
    );
    expect(&v, "uverbs_access", "pass", "uverbs0 (mana_0), ", "");
    expect(&v, "uverbs_access", "pass", "uverbs1 (mana_1) readable", "");
}

#[test]
fn check_fails_without_cap_net_raw_and_with_too_little_locked_memory() {
    let m = Machine::new();
    m.caps("0000000000004000"); // CAP_IPC_LOCK only
    let (code, v) = m.json(PORT1, &[]);
    assert_eq!(code, Some(1));
    assert_eq!(not_passing(&v), ["cap_net_raw=fail", "shm_dir=skip"]);
    expect(
        &v,
        "cap_net_raw",
        "fail",
        "no CAP_NET_RAW: raw packet queues need it",
        "setcap cap_net_raw,cap_ipc_lock+ep $(which l2fwd)",
    );
    let (_, t) = m.text(PORT1, &[]);
    assert!(
        t.contains("[FAIL] cap_net_raw   no CAP_NET_RAW: raw packet queues need it — fix: run as root, or setcap cap_net_raw,cap_ipc_lock+ep $(which l2fwd)"),
        "{t}"
    );

    m.caps("0000000000002000"); // CAP_NET_RAW only: the 8 MiB limit counts
    let (code, v) = m.json(PORT1, &[]);
    assert_eq!(code, Some(1));
    assert_eq!(not_passing(&v), ["memlock=fail", "shm_dir=skip"]);
    expect(
        &v,
        "memlock",
        "fail",
        "RLIMIT_MEMLOCK 8 MiB is less than the pool's 18 MiB",
        "ulimit -l unlimited",
    );
    // A smaller pool fits: --ring-size 64 --pool-size 1024 is 2304 KiB, 4 MiB in 2 MiB pages.
    let (code, v) = m.json(PORT1, &["--ring-size", "64", "--pool-size", "1024"]);
    assert_eq!(code, Some(0), "{v:#}");
    expect(
        &v,
        "memlock",
        "pass",
        "RLIMIT_MEMLOCK 8 MiB holds the pool's 4 MiB (1024 mbufs",
        "",
    );
    m.memlock("unlimited");
    expect(
        &m.json(PORT1, &[]).1,
        "memlock",
        "pass",
        "RLIMIT_MEMLOCK unlimited",
        "",
    );
    // Jumbo frames: a larger data room, a larger pool.
    m.memlock("8388608");
    let (_, v) = m.json(PORT1, &["--mtu", "9000"]);
    expect(&v, "memlock", "fail", "(8191 mbufs of 9024 data bytes)", "");
    // A device-model port runs with its pool unlocked: a warning, not a failure.
    let (code, v) = m.json("emu-mana:wire=none", &[]);
    assert_eq!(code, Some(0), "{v:#}");
    expect(
        &v,
        "memlock",
        "warn",
        "the tools run with it unlocked",
        "ulimit -l unlimited",
    );
}

#[test]
fn check_warns_when_the_pool_would_fall_back_to_normal_pages() {
    let m = Machine::new();
    m.write(
        "sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages",
        "4",
    );
    let (code, v) = m.json(PORT1, &[]);
    assert_eq!(code, Some(0), "a warning is no failure: {v:#}");
    assert_eq!(not_passing(&v), ["hugepages=warn", "shm_dir=skip"]);
    expect(
        &v,
        "hugepages",
        "warn",
        "4 free 2 MiB hugepages (64 reserved), the pool needs 9",
        "sysctl vm.nr_hugepages=69",
    );
    expect(
        &v,
        "hugepages",
        "warn",
        "fall back to 4 KiB pages",
        "scripts/setup.sh",
    );
    let (_, t) = m.text(PORT1, &[]);
    assert!(
        t.contains("[warn] hugepages") && t.ends_with("ready: 9 pass, 0 fail, 1 warn, 1 skip\n"),
        "{t}"
    );
    let o = m
        .command(PORT1, &["--json"])
        .env("PMD_NO_HUGEPAGES", "1")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    expect(
        &v,
        "hugepages",
        "warn",
        "PMD_NO_HUGEPAGES is set",
        "unset PMD_NO_HUGEPAGES",
    );
}

#[test]
fn check_fails_while_the_kernel_netdev_holds_a_mana_port() {
    let m = Machine::new();
    m.write(
        "sys/class/infiniband/mana_0/device/net/eth1/flags",
        "0x1003",
    );
    let net = m.path("sys/class/net/eth1");
    std::fs::create_dir_all(&net).unwrap();
    std::os::unix::fs::symlink("../../../devices/virtual/net/eth0", net.join("master")).unwrap();
    let (code, v) = m.json(PORT1, &[]);
    assert_eq!(code, Some(1));
    assert_eq!(not_passing(&v), ["shm_dir=skip", "netdev=fail"]);
    expect(
        &v,
        "netdev",
        "fail",
        "kernel netdev eth1 (master eth0) is up and holds the port",
        "ip link set eth0 down && ip link set eth1 down; or add busy=takeover",
    );
    expect(&v, "netdev", "fail", "", "busy=wait");
    let (code, v) = m.json(&format!("{PORT1},busy=takeover"), &[]);
    assert_eq!(code, Some(0), "{v:#}");
    expect(&v, "netdev", "pass", "busy=takeover brings it down at open and up again at close (ip link set eth1 up && ip link set eth0 up)", "");
    let (code, v) = m.json(&format!("{PORT1},busy=wait,busy-timeout=5"), &[]);
    assert_eq!(code, Some(0), "{v:#}");
    expect(
        &v,
        "netdev",
        "warn",
        "busy=wait waits up to 5 s",
        "ip link set eth0 down",
    );
    // Taking over needs CAP_NET_ADMIN.
    m.caps("0000000000006000");
    let (code, v) = m.json(&format!("{PORT1},busy=takeover"), &[]);
    assert_eq!(code, Some(1));
    expect(
        &v,
        "netdev",
        "fail",
        "busy=takeover needs CAP_NET_ADMIN",
        "run as root",
    );
}

#[test]
fn check_names_the_process_that_holds_the_port_lock_and_reuses_a_stale_one() {
    let m = Machine::new();
    let (_, v) = m.json(PORT1, &[]);
    let detail = item(&v, "port_lock")["detail"]
        .as_str()
        .unwrap()
        .to_string();
    let path = PathBuf::from(
        detail
            .strip_prefix("free (")
            .and_then(|d| d.strip_suffix(')'))
            .unwrap_or_else(|| panic!("{detail}")),
    );
    assert!(path.starts_with(m.path("locks")), "{detail}");
    assert!(!path.exists(), "the check leaves no lock behind");
    // Held by this test process.
    let held = match pmd::sys::lockfile::try_lock(&path).unwrap() {
        pmd::sys::lockfile::TryLock::Acquired(l) => l,
        pmd::sys::lockfile::TryLock::Held { .. } => panic!("nobody holds it yet"),
    };
    let (code, v) = m.json(PORT1, &[]);
    assert_eq!(code, Some(1));
    let me = std::process::id();
    expect(
        &v,
        "port_lock",
        "fail",
        &format!("held by process pid {me} ("),
        &format!("kill {me}"),
    );
    // Selected by MAC, the same port: the same lock.
    let (code, v) = m.json("mana:mac=02:00:00:00:10:01", &[]);
    assert_eq!(code, Some(1));
    expect(&v, "port_lock", "fail", &format!("pid {me}"), "");
    drop(held);
    // A file left by a process that is gone.
    std::fs::write(&path, "999999999\n").unwrap();
    let (code, v) = m.json(PORT1, &[]);
    assert_eq!(code, Some(0), "{v:#}");
    expect(
        &v,
        "port_lock",
        "pass",
        "was left by pid 999999999 (no longer running)",
        "",
    );
}

#[test]
fn check_compares_libibverbs_device_list_when_it_reads_the_same_tree() {
    // This machine's libibverbs, pointed at the tree, lists none of its made-up devices; on
    // a machine with RDMA devices it would list those instead, so skip there.
    if std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some()) {
        eprintln!("SKIPPED: this machine has RDMA devices");
        return;
    }
    let m = Machine::new();
    let o = m
        .command(PORT1, &["--json"])
        .env("SYSFS_PATH", m.path("sys"))
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(o.status.code(), Some(1), "{v:#}");
    expect(
        &v,
        "rdma_core",
        "fail",
        "but libibverbs does not list mana_0",
        "apt-get install ibverbs-providers libibverbs1",
    );
}

#[test]
fn check_of_a_device_model_port_needs_only_memory_and_its_shm_dir() {
    let m = Machine::new();
    m.caps("0000000000000000");
    m.memlock("unlimited");
    std::fs::remove_dir_all(m.path("sys/module")).unwrap();
    std::fs::create_dir_all(m.path("shm")).unwrap();
    let (code, v) = m.json("emu-mana:wire=shm:pf", &[]);
    assert_eq!(code, Some(0), "{v:#}");
    for id in [
        "modules",
        "uverbs_access",
        "rdma_core",
        "cap_net_raw",
        "netdev",
        "port_lock",
        "mtu",
    ] {
        assert_eq!(item(&v, id)["status"], "skip", "{id}: {v:#}");
    }
    expect(
        &v,
        "modules",
        "skip",
        "device model: no kernel module needed",
        "",
    );
    expect(
        &v,
        "shm_dir",
        "pass",
        &format!("cable file {}", m.path("shm/pmd-wire-pf").display()),
        "",
    );
    expect(&v, "memlock", "pass", "unlimited", "");
    // A PMD_SHM_DIR where nothing can be made has no fallback.
    let o = m
        .command("emu-mana:wire=shm:pf", &["--json"])
        .env("PMD_SHM_DIR", m.path("no-such-dir"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", shown(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    expect(
        &v,
        "shm_dir",
        "fail",
        "cannot create files in",
        "set PMD_SHM_DIR to a directory both ends can write",
    );
    // The afpacket wire opens a raw socket.
    let (code, v) = m.json("emu-mana:wire=afpacket:lo", &[]);
    assert_eq!(code, Some(1));
    expect(
        &v,
        "cap_net_raw",
        "fail",
        "AF_PACKET socket needs it",
        "setcap",
    );
}

#[test]
fn check_refuses_a_bad_spec_or_option_with_status_2() {
    let m = Machine::new();
    let o = m.command("e1000:", &[]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.contains("--check e1000:: unknown port kind 'e1000'"),
        "{e}"
    );
    let o = m
        .command(PORT1, &["--ring-size", "1024", "--pool-size", "256"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", shown(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("--pool-size 256"),
        "{}",
        shown(&o)
    );
    // The sizing options belong to --check.
    let o = Command::new(env!("CARGO_BIN_EXE_pmd-devices"))
        .args(["--ring-size", "1024"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", shown(&o));
}

/// Whether this process runs as root and `setpriv` and `prlimit` are there.
fn can_drop_privileges() -> bool {
    let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(2))
            == Some("0")
    });
    let tool = |t: &str| {
        Command::new(t)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    };
    root && tool("setpriv") && tool("prlimit")
}

#[test]
fn check_run_by_an_unprivileged_user_names_what_it_lacks() {
    if !can_drop_privileges() {
        assert!(
            std::env::var_os("PMD_REQUIRE_PRIVILEGED").is_none(),
            "PMD_REQUIRE_PRIVILEGED is set but this test cannot drop privileges"
        );
        eprintln!("SKIPPED: needs root, setpriv and prlimit");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let m = Machine::new();
    std::fs::set_permissions(m.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // Root's node, as udev makes it without a rule.
    let node = m.path("dev/infiniband/uverbs0");
    std::fs::set_permissions(&node, std::fs::Permissions::from_mode(0o600)).unwrap();
    let bin = m.path("pmd-devices");
    std::fs::copy(env!("CARGO_BIN_EXE_pmd-devices"), &bin).unwrap();
    let mut c = Command::new("prlimit");
    c.args([
        "--memlock=1048576:1048576",
        "setpriv",
        "--reuid",
        "65534",
        "--regid",
        "65534",
        "--clear-groups",
    ])
    .arg(&bin)
    .args(["--json", "--check", PORT1, "--sysfs-root"])
    .arg(m.path("sys"))
    .env("PMD_DEV_ROOT", m.path("dev"))
    .env("PMD_LOCK_DIR", m.path("locks"))
    .env_remove("PMD_PROC_ROOT")
    .env_remove("SYSFS_PATH")
    .env_remove("PMD_SYSFS_ROOT")
    .current_dir(m.dir.path());
    let o = c.output().unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", shown(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    expect(
        &v,
        "cap_net_raw",
        "fail",
        "no CAP_NET_RAW",
        "setcap cap_net_raw,cap_ipc_lock+ep",
    );
    expect(
        &v,
        "memlock",
        "fail",
        "RLIMIT_MEMLOCK 1 MiB is less than the pool's 18 MiB",
        "ulimit -l unlimited",
    );
    expect(
        &v,
        "uverbs_access",
        "fail",
        "cannot be opened for reading and writing by uid 65534",
        "chmod 666",
    );
}
