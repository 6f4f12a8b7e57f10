//! Tree algorithms: message injection at the root, flushing of the heaviest buffer (cascading),
//! splits and merges, reads that apply pending ancestor messages, bulk load, and the integrity
//! walk (PerconaFT `ft/ft-ops.cc`, `ft/ft-flusher.cc`).

use std::collections::HashSet;

use super::codec::encode_run;
use super::filter::KeyFilter;
use super::flusher::{Flusher, InFlight, LeafFlushDone, LeafFlushJob};
use super::msg::{apply_point, apply_range, key_hash, Buffer, Msg, Msn, PointOp, RangeMsg, RangeOp, RunRef};
use super::node::{
    child_bounds, child_index, chunk_entries, split_entries_even, Basement, Internal, Leaf, Node, NodeId,
};
use super::store::{CheckpointJob, InPlacePush, Store};
use crate::{EngineError, IntegrityReport, KeyValue, Result};

/// Shape parameters of a fractal tree (PerconaFT defaults in `ft/ft-internal.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeParams {
    /// Target node size in bytes (uncompressed): a leaf splits above it, an internal node is
    /// "gorged" and flushes above it. Default 4 MiB.
    pub node_size_bytes: usize,
    /// Basement node size in bytes (the unit of partial reads inside a leaf). Default 64 KiB.
    pub basement_size_bytes: usize,
    /// Maximum children per internal node (split above it, merge below a quarter). Default 16.
    pub fanout: usize,
}

impl Default for TreeParams {
    fn default() -> Self {
        TreeParams {
            node_size_bytes: 4 << 20,
            basement_size_bytes: 64 << 10,
            fanout: 16,
        }
    }
}

impl TreeParams {
    /// Rejects shapes the algorithms cannot work with.
    pub fn validate(&self) -> Result<()> {
        if self.fanout < 3 || self.node_size_bytes < 256 || self.basement_size_bytes < 64 {
            return Err(EngineError::InvalidArgument(format!(
                "tree params need fanout >= 3, node size >= 256 B, basement size >= 64 B: {self:?}"
            )));
        }
        Ok(())
    }
}

/// A buffer is flushed into its child once this many runs have spilled from it, whatever their
/// size (bounds the runs a point read may consult per level).
const MAX_RUNS_PER_BUFFER: usize = 16;
/// The cleaner's threshold, in 1/1024ths of a node's gorge limit: once writes pause it drains
/// cached internal nodes to half their limit.
pub const CLEAN_IDLE_FULLNESS_1024: u64 = 512;
/// Bloom filter bits per key and probes of a spilled run (about 0.1% false positives).
const RUN_FILTER_BITS_PER_KEY: usize = 14;
/// See [`RUN_FILTER_BITS_PER_KEY`].
const RUN_FILTER_PROBES: u8 = 10;

/// Whether a node lies on the left / right edge of the tree (for uneven edge splits).
#[derive(Debug, Clone, Copy)]
struct Edges {
    left: bool,
    right: bool,
}

const ROOT_EDGES: Edges = Edges {
    left: true,
    right: true,
};
const NO_EDGES: Edges = Edges {
    left: false,
    right: false,
};

fn child_edges(e: Edges, i: usize, n: usize) -> Edges {
    Edges {
        left: e.left && i == 0,
        right: e.right && i + 1 == n,
    }
}

fn corrupt(location: impl Into<String>, detail: impl Into<String>) -> EngineError {
    EngineError::Corruption {
        location: location.into(),
        detail: detail.into(),
    }
}

/// Applies one message to the value of `key`.
fn apply_msg_to_value(value: Option<Vec<u8>>, key: &[u8], msg: &Msg) -> Option<Vec<u8>> {
    match msg {
        Msg::Point { op, .. } => apply_point(value, op),
        Msg::Range(r) => {
            if r.covers(key) {
                value.and_then(|v| apply_range(&v, &r.op))
            } else {
                value
            }
        }
    }
}

/// Where reads get nodes from: the cache only (shared lock; a miss aborts the read) or the
/// cache with loading and eviction (exclusive lock).
trait Fetch {
    /// The node, `Ok(None)` when it is not cached and this source cannot load.
    fn fetch(&mut self, id: NodeId) -> Result<Option<&Node>>;
    /// Called after each leaf of a scan (evicts down to budget when allowed).
    fn after_leaf(&mut self, root: NodeId) -> Result<()>;
    /// For a point read reaching leaf `id`: its value and basement MSN from a partial read when
    /// the leaf is not cached whole. `overriding` is the MSN of the newest collected message that
    /// sets or deletes the key outright: when it is above the basement's applied MSN the stored
    /// value cannot matter, and the frame is not read (the value comes back `None`).
    fn probe_leaf(&mut self, id: NodeId, key: &[u8], overriding: Option<Msn>) -> Result<LeafProbe>;
    /// For a point read passing internal node `id`: when it is not cached whole, appends the
    /// key's messages from its buffer on the path (read partially) and names the child.
    fn probe_internal(
        &mut self,
        id: NodeId,
        key: &[u8],
        hash: u64,
        msgs: &mut Vec<Msg>,
    ) -> Result<InternalProbe>;
    /// The store, for reading spilled runs (file reads only, no cache).
    fn store(&self) -> &Store;
}

/// Outcome of [`Fetch::probe_internal`].
enum InternalProbe {
    /// Descend into this child (the node's messages for the key were collected).
    Child(NodeId),
    /// The node is cached: read it as a node.
    UseNode,
    /// Not available without I/O.
    Miss,
}

/// Outcome of [`Fetch::probe_leaf`].
enum LeafProbe {
    /// Value of the key in its basement and the basement's applied MSN.
    Value(Option<Vec<u8>>, Msn),
    /// The leaf is cached: read it as a node.
    UseNode,
    /// Not available without I/O (shared-lock readers retry exclusively).
    Miss,
}

struct Loading<'a>(&'a mut Store);
struct CachedOnly<'a>(&'a Store);

impl Fetch for Loading<'_> {
    fn fetch(&mut self, id: NodeId) -> Result<Option<&Node>> {
        self.0.get(id).map(Some)
    }
    fn after_leaf(&mut self, root: NodeId) -> Result<()> {
        self.0.evict_to_budget(root)
    }
    fn probe_leaf(&mut self, id: NodeId, key: &[u8], overriding: Option<Msn>) -> Result<LeafProbe> {
        if self.0.is_cached(id) {
            return Ok(LeafProbe::UseNode);
        }
        let (v, floor) = self.0.read_partial_value(id, key, overriding)?;
        Ok(LeafProbe::Value(v, floor))
    }
    fn probe_internal(
        &mut self,
        id: NodeId,
        key: &[u8],
        hash: u64,
        msgs: &mut Vec<Msg>,
    ) -> Result<InternalProbe> {
        if self.0.is_cached(id) {
            return Ok(InternalProbe::UseNode);
        }
        self.0
            .read_partial_internal(id, key, hash, msgs)
            .map(InternalProbe::Child)
    }
    fn store(&self) -> &Store {
        self.0
    }
}

impl Fetch for CachedOnly<'_> {
    fn fetch(&mut self, id: NodeId) -> Result<Option<&Node>> {
        Ok(self.0.peek(id))
    }
    fn after_leaf(&mut self, _root: NodeId) -> Result<()> {
        Ok(())
    }
    fn probe_leaf(&mut self, id: NodeId, key: &[u8], overriding: Option<Msn>) -> Result<LeafProbe> {
        if self.0.is_cached(id) {
            return Ok(LeafProbe::UseNode);
        }
        if let Some((v, floor)) = self.0.partial_value(id, key, overriding) {
            return Ok(LeafProbe::Value(v, floor));
        }
        // Not in the side cache: one frame read from the file under the shared lock.
        Ok(match self.0.read_frame_value_shared(id, key, overriding)? {
            Some((v, floor)) => LeafProbe::Value(v, floor),
            None => LeafProbe::Miss,
        })
    }
    fn probe_internal(
        &mut self,
        id: NodeId,
        key: &[u8],
        hash: u64,
        msgs: &mut Vec<Msg>,
    ) -> Result<InternalProbe> {
        if self.0.is_cached(id) {
            return Ok(InternalProbe::UseNode);
        }
        let before = msgs.len();
        Ok(match self.0.partial_internal_probe(id, key, hash, msgs)? {
            Some(c) => InternalProbe::Child(c),
            None => {
                msgs.truncate(before);
                InternalProbe::Miss
            }
        })
    }
    fn store(&self) -> &Store {
        self.0
    }
}

/// The in-memory state of an open tree.
pub struct Tree {
    pub(crate) params: TreeParams,
    pub(crate) store: Store,
    pub(crate) root: NodeId,
    pub(crate) next_msn: Msn,
    pub(crate) next_node_id: NodeId,
    pub(crate) meta: Option<Vec<u8>>,
    pub(crate) spill_stats: SpillStats,
    /// Background leaf flushes (`None`: flushes run on the writer).
    pub(crate) flusher: Option<Flusher>,
}

