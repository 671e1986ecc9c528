//! See `picnic_fuzz::wire`; run with `scripts/fuzz.sh wire` (docs/fuzzing.md).
#![no_main]
libfuzzer_sys::fuzz_target!(|bytes: &[u8]| picnic_fuzz::wire(bytes));
