//! Checked against etherparse's own checksum code (an independent implementation) and a
//! naive RFC 1071 sum.

use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use proptest::prelude::*;

use super::*;

const SRC4: [u8; 4] = [198, 18, 0, 1];
const DST4: [u8; 4] = [198, 18, 0, 2];
const SRC6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
const DST6: [u8; 16] = [0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
const MAC_A: [u8; 6] = [2, 0, 0, 0, 0, 1];
const MAC_B: [u8; 6] = [2, 0, 0, 0, 0, 2];

fn payload(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
}

/// The RFC 1071 sum, one big-endian word at a time.
fn naive_sum(data: &[u8]) -> u16 {
    let mut s: u64 = 0;
    for pair in data.chunks(2) {
        s += u64::from(pair[0]) << 8 | pair.get(1).map_or(0, |&b| u64::from(b));
    }
    fold(s)
}

/// A TCP super-frame (Ethernet + IP + TCP with 12 option bytes) carrying `n` payload bytes,
/// IPv4 id 0xfffe (so the per-segment ids wrap), flags ACK|PSH|FIN|CWR.
fn tcp_super(v6: bool, seq: u32, n: usize) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(MAC_A, MAC_B);
    let b = if v6 {
        b.ipv6(SRC6, DST6, 64)
    } else {
        b.ipv4(SRC4, DST4, 64)
    };
    let b = b
        .tcp(40000, 5201, seq, 512)
        .ack(77)
        .psh()
        .fin()
        .cwr()
        .options_raw(&[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2])
        .unwrap();
    let mut out = Vec::new();
    b.write(&mut out, &payload(n)).unwrap();
    if !v6 {
        out[18..20].copy_from_slice(&0xfffe_u16.to_be_bytes());
    }
    out
}

fn udp_super(v6: bool, n: usize) -> Vec<u8> {
    let b = PacketBuilder::ethernet2(MAC_A, MAC_B);
    let b = if v6 {
        b.ipv6(SRC6, DST6, 64)
    } else {
        b.ipv4(SRC4, DST4, 64)
    };
    let mut out = Vec::new();
    b.udp(4000, 53).write(&mut out, &payload(n)).unwrap();
    out
}

fn gso(gso: GsoType, gso_size: u16) -> VnetHdr {
    VnetHdr {
        needs_csum: true,
        gso,
        gso_size,
        ..VnetHdr::NONE
    }
}

fn segment_all(frame: &[u8], hdr: &VnetHdr, max_frame: usize) -> Vec<Vec<u8>> {
    let mut s = Segmenter::new(frame, hdr, max_frame).unwrap();
    let expected = s.remaining();
    let mut out = Vec::new();
    let mut buf = vec![0u8; max_frame];
    while let Some(n) = s.next_into(frame, &mut buf).unwrap() {
        assert!(
            n <= max_frame,
            "segment of {n} bytes over the limit {max_frame}"
        );
        out.push(buf[..n].to_vec());
    }
    assert_eq!(out.len(), expected, "remaining() predicted the count");
    assert_eq!(s.next_into(frame, &mut buf), Ok(None));
    out
}

/// What a segment says, every checksum verified with etherparse.
struct Seg {
    ip_id: Option<u16>,
    seq: u32,
    fin: bool,
    psh: bool,
    cwr: bool,
    ack: bool,
    payload: Vec<u8>,
}

fn check_tcp(seg: &[u8]) -> Seg {
    let p = SlicedPacket::from_ethernet(seg).unwrap();
    let Some(TransportSlice::Tcp(tcp)) = p.transport else {
        panic!("not TCP")
    };
    let header = tcp.to_header();
    let (expected, ip_id) = match p.net.unwrap() {
        NetSlice::Ipv4(ip) => {
            let h = ip.header().to_header();
            assert_eq!(h.total_len as usize, seg.len() - 14, "IPv4 total length");
            assert_eq!(h.calc_header_checksum(), h.header_checksum, "IPv4 checksum");
            (
                header.calc_checksum_ipv4(&h, tcp.payload()).unwrap(),
                Some(h.identification),
            )
        }
        NetSlice::Ipv6(ip) => {
            let h = ip.header().to_header();
            assert_eq!(h.payload_length as usize, seg.len() - 54, "IPv6 length");
            (header.calc_checksum_ipv6(&h, tcp.payload()).unwrap(), None)
        }
        NetSlice::Arp(_) => panic!("arp"),
    };
    assert_eq!(tcp.checksum(), expected, "TCP checksum");
    assert_eq!(tcp.options(), &[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]);
    Seg {
        ip_id,
        seq: tcp.sequence_number(),
        fin: tcp.fin(),
        psh: tcp.psh(),
        cwr: tcp.cwr(),
        ack: tcp.ack(),
        payload: tcp.payload().to_vec(),
    }
}