/// Counters of spilled runs since open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpillStats {
    /// Runs written by spills (buffers of children that were not cached).
    pub runs_spilled: u64,
    /// Times a buffer's small runs were merged into one (size-tiered compaction).
    pub runs_compacted: u64,
    /// Runs merged into their child (read, applied or pushed down, freed).
    pub runs_merged: u64,
    /// Point messages applied straight to an edge leaf (the sequential-insert fast path).
    pub edge_inserts: u64,
    /// Buffers flushed (or spilled) by the cleaner thread between write batches.
    pub cleaner_flushes: u64,
    /// Runs written straight from the runs of a flush into an internal node, for its children
    /// that were not cached (see [`Tree::hand_down`]); also counted in `runs_spilled`.
    pub runs_handed_down: u64,
}

impl Tree {
    fn alloc_id(&mut self) -> NodeId {
        let id = self.next_node_id;
        self.next_node_id += 1;
        id
    }

    /// Assigns the next MSN.
    pub fn next_msn(&mut self) -> Msn {
        let m = self.next_msn;
        self.next_msn += 1;
        m
    }

    // --------------------------------------------------------------------------------------
    // Write path
    // --------------------------------------------------------------------------------------

    /// Injects `msg` at the root; flushes and rebalances as needed. Never reads a leaf unless the
    /// root is one or a flush reaches it.
    pub fn inject(&mut self, msg: Msg) -> Result<()> {
        let Some(msg) = self.try_edge_insert(msg)? else {
            return Ok(());
        };
        let root_id = self.root;
        // A cached internal root takes the message where it sits; it is taken out of the cache
        // only to flush (or when it cannot, see `push_in_place`).
        let limit = self.gorge_limit_bytes(true, false);
        let msg = match self.store.push_in_place(root_id, msg, limit) {
            InPlacePush::Done => return Ok(()),
            InPlacePush::Gorged => None,
            InPlacePush::NotHere(msg) => Some(msg),
        };
        let mut root = self.store.take(root_id)?;
        match (&mut root, msg) {
            (Node::Leaf(l), Some(msg)) => {
                l.apply(&msg);
                l.normalize(self.params.basement_size_bytes);
            }
            (Node::Leaf(_), None) => {
                return Err(corrupt(
                    format!("node {root_id}"),
                    "root changed to a leaf during a push",
                ));
            }
            (Node::Internal(n), msg) => {
                if let Some(msg) = msg {
                    n.push_msg(msg);
                }
                self.flush_while_gorged(n, ROOT_EDGES, true)?;
            }
        }
        self.fix_root(root_id, root)
    }

    /// The sequential-insert fast path (PerconaFT's "promotion" of edge inserts): a point
    /// message whose key lies beyond the last (or before the first) key of the rightmost (or
    /// leftmost) leaf is applied straight to that leaf when every node on the way is cached and
    /// the buffers on the way hold nothing for the edge child, so the leaf is exactly up to date
    /// and the message is the newest for its key. Falls back (returns the message) when the
    /// leaf would outgrow a node: the normal path then buffers it and the flush splits the leaf
    /// unevenly. Consecutive edge inserts thus fill leaves without passing through buffers.
    fn try_edge_insert(&mut self, msg: Msg) -> Result<Option<Msg>> {
        let Msg::Point { key, .. } = &msg else {
            return Ok(Some(msg));
        };
        let mut id = self.root;
        let mut right: Option<bool> = None;
        loop {
            let Some(node) = self.store.peek(id) else {
                return Ok(Some(msg));
            };
            match node {
                Node::Internal(n) => {
                    let i = child_index(&n.pivots, key);
                    let last = n.children.len().saturating_sub(1);
                    let side = if i == last && i > 0 {
                        true
                    } else if i == 0 && last > 0 {
                        false
                    } else {
                        return Ok(Some(msg));
                    };
                    if right.is_some_and(|r| r != side) || n.buffers.get(i).is_none_or(|b| !b.is_empty()) {
                        return Ok(Some(msg));
                    }
                    right = Some(side);
                    let Some(&c) = n.children.get(i) else {
                        return Ok(Some(msg));
                    };
                    id = c;
                }
                Node::Leaf(l) => {
                    // The root itself (right is None) takes messages directly anyway.
                    let beyond = match right {
                        Some(true) => l
                            .basements
                            .iter()
                            .rev()
                            .find_map(Basement::last_key)
                            .is_none_or(|k| key.as_slice() > k),
                        Some(false) => l
                            .basements
                            .iter()
                            .find_map(Basement::first_key)
                            .is_none_or(|k| key.as_slice() < k),
                        None => false,
                    };
                    if !beyond || l.size_bytes() + msg.size_bytes() > self.params.node_size_bytes {
                        return Ok(Some(msg));
                    }
                    break;
                }
            }
        }
        let mut leaf = self.store.take(id)?;
        if let Node::Leaf(l) = &mut leaf {
            l.apply(&msg);
            l.normalize(self.params.basement_size_bytes);
        }
        self.store.put(id, leaf);
        self.spill_stats.edge_inserts += 1;
        Ok(None)
    }

    /// Splits an oversized root (growing the tree) or collapses a root with one child.
    fn fix_root(&mut self, mut root_id: NodeId, mut root: Node) -> Result<()> {
        loop {
            let extras = self.split_if_needed(&mut root, ROOT_EDGES);
            if extras.is_empty() {
                if let Node::Internal(n) = &mut root {
                    if n.children.len() == 1 {
                        if n.buffers.first().is_some_and(|b| !b.is_empty()) {
                            self.flush_into_child(n, 0, ROOT_EDGES)?;
                            continue;
                        }
                        let child = n.children[0];
                        self.store.delete(root_id);
                        self.root = child;
                        return Ok(());
                    }
                }
                self.store.put(root_id, root);
                self.root = root_id;
                return Ok(());
            }
            let height = root.height() + 1;
            self.store.put(root_id, root);
            let mut children = vec![root_id];
            let mut pivots = Vec::new();
            for (p, node) in extras {
                let id = self.alloc_id();
                self.store.put(id, node);
                pivots.push(p);
                children.push(id);
            }
            let buffers = vec![Buffer::new(); children.len()];
            root = Node::Internal(Internal {
                height,
                pivots,
                children,
                buffers,
            });
            root_id = self.alloc_id();
        }
    }

    /// Flushes (or spills) the heaviest buffers of `n` while it is gorged. A node below the root
    /// counts as gorged at a quarter of the node size while the cache is under pressure (the
    /// engine's memory over three quarters of the budget, [`Store::under_pressure`]), so
    /// internal nodes stay small enough to stay cached and spill to runs early instead of being
    /// evicted and re-read whole (flushing driven by cache pressure, ENGINE.md).
    fn flush_while_gorged(&mut self, n: &mut Internal, edges: Edges, is_root: bool) -> Result<()> {
        let mut rounds = 0;
        let limit = self.gorge_limit_bytes(is_root, self.store.under_pressure());
        while n.size_bytes() > limit && rounds < 4 * self.params.fanout + 16 {
            let Some(i) = n.heaviest_buffer() else { break };
            rounds += 1;
            if self.spill_if_child_uncached(n, i)? {
                continue;
            }
            let ce = child_edges(edges, i, n.children.len());
            self.flush_into_child(n, i, ce)?;
        }
        Ok(())
    }

    /// When child `i` is not cached, writes buffer `i`'s point messages as a run on disk instead
    /// of reading the child (see [`RunRef`]); true when it did and the child's runs are still
    /// below a node's worth (so the flush into the child can wait). Buffers holding range
    /// messages are flushed normally (range messages never go to runs).
    fn spill_if_child_uncached(&mut self, n: &mut Internal, i: usize) -> Result<bool> {
        let (Some(b), Some(&cid)) = (n.buffers.get(i), n.children.get(i)) else {
            return Ok(false);
        };
        if self.store.is_cached(cid) || !b.range_msgs().is_empty() || b.bytes() == 0 {
            return Ok(false);
        }
        let Some(b) = n.buffers.get_mut(i) else {
            return Ok(false);
        };
        let msgs = b.take_points();
        let run = self.write_run(msgs)?;
        b.push_spilled(run);
        self.spill_stats.runs_spilled += 1;
        self.after_spill(n, i)
    }

    /// After a run was added to buffer `i` of `n` (child not cached): starts a background flush
    /// of the child's runs once they add up to a node, or merges many small runs into one; true
    /// when the flush into the child can wait, false when the caller must flush now.
    fn after_spill(&mut self, n: &mut Internal, i: usize) -> Result<bool> {
        let (Some(b), Some(&cid)) = (n.buffers.get_mut(i), n.children.get(i)) else {
            return Ok(false);
        };
        if self.flush_busy(cid) {
            // The oldest runs are being applied to the leaf in the background: keep spilling
            // (no compaction of the runs it reads); with too many runs the normal flush waits
            // for it.
            return Ok(b.spilled().len() < 2 * MAX_RUNS_PER_BUFFER);
        }
        if b.spilled_bytes() >= self.params.node_size_bytes {
            let spilled_bytes = b.spilled_bytes();
            if self.start_leaf_flush(n, i)? {
                return Ok(true);
            }
            // The flusher is busy (or its memory share is taken): keep spilling up to twice a
            // node's worth rather than flushing on the writer, whose decoded runs and leaf are
            // memory outside the budget; beyond that the writer flushes (bounded).
            return Ok(self.flusher.is_some()
                && n.height == 1
                && spilled_bytes < 2 * self.params.node_size_bytes);
        }
        if b.spilled().len() >= MAX_RUNS_PER_BUFFER {
            // Many small runs: merge them into one (size-tiered, the child is not touched).
            let runs = b.take_spilled();
            self.spill_stats.runs_compacted += 1;
            let mut msgs = self.take_runs(runs)?;
            super::msg::sort_points_by_key(&mut msgs);
            drop_superseded(&mut msgs);
            let run = self.write_run(msgs)?;
            if let Some(b) = n.buffers.get_mut(i) {
                b.push_spilled(run);
            }
        }
        Ok(true)
    }

