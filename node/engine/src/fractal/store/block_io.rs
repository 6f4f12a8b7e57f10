//! Block I/O: reading, writing and releasing node blocks, read spans and partitions.

use super::*;

/// A block named in error messages (`<file> node 7 block @ offset 8192 (4096 bytes)`), formatted
/// only when an error is built: a point read beyond memory names two or three blocks and
/// formatting the names was 3% of its CPU time.
#[derive(Clone)]
pub(crate) struct BlockName {
    pub(crate) path: Arc<Path>,
    /// `node` or `run`.
    pub(crate) kind: &'static str,
    pub(crate) id: u64,
    pub(crate) loc: BlockLoc,
}

impl std::fmt::Display for BlockName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} {} block @ offset {} ({} bytes)",
            self.path.display(),
            self.kind,
            self.id,
            self.loc.offset,
            self.loc.size
        )
    }
}

pub(crate) fn read_at(
    file: &dyn VfsFile,
    offset: u64,
    len: u64,
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<Vec<u8>> {
    let mut buf = take_block_buf(len as usize);
    buf.resize(len as usize, 0);
    file.read_exact_at(&mut buf, offset)
        .map_err(|source| match source.kind() {
            std::io::ErrorKind::UnexpectedEof => EngineError::Corruption {
                location: location.to_string(),
                detail: "block past end of file".into(),
            },
            _ => EngineError::Io {
                context: format!("read {location}"),
                source,
            },
        })?;
    Ok(buf)
}

pub(crate) fn bump(clock: &AtomicU8) {
    let c = clock.load(Ordering::Relaxed);
    if c < CLOCK_MAX {
        clock.store(c + 1, Ordering::Relaxed);
    }
}

pub(crate) fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> EngineError {
    let context = context.into();
    move |source| EngineError::Io { context, source }
}

impl Store {
    pub(crate) fn release(&mut self, loc: BlockLoc) {
        self.space.lock().release(loc.offset, loc.alloc_bytes());
    }

    // --------------------------------------------------------------------------------------
    // Block I/O
    // --------------------------------------------------------------------------------------

    pub(crate) fn location(&self, id: NodeId, loc: &BlockLoc) -> BlockName {
        BlockName {
            path: self.name_path.clone(),
            kind: "node",
            id,
            loc: *loc,
        }
    }

    /// Reads and verifies node `id` from disk.
    pub(crate) fn read_node(&self, id: NodeId) -> Result<Node> {
        self.detached(id)?.read_node()
    }

    /// Block `id` as the BTT has it now, to read later without the store (a background job:
    /// the caller keeps the block in the tree until the job ends).
    ///
    /// Errors: `Corruption` when `id` has no BTT entry.
    pub(crate) fn detached(&self, id: u64) -> Result<DetachedBlock> {
        if let Some(msgs) = self.pending_runs.get(&id) {
            return Ok(DetachedBlock {
                file: Arc::clone(&self.file),
                path: self.path.clone(),
                id,
                loc: BlockLoc::default(),
                pending: Some(Arc::clone(msgs)),
            });
        }
        let loc = *self.btt.get(&id).ok_or_else(|| EngineError::Corruption {
            location: format!("{} BTT", self.path.display()),
            detail: format!("block {id} is referenced but has no BTT entry"),
        })?;
        Ok(DetachedBlock {
            file: Arc::clone(&self.file),
            path: self.path.clone(),
            id,
            loc,
            pending: None,
        })
    }

    /// Writes `node` to a fresh block (copy-on-write) and points the BTT at it.
    pub(crate) fn write_node(&mut self, id: NodeId, node: &Node) -> Result<()> {
        let enc = encode_node(id, node, self.compression_level)?;
        self.write_encoded(id, enc)
    }

    /// Writes an encoded node block to a fresh extent and points the BTT at it.
    pub(crate) fn write_encoded(&mut self, id: NodeId, enc: Vec<u8>) -> Result<()> {
        let size = len_u32(enc.len(), &format!("node {id} block"))?;
        let offset = self.space.lock().alloc(enc.len() as u64);
        let loc = BlockLoc {
            offset,
            size,
            crc: crc32c::crc32c(&enc),
        };
        if let Err(source) = self.file.write_all_at(&enc, offset) {
            self.space.lock().unalloc(offset, loc.alloc_bytes());
            return Err(block_write_error(
                format!("write node {id} @ {offset} of {}", self.path.display()),
                source,
            ));
        }
        self.space_regained();
        self.block_bytes.count(&enc);
        let sk = if enc.starts_with(NODE_MAGIC) {
            leaf_skeleton(&enc, id)
        } else {
            None
        };
        recycle_block_buf(enc);
        if let Some(old) = self.btt.insert(id, loc) {
            self.release(old);
        }
        self.keep_skeleton(id, loc, sk);
        Ok(())
    }

    /// Writes a node straight to disk without caching it (bulk load).
    pub(crate) fn write_uncached(&mut self, id: NodeId, node: &Node) -> Result<()> {
        self.write_node(id, node)
    }

    // --------------------------------------------------------------------------------------
    // Cache
    // --------------------------------------------------------------------------------------

    pub(crate) fn read_span(&self, id: NodeId, loc: &BlockLoc, off: u64, len: u64) -> Result<Vec<u8>> {
        let location = self.location(id, loc);
        if off + len > u64::from(loc.size) {
            return Err(EngineError::Corruption {
                location: location.to_string(),
                detail: format!("span {off}+{len} outside block"),
            });
        }
        read_at(&*self.file, loc.offset + off, len, &location)
    }

    pub(crate) fn read_partition(
        &self,
        id: NodeId,
        loc: &BlockLoc,
        e: &PartEntry,
        compressed: bool,
    ) -> Result<Vec<u8>> {
        let data = self.read_span(id, loc, u64::from(e.offset), u64::from(e.len))?;
        decode_partition(&data, e, compressed, &self.location(id, loc))
    }

    /// Reads and decodes the header (partition table) of node `id`'s block at `loc`.
    pub(crate) fn read_index(&self, id: NodeId, loc: &BlockLoc) -> Result<NodeIndex> {
        let location = self.location(id, loc);
        let fixed = self.read_span(id, loc, 0, NODE_FIXED_HEADER_BYTES as u64)?;
        let header_len = node_header_len(&fixed, &location)?;
        let header = self.read_span(id, loc, 0, header_len as u64)?;
        decode_node_index(&header, id, &location)
    }
}

/// Who a fresh block written beside the writer is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BlockClaim {
    /// A writeback job: the space is given back when the write fails.
    Writeback,
    /// The checkpoint in progress claims the space (an aborted checkpoint releases it).
    Checkpoint,
}

