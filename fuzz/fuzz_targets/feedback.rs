//! See `picnic_fuzz::feedback`; run with `scripts/fuzz.sh feedback` (docs/fuzzing.md).
#![no_main]
libfuzzer_sys::fuzz_target!(|bytes: &[u8]| picnic_fuzz::feedback(bytes));