    /// Whether a background flush into `child` is in flight.
    fn flush_busy(&self, child: NodeId) -> bool {
        self.flusher.as_ref().is_some_and(|f| f.busy(child))
    }

    /// Buffer `i` of `n` (height 1) holds a node's worth of spilled runs and its leaf is not
    /// cached: hands the flush to the background flusher when there is one with room (true),
    /// otherwise false (the caller flushes on the writer).
    fn start_leaf_flush(&mut self, n: &mut Internal, i: usize) -> Result<bool> {
        let (Some(b), Some(&cid)) = (n.buffers.get(i), n.children.get(i)) else {
            return Ok(false);
        };
        if n.height != 1 || b.bytes() != 0 || !self.flusher.as_ref().is_some_and(Flusher::has_room) {
            return Ok(false);
        }
        let mut runs = Vec::with_capacity(b.spilled().len());
        for r in b.spilled() {
            runs.push((r.msgs, self.store.detached(r.id)?));
        }
        // Decoded messages take their counted bytes (the count includes their in-memory
        // overhead); the leaf up to a node, and as much again while its basements are rebuilt.
        let reserved_bytes = b.spilled_bytes() + self.params.node_size_bytes * 2;
        // Flushes in flight hold at most a quarter of the budget (the share the cache leaves
        // free for background work), except that one flush may always run; beyond, the writer
        // keeps spilling or flushes itself.
        let reserved = self.store.reserved_bytes();
        if reserved > 0 && reserved + reserved_bytes > self.store.budget_bytes() / 4 {
            return Ok(false);
        }
        let flight = InFlight {
            child: cid,
            run_ids: b.spilled().iter().map(|r| r.id).collect(),
            probe_key: b.spilled().first().map(|r| r.min_key.clone()).unwrap_or_default(),
            reserved_bytes,
        };
        let job = LeafFlushJob {
            child: cid,
            leaf: self.store.detached(cid)?,
            runs,
            basement_size_bytes: self.params.basement_size_bytes,
        };
        if let Some(f) = self.flusher.as_mut() {
            f.submit(job, flight)?;
            self.store.reserve(reserved_bytes, 0);
        }
        Ok(true)
    }

    /// Installs a finished background flush into `parent`, whose child `i` it flushed: the
    /// flushed runs leave the buffer (their blocks are freed) and the flushed leaf replaces
    /// the child in the cache (dirty, not split yet: [`Tree::flush_into_child_inner`] applies
    /// what the buffer still holds and splits it).
    fn install_leaf_flush(
        &mut self,
        parent: &mut Internal,
        i: usize,
        flight: InFlight,
        done: LeafFlushDone,
    ) -> Result<()> {
        self.store.reserve(0, flight.reserved_bytes);
        let location = || format!("{} node {}", self.store.path().display(), flight.child);
        if parent.children.get(i) != Some(&flight.child) || done.child != flight.child || parent.height != 1 {
            return Err(corrupt(
                location(),
                "background flush installed under the wrong parent",
            ));
        }
        let Some(b) = parent.buffers.get_mut(i) else {
            return Err(corrupt(location(), "missing buffer"));
        };
        let runs = b.take_spilled();
        let n = flight.run_ids.len();
        if runs.len() < n || runs.iter().zip(&flight.run_ids).any(|(r, id)| r.id != *id) {
            return Err(corrupt(
                location(),
                "the buffer lost the runs a background flush applied",
            ));
        }
        let mut runs = runs.into_iter();
        for r in runs.by_ref().take(n) {
            self.store.delete(r.id);
        }
        for r in runs {
            b.push_spilled(r);
        }
        self.spill_stats.runs_merged += n as u64;
        // The old leaf's block is released when the new leaf is written.
        self.store.put(flight.child, Node::Leaf(done.leaf));
        Ok(())
    }

    /// Installs every finished background flush: finds each leaf's parent from the root (the
    /// parent may have split meanwhile), installs, applies the rest of the buffer, splits, and
    /// hands the new leaves to writeback to be written and evicted. Errors of the flush itself
    /// (`Io`, `Corruption`) are returned.
    pub fn install_finished_flushes(&mut self) -> Result<()> {
        while let Some((flight, r)) = self.flusher.as_mut().and_then(Flusher::take_finished) {
            let done = r?;
            if let Some(f) = self.flusher.as_mut() {
                f.totals.installed += 1;
            }
            let root_id = self.root;
            let mut root = self.store.take(root_id)?;
            let r = match &mut root {
                Node::Internal(n) => self.install_below(n, ROOT_EDGES, flight, done),
                Node::Leaf(_) => Err(corrupt(
                    format!("{} node {}", self.store.path().display(), flight.child),
                    "background flush of a leaf the tree no longer has",
                )),
            };
            self.fix_root(root_id, root)?;
            r?;
        }
        Ok(())
    }

    fn install_below(
        &mut self,
        n: &mut Internal,
        edges: Edges,
        flight: InFlight,
        done: LeafFlushDone,
    ) -> Result<()> {
        if n.height == 1 {
            let Some(i) = n.children.iter().position(|&c| c == flight.child) else {
                return Err(corrupt(
                    format!("{} node {}", self.store.path().display(), flight.child),
                    "background flush of a leaf not under its key's parent",
                ));
            };
            let child = flight.child;
            self.install_leaf_flush(n, i, flight, done)?;
            let before = n.children.len();
            self.flush_into_child_inner(n, i, child_edges(edges, i, before), false)?;
            let added = n.children.len().saturating_sub(before);
            let ids: Vec<NodeId> = n
                .children
                .get(i..=i + added)
                .map(<[_]>::to_vec)
                .unwrap_or_default();
            debug_assert_eq!(ids.first(), Some(&child));
            for id in ids {
                self.store.write_and_evict_soon(id)?;
            }
            return Ok(());
        }
        let i = child_index(&n.pivots, &flight.probe_key);
        self.below_child(n, i, edges, |t, c, ce| t.install_below(c, ce, flight, done))
    }

    /// Runs `f` on internal child `i` of `n` (taken from the cache, with its edges), then puts
    /// the child back, splitting it when it outgrew a node and buffer `i` is empty: a split adds
    /// pivots to `n`, and buffer `i` may hold messages for the whole old range, so otherwise the
    /// child stays over the fanout until the next flush into it (which empties the buffer
    /// first) splits it. Errors: `Corruption` when the child is missing or is a leaf.
    fn below_child(
        &mut self,
        n: &mut Internal,
        i: usize,
        edges: Edges,
        f: impl FnOnce(&mut Self, &mut Internal, Edges) -> Result<()>,
    ) -> Result<()> {
        let Some(&cid) = n.children.get(i) else {
            return Err(corrupt(format!("node child {i}"), "missing child"));
        };
        let ce = child_edges(edges, i, n.children.len());
        let mut child = self.store.take(cid)?;
        let r = match &mut child {
            Node::Internal(c) => f(self, c, ce),
            Node::Leaf(_) => Err(corrupt(format!("node {cid}"), "a leaf above height 1")),
        };
        if n.buffers.get(i).is_some_and(Buffer::is_empty) {
            let extras = self.split_if_needed(&mut child, ce);
            self.store.put(cid, child);
            self.insert_siblings(n, i, extras);
        } else {
            self.store.put(cid, child);
        }
        r
    }

    // --------------------------------------------------------------------------------------
    // Background flushing of internal buffers (the cleaner)
    // --------------------------------------------------------------------------------------

    /// One step of background flushing, run by the cleaner thread between write batches
    /// (PerconaFT's cleaner thread, `toku_cleaner_thread` in `ft/cachetable/cachetable.cc` and
    /// `toku_ftnode_cleaner_callback` in `ft/ft-flusher.cc`: it picks the node with the most
    /// buffered bytes and flushes its heaviest child buffer). Installs finished leaf flushes,
    /// then, among the cached internal nodes holding at least `min_fullness_1024` / 1024 of
    /// their gorge limit ([`Tree::gorge_limit_bytes`]), takes the fullest (its size, buffers and
    /// pivots, over its limit; on a tie the first found, parents before children, left to right) and flushes its heaviest buffer (delete-heavy buffers weigh more)
    /// into the child, or spills it when the child is not cached, cascading like a writer's
    /// flush. The writer then finds buffers with room, so ingest (a gorged root) and cache
    /// pressure (internal nodes gorge at a quarter node) are drained between batches instead of
    /// inside them (the cleaner passes [`CLEAN_IDLE_FULLNESS_1024`]). Returns true when it
    /// flushed something (call again), false when no node was worth it. Errors: as a writer's
    /// flush (`Io`, `Corruption`).
    pub fn clean_step(&mut self, min_fullness_1024: u64) -> Result<bool> {
        self.install_finished_flushes()?;
        let Some(path) = self.cleaning_target(min_fullness_1024) else {
            return Ok(false);
        };
        let root_id = self.root;
        let mut root = self.store.take(root_id)?;
        let r = match &mut root {
            Node::Internal(n) => self.clean_at(n, ROOT_EDGES, &path),
            Node::Leaf(_) => Ok(()),
        };
        self.fix_root(root_id, root)?;
        r?;
        self.spill_stats.cleaner_flushes += 1;
        Ok(true)
    }

