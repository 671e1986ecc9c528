//! The sender module (EyeQ's SEM, sections 3.3 and 4): per-destination rates set by
//! receiver feedback.

use std::collections::HashMap;
use std::hash::Hash;

use super::EyeqError;
use crate::time::{Duration, Instant};

/// Parameters of a [`Sender`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SenderConfig {
    /// Without feedback for this long a limiter halves its rate, and again after each further
    /// such period (EyeQ 3.3: 100 ms), in case the receiver is unreachable.
    pub feedback_timeout: Duration,
    /// Lowest rate a limiter holds, in units/s (EyeQ 3.3: 1 Mb/s). Halving stops here, and
    /// advertised rates below it are raised to it.
    pub floor: u64,
    /// A limiter with neither traffic nor feedback for this long is removed (EyeQ 4:
    /// inactive rate limiters are garbage collected every few seconds).
    pub idle_timeout: Duration,
    /// Most limiters held at once; see [`FeedbackOutcome::TableFull`].
    pub max_limiters: usize,
}

impl Default for SenderConfig {
    fn default() -> Self {
        SenderConfig {
            feedback_timeout: Duration::from_millis(100),
            floor: 1_000_000 / 8,
            idle_timeout: Duration::from_secs(2),
            max_limiters: 4096,
        }
    }
}

/// What [`Sender::on_feedback`] did with a feedback message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeedbackOutcome {
    /// The destination had no limiter; one was created at the advertised rate.
    Created,
    /// The destination's limiter took the advertised rate.
    Updated,
    /// The sequence number was not newer than the last one applied; ignored.
    Stale,
    /// No limiter existed and `max_limiters` are in use (after removing idle ones): the
    /// feedback is ignored and the destination stays unlimited. Count these; a full table
    /// means `max_limiters` is too small for the number of congested destinations.
    TableFull,
}

/// A destination's limiter, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LimiterStats {
    /// Current rate in units/s.
    pub rate: u64,
    /// Sequence number of the last feedback applied.
    pub last_seq: u32,
    /// When the last feedback was applied.
    pub last_feedback: Instant,
    /// Units reported through [`Sender::note_sent`] since the limiter was created.
    pub sent: u64,
}

#[derive(Debug, Clone, Copy)]
struct Limiter {
    rate: u64,
    last_seq: u32,
    last_feedback: Instant,
    next_halving: Instant,
    last_activity: Instant,
    sent: u64,
}

impl Limiter {
    fn idle_deadline(&self, idle_timeout: Duration) -> Instant {
        self.last_activity.max(self.last_feedback) + idle_timeout
    }
}

/// EyeQ's sender module: one rate per congested destination `D` (for example the pair of a
/// receiving host and endpoint). Destinations without a limiter are not held at all.
///
/// The limiter table is allocated once for `max_limiters` entries.
#[derive(Debug)]
pub struct Sender<D> {
    config: SenderConfig,
    limiters: HashMap<D, Limiter>,
}

