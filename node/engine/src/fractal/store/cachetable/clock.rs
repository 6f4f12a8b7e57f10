//! CLOCK eviction's walk over the ring: which victim goes, and how.
//!
//! Clean victims go first; a dirty one is taken only after the hand passed a ring's length of
//! dirty victims, and then queued for the writeback thread (evicted once written, counted in
//! the background share) or, when that share is full or there is no thread, handed to the
//! caller to write inline ([`InlineVictim`]). The walk itself does no I/O.

use super::*;

/// The state of one eviction pass ([`Store::evict_to_budget`]).
pub(crate) struct EvictionWalk {
    /// The cache's target: held bytes ([`Cachetable::held_bytes`]) above it are evicted.
    target_bytes: usize,
    /// Never evicted (the root).
    pinned: NodeId,
    /// Positions of the hand visited so far, and the most the pass visits.
    steps: usize,
    max_steps: usize,
    /// Dirty victims passed over so far, and how many are passed before one is taken.
    dirty_skips: usize,
    ring_len_at_start: usize,
    /// A full disk: dirty nodes stay cached (module `no_space`).
    pub(crate) hold: bool,
}

/// A dirty victim for the caller to write; after the write, [`Cachetable::evict_victim`] (it is
/// written) or [`Cachetable::pass_victim`] (the disk was full).
pub(crate) struct InlineVictim {
    pub(crate) id: NodeId,
    pub(crate) node: Arc<Node>,
}

/// What the hand did at one position of the ring.
enum Visit {
    /// Passed (CLOCK count lowered, pinned, held, or queued for the writeback thread), or
    /// evicted a clean node: go on.
    Next,
    /// A dirty victim to write inline.
    Write(InlineVictim),
}

impl Cachetable {
    /// Starts an eviction pass to `target_bytes`, never evicting `pinned`; `hold` when dirty
    /// nodes must stay cached (a full disk).
    pub(crate) fn eviction_walk(&self, target_bytes: usize, pinned: NodeId, hold: bool) -> EvictionWalk {
        let ring_len_at_start = self.ring.len();
        EvictionWalk {
            target_bytes,
            pinned,
            steps: 0,
            max_steps: 8 * (ring_len_at_start + 8),
            dirty_skips: 0,
            ring_len_at_start,
            hold,
        }
    }

    /// Whether nothing clean is cached (under a hold, nothing could be evicted).
    pub(crate) fn all_dirty(&self) -> bool {
        self.cached_bytes.saturating_sub(self.dirty_bytes) == 0
    }

    /// Moves the CLOCK hand, evicting clean victims and queueing dirty ones for the writeback
    /// thread, until the cache is within the walk's target or the pass has gone far enough
    /// (`None`), or a dirty victim is to be written inline.
    pub(crate) fn next_inline_victim(&mut self, walk: &mut EvictionWalk) -> Option<InlineVictim> {
        while self.held_bytes() > walk.target_bytes && self.entries.len() > 1 && !self.ring.is_empty() {
            walk.steps += 1;
            if walk.steps > walk.max_steps {
                break;
            }
            let id = self.ring.current()?;
            if let Visit::Write(victim) = self.visit(id, walk) {
                return Some(victim);
            }
        }
        None
    }

    /// The hand at `id`.
    fn visit(&mut self, id: NodeId, walk: &mut EvictionWalk) -> Visit {
        let Some(e) = self.entries.get_mut(&id) else {
            self.ring.remove_current();
            return Visit::Next;
        };
        if id == walk.pinned || (e.evicting && e.dirty) {
            self.ring.advance();
            return Visit::Next;
        }
        let c = e.clock.get_mut();
        if *c > 0 {
            *c -= 1;
            self.ring.advance();
            return Visit::Next;
        }
        if !e.dirty {
            self.eviction_stats.clean += 1;
            self.evict_victim(id);
            return Visit::Next;
        }
        if walk.hold {
            self.ring.advance();
            return Visit::Next;
        }
        if walk.dirty_skips < walk.ring_len_at_start {
            walk.dirty_skips += 1;
            self.ring.advance();
            return Visit::Next;
        }
        // Queued victims live in the background share, beside flushes in flight.
        let fits = self.evicting_bytes == 0
            || self.reserved_bytes + self.evicting_bytes + e.bytes <= self.background_share_bytes;
        if self.background_writes && Arc::strong_count(&e.node) == 1 && fits {
            e.evicting = true;
            self.evicting_bytes += e.bytes;
            self.eviction_stats.handed_to_writeback += 1;
            self.write_soon.push(id);
            self.ring.advance();
            self.debug_check();
            return Visit::Next;
        }
        if e.node.height() == 0 {
            self.eviction_stats.inline_leaves += 1;
        } else {
            self.eviction_stats.inline_internal += 1;
        }
        self.eviction_stats.inline_bytes += e.bytes as u64;
        Visit::Write(InlineVictim {
            id,
            node: Arc::clone(&e.node),
        })
    }

    /// Evicts victim `id`, the node under the hand (a clean victim, or a dirty one now
    /// written).
    pub(crate) fn evict_victim(&mut self, id: NodeId) {
        self.remove(id);
        self.ring.remove_current();
    }

    /// Leaves the victim under the hand cached (its write met a full disk) and moves on.
    pub(crate) fn pass_victim(&mut self) {
        self.ring.advance();
    }
}