    /// Size above which internal node `n` is gorged: a node at the root, or any node while the
    /// cache has room; a quarter node below the root under cache pressure (see
    /// [`Tree::flush_while_gorged`]).
    fn gorge_limit_bytes(&self, is_root: bool, pressure: bool) -> usize {
        if is_root || !pressure {
            self.params.node_size_bytes
        } else {
            self.params.node_size_bytes / 4
        }
    }

    /// Child indexes from the root to the cached internal node the cleaner should flush
    /// (empty: the root), or `None` when none holds `min_fullness_1024` / 1024 of its gorge
    /// limit. Looks only at cached nodes and leaves their CLOCK counts alone.
    fn cleaning_target(&self, min_fullness_1024: u64) -> Option<Vec<usize>> {
        let pressure = self.store.under_pressure();
        let mut best: Option<(u64, Vec<usize>)> = None;
        let mut stack = vec![(self.root, Vec::new())];
        while let Some((id, path)) = stack.pop() {
            let Some(Node::Internal(n)) = self.store.peek_quiet(id) else {
                continue;
            };
            let limit = self.gorge_limit_bytes(path.is_empty(), pressure).max(1);
            let size = n.size_bytes();
            // Fullness in 1/1024ths of the limit; ties go to the node found first.
            let fullness = (size as u64).saturating_mul(1024) / limit as u64;
            if fullness >= min_fullness_1024
                && n.heaviest_buffer().is_some()
                && best.as_ref().is_none_or(|(f, _)| fullness > *f)
            {
                best = Some((fullness, path.clone()));
            }
            if n.height > 1 {
                for (i, &c) in n.children.iter().enumerate().rev() {
                    let mut p = path.clone();
                    p.push(i);
                    stack.push((c, p));
                }
            }
        }
        best.map(|(_, p)| p)
    }

    /// Follows `path` from `n` and flushes the heaviest buffer of the node it ends at.
    fn clean_at(&mut self, n: &mut Internal, edges: Edges, path: &[usize]) -> Result<()> {
        if let Some((&i, rest)) = path.split_first() {
            return self.below_child(n, i, edges, |t, c, ce| t.clean_at(c, ce, rest));
        }
        let Some(i) = n.heaviest_buffer() else {
            return Ok(());
        };
        if !self.spill_if_child_uncached(n, i)? {
            let ce = child_edges(edges, i, n.children.len());
            self.flush_into_child(n, i, ce)?;
        }
        Ok(())
    }

    /// Waits for every background flush and forgets it (before the tree is replaced).
    fn cancel_flushes(&mut self) {
        if let Some(f) = self.flusher.as_mut() {
            let reserved: usize = f.in_flight.iter().map(|x| x.reserved_bytes).sum();
            f.cancel_all();
            self.store.reserve(0, reserved);
        }
    }

    /// Writes `msgs` (point messages sorted by (key, MSN)) as a new run block.
    fn write_run(&mut self, msgs: Vec<Msg>) -> Result<RunRef> {
        let id = self.alloc_id();
        let mut hashes = Vec::with_capacity(msgs.len());
        let mut bytes = 0u64;
        let mut min_key: Option<&[u8]> = None;
        let mut max_key: Option<&[u8]> = None;
        for m in &msgs {
            if let Msg::Point { key, .. } = m {
                hashes.push(key_hash(key));
                min_key = Some(min_key.map_or(key.as_slice(), |k| k.min(key.as_slice())));
                max_key = Some(max_key.map_or(key.as_slice(), |k| k.max(key.as_slice())));
            }
            bytes += m.size_bytes() as u64;
        }
        let run = RunRef {
            id,
            msgs: u32::try_from(msgs.len())
                .map_err(|_| EngineError::InvalidArgument("run over 4 G messages".into()))?,
            bytes,
            min_key: min_key.unwrap_or_default().to_vec(),
            max_key: max_key.unwrap_or_default().to_vec(),
            filter: KeyFilter::build_with_bits(
                hashes.into_iter(),
                RUN_FILTER_BITS_PER_KEY,
                RUN_FILTER_PROBES,
            ),
        };
        // The writeback thread encodes and writes it when it can take it (readable from memory
        // meanwhile); otherwise the writer does.
        if let Some(msgs) = self.store.try_defer_run(id, msgs, bytes as usize) {
            let enc = encode_run(id, &msgs, self.store.compression_level())?;
            self.store.write_run(id, enc)?;
        }
        Ok(run)
    }

    /// Reads and frees the spilled runs of a buffer: their messages, run after run (each run in
    /// (key, MSN) order; callers sort as they need).
    fn take_runs(&mut self, runs: Vec<RunRef>) -> Result<Vec<Msg>> {
        let mut out = Vec::new();
        for r in &runs {
            let msgs = self.store.read_run(r.id)?;
            if msgs.len() != r.msgs as usize {
                return Err(corrupt(
                    format!("{} run {}", self.store.path().display(), r.id),
                    format!("{} messages, parent says {}", msgs.len(), r.msgs),
                ));
            }
            out.extend(msgs);
        }
        for r in runs {
            self.store.delete(r.id);
        }
        Ok(out)
    }

    /// Moves every message of buffer `i` into child `i` (applying them if it is a leaf), then
    /// cascades, splits or merges the child.
    fn flush_into_child(&mut self, parent: &mut Internal, i: usize, ce: Edges) -> Result<()> {
        self.flush_into_child_inner(parent, i, ce, true)
    }

    /// `may_merge`: an underfull child merges with a neighbour after the flush. Before a merge the
    /// neighbour's buffer is flushed too, so both parent buffers are empty and every message that
    /// later enters the merged subtree is newer than all it holds (the MSN invariant that lets a
    /// split leaf give all its basements the leaf's highest MSN).
    fn flush_into_child_inner(
        &mut self,
        parent: &mut Internal,
        i: usize,
        ce: Edges,
        may_merge: bool,
    ) -> Result<()> {
        let Some(&cid) = parent.children.get(i) else {
            return Err(corrupt(format!("node child {i}"), "flush of a missing child"));
        };
        if let Some((flight, r)) = self.flusher.as_mut().and_then(|f| {
            let r = f.wait_for(cid);
            f.totals.waited += u64::from(r.is_some());
            r
        }) {
            // A background flush into this leaf comes first.
            self.install_leaf_flush(parent, i, flight, r?)?;
        }
        let Some(buf) = parent.buffers.get_mut(i) else {
            return Err(corrupt(format!("node child {i}"), "flush of a missing child"));
        };
        let runs = buf.take_spilled();
        let had_runs = !runs.is_empty();
        let mut msgs = buf.take_all();
        if !runs.is_empty() {
            self.spill_stats.runs_merged += runs.len() as u64;
            // Runs hold older messages than the buffer (sorted by MSN below).
            let mut all = self.take_runs(runs)?;
            all.append(&mut msgs);
            msgs = all;
        }
        let mut child = self.store.take(cid)?;
        let mut msgs = match &mut child {
            // Messages from runs go on to the child's own uncached children as runs.
            Node::Internal(c) if had_runs && c.height + 1 == parent.height => {
                self.hand_down(c, ce, msgs)?;
                Vec::new()
            }
            _ => msgs,
        };
        if had_runs {
            // One MSN-ordered stream for the child.
            msgs.sort_by_key(Msg::msn);
        }
        if child.height() + 1 != parent.height {
            return Err(corrupt(
                format!("node {cid}"),
                format!(
                    "height {} under a parent of height {}",
                    child.height(),
                    parent.height
                ),
            ));
        }
        match &mut child {
            Node::Leaf(l) => {
                l.apply_batch(msgs);
                l.normalize(self.params.basement_size_bytes);
            }
            Node::Internal(c) => {
                for m in msgs {
                    c.push_msg(m);
                }
                self.flush_while_gorged(c, ce, false)?;
            }
        }
        let extras = self.split_if_needed(&mut child, ce);
        let underfull = extras.is_empty() && self.is_underfull(&child);
        let is_leaf = child.height() == 0;
        self.store.put(cid, child);
        let added = extras.len();
        self.insert_siblings(parent, i, extras);
        if had_runs && is_leaf {
            // A leaf that received spilled runs was not cached and will not get messages again
            // until another node's worth has spilled: write it now and drop it from the cache,
            // keeping the cache for internal nodes (and out of the incremental writer's way).
            let ids: Vec<NodeId> = parent
                .children
                .get(i..=i + added)
                .map(<[_]>::to_vec)
                .unwrap_or_default();
            for id in ids {
                self.store.write_and_evict_soon(id)?;
            }
        }
        if may_merge && underfull && parent.children.len() > 1 {
            let j = if i + 1 < parent.children.len() {
                i + 1
            } else {
                i - 1
            };
            if parent.buffers.get(j).is_some_and(|b| !b.is_empty()) {
                let je = Edges {
                    left: false,
                    right: false,
                };
                self.flush_into_child_inner(parent, j, je, false)?;
            }
            // The neighbour may have split; find the child again and merge with an adjacent
            // child whose buffer is empty.
            let Some(i) = parent.children.iter().position(|&c| c == cid) else {
                return Ok(());
            };
            let j = if i + 1 < parent.children.len() {
                i + 1
            } else {
                i.wrapping_sub(1)
            };
            if parent.buffers.get(j).is_some_and(Buffer::is_empty)
                && parent.buffers.get(i).is_some_and(Buffer::is_empty)
            {
                self.merge_children(parent, i.min(j))?;
            }
        }
        Ok(())
    }

