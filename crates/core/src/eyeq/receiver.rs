//! The receiver module (EyeQ's REM, sections 3.2 and 3.4): per-endpoint rate meters, the RX
//! scheduler and one rate controller per endpoint, plus feedback sampling.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use super::EyeqError;
use crate::time::{Duration, Instant, NANOS_PER_SEC};

/// Parameters of a [`Receiver`]. `Default` gives EyeQ's values for a 10 Gb/s link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiverConfig {
    /// Raw capacity of the receiving resource in units/s (bytes/s for a link).
    pub capacity: u64,
    /// Capacity kept free for latency, in thousandths (EyeQ 2.2 reserves 10%: 100).
    pub headroom_permille: u32,
    /// Capacity kept free while the receiver has a single endpoint, in thousandths (the
    /// smaller of this and `headroom_permille` is used). The headroom keeps the resource's
    /// queue short for the other endpoints' traffic (EyeQ 3.2): an endpoint with no other
    /// beside it has nobody to protect and may use nearly all of it (work conservation).
    /// Equal to `headroom_permille`: EyeQ's fixed headroom.
    pub solo_headroom_permille: u32,
    /// Metering window; rates are recomputed at the end of each (EyeQ 3.2: 200 us).
    pub window: Duration,
    /// RCP gain alpha in thousandths (500 = 0.5, as in EyeQ's implementation; stable for
    /// alpha < 2 and monotone for alpha < 1 by the logistic-map analysis of EyeQ 3.4).
    pub alpha_permille: u32,
    /// Lowest rate ever advertised, in units/s (EyeQ's implementation: 1 Mb/s).
    pub min_rate: u64,
    /// Sample one packet for feedback every this many units received per endpoint
    /// (EyeQ 3.2: 10 kB, which bounds feedback bandwidth).
    pub feedback_units: u64,
    /// Also sample a packet when this long has passed since the endpoint's last feedback, so
    /// slow endpoints still reach their senders (EyeQ's implementation: 100 us). `None`: off.
    pub feedback_interval: Option<Duration>,
    /// The interval sample's period instead of `feedback_interval` while the endpoint is
    /// quiet: it advertises its whole allotment (R_i = C_i, nothing to hold back) and its
    /// last feedback carried that rate, so a feedback would say nothing new and only keeps
    /// senders' limiters from halving (every `feedback_timeout`, 100 ms). Byte samples are
    /// unchanged. Each feedback is a frame that wakes the sender's switch: one per packet of
    /// a slow flow otherwise. `None`: always `feedback_interval` (EyeQ's implementation).
    pub quiet_feedback_interval: Option<Duration>,
    /// An endpoint that received nothing for this long leaves the active set and gives its
    /// share to the others (EyeQ 3.2: A is the set of endpoints receiving at non-zero rate).
    pub idle_after: Duration,
}

impl Default for ReceiverConfig {
    fn default() -> Self {
        ReceiverConfig {
            capacity: 10_000_000_000 / 8,
            headroom_permille: 100,
            solo_headroom_permille: 100,
            window: Duration::from_micros(200),
            alpha_permille: 500,
            min_rate: 1_000_000 / 8,
            feedback_units: 10_000,
            feedback_interval: Some(Duration::from_micros(100)),
            quiet_feedback_interval: None,
            idle_after: Duration::from_millis(1),
        }
    }
}

impl ReceiverConfig {
    /// A sender counts as one of an endpoint's for twice `idle_after` after its last packet,
    /// so one held to a small share, sending rarely, is still counted.
    fn senders_horizon(&self) -> Duration {
        Duration::from_nanos(self.idle_after.as_nanos().saturating_mul(2))
    }

