//! `datapath`: what one driver burst call costs per packet when the NIC costs nothing.
//!
//! On real hardware the device's work is free to the CPU, so the driver's own instructions
//! are what a core pays per packet. Here the drivers (`pmd::mana` and `pmd::mlx5` queues, the
//! project's own code built with the workspace's release profile) run over queue memory this
//! program owns, and a device double plays the NIC between the timed calls, untimed: it
//! completes what a TX burst posted and fills what an RX queue posted (`mana.rs`, `mlx5.rs`).
//! The same doubles are written in C around DPDK's own burst functions
//! (`bench/datapath/c/`), so `bench/compare_datapath.sh` can put both drivers side by side.
//!
//! Timed: the driver call alone, between two `lfence; rdtsc; lfence` (the C harness uses the
//! same sequence). Everything the call does is in it: TX reclaims earlier completions and
//! frees those mbufs; RX delivers mbufs, allocates and posts replacements, rings doorbells.
//! Not timed: filling TX mbufs, the double, freeing received mbufs.
//!
//! Every timed call goes through [`datapath_call_tx`] or [`datapath_call_rx`] (never
//! inlined), so `valgrind --tool=callgrind --toggle-collect='*datapath_call*'` counts the
//! driver's instructions only; [`datapath_measure_start`] runs once between the warm-up and
//! the measured bursts, so `--zero-before='*datapath_measure_start*'` leaves the warm-up out
//! (`bench/datapath_instructions.sh`).
//!
//! Prints one `RESULT` line per path (TSC ticks per packet; `bench/datapath/summarize.py`
//! reads them) and `INFO` lines on stderr.

use clap::{Parser, ValueEnum};
use mempool::{lcache, ChunkKeys, MbufPool, MbufPoolConfig, Registration};
use pmd::ethdev::{Burst, RxBurst, TxBurst};
use pmd::sys::DevMem;
use std::hint::black_box;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod mana;
mod mlx5;

/// Descriptors per queue (DPDK's MANA default).
pub(crate) const RING: u16 = 256;
/// Packets per burst.
pub(crate) const BURST: usize = 32;
/// The memory key of every pool chunk (one stand-in registration).
pub(crate) const LKEY: u32 = 0x00ab_cdef;
/// The RSS hash the RX doubles report.
pub(crate) const RX_HASH: u32 = 0x9e37_79b9;
const POOL_MBUFS: u32 = 8192;

/// A 60-byte UDP/IPv4 frame with right IP and UDP checksums (64 bytes on the wire with the FCS).
pub(crate) const FRAME: [u8; 60] = [
    0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x00, 0x00, 0x00, 0xaa, 0x01, 0x08, 0x00, 0x45, 0x00,
    0x00, 0x2e, 0x00, 0x00, 0x00, 0x00, 0x40, 0x11, 0x24, 0xc0, 0xa9, 0xfe, 0x01, 0x01, 0xa9, 0xfe,
    0x01, 0x02, 0x04, 0x00, 0x23, 0x28, 0x00, 0x1a, 0x3a, 0x41, 0x00, 0x01, 0x02, 0x03, 0x04, 0x05,
    0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x11,
];

/// One measured datapath.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Path {
    /// MANA TX.
    #[value(name = "tx")]
    ManaTx,
    /// MANA RX, one RX_OKAY CQE per packet.
    #[value(name = "rx")]
    ManaRx,
    /// MANA RX, one RX_COALESCED_4 CQE per four packets.
    #[value(name = "rxc")]
    ManaRxCoalesced,
    /// mlx5 TX, eMPW WQEs (min_inline 0).
    #[value(name = "m5tx")]
    Mlx5TxEmpw,
    /// mlx5 TX, one SEND WQE per packet (min_inline 18: no eMPW).
    #[value(name = "m5tx-send")]
    Mlx5TxSend,
    /// mlx5 RX, cyclic RQ, one CQE per packet.
    #[value(name = "m5rx")]
    Mlx5Rx,
    /// mlx5 RX, cyclic RQ, compressed CQE sessions (HASH minis).
    #[value(name = "m5rx-cqz")]
    Mlx5RxCqz,
    /// mlx5 RX, multi-packet (striding) RQ, one CQE per packet.
    #[value(name = "m5rx-mprq")]
    Mlx5RxMprq,
    /// mlx5 RX, multi-packet RQ, compressed CQE sessions (CSUM_STRIDX minis).
    #[value(name = "m5rx-mprq-cqz")]
    Mlx5RxMprqCqz,
}

