//! l2fwd as a multi-process dataplane on `mana:` ports, through the fake rdma-core: a
//! primary (`--proc-type primary`) opens `mana_0` ports 1 and 2 over verbs, polls queue pairs
//! 0 and 1 of each and exports pairs 2 and 3; two secondaries (`--proc-type secondary`) each
//! take the next free pair of both ports. pktgen sends from device-model ports at the far
//! ends of the wires.
//!
//! What crosses the process boundary, as on a MANA VM (DPDK net/mana's model): the rings
//! (the primary's queue-buffer allocator puts each in a shared file, handed to libmana
//! through `manadv_set_context_attr`), the mbuf pool (one shared file, mapped at the
//! primary's address), and the context's command descriptor, which the primary passes with
//! each grant (`SCM_RIGHTS`) and from which each secondary maps the doorbell page itself
//! (`mmap(cmd_fd, 0)`, as `mana_alloc_context` does and net/mana's secondaries do). The
//! fake's command descriptor is a file whose page 0 is the context's doorbell page, so the
//! device model, in the primary, sees every process's doorbells on that one page.
//!
//! What this cannot show: a real uverbs file's mapping (write-combining MMIO of the device's
//! doorbell page), and whether the hardware serves a doorbell rung from another process's
//! mapping exactly as from the creator's (it does on MANA, whose doorbells are plain page
//! writes; DPDK relies on it).

use crate::common::serial;
use crate::common::{bin, text, Fake, Pair};
use integration_tests::StderrLines;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// pktgen's rate: the 256-descriptor rings hold 128 ms of it, with five processes on two
/// cores (see `queues.rs`).
const RATE: u64 = 2_000;

/// A background process, killed if the test ends without stopping it.
struct Bg(Option<Child>);

impl Bg {
    fn child(&mut self) -> &mut Child {
        self.0.as_mut().expect("running")
    }

