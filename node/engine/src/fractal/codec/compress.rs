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

/// The most raw bytes one stored zstd byte can stand for (128 KiB blocks of at least 4 bytes).
pub(crate) const MAX_ZSTD_EXPANSION: usize = 32 << 10;

/// zstd-decompresses `data` into exactly `raw_len` bytes (an error if it holds more) with this
/// thread's context.
///
/// `raw_len` comes from a block and is checked before anything is allocated for it: a zstd block
/// yields at most 128 KiB and takes at least 4 stored bytes (an RLE block), so no frame expands
/// more than [`MAX_ZSTD_EXPANSION`] times, and the frame's own content size (always written by
/// [`zstd_compress`]) must equal it. A damaged length is an error, never a huge allocation.
pub(crate) fn zstd_decompress(data: &[u8], raw_len: usize) -> std::io::Result<Vec<u8>> {
    let invalid = |msg: String| std::io::Error::new(std::io::ErrorKind::InvalidData, msg);
    if raw_len > data.len().saturating_mul(MAX_ZSTD_EXPANSION) {
        return Err(invalid(format!(
            "{raw_len} raw bytes cannot come from {} zstd bytes",
            data.len()
        )));
    }
    match zstd::zstd_safe::get_frame_content_size(data) {
        Ok(Some(declared)) if declared == raw_len as u64 => {}
        Ok(Some(declared)) => {
            return Err(invalid(format!(
                "the zstd frame holds {declared} bytes, the block says {raw_len}"
            )))
        }
        Ok(None) => return Err(invalid("the zstd frame does not declare its size".into())),
        Err(_) => return Err(invalid("not a zstd frame".into())),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raw_length_the_frame_does_not_declare_is_refused_before_allocating() {
        let raw = vec![7u8; 10_000];
        let stored = zstd_compress(&raw, 1).unwrap();
        assert_eq!(zstd_decompress(&stored, raw.len()).unwrap(), raw);
        // A damaged length behind a valid checksum: before, a 4 GiB buffer was reserved and the
        // call returned the 10,000 bytes as if they were right.
        for wrong in [u32::MAX as usize, raw.len() + 1, raw.len() - 1] {
            let err = zstd_decompress(&stored, wrong).unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{wrong}: {err}");
        }
        assert!(zstd_decompress(b"not zstd at all", 3).is_err());
        assert!(zstd_decompress(&[], 0).is_err());
    }
}
