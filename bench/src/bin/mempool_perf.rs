//! `mempool_perf`: DPDK's `mempool_perf_autotest` experiment on our `Mempool`.
//!
//! For every combination, each thread gets `n_keep` objects `n_get_bulk` at a time, then puts
//! them back `n_put_bulk` at a time, 65536 / `n_keep` times per round; a round counts 65536
//! objects, and the rate is objects counted / seconds (exactly as
//! `shared/bench/dpdk_mempool_perf.c` counts them). With several cores, every thread is pinned
//! to its own core, owns its own cache, and the per-thread rates are summed.

use std::process::ExitCode;
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use clap::Parser;
use mempool::{Mempool, PagePolicy, PoolCache, PoolConfig};

/// Objects counted per round (DPDK's `N`).
const N: usize = 65536;
/// Largest `n_keep` (size of the per-thread object table, as in DPDK's harness).
const MAX_KEEP: usize = 512;

#[derive(Parser, Debug)]
#[command(
    name = "mempool_perf",
    about = "DPDK's mempool_perf_autotest experiment on the mempool crate",
    long_about = "DPDK's mempool_perf_autotest experiment on the mempool crate.\n\n\
        For each row, every thread takes n_keep objects n_get_bulk at a time and puts them \
        back n_put_bulk at a time, for --seconds. The rate counts 65536 objects per round \
        (as DPDK's harness does) and is summed over cores. The pool holds 8191 objects of \
        2048 bytes, like DPDK's test.\n\n\
        Examples:\n  \
        mempool_perf                                   # all 72 rows, ~1 s each\n  \
        mempool_perf --cache 512 --cores 1 --json      # the rows DPDK's harness prints\n  \
        mempool_perf --get-bulk 32 --put-bulk 32 --keep 128 --seconds 5"
)]
struct Args {
    /// Seconds per row.
    #[arg(long, default_value_t = 1.0, value_parser = apps::cli::positive_seconds)]
    seconds: f64,

    /// Cache sizes to run (comma-separated; 0 = no cache, straight to the ring).
    #[arg(long, value_delimiter = ',', default_values_t = [512u32, 0])]
    cache: Vec<u32>,

    /// Core counts to run (comma-separated) [default: 1 and all cores].
    #[arg(long, value_delimiter = ',')]
    cores: Vec<usize>,

    /// Objects per get (comma-separated).
    #[arg(long = "get-bulk", value_delimiter = ',', default_values_t = [1usize, 4, 32])]
    get_bulk: Vec<usize>,

    /// Objects per put (comma-separated).
    #[arg(long = "put-bulk", value_delimiter = ',', default_values_t = [1usize, 4, 32])]
    put_bulk: Vec<usize>,

    /// Objects held before putting them back (comma-separated; multiples of the bulk sizes,
    /// at most 512).
    #[arg(long, value_delimiter = ',', default_values_t = [32usize, 128])]
    keep: Vec<usize>,

    /// Print one JSON object per row (keys: cache, cores, n_get_bulk, n_put_bulk, n_keep,
    /// rate_persec).
    #[arg(long)]
    json: bool,

    /// Objects in the pool.
    #[arg(long, default_value_t = 8191)]
    objects: u32,

    /// Bytes per object.
    #[arg(long, default_value_t = 2048)]
    obj_size: usize,

    /// Use normal 4 KiB pages even when hugepages are available.
    #[arg(long)]
    no_hugepages: bool,
}

/// One side of the experiment: a per-thread cache, or the pool's ring directly.
trait Bulk {
    fn get(&mut self, out: &mut [u32]) -> bool;
    fn put(&mut self, objs: &[u32]);
}

impl Bulk for PoolCache {
    #[inline(always)]
    fn get(&mut self, out: &mut [u32]) -> bool {
        self.get_bulk(out)
    }
    #[inline(always)]
    fn put(&mut self, objs: &[u32]) {
        self.put_bulk(objs)
    }
}

struct Ring<'a>(&'a Mempool);

impl Bulk for Ring<'_> {
    #[inline(always)]
    fn get(&mut self, out: &mut [u32]) -> bool {
        self.0.get_bulk(out)
    }
    #[inline(always)]
    fn put(&mut self, objs: &[u32]) {
        self.0.put_bulk(objs)
    }
}

/// The timed loop of DPDK's `per_lcore_mempool_test`; returns objects per second.
#[inline(never)]
fn run_loop<B: Bulk>(b: &mut B, gb: usize, pb: usize, keep: usize, dur: Duration) -> f64 {
    let mut objs = [0u32; MAX_KEEP];
    let mut total: u64 = 0;
    let start = Instant::now();
    while start.elapsed() < dur {
        for _ in 0..N / keep {
            for chunk in objs[..keep].chunks_exact_mut(gb) {
                if !b.get(chunk) {
                    eprintln!("mempool_perf: get of {gb} objects failed: pool exhausted");
                    std::process::exit(1);
                }
            }
            for chunk in objs[..keep].chunks_exact(pb) {
                b.put(chunk);
            }
        }
        total += N as u64;
    }
    total as f64 / start.elapsed().as_secs_f64()
}

