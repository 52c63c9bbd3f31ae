//! Device discovery against fake sysfs trees shaped like a MANA VM and an mlx5 host.

use pmd::devices::{self, Family};
use pmd::MacAddr;
use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

fn write(path: &Path, contents: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, contents).unwrap();
}

/// One fake IB device and the PCI function behind it.
struct Fake<'a> {
    ibdev: &'a str,
    pci: &'a str,
    ids: (&'a str, &'a str),
    driver: &'a str,
    /// `(port number, state, link layer)`
    ports: &'a [(u32, &'a str, &'a str)],
    /// `(name, dev_port, mac, flags)`
    netdevs: &'a [(&'a str, u32, &'a str, &'a str)],
}

impl Fake<'_> {
    fn create(&self, root: &Path) {
        let pci_dir = root.join("devices/pci0000:00").join(self.pci);
        write(&pci_dir.join("vendor"), &format!("{}\n", self.ids.0));
        write(&pci_dir.join("device"), &format!("{}\n", self.ids.1));
        write(
            &pci_dir.join("uevent"),
            &format!("DRIVER={}\nPCI_SLOT_NAME={}\n", self.driver, self.pci),
        );
        let drv = root.join("bus/pci/drivers").join(self.driver);
        fs::create_dir_all(&drv).unwrap();
        symlink(&drv, pci_dir.join("driver")).unwrap();
        for (name, dev_port, mac, flags) in self.netdevs {
            let n = pci_dir.join("net").join(name);
            write(&n.join("dev_port"), &format!("{dev_port}\n"));
            write(&n.join("address"), &format!("{mac}\n"));
            write(&n.join("flags"), &format!("{flags}\n"));
        }
        let ib = root.join("class/infiniband").join(self.ibdev);
        fs::create_dir_all(&ib).unwrap();
        symlink(&pci_dir, ib.join("device")).unwrap();
        for (p, state, ll) in self.ports {
            write(&ib.join(format!("ports/{p}/state")), &format!("{state}\n"));
            write(
                &ib.join(format!("ports/{p}/link_layer")),
                &format!("{ll}\n"),
            );
        }
    }
}

/// An Azure VM: one MANA VF with two vPorts; eth1 (port 1) is up, eth2 (port 2) is down.
fn mana_vm(root: &Path) {
    Fake {
        ibdev: "mana_0",
        pci: "7870:00:00.0",
        ids: ("0x1414", "0x00ba"),
        driver: "mana",
        ports: &[(1, "4: ACTIVE", "Ethernet"), (2, "4: ACTIVE", "Ethernet")],
        netdevs: &[
            ("eth2", 1, "00:15:5d:01:02:04", "0x1002"),
            ("eth1", 0, "00:15:5d:01:02:03", "0x1003"),
        ],
    }
    .create(root);
}

/// A host with one ConnectX function.
fn mlx5_host(root: &Path) {
    Fake {
        ibdev: "mlx5_0",
        pci: "0000:3b:00.0",
        ids: ("0x15b3", "0x101d"),
        driver: "mlx5_core",
        ports: &[(1, "1: DOWN", "Ethernet")],
        netdevs: &[("enp59s0f0np0", 0, "b8:ce:f6:00:11:22", "0x1003")],
    }
    .create(root);
}

