//! Every numeric option has a range: out-of-range values (the ones that used to panic) are
//! usage errors, exit status 2, with a message naming the option and the range, before any
//! port is opened or memory allocated.

use std::process::Command;

fn run(bin: &str, args: &[&str]) -> (Option<i32>, String) {
    let path = match bin {
        "l2fwd" => env!("CARGO_BIN_EXE_l2fwd"),
        "pktgen" => env!("CARGO_BIN_EXE_pktgen"),
        _ => unreachable!(),
    };
    let o = integration_tests::own_runtime_dir(&mut Command::new(path))
        .args(args)
        .output()
        .unwrap();
    // stderr, then stdout (where the summary goes).
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned() + &String::from_utf8_lossy(&o.stdout),
    )
}

#[test]
fn out_of_range_numbers_are_usage_errors() {
    let l2 = ["--port", "null", "--port", "null"];
    let pg = ["--port", "null"];
    let cases: &[(&str, &[&str], &[&str], &str)] = &[
        ("l2fwd", &l2, &["--duration", "1e30"], "--duration"),
        (
            "l2fwd",
            &l2,
            &["--stats-interval", "inf"],
            "--stats-interval",
        ),
        ("l2fwd", &l2, &["--link-timeout=-1"], "--link-timeout"),
        (
            "l2fwd",
            &l2,
            &["--ring-size", "65535"],
            "power of two from 64 to 32768",
        ),
        ("pktgen", &pg, &["--rate", "1e-30"], "packets per second"),
        ("pktgen", &pg, &["--rate", "1e30"], "packets per second"),
        ("pktgen", &pg, &["--rate-gbps", "1e-25"], "Gbit/s"),
        ("pktgen", &pg, &["--rate-gbps-l1", "1e4"], "Gbit/s"),
        (
            "pktgen",
            &pg,
            &["--size", "60,9100"],
            "each from 60 to 9018",
        ),
        ("pktgen", &pg, &["--size", "59"], "each from 60 to 9018"),
        (
            "pktgen",
            &pg,
            &["--pcap", "x.pcap", "--pcap-timing", "--pcap-speed", "0"],
            "speed multiplier from 0.001 to 1000",
        ),
        (
            "pktgen",
            &pg,
            &["--pcap", "x.pcap", "--pcap-timing", "--pcap-speed", "1e9"],
            "speed multiplier",
        ),
        ("pktgen", &pg, &["--duration", "1e30"], "--duration"),
        (
            "pktgen",
            &pg,
            &["--drain-timeout", "inf"],
            "--drain-timeout",
        ),
        ("pktgen", &pg, &["--ring-size", "65535"], "power of two"),
        // Jumbo frames: MTUs up to 9000, frames up to 9018 bytes (tagged).
        (
            "l2fwd",
            &l2,
            &["--mtu", "9001"],
            "an MTU in bytes from 68 to 9000",
        ),
        (
            "l2fwd",
            &l2,
            &["--mtu", "67"],
            "an MTU in bytes from 68 to 9000",
        ),
        (
            "pktgen",
            &pg,
            &["--mtu", "65536"],
            "an MTU in bytes from 68 to 9000",
        ),
        ("pktgen", &pg, &["--size", "9019"], "from 60 to 9018"),
        ("pktgen", &pg, &["--size", "59"], "from 60 to 9018"),
        (
            "l2fwd",
            &l2,
            &["--pool-size", "1e6"],
            "whole number of mbufs",
        ),
        (
            "pktgen",
            &pg,
            &["--pool-size", "16777217"],
            "from 256 to 16777216",
        ),
        (
            "pktgen",
            &pg,
            &["--src-ip", "0.0.0.0-255.255.255.255"],
            "at most 4294967295 addresses",
        ),
    ];
    for (bin, ports, args, want) in cases {
        let mut all: Vec<&str> = ports.to_vec();
        all.extend_from_slice(args);
        let (code, err) = run(bin, &all);
        assert_eq!(code, Some(2), "{bin} {args:?}: {err}");
        assert!(err.contains(want), "{bin} {args:?}: {want:?} in {err}");
        let value = args.last().unwrap().rsplit('=').next().unwrap();
        assert!(
            err.contains(value),
            "{bin} {args:?}: the value is named: {err}"
        );
    }
}

