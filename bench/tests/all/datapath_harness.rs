//! The `datapath` harness keeps working as the drivers change: every path runs a few bursts
//! over its device double (which checks what the driver posts and delivers) and prints its
//! RESULT line; a path it does not know is a usage error.

use std::process::Command;

const PATHS: [(&str, &str); 9] = [
    ("tx", "mana_tx"),
    ("rx", "mana_rx"),
    ("rxc", "mana_rx_coalesced4"),
    ("m5tx", "mlx5_tx_empw"),
    ("m5tx-send", "mlx5_tx_send"),
    ("m5rx", "mlx5_rx"),
    ("m5rx-cqz", "mlx5_rx_cqz"),
    ("m5rx-mprq", "mlx5_rx_mprq"),
    ("m5rx-mprq-cqz", "mlx5_rx_mprq_cqz"),
];

#[test]
fn every_path_runs_and_prints_its_result_line() {
    let paths: Vec<&str> = PATHS.iter().map(|(p, _)| *p).collect();
    let paths = paths.join(",");
    // 300 bursts: the rings wrap several times (256 descriptors, CQs of 32 to 512).
    let o = Command::new(env!("CARGO_BIN_EXE_datapath"))
        .args(["--bursts", "300", "--warmup", "20", "--paths", &paths])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "datapath failed: {err}");
    let results: Vec<&str> = out.lines().filter(|l| l.starts_with("RESULT ")).collect();
    assert_eq!(results.len(), PATHS.len(), "{out}");
    for ((_, name), line) in PATHS.iter().zip(&results) {
        assert!(
            line.contains(&format!(" path={name} ")) && line.contains(" bursts=300 "),
            "{line}"
        );
    }
}

#[test]
fn an_unknown_path_is_a_usage_error() {
    let o = Command::new(env!("CARGO_BIN_EXE_datapath"))
        .args(["--paths", "tx,nope"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("nope"));
}
