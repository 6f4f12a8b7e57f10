//! The side cache of partial reads: leaf skeletons, partition 0 of internal nodes, decoded frames.

use super::*;

/// Pieces of a leaf read without the rest of it (partial eviction's read side): its pivots and
/// some basements, valid while the BTT still points at `loc`.
pub(crate) struct PartialLeaf {
    pub(crate) loc: BlockLoc,
    pub(crate) index: NodeIndex,
    pub(crate) pivots: Vec<Vec<u8>>,
    /// [`key_prefix`] of each pivot, for [`PartialLeaf::spot`].
    pub(crate) pivot_prefixes: Vec<u64>,
    /// Frame tables per basement.
    pub(crate) frames: Vec<BasementFrames>,
    /// Decoded frames by (basement, frame).
    pub(crate) basements: HashMap<(usize, usize), Basement>,
    pub(crate) bytes: usize,
}

/// Where a key's entry lives in a partial leaf: its basement and frame, or `Absent` (with the
/// basement's applied MSN) when the frame table shows the basement cannot hold it or a newer
/// message overrides whatever it holds.
pub(crate) enum LeafSpot {
    Piece(usize, usize),
    Absent(Msn),
}

impl PartialLeaf {
    pub(crate) fn spot(&self, key: &[u8], overriding: Option<Msn>) -> LeafSpot {
        let bi = count_at_or_below(&self.pivot_prefixes, key, |i| {
            self.pivots.get(i).is_some_and(|p| key_cmp(p, key).is_le())
        });
        debug_assert_eq!(bi, child_index(&self.pivots, key));
        match self.frames.get(bi) {
            Some(bf) if overriding.is_some_and(|m| m > bf.max_msn) => LeafSpot::Absent(bf.max_msn),
            Some(bf) => match bf.frame_for(key) {
                Some(fi) => LeafSpot::Piece(bi, fi),
                None => LeafSpot::Absent(bf.max_msn),
            },
            // Not for a well-formed skeleton (one table per basement): reading the piece
            // reports the missing table as corruption.
            None => LeafSpot::Piece(bi, 0),
        }
    }
}

/// Pieces of an internal node read without the rest of it: partition 0 (pivots, children,
/// per-child key filters and buffer tables) and the buffer frames point reads needed, valid
/// while the BTT still points at `loc`.
pub(crate) struct PartialInternal {
    pub(crate) loc: BlockLoc,
    pub(crate) index: NodeIndex,
    pub(crate) info: InternalInfo,
    /// Decoded buffer frames by (child, frame): point messages in (key, MSN) order.
    pub(crate) frames: HashMap<(usize, usize), Vec<Msg>>,
    pub(crate) bytes: usize,
}

/// A leaf block's partition table and partition 0 (pivots, frame tables), parsed when the
/// block is written or read whole: when the cache evicts the (clean) leaf, this stays in the
/// side cache of partial reads, so the leaf's basements leave memory but a later point read
/// reads one frame, not the header and partition 0 first (PerconaFT's partial eviction keeps
/// an evicted leaf's pivots in memory likewise).
pub(crate) struct LeafSkeleton {
    pub(crate) index: NodeIndex,
    pub(crate) info: LeafInfo,
}

/// Parses the skeleton of the encoded block `enc` of node `id` (`None` for internal nodes). The block was just encoded or verified, so a parse failure is a
/// bug; it is reported in debug builds and costs only the skeleton otherwise.
pub(crate) fn leaf_skeleton(enc: &[u8], id: NodeId) -> Option<LeafSkeleton> {
    match decode_leaf_skeleton(enc, id, "encoded leaf") {
        Ok(sk) => sk.map(|(index, info)| LeafSkeleton { index, info }),
        Err(e) => {
            debug_assert!(false, "skeleton of node {id}: {e}");
            None
        }
    }
}

/// What a point read needs from a partial internal node's buffer on the key's path.
pub(crate) enum BufferNeed {
    /// Nothing beyond partition 0 (the filter rules the key out, or no frame can hold it).
    Nothing,
    /// One frame of the buffer partition.
    Frame(usize),
}

/// Reads `len` bytes at `offset` of `file` into a (reused) block buffer. Errors: `Corruption`
/// naming `location` when the file ends first, `Io` otherwise.
/// Admission to the side cache for decoded basement frames: a frame is kept only when it is
/// read a second time while its first read is still remembered here (direct-mapped, one slot
/// per hash; the doorkeeper of TinyLFU, Einziger et al., ACM ToS 2017, in its simplest form).
/// Point reads spread over more data than memory rarely read a frame twice: a decoded frame
/// kept on every read only displaced the page cache (which holds the same data compressed,
/// about half the size) and fragmented the heap, while a hot frame still gets in on its
/// second read.
pub(crate) struct FrameDoorkeeper {
    pub(crate) slots: Box<[AtomicU64]>,
}

impl FrameDoorkeeper {
    /// Frames remembered (64 KiB of slots).
    pub(crate) const SLOTS: usize = 8192;

