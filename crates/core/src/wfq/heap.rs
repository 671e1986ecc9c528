//! An indexed binary min-heap of `(key, id)` pairs.
//!
//! Each id's position is kept in a caller-owned slice so that any entry can be
//! re-keyed or removed in O(log n). The scheduler keeps one heap per interior
//! node (its eligible children, keyed by start tag) and one for throttled nodes
//! (keyed by the time their cap allows them again); positions live in separate
//! per-slot arrays, which the generic crates (`priority-queue`,
//! `keyed_priority_queue`) cannot do without hashing. Ties are broken by id, so
//! the order is fully deterministic.

/// Position of an id that is not in the heap.
pub(crate) const ABSENT: u32 = u32::MAX;

/// Min-heap ordered by `(key, id)`.
#[derive(Debug, Default)]
pub(crate) struct Heap {
    entries: Vec<(u128, u32)>,
}

impl Heap {
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Makes room for `additional` more entries so later pushes do not allocate.
    pub(crate) fn reserve(&mut self, additional: usize) {
        self.entries.reserve(additional);
    }

    /// The smallest entry.
    pub(crate) fn peek(&self) -> Option<(u128, u32)> {
        self.entries.first().copied()
    }

    pub(crate) fn push(&mut self, key: u128, id: u32, pos: &mut [u32]) {
        let at = self.entries.len();
        self.entries.push((key, id));
        pos[id as usize] = at as u32;
        self.sift_up(at, pos);
    }

    /// Removes the entry of `id` (which must be in this heap).
    pub(crate) fn remove(&mut self, id: u32, pos: &mut [u32]) {
        let at = pos[id as usize] as usize;
        pos[id as usize] = ABSENT;
        let last = self.entries.len() - 1;
        if at != last {
            self.entries.swap(at, last);
            self.entries.pop();
            let moved = self.entries[at].1;
            pos[moved as usize] = at as u32;
            self.restore(at, pos);
        } else {
            self.entries.pop();
        }
    }

    /// Changes the key of `id` (which must be in this heap).
    pub(crate) fn rekey(&mut self, id: u32, key: u128, pos: &mut [u32]) {
        let at = pos[id as usize] as usize;
        self.entries[at].0 = key;
        self.restore(at, pos);
    }

    fn restore(&mut self, at: usize, pos: &mut [u32]) {
        let at = self.sift_up(at, pos);
        self.sift_down(at, pos);
    }

    fn sift_up(&mut self, mut at: usize, pos: &mut [u32]) -> usize {
        let entry = self.entries[at];
        while at > 0 {
            let up = (at - 1) / 2;
            if self.entries[up] <= entry {
                break;
            }
            self.entries[at] = self.entries[up];
            pos[self.entries[at].1 as usize] = at as u32;
            at = up;
        }
        self.entries[at] = entry;
        pos[entry.1 as usize] = at as u32;
        at
    }

    fn sift_down(&mut self, mut at: usize, pos: &mut [u32]) {
        let entry = self.entries[at];
        let n = self.entries.len();
        loop {
            let left = 2 * at + 1;
            if left >= n {
                break;
            }
            let right = left + 1;
            let child = if right < n && self.entries[right] < self.entries[left] {
                right
            } else {
                left
            };
            if entry <= self.entries[child] {
                break;
            }
            self.entries[at] = self.entries[child];
            pos[self.entries[at].1 as usize] = at as u32;
            at = child;
        }
        self.entries[at] = entry;
        pos[entry.1 as usize] = at as u32;
    }

    /// Removes every entry, marking each id absent.
    pub(crate) fn clear(&mut self, pos: &mut [u32]) {
        for &(_, id) in &self.entries {
            pos[id as usize] = ABSENT;
        }
        self.entries.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pops_in_key_then_id_order_after_rekeys_and_removals() {
        let mut pos = vec![ABSENT; 8];
        let mut heap = Heap::default();
        for (id, key) in [(0u32, 50u128), (1, 10), (2, 30), (3, 30), (4, 70), (5, 20)] {
            heap.push(key, id, &mut pos);
        }
        heap.rekey(4, 5, &mut pos);
        heap.remove(5, &mut pos);
        heap.rekey(1, 60, &mut pos);
        assert_eq!(pos[5], ABSENT);
        let mut order = Vec::new();
        while let Some((_, id)) = heap.peek() {
            heap.remove(id, &mut pos);
            order.push(id);
        }
        assert_eq!(order, vec![4, 2, 3, 0, 1]);
        assert!(pos.iter().all(|&p| p == ABSENT));
    }
}
