//! Fuzz target `mp_control`: see `fuzz_harness` (tests/fuzz/harness).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_harness::text::mp_control(data));
