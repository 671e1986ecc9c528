//! A window-based TCP model counting in segments: slow start, congestion avoidance, NewReno
//! fast retransmit and recovery (RFC 6582), retransmission timeout with backoff (RFC 6298),
//! and DCTCP's ECN reaction (Alizadeh et al., section 3: alpha <- (1-g) alpha + g F per
//! window, cwnd <- cwnd (1 - alpha/2) once per window of marks); in recovery the sending
//! rule is Proportional Rate Reduction (RFC 6937) or window inflation. Sans-I/O: the application
//! sends what [`TcpSender::next_to_send`] allows and feeds ACKs and timeouts back.

use crate::event::Nanos;
use crate::spec::{CongestionControl, Recovery};
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;

/// DCTCP's EWMA gain g.
const DCTCP_G: f64 = 1.0 / 16.0;
/// Initial congestion window, segments (RFC 6928).
const INITIAL_CWND: f64 = 10.0;
/// Largest RTO, ns.
const MAX_RTO: Nanos = 1_000_000_000;

/// The sending side of one connection.
#[derive(Debug, Clone)]
pub struct TcpSender {
    cc: CongestionControl,
    /// Congestion window, segments.
    pub cwnd: f64,
    ssthresh: f64,
    /// Oldest unacknowledged segment.
    pub snd_una: u64,
    /// Next segment to send.
    pub next_seq: u64,
    high_seq: u64,
    total: Option<u64>,
    dupacks: u32,
    recovering: Option<u64>,
    /// Segments above `snd_una` the receiver reported holding (SACK, RFC 6675 in spirit).
    sacked: BTreeSet<u64>,
    /// Next candidate hole to retransmit during recovery.
    rtx_next: u64,
    srtt: Option<u64>,
    rttvar: u64,
    rto: u64,
    min_rto: u64,
    /// When the retransmission timer fires, if armed.
    pub rto_deadline: Option<Nanos>,
    alpha: f64,
    window_end: u64,
    acked_in_window: u64,
    marked_in_window: u64,
    cwr_until: u64,
    /// Segments sent again (fast retransmit or timeout).
    pub retransmits: u64,
    /// Timeouts taken.
    pub timeouts: u64,
    /// Duplicate ACKs that start fast retransmit (3; EyeQ 5.4 raises it under per-packet
    /// ECMP, whose reordering would otherwise look like loss).
    pub dupack_threshold: u32,
    /// The sending rule in fast recovery.
    pub recovery: Recovery,
    prr: Prr,
}

/// Proportional Rate Reduction's state in one recovery (RFC 6937 section 3), in segments.
#[derive(Debug, Clone, Copy, Default)]
struct Prr {
    /// RecoverFS: snd.nxt - snd.una when recovery began.
    recover_fs: u64,
    /// prr_delivered: segments the receiver reported arriving since (cumulatively or SACKed).
    delivered: u64,
    /// prr_out: segments sent since.
    out: u64,
    /// What the last ACK's sndcnt lets out, less what went out since.
    quota: u64,
}

impl TcpSender {
    /// A sender of `total` segments (None: unlimited) with minimum RTO `min_rto` ns.
    pub fn new(cc: CongestionControl, total: Option<u64>, min_rto: Nanos) -> TcpSender {
        TcpSender {
            dupack_threshold: 3,
            recovery: Recovery::Classic,
            prr: Prr::default(),
            cc,
            cwnd: INITIAL_CWND,
            ssthresh: f64::MAX,
            snd_una: 0,
            next_seq: 0,
            high_seq: 0,
            total,
            dupacks: 0,
            recovering: None,
            sacked: BTreeSet::new(),
            rtx_next: 0,
            srtt: None,
            rttvar: 0,
            rto: min_rto.max(1_000_000),
            min_rto,
            rto_deadline: None,
            alpha: 1.0,
            window_end: 0,
            acked_in_window: 0,
            marked_in_window: 0,
            cwr_until: 0,
            retransmits: 0,
            timeouts: 0,
        }
    }

    /// Whether every segment was acknowledged (never for an unlimited sender).
    pub fn done(&self) -> bool {
        self.total.is_some_and(|t| self.snd_una >= t)
    }