impl Path {
    /// The name in `RESULT` lines (the DPDK harnesses print the same names).
    fn result_name(self) -> &'static str {
        match self {
            Path::ManaTx => "mana_tx",
            Path::ManaRx => "mana_rx",
            Path::ManaRxCoalesced => "mana_rx_coalesced4",
            Path::Mlx5TxEmpw => "mlx5_tx_empw",
            Path::Mlx5TxSend => "mlx5_tx_send",
            Path::Mlx5Rx => "mlx5_rx",
            Path::Mlx5RxCqz => "mlx5_rx_cqz",
            Path::Mlx5RxMprq => "mlx5_rx_mprq",
            Path::Mlx5RxMprqCqz => "mlx5_rx_mprq_cqz",
        }
    }
}

/// Per-packet cost of the MANA and mlx5 burst calls over a zero-cost device double. Prints
/// one RESULT line per path, in TSC ticks per packet.
#[derive(Parser, Debug)]
#[command(version)]
struct Args {
    /// Timed bursts of 32 packets per path.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u32).range(1..))]
    bursts: u32,
    /// Untimed bursts before them, per path.
    #[arg(long, default_value_t = 20_000)]
    warmup: u32,
    /// Paths to measure, in order.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "tx,rx,rxc,m5tx,m5tx-send,m5rx,m5rx-cqz,m5rx-mprq,m5rx-mprq-cqz"
    )]
    paths: Vec<Path>,
    /// NDIS hash type the MANA RX double reports (hex). 0x1b6 is the L4 group, which both
    /// drivers turn into a delivered RSS hash.
    #[arg(long, default_value = "0x1b6", value_parser = parse_hex)]
    hash_type: u32,
    /// Use a pool shared between processes (a file in this directory, removed at the end):
    /// what a multi-process dataplane uses, whose objects carry their owner's tag.
    #[arg(long)]
    shared_pool: Option<std::path::PathBuf>,
}

fn parse_hex(s: &str) -> Result<u32, String> {
    u32::from_str_radix(s.trim_start_matches("0x"), 16).map_err(|e| format!("{s}: {e}"))
}

/// `lfence; rdtsc; lfence`: the same instruction sequence as the C harness's.
#[inline(always)]
fn rdtsc() -> u64 {
    let lo: u32;
    let hi: u32;
    // SAFETY: `lfence` and `rdtsc` read the time-stamp counter into eax/edx and touch no
    // memory; without `nomem` the asm is also a compiler barrier, so no memory access of the
    // timed call moves across it.
    unsafe {
        std::arch::asm!(
            "lfence", "rdtsc", "lfence",
            out("eax") lo, out("edx") hi,
            options(nostack)
        );
    }
    (u64::from(hi) << 32) | u64::from(lo)
}

/// TSC ticks per second, against the monotonic clock over 200 ms.
fn tsc_hz() -> f64 {
    let (t0, c0) = (Instant::now(), rdtsc());
    std::thread::sleep(Duration::from_millis(200));
    let (c1, dt) = (rdtsc(), t0.elapsed());
    (c1 - c0) as f64 / dt.as_secs_f64()
}

/// Zero-filled queue memory of `len` bytes (anonymous 4 KiB pages).
pub(crate) fn anon(len: usize) -> Arc<DevMem> {
    Arc::new(DevMem::anon(len).expect("queue memory"))
}