/// The one block writer of writeback and checkpoint jobs: allocates room for `enc` in `space`
/// as `claim` says, writes it to `file` (at `path`, for errors) and returns its location with
/// its crc32c. `what` names the block in errors. Errors: `InvalidArgument` for a block over
/// 4 GiB, `Io` for a failed write.
pub(crate) fn write_fresh_block(
    file: &dyn VfsFile,
    path: &Path,
    space: &Mutex<Space>,
    block_bytes: &BlockBytes,
    claim: BlockClaim,
    enc: &[u8],
    what: impl Fn() -> String,
) -> Result<BlockLoc> {
    let size = len_u32(enc.len(), &format!("{} block", what()))?;
    let len = enc.len() as u64;
    let offset = match claim {
        BlockClaim::Writeback => space.lock().alloc(len),
        BlockClaim::Checkpoint => space.lock().alloc_for_checkpoint(len),
    };
    if let Err(source) = file.write_all_at(enc, offset) {
        // Nothing refers to the block (a checkpoint's claim on it goes too).
        space.lock().unalloc(offset, len);
        return Err(block_write_error(
            format!("write {} @ {offset} of {}", what(), path.display()),
            source,
        ));
    }
    block_bytes.count(enc);
    Ok(BlockLoc {
        offset,
        size,
        crc: crc32c::crc32c(enc),
    })
}