    /// Run hand-down: of the messages flushed into internal node `c` together with spilled
    /// runs (any order), those for a child of `c` that is not cached go straight into a new run
    /// for that child, merged with the point messages `c`'s buffer holds for it (older, so the
    /// run stays older than anything left in memory), instead of being pushed into `c`'s
    /// buffers one by one, only to be taken out, sorted and spilled again when `c` gorges
    /// (SplinterDB flushes whole branches the same way, Conway et al., USENIX ATC 2020). A
    /// child's share goes this way when it is at least a 32nd of a node with its buffer; smaller
    /// shares, shares for cached children or for buffers holding range messages, and all of a
    /// batch with range messages are pushed into `c`'s buffers in MSN order. Only then are the
    /// children whose runs add up to a node flushed ([`Tree::after_spill`]): such a flush may
    /// merge a child with a neighbour after flushing the neighbour's buffer, which must by then
    /// hold every message for it (a merged leaf's basements take the newest MSN of both, so a
    /// message pushed after the merge would be taken as already applied).
    fn hand_down(&mut self, c: &mut Internal, ce: Edges, mut msgs: Vec<Msg>) -> Result<()> {
        if msgs.iter().any(|m| matches!(m, Msg::Range(_))) {
            msgs.sort_by_key(Msg::msn);
            for m in msgs {
                c.push_msg(m);
            }
            return Ok(());
        }
        let min_bytes = self.params.node_size_bytes / 32;
        let mut groups: Vec<(Vec<Msg>, usize)> = (0..c.children.len()).map(|_| (Vec::new(), 0)).collect();
        for m in msgs {
            if let Msg::Point { key, .. } = &m {
                let j = child_index(&c.pivots, key);
                let Some(g) = groups.get_mut(j) else {
                    return Err(corrupt(
                        format!("{} internal node", self.store.path().display()),
                        format!("child index {j} of {} children", c.children.len()),
                    ));
                };
                g.1 += m.size_bytes();
                g.0.push(m);
            }
        }
        let mut rest = Vec::new();
        let mut spilled_into = Vec::new();
        for (j, (group, bytes)) in groups.into_iter().enumerate() {
            if group.is_empty() {
                continue;
            }
            let (Some(b), Some(&gc)) = (c.buffers.get_mut(j), c.children.get(j)) else {
                rest.extend(group);
                continue;
            };
            if self.store.is_cached(gc) || !b.range_msgs().is_empty() || bytes + b.bytes() < min_bytes {
                rest.extend(group);
                continue;
            }
            let mut run = b.take_points();
            run.extend(group);
            super::msg::sort_points_by_key(&mut run);
            drop_superseded(&mut run);
            let r = self.write_run(run)?;
            b.push_spilled(r);
            self.spill_stats.runs_spilled += 1;
            self.spill_stats.runs_handed_down += 1;
            spilled_into.push(gc);
        }
        rest.sort_by_key(Msg::msn);
        for m in rest {
            c.push_msg(m);
        }
        // Children whose runs now add up to a node are flushed (in the background when the
        // flusher has room). Found by id: a flush may split or merge children.
        for gc in spilled_into {
            let Some(j) = c.children.iter().position(|&x| x == gc) else {
                continue;
            };
            if !self.after_spill(c, j)? {
                let je = child_edges(ce, j, c.children.len());
                self.flush_into_child(c, j, je)?;
            }
        }
        Ok(())
    }

    fn insert_siblings(&mut self, parent: &mut Internal, i: usize, extras: Vec<(Vec<u8>, Node)>) {
        for (k, (p, node)) in extras.into_iter().enumerate() {
            let id = self.alloc_id();
            self.store.put(id, node);
            parent.pivots.insert(i + k, p);
            parent.children.insert(i + 1 + k, id);
            parent.buffers.insert(i + 1 + k, Buffer::new());
        }
    }

    fn is_underfull(&self, node: &Node) -> bool {
        match node {
            Node::Leaf(l) => l.size_bytes() < self.params.node_size_bytes / 4,
            Node::Internal(n) => n.children.len() < (self.params.fanout / 4).max(2),
        }
    }

    /// Merges child `i` with a neighbour (their buffers merge too), re-splitting if too big.
    fn merge_children(&mut self, parent: &mut Internal, a: usize) -> Result<()> {
        let b = a + 1;
        if b >= parent.children.len() {
            return Ok(());
        }
        let (a_id, b_id) = (parent.children[a], parent.children[b]);
        if self.flush_busy(a_id) || self.flush_busy(b_id) {
            // Merging can wait; the leaf being flushed in the background may not change.
            return Ok(());
        }
        let mut left = self.store.take(a_id)?;
        let right = match self.store.take(b_id) {
            Ok(r) => r,
            Err(e) => {
                self.store.put(a_id, left);
                return Err(e);
            }
        };
        let pivot = parent.pivots.remove(a);
        parent.children.remove(b);
        let bbuf = parent.buffers.remove(b);
        parent.buffers[a].absorb(bbuf);
        match (&mut left, right) {
            (Node::Leaf(l), Node::Leaf(r)) => {
                l.pivots.push(pivot);
                l.pivots.extend(r.pivots);
                l.basements.extend(r.basements);
                l.normalize(self.params.basement_size_bytes);
            }
            (Node::Internal(l), Node::Internal(r)) if l.height == r.height => {
                l.pivots.push(pivot);
                l.pivots.extend(r.pivots);
                l.children.extend(r.children);
                l.buffers.extend(r.buffers);
            }
            _ => {
                return Err(corrupt(
                    format!("nodes {a_id} and {b_id}"),
                    "siblings of different heights",
                ))
            }
        }
        self.store.delete(b_id);
        let extras = self.split_if_needed(&mut left, NO_EDGES);
        self.store.put(a_id, left);
        self.insert_siblings(parent, a, extras);
        Ok(())
    }

    /// Splits an oversized node; returns the new right siblings with their left pivots.
    fn split_if_needed(&self, node: &mut Node, edges: Edges) -> Vec<(Vec<u8>, Node)> {
        let p = self.params;
        match node {
            Node::Leaf(l) => {
                let total = l.size_bytes();
                if total <= p.node_size_bytes || l.entry_count() < 2 {
                    return Vec::new();
                }
                let appending = edges.right && l.appending;
                let prepending = edges.left && l.prepending && !appending;
                let max_msn = l.max_msn();
                let entries = std::mem::take(l).into_entries();
                // Edge leaves under sequential inserts split unevenly so the full part stays full.
                let pieces = if appending {
                    chunk_entries(entries, p.node_size_bytes * 15 / 16)
                } else if prepending {
                    let mut rev = entries;
                    rev.reverse();
                    let mut chunks = chunk_entries(rev, p.node_size_bytes * 15 / 16);
                    chunks.reverse();
                    for c in &mut chunks {
                        c.reverse();
                    }
                    chunks
                } else {
                    let n = (total * 2).div_ceil(p.node_size_bytes).max(2);
                    split_entries_even(entries, n)
                };
                let mut leaves = pieces.into_iter().map(|c| {
                    let pivot = c.first().map(|e| e.0.clone()).unwrap_or_default();
                    (pivot, Leaf::from_entries(c, max_msn, p.basement_size_bytes))
                });
                if let Some((_, first)) = leaves.next() {
                    *l = first;
                }
                leaves.map(|(pv, leaf)| (pv, Node::Leaf(leaf))).collect()
            }
            Node::Internal(n) => {
                let len = n.children.len();
                if len <= p.fanout {
                    return Vec::new();
                }
                let pieces = len.div_ceil(p.fanout).max(2);
                let per = len.div_ceil(pieces);
                let mut out = Vec::new();
                let mut rest_children = n.children.split_off(per);
                let mut rest_buffers = n.buffers.split_off(per);
                let mut rest_pivots = n.pivots.split_off(per - 1);
                while !rest_children.is_empty() {
                    let up = rest_pivots.remove(0);
                    let take = per.min(rest_children.len());
                    let next_children = rest_children.split_off(take);
                    let next_buffers = rest_buffers.split_off(take);
                    let next_pivots = rest_pivots.split_off((take - 1).min(rest_pivots.len()));
                    out.push((
                        up,
                        Node::Internal(Internal {
                            height: n.height,
                            pivots: std::mem::replace(&mut rest_pivots, next_pivots),
                            children: std::mem::replace(&mut rest_children, next_children),
                            buffers: std::mem::replace(&mut rest_buffers, next_buffers),
                        }),
                    ));
                }
                out
            }
        }
    }

    // --------------------------------------------------------------------------------------
    // Read path
    // --------------------------------------------------------------------------------------