    fn validate(&self) -> Result<(), EyeqError> {
        if self.capacity == 0 {
            return Err(EyeqError::InvalidConfig("capacity must be > 0"));
        }
        if self.headroom_permille >= 1000 {
            return Err(EyeqError::InvalidConfig("headroom_permille must be < 1000"));
        }

        if self.window == Duration::ZERO {
            return Err(EyeqError::InvalidConfig("window must be > 0"));
        }
        if self.alpha_permille == 0 || self.alpha_permille >= 2000 {
            return Err(EyeqError::InvalidConfig(
                "alpha_permille must be in 1..2000 (alpha in (0, 2) for stability)",
            ));
        }
        if self.feedback_units == 0 {
            return Err(EyeqError::InvalidConfig("feedback_units must be > 0"));
        }
        Ok(())
    }
}

/// The service level of one receiving endpoint (VM or container).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointConfig {
    /// Minimum guarantee B_i in units/s; also its weight when sharing capacity. Must be > 0.
    pub guarantee: u64,
    /// Optional maximum receive rate in units/s.
    pub max_rate: Option<u64>,
}

/// Congestion feedback to send to the source of a sampled packet (EyeQ's "HACK", 3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Feedback<K, S> {
    /// The receiving endpoint the rate applies to.
    pub endpoint: K,
    /// The source of the sampled packet: where to send this feedback.
    pub source: S,
    /// Advertised rate R_i in units/s: each sender to `endpoint` should send at most this.
    pub rate: u64,
    /// Per-endpoint sequence number, increasing (wrapping) with every feedback, so senders
    /// can ignore reordered stale feedback.
    pub seq: u32,
}

/// What the receiver currently knows and decides about one endpoint, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointStats {
    /// The endpoint's configured service level.
    pub config: EndpointConfig,
    /// Whether it received traffic recently (is in EyeQ's active set A).
    pub active: bool,
    /// Capacity C_i allotted by the RX scheduler, in units/s (0 when inactive).
    pub allowed: u64,
    /// Rate R_i advertised to each of its senders, in units/s (0 when inactive).
    pub advertised: u64,
    /// Receive rate y_i measured over the last closed window, in units/s.
    pub measured: u64,
    /// Feedback messages generated for it so far.
    pub feedbacks: u64,
}

/// How recently an endpoint must have received to count in [`Receiver::aggregate`].
pub const AGGREGATE_RECENT: Duration = Duration::from_millis(100);

/// A receiver's recently receiving endpoints taken together ([`Receiver::aggregate`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Aggregate {
    /// Endpoints that received recently.
    pub active: u32,
    /// Sum of their guarantees.
    pub guarantee: u64,
    /// Sum of their demands, units/s.
    pub demand: u64,
    /// Sum of every endpoint's guarantee, active or not.
    pub reserve: u64,
}

/// Units received in the current metering window. Private so that a shared meter type can
/// replace it without touching the rest of the module.
#[derive(Debug, Default, Clone, Copy)]
struct WindowCounter {
    units: u64,
}

impl WindowCounter {
    fn add(&mut self, units: u64) {
        self.units = self.units.saturating_add(units);
    }

    /// Rate over a window of `elapsed`, in units/s; starts the next window.
    fn close(&mut self, elapsed: Duration) -> u64 {
        let units = core::mem::take(&mut self.units);
        let ns = elapsed.as_nanos().max(1) as u128;
        (units as u128 * NANOS_PER_SEC as u128 / ns).min(u64::MAX as u128) as u64
    }
}

/// The least rate advertised to N senders, as a fraction of C_i / N (see
/// `Receiver::close_window`).
const FAIR_FLOOR: (u64, u64) = (3, 4);

/// Most senders of one endpoint told apart; with more, [`Senders::count`] gives up.
const SENDERS_TRACKED: usize = 16;

/// The distinct senders of an endpoint lately: a 64-bit hash of each and when it last sent.
#[derive(Debug, Default, Clone, Copy)]
struct Senders {
    seen: [(u64, Instant); SENDERS_TRACKED],
    len: usize,
    /// More senders than tracked came until then.
    many_until: Option<Instant>,
}