fn check_udp(seg: &[u8]) -> (Option<u16>, Vec<u8>) {
    let p = SlicedPacket::from_ethernet(seg).unwrap();
    let Some(TransportSlice::Udp(udp)) = p.transport else {
        panic!("not UDP")
    };
    assert_eq!(
        udp.length() as usize,
        seg.len() - udp_offset(seg),
        "UDP length"
    );
    let header = udp.to_header();
    let (expected, id) = match p.net.unwrap() {
        NetSlice::Ipv4(ip) => {
            let h = ip.header().to_header();
            assert_eq!(h.total_len as usize, seg.len() - 14);
            assert_eq!(h.calc_header_checksum(), h.header_checksum);
            (
                header.calc_checksum_ipv4(&h, udp.payload()).unwrap(),
                Some(h.identification),
            )
        }
        NetSlice::Ipv6(ip) => {
            let h = ip.header().to_header();
            assert_eq!(h.payload_length as usize, seg.len() - 54);
            (header.calc_checksum_ipv6(&h, udp.payload()).unwrap(), None)
        }
        NetSlice::Arp(_) => panic!("arp"),
    };
    assert_eq!(udp.checksum(), expected, "UDP checksum");
    (id, udp.payload().to_vec())
}

fn udp_offset(seg: &[u8]) -> usize {
    if seg[12..14] == [0x08, 0x00] {
        14 + usize::from(seg[14] & 0x0f) * 4
    } else {
        54
    }
}

#[test]
fn tcp_v4_super_frame_becomes_mss_segments_with_headers_fixed_up() {
    let frame = tcp_super(false, 0xffff_f000, 10_000);
    let segs = segment_all(&frame, &gso(GsoType::TcpV4, 1448), 1514);
    // 10000 = 6 * 1448 + 1312.
    assert_eq!(segs.len(), 7);
    let mut data = Vec::new();
    for (i, s) in segs.iter().enumerate() {
        let last = i == segs.len() - 1;
        let seg = check_tcp(s);
        assert_eq!(s.len(), if last { 14 + 20 + 32 + 1312 } else { 1514 });
        assert_eq!(
            seg.seq,
            0xffff_f000_u32.wrapping_add(i as u32 * 1448),
            "sequence numbers advance (and wrap) with the payload"
        );
        assert_eq!(
            seg.ip_id,
            Some(0xfffe_u16.wrapping_add(i as u16)),
            "ids count up"
        );
        assert_eq!((seg.fin, seg.psh), (last, last), "FIN/PSH on the last only");
        assert_eq!(seg.cwr, i == 0, "CWR on the first only");
        assert!(seg.ack);
        data.extend_from_slice(&seg.payload);
    }
    assert_eq!(data, payload(10_000), "payload intact, in order");
}

#[test]
fn tcp_v6_super_frame_is_segmented_too() {
    let frame = tcp_super(true, 1, 4000);
    let segs = segment_all(&frame, &gso(GsoType::TcpV6, 1000), 1514);
    assert_eq!(segs.len(), 4);
    let mut data = Vec::new();
    for (i, s) in segs.iter().enumerate() {
        let seg = check_tcp(s);
        assert_eq!(seg.seq, 1 + 1000 * i as u32);
        assert_eq!(seg.ip_id, None);
        assert_eq!(seg.fin, i == 3);
        data.extend_from_slice(&seg.payload);
    }
    assert_eq!(data, payload(4000));
}

