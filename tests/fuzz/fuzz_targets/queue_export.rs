//! Fuzz target `queue_export`: see `fuzz_harness` (tests/fuzz/harness).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_harness::text::queue_export(data));
