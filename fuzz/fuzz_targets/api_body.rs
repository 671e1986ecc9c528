//! See `picnic_fuzz::api_body`; run with `scripts/fuzz.sh api_body` (docs/fuzzing.md).
#![no_main]
libfuzzer_sys::fuzz_target!(|bytes: &[u8]| picnic_fuzz::api_body(bytes));
