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
    let o = Command::new(path).args(args).output().unwrap();
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
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
            "--size <SIZE>",
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
        let o = Command::new(path)
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