    /// The segment the window allows next, if any. In recovery under PRR: what the last
    /// ACK's sndcnt still lets out, chosen by RFC 6675's NextSeg (a hole deemed lost, else
    /// new data, else with no new data left any hole).
    pub fn next_to_send(&self) -> Option<u64> {
        if self.prr_recovering() {
            if self.prr.quota == 0 {
                return None;
            }
            return self
                .find_hole(true)
                .or_else(|| self.has_new_data().then_some(self.next_seq))
                .or_else(|| self.find_hole(false));
        }
        let in_window = (self.next_seq - self.snd_una) < self.cwnd.max(1.0) as u64;
        (in_window && self.has_new_data()).then_some(self.next_seq)
    }

    fn has_new_data(&self) -> bool {
        self.total.is_none_or(|t| self.next_seq < t)
    }

    fn prr_recovering(&self) -> bool {
        self.recovery == Recovery::Prr && self.recovering.is_some()
    }

    /// Records that segment `seq` went out at `now`.
    pub fn on_sent(&mut self, now: Nanos, seq: u64) {
        if seq == self.next_seq {
            self.next_seq += 1;
            self.skip_sacked();
        }
        if seq < self.high_seq {
            self.retransmits += 1;
        }
        if self.prr_recovering() {
            // A hole NextSeg chose went out (`next_to_send`): the next search starts above.
            if seq < self.high_seq {
                self.rtx_next = self.rtx_next.max(seq + 1);
            }
            self.prr.out += 1;
            self.prr.quota = self.prr.quota.saturating_sub(1);
        }
        self.high_seq = self.high_seq.max(seq + 1);
        if self.rto_deadline.is_none() {
            self.rto_deadline = Some(now + self.rto);
        }
    }

    /// An ACK of every segment below `ack` that also reports holding the segments `sack`
    /// (the SACK block of the segment that triggered it), echoing its send time `echo_ns`
    /// and ECN-echo `ece`. Returns a segment to retransmit now, if any: during recovery
    /// every ACK clocks out one segment (SACK-based loss recovery, RFC 6675).
    pub fn on_ack(
        &mut self,
        now: Nanos,
        ack: u64,
        sack: Range<u64>,
        ece: bool,
        echo_ns: Nanos,
    ) -> Option<u64> {
        // A duplicate ACK is one whose SACK reports a segment not reported before (RFC 6675
        // section 2, ns-3's definition with SACK): the ACK of a segment the receiver already
        // held (a spurious retransmission's echo, D-SACK in Linux) says nothing of a loss.
        let mut newly_sacked = false;
        let (una, held) = (self.snd_una, self.sacked.len() as u64);
        for seq in sack.start.max(ack)..sack.end.min(self.high_seq) {
            newly_sacked |= self.sacked.insert(seq);
        }
        if echo_ns <= now {
            self.rtt_sample(now - echo_ns);
        }
        if self.cc == CongestionControl::Dctcp {
            self.dctcp(ack, ece);
        }
        if ack > self.snd_una {
            let newly = ack - self.snd_una;
            self.snd_una = ack;
            self.sacked = self.sacked.split_off(&ack);
            // RFC 6937's DeliveredData: the change in snd.una plus the change in SACKed.
            let delivered = (ack - una + self.sacked.len() as u64).saturating_sub(held);
            self.next_seq = self.next_seq.max(ack);
            self.skip_sacked();
            self.dupacks = 0;
            self.rto_deadline = (self.snd_una < self.high_seq).then_some(now + self.rto);
            match self.recovering {
                Some(recover) if ack >= recover => {
                    self.cwnd = self.ssthresh;
                    self.recovering = None;
                }
                Some(_) if self.recovery == Recovery::Prr => {
                    self.prr_on_ack(delivered);
                }
                Some(_) => {
                    // NewReno partial ACK: deflate the window, send by RFC 6675's NextSeg.
                    self.cwnd = (self.cwnd - newly as f64 + 1.0).max(1.0);
                    return self.next_segment_in_recovery();
                }
                // After an ECN cut the window does not grow until the data sent before the cut
                // is acknowledged (RFC 3168 6.1.2: one reduction per window; Linux's and
                // ns-3's CWR state). Growing on the cutting ACK itself gave back 1/cwnd, a
                // whole segment at a window of one: eight DCTCP connections then held two
                // segments each in a 25 KB queue whatever the marking threshold.
                None if ack < self.cwr_until => {}
                // Appropriate byte counting, L = 2 (RFC 3465).
                None if self.cwnd < self.ssthresh => self.cwnd += newly.min(2) as f64,
                None => self.cwnd += newly as f64 / self.cwnd,
            }
            None
        } else if ack == self.snd_una && self.snd_una < self.high_seq && newly_sacked {
            self.dupacks += 1;
            let delivered = self.sacked.len() as u64 - held;
            if self.prr_recovering() {
                self.prr_on_ack(delivered);
            } else if self.recovering.is_some() {
                // One segment out per segment that left: the window inflates by it, and
                // NextSeg's choice goes out, a hole taking the slot of new data. Both, as
                // before 2026-11-29 (early), sent two per duplicate ACK into the queue.
                self.cwnd += 1.0;
                let hole = self.next_segment_in_recovery();
                if hole.is_some() {
                    self.cwnd -= 1.0;
                }
                return hole;
            } else if self.dupacks == self.dupack_threshold {
                self.rtx_next = self.snd_una;
                self.ssthresh = self.loss_ssthresh();
                self.cwnd = self.ssthresh + self.dupack_threshold as f64;
                self.recovering = Some(self.high_seq);
                if self.recovery == Recovery::Prr {
                    self.prr = Prr {
                        recover_fs: self.flight(),
                        ..Prr::default()
                    };
                    self.prr_on_ack(delivered);
                    // The fast retransmission goes whatever sndcnt says (ns-3's
                    // `TcpPrrRecovery::DoRecovery`: at least one segment before any).
                    self.prr.quota = self.prr.quota.max(1);
                }
                return self.next_hole(false);
            }
            None
        } else {
            None
        }
    }

