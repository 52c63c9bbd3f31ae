//! `pmd-devices --check` on the fake rdma-core: with the fake installed as rdma-core (its
//! libmana.so.1 loads, its libibverbs lists the world's devices) and the world's tree, a
//! `mana:` or `mlx5:` port passes every item this machine can give it; a netdev that holds
//! the port, a spec that matches two ports and a device libibverbs does not list fail, each
//! with its fix.

use crate::common::{bin, text, Fake};
use std::process::Output;

const PORT1: &str = "mana:dev=mana_0,port=1";

/// The fake world of `ports`, with what `scripts/fake-rdma.sh` adds for the preflight: the
/// modules sysfs shows loaded and a uverbs node per device.
fn world(ports: Option<&str>) -> Fake {
    let fake = Fake::new(ports);
    let d = fake.dir.path();
    for m in ["ib_uverbs", "mana_ib", "mlx5_ib"] {
        std::fs::create_dir_all(d.join("sys/module").join(m)).unwrap();
    }
    std::fs::create_dir_all(d.join("dev/infiniband")).unwrap();
    for e in std::fs::read_dir(d.join("sys/class/infiniband_verbs")).unwrap() {
        let name = e.unwrap().file_name();
        if name.to_string_lossy().starts_with("uverbs") {
            std::fs::write(d.join("dev/infiniband").join(name), "").unwrap();
        }
    }
    std::fs::create_dir_all(d.join("locks")).unwrap();
    fake
}

/// `pmd-devices --json --check SPEC` on `fake`.
fn check(fake: &Fake, spec: &str) -> (Output, serde_json::Value) {
    let d = fake.dir.path();
    let o = fake
        .cmd(&bin("pmd-devices"))
        .args(["--json", "--check", spec])
        .env("PMD_DEV_ROOT", d.join("dev"))
        .env("PMD_LOCK_DIR", d.join("locks"))
        .env_remove("PMD_PROC_ROOT")
        .env_remove("PMD_NO_HUGEPAGES")
        .output()
        .expect("run pmd-devices");
    let v = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)));
    (o, v)
}

fn item<'a>(v: &'a serde_json::Value, id: &str) -> &'a serde_json::Value {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == id)
        .unwrap_or_else(|| panic!("no {id} in {v:#}"))
}

fn status(v: &serde_json::Value, id: &str) -> String {
    item(v, id)["status"].as_str().unwrap().to_string()
}

fn detail(v: &serde_json::Value, id: &str) -> String {
    item(v, id)["detail"].as_str().unwrap().to_string()
}

/// Items whose outcome depends on the user and machine running the test (capabilities,
/// locked memory, hugepages): whatever they say, they must not be the only thing checked.
const MACHINE: [&str; 3] = ["cap_net_raw", "memlock", "hugepages"];

#[test]
fn a_fake_mana_port_passes_its_preflight() {
    let fake = world(None);
    let (o, v) = check(&fake, PORT1);
    for id in [
        "modules",
        "uverbs_access",
        "rdma_core",
        "selection",
        "netdev",
        "port_lock",
        "mtu",
    ] {
        assert_eq!(status(&v, id), "pass", "{id}: {}", text(&o));
    }
    // The fake is what loaded as libmana.so.1, and its libibverbs lists the world's device.
    let rdma = detail(&v, "rdma_core");
    assert!(
        rdma.contains(&fake.dir.path().join("lib").display().to_string())
            && rdma.contains("libibverbs lists mana_0"),
        "{rdma}"
    );
    assert!(
        detail(&v, "netdev").contains("eth-mana_0-1 is down"),
        "{v:#}"
    );
    let failing: Vec<&str> = MACHINE
        .into_iter()
        .filter(|id| status(&v, id) == "fail")
        .collect();
    assert_eq!(
        o.status.code(),
        Some(if failing.is_empty() { 0 } else { 1 }),
        "{}",
        text(&o)
    );
}

#[test]
fn a_fake_mlx5_port_passes_and_its_netdev_is_only_information() {
    let fake = world(Some("mlx5_0/1:mac=02:00:00:00:50:01,wire=none"));
    let (o, v) = check(&fake, "mlx5:dev=mlx5_0");
    for id in [
        "modules",
        "uverbs_access",
        "rdma_core",
        "selection",
        "netdev",
    ] {
        assert_eq!(status(&v, id), "pass", "{id}: {}", text(&o));
    }
    assert!(
        detail(&v, "modules").contains("mlx5_ib, ib_uverbs"),
        "{v:#}"
    );
    assert!(detail(&v, "rdma_core").contains("libmlx5.so.1"), "{v:#}");
    assert!(
        detail(&v, "netdev").contains("on mlx5 it shares the port"),
        "{v:#}"
    );
    assert_eq!(status(&v, "port_lock"), "skip", "{v:#}");
}

#[test]
fn a_spec_for_two_fake_ports_fails_with_both() {
    let fake = world(None);
    let (o, v) = check(&fake, "mana:");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(status(&v, "selection"), "fail");
    let fix = item(&v, "selection")["fix"].as_str().unwrap();
    assert_eq!(
        fix,
        "name one: mana:dev=mana_0,port=1 or mana:dev=mana_0,port=2"
    );
}

#[test]
fn a_device_libibverbs_does_not_list_fails_rdma_core() {
    // The world has mana_0; the tree also shows a mana_5 that libibverbs (the fake) does not
    // know: a device whose provider is missing.
    let fake = world(None);
    let d = fake.dir.path().join("sys/class/infiniband/mana_5");
    std::fs::create_dir_all(d.join("device/net/eth5")).unwrap();
    std::fs::create_dir_all(d.join("ports/1")).unwrap();
    std::fs::write(d.join("device/vendor"), "0x1414\n").unwrap();
    std::fs::write(d.join("device/net/eth5/dev_port"), "0\n").unwrap();
    std::fs::write(d.join("device/net/eth5/address"), "02:00:00:00:10:05\n").unwrap();
    let verbs = fake.dir.path().join("sys/class/infiniband_verbs/uverbs9");
    std::fs::create_dir_all(&verbs).unwrap();
    std::fs::write(verbs.join("ibdev"), "mana_5\n").unwrap();
    std::fs::write(fake.dir.path().join("dev/infiniband/uverbs9"), "").unwrap();
    let (o, v) = check(&fake, "mana:dev=mana_5");
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(status(&v, "selection"), "pass", "{v:#}");
    assert_eq!(status(&v, "rdma_core"), "fail", "{v:#}");
    assert!(
        detail(&v, "rdma_core").contains("libibverbs does not list mana_5 (it lists: mana_0)"),
        "{v:#}"
    );
}