#[test]
fn tcp_segments_shrink_to_the_port_limit_when_the_vm_mss_is_too_big() {
    // A VM whose MTU ignores the overlay: 1448-byte segments would not fit 1444-byte frames.
    let frame = tcp_super(false, 7, 5000);
    let limit = 1514 - 70;
    let segs = segment_all(&frame, &gso(GsoType::TcpV4, 1448), limit);
    let mss = limit - 66;
    assert_eq!(segs.len(), 5000usize.div_ceil(mss));
    let mut data = Vec::new();
    for (i, s) in segs.iter().enumerate() {
        let seg = check_tcp(s);
        assert_eq!(seg.seq, 7 + (i * mss) as u32);
        data.extend_from_slice(&seg.payload);
    }
    assert_eq!(data, payload(5000));
}

#[test]
fn udp_l4_super_frame_becomes_datagrams_of_gso_size() {
    for v6 in [false, true] {
        let frame = udp_super(v6, 3000);
        let segs = segment_all(&frame, &gso(GsoType::UdpL4, 1200), 1514);
        assert_eq!(segs.len(), 3, "v6 {v6}");
        let mut data = Vec::new();
        for (i, s) in segs.iter().enumerate() {
            let (id, p) = check_udp(s);
            assert_eq!(p.len(), if i == 2 { 600 } else { 1200 });
            if !v6 {
                assert_eq!(id, Some(i as u16), "ids count up from the super-frame's 0");
            }
            data.extend_from_slice(&p);
        }
        assert_eq!(data, payload(3000));
    }
}

#[test]
fn udp_datagrams_are_never_resized() {
    let frame = udp_super(false, 3000);
    assert_eq!(
        Segmenter::new(&frame, &gso(GsoType::UdpL4, 1472), 1444),
        Err(Error::Malformed(
            "GSO segment larger than the port's frame limit"
        ))
    );
}

#[test]
fn header_only_super_frame_makes_one_segment() {
    let frame = tcp_super(false, 9, 0);
    let segs = segment_all(&frame, &gso(GsoType::TcpV4, 1448), 1514);
    assert_eq!(segs.len(), 1);
    let seg = check_tcp(&segs[0]);
    assert!(seg.fin && seg.psh && seg.cwr && seg.payload.is_empty());
}

#[test]
fn bad_super_frames_are_refused() {
    let v4 = tcp_super(false, 1, 3000);
    let tcp4 = gso(GsoType::TcpV4, 1448);
    let refuse = |frame: &[u8], hdr: &VnetHdr| Segmenter::new(frame, hdr, 1514).unwrap_err();
    assert_eq!(refuse(&v4[..40], &tcp4), Error::Truncated);
    assert!(matches!(
        refuse(&v4, &gso(GsoType::TcpV6, 1448)),
        Error::Malformed(_)
    ));
    assert!(matches!(
        refuse(&v4, &gso(GsoType::UdpL4, 1448)),
        Error::Malformed(_)
    ));
    assert!(matches!(
        refuse(&v4, &gso(GsoType::TcpV4, 63)),
        Error::Malformed(_)
    ));
    assert!(matches!(refuse(&v4, &VnetHdr::NONE), Error::Malformed(_)));
    let mut frag = v4.clone();
    frag[20] |= 0x20; // more fragments
    assert!(matches!(refuse(&frag, &tcp4), Error::Malformed(_)));
    let mut tagged = v4.clone();
    tagged[12..14].copy_from_slice(&[0x81, 0x00]);
    assert!(matches!(refuse(&tagged, &tcp4), Error::Malformed(_)));
    let mut bad_doff = v4.clone();
    bad_doff[14 + 20 + 12] = 0x40;
    assert!(matches!(refuse(&bad_doff, &tcp4), Error::Malformed(_)));
}

#[test]
fn segmenting_pauses_resumes_and_checks_its_inputs() {
    let frame = tcp_super(false, 1, 3000);
    let mut s = Segmenter::new(&frame, &gso(GsoType::TcpV4, 1448), 1514).unwrap();
    let mut small = [0u8; 100];
    assert_eq!(
        s.next_into(&frame, &mut small),
        Err(Error::BufferTooSmall { needed: 1514 })
    );
    assert_eq!(
        s.next_into(&frame[..100], &mut [0u8; 1514]),
        Err(Error::BadLength)
    );
    assert_eq!(s.remaining(), 3, "failed calls emit nothing");
    let mut buf = [0u8; 1514];
    assert_eq!(s.next_into(&frame, &mut buf), Ok(Some(1514)));
    assert_eq!(check_tcp(&buf).seq, 1);
    assert_eq!(s.remaining(), 2);
}