    /// Fires the retransmission timer if due at `now`: go back to the oldest unacknowledged
    /// segment with a window of one, over the segments not reported held (the SACK record is
    /// kept: the simulator's receivers never renege). Returns whether it fired.
    pub fn on_timeout(&mut self, now: Nanos) -> bool {
        if self.rto_deadline.is_none_or(|d| d > now) {
            return false;
        }
        self.timeouts += 1;
        self.ssthresh = self.loss_ssthresh();
        self.cwnd = 1.0;
        self.recovering = None;
        self.dupacks = 0;
        self.next_seq = self.snd_una;
        self.rto = (self.rto * 2).min(MAX_RTO);
        self.rto_deadline = None;
        true
    }

    /// What a sender in recovery sends, RFC 6675 section 4's NextSeg as ns-3 runs it: (1) a
    /// hole deemed lost, (2) else new data if the window allows (`None`: the caller sends
    /// it), (3) else, with no new data left, a hole not yet deemed lost. Before 2026-11-29
    /// every hole went first: with per-packet ECMP most were segments still on a longer
    /// path, and a partial ACK's hole was spurious seven times in eight (web search, 0.5).
    fn next_segment_in_recovery(&mut self) -> Option<u64> {
        if let Some(lost) = self.next_hole(true) {
            return Some(lost);
        }
        if self.next_to_send().is_some() {
            return None;
        }
        let no_new_data = self.total.is_some_and(|t| self.next_seq >= t);
        no_new_data.then(|| self.next_hole(false)).flatten()
    }

    /// PRR on an ACK in recovery that delivered `delivered` segments (RFC 6937 section 3,
    /// with the slow-start reduction bound, PRR-SSRB, as ns-3's default): while more than
    /// ssthresh is in the pipe, send so that what went out since recovery began stays
    /// ssthresh / RecoverFS of what was delivered; below it, grow back toward ssthresh by
    /// at most one segment more than delivered.
    fn prr_on_ack(&mut self, delivered: u64) {
        self.prr.delivered += delivered;
        let pipe = self.pipe() as f64;
        let (prr_delivered, prr_out) = (self.prr.delivered as f64, self.prr.out as f64);
        let sndcnt = if pipe > self.ssthresh {
            (prr_delivered * self.ssthresh / self.prr.recover_fs.max(1) as f64).ceil() - prr_out
        } else {
            let limit = (prr_delivered - prr_out).max(delivered as f64) + 1.0;
            (self.ssthresh - pipe).min(limit).floor()
        };
        self.prr.quota = sndcnt.max(0.0) as u64;
        self.cwnd = pipe + self.prr.quota as f64;
    }

