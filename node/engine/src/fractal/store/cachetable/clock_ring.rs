//! The cachetable's CLOCK ring: the order in which eviction visits cached nodes.

use std::collections::HashSet;

use super::NodeId;

/// The ids eviction's CLOCK hand sweeps over, each once (PerconaFT's cachetable clock). An id
/// stays in the ring after its node leaves the cache; the hand drops it when it reaches it.
#[derive(Debug, Default)]
pub(crate) struct ClockRing {
    ids: Vec<NodeId>,
    members: HashSet<NodeId>,
    hand: usize,
}

impl ClockRing {
    /// Puts `id` into the ring unless it is there already (new ids go behind the hand's sweep).
    pub(crate) fn touch(&mut self, id: NodeId) {
        if self.members.insert(id) {
            self.ids.push(id);
        }
    }

    /// Ids in the ring.
    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The id under the hand (the hand wraps to the start past the end); `None` when empty.
    pub(crate) fn current(&mut self) -> Option<NodeId> {
        if self.hand >= self.ids.len() {
            self.hand = 0;
        }
        self.ids.get(self.hand).copied()
    }

    /// Moves the hand to the next id (the current one stays).
    pub(crate) fn advance(&mut self) {
        self.hand += 1;
    }

    /// Drops the id [`ClockRing::current`] returned from the ring (the last id takes its
    /// place, so the hand visits that one next).
    pub(crate) fn remove_current(&mut self) {
        if self.hand < self.ids.len() {
            let id = self.ids.swap_remove(self.hand);
            self.members.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hand_sweeps_every_id_once_per_turn_and_wraps() {
        let mut r = ClockRing::default();
        assert_eq!(r.current(), None);
        for id in [5, 6, 7, 6] {
            r.touch(id);
        }
        assert_eq!(r.len(), 3, "an id is in the ring once");
        let mut seen = Vec::new();
        for _ in 0..4 {
            seen.push(r.current());
            r.advance();
        }
        assert_eq!(seen, [Some(5), Some(6), Some(7), Some(5)]);
        // The hand is on 6: removing it puts the last id (7) under the hand.
        r.remove_current();
        assert_eq!((r.len(), r.current()), (2, Some(7)));
        r.touch(6);
        assert_eq!(r.len(), 3, "a removed id can come back");
        // Removal follows `current` (which wraps the hand), as in eviction.
        let mut removed = Vec::new();
        while let Some(id) = r.current() {
            removed.push(id);
            r.remove_current();
        }
        assert_eq!(removed, [7, 6, 5]);
        assert!(r.is_empty());
        assert_eq!(r.current(), None);
    }
}
