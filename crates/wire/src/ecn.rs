//! ECN marking of a tenant's IPv4 frame (RFC 3168): a queue that is filling marks
//! ECN-capable packets Congestion Experienced instead of dropping them, so TCP slows down
//! without losing a segment.

use etherparse::{EtherType, Ethernet2Slice, IpEcn, Ipv4HeaderSlice};

/// Marks an untagged Ethernet/IPv4 frame CE if it is ECN-capable (ECT(0) or ECT(1)), fixing
/// the header checksum. Returns whether the frame now carries CE; frames that are not IPv4,
/// not ECN-capable, already CE or malformed are left untouched.
pub fn mark_ce(frame: &mut [u8]) -> bool {
    let Ok(eth) = Ethernet2Slice::from_slice_without_fcs(frame) else {
        return false;
    };
    if eth.ether_type() != EtherType::IPV4 {
        return false;
    }
    const ETH: usize = 14;
    let Ok(ip) = Ipv4HeaderSlice::from_slice(&frame[ETH..]) else {
        return false;
    };
    let mut header = ip.to_header();
    match header.ecn {
        IpEcn::Ect0 | IpEcn::Ect1 => {}
        IpEcn::CongestionExperienced => return true,
        IpEcn::NotEct => return false,
    }
    header.ecn = IpEcn::CongestionExperienced;
    header.header_checksum = header.calc_header_checksum();
    let len = header.header_len();
    frame[ETH..ETH + len].copy_from_slice(&header.to_bytes());
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::PacketBuilder;

    fn frame(ecn: IpEcn) -> Vec<u8> {
        let mut out = Vec::new();
        let mut ip = etherparse::Ipv4Header::new(
            8 + 4,
            64,
            etherparse::IpNumber::UDP,
            [198, 18, 0, 1],
            [198, 18, 0, 2],
        )
        .unwrap();
        ip.ecn = ecn;
        PacketBuilder::ethernet2([2; 6], [4; 6])
            .ip(etherparse::IpHeaders::Ipv4(ip, Default::default()))
            .udp(1, 2)
            .write(&mut out, &[1, 2, 3, 4])
            .unwrap();
        out
    }

    #[test]
    fn ect_becomes_ce_with_a_valid_checksum() {
        for ecn in [IpEcn::Ect0, IpEcn::Ect1] {
            let mut f = frame(ecn);
            assert!(mark_ce(&mut f));
            let ip = Ipv4HeaderSlice::from_slice(&f[14..]).unwrap().to_header();
            assert_eq!(ip.ecn, IpEcn::CongestionExperienced);
            assert_eq!(ip.header_checksum, ip.calc_header_checksum());
        }
    }

    #[test]
    fn not_ect_and_garbage_are_left_alone() {
        let mut f = frame(IpEcn::NotEct);
        let before = f.clone();
        assert!(!mark_ce(&mut f));
        assert_eq!(f, before);
        let mut junk = vec![0xffu8; 20];
        assert!(!mark_ce(&mut junk));
        assert!(!mark_ce(&mut []));
    }
}
