#!/usr/bin/env python3
"""Where the time of the timed burst calls goes: perf samples with call chains, every frame
resolved through inlining.

  profile.py PERF_DATA BINARY      (PERF_DATA from `perf record --call-graph dwarf`)

Each frame of each sample (symbol + offset, from `perf script`) is resolved with
`addr2line -f -i` into its chain of inlined functions. A sample counts when some frame's chain
holds the driver's burst call (ours: `datapath_call_tx` / `datapath_call_rx` and the `tx_burst` /
`rx_burst` inlined into them; DPDK's: `mana_tx_burst` / `mana_rx_burst` / `mlx5_rx_burst` /
`mlx5_rx_burst_vec` / `mlx5_tx_burst_*`); the harness and the device double are left out.
Prints the share of those samples by innermost function (self) and by any function on any
frame (inclusive). With debug = "line-tables-only" the inlined frames of the Rust build carry
bare names (`post`, `build_wqe`); the file is given beside each name.
"""
import collections
import re
import glob
import shutil
import subprocess
import sys

# binutils' addr2line names the innermost inlined frame of Rust's line-tables-only debug info
# after the symbol; llvm-addr2line (clang's LLVM) gets it right.
ADDR2LINE = shutil.which("llvm-addr2line") or (sorted(glob.glob("/usr/lib/llvm-*/bin/llvm-addr2line")) or ["addr2line"])[-1]

BURST = re.compile(r"(^|::)(datapath_call_tx|datapath_call_rx|tx_burst|rx_burst|mana_tx_burst|mana_rx_burst|mlx5_rx_burst|mlx5_rx_burst_vec|mlx5_tx_burst_\w+)$")
FRAME = re.compile(r"\s*([0-9a-f]+)\s+(\S+?)(?:\+0x([0-9a-f]+))?\s+\((.*)\)\s*$")


def main() -> None:
    data, binary = sys.argv[1], sys.argv[2]
    base = binary.split("/")[-1]
    out = subprocess.run(["perf", "script", "-i", data, "-F", "ip,sym,symoff,dso", "--no-demangle", "--no-inline"],
                         capture_output=True, text=True, check=True).stdout
    syms = {}
    for line in subprocess.run(["nm", "--defined-only", binary], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        parts = line.split()
        if len(parts) == 3:
            syms.setdefault(parts[2], int(parts[0], 16))
    samples = []  # list of frames: (file address or None, symbol, dso)
    cur = []
    for line in out.splitlines() + [""]:
        if not line.strip():
            if cur:
                samples.append(cur)
                cur = []
            continue
        m = FRAME.match(line)
        if not m:
            continue
        sym, off, dso = m.group(2), int(m.group(3) or "0", 16), m.group(4)
        addr = None
        if dso.endswith("/" + base) and sym in syms:
            addr = syms[sym] + off
            if cur:  # a return address: resolve the call instruction
                addr -= 1
        cur.append((addr, sym, dso))
    addrs = sorted({a for s in samples for a, _, _ in s if a is not None})
    chains = {}
    for i in range(0, len(addrs), 2000):
        part = addrs[i:i + 2000]
        res = subprocess.run([ADDR2LINE, "-f", "-i", "-C", "-a", "-e", binary] + [hex(a) for a in part],
                             capture_output=True, text=True, check=True).stdout.splitlines()
        j, at = 0, None
        while j < len(res):
            if res[j].startswith("0x") and (j + 1 >= len(res) or not res[j + 1].startswith("0x")):
                at = int(res[j], 16)
                chains[at] = []
                j += 1
                continue
            fn, src = re.sub(r"::h[0-9a-f]{16}$", "", res[j]), res[j + 1] if j + 1 < len(res) else "?"
            chains[at].append((fn, src.split(" (")[0].split("/")[-1].split(":")[0]))
            j += 2
    self_c = collections.Counter()
    incl = collections.Counter()
    kept = 0
    for s in samples:
        frame_keys = []
        hit = False
        for a, sym, dso in s:
            if a is None:
                keys = [(sym, dso.split("/")[-1])]
            else:
                keys = chains.get(a, [(sym, "?")])
            hit |= any(BURST.search(fn) for fn, _ in keys)
            frame_keys.append(keys)
        if not hit:
            continue
        kept += 1
        fn, f = frame_keys[0][0]
        self_c[f"{fn}  [{f}]"] += 1
        for k in {f"{fn}  [{f}]" for keys in frame_keys for fn, f in keys}:
            incl[k] += 1
    print(f"{len(samples)} samples; {kept} inside the burst calls ({100.0 * kept / max(len(samples), 1):.1f}%)")
    print()
    print("self (innermost inlined function), % of burst samples:")
    for k, n in self_c.most_common(30):
        print(f"  {100.0 * n / max(kept, 1):5.1f}%  {k}")
    print()
    print("inclusive (anywhere on the call/inline chain), % of burst samples:")
    for k, n in incl.most_common(40):
        print(f"  {100.0 * n / max(kept, 1):5.1f}%  {k}")


if __name__ == "__main__":
    main()
