//! Fuzz target `mana_rx`: see `fuzz_harness` (tests/fuzz/harness).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_harness::device::mana_rx(data));
