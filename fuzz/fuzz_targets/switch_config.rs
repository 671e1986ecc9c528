//! See `picnic_fuzz::switch_config`; run with `scripts/fuzz.sh switch_config` (docs/fuzzing.md).
#![no_main]
libfuzzer_sys::fuzz_target!(|bytes: &[u8]| picnic_fuzz::switch_config(bytes));
