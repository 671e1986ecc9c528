//! The discrete-event core: a monotone priority queue of timestamped events on a virtual
//! nanosecond clock. Ties are broken by insertion order, so a run is a pure function of its
//! inputs and seed (no dependency owns time).

use std::collections::VecDeque;

/// Virtual time in nanoseconds since the start of the run.
pub type Nanos = u64;

/// Something that happens at a point in virtual time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Event {
    /// Host `0` runs its engines; `1` is the poll generation (stale polls are skipped).
    HostPoll(u32, u32),
    /// Link `0` finished serializing its head packet.
    LinkTxDone(u32),
    /// The oldest packet in flight on link `0` reaches the far end.
    LinkArrive(u32),
    /// Application `0`'s timer; `1` is a generation the application checks.
    App(u32, u32),
    /// Periodic progress line and bookkeeping.
    Tick,
    /// Every queue's occupancy is sampled (each [`crate::world::SAMPLE_NS`]).
    Sample,
}

#[derive(Clone, Copy)]
struct Entry {
    at: Nanos,
    event: Event,
}

/// The pending events, earliest first, FIFO among equal times: the order of the binary heap
/// of `(time, insertion seq)` that this queue replaced.
///
/// A radix heap (Ahuja, Mehlhorn, Orlin, Tarjan 1990). Hand-written rather than the
/// `radix-heap` crate, whose buckets are stacks: it pops equal keys last in, first out, so
/// FIFO among equal times would need a 128-bit `(time, seq)` key and a bucket scatter for
/// every pop; keyed by time with FIFO buckets, a scatter happens once per distinct time and
/// no sequence number is stored.
///
/// The simulator never schedules before the event it is handling, so every pending time is
/// at least `last`, the time of the latest event taken. Bucket `b` (1 to 64) holds the events
/// whose time first differs from `last` at bit `b - 1`, `now` those at exactly `last`. A push
/// is O(1); taking from an empty `now` scatters the lowest non-empty bucket around its
/// minimum, and an event only ever moves to a lower bucket. Every bucket stays in insertion
/// order: a scatter only fills buckets that are empty (all buckets below the one scattered
/// are) and keeps its source's order, and a push appends the newest event.
pub struct EventQueue {
    now: VecDeque<Entry>,
    buckets: [Vec<Entry>; 64],
    /// Bit `b - 1` is set when bucket `b` is not empty.
    occupied: u64,
    last: Nanos,
    /// Events pending.
    len: usize,
    /// Events popped so far.
    pub processed: u64,
}

impl Default for EventQueue {
    fn default() -> Self {
        EventQueue {
            now: VecDeque::new(),
            buckets: std::array::from_fn(|_| Vec::new()),
            occupied: 0,
            last: 0,
            len: 0,
            processed: 0,
        }
    }
}

/// The bucket of time `at` relative to `last`: 0 when equal, else 1 + the highest differing bit.
fn bucket(at: Nanos, last: Nanos) -> usize {
    (u64::BITS - (at ^ last).leading_zeros()) as usize
}

impl EventQueue {
    /// Schedules `event` at `at`, which must not be earlier than the last event taken.
    pub fn push(&mut self, at: Nanos, event: Event) {
        assert!(
            at >= self.last,
            "event at {at} ns scheduled before {} ns",
            self.last
        );
        let entry = Entry { at, event };
        self.len += 1;
        match bucket(at, self.last) {
            0 => self.now.push_back(entry),
            b => {
                self.buckets[b - 1].push(entry);
                self.occupied |= 1 << (b - 1);
            }
        }
    }

    /// Takes the earliest event.
    pub fn pop(&mut self) -> Option<(Nanos, Event)> {
        self.refill();
        let e = self.now.pop_front()?;
        self.len -= 1;
        self.processed += 1;
        Some((e.at, e.event))
    }

    /// Time of the earliest event.
    pub fn peek_time(&mut self) -> Option<Nanos> {
        self.refill();
        self.now.front().map(|e| e.at)
    }

    /// Events pending.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no event is pending.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops the pending events for which `keep` is false; returns how many. The others keep
    /// their order (each bucket is filtered in place), so they pop exactly as they would have.
    pub fn retain(&mut self, mut keep: impl FnMut(Nanos, &Event) -> bool) -> usize {
        let before = self.len;
        self.now.retain(|e| keep(e.at, &e.event));
        self.len = self.now.len();
        for (b, bucket) in self.buckets.iter_mut().enumerate() {
            bucket.retain(|e| keep(e.at, &e.event));
            if bucket.is_empty() {
                self.occupied &= !(1 << b);
            }
            self.len += bucket.len();
        }
        before - self.len
    }