impl Senders {
    fn add<S: Hash>(&mut self, now: Instant, source: &S, horizon: Duration) {
        // Once per received frame, so FxHash rather than SipHash: a collision only counts
        // two senders as one, which makes the fair start laxer, never stricter.
        let mut h = rustc_hash::FxHasher::default();
        source.hash(&mut h);
        let hash = h.finish();
        let seen = &mut self.seen[..self.len];
        if let Some(entry) = seen.iter_mut().find(|(s, _)| *s == hash) {
            entry.1 = now;
        } else if self.len < SENDERS_TRACKED {
            self.seen[self.len] = (hash, now);
            self.len += 1;
        } else if let Some(old) = seen
            .iter_mut()
            .find(|(_, last)| now.saturating_since(*last) >= horizon)
        {
            *old = (hash, now);
        } else {
            self.many_until = Some(now + horizon);
        }
    }

    /// How many sent within `horizon` before `now`; `None` when more than can be told apart.
    fn count(&self, now: Instant, horizon: Duration) -> Option<u64> {
        if self.many_until.is_some_and(|t| now < t) {
            return None;
        }
        let recent = self.seen[..self.len]
            .iter()
            .filter(|(_, last)| now.saturating_since(*last) < horizon)
            .count();
        Some(recent.max(1) as u64)
    }

    /// When [`count`](Self::count) next changes after `now` with no sender added: a sender
    /// leaves the horizon, or the time with too many to tell apart ends.
    fn next_change(&self, now: Instant, horizon: Duration) -> Option<Instant> {
        self.seen[..self.len]
            .iter()
            .map(|&(_, last)| last + horizon)
            .chain(self.many_until)
            .filter(|&t| t > now)
            .min()
    }
}

#[derive(Debug)]
struct Endpoint<K> {
    id: K,
    config: EndpointConfig,
    meter: WindowCounter,
    active: bool,
    /// Active, but no full window measured since it became active: its demand is unknown.
    fresh: bool,
    last_rx: Instant,
    allowed: u64,
    advertised: u64,
    measured: u64,
    units_since_feedback: u64,
    last_feedback: Option<Instant>,
    /// The rate the last feedback carried.
    fed_back: Option<u64>,
    seq: u32,
    feedbacks: u64,
    /// Scratch flag of the water-filling in [`Receiver::reallocate`].
    settled: bool,
    /// Its senders lately, and how many there were at the last window's end (`u64::MAX`: too
    /// many to tell).
    senders: Senders,
    sender_count: u64,
    /// Scratch: `(allowed, advertised)` before the window being closed, so
    /// [`Receiver::close_window`] can tell whether it changed anything.
    before: (u64, u64),
}

impl<K> Endpoint<K> {
    fn max_rate(&self) -> u64 {
        self.config.max_rate.unwrap_or(u64::MAX)
    }

    /// Demand estimate for the RX scheduler. An endpoint is limited by its own traffic when
    /// its controller already advertises its whole allotment (every sender may send C_i)
    /// and it still received under 90% of it: it wants what it received, so the rest can go
    /// to the others (work conservation). Any other endpoint (throttled, fully using its
    /// allotment, or fresh) may want up to its max.
    fn demand(&self) -> u64 {
        let traffic_limited = !self.fresh
            && self.advertised >= self.allowed
            && (self.measured as u128) * 10 < (self.allowed as u128) * 9;
        if traffic_limited {
            self.measured.min(self.max_rate())
        } else {
            self.max_rate()
        }
    }
}

/// EyeQ's receiver module for one receiving resource, over endpoints keyed by `K`.
///
/// Feed every received packet to [`on_packet`](Self::on_packet). Meter windows are closed
/// either on a timer, [`on_timeout`](Self::on_timeout) at [`poll_at`](Self::poll_at), or
/// when somebody needs them: [`catch_up`](Self::catch_up) after the owner was idle closes
/// every window that ended meanwhile as that timer would have, so an owner need not wake for
/// them (EyeQ 3.2 recomputes the rates once per window; what a closed window changes is only
/// observed when a packet arrives or the state is read). Both close a window that ended while
/// the owner was busy when it next looks, late (`on_packet` too). Endpoint registration
/// allocates; the per-packet path does not.
#[derive(Debug)]
pub struct Receiver<K> {
    config: ReceiverConfig,
    endpoints: Vec<Endpoint<K>>,
    index: HashMap<K, usize>,
    window_start: Instant,
    /// Whether anything was metered since the window started.
    window_busy: bool,
}