    /// Value of `key`: the leaf's entry with every pending ancestor message for the key applied
    /// in MSN order.
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let root = self.root;
        get_from(&mut Loading(&mut self.store), root, key).map(|r| r.unwrap_or_default())
    }

    /// Like [`Tree::get`] from cached nodes only (a shared lock suffices); `None` on a miss.
    pub fn get_cached(&self, key: &[u8]) -> Option<Result<Option<Vec<u8>>>> {
        get_from(&mut CachedOnly(&self.store), self.root, key).transpose()
    }

    /// Up to `limit` pairs in `[start, end)`, leaf by leaf and basement by basement, with pending
    /// ancestor messages applied.
    pub fn scan(&mut self, start: &[u8], end: Option<&[u8]>, limit: usize) -> Result<Vec<KeyValue>> {
        let root = self.root;
        scan_from(&mut Loading(&mut self.store), root, start, end, limit).map(|r| r.unwrap_or_default())
    }

    /// Like [`Tree::scan`] from cached nodes only; `None` on a miss.
    pub fn scan_cached(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> Option<Result<Vec<KeyValue>>> {
        scan_from(&mut CachedOnly(&self.store), self.root, start, end, limit).transpose()
    }
}

/// Point read over `src`; `Ok(None)` when `src` missed a node.
fn get_from(src: &mut impl Fetch, root: NodeId, key: &[u8]) -> Result<Option<Option<Vec<u8>>>> {
    let mut msgs = Vec::new();
    let mut id = root;
    let hash = key_hash(key);
    // Height of `id` once known from its parent (the root is always cached).
    let mut height: Option<u32> = None;
    loop {
        match height {
            // An uncached leaf is read one basement at a time.
            Some(0) => match src.probe_leaf(id, key, overriding_msn(&msgs))? {
                LeafProbe::Value(v, floor) => return Ok(Some(finish_point_read(v, floor, key, msgs))),
                LeafProbe::Miss => return Ok(None),
                LeafProbe::UseNode => {}
            },
            // An uncached internal node: partition 0 and at most one buffer.
            Some(h) => match src.probe_internal(id, key, hash, &mut msgs)? {
                InternalProbe::Child(c) => {
                    id = c;
                    height = Some(h - 1);
                    continue;
                }
                InternalProbe::Miss => return Ok(None),
                InternalProbe::UseNode => {}
            },
            None => {}
        }
        let Some(node) = src.fetch(id)? else {
            return Ok(None);
        };
        match node {
            Node::Internal(n) => {
                let i = child_index(&n.pivots, key);
                let (Some(b), Some(&c)) = (n.buffers.get(i), n.children.get(i)) else {
                    return Err(corrupt(format!("node {id}"), "pivot/child count mismatch"));
                };
                if n.height == 0 {
                    return Err(corrupt(format!("node {id}"), "internal node of height 0"));
                }
                b.collect_for_key(key, hash, &mut msgs);
                let runs: Vec<u64> = b
                    .spilled()
                    .iter()
                    .filter(|r| r.may_hold(key, hash))
                    .map(|r| r.id)
                    .collect();
                height = Some(n.height - 1);
                id = c;
                for r in runs {
                    src.store().run_msgs_for_key(r, key, &mut msgs)?;
                }
            }
            Node::Leaf(l) => {
                let bi = child_index(&l.pivots, key);
                let Some(b) = l.basements.get(bi) else {
                    return Err(corrupt(format!("node {id}"), "basement count mismatch"));
                };
                return Ok(Some(finish_point_read(
                    b.get(key).map(<[u8]>::to_vec),
                    b.max_msn,
                    key,
                    msgs,
                )));
            }
        }
    }
}

/// MSN of the newest message in `msgs` (all for one key) that sets or deletes the key outright
/// (a Put, a Delete, or a DeleteRange): the value below it no longer matters.
fn overriding_msn(msgs: &[Msg]) -> Option<Msn> {
    msgs.iter()
        .filter(|m| match m {
            Msg::Point { op, .. } => matches!(op, PointOp::Put(_) | PointOp::Delete),
            Msg::Range(r) => matches!(r.op, RangeOp::Delete),
        })
        .map(Msg::msn)
        .max()
}

/// Applies the ancestor messages above `floor` (the basement's applied MSN) in MSN order.
fn finish_point_read(mut v: Option<Vec<u8>>, floor: Msn, key: &[u8], mut msgs: Vec<Msg>) -> Option<Vec<u8>> {
    msgs.sort_by_key(Msg::msn);
    for m in msgs.iter().filter(|m| m.msn() > floor) {
        v = apply_msg_to_value(v, key, m);
    }
    v
}

/// Ancestor messages collected for one scan pass, ready to merge with basement entries in key
/// order: point messages sorted by (key, MSN), range messages in MSN order.
struct PendingForRange {
    points: Vec<(Vec<u8>, Msn, PointOp)>,
    ranges: Vec<RangeMsg>,
}

impl PendingForRange {
    fn new(msgs: Vec<Msg>) -> Self {
        let mut points = Vec::new();
        let mut ranges = Vec::new();
        for m in msgs {
            match m {
                Msg::Point { msn, key, op } => points.push((key, msn, op)),
                Msg::Range(r) => ranges.push(r),
            }
        }
        points.sort_unstable_by(|a, b| super::msg::key_cmp(&a.0, &b.0).then(a.1.cmp(&b.1)));
        ranges.sort_by_key(|r| r.msn);
        PendingForRange { points, ranges }
    }

    /// Streams the rows of basement `b` in `[lo, hi)` with the pending messages newer than the
    /// basement's applied MSN folded in (in MSN order), appending to `out` until it holds
    /// `limit` rows; true when the limit was reached. Nothing is copied but the rows returned.
    fn merge_basement(
        &self,
        b: &Basement,
        lo: &[u8],
        hi: Option<&[u8]>,
        limit: usize,
        out: &mut Vec<KeyValue>,
    ) -> bool {
        let floor = b.max_msn;
        let below_hi = |k: &[u8]| hi.is_none_or(|h| k < h);
        let s = b.lower_bound(lo);
        let mut entries = b
            .iter_range(s..b.len())
            .take_while(|(k, _)| below_hi(k))
            .peekable();
        let p0 = self.points.partition_point(|(k, _, _)| k.as_slice() < lo);
        let mut points = self.points[p0..]
            .iter()
            .take_while(|(k, _, _)| below_hi(k))
            .peekable();
        let ranges: Vec<&RangeMsg> = self
            .ranges
            .iter()
            .filter(|r| r.msn > floor && r.overlaps(Some(lo), hi))
            .collect();
        loop {
            // The next key in order: from the entries, the messages, or both.
            let key: &[u8] = match (entries.peek(), points.peek()) {
                (None, None) => return false,
                (Some((ek, _)), None) => ek,
                (None, Some((pk, _, _))) => pk,
                (Some((ek, _)), Some((pk, _, _))) => (*ek).min(pk.as_slice()),
            };
            let stored = entries.next_if(|(ek, _)| *ek == key).map(|(_, v)| v);
            let mut mine: Vec<(Msn, &PointOp)> = Vec::new();
            while let Some((_, msn, op)) = points.next_if(|(pk, _, _)| pk.as_slice() == key) {
                if *msn > floor {
                    mine.push((*msn, op));
                }
            }
            let covering = ranges.iter().filter(|r| r.covers(key));
            let value: Option<Vec<u8>> = if mine.is_empty() && ranges.is_empty() {
                stored.map(<[u8]>::to_vec)
            } else {
                // Fold point and range messages in MSN order (both lists are MSN-sorted).
                let mut v = stored.map(<[u8]>::to_vec);
                let mut rs = covering.peekable();
                let mut ps = mine.into_iter().peekable();
                loop {
                    let take_range = match (ps.peek(), rs.peek()) {
                        (None, None) => break,
                        (Some(_), None) => false,
                        (None, Some(_)) => true,
                        (Some((pm, _)), Some(r)) => r.msn < *pm,
                    };
                    if take_range {
                        if let Some(r) = rs.next() {
                            v = v.and_then(|x| apply_range(&x, &r.op));
                        }
                    } else if let Some((_, op)) = ps.next() {
                        v = apply_point(v, op);
                    }
                }
                v
            };
            if let Some(v) = value {
                out.push((key.to_vec(), v));
                if out.len() >= limit {
                    return true;
                }
            }
        }
    }
}

/// Point keys a scan's first pass takes from each buffer on its path (see [`scan_from`]).
const SCAN_FIRST_PASS_KEYS: usize = 16;