    /// The ssthresh a loss sets: half of what is in flight, counted as snd.nxt - snd.una
    /// under `classic` (RFC 5681's FlightSize), as RFC 6675's pipe under PRR, as ns-3 counts
    /// it with SACK (`BytesInFlight` in `TcpSocketBase::EnterRecovery` and on a timeout).
    /// After a burst loss the two differ by what the receiver holds and what was lost, and
    /// PRR refills the pipe to ssthresh: from the flight it refilled it to twice ns-3's.
    fn loss_ssthresh(&self) -> f64 {
        let in_flight = match self.recovery {
            Recovery::Prr => self.pipe(),
            Recovery::Classic => self.flight(),
        };
        (in_flight as f64 / 2.0).max(2.0)
    }

    /// RFC 6675's pipe (SetPipe), in segments: those sent and not reported held, less the
    /// holes deemed lost and not retransmitted; a retransmitted hole counts once.
    fn pipe(&self) -> u64 {
        let outstanding = self.flight() - self.sacked.len() as u64;
        // Every hole below the `dupack_threshold`-th highest segment reported held is lost.
        let threshold = self.dupack_threshold.max(1) as usize;
        let Some(&bound) = self.sacked.iter().rev().nth(threshold - 1) else {
            return outstanding;
        };
        // Holes below `rtx_next` were retransmitted in this recovery.
        let from = self.rtx_next.max(self.snd_una);
        let lost =
            bound.saturating_sub(from) - self.sacked.range(from..bound.max(from)).count() as u64;
        outstanding - lost
    }

    /// The lowest segment from `rtx_next` not reported held, below the highest reported;
    /// with `lost_only`, only if it is deemed lost: `dupack_threshold` segments above it
    /// reported held (RFC 6675's IsLost, as ns-3 decides it). `rtx_next` moves past it.
    fn next_hole(&mut self, lost_only: bool) -> Option<u64> {
        let seq = self.find_hole(lost_only)?;
        self.rtx_next = seq + 1;
        Some(seq)
    }

    /// [`Self::next_hole`] without moving `rtx_next`.
    fn find_hole(&self, lost_only: bool) -> Option<u64> {
        let mut seq = self.rtx_next.max(self.snd_una);
        while seq < self.high_seq && self.sacked.contains(&seq) {
            seq += 1;
        }
        let below_sacked = seq < self.high_seq && seq < self.sacked.last().map_or(seq + 1, |&l| l);
        let threshold = self.dupack_threshold.max(1) as usize;
        let lost = !lost_only || self.sacked.range(seq + 1..).nth(threshold - 1).is_some();
        (below_sacked && lost).then_some(seq)
    }

    /// Moves `next_seq` past segments the receiver reported holding (after a timeout the
    /// sender goes back over them, as ns-3 does, keeping its SACK record: RFC 6675 5.1).
    fn skip_sacked(&mut self) {
        while self.next_seq < self.high_seq && self.sacked.contains(&self.next_seq) {
            self.next_seq += 1;
        }
    }

    fn flight(&self) -> u64 {
        self.high_seq - self.snd_una
    }

    fn rtt_sample(&mut self, rtt: u64) {
        // RFC 6298 section 2.
        match self.srtt {
            None => {
                self.srtt = Some(rtt);
                self.rttvar = rtt / 2;
            }
            Some(s) => {
                self.rttvar = (3 * self.rttvar + s.abs_diff(rtt)) / 4;
                self.srtt = Some((7 * s + rtt) / 8);
            }
        }
        let s = self.srtt.unwrap_or(rtt);
        self.rto = (s + 4 * self.rttvar).clamp(self.min_rto, MAX_RTO);
    }

    fn dctcp(&mut self, ack: u64, ece: bool) {
        self.acked_in_window += 1;
        if ece {
            self.marked_in_window += 1;
            if ack >= self.cwr_until {
                self.cwnd = (self.cwnd * (1.0 - self.alpha / 2.0)).max(1.0);
                self.ssthresh = self.cwnd;
                self.cwr_until = self.high_seq;
            }
        }
        if ack >= self.window_end {
            let f = self.marked_in_window as f64 / self.acked_in_window.max(1) as f64;
            self.alpha = (1.0 - DCTCP_G) * self.alpha + DCTCP_G * f;
            self.acked_in_window = 0;
            self.marked_in_window = 0;
            self.window_end = self.high_seq.max(ack + 1);
        }
    }
}