/// Copies the frame into a buffer the driver posted.
///
/// # Safety
/// `addr..addr + 60` must be a posted receive buffer (an mbuf's data room of this program's
/// pool) that nothing else reads or writes until the driver delivers it.
pub(crate) unsafe fn dma_frame(addr: u64) {
    // SAFETY: the caller guarantees the destination is a posted, otherwise untouched buffer of
    // at least 60 bytes; FRAME is a distinct constant.
    unsafe { std::ptr::copy_nonoverlapping(FRAME.as_ptr(), addr as usize as *mut u8, FRAME.len()) };
}

// ------------------------------------------------------------------------------------------
// The timed calls: one non-inlined function per direction (callgrind's toggle pattern).

/// The timed TX call: the driver's `tx_burst`, nothing else.
#[inline(never)]
pub(crate) fn datapath_call_tx<Q: TxBurst>(q: &mut Q, pkts: &mut Burst) -> usize {
    q.tx_burst(pkts)
}

/// The timed RX call: the driver's `rx_burst`, nothing else.
#[inline(never)]
pub(crate) fn datapath_call_rx<Q: RxBurst>(q: &mut Q, out: &mut Burst) -> usize {
    q.rx_burst(out)
}

/// Called once per path between the warm-up and the measured bursts: callgrind's
/// `--zero-before` hook.
#[inline(never)]
fn datapath_measure_start(bursts: u32) {
    black_box(bursts);
}

/// Burst counts of one path's run.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    pub warm: u32,
    pub bursts: u32,
}

impl Plan {
    fn total(self) -> u32 {
        self.warm + self.bursts
    }
}

/// Runs `plan` TX bursts of fresh 60-byte frames through `q`, timing each call; `device`
/// plays the NIC after each one.
pub(crate) fn time_tx<Q: TxBurst>(
    q: &mut Q,
    pool: &Arc<MbufPool>,
    plan: Plan,
    mut device: impl FnMut(),
) -> Stats {
    let mut out = Burst::with_capacity(BURST);
    let mut ticks = Vec::with_capacity(plan.bursts as usize);
    for i in 0..plan.total() {
        if i == plan.warm {
            datapath_measure_start(plan.bursts);
        }
        while out.spare() > 0 {
            let mut m = lcache::alloc(pool).expect("mbuf");
            m.extend_from_slice(&FRAME).expect("room");
            out.push(m).expect("spare");
        }
        let t0 = rdtsc();
        let n = datapath_call_tx(q, black_box(&mut out));
        let t1 = rdtsc();
        assert_eq!(n, BURST, "tx_burst took {n} (burst {i})");
        device();
        if i >= plan.warm {
            ticks.push((t1 - t0) as u32);
        }
    }
    Stats { ticks }
}

/// Runs `plan` RX bursts on `q`, timing each call; `device` plays the NIC before each one;
/// the first packet of the first and of the first measured burst must be the frame with the
/// double's hash.
pub(crate) fn time_rx<Q: RxBurst>(
    q: &mut Q,
    pool: &Arc<MbufPool>,
    plan: Plan,
    check_hash: bool,
    mut device: impl FnMut(),
) -> Stats {
    let mut inb = Burst::with_capacity(BURST);
    let mut ticks = Vec::with_capacity(plan.bursts as usize);
    for i in 0..plan.total() {
        if i == plan.warm {
            datapath_measure_start(plan.bursts);
        }
        device();
        let t0 = rdtsc();
        let n = datapath_call_rx(q, black_box(&mut inb));
        let t1 = rdtsc();
        assert_eq!(n, BURST, "rx_burst gave {n} (burst {i})");
        if i == 0 || i == plan.warm {
            let m = &inb.as_slice()[0];
            assert!(
                m.data() == FRAME,
                "burst {i}: the first packet differs from the frame"
            );
            assert!(
                !check_hash || m.rss_hash() == RX_HASH,
                "burst {i}: hash not delivered"
            );
        }
        lcache::with_cache(pool, |c| inb.free_all(c));
        if i >= plan.warm {
            ticks.push((t1 - t0) as u32);
        }
    }
    Stats { ticks }
}