impl<D: Copy + Eq + Hash> Sender<D> {
    /// A sender with no limiters.
    pub fn new(config: SenderConfig) -> Result<Self, EyeqError> {
        if config.feedback_timeout == Duration::ZERO {
            return Err(EyeqError::InvalidConfig("feedback_timeout must be > 0"));
        }
        if config.floor == 0 {
            return Err(EyeqError::InvalidConfig("floor must be > 0"));
        }
        if config.max_limiters == 0 {
            return Err(EyeqError::InvalidConfig("max_limiters must be > 0"));
        }
        Ok(Sender {
            config,
            limiters: HashMap::with_capacity(config.max_limiters),
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &SenderConfig {
        &self.config
    }

    /// Applies feedback from `dst`'s receiver: the rate to use (units/s) and its sequence
    /// number. Creates the limiter on the first feedback (EyeQ 3.3). A sequence number not
    /// newer (in wrapping order) than the last applied one is stale, unless the last
    /// feedback is older than `feedback_timeout` (the receiver may have restarted).
    pub fn on_feedback(&mut self, now: Instant, dst: D, rate: u64, seq: u32) -> FeedbackOutcome {
        let rate = rate.max(self.config.floor);
        let next_halving = now + self.config.feedback_timeout;
        if let Some(limiter) = self.limiters.get_mut(&dst) {
            let newer = (seq.wrapping_sub(limiter.last_seq) as i32) > 0;
            let silent =
                now.saturating_since(limiter.last_feedback) >= self.config.feedback_timeout;
            if !newer && !silent {
                return FeedbackOutcome::Stale;
            }
            limiter.rate = rate;
            limiter.last_seq = seq;
            limiter.last_feedback = now;
            limiter.next_halving = next_halving;
            return FeedbackOutcome::Updated;
        }
        if self.limiters.len() >= self.config.max_limiters {
            self.collect_idle(now);
            if self.limiters.len() >= self.config.max_limiters {
                return FeedbackOutcome::TableFull;
            }
        }
        self.limiters.insert(
            dst,
            Limiter {
                rate,
                last_seq: seq,
                last_feedback: now,
                next_halving,
                last_activity: now,
                sent: 0,
            },
        );
        FeedbackOutcome::Created
    }

    /// The rate to shape traffic to `dst` at, in units/s; `None` when `dst` has no limiter
    /// (not congested): send without holding.
    pub fn rate_for(&self, dst: D) -> Option<u64> {
        self.limiters.get(&dst).map(|l| l.rate)
    }

    /// Records that `units` were sent to `dst`, which keeps its limiter from being collected.
    pub fn note_sent(&mut self, now: Instant, dst: D, units: u64) {
        if let Some(limiter) = self.limiters.get_mut(&dst) {
            limiter.last_activity = limiter.last_activity.max(now);
            limiter.sent = limiter.sent.saturating_add(units);
        }
    }

    /// The next halving or idle collection due, if any limiter exists. Scans all limiters.
    pub fn poll_at(&self) -> Option<Instant> {
        let floor = self.config.floor;
        self.limiters
            .values()
            .map(|l| {
                let idle = l.idle_deadline(self.config.idle_timeout);
                if l.rate > floor {
                    idle.min(l.next_halving)
                } else {
                    idle
                }
            })
            .min()
    }

    /// Halves the rate of every limiter without feedback for `feedback_timeout` (once per
    /// elapsed period, down to `floor`) and removes idle limiters.
    pub fn on_timeout(&mut self, now: Instant) {
        let (timeout, floor) = (self.config.feedback_timeout, self.config.floor);
        for limiter in self.limiters.values_mut() {
            while limiter.rate > floor && now >= limiter.next_halving {
                limiter.rate = (limiter.rate / 2).max(floor);
                limiter.next_halving += timeout;
            }
        }
        self.collect_idle(now);
    }

    /// Metrics of `dst`'s limiter.
    pub fn limiter(&self, dst: D) -> Option<LimiterStats> {
        self.limiters.get(&dst).map(|l| LimiterStats {
            rate: l.rate,
            last_seq: l.last_seq,
            last_feedback: l.last_feedback,
            sent: l.sent,
        })
    }

    /// Number of limiters held.
    pub fn len(&self) -> usize {
        self.limiters.len()
    }

    /// Whether no limiter is held (every destination is sent to unheld).
    pub fn is_empty(&self) -> bool {
        self.limiters.is_empty()
    }

    fn collect_idle(&mut self, now: Instant) {
        let idle_timeout = self.config.idle_timeout;
        self.limiters
            .retain(|_, l| now < l.idle_deadline(idle_timeout));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at_ms(ms: u64) -> Instant {
        Instant::ZERO + Duration::from_millis(ms)
    }

    fn sender(max_limiters: usize) -> Sender<u32> {
        Sender::new(SenderConfig {
            max_limiters,
            ..SenderConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn limiter_exists_only_after_feedback() {
        let mut s = sender(4);
        assert_eq!(s.rate_for(1), None);
        s.note_sent(at_ms(0), 1, 1500);
        assert!(s.is_empty());
        assert_eq!(
            s.on_feedback(at_ms(1), 1, 5_000_000, 1),
            FeedbackOutcome::Created
        );
        assert_eq!(s.rate_for(1), Some(5_000_000));
        assert_eq!(s.rate_for(2), None);
    }

    #[test]
    fn stale_and_duplicate_sequence_numbers_are_ignored() {
        let mut s = sender(4);
        s.on_feedback(at_ms(0), 1, 5_000_000, 10);
        assert_eq!(
            s.on_feedback(at_ms(1), 1, 9_000_000, 9),
            FeedbackOutcome::Stale
        );
        assert_eq!(
            s.on_feedback(at_ms(1), 1, 9_000_000, 10),
            FeedbackOutcome::Stale
        );
        assert_eq!(s.rate_for(1), Some(5_000_000));
        assert_eq!(
            s.on_feedback(at_ms(2), 1, 3_000_000, 11),
            FeedbackOutcome::Updated
        );
        assert_eq!(s.rate_for(1), Some(3_000_000));
        // Wrapping order: 0 is newer than u32::MAX.
        s.on_feedback(at_ms(3), 2, 1_000_000, u32::MAX);
        assert_eq!(
            s.on_feedback(at_ms(4), 2, 2_000_000, 0),
            FeedbackOutcome::Updated
        );
        // After a silent feedback_timeout any sequence is accepted (receiver restart).
        assert_eq!(
            s.on_feedback(at_ms(200), 1, 4_000_000, 1),
            FeedbackOutcome::Updated
        );
    }

    #[test]
    fn halves_every_timeout_without_feedback_down_to_the_floor() {
        let mut s = sender(4);
        let floor = s.config().floor;
        s.on_feedback(at_ms(0), 1, floor * 8 + 10, 1);
        assert_eq!(s.poll_at(), Some(at_ms(100)));
        let mut rates = Vec::new();
        for ms in (0..=600).step_by(10) {
            s.note_sent(at_ms(ms), 1, 1500);
            if s.poll_at().is_some_and(|t| t <= at_ms(ms)) {
                s.on_timeout(at_ms(ms));
            }
            if ms % 100 == 0 {
                rates.push(s.rate_for(1).unwrap());
            }
        }
        let r0 = floor * 8 + 10;
        assert_eq!(rates, vec![r0, r0 / 2, r0 / 4, r0 / 8, floor, floor, floor]);
        // Feedback restores the rate and restarts the timer.
        s.on_feedback(at_ms(601), 1, floor * 4, 2);
        assert_eq!(s.rate_for(1), Some(floor * 4));
        s.on_timeout(at_ms(700));
        assert_eq!(s.rate_for(1), Some(floor * 4));
        s.on_timeout(at_ms(701));
        assert_eq!(s.rate_for(1), Some(floor * 2));
    }

    #[test]
    fn idle_limiters_are_collected_and_busy_ones_kept() {
        let mut s = sender(4);
        s.on_feedback(at_ms(0), 1, 5_000_000, 1);
        s.on_feedback(at_ms(0), 2, 5_000_000, 1);
        for ms in (0..=2500).step_by(50) {
            s.note_sent(at_ms(ms), 2, 1500);
            s.on_timeout(at_ms(ms));
        }
        assert_eq!(s.rate_for(1), None, "idle limiter collected after 2 s");
        assert!(s.rate_for(2).is_some(), "busy limiter kept");
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn full_table_rejects_new_destinations_until_one_is_idle() {
        let mut s = sender(2);
        s.on_feedback(at_ms(0), 1, 5_000_000, 1);
        s.on_feedback(at_ms(0), 2, 5_000_000, 1);
        assert_eq!(
            s.on_feedback(at_ms(1), 3, 5_000_000, 1),
            FeedbackOutcome::TableFull
        );
        assert_eq!(s.rate_for(3), None);
        s.note_sent(at_ms(1500), 2, 1500);
        assert_eq!(
            s.on_feedback(at_ms(2100), 3, 5_000_000, 1),
            FeedbackOutcome::Created
        );
        assert_eq!(s.rate_for(1), None);
        assert!(s.rate_for(2).is_some());
    }

    #[test]
    fn rates_below_the_floor_are_raised() {
        let mut s = sender(1);
        s.on_feedback(at_ms(0), 1, 0, 1);
        assert_eq!(s.rate_for(1), Some(s.config().floor));
    }
}