struct Row {
    cache: u32,
    cores: usize,
    gb: usize,
    pb: usize,
    keep: usize,
}

fn run_row(pool: &Arc<Mempool>, cores: &[core_affinity::CoreId], row: &Row, dur: Duration) -> f64 {
    let barrier = Arc::new(Barrier::new(cores.len()));
    let handles: Vec<_> = cores
        .iter()
        .map(|&core| {
            let pool = Arc::clone(pool);
            let barrier = Arc::clone(&barrier);
            let (cache, gb, pb, keep) = (row.cache, row.gb, row.pb, row.keep);
            thread::spawn(move || {
                core_affinity::set_for_current(core);
                if cache > 0 {
                    let mut c = PoolCache::with_size(&pool, cache);
                    barrier.wait();
                    run_loop(&mut c, gb, pb, keep, dur)
                } else {
                    barrier.wait();
                    run_loop(&mut Ring(&pool), gb, pb, keep, dur)
                }
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("worker thread panicked"))
        .sum()
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("mempool_perf: {msg}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<(), String> {
    if !(args.seconds > 0.0 && args.seconds.is_finite()) {
        return Err(format!("--seconds must be positive, got {}", args.seconds));
    }
    let dur = Duration::from_secs_f64(args.seconds);
    let all_cores = core_affinity::get_core_ids().unwrap_or_default();
    if all_cores.is_empty() {
        return Err("cannot list this machine's cores".into());
    }
    let mut core_counts = if args.cores.is_empty() {
        vec![1, all_cores.len()]
    } else {
        args.cores.clone()
    };
    core_counts.dedup();
    for &c in &core_counts {
        if c == 0 || c > all_cores.len() {
            return Err(format!(
                "--cores {c}: this machine has {} cores",
                all_cores.len()
            ));
        }
    }
    for &keep in &args.keep {
        if keep == 0 || keep > MAX_KEEP {
            return Err(format!("--keep {keep}: must be between 1 and {MAX_KEEP}"));
        }
        for &b in args.get_bulk.iter().chain(&args.put_bulk) {
            if b == 0 || keep % b != 0 {
                return Err(format!("--keep {keep} is not a multiple of bulk size {b}"));
            }
        }
    }
    let policy = if args.no_hugepages {
        PagePolicy::Normal
    } else {
        PagePolicy::Auto
    };

    let mut first = true;
    for &cache in &args.cache {
        let cfg = PoolConfig::new(format!("perf_cache{cache}"), args.objects, args.obj_size)
            .cache_size(cache)
            .page_policy(policy);
        let pool = Mempool::new(cfg).map_err(|e| e.to_string())?;
        if !args.json && first {
            println!(
                "mempool_perf: {} objects of {} bytes on {} pages, {:.1} s per row; rate = \
                 objects per second (65536 per round, summed over cores)",
                pool.capacity(),
                pool.obj_size(),
                pool.page_size(),
                args.seconds
            );
            println!(
                "{:>5} {:>5} {:>10} {:>10} {:>6} {:>16}",
                "cache", "cores", "n_get_bulk", "n_put_bulk", "n_keep", "rate_persec"
            );
            first = false;
        }
        for &cores in &core_counts {
            for &keep in &args.keep {
                for &gb in &args.get_bulk {
                    for &pb in &args.put_bulk {
                        let row = Row {
                            cache,
                            cores,
                            gb,
                            pb,
                            keep,
                        };
                        let rate = run_row(&pool, &all_cores[..cores], &row, dur);
                        if pool.available() != pool.capacity() {
                            return Err(format!(
                                "after the row, {} of {} objects are missing",
                                pool.capacity() - pool.available(),
                                pool.capacity()
                            ));
                        }
                        print_row(args.json, &row, rate);
                    }
                }
            }
        }
    }
    Ok(())
}

fn print_row(json: bool, r: &Row, rate: f64) {
    if json {
        let v = serde_json::json!({
            "cache": r.cache,
            "cores": r.cores,
            "n_get_bulk": r.gb,
            "n_put_bulk": r.pb,
            "n_keep": r.keep,
            "rate_persec": rate.round() as u64,
        });
        println!("{v}");
    } else {
        println!(
            "{:>5} {:>5} {:>10} {:>10} {:>6} {:>16}",
            r.cache,
            r.cores,
            r.gb,
            r.pb,
            r.keep,
            rate.round() as u64
        );
    }
}