#[test]
fn partial_checksums_are_completed_like_the_kernel_does() {
    for v6 in [false, true] {
        for tcp in [false, true] {
            let mut frame = if tcp {
                tcp_super(v6, 5, 999)
            } else {
                udp_super(v6, 999)
            };
            let l4 = if v6 { 54 } else { 34 };
            let field = l4 + if tcp { 16 } else { 6 };
            let good = frame.clone();
            // What a sender with tx checksum offload leaves: the pseudo-header sum only.
            let (src, dst) = if v6 { (22, 54) } else { (26, 34) };
            let len = (frame.len() - l4) as u64;
            let proto = if tcp { 6 } else { 17 };
            let pseudo = add(sum(&frame[src..dst]), fold(proto + len));
            frame[field..field + 2].copy_from_slice(&pseudo.to_be_bytes());
            complete_checksum(&mut frame, l4 as u16, (field - l4) as u16).unwrap();
            assert_eq!(frame, good, "v6 {v6} tcp {tcp}");
        }
    }
}

#[test]
fn completion_refuses_fields_outside_the_frame_and_never_writes_zero() {
    let mut frame = vec![0u8; 20];
    assert_eq!(complete_checksum(&mut frame, 10, 9), Err(Error::BadLength));
    assert_eq!(complete_checksum(&mut frame, 30, 0), Err(Error::BadLength));
    assert_eq!(
        complete_checksum(&mut frame, u16::MAX, u16::MAX),
        Err(Error::BadLength)
    );
    // Bytes summing to 0xffff complement to zero, sent as 0xffff.
    let mut ones = vec![0xff, 0xff, 0, 0];
    complete_checksum(&mut ones, 0, 2).unwrap();
    assert_eq!(ones, [0xff, 0xff, 0xff, 0xff]);
}

#[test]
fn vnet_headers_round_trip_and_unknown_types_are_refused() {
    let h = VnetHdr {
        needs_csum: true,
        gso: GsoType::TcpV6,
        ecn: true,
        hdr_len: 86,
        gso_size: 1428,
        csum_start: 54,
        csum_offset: 16,
    };
    assert_eq!(VnetHdr::parse(&h.to_bytes()), Ok(h));
    assert_eq!(VnetHdr::parse(&[0; 10]), Ok(VnetHdr::NONE));
    assert_eq!(VnetHdr::parse(&[0; 9]), Err(Error::Truncated));
    for bad in [2u8, 3, 6, 0x83] {
        let mut b = [0u8; 10];
        b[1] = bad;
        assert!(VnetHdr::parse(&b).is_err(), "gso_type {bad:#x}");
    }
}

proptest! {
    #[test]
    fn fast_sum_equals_the_naive_one(data in proptest::collection::vec(any::<u8>(), 0..3000), skip in 0usize..9) {
        let data = &data[skip.min(data.len())..];
        prop_assert_eq!(sum(data), naive_sum(data));
    }

    /// Whatever a VM puts in the header and the frame: no panic, segments within the limit
    /// and within the bound that MIN_GSO_SIZE sets.
    #[test]
    fn arbitrary_input_never_panics(
        frame in proptest::collection::vec(any::<u8>(), 0..400),
        hdr in proptest::array::uniform10(any::<u8>()),
        max_frame in 0usize..2000,
        ethertype in prop_oneof![Just([0x08u8, 0x00]), Just([0x86, 0xdd]), any::<[u8; 2]>()],
    ) {
        let mut frame = frame;
        if frame.len() >= 14 {
            frame[12..14].copy_from_slice(&ethertype);
        }
        if let Ok(h) = VnetHdr::parse(&hdr) {
            let mut copy = frame.clone();
            let _ = complete_checksum(&mut copy, h.csum_start, h.csum_offset);
            if let Ok(mut s) = Segmenter::new(&frame, &h, max_frame) {
                let mut out = vec![0u8; max_frame];
                let mut n = 0;
                while let Some(len) = s.next_into(&frame, &mut out).unwrap() {
                    prop_assert!(len <= max_frame);
                    n += 1;
                    prop_assert!(n <= 1 + frame.len() / MIN_GSO_SIZE);
                }
            }
        }
    }
}