/// The same exit codes in every tool: 2 when the command line cannot work, 1 when something
/// fails while running.
#[test]
fn usage_errors_exit_2_runtime_failures_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let shm = format!("emu-mana:wire=shm:cli{}", std::process::id());
    let cases: &[(&str, &[&str], i32, &str)] = &[
        ("l2fwd", &["--port", "null"], 2, "even number"),
        (
            "l2fwd",
            &["--port", "null", "--port", "null", "--lcores", "999"],
            2,
            "999",
        ),
        (
            "pktgen",
            &["--port", "null", "--size", "20"],
            2,
            "'20' in '20': expected frame sizes in bytes without FCS, each from 60 to 9018",
        ),
        (
            "pktgen",
            &["--port", "null", "--tx-only", "--rx-only"],
            2,
            "--tx-only",
        ),
        (
            "pktgen",
            &["--port", "null", "--imix", "--size", "64"],
            2,
            "--imix",
        ),
        ("pktgen", &["--port", "null", "--pcap-timing"], 2, "--pcap"),
        (
            "pktgen",
            &["--port", "null", "--rate", "5", "--rate-gbps-l1", "1"],
            2,
            "--rate-gbps-l1",
        ),
        // A frame the MTU given cannot carry.
        (
            "pktgen",
            &["--port", "null", "--size", "9014", "--mtu", "1500"],
            2,
            "--mtu 1500: frames with 9000 bytes after the Ethernet header",
        ),
        (
            "pktgen",
            &["--port", "null", "--port", "null", "--port", "null"],
            2,
            "3 ports given",
        ),
        (
            "pktgen",
            &["--port", "null", "--rx-only", "--count", "5"],
            2,
            "--rx-only",
        ),
        // A link that stays down: the far end of the cable never attaches.
        (
            "pktgen",
            &["--port", &shm, "--link-timeout", "0.2"],
            1,
            "link",
        ),
        // Two ports recording to one file: refused, not half a capture each.
        (
            "l2fwd",
            &[
                "--port",
                "emu-mana:wire=none,pcap=same.pcap",
                "--port",
                "emu-mana:wire=none,pcap=same.pcap",
            ],
            1,
            "another port (of this or another process) is recording to this file",
        ),
        // A capture that cannot be written fails at once, naming the file and why.
        (
            "l2fwd",
            &[
                "--port",
                "emu-mana:wire=none,pcap=/dev/full",
                "--port",
                "null",
            ],
            1,
            "/dev/full: No space left on device",
        ),
        // A device that does not exist on this machine.
        (
            "l2fwd",
            &["--port", "mana:dev=mana_9", "--port", "null"],
            1,
            "mana_9",
        ),
    ];
    for (bin, args, code, want) in cases {
        let path = match *bin {
            "l2fwd" => env!("CARGO_BIN_EXE_l2fwd"),
            _ => env!("CARGO_BIN_EXE_pktgen"),
        };
        let o = integration_tests::own_runtime_dir(&mut Command::new(path))
            .args(*args)
            .current_dir(dir.path())
            .env("PMD_SHM_DIR", dir.path())
            .env("PMD_SYSFS_ROOT", dir.path())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(*code), "{bin} {args:?}: {err}");
        assert!(err.contains(want), "{bin} {args:?}: {want:?} in {err}");
    }
}

/// The pool is sized from what each port really gets (its devargs' queue counts), before it
/// is allocated; `--pool-size` overrides it, and one too small for the RX rings is a usage
/// error saying how many it takes.
#[test]
fn the_pool_holds_the_queues_the_devargs_ask_for() {
    let tag = std::process::id();
    let a = format!("emu-mana:wire=loop:pool{tag},rxq=16");
    let b = format!("emu-mana:wire=loop:pool{tag}");
    let base = ["--port", &a, "--port", &b, "--ring-size", "4096"];
    let (code, err) = run("l2fwd", &[&base[..], &["--duration", "0.3"]].concat());
    assert_eq!(code, Some(0), "rxq=16 with 4096 descriptors: {err}");
    assert!(err.contains("mbufs still in use at exit: 0"), "{err}");

    let (code, err) = run(
        "l2fwd",
        &[&base[..], &["--pool-size", "1000", "--duration", "0.3"]].concat(),
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("--pool-size 1000")
            && err.contains("16 × 4096 + 1 × 4096")
            && err.contains("give at least 69696"),
        "{err}"
    );

    // Enough for the rings: taken as given.
    let (code, err) = run(
        "l2fwd",
        &[&base[..], &["--pool-size", "70000", "--duration", "0.3"]].concat(),
    );
    assert_eq!(code, Some(0), "{err}");

    // pktgen polls every RX queue of its receiving port, so it sizes for them too.
    let (code, err) = run(
        "pktgen",
        &[
            "--port",
            &a,
            "--port",
            &b,
            "--ring-size",
            "4096",
            "--count",
            "100",
            "--link-timeout",
            "0.5",
        ],
    );
    assert_ne!(code, Some(2), "{err}");
    assert!(!err.contains("mbuf pool size"), "{err}");
}

/// `--help` and `-h` of every tool start with what the tool does (not the crate's one-line
/// description), and pktgen's says how it counts frame sizes next to DPDK's tools.
#[test]
fn help_starts_with_what_the_tool_does() {
    let tools: [(&str, &str); 3] = [
        (env!("CARGO_BIN_EXE_l2fwd"), "Layer-2 forwarder:"),
        (env!("CARGO_BIN_EXE_pktgen"), "Traffic generator:"),
        (
            env!("CARGO_BIN_EXE_pmd-devices"),
            "List the NIC ports this framework can drive",
        ),
    ];
    for (path, start) in tools {
        for flag in ["--help", "-h"] {
            let o = Command::new(path).arg(flag).output().unwrap();
            assert_eq!(o.status.code(), Some(0));
            let h = String::from_utf8_lossy(&o.stdout);
            assert!(h.starts_with(start), "{path} {flag}: {h}");
        }
    }
    let o = Command::new(env!("CARGO_BIN_EXE_pktgen"))
        .arg("--help")
        .output()
        .unwrap();
    let h = String::from_utf8_lossy(&o.stdout);
    for want in [
        "without the 4-byte FCS",
        "testpmd counts the same way",
        "pktgen-dpdk counts the FCS",
        "--imix",
        "--rate-gbps-l1",
        "--tx-only",
        "--pcap-timing",
        "--src-mac",
    ] {
        assert!(h.contains(want), "{want:?} in {h}");
    }
}