    /// SIGINT, then its output (at most 30 s).
    fn stop(mut self) -> std::process::Output {
        crate::common::interrupt(self.child().id());
        let mut c = self.0.take().expect("running");
        assert!(
            integration_tests::eventually(Duration::from_secs(30), || c
                .try_wait()
                .unwrap()
                .is_some()),
            "did not stop on SIGINT"
        );
        c.wait_with_output().unwrap()
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// l2fwd with the fake in place, primary and secondaries sharing `run` (control socket,
/// pool and queue descriptions).
fn l2fwd(fake: &Fake, run: &Path, args: &[&str]) -> (Bg, StderrLines) {
    let mut c = fake.cmd(&bin("l2fwd"));
    c.env("RUNTIME_DIRECTORY", run)
        .args(args)
        .args(["--json", "--stats-interval", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("start l2fwd");
    let lines = StderrLines::take(&mut child);
    (Bg(Some(child)), lines)
}

fn primary(fake: &Fake, run: &Path, pair: &Pair) -> (Bg, StderrLines) {
    l2fwd(
        fake,
        run,
        &[
            "--proc-type",
            "primary",
            "--file-prefix",
            "fakemp",
            "--port",
            pair.l2fwd[0],
            "--port",
            pair.l2fwd[1],
            "--lcores",
            &cores(2),
            "--secondaries",
            "2",
            "--ring-size",
            "256",
            "--link-timeout",
            "0",
        ],
    )
}

fn secondary(fake: &Fake, run: &Path, core: usize) -> (Bg, StderrLines) {
    l2fwd(
        fake,
        run,
        &[
            "--proc-type",
            "secondary",
            "--file-prefix",
            "fakemp",
            "--lcores",
            &core.to_string(),
        ],
    )
}

/// Up to `n` of the CPUs this process may use, as an lcore list.
fn cores(n: usize) -> String {
    let mut c = pmd::lcore::available_cores();
    c.truncate(n);
    c.iter().map(usize::to_string).collect::<Vec<_>>().join(",")
}

/// The `n`-th CPU this process may use (wrapping).
fn core(n: usize) -> usize {
    let c = pmd::lcore::available_cores();
    c[n % c.len()]
}

/// pktgen on the far ends of `pair`'s wires: `count` frames of 64 flows at [`RATE`].
fn pktgen(fake: &Fake, pair: &Pair, count: u64) -> Command {
    let mut c = Command::new(bin("pktgen"));
    integration_tests::own_runtime_dir(&mut c)
        .args(["--port", &pair.pktgen[0], "--port", &pair.pktgen[1]])
        .args(["--count", &count.to_string(), "--rate", &RATE.to_string()])
        .args([
            "--flows",
            "64",
            "--json",
            "--no-telemetry",
            "--link-timeout",
            "30",
        ])
        .args(["--drain-timeout", "5"])
        .env_remove("PMD_LOG")
        .env("PMD_SHM_DIR", fake.shm_dir())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn json(out: &std::process::Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(out)))
}

/// Frames the secondary's report says it forwarded (TX on both ports).
fn forwarded(s: &serde_json::Value) -> u64 {
    s["ports"]
        .as_array()
        .unwrap_or_else(|| panic!("no ports in {s}"))
        .iter()
        .map(|q| q["tx_packets"].as_u64().unwrap())
        .sum()
}

/// The primary's report and output, after SIGINT.
fn stop_primary(pri: Bg, lines: StderrLines) -> (serde_json::Value, std::process::Output, String) {
    let out = pri.stop();
    let err = lines.all(Duration::from_secs(10));
    let ctx = format!("--- primary\n{}{err}", text(&out));
    (json(&out), out, ctx)
}

/// A running set: the primary on `pair`'s ports and two secondaries, all attached.
struct Set {
    fake: Fake,
    run: std::path::PathBuf,
    pri: (Bg, StderrLines),
    a: (Bg, StderrLines),
    b: (Bg, StderrLines),
}

/// The primary on a fake world of `pair` and two secondaries, each attached.
fn start_set(pair: &Pair) -> Set {
    let fake = Fake::new(Some(&pair.world));
    let run = fake.dir.path().join("run");
    let (pri, mut pri_err) = primary(&fake, &run, pair);
    pri_err.wait_for(
        "queue pair(s) of every port for secondaries",
        Duration::from_secs(60),
    );
    let (a, mut a_err) = secondary(&fake, &run, core(0));
    a_err.wait_for("secondary of process", Duration::from_secs(60));
    let (b, mut b_err) = secondary(&fake, &run, core(1));
    b_err.wait_for("secondary of process", Duration::from_secs(60));
    Set {
        fake,
        run,
        pri: (pri, pri_err),
        a: (a, a_err),
        b: (b, b_err),
    }
}

#[test]
fn two_secondaries_forward_on_mana_ports_over_verbs_and_every_frame_arrives() {
    let _one = serial();
    two_secondaries_forward(&Pair::mana(&format!("mp{}", std::process::id())));
}

/// The same on `mlx5:` ports (`mlx5_0` and `mlx5_1`, a context each): rings, CQs and
/// doorbell records in shared files through `mlx5dv_set_context_attr`'s allocators, and the
/// send doorbell register in a UAR page each secondary maps from the primary's command
/// descriptor at `uar_mmap_offset`, as DPDK net/mlx5's secondaries do.
#[test]
fn two_secondaries_forward_on_mlx5_ports_over_verbs_and_every_frame_arrives() {
    let _one = serial();
    two_secondaries_forward(&Pair::mlx5(&format!("mpx{}", std::process::id())));
}

/// The texts of the queue-pair descriptions under `run`.
fn descriptions(run: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs = vec![run.to_owned()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "export") {
                out.push(std::fs::read_to_string(&p).unwrap());
            }
        }
    }
    out
}

/// A primary on `pair` and two secondaries forward 6000 frames: every one arrives, each
/// process forwards its share, the counters add up, the pool ends whole.
fn two_secondaries_forward(pair: &Pair) {
    let Set {
        fake,
        run,
        pri: (pri, mut pri_err),
        a: (a, _a_err),
        b: (b, _b_err),
    } = start_set(pair);
    pri_err.wait_for("polls port 1 queue pair 3", Duration::from_secs(30));
    if pair.l2fwd[0].starts_with("mlx5:") {
        // What a secondary is told: records at their offsets in shared pages, and the send
        // doorbell register as an offset of the command descriptor (a UAR page).
        let d = descriptions(&run);
        assert_eq!(d.len(), 4, "two pairs of two ports: {d:?}");
        for t in &d {
            assert!(t.contains("driver mlx5\n"), "{t}");
            assert!(t.contains("value tx_uar_device_offset "), "{t}");
            assert!(t.contains("area rx_cq_dbrec 8"), "{t}");
            assert!(
                t.contains(" 8@"),
                "records at offsets in a shared page: {t}"
            );
        }
    }

    const FRAMES: u64 = 6_000;
    let g = pktgen(&fake, pair, FRAMES).output().unwrap();
    let gen = json(&g);
    let sa = a.stop();
    let sb = b.stop();
    let (sa_j, sb_j) = (json(&sa), json(&sb));
    pri_err.wait_for("gave back port 1 queue pair 3", Duration::from_secs(30));
    let (p, pout, pctx) = stop_primary(pri, pri_err);
    let ctx = format!(
        "--- pktgen\n{}\n--- secondary a\n{}\n--- secondary b\n{}\n{pctx}",
        text(&g),
        text(&sa),
        text(&sb)
    );
    assert!(g.status.success() && pout.status.success(), "{ctx}");
    assert_eq!(gen["tx_packets"], FRAMES, "{ctx}");
    assert_eq!(gen["rx_packets"], FRAMES, "every frame arrives: {ctx}");
    assert_eq!(gen["lost"], 0, "{ctx}");

    // Each process forwarded its RSS share; together, every frame once.
    let (fa, fb) = (forwarded(&sa_j), forwarded(&sb_j));
    let here = p["tx_packets"].as_u64().unwrap();
    assert!(fa > 0 && fb > 0 && here > 0, "{here} {fa} {fb}: {ctx}");
    assert_eq!(here + fa + fb, FRAMES, "{ctx}");
    // The primary's port counters count the secondaries' pairs (published through shared
    // files), and its pool (shared by all three) ends whole.
    let rx0: u64 = p["ports"][0]["stats"]["ipackets"].as_u64().unwrap();
    let tx1: u64 = p["ports"][1]["stats"]["opackets"].as_u64().unwrap();
    assert_eq!(
        (rx0, tx1),
        (FRAMES, FRAMES),
        "port counters across processes: {ctx}"
    );
    assert_eq!(p["pool_in_use"], 0, "{ctx}");
    assert_eq!(sa_j["buffers_returned"], true, "{ctx}");
    assert_eq!(sb_j["buffers_returned"], true, "{ctx}");
    assert_eq!(p["secondaries"]["attached"], 2, "{ctx}");
    assert!(
        pctx.contains("fake-rdma: at exit: 0 live objects"),
        "the primary's verbs objects all destroyed: {ctx}"
    );
}

#[test]
fn a_killed_secondary_on_mana_ports_is_replaced_and_the_other_keeps_forwarding() {
    let _one = serial();
    killed_secondary_is_replaced(
        &Pair::mana(&format!("mk{}", std::process::id())),
        Some("mana_0 port 1 is configured by another process: ENODEV"),
    );
}

/// The same on `mlx5:` ports. A ConnectX lets several processes make raw QPs on one port
/// (no vPort to hold) and pmd takes no lock for `mlx5:` ports (`port::lock`), so nothing
/// refuses a second primary there: that part is MANA's.
#[test]
fn a_killed_secondary_on_mlx5_ports_is_replaced_and_the_other_keeps_forwarding() {
    let _one = serial();
    killed_secondary_is_replaced(&Pair::mlx5(&format!("mkx{}", std::process::id())), None);
}

/// SIGKILL of one of two secondaries on `pair` mid-stream: the other keeps forwarding, a
/// new one takes the pairs over, the killed one's posted buffers come back to the pool
/// once its pairs are rebuilt. Where `kernel_refusal` is given (MANA), a second primary is refused by the port
/// lock, and by the kernel with that message.
fn killed_secondary_is_replaced(pair: &Pair, kernel_refusal: Option<&str>) {
    let Set {
        fake,
        run,
        pri: (pri, mut pri_err),
        a: (a, _a_err),
        b: (mut b, _b_err),
    } = start_set(pair);

    // A long stream; b is killed in the middle of it.
    let mut gen = Bg(Some(pktgen(&fake, pair, 1_000_000).spawn().unwrap()));
    std::thread::sleep(Duration::from_secs(1));
    b.child().kill().unwrap();
    b.child().wait().unwrap();
    pri_err.wait_for("without a goodbye", Duration::from_secs(30));

    // A second primary on the same ports is refused while this one holds them: by pmd's
    // port lock (naming the holder), and, for a program that does not share the lock
    // directory, by the (fake) kernel, which holds the vPort for the primary's raw QPs.
    let pri_pid = pri.0.as_ref().expect("running").id();
    let second = |lock_dir: Option<&Path>| {
        let mut c = fake.cmd(&bin("l2fwd"));
        c.env("RUNTIME_DIRECTORY", fake.dir.path().join("run2"))
            .args(["--proc-type", "primary", "--file-prefix", "other"])
            .args(["--port", pair.l2fwd[0], "--port", pair.l2fwd[1]])
            .args(["--lcores", &core(0).to_string(), "--link-timeout", "0"]);
        if let Some(d) = lock_dir {
            c.env("PMD_LOCK_DIR", d);
        }
        let o = c.output().unwrap();
        assert!(
            !o.status.success(),
            "a second primary on held ports: {}",
            text(&o)
        );
        text(&o)
    };
    if let Some(why) = kernel_refusal {
        let said = second(None);
        assert!(
            said.contains(&format!("port is in use by process pid {pri_pid}")),
            "{said}"
        );
        let locks = tempfile::tempdir().unwrap();
        let said_kernel = second(Some(locks.path()));
        assert!(said_kernel.contains(why), "{said_kernel}");
    }

    // A new secondary takes b's pairs over once the primary rebuilt them; a keeps going.
    let (c, mut c_err) = secondary(&fake, &run, core(1));
    c_err.wait_for("secondary of process", Duration::from_secs(60));
    std::thread::sleep(Duration::from_secs(2));
    let sc = c.stop();
    let sa = a.stop();
    crate::common::interrupt(gen.child().id());
    let g = gen.0.take().unwrap().wait_with_output().unwrap();
    let (p, pout, pctx) = stop_primary(pri, pri_err);
    let ctx = format!(
        "--- pktgen\n{}\n--- secondary a\n{}\n--- secondary c\n{}\n{pctx}",
        text(&g),
        text(&sa),
        text(&sc)
    );
    let (sa_j, sc_j) = (json(&sa), json(&sc));
    assert!(forwarded(&sc_j) > 0, "the new secondary forwards: {ctx}");
    assert!(
        forwarded(&sa_j) > 0,
        "the other secondary kept forwarding: {ctx}"
    );
    assert_eq!(sa_j["buffers_returned"], true, "{ctx}");
    assert_eq!(sc_j["buffers_returned"], true, "{ctx}");
    assert_eq!(p["secondaries"]["attached"], 3, "{ctx}");
    assert_eq!(p["secondaries"]["killed"], 1, "{ctx}");
    // What the killed one had posted (its RX rings of 256 on both ports) and in flight
    // comes back once the primary rebuilt its pairs (the device no longer uses it): every
    // mbuf in use carries the owner id of the process that took it. The pool ends whole.
    let held = p["secondaries"]["reclaimed_held_mbufs"].as_u64().unwrap();
    // Its two RX rings, less what it had taken and not replaced yet (refills go in 32s).
    assert!(held >= 2 * (256 - 32), "{ctx}");
    assert_eq!(p["pool_in_use"], 0, "{ctx}");
    assert!(pout.status.success(), "{ctx}");
}

/// A host servicing of the primary's device (`mana_0` gone for a second, then back): the
/// primary recovers its ports onto a new device context, exports the pairs anew and
/// publishes the new context's command descriptor; the secondary sees its pairs rebuilt,
/// asks for the descriptor again (its old one maps the old context's doorbell page) and
/// attaches to the new rings. Traffic flows throughout; what is sent after the servicing
/// all arrives, through both processes, and the pool ends whole.
#[test]
fn a_serviced_device_is_recovered_for_the_secondaries_too() {
    let _one = serial();
    serviced_devices_recovered(
        &Pair::mana(&format!("ms{}", std::process::id())),
        &["mana_0"],
    );
}

/// The same on `mlx5:` ports (two devices, both serviced): the new contexts' UAR pages are
/// in their new command descriptors, which the secondary maps again.
#[test]
fn serviced_mlx5_devices_are_recovered_for_the_secondaries_too() {
    let _one = serial();
    serviced_devices_recovered(
        &Pair::mlx5(&format!("msx{}", std::process::id())),
        &["mlx5_0", "mlx5_1"],
    );
}

/// `devices` (which hold `pair`'s two ports) serviced under a primary and a secondary.
fn serviced_devices_recovered(pair: &Pair, devices: &[&str]) {
    let fake = Fake::new(Some(&pair.world));
    let run = fake.dir.path().join("run");
    let ports = pair.l2fwd.map(|p| format!("{p},recover-timeout=20"));
    let (pri, mut pri_err) = l2fwd(
        &fake,
        &run,
        &[
            "--proc-type",
            "primary",
            "--file-prefix",
            "fakemp",
            "--port",
            &ports[0],
            "--port",
            &ports[1],
            "--lcores",
            &core(0).to_string(),
            "--secondaries",
            "1",
            "--ring-size",
            "256",
            "--link-timeout",
            "0",
        ],
    );
    pri_err.wait_for(
        "queue pair(s) of every port for secondaries",
        Duration::from_secs(60),
    );
    let (sec, mut sec_err) = secondary(&fake, &run, core(1));
    sec_err.wait_for("secondary of process", Duration::from_secs(60));

    // Traffic flows through both processes while the device goes away and comes back.
    let during = Bg(Some(pktgen(&fake, pair, 1_000_000).spawn().unwrap()));
    std::thread::sleep(Duration::from_secs(1));
    for dev in devices {
        let knob = fake
            .dir
            .path()
            .join(format!("sys/class/infiniband/{dev}/fake_rdma_fatal"));
        std::fs::write(&knob, "service 1").unwrap();
    }
    for _ in 0..2 {
        pri_err.wait_for("recovered after", Duration::from_secs(60));
    }
    for _ in 0..2 {
        pri_err.wait_for("new device descriptor published", Duration::from_secs(30));
        sec_err.wait_for("got its new descriptor", Duration::from_secs(30));
        sec_err.wait_for(
            "rebuilt by the primary: attached again",
            Duration::from_secs(30),
        );
    }

    std::thread::sleep(Duration::from_secs(1));
    let d = during.stop();
    let dj = json(&d);
    assert!(
        dj["rx_packets"].as_u64().unwrap() > 0,
        "frames came back around the servicing: {}",
        text(&d)
    );

    const FRAMES: u64 = 4_000;
    let g = pktgen(&fake, pair, FRAMES).output().unwrap();
    let gen = json(&g);
    let s = sec.stop();
    let s_err = sec_err.all(Duration::from_secs(10));
    let (p, pout, pctx) = stop_primary(pri, pri_err);
    let ctx = format!(
        "--- pktgen\n{}\n--- secondary\n{}{s_err}\n{pctx}",
        text(&g),
        text(&s)
    );
    assert!(g.status.success() && pout.status.success(), "{ctx}");
    assert_eq!(
        gen["rx_packets"], FRAMES,
        "every frame after the servicing arrives: {ctx}"
    );
    let sj = json(&s);
    let there = forwarded(&sj);
    let here = p["tx_packets"].as_u64().unwrap();
    assert!(there > 0 && here > 0, "{here} {there}: {ctx}");
    // Everything both pktgens got back was forwarded by one of the two processes (and a
    // frame sent as the device went may be forwarded and never arrive).
    let back = dj["rx_packets"].as_u64().unwrap() + FRAMES;
    assert!(here + there >= back, "{here} + {there} < {back}: {ctx}");
    assert_eq!(sj["buffers_returned"], true, "{ctx}");
    assert_eq!(p["pool_in_use"], 0, "{ctx}");
    assert_eq!(p["ports"][0]["recoveries"], 1, "{ctx}");
}

/// `tests/c/import.c`, compiled once per test process against the real headers.
fn import_program() -> &'static Path {
    static EXE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    EXE.get_or_init(|| crate::common::compile_c("import", &[], &["-libverbs"]))
}

/// What a process given a MANA context's command descriptor can do with it, through the
/// real libibverbs API: no import (`EOPNOTSUPP`, as rdma-core's MANA provider has none;
/// `EINVAL` / `ENODEV` for descriptors that are no device), and the doorbell page mapped
/// from it is the context's one page.
#[test]
fn a_mana_command_descriptor_maps_the_doorbell_page_and_imports_nothing() {
    let fake = Fake::new(None);
    let o = fake
        .cmd(import_program())
        .arg("mana_0")
        .output()
        .expect("run import");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "{}", text(&o));
    assert!(!out.contains("FAIL"), "{out}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("ok ")).count(),
        12,
        "{out}"
    );
}
