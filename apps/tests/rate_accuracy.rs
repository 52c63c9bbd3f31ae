//! pktgen's rate control on the device model: the achieved TX rate over 5 s is within 1% of
//! the requested rate, up to 1 Mpps. (Its own test binary, so it runs alone.)

#[path = "all/support.rs"]
mod support;

use support::{bin, succeeded};

fn achieved(rate: u64) -> f64 {
    let out = bin("pktgen")
        .args([
            "--port",
            "emu-mana:wire=none",
            "--lcores",
            "0",
            "--json",
            "--duration",
            "5",
        ])
        .args(["--rate", &rate.to_string()])
        .output()
        .unwrap();
    let v = succeeded(&out);
    let pps = v["tx_pps"].as_f64().unwrap();
    let secs = v["duration_s"].as_f64().unwrap();
    assert!((secs - 5.0).abs() < 0.05, "ran {secs} s");
    pps
}

#[test]
fn achieved_rate_is_within_one_percent_up_to_1mpps() {
    for rate in [10_000u64, 1_000_000] {
        let pps = achieved(rate);
        let err = (pps - rate as f64).abs() / rate as f64;
        assert!(
            err < 0.01,
            "requested {rate} pps, achieved {pps:.0} pps ({:.3}% off)",
            err * 100.0
        );
    }
}
