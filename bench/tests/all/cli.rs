//! The bench tools' numeric options have ranges: out-of-range values are usage errors
//! (exit status 2) instead of panics.

use std::process::Command;

#[test]
fn out_of_range_seconds_are_usage_errors() {
    for (bin, opt) in [
        (env!("CARGO_BIN_EXE_null_fwd"), "--duration"),
        (env!("CARGO_BIN_EXE_mempool_perf"), "--seconds"),
    ] {
        for bad in ["1e30", "inf", "0", "-2", "NaN"] {
            let o = Command::new(bin)
                .arg(format!("{opt}={bad}"))
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(2), "{bin} {opt} {bad}: {err}");
            assert!(
                err.contains(opt) && err.contains("expected a number of seconds"),
                "{bin} {opt} {bad}: {err}"
            );
        }
    }
}