/// The receiving side: cumulative ACKs over out-of-order blocks.
#[derive(Debug, Clone, Default)]
pub struct TcpReceiver {
    /// Next in-order segment expected.
    pub rcv_next: u64,
    /// Segments held above `rcv_next`, as blocks: first segment -> one past the last.
    out_of_order: BTreeMap<u64, u64>,
}

impl TcpReceiver {
    /// Takes segment `seq`; returns the cumulative ACK and how many segments became in order.
    pub fn on_data(&mut self, seq: u64) -> (u64, u64) {
        let before = self.rcv_next;
        if seq == self.rcv_next {
            self.rcv_next += 1;
            if let Some(end) = self.out_of_order.remove(&self.rcv_next) {
                self.rcv_next = end;
            }
        } else if seq > self.rcv_next && self.block_of(seq).is_none() {
            let start = match self.out_of_order.range(..seq).next_back() {
                Some((&start, &end)) if end == seq => start,
                _ => seq,
            };
            let end = self.out_of_order.remove(&(seq + 1)).unwrap_or(seq + 1);
            self.out_of_order.insert(start, end);
        }
        (self.rcv_next, self.rcv_next - before)
    }

    /// The SACK block an ACK of segment `seq` reports: the block of held segments around
    /// it, as a real SACK option's first block (RFC 2018: the block holding the segment
    /// that triggered the ACK). A later ACK so repeats what an earlier one reported, and
    /// an ACK that per-packet ECMP delays or a queue drops costs the sender no knowledge.
    /// Before 2026-11-29 an ACK reported its one segment. A segment below the cumulative
    /// ACK (a duplicate) reports itself, as a D-SACK.
    pub fn sack_block(&self, seq: u64) -> Range<u64> {
        match self.block_of(seq) {
            Some(block) if seq >= self.rcv_next => block,
            _ => seq..seq + 1,
        }
    }