/// The timed calls of one path, in TSC ticks per burst.
pub(crate) struct Stats {
    ticks: Vec<u32>,
}

impl Stats {
    /// Prints the path's `RESULT` line (the C harnesses print the same fields).
    fn report(mut self, path: &str, hz: f64) {
        let n = self.ticks.len();
        let total: u64 = self.ticks.iter().map(|&t| u64::from(t)).sum();
        let pkts = (n * BURST) as u64;
        self.ticks.sort_unstable();
        // Bursts over 10x the median were interrupted or preempted: left out of the trimmed mean.
        let limit = 10 * u64::from(self.ticks[(n - 1) / 2]);
        let (kept_sum, kept) = self
            .ticks
            .iter()
            .map(|&t| u64::from(t))
            .filter(|&t| t <= limit)
            .fold((0u64, 0usize), |(s, k), t| (s + t, k + 1));
        let trim = kept_sum as f64 / (kept * BURST) as f64;
        let q = |f: f64| f64::from(self.ticks[((n - 1) as f64 * f) as usize]) / BURST as f64;
        println!(
            "RESULT side=ours path={path} bursts={n} pkts={pkts} trim_cyc_pkt={trim:.3} trimmed_bursts={} mean_cyc_pkt={:.3} med_cyc_pkt={:.3} p10_cyc_pkt={:.3} p90_cyc_pkt={:.3} p99_cyc_pkt={:.3} max_cyc_pkt={:.3} tsc_hz={hz:.0}",
            n - kept,
            total as f64 / pkts as f64,
            q(0.5),
            q(0.1),
            q(0.9),
            q(0.99),
            q(1.0),
        );
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut cfg = MbufPoolConfig::new("datapath", POOL_MBUFS);
    let shared = args
        .shared_pool
        .as_ref()
        .map(|d| d.join(format!("datapath-pool-{}", std::process::id())));
    if let Some(f) = &shared {
        cfg = cfg.shared_file(f);
    }
    let pool = match MbufPool::new(cfg) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("datapath: mbuf pool: {e}");
            return ExitCode::FAILURE;
        }
    };
    let keys: ChunkKeys = match pool.register_chunks(|_| Ok(Registration::new(mempool::Lkey(LKEY))))
    {
        Ok(k) => k,
        Err(e) => {
            eprintln!("datapath: registering the pool: {e}");
            return ExitCode::FAILURE;
        }
    };
    let hz = tsc_hz();
    let plan = Plan {
        warm: args.warmup,
        bursts: args.bursts,
    };
    for &p in &args.paths {
        let stats = match p {
            Path::ManaTx => mana::run_tx(&pool, &keys, plan),
            Path::ManaRx => mana::run_rx(&pool, &keys, plan, false, args.hash_type),
            Path::ManaRxCoalesced => mana::run_rx(&pool, &keys, plan, true, args.hash_type),
            Path::Mlx5TxEmpw => mlx5::run_tx(&pool, &keys, plan, 0),
            Path::Mlx5TxSend => mlx5::run_tx(&pool, &keys, plan, 18),
            Path::Mlx5Rx => mlx5::run_rx(&pool, &keys, plan, false),
            Path::Mlx5RxCqz => mlx5::run_rx(&pool, &keys, plan, true),
            Path::Mlx5RxMprq => mlx5::run_rx_mprq(&pool, plan, false),
            Path::Mlx5RxMprqCqz => mlx5::run_rx_mprq(&pool, plan, true),
        };
        stats.report(p.result_name(), hz);
    }
    lcache::flush();
    if let Some(f) = &shared {
        let _ = std::fs::remove_file(f);
    }
    ExitCode::SUCCESS
}
