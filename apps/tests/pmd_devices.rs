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