#[test]
fn mana_vm_ports_map_to_netdevs_by_dev_port() {
    let dir = tempfile::tempdir().unwrap();
    mana_vm(dir.path());
    let devs = devices::list(dir.path()).unwrap();
    assert_eq!(devs.len(), 1);
    let d = &devs[0];
    assert_eq!(d.name, "mana_0");
    assert_eq!(d.family, Family::Mana);
    assert_eq!((d.vendor_id, d.device_id), (Some(0x1414), Some(0x00ba)));
    assert_eq!(d.pci_addr.as_deref(), Some("7870:00:00.0"));
    assert_eq!(d.ports.len(), 2);
    let p1 = &d.ports[0];
    assert_eq!(
        (p1.number, p1.state.as_str(), p1.link_layer.as_str()),
        (1, "ACTIVE", "Ethernet")
    );
    let n1 = p1.netdev.as_ref().unwrap();
    assert_eq!(n1.name, "eth1");
    assert_eq!(
        n1.mac,
        Some("00:15:5d:01:02:03".parse::<MacAddr>().unwrap())
    );
    assert!(n1.up);
    let n2 = d.ports[1].netdev.as_ref().unwrap();
    assert_eq!(n2.name, "eth2");
    assert!(!n2.up);

    let r = devices::report(&devs);
    assert!(
        r.contains("mana_0  provider mana [1414:00ba] pci 7870:00:00.0"),
        "{r}"
    );
    assert!(
        r.contains(
            "port 1  Ethernet ACTIVE  netdev eth1 mac 00:15:5d:01:02:03 (up: holds the port)"
        ),
        "{r}"
    );
    assert!(
        r.contains("port 2  Ethernet ACTIVE  netdev eth2 mac 00:15:5d:01:02:04 (down)"),
        "{r}"
    );
    assert!(!r.contains("No RDMA devices"));
}

#[test]
fn mlx5_and_mana_listed_together_sorted() {
    let dir = tempfile::tempdir().unwrap();
    mlx5_host(dir.path());
    mana_vm(dir.path());
    let devs = devices::list(dir.path()).unwrap();
    let names: Vec<_> = devs.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["mana_0", "mlx5_0"]);
    let m = &devs[1];
    assert_eq!(m.family, Family::Mlx5);
    assert_eq!(m.ports[0].state, "DOWN");
    assert_eq!(m.ports[0].netdev.as_ref().unwrap().name, "enp59s0f0np0");

    // Each port says how to open it; an up mlx5 netdev does not hold its port (mlx5 is
    // bifurcated), an up MANA one does.
    let r = devices::report(&devs);
    assert!(r.contains("--port mana:dev=mana_0,port=2"), "{r}");
    assert!(r.contains("--port mlx5:dev=mlx5_0,port=1"), "{r}");
    assert!(
        r.contains("netdev enp59s0f0np0 mac b8:ce:f6:00:11:22 (up)\n"),
        "{r}"
    );
    // The mlx5 port is selected by the same keys as a MANA one.
    let sel = devices::PortSelector {
        netdev: Some("enp59s0f0np0".into()),
        ..Default::default()
    };
    let (dev, port, nd) = devices::resolve_port(dir.path(), Family::Mlx5, &sel).unwrap();
    assert_eq!((dev.as_str(), port), ("mlx5_0", 1));
    assert_eq!(nd.unwrap().mac, Some("b8:ce:f6:00:11:22".parse().unwrap()));
    let e = devices::resolve_port(
        dir.path(),
        Family::Mlx5,
        &devices::PortSelector {
            dev: Some("mlx5_7".into()),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(
        e.contains("no mlx5 port matches dev=mlx5_7; there is mlx5_0 port 1 (enp59s0f0np0"),
        "{e}"
    );
}

#[test]
fn unknown_vendor_is_other_with_driver_name() {
    let dir = tempfile::tempdir().unwrap();
    Fake {
        ibdev: "rxe0",
        pci: "0000:00:03.0",
        ids: ("0x8086", "0x1572"),
        driver: "i40e",
        ports: &[(1, "4: ACTIVE", "Ethernet")],
        netdevs: &[],
    }
    .create(dir.path());
    let devs = devices::list(dir.path()).unwrap();
    assert_eq!(devs[0].family, Family::Other("i40e".into()));
    assert!(devs[0].ports[0].netdev.is_none());
    assert!(devices::report(&devs).contains("provider other (i40e)"));
}

#[test]
fn no_devices_says_so_and_points_to_the_model() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("class/infiniband")).unwrap();
    let devs = devices::list(dir.path()).unwrap();
    assert!(devs.is_empty());
    let r = devices::report(&devs);
    assert!(r.starts_with("No RDMA devices found"), "{r}");
    assert!(r.contains("emu-mana:wire="), "{r}");
}
