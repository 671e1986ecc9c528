//! Feeds arbitrary bytes to every parser of picnic-wire; any panic is a bug.
//!
//! Run (nightly): `cd crates/wire/fuzz && cargo +nightly fuzz run parse_any`

#![no_main]

use libfuzzer_sys::fuzz_target;
use picnic_wire::{classify, decap, FeedbackOption, GenevePacket, GeneveRepr};

fuzz_target!(|bytes: &[u8]| {
    if let Ok(packet) = GenevePacket::new_checked(bytes) {
        assert!(packet.header_len() <= bytes.len());
        let _ = (
            packet.vni(),
            packet.protocol(),
            packet.oam(),
            packet.critical(),
        );
        let options_len: usize = packet.options().map(|o| 4 + o.data.len()).sum();
        assert_eq!(8 + options_len, packet.header_len());
        if let Ok(repr) = GeneveRepr::parse(&packet) {
            // What we parse, we can emit, and it parses back the same.
            let mut out = [0u8; 64];
            let len = repr.emit(&mut out).expect("a parsed header fits 64 bytes");
            let again = GenevePacket::new_checked(&out[..len]).expect("emitted header checks");
            assert_eq!(GeneveRepr::parse(&again), Ok(repr));
        }
    }
    let _ = FeedbackOption::parse(bytes);
    if let Ok(decapped) = decap(bytes) {
        let _ = classify(decapped.inner);
    }
    if let Ok(summary) = classify(bytes) {
        let _ = summary.flow_hash();
    }
});
