#!/usr/bin/env python3
"""The soak run behind bench/soak.sh: pktgen -> l2fwd -> pktgen for a long time while every
fault the devices can have keeps happening, then a check that nothing was lost uncounted,
nothing leaked and nothing grew. See bench/soak.sh --help for what it runs and checks.

Runs its parts one after the other (DURATION is shared between them):

  emu-mana, emu-mlx5  l2fwd on two device-model ports whose faults take turns
                      (faults=all, fault-period=PERIOD: link flaps, dropped and truncated
                      frames, TX error completions, bad memory keys, failed queue state
                      changes, slow completions);
  mana, mlx5          l2fwd on two mana:/mlx5: ports over the fake rdma-core, whose device
                      models cycle the same faults (FAKE_RDMA_PORTS faults=all) and whose
                      devices get link flaps and host servicing (device resets) from the
                      fake's sysfs knobs.

In every part pktgen (device-model ports on the far ends of the two shared-memory cables)
runs several times in a row: each run is a cable peer that goes away and comes back.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PARTS = ["emu-mana", "emu-mlx5", "mana", "mlx5"]
# How much l2fwd's anonymous resident memory may grow from the end of the first pktgen run to
# the end.
# The shortest part that gives every fault its turn while pktgen sends, at the default --period
# of 0.5 s (12 s a part did not:
# the TX-error phase came after the traffic, and no TX error completion happened).
MIN_PART_SECONDS = 15
RSS_GROWTH_LIMIT_KIB = 2048


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class Proc:
    """A tool in the background, its stderr read line by line (kept, and scanned for
    events)."""

    def __init__(self, argv, env, stdout_path):
        self.out = open(stdout_path, "w")
        self.p = subprocess.Popen(
            argv, env=env, stdout=self.out, stderr=subprocess.PIPE, text=True
        )
        self.lines = []
        self.cond = threading.Condition()
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stderr:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()
        with self.cond:
            self.cond.notify_all()

    def wait_line(self, pred, timeout):
        """Waits for a stderr line `pred` accepts; the line, or None at the timeout or exit."""
        end = time.monotonic() + timeout
        seen = 0
        with self.cond:
            while True:
                for line in self.lines[seen:]:
                    if pred(line):
                        return line
                seen = len(self.lines)
                left = end - time.monotonic()
                if left <= 0 or (self.p.poll() is not None and not self.t.is_alive()):
                    return None
                self.cond.wait(min(left, 0.2))

    def count(self, pred):
        with self.cond:
            return sum(1 for line in self.lines if pred(line))

    def stop(self, timeout=60):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGINT)
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = self.p.wait()
        self.t.join(5)
        self.out.close()
        return rc

    def stderr(self):
        with self.cond:
            return "\n".join(self.lines)


def proc_sample(pid):
    """(anonymous resident KiB, open fds) of a live process. Anonymous memory (the heap, the
    stacks) is where a leak grows; the shared-memory cables' rings are file pages that fill
    in as the ring is first written round, so whole-RSS grows for a while by design."""
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            rss = int(line.split()[1])
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    return rss, fds


def hugepage_files():
    root = Path("/dev/hugepages")
    try:
        return {p.name for p in root.iterdir()}
    except OSError:
        return set()


def last_json(path):
    lines = [l for l in Path(path).read_text().splitlines() if l.startswith("{")]
    if not lines:
        raise RuntimeError(f"no JSON report in {path}")
    return json.loads(lines[-1])


def device_drops(ports):
    return sum(p["device_drops"]["rx"] + p["device_drops"]["tx"] for p in ports)


def xsum(ports, names):
    return sum(p["xstats"].get(n, 0) for p in ports for n in names)


class Knobs(threading.Thread):
    """The fake rdma-core's sysfs knobs, turned while a part runs: a link flap (down for
    PERIOD) and a host servicing (the device away for PERIOD) in turn, on both devices in
    turn, each servicing waited out (l2fwd's `recovered` event) before the next knob."""

    def __init__(self, family, period, l2fwd):
        super().__init__(daemon=True)
        self.family, self.period, self.l2 = family, period, l2fwd
        self.stop_flag = threading.Event()
        # Held while a knob is turned and until the port is back: samples of l2fwd's files
        # are taken outside (a device being serviced has its files closed).
        self.quiet = threading.Lock()
        self.flaps = 0
        self.resets = 0
        self.failure = None

    def run(self):
        root = Path(os.environ["SYSFS_PATH"]) / "class/infiniband"
        dev = 0
        try:
            while not self.stop_flag.wait(self.period):
                d = root / f"{self.family}_{dev}"
                # Flap the link (the knobs are files the watcher reads once written; the
                # device's directory is away while it is serviced).
                link = d / "ports/1/fake_rdma_link"
                if link.parent.is_dir():
                    with self.quiet:
                        link.write_text("down\n")
                        time.sleep(self.period)
                        link.write_text("up\n")
                        self.flaps += 1
                if self.stop_flag.wait(self.period):
                    break
                # Service the device, then wait for the port to be running again.
                fatal = d / "fake_rdma_fatal"
                if d.is_dir():
                    recovered = lambda l: "recovered after" in l
                    want = self.l2.count(recovered) + 1
                    end = time.monotonic() + 60
                    with self.quiet:
                        fatal.write_text(f"service {self.period}\n")
                        self.resets += 1
                        while self.l2.count(recovered) < want and time.monotonic() < end:
                            time.sleep(0.05)
                    if self.l2.count(recovered) < want:
                        self.failure = f"{d.name}: no recovery within 60 s of a servicing"
                        return
                dev ^= 1
        except OSError as e:
            self.failure = f"knobs: {e}"


def run_part(part, seconds, args, bin_dir, work):
    """One part; returns its result dict. Whatever way it ends (Ctrl-C included), the tools it
    started are stopped."""
    started = []
    try:
        return _run_part(part, seconds, args, bin_dir, work, started)
    finally:
        for p in started:
            if p.poll() is None:
                p.kill()
                p.wait()


def _run_part(part, seconds, args, bin_dir, work, started):
    """One part; returns its result dict (also written to work/result.json)."""
    family = part.removeprefix("emu-")
    fake = not part.startswith("emu-")
    tag = args.tag or f"soak{os.getpid()}{family}"
    shm = work / "shm"
    shm.mkdir(parents=True, exist_ok=True)
    base_env = dict(os.environ, PMD_SHM_DIR=str(shm))
    period = args.period
    if fake:
        l2_ports = [f"{family}:dev={family}_0", f"{family}:dev={family}_1"]
    else:
        faults = f"faults=all,fault-period={period}"
        l2_ports = [f"emu-{family}:wire=shm:{tag}-1,{faults}", f"emu-{family}:wire=shm:{tag}-2,{faults}"]
    pg_ports = [f"emu-{family}:wire=shm:{tag}-1", f"emu-{family}:wire=shm:{tag}-2"]
    l2_argv = [str(bin_dir / "l2fwd")]
    for p in l2_ports:
        l2_argv += ["--port", p]
    # No wait for links: pktgen, the far end, starts after l2fwd is ready.
    l2_argv += ["--json", "--stats-interval", "0", "--link-timeout", "0"]
    l2_env = dict(base_env, RUNTIME_DIRECTORY=str(work / "run-l2fwd"))
    huge_before = hugepage_files()
    t0 = time.monotonic()
    l2 = Proc(l2_argv, l2_env, work / "l2fwd.json")
    started.append(l2.p)
    result = {"part": part, "failures": []}
    fail = result["failures"].append
    if l2.wait_line(lambda l: '"event":"ready"' in l, 60) is None:
        l2.stop(5)
        fail(f"l2fwd did not start: {l2.stderr()[-2000:]}")
        return result
    knobs = None
    if fake:
        knobs = Knobs(family, period, l2)
        knobs.start()
    legs = max(2, round(seconds / args.leg_seconds))
    # Each run of pktgen: its send time, then up to 2 s of drain and about 1 s to start.
    leg_send = max(1.0, seconds / legs - 3.0)
    pg_env = dict(base_env)
    pg_env.pop("LD_LIBRARY_PATH", None)  # pktgen runs on the device model, not the fake
    reports, samples = [], []
    for i in range(legs):
        pg_env["RUNTIME_DIRECTORY"] = str(work / f"run-pktgen-{i}")
        argv = [str(bin_dir / "pktgen")]
        for p in pg_ports:
            argv += ["--port", p]
        argv += ["--rate", str(args.rate), "--duration", f"{leg_send:.3f}",
                 "--drain-timeout", "2", "--link-timeout", "30", "--json",
                 "--stats-interval", "0", "--flows", "64"]
        out = work / f"pktgen-{i}.json"
        with open(out, "w") as o, open(work / f"pktgen-{i}.err", "w") as e:
            pg = subprocess.Popen(argv, env=pg_env, stdout=o, stderr=e)
            started.append(pg)
            rc = pg.wait()
        if rc != 0:
            fail(f"pktgen run {i + 1} exited {rc}: {(work / f'pktgen-{i}.err').read_text()[-1500:]}")
            break
        reports.append(last_json(out))
        if l2.p.poll() is not None:
            fail(f"l2fwd exited during pktgen run {i + 1}: {l2.stderr()[-2000:]}")
            break
        if knobs:
            with knobs.quiet:
                samples.append(proc_sample(l2.p.pid))
        else:
            samples.append(proc_sample(l2.p.pid))
    if knobs:
        knobs.stop_flag.set()
        knobs.join(90)
        if knobs.failure:
            fail(knobs.failure)
        result["link_flaps"], result["resets"] = knobs.flaps, knobs.resets
    # Let a servicing in progress end before the end counts are taken.
    if fake:
        time.sleep(period + 0.5)
    if l2.p.poll() is None:
        samples.append(proc_sample(l2.p.pid))
    rc = l2.stop()
    result["seconds"] = round(time.monotonic() - t0, 1)
    if rc != 0:
        fail(f"l2fwd exited {rc}: {l2.stderr()[-2000:]}")
        return result
    l2r = last_json(work / "l2fwd.json")
    (work / "l2fwd.err").write_text(l2.stderr())

    sent = sum(r["tx_packets"] for r in reports)
    received = sum(r["rx_packets"] for r in reports)
    lost = sum(r["lost"] for r in reports)
    dups = sum(r["duplicates"] for r in reports)
    pg_drops = sum(device_drops(r["ports"]) for r in reports)
    # Frames an earlier pktgen run lost that a later one found waiting on its cable when it
    # attached (sent to the cable while no pktgen was there) and discarded: counted there.
    pg_drops += sum(xsum(r["ports"], ["wire_rx_stale"]) for r in reports)
    l2_drops = l2r["dropped"] + l2r["down_drops"] + l2r["device_drops"]
    # Over the fake: what its device models dropped where no driver over verbs can see it
    # (a real NIC counts these in its own counters), as the fake reports at exit.
    fake_drops = {}
    for line in l2.lines:
        if line.startswith("fake-rdma: device drops at exit: "):
            fake_drops = json.loads(line.split("at exit: ", 1)[1])
    counted = pg_drops + l2_drops + sum(fake_drops.values())
    result.update(
        runs=len(reports), sent=sent, received=received, lost=lost, counted=counted,
        pktgen_device_drops=pg_drops, l2fwd_dropped=l2r["dropped"],
        l2fwd_down_drops=l2r["down_drops"], l2fwd_device_drops=l2r["device_drops"],
        fake_device_drops=fake_drops,
        recoveries=l2r["recoveries"],
        link_events=sum(1 for e in l2r["events"] if e["event"] in ("link_down", "link_up")),
        rss_kib=[s[0] for s in samples], fds=[s[1] for s in samples],
    )
    # What the faults did, from the devices' own counters.
    ports = l2r["ports"]
    result["faults_seen"] = {
        "rx_fault_drops": xsum(ports, ["dev_rx_fault_drops"]) + fake_drops.get("rx_fault_drops", 0),
        # Error completions, as the drivers saw them.
        "rx_errors": xsum(ports, ["rx_cqe_errors"]),
        "tx_errors": xsum(ports, ["tx_cqe_errors"]),
    }
    if len(reports) < legs:
        fail(f"{len(reports)} of {legs} pktgen runs finished")
    if any(r["rx_packets"] == 0 for r in reports):
        fail("a pktgen run received nothing: the dataplane made no progress")
    if dups:
        fail(f"{dups} duplicate frames")
    if lost != counted:
        fail(f"lost {lost} frames, the devices and l2fwd counted {counted} "
             f"({'uncounted' if lost > counted else 'counted twice'}: {abs(lost - counted)})")
        # Where to look, in the verdict itself (a CI run's log folder does not outlive it).
        detail = result.setdefault("details", []).append
        for i, r in enumerate(reports):
            detail(f"pktgen run {i + 1}: sent {r['tx_packets']}, received {r['rx_packets']}, "
                   f"lost {r['lost']}, longest gap {r.get('longest_gap')}, "
                   f"stale on its cables {xsum(r['ports'], ['wire_rx_stale'])}")
        for p in ports:
            st = p.get("stats", {})
            nonzero = {k: v for k, v in p.get("xstats", {}).items() if v}
            detail(f"l2fwd port {p['port']}: rx {p['rx_packets']}, tx {p['tx_packets']}, "
                   f"dropped {p['dropped']}, down {p['down_drops']}, recoveries {p['recoveries']}, "
                   f"imissed {st.get('imissed')}, ierrors {st.get('ierrors')}, "
                   f"oerrors {st.get('oerrors')}; xstats {nonzero}")
    in_use = [l2r["pool_in_use"]] + [r["pool_in_use"] for r in reports]
    if any(in_use):
        fail(f"pools not whole at exit (in use: l2fwd {in_use[0]}, pktgen {in_use[1:]})")
    if len(samples) >= 2:
        if samples[-1][1] != samples[0][1]:
            fail(f"l2fwd's open files went from {samples[0][1]} to {samples[-1][1]}")
        growth = samples[-1][0] - samples[0][0]
        if growth > RSS_GROWTH_LIMIT_KIB:
            fail(f"l2fwd's RSS grew {growth} KiB after the first run (limit {RSS_GROWTH_LIMIT_KIB})")
    if fake:
        live = [l for l in l2.lines if l.startswith("fake-rdma: at exit:") and "live objects" in l]
        if live != ["fake-rdma: at exit: 0 live objects"]:
            fail(f"verbs objects left: {live}")
        if result.get("resets", 0) == 0:
            fail("no device reset happened")
        if l2r["recoveries"] < result.get("resets", 0):
            fail(f"{result['resets']} resets, {l2r['recoveries']} recoveries")
    f = result["faults_seen"]
    if f["tx_errors"] == 0 or f["rx_fault_drops"] == 0 or f["rx_errors"] == 0 or (
        result["link_events"] == 0
    ):
        fail(f"the faults did not happen: {f}, link events {result['link_events']}")
    left = sorted(p.name for p in shm.iterdir())
    if left:
        fail(f"files left in PMD_SHM_DIR: {left}")
    new_huge = sorted(hugepage_files() - huge_before)
    if new_huge:
        fail(f"hugepage files left: {new_huge}")
    return result


def describe(r):
    if "sent" not in r:
        return f"{r['part']:9s} FAIL: {'; '.join(r['failures'])}"
    extra = ""
    if "resets" in r:
        extra = f", {r['link_flaps']} link flaps, {r['resets']} resets"
    f = r["faults_seen"]
    rss = r["rss_kib"]
    return (
        f"{r['part']:9s} {'ok  ' if not r['failures'] else 'FAIL'} {r['seconds']:6.1f} s, "
        f"{r['runs']} pktgen runs: sent {r['sent']}, received {r['received']}, lost {r['lost']} "
        f"(counted {r['counted']}: pktgen devices {r['pktgen_device_drops']}, l2fwd dropped "
        f"{r['l2fwd_dropped']} + down {r['l2fwd_down_drops']} + devices {r['l2fwd_device_drops']}"
        + (f"; the fake's devices {r['fake_device_drops']}" if r.get("fake_device_drops") else "")
        + "); "
        f"recoveries {r['recoveries']}, link events {r['link_events']}{extra}; "
        f"device faults: rx drops {f['rx_fault_drops']}, rx errors {f['rx_errors']}, "
        f"tx errors {f['tx_errors']}; RSS {rss[0] if rss else 0}->{rss[-1] if rss else 0} KiB, "
        f"fds {r['fds'][0] if r['fds'] else 0}->{r['fds'][-1] if r['fds'] else 0}"
        + ("" if not r["failures"] else "\n          " + "\n          ".join(r["failures"]))
        + "".join(f"\n            {d}" for d in r.get("details", []))
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("duration", type=float, nargs="?", default=600.0)
    ap.add_argument("--bin", required=True, type=Path)
    ap.add_argument("--parts", default=",".join(PARTS))
    ap.add_argument("--rate", type=int, default=20000)
    ap.add_argument("--period", type=float, default=0.5)
    ap.add_argument("--leg-seconds", type=float, default=15.0)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--inner", help=argparse.SUPPRESS)  # one fake part, inside its world
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--tag", help=argparse.SUPPRESS)  # the cables' names, set by the world
    args = ap.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    for p in parts:
        if p not in PARTS:
            sys.exit(f"soak: unknown part {p!r}: expected some of {', '.join(PARTS)}")
    if args.inner:
        r = run_part(args.inner, args.duration, args, args.bin, args.work)
        (args.work / "result.json").write_text(json.dumps(r))
        return 0
    each = args.duration / len(parts)
    # The fault cycle is as long as its period: a longer --period needs longer parts.
    least = MIN_PART_SECONDS * max(1.0, args.period / 0.5)
    if each < least:
        sys.exit(f"soak: {args.duration:g} s over {len(parts)} parts is {each:.1f} s a part: each part "
                 f"needs at least {least:g} s for every fault to take its turn while traffic "
                 f"flows (give DURATION >= {least * len(parts):g}, or fewer --parts)")
    top = Path(tempfile.mkdtemp(prefix="pmd-soak-"))
    try:
        results = run_parts(parts, each, args, top)
    except KeyboardInterrupt:
        log(f"soak: interrupted; logs in {top}")
        return 130
    return verdict(results, parts, args, top)


def run_parts(parts, each, args, top):
    results = []
    for part in parts:
        work = top / part
        work.mkdir()
        log(f"soak: {part} for {each:.0f} s ...")
        if part.startswith("emu-"):
            r = run_part(part, each, args, args.bin, work)
        else:
            tag = f"soak{os.getpid()}{part}"
            # The fake's device models cycle their faults too (error completions, drops, bad
            # keys); its link faults stay on the wire, the knobs flap the port's link.
            faults = f"faults=all,fault_period={args.period}"
            # The fake's devices open their ends of the cables in l2fwd, as pktgen does.
            (work / "shm").mkdir()
            env = dict(
                os.environ,
                PMD_SHM_DIR=str(work / "shm"),
                FAKE_RDMA_LIB=str(args.bin / "libfake_rdma.so"),
                FAKE_RDMA_PORTS=(
                    f"{part}_0/1:mac=02:00:00:00:20:01,wire=shm:{tag}-1,{faults};"
                    f"{part}_1/1:mac=02:00:00:00:20:02,wire=shm:{tag}-2,{faults}"
                ),
            )
            argv = [
                "scripts/fake-rdma.sh", sys.executable, __file__, str(each), "--bin", str(args.bin),
                "--inner", part, "--work", str(work), "--tag", tag, "--rate", str(args.rate),
                "--period", str(args.period), "--leg-seconds", str(args.leg_seconds),
            ]
            rc = subprocess.run(argv, env=env).returncode
            try:
                r = json.loads((work / "result.json").read_text())
            except OSError:
                r = {"part": part, "failures": [f"the part's run exited {rc} with no result"]}
        results.append(r)
        log(describe(r))
    return results


def verdict(results, parts, args, top):
    """Prints the one-line verdict; returns the exit status."""
    ok = all(not r["failures"] for r in results)
    sent = sum(r.get("sent", 0) for r in results)
    received = sum(r.get("received", 0) for r in results)
    lost = sum(r.get("lost", 0) for r in results)
    counted = sum(r.get("counted", 0) for r in results)
    rec = sum(r.get("recoveries", 0) for r in results)
    resets = sum(r.get("resets", 0) for r in results)
    print(
        f"soak: {'PASS' if ok else 'FAIL'}: {args.duration:.0f} s over {len(parts)} parts; sent {sent}, received "
        f"{received}, lost {lost}, counted {counted}; {rec} queue/port recoveries, {resets} "
        f"device resets; "
        + ("pools whole, no fd, file or verbs object left, RSS flat" if ok else
           "; ".join(f"{r['part']}: {f}" for r in results for f in r["failures"]))
    )
    (top / "results.json").write_text(json.dumps(results, indent=1))
    if args.keep or not ok:
        log(f"soak: logs in {top}")
    else:
        subprocess.run(["rm", "-rf", str(top)])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
