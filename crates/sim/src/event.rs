//! The discrete-event core: a binary heap of timestamped events on a virtual nanosecond
//! clock. Ties are broken by insertion order, so a run is a pure function of its inputs and
//! seed (no dependency owns time).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

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

/// The pending events, earliest first, FIFO among equal times.
#[derive(Default)]
pub struct EventQueue {
    heap: BinaryHeap<Reverse<(Nanos, u64, Event)>>,
    seq: u64,
    /// Events popped so far.
    pub processed: u64,
}

impl EventQueue {
    /// Schedules `event` at `at`.
    pub fn push(&mut self, at: Nanos, event: Event) {
        self.seq += 1;
        self.heap.push(Reverse((at, self.seq, event)));
    }

    /// Takes the earliest event.
    pub fn pop(&mut self) -> Option<(Nanos, Event)> {
        let Reverse((at, _, ev)) = self.heap.pop()?;
        self.processed += 1;
        Some((at, ev))
    }

    /// Time of the earliest event.
    pub fn peek_time(&self) -> Option<Nanos> {
        self.heap.peek().map(|Reverse((t, _, _))| *t)
    }

    /// Number of pending events.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// Whether nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
