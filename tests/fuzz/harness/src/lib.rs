//! The fuzz targets' bodies, one function per trust boundary, each taking the fuzzer's bytes.
//! `tests/fuzz/fuzz_targets/*.rs` (cargo-fuzz, libFuzzer, AddressSanitizer) call them, and
//! `tests/regressions.rs` replays every saved input through them under `cargo test`: the seed
//! corpus and every input that once found a defect.
//!
//! A function returns normally for any input; a panic (or a sanitizer report) is a defect.
//! The invariants each one checks are in its docs.

pub mod device;
pub mod input;
pub mod text;

/// A target's body: the fuzzer's bytes in, a panic on a broken invariant.
pub type Target = fn(&[u8]);

/// Every target by name, as the fuzz targets and the regression test call them.
pub const TARGETS: &[(&str, Target)] = &[
    ("net_parse", text::net_parse),
    ("devargs", text::devargs),
    ("pcap_file", text::pcap_file),
    ("shm_ring", text::shm_ring),
    ("telemetry", text::telemetry),
    ("mp_control", text::mp_control),
    ("queue_export", text::queue_export),
    ("shared_pool", text::shared_pool),
    ("mana_rx", device::mana_rx),
    ("mana_tx", device::mana_tx),
    ("mlx5_rx", device::mlx5_rx),
    ("mlx5_mprq", device::mlx5_mprq),
    ("mlx5_tx", device::mlx5_tx),
];