impl<K: Copy + Eq + Hash> Receiver<K> {
    /// A receiver with no endpoints whose first window starts at `now`.
    pub fn new(config: ReceiverConfig, now: Instant) -> Result<Self, EyeqError> {
        config.validate()?;
        Ok(Receiver {
            config,
            endpoints: Vec::new(),
            index: HashMap::new(),
            window_start: now,
            window_busy: false,
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &ReceiverConfig {
        &self.config
    }

    /// Capacity shared among endpoints: raw capacity minus headroom (the solo headroom with a
    /// single endpoint), in units/s.
    pub fn shared_capacity(&self) -> u64 {
        let headroom = if self.endpoints.len() <= 1 {
            self.config
                .solo_headroom_permille
                .min(self.config.headroom_permille)
        } else {
            self.config.headroom_permille
        };
        (self.config.capacity as u128 * (1000 - headroom) as u128 / 1000) as u64
    }

    /// Changes the raw capacity (PicNIC: processing capacity varies, so it is measured and
    /// updated). Takes effect at once for the allocation.
    pub fn set_capacity(&mut self, capacity: u64) -> Result<(), EyeqError> {
        if capacity == 0 {
            return Err(EyeqError::InvalidConfig("capacity must be > 0"));
        }
        self.config.capacity = capacity;
        self.reallocate();
        Ok(())
    }

    /// Registers an endpoint; it stays inactive until it receives traffic.
    pub fn add_endpoint(&mut self, id: K, config: EndpointConfig) -> Result<(), EyeqError> {
        Self::check_endpoint(&config)?;
        if self.index.contains_key(&id) {
            return Err(EyeqError::DuplicateEndpoint);
        }
        self.index.insert(id, self.endpoints.len());
        self.endpoints.push(Endpoint {
            id,
            config,
            meter: WindowCounter::default(),
            active: false,
            fresh: false,
            last_rx: Instant::ZERO,
            allowed: 0,
            advertised: 0,
            measured: 0,
            units_since_feedback: 0,
            last_feedback: None,
            fed_back: None,
            seq: 0,
            feedbacks: 0,
            settled: false,
            senders: Senders::default(),
            sender_count: 0,
            before: (0, 0),
        });
        // A second endpoint ends a solo receiver's small headroom at once.
        self.reallocate();
        Ok(())
    }

    /// Changes an endpoint's guarantee or maximum; takes effect at once.
    pub fn set_endpoint(&mut self, id: K, config: EndpointConfig) -> Result<(), EyeqError> {
        Self::check_endpoint(&config)?;
        let i = *self.index.get(&id).ok_or(EyeqError::UnknownEndpoint)?;
        self.endpoints[i].config = config;
        self.reallocate();
        Ok(())
    }

    /// Unregisters an endpoint; its share goes to the others at once.
    pub fn remove_endpoint(&mut self, id: K) -> Result<(), EyeqError> {
        let i = self.index.remove(&id).ok_or(EyeqError::UnknownEndpoint)?;
        self.endpoints.swap_remove(i);
        if let Some(moved) = self.endpoints.get(i) {
            self.index.insert(moved.id, i);
        }
        self.reallocate();
        Ok(())
    }

    fn check_endpoint(config: &EndpointConfig) -> Result<(), EyeqError> {
        if config.guarantee == 0 {
            return Err(EyeqError::InvalidConfig("endpoint guarantee must be > 0"));
        }
        if config.max_rate == Some(0) {
            return Err(EyeqError::InvalidConfig("endpoint max_rate must be > 0"));
        }
        Ok(())
    }

    /// Accounts a packet of `units` received for `endpoint` from `source` and returns the
    /// feedback to send to `source` when this packet is sampled (EyeQ 3.2: one every
    /// `feedback_units` received by the endpoint, or after `feedback_interval`, or
    /// `quiet_feedback_interval` while the endpoint is quiet).
    pub fn on_packet<S: Hash>(
        &mut self,
        now: Instant,
        endpoint: K,
        source: S,
        units: u64,
    ) -> Result<Option<Feedback<K, S>>, EyeqError> {
        let i = *self
            .index
            .get(&endpoint)
            .ok_or(EyeqError::UnknownEndpoint)?;
        if now >= self.window_end() {
            self.close_window(now);
        }
        self.window_busy = true;
        let ep = &mut self.endpoints[i];
        ep.meter.add(units);
        ep.senders.add(now, &source, self.config.senders_horizon());
        ep.last_rx = now;
        if !ep.active {
            // A newly active endpoint joins A; it starts advertising its whole allotment
            // and RCP brings the rate down if it has several senders.
            ep.active = true;
            ep.fresh = true;
            self.reallocate();
            let ep = &mut self.endpoints[i];
            ep.advertised = ep.allowed;
        }
        let ep = &mut self.endpoints[i];
        ep.units_since_feedback = ep.units_since_feedback.saturating_add(units);
        let quiet = ep.advertised >= ep.allowed && ep.fed_back == Some(ep.advertised);
        let interval = match self.config.quiet_feedback_interval {
            Some(long) if quiet => Some(long),
            _ => self.config.feedback_interval,
        };
        let interval_due = match (interval, ep.last_feedback) {
            (Some(interval), Some(last)) => now.saturating_since(last) >= interval,
            (_, None) => true,
            (None, Some(_)) => false,
        };
        if ep.units_since_feedback < self.config.feedback_units && !interval_due {
            return Ok(None);
        }
        ep.units_since_feedback = 0;
        ep.last_feedback = Some(now);
        ep.fed_back = Some(ep.advertised);
        ep.seq = ep.seq.wrapping_add(1);
        ep.feedbacks += 1;
        Ok(Some(Feedback {
            endpoint,
            source,
            rate: ep.advertised,
            seq: ep.seq,
        }))
    }

    /// Tells the receiver that `endpoint` received until `last_rx` by another path whose
    /// arrivals are counted later, with [`on_packet`](Self::on_packet) (a kernel fast path's
    /// counters, read once a window or so). An active endpoint then counts as receiving
    /// until `last_rx`, so a window closed at the late read does not take it for idle and
    /// restart it fresh at its whole allotment (EyeQ 3.2's active set is about arrivals,
    /// not about when they are counted). Call it for every endpoint read before counting
    /// any: counting one may close the window for all.
    pub fn received_until(&mut self, endpoint: K, last_rx: Instant) {
        if let Some(&i) = self.index.get(&endpoint) {
            let ep = &mut self.endpoints[i];
            if ep.active {
                ep.last_rx = ep.last_rx.max(last_rx);
            }
        }
    }

    /// The feedback just sampled for `endpoint` left at a lower rate than this receiver
    /// advertises: its owner sends the lowest of several controllers' rates (another
    /// resource, or backpressure, capped it). The endpoint is then not quiet, so it is
    /// sampled every `feedback_interval` while capped and its senders learn promptly when
    /// the cap lifts, not a `quiet_feedback_interval` later.
    pub fn fed_back_capped(&mut self, endpoint: K) {
        if let Some(&i) = self.index.get(&endpoint) {
            self.endpoints[i].fed_back = None;
        }
    }

    /// When the current window ends and [`on_timeout`](Self::on_timeout) should be called,
    /// by an owner that closes windows on a timer (one using [`catch_up`](Self::catch_up)
    /// need not wake for it). While no endpoint is active and nothing arrived in the window
    /// there is nothing to close: `None`, so an idle receiver wakes nobody (the next packet
    /// closes the window).
    pub fn poll_at(&self) -> Option<Instant> {
        (self.window_busy || self.endpoints.iter().any(|ep| ep.active)).then(|| self.window_end())
    }

    /// Closes the current window if it has ended: measures every endpoint, updates the
    /// active set and allocation, and runs one RCP step per active endpoint. A late close
    /// measures over the real elapsed time.
    pub fn on_timeout(&mut self, now: Instant) {
        if now >= self.window_end() {
            self.close_window(now);
        }
    }

    /// Brings the receiver to `now` for an owner that last looked at it before `idle_from`
    /// (busy until then, looking at least once a window or closing late as `on_timeout`)
    /// and was idle from `idle_from` to `now`: a window that ended while it was busy is
    /// closed at `idle_from`, late, and every window that ended while it was idle at its own
    /// end, so the state is the one a timer at [`poll_at`](Self::poll_at) would have left
    /// without waking the owner. Cheap when no window ended (a comparison).
    pub fn catch_up(&mut self, idle_from: Instant, now: Instant) {
        let idle_from = idle_from.min(now);
        if self.poll_at().is_some_and(|end| end <= idle_from) {
            self.close_window(idle_from);
        }
        self.close_ended(now);
    }

    /// The endpoints that received in the last [`AGGREGATE_RECENT`] taken together, as one endpoint
    /// of a larger resource: how many, the sum of their guarantees and of their demands (an
    /// active one's as the RX scheduler estimates it, see `Endpoint::demand`; one idle for
    /// the moment may want up to its max; saturating), and every endpoint's guarantees.
    /// Several receivers sharing one resource (a switch's workers, each with the endpoints of
    /// its VMs) are given their parts of it by these ([`Self::set_capacity`]); counting
    /// endpoints over 100 ms rather than EyeQ's 1 ms active set keeps a bursty one counted
    /// between its bursts.
    pub fn aggregate(&self, now: Instant) -> Aggregate {
        let mut a = Aggregate::default();
        for ep in &self.endpoints {
            a.reserve = a.reserve.saturating_add(ep.config.guarantee);
            // Its first packet is always sampled for feedback: it received at least once.
            let received = ep.last_feedback.is_some();
            if !received || now.saturating_since(ep.last_rx) >= AGGREGATE_RECENT {
                continue;
            }
            a.active += 1;
            a.guarantee = a.guarantee.saturating_add(ep.config.guarantee);
            let demand = if ep.active {
                ep.demand()
            } else {
                ep.max_rate()
            };
            a.demand = a.demand.saturating_add(demand);
        }
        a
    }

    /// Metrics of one endpoint.
    pub fn endpoint(&self, id: K) -> Option<EndpointStats> {
        let i = *self.index.get(&id)?;
        Some(Self::stats(&self.endpoints[i]))
    }

    /// Metrics of every endpoint, in no particular order.
    pub fn endpoints(&self) -> impl Iterator<Item = (K, EndpointStats)> + '_ {
        self.endpoints.iter().map(|ep| (ep.id, Self::stats(ep)))
    }

    fn stats(ep: &Endpoint<K>) -> EndpointStats {
        EndpointStats {
            config: ep.config,
            active: ep.active,
            allowed: ep.allowed,
            advertised: ep.advertised,
            measured: ep.measured,
            feedbacks: ep.feedbacks,
        }
    }

    fn window_end(&self) -> Instant {
        self.window_start + self.config.window
    }

    /// Closes, lazily, every window that ended by `now`, as a timer firing at each window's
    /// end would have closed it (the owner was idle since the last look).
    ///
    /// EyeQ 3.2 computes the receive rates and runs the RX scheduler and RCP once per
    /// metering window (200 us). What a closed window changes (measured rates, the active
    /// set, the allocation, the advertised rates) is only observed when a packet arrives
    /// (its feedback carries the advertised rate), when the state is read (the switch's
    /// aggregate, metrics) or changed (capacity, endpoints). Closing each window on a timer
    /// woke the switch's loop every window (605 us at 200 Mb/s) while an endpoint was
    /// active, even a 1,000/s RPC's, for a pass that handled no frame (docs/BENCHMARKS.md,
    /// "The fast path at low load"). So the windows are closed when the state is needed,
    /// each at its own end, with the same result:
    ///
    /// - the first window that ended holds every unit metered since it started (a packet
    ///   arriving after it ended is metered after a catch-up), measured over one window;
    /// - each later window measured nothing: a step of the idle check (at that window's
    ///   end), the allocation, and RCP (the rate climbs towards the allotment);
    /// - bounded: once a closed empty window changes nothing, the next ones change nothing
    ///   until an endpoint's `idle_after` runs out or one of its senders leaves the sender
    ///   count (the fair start compares the count with the previous window's, so that must
    ///   be the count at that window's end), so those are skipped to the window in which the
    ///   first of these happens; once no endpoint is active and the window is empty, nothing
    ///   is left to close (no timer was armed): the window is left for the next packet to
    ///   close, late, as with a timer.
    fn close_ended(&mut self, now: Instant) {
        let window = self.config.window;
        let mut first = true;
        while now >= self.window_end() {
            if !self.window_busy && !self.endpoints.iter().any(|ep| ep.active) {
                // Idle: no timer would have been armed.
                return;
            }
            let end = self.window_end();
            let changed = self.close_window(end);
            if first || changed {
                first = false;
                continue;
            }
            // A fixed point of empty windows until the next endpoint goes idle or the next
            // sender count changes: skip to the window whose end is the first at or after
            // that.
            let Some(idle_at) = self
                .endpoints
                .iter()
                .filter(|ep| ep.active)
                .map(|ep| ep.last_rx + self.config.idle_after)
                .min()
            else {
                continue;
            };
            let horizon = self.config.senders_horizon();
            let next_at = self
                .endpoints
                .iter()
                .filter_map(|ep| ep.senders.next_change(end, horizon))
                .fold(idle_at, Instant::min);
            let w = window.as_nanos();
            let start = self.window_start.as_nanos();
            // Windows to skip: those ending before `next_at`, and none ending after `now`.
            let before_next = next_at.as_nanos().saturating_sub(start).div_ceil(w).max(1) - 1;
            let before_now = now.as_nanos().saturating_sub(start) / w;
            self.window_start += Duration::from_nanos(before_next.min(before_now) * w);
        }
    }

    /// Ends the window at `end`, measuring over the time since it started (more than a
    /// window when it is closed late). Returns whether it changed any endpoint's state.
    fn close_window(&mut self, end: Instant) -> bool {
        let elapsed = end.saturating_since(self.window_start);
        let mut changed = false;
        for ep in &mut self.endpoints {
            let measured = ep.meter.close(elapsed);
            changed |= measured != ep.measured;
            ep.measured = measured;
            if ep.active && end.saturating_since(ep.last_rx) >= self.config.idle_after {
                ep.active = false;
                changed = true;
            }
            ep.before = (ep.allowed, ep.advertised);
        }
        self.reallocate();
        let (alpha, min_rate) = (self.config.alpha_permille, self.config.min_rate);
        let senders_horizon = self.config.senders_horizon();
        for ep in &mut self.endpoints {
            // Counted in every window, so that senders that come back after a pause shorter
            // than the horizon are not new ones, and a burst after a longer one starts afresh.
            let count = ep.senders.count(end, senders_horizon);
            let last_count = core::mem::replace(&mut ep.sender_count, count.unwrap_or(u64::MAX));
            if !ep.active {
                continue;
            }
            let mut rate = rcp_step(ep.advertised, ep.measured, ep.allowed, alpha, min_rate);
            // With N senders the fair rate is at least C_i / N (were each held to it, y would
            // be C_i). Senders that appear while the endpoint is overloaded start at that share
            // at once (RCP's C/N start), not at the rate advertised to fewer: at a burst's
            // onset EyeQ 3.4's step is bounded by y, which the access link caps, so it would
            // take several windows while the link's queue overflows. And the rate is kept
            // above FAIR_FLOOR of it: y rises above C_i while a queue drains into the link,
            // and cuts in every window of that, before the first can show, compound (a lone
            // TCP sender fell from 450 to 9 Mb/s in 2 ms). Below C_i / N, RCP still corrects
            // senders that overshoot their rate and a count that missed some.
            if let Some(n) = count {
                let fair = ep.allowed / n;
                if ep.measured > ep.allowed && n > last_count {
                    rate = rate.min(fair.max(min_rate));
                }
                let floor = (fair as u128 * FAIR_FLOOR.0 as u128 / FAIR_FLOOR.1 as u128) as u64;
                rate = rate.max(floor.max(min_rate)).min(ep.allowed);
            }
            ep.advertised = rate;
            changed |= ep.fresh;
            ep.fresh = false;
        }
        changed |= self
            .endpoints
            .iter()
            .any(|ep| ep.before != (ep.allowed, ep.advertised));
        self.window_start = end;
        self.window_busy = false;
        changed
    }

    /// EyeQ's RX scheduler (3.2), made work conserving by weighted water-filling.
    ///
    /// Every active endpoint i is first guaranteed `min(max_i, B_i * C / sum_{j in A} B_j)`,
    /// EyeQ's formula, so it can always ramp up to its share. What endpoints leave unused
    /// (inactive ones by not being in A; capped ones at their max; traffic-limited ones at
    /// their measured rate) is shared
    /// among the remaining ones by weight (see `Endpoint::demand`), repeatedly, until every one is either settled at
    /// its demand or gets a weighted share of the rest. C_i is the larger of the two. The
    /// sum may exceed C for a while when a traffic-limited endpoint grows; the next windows
    /// take it back from the others through their controllers.
    fn reallocate(&mut self) {
        let capacity = self.shared_capacity() as u128;
        let mut total_weight: u128 = 0;
        for ep in &mut self.endpoints {
            ep.settled = !ep.active;
            if ep.active {
                total_weight += ep.config.guarantee as u128;
            }
        }
        let mut remaining = capacity;
        let mut unsettled_weight = total_weight;
        let mut settled_any = true;
        while settled_any && unsettled_weight > 0 {
            settled_any = false;
            for ep in self.endpoints.iter_mut().filter(|ep| !ep.settled) {
                let weight = ep.config.guarantee as u128;
                let share = remaining * weight / unsettled_weight;
                let demand = ep.demand() as u128;
                if demand <= share {
                    ep.settled = true;
                    ep.allowed = demand as u64;
                    remaining -= demand;
                    unsettled_weight -= weight;
                    settled_any = true;
                }
            }
        }
        for ep in &mut self.endpoints {
            if !ep.active {
                ep.allowed = 0;
                ep.advertised = 0;
                continue;
            }
            let weight = ep.config.guarantee as u128;
            if !ep.settled {
                ep.allowed = (remaining * weight / unsettled_weight) as u64;
            }
            let guaranteed = (capacity * weight / total_weight).min(ep.max_rate() as u128) as u64;
            ep.allowed = ep.allowed.max(guaranteed);
        }
    }
}

/// One RCP step (EyeQ 3.4): `R <- R * (1 - alpha * (y - C) / C)`, clamped to
/// `[min_rate, C]`. A decrease never goes below `R * C / y`, the rate at which y would equal C
/// if every sender sent at R: that keeps R positive (as 3.4 requires) without collapsing it
/// to `min_rate` when a burst overshoots C many times, since sampled feedback reaches slow
/// senders rarely and they would take long to climb back. Exact integer arithmetic.
fn rcp_step(rate: u64, measured: u64, allowed: u64, alpha_permille: u32, min_rate: u64) -> u64 {
    if allowed == 0 {
        return 0;
    }
    let (r, y, c) = (rate as i128, measured as i128, allowed as i128);
    let factor_num = c * 1000 - alpha_permille as i128 * (y - c);
    let mut next = (r * factor_num / (c * 1000)).max(0);
    if y > c {
        next = next.max(r * c / y);
    }
    (next as u64).max(min_rate).min(allowed)
}

#[cfg(test)]
mod tests;
