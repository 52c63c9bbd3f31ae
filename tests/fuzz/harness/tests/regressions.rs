//! Replays every saved input of every fuzz target under `cargo test`: the seed corpus
//! (`tests/fuzz/seeds/TARGET/`) and every input that once found a defect
//! (`tests/fuzz/regressions/TARGET/`, named after the defect). Then a short deterministic
//! walk of pseudo-random inputs per target, so that `cargo test` alone (no nightly, no
//! libFuzzer) still drives each boundary with inputs nobody chose.

use std::path::{Path, PathBuf};

fn dir(kind: &str, target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(kind)
        .join(target)
}

fn files(d: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = match std::fs::read_dir(d) {
        Ok(rd) => rd
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

#[test]
fn every_target_has_seeds_and_every_saved_input_passes() {
    for (name, f) in fuzz_harness::TARGETS {
        let seeds = files(&dir("seeds", name));
        assert!(
            !seeds.is_empty(),
            "no seeds for {name} in {}",
            dir("seeds", name).display()
        );
        for p in seeds.iter().chain(&files(&dir("regressions", name))) {
            let data = std::fs::read(p).unwrap();
            eprintln!("{name}: {}", p.display());
            f(&data);
        }
    }
}

/// xorshift64*: the same inputs on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
fn pseudo_random_inputs_keep_every_invariant() {
    for (i, (name, f)) in fuzz_harness::TARGETS.iter().enumerate() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (i as u64 + 1));
        // Seeds mutated: a few bytes changed, or cut short.
        let seeds: Vec<Vec<u8>> = files(&dir("seeds", name))
            .iter()
            .map(|p| std::fs::read(p).unwrap())
            .collect();
        for round in 0..300 {
            let mut data = if round % 2 == 0 && !seeds.is_empty() {
                seeds[rng.next() as usize % seeds.len()].clone()
            } else {
                let n = rng.next() as usize % 2048;
                (0..n).map(|_| rng.next() as u8).collect()
            };
            if !data.is_empty() {
                for _ in 0..rng.next() % 8 {
                    let at = rng.next() as usize % data.len();
                    data[at] = rng.next() as u8;
                }
                if rng.next().is_multiple_of(4) {
                    data.truncate(rng.next() as usize % data.len());
                }
            }
            let r = std::panic::catch_unwind(|| f(&data));
            if r.is_err() {
                let path = std::env::temp_dir().join(format!("fuzz-{name}-{round}.bin"));
                std::fs::write(&path, &data).unwrap();
                panic!(
                    "{name}: round {round} failed; input saved to {}",
                    path.display()
                );
            }
        }
    }
}