    pub(crate) fn new() -> Self {
        FrameDoorkeeper {
            slots: (0..Self::SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Whether frame `fi` of basement `bi` of the block at `offset` was seen recently; remembers
    /// it when it was not.
    /// Readers under the shared lock race on slots; a lost update only delays an admission.
    pub(crate) fn admit(&self, offset: u64, bi: usize, fi: usize) -> bool {
        let mut id = [0u8; 24];
        id[..8].copy_from_slice(&offset.to_le_bytes());
        id[8..16].copy_from_slice(&(bi as u64).to_le_bytes());
        id[16..].copy_from_slice(&(fi as u64).to_le_bytes());
        let h = xxhash_rust::xxh3::xxh3_64(&id).max(1);
        let slot = (h % Self::SLOTS as u64) as usize;
        match self.slots.get(slot) {
            Some(s) if s.load(Ordering::Relaxed) == h => true,
            Some(s) => {
                s.store(h, Ordering::Relaxed);
                false
            }
            None => false,
        }
    }
}

impl Store {
    /// Puts leaf `id`'s skeleton for its block at `loc` into the side cache of partial reads,
    /// replacing what it held for `id`.
    pub(crate) fn insert_partial_leaf(&mut self, id: NodeId, loc: BlockLoc, sk: LeafSkeleton) {
        let LeafSkeleton { index, info } = sk;
        let bytes = info.pivots.iter().map(|p| p.len() + 24).sum::<usize>()
            + index.parts.len() * 16
            + info.frames.iter().map(BasementFrames::size_bytes).sum::<usize>();
        if let Some(old) = self.partial.remove(&id) {
            self.partial_bytes -= old.bytes;
        }
        self.partial_bytes += bytes;
        self.partial.insert(
            id,
            PartialLeaf {
                loc,
                index,
                pivot_prefixes: info.pivots.iter().map(|p| key_prefix(p)).collect(),
                pivots: info.pivots,
                frames: info.frames,
                basements: HashMap::new(),
                bytes,
            },
        );
    }

    /// Keeps the skeleton of leaf `id`, whose block now is `loc` (just written or read whole):
    /// partial eviction, see [`LeafSkeleton`].
    pub(crate) fn keep_skeleton(&mut self, id: NodeId, loc: BlockLoc, sk: Option<LeafSkeleton>) {
        if let Some(sk) = sk {
            self.insert_partial_leaf(id, loc, sk);
            self.trim_partial(id);
        }
    }

    /// The partial-read side cache's share of the budget: a quarter, or whatever the node
    /// cache and the background share leave free if that is more (a read-only phase after a
    /// load keeps few nodes cached whole; [`Store::evict_to_budget`] takes the room back).
    pub(crate) fn partial_cap_bytes(&self) -> usize {
        let others =
            self.cachetable.held_bytes() + self.pending_run_bytes + self.cachetable.background_bytes();
        let budget = self.budget_bytes();
        (budget / 4).max(budget.saturating_sub(others))
    }

    /// Keeps the partial-read side cache under its share ([`Store::partial_cap_bytes`]).
    pub(crate) fn trim_partial(&mut self, keep: NodeId) {
        let cap = self.partial_cap_bytes();
        self.trim_partial_to(cap, keep, true);
    }

    /// Trims the side cache to `cap` bytes, cheapest-to-lose first: decoded basement frames
    /// (one per lookup, rarely read twice), then decoded internal buffer frames (read when a key
    /// filter lets a key through), then leaves' partition 0 (pivots and frame tables: one per
    /// leaf, serving every later lookup in it), and internal nodes' partition 0 (pivots and
    /// key filters, serving every lookup below them) last. With `margin`, goes down to three
    /// quarters of `cap` once it starts, so trimming is not paid on every lookup.
    pub(crate) fn trim_partial_to(&mut self, cap: usize, keep: NodeId, margin: bool) {
        if self.partial_bytes <= cap {
            return;
        }
        let target = if margin { cap / 4 * 3 } else { cap };
        for (id, p) in self.partial.iter_mut() {
            if self.partial_bytes <= target {
                return;
            }
            if *id == keep {
                continue;
            }
            let freed: usize = p.basements.drain().map(|(_, b)| b.size_bytes()).sum();
            p.bytes -= freed;
            self.partial_bytes -= freed;
        }
        for (id, p) in self.partial_internal.iter_mut() {
            if self.partial_bytes <= target {
                return;
            }
            if *id == keep {
                continue;
            }
            let freed: usize = p
                .frames
                .drain()
                .map(|(_, m)| m.iter().map(Msg::size_bytes).sum::<usize>() + 64)
                .sum();
            p.bytes -= freed;
            self.partial_bytes -= freed;
        }
        let leaves: Vec<NodeId> = self.partial.keys().copied().filter(|k| *k != keep).collect();
        for victim in leaves {
            if self.partial_bytes <= target {
                return;
            }
            if let Some(p) = self.partial.remove(&victim) {
                self.partial_bytes -= p.bytes;
            }
        }
        let internals: Vec<NodeId> = self
            .partial_internal
            .keys()
            .copied()
            .filter(|k| *k != keep)
            .collect();
        for victim in internals {
            if self.partial_bytes <= target {
                return;
            }
            if let Some(p) = self.partial_internal.remove(&victim) {
                self.partial_bytes -= p.bytes;
            }
        }
    }
}
