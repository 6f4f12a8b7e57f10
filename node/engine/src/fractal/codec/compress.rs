//! zstd contexts per thread, the block buffer pool, and the transient compression level.

use super::*;
pub(crate) use crate::fractal::limits::{BLOCK_BUFS_KEPT, BLOCK_BUF_MAX_BYTES};

thread_local! {
    /// This thread's zstd compression contexts by level (creating one per call cost more than
    /// compressing a small partition). Leaves and transient blocks use two levels, so a thread
    /// keeps a few contexts instead of rebuilding one (about a megabyte) at every switch.
    static COMPRESSORS: RefCell<Vec<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(Vec::new()) };
    /// This thread's zstd decompression context (creating one per frame was 16% of a point
    /// read beyond memory).
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

thread_local! {
    /// Block-sized buffers this thread reuses (encoded node and run blocks, whole blocks read).
    /// Freeing megabyte buffers at the rate the engine rewrites nodes kept about as much freed
    /// memory resident in the allocator (mimalloc purges after a delay) as the cache itself.
    static BLOCK_BUFS: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// An empty buffer with room for `capacity` bytes, reused from this thread's pool when it
/// holds one.
pub(crate) fn take_block_buf(capacity: usize) -> Vec<u8> {
    let mut v = BLOCK_BUFS.with(|c| c.borrow_mut().pop()).unwrap_or_default();
    v.clear();
    v.reserve(capacity);
    v
}

/// Gives a block buffer back to this thread's pool (kept unless the pool is full or the
/// buffer is huge).
pub(crate) fn recycle_block_buf(mut v: Vec<u8>) {
    if v.capacity() > BLOCK_BUF_MAX_BYTES {
        return;
    }
    v.clear();
    BLOCK_BUFS.with(|c| {
        let mut pool = c.borrow_mut();
        if pool.len() < BLOCK_BUFS_KEPT {
            pool.push(v);
        }
    });
}

/// zstd-compresses `raw` at `level` with this thread's context.
pub(crate) fn zstd_compress(raw: &[u8], level: i32) -> std::io::Result<Vec<u8>> {
    /// Contexts kept per thread (levels in use: the configured one and the transient one).
    const KEPT: usize = 4;
    COMPRESSORS.with(|cell| {
        let mut ctxs = cell.borrow_mut();
        let i = match ctxs.iter().position(|(l, _)| *l == level) {
            Some(i) => i,
            None => {
                if ctxs.len() >= KEPT {
                    ctxs.remove(0);
                }
                ctxs.push((level, zstd::bulk::Compressor::new(level)?));
                ctxs.len() - 1
            }
        };
        match ctxs.get_mut(i) {
            Some((_, ctx)) => ctx.compress(raw),
            None => Err(std::io::Error::other("zstd context vanished")),
        }
    })
}

/// zstd-decompresses `data` into exactly `raw_len` bytes (an error if it holds more) with this
/// thread's context.
pub(crate) fn zstd_decompress(data: &[u8], raw_len: usize) -> std::io::Result<Vec<u8>> {
    DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let ctx = match &mut *slot {
            Some(ctx) => ctx,
            other => other.insert(zstd::bulk::Decompressor::new()?),
        };
        ctx.decompress(data, raw_len)
    })
}

pub(crate) fn compress(raw: Vec<u8>, level: Option<i32>) -> Result<Vec<u8>> {
    match level {
        None => Ok(raw),
        Some(l) => zstd_compress(&raw, l).map_err(|source| EngineError::Io {
            context: "zstd compress".into(),
            source,
        }),
    }
}

/// zstd's fastest levels skip Huffman coding of literals and match less: about twice the speed
/// of level 1 for a few percent of size. Used for blocks that are rewritten soon.
pub(crate) const TRANSIENT_LEVEL_MAX: i32 = -1;

/// The level for transient blocks (spilled runs and internal nodes, whose buffers are rewritten
/// by every flush through them): the configured level, but no slower than
/// [`TRANSIENT_LEVEL_MAX`]. Leaves, where the data rests, keep the configured level (RocksDB's
/// per-level compression, `compression_per_level` and `bottommost_compression`, follows the same
/// idea). `None` (no compression) stays `None`.
pub(crate) fn transient_level(level: Option<i32>) -> Option<i32> {
    level.map(|l| l.min(TRANSIENT_LEVEL_MAX))
}