/// Range read over `src`; `Ok(None)` when `src` missed a node.
fn scan_from(
    src: &mut impl Fetch,
    root: NodeId,
    start: &[u8],
    end: Option<&[u8]>,
    limit: usize,
) -> Result<Option<Vec<KeyValue>>> {
    {
        let mut out = Vec::new();
        if limit == 0 || end.is_some_and(|e| e <= start) {
            return Ok(Some(out));
        }
        let mut cursor = start.to_vec();
        // Point keys taken from one buffer per pass: a page needs a few keys, not the buffer.
        // The first pass takes few: an upper buffer holds one message per many rows below it, so
        // its first keys already span more rows than a page (taking `limit` keys from each buffer
        // on the path cloned and sorted hundreds of messages per 100-row page, 70% of a scan's
        // time in memory). A pass cut short by a buffer doubles the count for the next one.
        let mut keys_per_pass = SCAN_FIRST_PASS_KEYS.min(limit);
        let max_keys_per_pass = limit.max(64);
        let mut runs: Vec<(u64, Option<Vec<u8>>)> = Vec::new();
        loop {
            let mut msgs = Vec::new();
            let mut hi: Option<Vec<u8>> = None;
            let mut id = root;
            loop {
                let Some(node) = src.fetch(id)? else {
                    return Ok(None);
                };
                let Node::Internal(n) = node else { break };
                let i = child_index(&n.pivots, &cursor);
                if let Some(p) = n.pivots.get(i) {
                    if hi.as_ref().is_none_or(|h| p < h) {
                        hi = Some(p.clone());
                    }
                }
                let qhi = min_bound(hi.as_deref(), end);
                let (Some(b), Some(&c)) = (n.buffers.get(i), n.children.get(i)) else {
                    return Err(corrupt(format!("node {id}"), "pivot/child count mismatch"));
                };
                // A buffer that stopped early bounds this pass at the first key it left out
                // (rows below it are complete); the next pass resumes there.
                if let Some(cut) = b.collect_for_range_limited(Some(&cursor), qhi, keys_per_pass, &mut msgs) {
                    if hi.as_ref().is_none_or(|h| cut < *h) {
                        hi = Some(cut);
                    }
                }
                let qhi = min_bound(hi.as_deref(), end).map(<[u8]>::to_vec);
                runs.extend(
                    b.spilled()
                        .iter()
                        .filter(|r| r.overlaps(Some(&cursor), qhi.as_deref()))
                        .map(|r| (r.id, qhi.clone())),
                );
                id = c;
            }
            for (r, rhi) in runs.drain(..) {
                src.store()
                    .run_msgs_for_range(r, &cursor, rhi.as_deref(), &mut msgs)?;
            }
            let qhi = min_bound(hi.as_deref(), end).map(<[u8]>::to_vec);
            let pending = PendingForRange::new(msgs);
            let Some(node) = src.fetch(id)? else {
                return Ok(None);
            };
            let Node::Leaf(leaf) = node else {
                return Err(corrupt(format!("node {id}"), "expected a leaf"));
            };
            let first = child_index(&leaf.pivots, &cursor);
            for bi in first..leaf.basements.len() {
                let (blo, bhi) = child_bounds(&leaf.pivots, bi, None, None);
                let lo: &[u8] = match blo {
                    Some(b) if b > cursor.as_slice() => b,
                    _ => &cursor,
                };
                let h = min_bound(bhi, qhi.as_deref());
                if h.is_some_and(|h| lo >= h) {
                    break;
                }
                let Some(b) = leaf.basements.get(bi) else { break };
                if pending.merge_basement(b, lo, h, limit, &mut out) {
                    return Ok(Some(out));
                }
            }
            src.after_leaf(root)?;
            match qhi {
                None => return Ok(Some(out)),
                Some(h) => {
                    if end.is_some_and(|e| h.as_slice() >= e) {
                        return Ok(Some(out));
                    }
                    cursor = h;
                    keys_per_pass = keys_per_pass.saturating_mul(2).min(max_keys_per_pass);
                }
            }
        }
    }
}

impl Tree {
    // --------------------------------------------------------------------------------------
    // Checkpoint, bulk load
    // --------------------------------------------------------------------------------------

    /// Writes every dirty node, then commits the BTT, metadata and header, on this thread.
    pub fn checkpoint(&mut self) -> Result<()> {
        self.store
            .checkpoint(self.root, self.next_msn, self.next_node_id, self.meta.clone())
            .map(|_| ())
    }

    /// Starts a checkpoint of the tree as it is now; run the job without the engine lock, then
    /// hand its result to [`Store::finish_checkpoint`] (see [`Store::begin_checkpoint`]).
    pub fn begin_checkpoint(&mut self) -> CheckpointJob {
        self.store
            .begin_checkpoint(self.root, self.next_msn, self.next_node_id, self.meta.clone())
    }

    /// Builds a fresh tree bottom-up from sorted `pairs` (leaves filled to 7/8 of the node size,
    /// PerconaFT's loader), then switches to it and checkpoints. On error before the switch the
    /// old tree is untouched and the new blocks are released.
    pub fn replace_all(
        &mut self,
        pairs: &mut dyn Iterator<Item = Result<KeyValue>>,
        meta: &[u8],
    ) -> Result<()> {
        self.cancel_flushes();
        let old_ids: HashSet<NodeId> = self
            .store
            .btt_ids()
            .chain(self.store.cached_ids())
            .chain(self.store.pending_run_ids())
            .collect();
        let mut new_ids = Vec::new();
        match self.build(pairs, &mut new_ids) {
            Ok(root) => {
                for id in old_ids {
                    self.store.delete(id);
                }
                self.root = root;
                self.meta = Some(meta.to_vec());
                self.checkpoint()
            }
            Err(e) => {
                for id in new_ids {
                    self.store.delete(id);
                }
                Err(e)
            }
        }
    }

    fn build(
        &mut self,
        pairs: &mut dyn Iterator<Item = Result<KeyValue>>,
        ids: &mut Vec<NodeId>,
    ) -> Result<NodeId> {
        let p = self.params;
        let fill = p.node_size_bytes * 7 / 8;
        let mut level: Vec<(Vec<u8>, NodeId)> = Vec::new();
        let mut cur: Vec<KeyValue> = Vec::new();
        let mut cur_bytes = 0usize;
        let mut last: Option<Vec<u8>> = None;
        for pair in pairs {
            let (k, v) = pair?;
            if last.as_ref().is_some_and(|l| *l >= k) {
                return Err(EngineError::InvalidArgument(
                    "replace_all pairs not strictly ascending".into(),
                ));
            }
            last = Some(k.clone());
            cur_bytes += k.len() + v.len() + super::node::ENTRY_OVERHEAD_BYTES;
            cur.push((k, v));
            if cur_bytes >= fill {
                self.emit_leaf(std::mem::take(&mut cur), &mut level, ids)?;
                cur_bytes = 0;
            }
        }
        if !cur.is_empty() || level.is_empty() {
            self.emit_leaf(cur, &mut level, ids)?;
        }
        let mut height = 1;
        while level.len() > 1 {
            let mut next = Vec::new();
            let per = p.fanout.max(2);
            for group in level.chunks(per) {
                let first_key = group.first().map(|g| g.0.clone()).unwrap_or_default();
                let node = Node::Internal(Internal {
                    height,
                    pivots: group.iter().skip(1).map(|g| g.0.clone()).collect(),
                    children: group.iter().map(|g| g.1).collect(),
                    buffers: vec![Buffer::new(); group.len()],
                });
                let id = self.alloc_id();
                ids.push(id);
                self.store.write_uncached(id, &node)?;
                next.push((first_key, id));
            }
            level = next;
            height += 1;
        }
        level
            .first()
            .map(|l| l.1)
            .ok_or_else(|| corrupt("bulk load", "no root built"))
    }

    fn emit_leaf(
        &mut self,
        entries: Vec<KeyValue>,
        level: &mut Vec<(Vec<u8>, NodeId)>,
        ids: &mut Vec<NodeId>,
    ) -> Result<()> {
        let first_key = entries.first().map(|e| e.0.clone()).unwrap_or_default();
        let leaf = Node::Leaf(Leaf::from_entries(entries, 0, self.params.basement_size_bytes));
        let id = self.alloc_id();
        ids.push(id);
        self.store.write_uncached(id, &leaf)?;
        level.push((first_key, id));
        Ok(())
    }

    // --------------------------------------------------------------------------------------
    // Integrity
    // --------------------------------------------------------------------------------------

    /// Walks every node: pivots sorted and inside their parent's bounds, keys inside pivot
    /// bounds and sorted, buffer messages in MSN order and inside their child's range, stored
    /// sizes equal recomputed ones, all leaves at one depth, reachable nodes == nodes with a
    /// block or a cache entry, no overlapping blocks. Then counts live keys with a full scan.
    pub fn check_integrity(&mut self) -> Result<IntegrityReport> {
        let mut reachable = HashSet::new();
        let root = self.root;
        let root_height = self.check_node(root, None, None, None, &mut reachable)?;
        let known: HashSet<NodeId> = self
            .store
            .btt_ids()
            .chain(self.store.cached_ids())
            .chain(self.store.pending_run_ids())
            .collect();
        if reachable != known {
            let mut leaked: Vec<_> = known.difference(&reachable).copied().collect();
            let mut missing: Vec<_> = reachable.difference(&known).copied().collect();
            leaked.sort_unstable();
            missing.sort_unstable();
            return Err(corrupt(
                format!("{} BTT", self.store.path().display()),
                format!("unreachable nodes {leaked:?}, nodes without block {missing:?}"),
            ));
        }
        self.store
            .check_space()
            .map_err(|d| corrupt(format!("{} block map", self.store.path().display()), d))?;
        let mut keys = 0u64;
        let mut cursor: Vec<u8> = Vec::new();
        loop {
            let chunk = self.scan(&cursor, None, 4096)?;
            keys += chunk.len() as u64;
            match chunk.last() {
                Some((k, _)) if chunk.len() == 4096 => {
                    cursor = k.clone();
                    cursor.push(0);
                }
                _ => break,
            }
        }
        Ok(IntegrityReport {
            keys,
            blocks: reachable.len() as u64,
            height: root_height + 1,
        })
    }

