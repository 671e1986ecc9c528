//! See `picnic_fuzz::scenario`; run with `scripts/fuzz.sh scenario` (docs/fuzzing.md).
#![no_main]
libfuzzer_sys::fuzz_target!(|bytes: &[u8]| picnic_fuzz::scenario(bytes));
