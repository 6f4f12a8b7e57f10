//! The block layer and the cachetable: one file of copy-on-write node blocks addressed through a
//! block translation table (BTT), two alternating headers, a free-extent allocator, and a
//! CLOCK-evicted node cache with a byte budget (PerconaFT `ft/serialize/block_table.cc`,
//! `ft/cachetable/cachetable.cc`).
//!
//! Space rules: a block referenced by one of the last two durable checkpoints is never
//! overwritten; when its node is rewritten or deleted, the block waits in `pending_free` until
//! the next checkpoint commits and in `pending_older` for one more (so a damaged newest header
//! can fall back to the previous checkpoint intact). Blocks written and superseded between two checkpoints are reused at once. Free space
//! at the end of the file is cut off with `set_len`, so a steady overwrite workload reuses space
//! instead of growing the file.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use ftkv_vfs::VfsFile;

use super::codec::{
    align_up, decode_basement_partition, decode_buffer_partition, decode_internal_info, decode_leaf_pivots,
    decode_node, decode_node_index, decode_partition, decode_run_range, encode_btt, encode_header,
    encode_node, node_header_len, BlockLoc, BttImage, Header, InternalInfo, NodeIndex, PartEntry, DATA_START,
    HEADER_SLOT_BYTES, NODE_FIXED_HEADER_BYTES,
};
use super::msg::{Buffer, Msg, Msn};
use super::node::{child_index, Basement, Node, NodeId};
use crate::{EngineError, Result};

/// Write batches a dirty node must stay unmodified before the incremental writer takes it.
const IDLE_EPOCHS: u64 = 8;

/// CLOCK count given to a node when it is loaded or touched, and its maximum.
const CLOCK_MAX: u8 = 3;

struct Entry {
    node: Node,
    dirty: bool,
    /// CLOCK count; atomic so readers under a shared lock can mark use.
    clock: AtomicU8,
    bytes: usize,
    /// [`Store::write_epoch`] when the node was last put (modified).
    modified_epoch: u64,
}

/// Pieces of a leaf read without the rest of it (partial eviction's read side): its pivots and
/// some basements, valid while the BTT still points at `loc`.
struct PartialLeaf {
    loc: BlockLoc,
    index: NodeIndex,
    pivots: Vec<Vec<u8>>,
    basements: HashMap<usize, Basement>,
    bytes: usize,
}

/// Pieces of an internal node read without the rest of it: partition 0 (pivots, children,
/// per-child key filters) and the buffers point reads needed, valid while the BTT still points
/// at `loc`.
struct PartialInternal {
    loc: BlockLoc,
    index: NodeIndex,
    info: InternalInfo,
    buffers: HashMap<usize, Buffer>,
    bytes: usize,
}

/// The tree file, its BTT and the node cache.
pub struct Store {
    file: Arc<dyn VfsFile>,
    path: PathBuf,
    compression_level: Option<i32>,
    /// Current node map (durable entries plus blocks written since the last checkpoint).
    btt: HashMap<NodeId, BlockLoc>,
    /// Offsets of every block the last durable checkpoint references (nodes and its BTT block).
    durable_offsets: HashSet<u64>,
    /// Extents the durable checkpoint references but the current tree no longer does.
    pending_free: Vec<(u64, u64)>,
    /// Extents only the checkpoint before the durable one references: kept one more checkpoint
    /// so a damaged newest header can fall back to it.
    pending_older: Vec<(u64, u64)>,
    /// Free extents `offset -> length` below `end`, coalesced.
    free: BTreeMap<u64, u64>,
    /// End of the allocated area (the file is cut back to here at checkpoints).
    end: u64,
    durable_btt: Option<BlockLoc>,
    /// Counter of the last durable checkpoint.
    counter: u64,
    cache: HashMap<NodeId, Entry>,
    ring: Vec<NodeId>,
    ring_members: HashSet<NodeId>,
    hand: usize,
    cached_bytes: usize,
    budget_bytes: usize,
    /// Basements of uncached leaves read for point lookups (at most a quarter of the budget).
    partial: HashMap<NodeId, PartialLeaf>,
    /// Internal nodes read partially for point lookups (same quarter of the budget).
    partial_internal: HashMap<NodeId, PartialInternal>,
    partial_bytes: usize,
    /// Bytes of dirty cached nodes (written ahead of checkpoints to keep them short).
    dirty_bytes: usize,
    /// Partial reads done so far (see [`PartialReadStats`]).
    partial_stats: PartialReadStats,
    /// Count of [`Store::write_some_dirty`] calls (one per write batch): the clock by which the
    /// incremental writer tells recently modified nodes from idle ones.
    write_epoch: u64,
}

