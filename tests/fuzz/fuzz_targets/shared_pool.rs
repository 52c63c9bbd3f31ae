//! Fuzz target `shared_pool`: see `fuzz_harness` (tests/fuzz/harness).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_harness::text::shared_pool(data));