    fn block_of(&self, seq: u64) -> Option<Range<u64>> {
        let (&start, &end) = self.out_of_order.range(..=seq).next_back()?;
        (end > seq).then_some(start..end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_start_doubles_per_round_then_three_dupacks_halve() {
        let mut s = TcpSender::new(CongestionControl::NewReno, None, 1_000_000);
        let mut sent = Vec::new();
        while let Some(q) = s.next_to_send() {
            s.on_sent(0, q);
            sent.push(q);
        }
        assert_eq!(sent.len(), 10);
        for q in 0..10 {
            assert_eq!(s.on_ack(100, q + 1, q..q + 1, false, 0), None);
        }
        assert_eq!(s.cwnd, 20.0);
        while let Some(q) = s.next_to_send() {
            s.on_sent(200, q);
        }
        // Segment 10 lost: three duplicate ACKs of 10 trigger its fast retransmit.
        assert_eq!(s.on_ack(300, 10, 11..12, false, 200), None);
        assert_eq!(s.on_ack(300, 10, 12..13, false, 200), None);
        assert_eq!(s.on_ack(300, 10, 13..14, false, 200), Some(10));
        assert_eq!(s.cwnd, 10.0 + 3.0);
        // The retransmission fills the hole: recovery ends at ssthresh.
        assert_eq!(s.on_ack(400, 30, 10..11, false, 300), None);
        assert_eq!(s.cwnd, 10.0);
    }

    /// ACKs of segments the receiver already held (the echoes of a spurious retransmission)
    /// are not duplicate ACKs: before, three of them started a fast retransmission of data
    /// that was not lost, and each partial ACK then resent the next segment, a cascade that
    /// cost eight NewReno connections through a 100 KB queue a tenth of their goodput.
    #[test]
    fn acks_of_duplicate_segments_do_not_start_fast_retransmit() {
        let mut s = TcpSender::new(CongestionControl::NewReno, None, 1_000_000);
        while let Some(q) = s.next_to_send() {
            s.on_sent(0, q);
        }
        // Segments 0-4 arrive; then three copies of segments 1-3 the receiver held already.
        assert_eq!(s.on_ack(100, 5, 4..5, false, 0), None);
        for dup in 1..4 {
            assert_eq!(
                s.on_ack(110, 5, dup..dup + 1, false, 0),
                None,
                "copy of {dup}"
            );
        }
        assert_eq!(s.recovering, None);
        assert_eq!(s.retransmits, 0);
        // Segment 5 lost: three ACKs reporting segments 6-8 are duplicates and retransmit it.
        assert_eq!(s.on_ack(120, 5, 6..7, false, 0), None);
        assert_eq!(s.on_ack(120, 5, 7..8, false, 0), None);
        assert_eq!(s.on_ack(120, 5, 8..9, false, 0), Some(5));
        // A second report of segment 8 is not another duplicate: no hole is sent for it.
        assert_eq!(s.on_ack(130, 5, 8..9, false, 0), None);
    }

    /// In recovery a duplicate ACK lets one segment out, a hole's retransmission or new
    /// data: on the leaf-spine case the sender sent both, and lost 15x ns-3's segments.
    #[test]
    fn a_duplicate_ack_in_recovery_sends_one_segment_not_two() {
        let mut s = TcpSender::new(CongestionControl::NewReno, None, 1_000_000);
        s.cwnd = 20.0;
        while let Some(q) = s.next_to_send() {
            s.on_sent(0, q);
        }
        // Segments 0 and 1 lost; 2, 3, 4 arrive: fast retransmit of 0.
        assert_eq!(s.on_ack(10, 0, 2..3, false, 0), None);
        assert_eq!(s.on_ack(10, 0, 3..4, false, 0), None);
        assert_eq!(s.on_ack(10, 0, 4..5, false, 0), Some(0));
        let window = s.cwnd;
        // The next duplicate ACK retransmits hole 1 and opens no room for new data.
        assert_eq!(s.on_ack(11, 0, 5..6, false, 0), Some(1));
        assert_eq!(s.cwnd, window);
        s.on_sent(11, 1);
        // With no hole left, a duplicate ACK inflates the window by the one that left.
        assert_eq!(s.on_ack(12, 0, 6..7, false, 0), None);
        assert_eq!(s.cwnd, window + 1.0);
    }

    /// An ACK's SACK block repeats what earlier ACKs reported, so an ACK lost (or delayed
    /// by per-packet ECMP) costs the sender no knowledge. With one segment per ACK, as
    /// before 2026-11-29, segment 2 (whose ACK was lost) was a hole, resent in recovery.
    #[test]
    fn a_sack_block_covers_an_ack_lost_on_the_way() {
        let mut r = TcpReceiver::default();
        for seq in 1..7 {
            assert_eq!(r.on_data(seq), (0, 0));
        }
        assert_eq!(r.sack_block(3), 1..7);
        let mut s = TcpSender::new(CongestionControl::NewReno, None, 1_000_000);
        while let Some(q) = s.next_to_send() {
            s.on_sent(0, q);
        }
        // Segment 0 lost; the ACK of segment 2 lost too.
        assert_eq!(s.on_ack(10, 0, 1..2, false, 0), None);
        assert_eq!(s.on_ack(10, 0, 1..4, false, 0), None);
        assert_eq!(s.on_ack(10, 0, 1..5, false, 0), Some(0));
        s.on_sent(10, 0);
        // Two more duplicate ACKs: no hole left below the highest reported, so nothing
        // is resent (new data goes out when the window allows).
        assert_eq!(s.on_ack(11, 0, 1..6, false, 0), None);
        assert_eq!(s.on_ack(11, 0, 1..7, false, 0), None);
        assert_eq!(s.retransmits, 1);
        // The receiver takes segment 0 and acknowledges all it holds.
        assert_eq!(r.on_data(0), (7, 7));
        assert_eq!(
            r.sack_block(0),
            0..1,
            "below the cumulative ACK: reports itself"
        );
    }

    /// On a partial ACK a hole with fewer than `dupack_threshold` segments reported above it
    /// (one still on a longer path, as per-packet ECMP reorders) is not resent while new
    /// data can go (RFC 6675 NextSeg); it was, before 2026-11-29, and 7 of 8 such
    /// retransmissions were spurious on the web-search fabric at load 0.5.
    #[test]
    fn a_partial_ack_sends_new_data_before_a_hole_not_deemed_lost() {
        let mut s = TcpSender::new(CongestionControl::NewReno, None, 1_000_000);
        s.cwnd = 20.0;
        while let Some(q) = s.next_to_send() {
            s.on_sent(0, q);
        }
        // Segment 0 lost, segments 1-9 arrive: fast retransmit of 0 on the third.
        for seq in 1..10 {
            let rtx = s.on_ack(10, 0, 1..seq + 1, false, 0);
            assert_eq!(rtx, (seq == 3).then_some(0), "ACK reporting 1..{}", seq + 1);
            if rtx.is_some() {
                s.on_sent(10, 0);
            }
        }
        // Segment 10 is late; 11 and 12 arrive, then the retransmitted 0: ACK 10.
        assert_eq!(s.on_ack(11, 0, 11..12, false, 0), None);
        assert_eq!(s.on_ack(11, 0, 11..13, false, 0), None);
        assert_eq!(
            s.on_ack(12, 10, 0..1, false, 0),
            None,
            "10 is not deemed lost"
        );
        assert_eq!(s.next_to_send(), Some(20), "new data goes instead");
        s.on_sent(12, 20);
        // A third segment reported above 10 deems it lost: then it is resent.
        assert_eq!(s.on_ack(13, 10, 11..14, false, 0), Some(10));
        assert_eq!(s.retransmits, 1);
    }

    /// After a timeout the sender goes back over what the receiver did not report holding
    /// only; before 2026-11-29 it forgot its SACK record and resent the whole window.
    #[test]
    fn a_timeout_resends_only_what_was_not_reported_held() {
        let mut s = TcpSender::new(CongestionControl::NewReno, None, 1_000_000);
        s.dupack_threshold = 100;
        while let Some(q) = s.next_to_send() {
            s.on_sent(0, q);
        }
        // Segments 0 and 1 lost, 2-9 held; no fast retransmit at this threshold.
        assert_eq!(s.on_ack(10, 0, 2..10, false, 0), None);
        assert!(s.on_timeout(s.rto_deadline.unwrap()));
        assert_eq!(s.next_to_send(), Some(0));
        s.on_sent(2_000_000, 0);
        assert_eq!(s.on_ack(2_000_100, 1, 2..10, false, 2_000_000), None);
        assert_eq!(s.next_to_send(), Some(1));
        s.on_sent(2_000_100, 1);
        assert_eq!(s.next_seq, 10, "2-9 skipped");
        assert_eq!(s.retransmits, 2);
    }

    /// Sends what an ACK lets out (the segment `on_ack` returns, then what the window
    /// allows), on a virtual clock at `now`.
    fn ack_and_send(s: &mut TcpSender, now: Nanos, ack: u64, sack: Range<u64>) -> Vec<u64> {
        let mut out: Vec<u64> = s.on_ack(now, ack, sack, false, 0).into_iter().collect();
        for &q in &out {
            s.on_sent(now, q);
        }
        while let Some(q) = s.next_to_send() {
            s.on_sent(now, q);
            out.push(q);
        }
        out
    }

    /// PRR (RFC 6937) spreads recovery's sending over the window: while the pipe is above
    /// ssthresh, what went out since recovery began is ceil(delivered x ssthresh / RecoverFS)
    /// (8 / 20 here: two segments per five delivered), then PRR-SSRB holds the pipe at
    /// ssthresh. PRR halves the pipe (16: 20 sent, 3 SACKed, segment 0 deemed lost), as
    /// ns-3 does; window inflation (`classic`) halves the flight (20) and sends nothing until
    /// the duplicate ACKs have inflated the window past it, then one per ACK.
    #[test]
    fn prr_sends_in_proportion_to_what_was_delivered() {
        let mut sent = Vec::new();
        for (recovery, ssthresh) in [(Recovery::Prr, 8.0), (Recovery::Classic, 10.0)] {
            let mut s = TcpSender::new(CongestionControl::NewReno, None, 1_000_000);
            s.recovery = recovery;
            s.cwnd = 20.0;
            while let Some(q) = s.next_to_send() {
                s.on_sent(0, q);
            }
            // Segment 0 lost; 1-19 arrive, one ACK each, 1 us apart.
            let per_ack: Vec<Vec<u64>> = (1..20)
                .map(|k| ack_and_send(&mut s, 10_000 + k * 1000, 0, 1..k + 1))
                .collect();
            assert_eq!(
                per_ack[2],
                [0],
                "{recovery:?}: fast retransmit on the third"
            );
            assert_eq!(s.ssthresh, ssthresh, "{recovery:?}");
            if recovery == Recovery::Prr {
                // The pipe stays above 8 through the 16th ACK.
                let mut out = 0;
                for (i, segs) in per_ack.iter().enumerate().take(16).skip(2) {
                    out += segs.len();
                    let delivered = i - 1;
                    assert_eq!(out, (delivered * 8).div_ceil(20), "after ACK {}", i + 1);
                }
                assert_eq!(per_ack[4], [20], "new data from the fifth ACK on");
                assert!(per_ack[16].is_empty() && per_ack[17..].iter().all(|p| p.len() == 1));
                assert_eq!(s.pipe(), 8, "the pipe has come down to ssthresh");
            } else {
                assert!(per_ack[3..10].iter().all(|p| p.is_empty()), "{per_ack:?}");
                assert!(per_ack[10..].iter().all(|p| p.len() == 1), "{per_ack:?}");
            }
            sent.push(s.next_seq - 20);
            // The retransmission arrives: recovery ends at ssthresh.
            ack_and_send(&mut s, 40_000, 20, 0..1);
            assert_eq!(s.recovering, None);
            assert_eq!(s.cwnd, ssthresh);
        }
        // New segments sent in recovery: PRR seven, from the fifth ACK on, spread; classic
        // nine, in the second half only.
        assert_eq!(sent, [7, 9]);
    }

    #[test]
    fn timeout_goes_back_to_one_segment() {
        let mut s = TcpSender::new(CongestionControl::NewReno, Some(5), 1_000_000);
        while let Some(q) = s.next_to_send() {
            s.on_sent(0, q);
        }
        assert!(!s.on_timeout(10));
        assert!(s.on_timeout(s.rto_deadline.unwrap()));
        assert_eq!((s.cwnd, s.next_seq), (1.0, 0));
        assert!(!s.done());
        assert_eq!(s.on_ack(2_000_000, 5, 0..1, false, 1_500_000), None);
        assert!(s.done());
    }

    #[test]
    fn dctcp_cuts_in_proportion_to_marks() {
        let mut s = TcpSender::new(CongestionControl::Dctcp, None, 1_000_000);
        s.cwnd = 100.0;
        s.ssthresh = 50.0;
        while let Some(q) = s.next_to_send() {
            s.on_sent(0, q);
        }
        // alpha starts at 1: the first marked window halves.
        s.on_ack(10, 1, 0..1, true, 0);
        assert!((s.cwnd - 50.0).abs() < 1.0, "{}", s.cwnd);
    }

    /// The window cut by a mark stays cut until the data sent before the cut is acknowledged,
    /// then grows again; at a window of one the cutting ACK's growth would have undone the cut.
    #[test]
    fn dctcp_does_not_grow_the_window_it_just_cut() {
        let mut s = TcpSender::new(CongestionControl::Dctcp, None, 1_000_000);
        s.cwnd = 2.0;
        s.ssthresh = 2.0;
        while let Some(q) = s.next_to_send() {
            s.on_sent(0, q);
        }
        assert_eq!(s.high_seq, 2);
        // A marked ACK of segment 0: alpha 1 halves the window to one segment, and it stays.
        s.on_ack(10, 1, 0..1, true, 0);
        assert_eq!(s.cwnd, 1.0);
        assert_eq!(s.next_to_send(), None, "one segment still in flight");
        // The ACK of segment 1, the last sent before the cut, ends the round: growth resumes.
        s.on_ack(20, 2, 1..2, false, 0);
        assert_eq!(s.cwnd, 2.0);
    }

    #[test]
    fn receiver_acks_cumulatively() {
        let mut r = TcpReceiver::default();
        assert_eq!(r.on_data(0), (1, 1));
        assert_eq!(r.on_data(2), (1, 0));
        assert_eq!(r.on_data(3), (1, 0));
        assert_eq!(r.on_data(1), (4, 3));
        assert_eq!(r.on_data(1), (4, 0));
    }
}