    /// When no event is due at `last`, advances `last` to the earliest pending time and
    /// scatters that time's bucket: its earliest events into `now`, the rest into lower
    /// buckets.
    fn refill(&mut self) {
        if !self.now.is_empty() || self.occupied == 0 {
            return;
        }
        let i = self.occupied.trailing_zeros() as usize;
        self.occupied &= !(1 << i);
        let mut from = std::mem::take(&mut self.buckets[i]);
        let last = from.iter().map(|e| e.at).min().expect("occupied bucket");
        self.last = last;
        for e in from.drain(..) {
            match bucket(e.at, last) {
                0 => self.now.push_back(e),
                b => {
                    self.buckets[b - 1].push(e);
                    self.occupied |= 1 << (b - 1);
                }
            }
        }
        self.buckets[i] = from;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

    #[test]
    fn earliest_first_and_fifo_among_ties() {
        let mut q = EventQueue::default();
        q.push(20, Event::Tick);
        q.push(10, Event::App(1, 0));
        q.push(10, Event::App(2, 0));
        q.push(5, Event::LinkArrive(3));
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(
            order,
            vec![
                (5, Event::LinkArrive(3)),
                (10, Event::App(1, 0)),
                (10, Event::App(2, 0)),
                (20, Event::Tick)
            ]
        );
        assert_eq!(q.processed, 4);
    }

    /// The order the simulator had with a binary heap of `(time, seq, event)`, for random
    /// interleavings of pushes and pops at or after the last popped time, with many ties and
    /// delays from 0 to far beyond a bucket's width.
    #[test]
    fn pops_in_the_order_of_a_binary_heap() {
        for seed in 0..20 {
            let mut rng = SmallRng::seed_from_u64(seed);
            let mut q = EventQueue::default();
            let mut reference = BinaryHeap::new();
            let (mut seq, mut now, mut popped) = (0u64, 0u64, 0u64);
            for _ in 0..20_000 {
                if rng.gen_bool(0.55) {
                    let delay = match rng.gen_range(0..4) {
                        0 => 0,
                        1 => rng.gen_range(0..4),
                        2 => rng.gen_range(0..10_000),
                        _ => {
                            let bits = rng.gen_range(1..40);
                            rng.gen_range(0..1u64 << bits)
                        }
                    };
                    let ev = Event::App(rng.gen(), rng.gen());
                    seq += 1;
                    q.push(now + delay, ev);
                    reference.push(Reverse((now + delay, seq, ev)));
                } else {
                    assert_eq!(q.peek_time(), reference.peek().map(|r| r.0 .0));
                    let want = reference.pop().map(|Reverse((t, _, ev))| (t, ev));
                    assert_eq!(q.pop(), want);
                    if let Some((t, _)) = want {
                        now = t;
                        popped += 1;
                    }
                }
            }
            while let Some(Reverse((t, _, ev))) = reference.pop() {
                assert_eq!(q.pop(), Some((t, ev)));
                popped += 1;
            }
            assert_eq!(q.pop(), None);
            assert_eq!(q.processed, popped);
        }
    }

    /// Dropping events leaves the others' order as it was: a random schedule (as above) from
    /// which the events of odd generation are dropped now and then pops exactly what the same
    /// schedule unfiltered pops, less the dropped events.
    #[test]
    fn retain_keeps_the_order_of_the_rest() {
        for seed in 0..10 {
            let mut rng = SmallRng::seed_from_u64(seed);
            let (mut q, mut full) = (EventQueue::default(), EventQueue::default());
            let mut dropped = std::collections::HashSet::new();
            let (mut now, mut id) = (0u64, 0u32);
            let was_dropped = |dropped: &std::collections::HashSet<u32>, ev: &Event| matches!(ev, Event::App(i, _) if dropped.contains(i));
            for _ in 0..20_000 {
                match rng.gen_range(0..20) {
                    0..=10 => {
                        let bits = rng.gen_range(1..30);
                        let at = now + rng.gen_range(0..1u64 << bits) * rng.gen_range(0..2);
                        let ev = Event::App(id, rng.gen());
                        id += 1;
                        q.push(at, ev);
                        full.push(at, ev);
                    }
                    11 => {
                        let pending = q.len();
                        let n = q.retain(|_, ev| match *ev {
                            Event::App(i, g) if g % 2 == 1 => !dropped.insert(i),
                            _ => true,
                        });
                        assert_eq!(q.len(), pending - n);
                    }
                    _ => {
                        // `full` also pops the dropped events; pushes go after all it popped.
                        let mut want = None;
                        while let Some((t, ev)) = full.pop() {
                            now = now.max(t);
                            if !was_dropped(&dropped, &ev) {
                                want = Some((t, ev));
                                break;
                            }
                        }
                        assert_eq!(q.pop(), want);
                    }
                }
            }
            let rest: Vec<_> = std::iter::from_fn(|| full.pop())
                .filter(|(_, ev)| !was_dropped(&dropped, ev))
                .collect();
            assert_eq!(std::iter::from_fn(|| q.pop()).collect::<Vec<_>>(), rest);
            assert!(q.is_empty() && !dropped.is_empty());
        }
    }

    #[test]
    #[should_panic(expected = "scheduled before")]
    fn refuses_an_event_in_the_past() {
        let mut q = EventQueue::default();
        q.push(10, Event::Tick);
        q.pop();
        q.push(9, Event::Tick);
    }
}