    fn check_node(
        &mut self,
        id: NodeId,
        lo: Option<Vec<u8>>,
        hi: Option<Vec<u8>>,
        expect_height: Option<u32>,
        reachable: &mut HashSet<NodeId>,
    ) -> Result<u32> {
        let loc = format!("{} node {id}", self.store.path().display());
        if !reachable.insert(id) {
            return Err(corrupt(loc, "node reachable twice"));
        }
        let node = self.store.get(id)?.clone();
        self.store.evict_to_budget(self.root)?;
        let next_msn = self.next_msn;
        let height = node.height();
        if expect_height.is_some_and(|h| h != height) {
            return Err(corrupt(
                loc,
                format!("height {height}, expected {expect_height:?}"),
            ));
        }
        let bad = |d: String| corrupt(loc.clone(), d);
        let check_pivots = |pivots: &[Vec<u8>], parts: usize| -> std::result::Result<(), String> {
            if parts != pivots.len() + 1 || parts == 0 {
                return Err(format!("{} pivots for {parts} parts", pivots.len()));
            }
            for w in pivots.windows(2) {
                if w[0] >= w[1] {
                    return Err("pivots not strictly increasing".into());
                }
            }
            for p in pivots {
                if lo.as_ref().is_some_and(|l| p <= l) || hi.as_ref().is_some_and(|h| p >= h) {
                    return Err(format!("pivot {p:?} outside node bounds [{lo:?}, {hi:?})"));
                }
            }
            Ok(())
        };
        match node {
            Node::Leaf(l) => {
                check_pivots(&l.pivots, l.basements.len()).map_err(&bad)?;
                for (bi, b) in l.basements.iter().enumerate() {
                    let (blo, bhi) = child_bounds(&l.pivots, bi, lo.as_deref(), hi.as_deref());
                    for j in 1..b.len() {
                        if b.key(j - 1) >= b.key(j) {
                            return Err(bad(format!("basement {bi}: keys not strictly increasing")));
                        }
                    }
                    for (k, _) in b.iter() {
                        if blo.is_some_and(|x| k < x) || bhi.is_some_and(|x| k >= x) {
                            return Err(bad(format!(
                                "basement {bi}: key {k:?} outside [{blo:?}, {bhi:?})"
                            )));
                        }
                    }
                    let data = b.recompute_data_bytes();
                    if data != b.data_bytes() {
                        return Err(bad(format!(
                            "basement {bi}: size {} != recomputed {data}",
                            b.data_bytes()
                        )));
                    }
                    if b.max_msn >= next_msn {
                        return Err(bad(format!("basement {bi}: MSN {} from the future", b.max_msn)));
                    }
                }
                Ok(0)
            }
            Node::Internal(n) => {
                check_pivots(&n.pivots, n.children.len()).map_err(&bad)?;
                if n.buffers.len() != n.children.len() || height == 0 {
                    return Err(bad(format!(
                        "{} buffers, {} children, height {height}",
                        n.buffers.len(),
                        n.children.len()
                    )));
                }
                for (i, b) in n.buffers.iter().enumerate() {
                    let (clo, chi) = child_bounds(&n.pivots, i, lo.as_deref(), hi.as_deref());
                    check_buffer(b, clo, chi, next_msn).map_err(|d| bad(format!("buffer {i}: {d}")))?;
                    let mut spilled_bytes = 0usize;
                    for r in b.spilled() {
                        if !reachable.insert(r.id) {
                            return Err(bad(format!("buffer {i}: run {} referenced twice", r.id)));
                        }
                        let msgs = self.store.read_run(r.id)?;
                        check_run(r, &msgs, clo, chi, next_msn)
                            .map_err(|d| bad(format!("buffer {i}: run {}: {d}", r.id)))?;
                        spilled_bytes += r.bytes as usize;
                    }
                    if spilled_bytes != b.spilled_bytes() {
                        return Err(bad(format!(
                            "buffer {i}: spilled bytes {} != recomputed {spilled_bytes}",
                            b.spilled_bytes()
                        )));
                    }
                }
                for (i, &c) in n.children.iter().enumerate() {
                    let (clo, chi) = child_bounds(&n.pivots, i, lo.as_deref(), hi.as_deref());
                    let (clo, chi) = (clo.map(<[u8]>::to_vec), chi.map(<[u8]>::to_vec));
                    self.check_node(c, clo, chi, Some(height - 1), reachable)?;
                }
                Ok(height)
            }
        }
    }
}

fn check_buffer(
    b: &Buffer,
    lo: Option<&[u8]>,
    hi: Option<&[u8]>,
    next_msn: Msn,
) -> std::result::Result<(), String> {
    let (bytes, deletes, count) = b.recompute();
    if (bytes, deletes, count) != b.counters() {
        return Err(format!(
            "counters {:?} != recomputed {:?}",
            b.counters(),
            (bytes, deletes, count)
        ));
    }
    b.check_index()?;
    let mut prev: Option<(&[u8], Msn)> = None;
    for (msn, k, _) in b.point_msgs() {
        if lo.is_some_and(|x| k < x) || hi.is_some_and(|x| k >= x) {
            return Err(format!("message key {k:?} outside child range"));
        }
        if prev.is_some_and(|(pk, pm)| pk == k && pm >= msn) {
            return Err(format!("messages of {k:?} not in MSN order"));
        }
        if msn >= next_msn || msn == 0 {
            return Err(format!("message of {k:?} with MSN out of range"));
        }
        prev = Some((k, msn));
    }
    for w in b.range_msgs().windows(2) {
        if w[0].msn >= w[1].msn {
            return Err("range messages not in MSN order".into());
        }
    }
    for r in b.range_msgs() {
        if !r.overlaps(lo, hi) {
            return Err(format!("range message {} does not overlap its child", r.msn));
        }
        if r.msn >= next_msn || r.msn == 0 {
            return Err(format!("range message MSN {} out of range", r.msn));
        }
    }
    Ok(())
}

/// Checks a spilled run against its reference: message count and bytes, key span and filter
/// (no false negatives), keys inside the child's range, MSNs in range.
fn check_run(
    r: &RunRef,
    msgs: &[Msg],
    lo: Option<&[u8]>,
    hi: Option<&[u8]>,
    next_msn: Msn,
) -> std::result::Result<(), String> {
    if msgs.len() != r.msgs as usize {
        return Err(format!("{} messages, reference says {}", msgs.len(), r.msgs));
    }
    let bytes: u64 = msgs.iter().map(|m| m.size_bytes() as u64).sum();
    if bytes != r.bytes {
        return Err(format!("{bytes} bytes, reference says {}", r.bytes));
    }
    for m in msgs {
        let Msg::Point { msn, key, .. } = m else {
            return Err("range message in a run".into());
        };
        if lo.is_some_and(|x| key.as_slice() < x) || hi.is_some_and(|x| key.as_slice() >= x) {
            return Err(format!("message key {key:?} outside child range"));
        }
        if !r.may_hold(key, key_hash(key)) {
            return Err(format!("key span or filter misses key {key:?}"));
        }
        if *msn >= next_msn || *msn == 0 {
            return Err(format!("message of {key:?} with MSN out of range"));
        }
    }
    Ok(())
}

/// Drops, from point messages sorted by (key, MSN), exact duplicates (the same key and MSN,
/// re-delivered) and messages a newer `Put` or `Delete` of the same key supersedes, as
/// [`Buffer::push`] does.
fn drop_superseded(msgs: &mut Vec<Msg>) {
    let mut out: Vec<Msg> = Vec::with_capacity(msgs.len());
    for m in msgs.drain(..) {
        if let Msg::Point { key, msn, op } = &m {
            let supersedes = matches!(op, PointOp::Put(_) | PointOp::Delete);
            while let Some(Msg::Point { key: pk, msn: pm, .. }) = out.last() {
                if pk != key || !(pm == msn || supersedes) {
                    break;
                }
                out.pop();
            }
        }
        out.push(m);
    }
    *msgs = out;
}

fn min_bound<'a>(a: Option<&'a [u8]>, b: Option<&'a [u8]>) -> Option<&'a [u8]> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (Some(x), None) => Some(x),
        (None, y) => y,
    }
}

#[cfg(test)]
mod hand_down_tests {
    use super::{drop_superseded, Msg, PointOp};
    use crate::UpsertOp;

    fn point(key: &[u8], msn: u64, op: PointOp) -> Msg {
        Msg::Point {
            key: key.to_vec(),
            msn,
            op,
        }
    }

    /// Sorted (key, MSN) input: a Put or Delete drops the older messages of its key (however
    /// many), re-delivered duplicates collapse to one, and upserts after the newest Put stay.
    #[test]
    fn drop_superseded_keeps_what_can_still_change_the_outcome() {
        let add = || PointOp::Upsert(UpsertOp::Add(1));
        let mut msgs = vec![
            point(b"a", 1, add()),
            point(b"a", 2, add()),
            point(b"a", 3, PointOp::Put(b"x".to_vec())),
            point(b"a", 3, PointOp::Put(b"x".to_vec())),
            point(b"a", 5, add()),
            point(b"b", 1, PointOp::Put(b"y".to_vec())),
            point(b"b", 4, add()),
            point(b"b", 4, add()),
            point(b"c", 2, add()),
            point(b"c", 6, PointOp::Delete),
        ];
        drop_superseded(&mut msgs);
        assert_eq!(
            msgs,
            vec![
                point(b"a", 3, PointOp::Put(b"x".to_vec())),
                point(b"a", 5, add()),
                point(b"b", 1, PointOp::Put(b"y".to_vec())),
                point(b"b", 4, add()),
                point(b"c", 6, PointOp::Delete),
            ]
        );
    }
}