/// Counters of partial (one-partition) reads by point lookups.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PartialReadStats {
    /// Basements read from leaves that were not cached.
    pub basements: u64,
    /// Partition 0 (pivots, children, key filters) of internal nodes that were not cached.
    pub internal_infos: u64,
    /// Buffers of uncached internal nodes read because the key filter let the key through.
    pub internal_buffers: u64,
}

/// The data partition of a node that holds `key` (child or basement `i` is partition `i + 1`).
fn data_partition(
    index: &NodeIndex,
    pivots: &[Vec<u8>],
    key: &[u8],
    location: &str,
) -> Result<(usize, PartEntry)> {
    let i = child_index(pivots, key);
    let entry = index
        .parts
        .get(i + 1)
        .copied()
        .ok_or_else(|| EngineError::Corruption {
            location: location.to_string(),
            detail: format!("no partition for child {i}"),
        })?;
    Ok((i, entry))
}

fn bump(clock: &AtomicU8) {
    let c = clock.load(Ordering::Relaxed);
    if c < CLOCK_MAX {
        clock.store(c + 1, Ordering::Relaxed);
    }
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> EngineError {
    let context = context.into();
    move |source| EngineError::Io { context, source }
}

impl Store {
    /// A store over `file` whose durable state is `image` at `btt_loc` (`None` for a file that
    /// has no checkpoint yet).
    pub fn new(
        file: Arc<dyn VfsFile>,
        path: PathBuf,
        compression_level: Option<i32>,
        budget_bytes: usize,
        image: Option<(&BttImage, BlockLoc)>,
        previous: Option<(&BttImage, BlockLoc)>,
    ) -> Self {
        let mut s = Store {
            file,
            path,
            compression_level,
            btt: HashMap::new(),
            durable_offsets: HashSet::new(),
            pending_free: Vec::new(),
            pending_older: Vec::new(),
            free: BTreeMap::new(),
            end: DATA_START,
            durable_btt: None,
            counter: 0,
            cache: HashMap::new(),
            ring: Vec::new(),
            ring_members: HashSet::new(),
            hand: 0,
            cached_bytes: 0,
            budget_bytes,
            partial: HashMap::new(),
            partial_internal: HashMap::new(),
            partial_bytes: 0,
            dirty_bytes: 0,
            partial_stats: PartialReadStats::default(),
            write_epoch: 0,
        };
        if let Some((img, loc)) = image {
            s.counter = img.counter;
            s.btt = img.entries.iter().copied().collect();
            s.durable_btt = Some(loc);
            if let Some((prev, prev_loc)) = previous {
                let mut older: Vec<(u64, u64)> = prev
                    .entries
                    .iter()
                    .map(|(_, l)| (l.offset, l.alloc_bytes()))
                    .collect();
                older.push((prev_loc.offset, prev_loc.alloc_bytes()));
                let current: HashSet<u64> = img
                    .entries
                    .iter()
                    .map(|(_, l)| l.offset)
                    .chain(std::iter::once(loc.offset))
                    .collect();
                older.retain(|(o, _)| !current.contains(o));
                older.sort_unstable();
                older.dedup();
                s.pending_older = older;
            }
            s.rebuild_allocator();
        }
        s
    }

    /// Recomputes the free list and `end` from the BTT and the durable BTT block.
    fn rebuild_allocator(&mut self) {
        let mut used: Vec<(u64, u64)> = self.btt.values().map(|l| (l.offset, l.alloc_bytes())).collect();
        if let Some(b) = self.durable_btt {
            used.push((b.offset, b.alloc_bytes()));
        }
        self.durable_offsets = used.iter().map(|(o, _)| *o).collect();
        // Blocks of the previous checkpoint must not overlap the current one's; if a damaged
        // older image claims overlapping space, forget it rather than corrupt the allocator.
        let mut with_older = used.clone();
        with_older.extend(self.pending_older.iter().copied());
        with_older.sort_unstable();
        if with_older.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
            self.pending_older.clear();
        } else {
            used = with_older;
        }
        used.sort_unstable();
        self.free.clear();
        let mut cursor = DATA_START;
        for (off, len) in used {
            if off > cursor {
                self.free.insert(cursor, off - cursor);
            }
            cursor = cursor.max(off + len);
        }
        self.end = cursor;
    }

    /// Counter of the last durable checkpoint.
    pub fn counter(&self) -> u64 {
        self.counter
    }

    /// Path of the tree file (for error messages).
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Bytes of the tree file.
    pub fn file_len(&self) -> Result<u64> {
        self.file.len().map_err(io_err("tree file length"))
    }

    /// Node ids with a block in the current BTT.
    pub fn btt_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.btt.keys().copied()
    }

    /// Node ids in the cache.
    pub fn cached_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.cache.keys().copied()
    }

    /// Bytes of cached nodes.
    pub fn cached_bytes(&self) -> usize {
        self.cached_bytes
    }

    /// Partial reads done since open.
    pub fn partial_stats(&self) -> PartialReadStats {
        self.partial_stats
    }

    /// Cache budget in bytes.
    pub fn budget_bytes(&self) -> usize {
        self.budget_bytes
    }

    /// Checks that allocated blocks, pending blocks and free extents never overlap and lie in
    /// the block area; returns a description of the first violation.
    pub fn check_space(&self) -> std::result::Result<(), String> {
        let cached: usize = self.cache.values().map(|e| e.bytes).sum();
        let dirty: usize = self.cache.values().filter(|e| e.dirty).map(|e| e.bytes).sum();
        if (cached, dirty) != (self.cached_bytes, self.dirty_bytes) {
            return Err(format!(
                "cache counters (cached {}, dirty {}) != recomputed ({cached}, {dirty})",
                self.cached_bytes, self.dirty_bytes
            ));
        }
        let mut spans: Vec<(u64, u64, String)> = Vec::new();
        for (id, l) in &self.btt {
            spans.push((l.offset, l.alloc_bytes(), format!("node {id}")));
        }
        if let Some(b) = self.durable_btt {
            spans.push((b.offset, b.alloc_bytes(), "BTT".into()));
        }
        for (o, l) in &self.pending_free {
            spans.push((*o, *l, "pending-free".into()));
        }
        for (o, l) in &self.pending_older {
            spans.push((*o, *l, "previous-checkpoint".into()));
        }
        for (o, l) in &self.free {
            spans.push((*o, *l, "free".into()));
        }
        spans.sort_by_key(|s| s.0);
        let mut prev_end = DATA_START;
        let mut prev_name = "headers".to_string();
        for (o, l, name) in spans {
            if o < prev_end {
                return Err(format!("{name} at {o} overlaps {prev_name} ending at {prev_end}"));
            }
            if o + l > self.end {
                return Err(format!("{name} at {o}+{l} beyond allocated end {}", self.end));
            }
            prev_end = o + l;
            prev_name = name;
        }
        Ok(())
    }

    // --------------------------------------------------------------------------------------
    // Allocation
    // --------------------------------------------------------------------------------------

    fn alloc(&mut self, len: u64) -> u64 {
        let len = align_up(len.max(1));
        let found = self.free.iter().find(|(_, l)| **l >= len).map(|(o, l)| (*o, *l));
        if let Some((off, flen)) = found {
            self.free.remove(&off);
            if flen > len {
                self.free.insert(off + len, flen - len);
            }
            return off;
        }
        let off = self.end;
        self.end += len;
        off
    }

    fn free_extent(&mut self, mut off: u64, mut len: u64) {
        if len == 0 {
            return;
        }
        if let Some((&po, &pl)) = self.free.range(..off).next_back() {
            if po + pl == off {
                self.free.remove(&po);
                off = po;
                len += pl;
            }
        }
        if let Some(&nl) = self.free.get(&(off + len)) {
            self.free.remove(&(off + len));
            len += nl;
        }
        if off + len >= self.end {
            self.end = off;
        } else {
            self.free.insert(off, len);
        }
    }

    fn release(&mut self, loc: BlockLoc) {
        if self.durable_offsets.contains(&loc.offset) {
            self.pending_free.push((loc.offset, loc.alloc_bytes()));
        } else {
            self.free_extent(loc.offset, loc.alloc_bytes());
        }
    }

    // --------------------------------------------------------------------------------------
    // Block I/O
    // --------------------------------------------------------------------------------------

    fn location(&self, id: NodeId, loc: &BlockLoc) -> String {
        format!(
            "{} node {id} block @ offset {} ({} bytes)",
            self.path.display(),
            loc.offset,
            loc.size
        )
    }

    /// Reads and verifies node `id` from disk.
    pub fn read_node(&self, id: NodeId) -> Result<Node> {
        let loc = *self.btt.get(&id).ok_or_else(|| EngineError::Corruption {
            location: format!("{} BTT", self.path.display()),
            detail: format!("node {id} is referenced but has no block"),
        })?;
        let location = self.location(id, &loc);
        let mut buf = vec![0u8; loc.size as usize];
        self.file
            .read_exact_at(&mut buf, loc.offset)
            .map_err(|source| match source.kind() {
                std::io::ErrorKind::UnexpectedEof => EngineError::Corruption {
                    location: location.clone(),
                    detail: "block past end of file".into(),
                },
                _ => EngineError::Io {
                    context: format!("read {location}"),
                    source,
                },
            })?;
        let crc = crc32c::crc32c(&buf);
        if crc != loc.crc {
            return Err(EngineError::Corruption {
                location,
                detail: format!("crc32c mismatch (BTT {:#010x}, block {crc:#010x})", loc.crc),
            });
        }
        decode_node(&buf, id, &location)
    }

    /// Writes `node` to a fresh block (copy-on-write) and points the BTT at it.
    pub fn write_node(&mut self, id: NodeId, node: &Node) -> Result<()> {
        let enc = encode_node(id, node, self.compression_level)?;
        self.write_encoded(id, enc)
    }

    /// Writes an encoded node block to a fresh extent and points the BTT at it.
    fn write_encoded(&mut self, id: NodeId, enc: Vec<u8>) -> Result<()> {
        let size = u32::try_from(enc.len())
            .map_err(|_| EngineError::InvalidArgument(format!("node {id} encodes to {} bytes", enc.len())))?;
        let offset = self.alloc(enc.len() as u64);
        let loc = BlockLoc {
            offset,
            size,
            crc: crc32c::crc32c(&enc),
        };
        if let Err(source) = self.file.write_all_at(&enc, offset) {
            self.free_extent(offset, loc.alloc_bytes());
            return Err(EngineError::Io {
                context: format!("write node {id} @ {offset}"),
                source,
            });
        }
        if let Some(old) = self.btt.insert(id, loc) {
            self.release(old);
        }
        Ok(())
    }

    /// Writes spilled run `id` (an encoded run block, [`super::codec::encode_run`]) to a fresh
    /// extent and registers it in the BTT.
    pub fn write_run(&mut self, id: u64, enc: Vec<u8>) -> Result<()> {
        self.write_encoded(id, enc)
    }

    /// Compression level for new blocks.
    pub fn compression_level(&self) -> Option<i32> {
        self.compression_level
    }

    /// Reads and verifies spilled run `id`: its messages sorted by (key, MSN). Needs no cache,
    /// so readers under a shared lock can call it.
    pub fn read_run(&self, id: u64) -> Result<Vec<Msg>> {
        self.read_run_range(id, &[], None)
    }

    /// Reads and verifies spilled run `id`, materializing only the messages in `[lo, hi)`.
    fn read_run_range(&self, id: u64, lo: &[u8], hi: Option<&[u8]>) -> Result<Vec<Msg>> {
        let loc = *self.btt.get(&id).ok_or_else(|| EngineError::Corruption {
            location: format!("{} BTT", self.path.display()),
            detail: format!("run {id} is referenced but has no block"),
        })?;
        let location = format!(
            "{} run {id} block @ offset {} ({} bytes)",
            self.path.display(),
            loc.offset,
            loc.size
        );
        let buf = self.read_span(id, &loc, 0, u64::from(loc.size))?;
        let crc = crc32c::crc32c(&buf);
        if crc != loc.crc {
            return Err(EngineError::Corruption {
                location,
                detail: format!("crc32c mismatch (BTT {:#010x}, block {crc:#010x})", loc.crc),
            });
        }
        decode_run_range(&buf, id, &location, lo, hi)
    }

    /// Writes a node straight to disk without caching it (bulk load).
    pub fn write_uncached(&mut self, id: NodeId, node: &Node) -> Result<()> {
        self.write_node(id, node)
    }

    // --------------------------------------------------------------------------------------
    // Cache
    // --------------------------------------------------------------------------------------

    fn touch_ring(&mut self, id: NodeId) {
        if self.ring_members.insert(id) {
            self.ring.push(id);
        }
    }

    /// The node `id`, loaded from disk if not cached.
    pub fn get(&mut self, id: NodeId) -> Result<&Node> {
        if !self.cache.contains_key(&id) {
            let node = self.read_node(id)?;
            self.insert(id, node, false, 1);
        }
        match self.cache.get_mut(&id) {
            Some(e) => {
                bump(&e.clock);
                Ok(&e.node)
            }
            None => Err(EngineError::Corruption {
                location: format!("{} cache", self.path.display()),
                detail: format!("node {id} vanished from the cache"),
            }),
        }
    }

    /// Whether node `id` is in the cache.
    pub fn is_cached(&self, id: NodeId) -> bool {
        self.cache.contains_key(&id)
    }

    /// Value of `key` in uncached leaf `id` from already-read basements, with the basement's
    /// applied MSN; `None` when that basement has not been read (or the leaf moved).
    pub fn partial_value(&self, id: NodeId, key: &[u8]) -> Option<(Option<Vec<u8>>, Msn)> {
        let p = self.partial.get(&id)?;
        if self.btt.get(&id) != Some(&p.loc) {
            return None;
        }
        let b = p.basements.get(&child_index(&p.pivots, key))?;
        Some((b.get(key).map(<[u8]>::to_vec), b.max_msn))
    }

    fn read_span(&self, id: NodeId, loc: &BlockLoc, off: u64, len: u64) -> Result<Vec<u8>> {
        let location = self.location(id, loc);
        if off + len > u64::from(loc.size) {
            return Err(EngineError::Corruption {
                location,
                detail: format!("span {off}+{len} outside block"),
            });
        }
        let mut buf = vec![0u8; len as usize];
        self.file
            .read_exact_at(&mut buf, loc.offset + off)
            .map_err(|source| match source.kind() {
                std::io::ErrorKind::UnexpectedEof => EngineError::Corruption {
                    location: location.clone(),
                    detail: "block past end of file".into(),
                },
                _ => EngineError::Io {
                    context: format!("read {location}"),
                    source,
                },
            })?;
        Ok(buf)
    }

    fn read_partition(&self, id: NodeId, loc: &BlockLoc, e: &PartEntry, compressed: bool) -> Result<Vec<u8>> {
        let data = self.read_span(id, loc, u64::from(e.offset), u64::from(e.len))?;
        decode_partition(&data, e, compressed, &self.location(id, loc))
    }

    /// Reads the one basement of uncached leaf `id` that holds `key` (header, pivots and that
    /// partition only; each verified by its crc32c) and returns the key's value and the
    /// basement's applied MSN. The pieces are kept in a small side cache.
    pub fn read_partial_value(&mut self, id: NodeId, key: &[u8]) -> Result<(Option<Vec<u8>>, Msn)> {
        if let Some(v) = self.partial_value(id, key) {
            return Ok(v);
        }
        let loc = *self.btt.get(&id).ok_or_else(|| EngineError::Corruption {
            location: format!("{} BTT", self.path.display()),
            detail: format!("node {id} is referenced but has no block"),
        })?;
        let location = self.location(id, &loc);
        if self.partial.get(&id).is_none_or(|p| p.loc != loc) {
            if let Some(old) = self.partial.remove(&id) {
                self.partial_bytes -= old.bytes;
            }
            let index = self.read_index(id, &loc)?;
            if index.height != 0 || index.parts.len() < 2 {
                return Err(EngineError::Corruption {
                    location,
                    detail: "expected a leaf".into(),
                });
            }
            let p0 = index.parts[0];
            let raw = self.read_partition(id, &loc, &p0, index.compressed)?;
            let pivots = decode_leaf_pivots(&raw, index.parts.len() - 1, &location)?;
            let bytes = pivots.iter().map(|p| p.len() + 16).sum::<usize>() + index.parts.len() * 16;
            self.partial_bytes += bytes;
            self.partial.insert(
                id,
                PartialLeaf {
                    loc,
                    index,
                    pivots,
                    basements: HashMap::new(),
                    bytes,
                },
            );
        }
        let (bi, entry, compressed) = match self.partial.get(&id) {
            Some(p) => {
                let (bi, entry) = data_partition(&p.index, &p.pivots, key, &location)?;
                (bi, entry, p.index.compressed)
            }
            None => {
                return Err(EngineError::Corruption {
                    location,
                    detail: "partial leaf vanished".into(),
                })
            }
        };
        let raw = self.read_partition(id, &loc, &entry, compressed)?;
        let b = decode_basement_partition(&raw, &location)?;
        self.partial_stats.basements += 1;
        let result = (b.get(key).map(<[u8]>::to_vec), b.max_msn);
        let size = b.size_bytes();
        if let Some(p) = self.partial.get_mut(&id) {
            p.bytes += size;
            p.basements.insert(bi, b);
            self.partial_bytes += size;
        }
        self.trim_partial(id);
        Ok(result)
    }

    /// For a point read of `key` (hash `hash`) through internal node `id` without loading it
    /// whole: appends the messages for the key from the one buffer on its path (skipped when the
    /// stored key filter rules the key out) and returns the child to descend into. Reads the
    /// header, partition 0 and at most that one buffer partition, each verified by its crc32c.
    pub fn read_partial_internal(
        &mut self,
        id: NodeId,
        key: &[u8],
        hash: u64,
        out: &mut Vec<Msg>,
    ) -> Result<NodeId> {
        if let Some(c) = self.partial_internal_probe(id, key, hash, out)? {
            return Ok(c);
        }
        let loc = *self.btt.get(&id).ok_or_else(|| EngineError::Corruption {
            location: format!("{} BTT", self.path.display()),
            detail: format!("node {id} is referenced but has no block"),
        })?;
        let location = self.location(id, &loc);
        if self.partial_internal.get(&id).is_none_or(|p| p.loc != loc) {
            if let Some(old) = self.partial_internal.remove(&id) {
                self.partial_bytes -= old.bytes;
            }
            let index = self.read_index(id, &loc)?;
            if index.height == 0 || index.parts.len() < 2 {
                return Err(EngineError::Corruption {
                    location,
                    detail: "expected an internal node".into(),
                });
            }
            let p0 = index.parts[0];
            let raw = self.read_partition(id, &loc, &p0, index.compressed)?;
            let info = decode_internal_info(&raw, index.parts.len() - 1, &location)?;
            self.partial_stats.internal_infos += 1;
            let bytes = raw.len() + index.parts.len() * 16 + 64;
            self.partial_bytes += bytes;
            self.partial_internal.insert(
                id,
                PartialInternal {
                    loc,
                    index,
                    info,
                    buffers: HashMap::new(),
                    bytes,
                },
            );
        }
        if let Some(c) = self.partial_internal_probe(id, key, hash, out)? {
            return Ok(c);
        }
        // The filter says the key may be in the buffer, and it has not been read yet.
        let (i, entry, compressed) = match self.partial_internal.get(&id) {
            Some(p) => {
                let (i, entry) = data_partition(&p.index, &p.info.pivots, key, &location)?;
                (i, entry, p.index.compressed)
            }
            None => {
                return Err(EngineError::Corruption {
                    location,
                    detail: "partial node vanished".into(),
                })
            }
        };
        let raw = self.read_partition(id, &loc, &entry, compressed)?;
        let buffer = decode_buffer_partition(&raw, &location)?;
        self.partial_stats.internal_buffers += 1;
        let size = buffer.bytes() + 64;
        if let Some(p) = self.partial_internal.get_mut(&id) {
            p.bytes += size;
            p.buffers.insert(i, buffer);
            self.partial_bytes += size;
        }
        let child = self.partial_internal_probe(id, key, hash, out)?;
        self.trim_partial(id);
        child.ok_or_else(|| EngineError::Corruption {
            location,
            detail: "partial node lost its buffer".into(),
        })
    }

    /// [`Store::read_partial_internal`] from pieces already read (spilled runs that may hold
    /// the key are read from the file); `None` when a piece is missing.
    pub fn partial_internal_probe(
        &self,
        id: NodeId,
        key: &[u8],
        hash: u64,
        out: &mut Vec<Msg>,
    ) -> Result<Option<NodeId>> {
        let Some(p) = self.partial_internal.get(&id) else {
            return Ok(None);
        };
        if self.btt.get(&id) != Some(&p.loc) {
            return Ok(None);
        }
        let i = child_index(&p.info.pivots, key);
        let (Some(&child), Some(f)) = (p.info.children.get(i), p.info.filters.get(i)) else {
            return Ok(None);
        };
        let need_buffer = f.has_ranges || f.keys.may_contain(hash);
        if need_buffer && !p.buffers.contains_key(&i) {
            return Ok(None);
        }
        for r in f.runs.iter().filter(|r| r.may_hold(key, hash)) {
            self.run_msgs_for_key(r.id, key, out)?;
        }
        if let Some(b) = p.buffers.get(&i).filter(|_| need_buffer) {
            b.collect_for_key(key, hash, out);
        }
        Ok(Some(child))
    }

    /// Appends the messages for `key` in spilled run `id` (in MSN order).
    pub fn run_msgs_for_key(&self, id: u64, key: &[u8], out: &mut Vec<Msg>) -> Result<()> {
        let mut next = key.to_vec();
        next.push(0);
        out.extend(self.read_run_range(id, key, Some(&next))?);
        Ok(())
    }

    /// Appends the messages of spilled run `id` with keys in `[lo, hi)`.
    pub fn run_msgs_for_range(
        &self,
        id: u64,
        lo: &[u8],
        hi: Option<&[u8]>,
        out: &mut Vec<Msg>,
    ) -> Result<()> {
        out.extend(self.read_run_range(id, lo, hi)?);
        Ok(())
    }

    /// Reads and decodes the header (partition table) of node `id`'s block at `loc`.
    fn read_index(&self, id: NodeId, loc: &BlockLoc) -> Result<NodeIndex> {
        let location = self.location(id, loc);
        let fixed = self.read_span(id, loc, 0, NODE_FIXED_HEADER_BYTES as u64)?;
        let header_len = node_header_len(&fixed, &location)?;
        let header = self.read_span(id, loc, 0, header_len as u64)?;
        decode_node_index(&header, id, &location)
    }

    /// Keeps the partial-read side cache under a quarter of the budget.
    fn trim_partial(&mut self, keep: NodeId) {
        let cap = self.budget_bytes / 4;
        while self.partial_bytes > cap {
            // Leaf pieces go first (one basement per lookup); internal pieces serve many.
            if let Some(victim) = self.partial.keys().copied().find(|k| *k != keep) {
                if let Some(p) = self.partial.remove(&victim) {
                    self.partial_bytes -= p.bytes;
                }
                continue;
            }
            let Some(victim) = self.partial_internal.keys().copied().find(|k| *k != keep) else {
                break;
            };
            if let Some(p) = self.partial_internal.remove(&victim) {
                self.partial_bytes -= p.bytes;
            }
        }
    }

    /// The cached node `id` without loading (readers under a shared lock); `None` on a miss.
    pub fn peek(&self, id: NodeId) -> Option<&Node> {
        self.cache.get(&id).map(|e| {
            bump(&e.clock);
            &e.node
        })
    }

    /// Removes a cache entry, keeping the byte counters exact.
    fn remove_entry(&mut self, id: NodeId) -> Option<Entry> {
        let e = self.cache.remove(&id)?;
        self.cached_bytes -= e.bytes;
        if e.dirty {
            self.dirty_bytes -= e.bytes;
        }
        Some(e)
    }

    fn insert(&mut self, id: NodeId, node: Node, dirty: bool, clock: u8) {
        self.remove_entry(id);
        let bytes = node.size_bytes();
        self.cached_bytes += bytes;
        if dirty {
            self.dirty_bytes += bytes;
        }
        if let Some(old) = self.cache.insert(
            id,
            Entry {
                node,
                dirty,
                clock: AtomicU8::new(clock),
                bytes,
                modified_epoch: self.write_epoch,
            },
        ) {
            self.cached_bytes -= old.bytes;
        }
        self.touch_ring(id);
    }

    /// Removes node `id` from the cache (loading it if needed) for modification; returns it and
    /// whether it was dirty. Put it back with [`Store::put`].
    pub fn take(&mut self, id: NodeId) -> Result<Node> {
        match self.remove_entry(id) {
            Some(e) => Ok(e.node),
            None => self.read_node(id),
        }
    }

    /// Puts a (modified) node into the cache as dirty. Internal nodes (touched by every flush
    /// through them) start at the highest CLOCK count, leaves at one: under pressure leaves go
    /// first.
    pub fn put(&mut self, id: NodeId, node: Node) {
        let clock = if node.height() > 0 { CLOCK_MAX } else { 1 };
        self.insert(id, node, true, clock);
    }

    /// Whether the cache is under pressure (over three quarters of its budget).
    pub fn under_pressure(&self) -> bool {
        self.cached_bytes > self.budget_bytes / 4 * 3
    }

    /// Forgets node `id` (merged away): drops it from the cache and frees its block.
    pub fn delete(&mut self, id: NodeId) {
        if let Some(p) = self.partial.remove(&id) {
            self.partial_bytes -= p.bytes;
        }
        if let Some(p) = self.partial_internal.remove(&id) {
            self.partial_bytes -= p.bytes;
        }
        self.remove_entry(id);
        if let Some(loc) = self.btt.remove(&id) {
            self.release(loc);
        }
    }

    /// Forgets every node (cache and BTT); blocks are released. Used when a bulk load replaces
    /// the whole tree.
    pub fn forget_all(&mut self) {
        self.partial.clear();
        self.partial_internal.clear();
        self.partial_bytes = 0;
        self.cache.clear();
        self.ring.clear();
        self.ring_members.clear();
        self.hand = 0;
        self.cached_bytes = 0;
        self.dirty_bytes = 0;
        let locs: Vec<BlockLoc> = self.btt.drain().map(|(_, l)| l).collect();
        for l in locs {
            self.release(l);
        }
    }

    /// Evicts clean nodes (writing dirty ones first, copy-on-write) with CLOCK until the cache
    /// fits its budget. `pinned` (the root) is never evicted.
    pub fn evict_to_budget(&mut self, pinned: NodeId) -> Result<()> {
        let mut steps = 0usize;
        let budget = self.budget_bytes.saturating_sub(self.partial_bytes);
        while self.cached_bytes > budget && self.cache.len() > 1 && !self.ring.is_empty() {
            steps += 1;
            if steps > 8 * (self.ring.len() + 8) {
                break;
            }
            if self.hand >= self.ring.len() {
                self.hand = 0;
            }
            let id = self.ring[self.hand];
            let Some(e) = self.cache.get_mut(&id) else {
                self.ring.swap_remove(self.hand);
                self.ring_members.remove(&id);
                continue;
            };
            if id == pinned {
                self.hand += 1;
                continue;
            }
            let c = e.clock.get_mut();
            if *c > 0 {
                *c -= 1;
                self.hand += 1;
                continue;
            }
            if e.dirty {
                let enc = encode_node(id, &e.node, self.compression_level)?;
                self.write_encoded(id, enc)?;
            }
            self.remove_entry(id);
            self.ring.swap_remove(self.hand);
            self.ring_members.remove(&id);
        }
        Ok(())
    }

    /// Writes node `id` if it is cached and dirty (copy-on-write), then drops it from the cache.
    pub fn write_and_evict(&mut self, id: NodeId) -> Result<()> {
        if let Some(e) = self.cache.get(&id) {
            if e.dirty {
                let enc = encode_node(id, &e.node, self.compression_level)?;
                self.write_encoded(id, enc)?;
            }
            self.remove_entry(id);
            // The CLOCK ring drops ids without a cache entry when its hand reaches them.
        }
        Ok(())
    }

    /// Writes every dirty cached node (copy-on-write) and marks it clean.
    pub fn write_dirty(&mut self) -> Result<()> {
        let mut dirty: Vec<NodeId> = self
            .cache
            .iter()
            .filter(|(_, e)| e.dirty)
            .map(|(id, _)| *id)
            .collect();
        dirty.sort_unstable();
        for id in dirty {
            let Some(e) = self.cache.get(&id) else { continue };
            let enc = encode_node(id, &e.node, self.compression_level)?;
            self.write_encoded(id, enc)?;
            self.mark_clean(id);
        }
        Ok(())
    }

    fn mark_clean(&mut self, id: NodeId) {
        if let Some(e) = self.cache.get_mut(&id) {
            if e.dirty {
                e.dirty = false;
                self.dirty_bytes -= e.bytes;
            }
        }
    }

    /// Bytes of dirty cached nodes.
    pub fn dirty_bytes(&self) -> usize {
        self.dirty_bytes
    }

    /// Incremental checkpointing: when dirty nodes exceed `limit_bytes`, writes those left
    /// unmodified for the longest (at least [`IDLE_EPOCHS`] write batches; copy-on-write; they
    /// stay cached, now clean) until half the limit is left, so a checkpoint only has a bounded
    /// amount left to write. Nodes modified in the last few batches (the root and the internal
    /// nodes taking flushes) are left for eviction or the checkpoint: writing them now would be
    /// undone by the next flush. `pinned` (the root) is never written here.
    pub fn write_some_dirty(&mut self, limit_bytes: usize, pinned: NodeId) -> Result<()> {
        self.write_epoch += 1;
        if self.dirty_bytes <= limit_bytes {
            return Ok(());
        }
        let idle_before = self.write_epoch.saturating_sub(IDLE_EPOCHS);
        let mut dirty: Vec<(u64, u8, NodeId)> = self
            .cache
            .iter()
            .filter(|(id, e)| e.dirty && **id != pinned && e.modified_epoch <= idle_before)
            .map(|(id, e)| (e.modified_epoch, e.clock.load(Ordering::Relaxed), *id))
            .collect();
        dirty.sort_unstable();
        for (_, _, id) in dirty {
            if self.dirty_bytes <= limit_bytes / 2 {
                break;
            }
            let Some(e) = self.cache.get(&id) else { continue };
            let enc = encode_node(id, &e.node, self.compression_level)?;
            self.write_encoded(id, enc)?;
            self.mark_clean(id);
        }
        Ok(())
    }

    /// Commits a checkpoint: writes the BTT block (with `root`, counters and `meta`), syncs,
    /// writes the alternate header, syncs. Only then are blocks of the previous checkpoint freed.
    /// Every dirty node must have been written first ([`Store::write_dirty`]).
    pub fn commit(
        &mut self,
        root: NodeId,
        next_msn: Msn,
        next_node_id: NodeId,
        meta: Option<Vec<u8>>,
    ) -> Result<()> {
        let counter = self.counter + 1;
        let mut entries: Vec<(NodeId, BlockLoc)> = self.btt.iter().map(|(k, v)| (*k, *v)).collect();
        entries.sort_unstable_by_key(|e| e.0);
        let img = BttImage {
            counter,
            root,
            next_msn,
            next_node_id,
            meta,
            entries,
        };
        let enc = encode_btt(&img);
        let size = u32::try_from(enc.len())
            .map_err(|_| EngineError::InvalidArgument(format!("BTT encodes to {} bytes", enc.len())))?;
        let offset = self.alloc(enc.len() as u64);
        let loc = BlockLoc {
            offset,
            size,
            crc: crc32c::crc32c(&enc),
        };
        self.file
            .write_all_at(&enc, offset)
            .map_err(io_err("write BTT"))?;
        self.file
            .sync_data()
            .map_err(io_err("sync tree file before header"))?;
        let header = encode_header(&Header { counter, btt: loc });
        let slot = (counter % 2) * HEADER_SLOT_BYTES;
        self.file
            .write_all_at(&header, slot)
            .map_err(io_err("write header"))?;
        self.file.sync_data().map_err(io_err("sync header"))?;
        // Durable. Release what only the previous checkpoint referenced.
        self.counter = counter;
        for (o, l) in std::mem::take(&mut self.pending_older) {
            self.free_extent(o, l);
        }
        self.pending_older = std::mem::take(&mut self.pending_free);
        if let Some(old) = self.durable_btt.replace(loc) {
            self.pending_older.push((old.offset, old.alloc_bytes()));
        }
        self.durable_offsets = self.btt.values().map(|l| l.offset).collect();
        self.durable_offsets.insert(loc.offset);
        let file_len = self.file_len()?;
        if file_len > self.end {
            self.file
                .set_len(self.end)
                .map_err(io_err("truncate tree file"))?;
        }
        Ok(())
    }
}
