//! Spill files of a bulk load's sort: sorted runs of rows written through the engine's
//! [`Vfs`] into `bulk-tmp/` of the engine directory, read back once or twice by the merge, and
//! removed when the load ends (and at open, after a crash).
//!
//! Format (FORMAT.md, "Bulk-load spill files"; fixed-width little-endian integers):
//! - file header, 16 bytes: magic `FTKVSORT`, version `u32` (1), reserved `u32` (0);
//! - blocks: `payload_len u32`, `rows u32`, `payload_crc32c u32`, `header_crc32c u32` (of the
//!   first 12 bytes), then the payload: per row `index u64`, `key_len u32`, `value_len u32`,
//!   key, value.
//!
//! The writer keeps the number of rows and bytes it wrote; the reader checks both at the end,
//! so a truncated file is an error, never a shorter run.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ftkv_vfs::{Vfs, VfsFile};

use crate::bulk::Row;
use crate::fractal::engine::io;
use crate::fractal::limits::len_u32;
use crate::{EngineError, Result};

/// Subdirectory of the engine directory holding spill files.
pub(crate) const BULK_TMP_DIR: &str = "bulk-tmp";
pub(crate) const SPILL_MAGIC: &[u8; 8] = b"FTKVSORT";
pub(crate) const SPILL_VERSION: u32 = 1;
pub(crate) const FILE_HEADER_BYTES: usize = 16;
pub(crate) const BLOCK_HEADER_BYTES: usize = 16;
/// A block is cut once its payload reaches this size.
pub(crate) const BLOCK_TARGET_BYTES: usize = 64 << 10;
/// Fixed bytes per row in a block (index, key length, value length).
pub(crate) const ROW_HEADER_BYTES: usize = 16;

/// Distinguishes spill files of successive loads of this process.
static NEXT_FILE: AtomicU64 = AtomicU64::new(1);

fn no_space_or_io(context: String) -> impl FnOnce(std::io::Error) -> EngineError {
    move |source| {
        if crate::is_no_space_io(&source) {
            EngineError::NoSpace { context, source }
        } else {
            EngineError::Io { context, source }
        }
    }
}

/// The spill files of one load; dropping it removes them (success or error alike).
pub(crate) struct TmpFiles {
    vfs: Arc<dyn Vfs>,
    dir: PathBuf,
    files: Vec<PathBuf>,
}

impl TmpFiles {
    pub(crate) fn new(vfs: Arc<dyn Vfs>, engine_dir: &Path) -> Self {
        TmpFiles {
            vfs,
            dir: engine_dir.join(BULK_TMP_DIR),
            files: Vec::new(),
        }
    }

    /// Creates a new empty spill file.
    pub(crate) fn create(&mut self) -> Result<RunWriter> {
        if self.files.is_empty() {
            self.vfs
                .create_dir_all(&self.dir)
                .map_err(io(format!("create {}", self.dir.display())))?;
        }
        let n = NEXT_FILE.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!("run-{}-{n}.sort", std::process::id()));
        let file = self
            .vfs
            .open(&path, true)
            .map_err(no_space_or_io(format!("create {}", path.display())))?;
        self.files.push(path.clone());
        RunWriter::new(file, path)
    }

    /// Removes every file of this load.
    pub(crate) fn remove_all(&mut self) {
        for p in self.files.drain(..) {
            // Best effort: whatever stays behind is removed at the next open.
            let _ = self.vfs.remove_file(&p);
        }
    }
}

impl Drop for TmpFiles {
    fn drop(&mut self) {
        self.remove_all();
    }
}

/// Removes spill files a crashed load left in `engine_dir/bulk-tmp/`.
pub(crate) fn remove_leftovers(vfs: &dyn Vfs, engine_dir: &Path) -> Result<()> {
    let dir = engine_dir.join(BULK_TMP_DIR);
    if !vfs.exists(&dir) {
        return Ok(());
    }
    for p in vfs
        .list_dir(&dir)
        .map_err(io(format!("list {}", dir.display())))?
    {
        vfs.remove_file(&p)
            .map_err(io(format!("remove leftover {}", p.display())))?;
    }
    Ok(())
}

/// A written run: where to read it back and what the reader must find.
#[derive(Debug, Clone)]
pub(crate) struct Run {
    pub(crate) file: Arc<dyn VfsFile>,
    pub(crate) path: PathBuf,
    pub(crate) len: u64,
    pub(crate) rows: u64,
}

/// Appends rows to a spill file, block by block.
pub(crate) struct RunWriter {
    run: Run,
    block: Vec<u8>,
    block_rows: u32,
}

impl RunWriter {
    fn new(file: Arc<dyn VfsFile>, path: PathBuf) -> Result<Self> {
        let mut header = Vec::with_capacity(FILE_HEADER_BYTES);
        header.extend_from_slice(SPILL_MAGIC);
        header.extend_from_slice(&SPILL_VERSION.to_le_bytes());
        header.extend_from_slice(&0u32.to_le_bytes());
        file.write_all_at(&header, 0)
            .map_err(no_space_or_io(format!("write {}", path.display())))?;
        Ok(RunWriter {
            run: Run {
                file,
                path,
                len: FILE_HEADER_BYTES as u64,
                rows: 0,
            },
            block: Vec::with_capacity(BLOCK_TARGET_BYTES + 1024),
            block_rows: 0,
        })
    }

    /// Appends one row.
    pub(crate) fn push(&mut self, key: &[u8], value: &[u8], index: u64) -> Result<()> {
        let kl = len_u32(key.len(), &format!("bulk row {index}: key"))?;
        let vl = len_u32(value.len(), &format!("bulk row {index}: value"))?;
        self.block.extend_from_slice(&index.to_le_bytes());
        self.block.extend_from_slice(&kl.to_le_bytes());
        self.block.extend_from_slice(&vl.to_le_bytes());
        self.block.extend_from_slice(key);
        self.block.extend_from_slice(value);
        self.block_rows += 1;
        if self.block.len() >= BLOCK_TARGET_BYTES {
            self.flush_block()?;
        }
        Ok(())
    }

    fn flush_block(&mut self) -> Result<()> {
        if self.block_rows == 0 {
            return Ok(());
        }
        let len = len_u32(self.block.len(), "bulk spill block")?;
        let mut out = Vec::with_capacity(BLOCK_HEADER_BYTES + self.block.len());
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&self.block_rows.to_le_bytes());
        out.extend_from_slice(&crc32c::crc32c(&self.block).to_le_bytes());
        let head_crc = crc32c::crc32c(&out);
        out.extend_from_slice(&head_crc.to_le_bytes());
        out.extend_from_slice(&self.block);
        self.run
            .file
            .write_all_at(&out, self.run.len)
            .map_err(no_space_or_io(format!("write {}", self.run.path.display())))?;
        self.run.len += out.len() as u64;
        self.run.rows += u64::from(self.block_rows);
        self.block.clear();
        self.block_rows = 0;
        Ok(())
    }

    /// Writes the last block; the run can then be read.
    pub(crate) fn finish(&mut self) -> Result<Run> {
        self.flush_block()?;
        Ok(self.run.clone())
    }
}

/// Reads a run back in order, checking every block.
pub(crate) struct RunReader {
    run: Run,
    offset: u64,
    rows_read: u64,
    block: Vec<u8>,
    at: usize,
    failed: bool,
}

fn read_u32(b: &[u8], at: usize) -> Option<u32> {
    let raw: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
    Some(u32::from_le_bytes(raw))
}

fn read_u64(b: &[u8], at: usize) -> Option<u64> {
    let raw: [u8; 8] = b.get(at..at + 8)?.try_into().ok()?;
    Some(u64::from_le_bytes(raw))
}

impl RunReader {
    pub(crate) fn open(run: &Run) -> Result<Self> {
        let mut head = [0u8; FILE_HEADER_BYTES];
        run.file
            .read_exact_at(&mut head, 0)
            .map_err(io(format!("read {}", run.path.display())))?;
        let bad = |detail: String| EngineError::Corruption {
            location: format!("{} header", run.path.display()),
            detail,
        };
        if head.get(..8) != Some(SPILL_MAGIC.as_slice()) {
            return Err(bad("not a bulk-load spill file".into()));
        }
        let version = read_u32(&head, 8).unwrap_or(0);
        if version != SPILL_VERSION {
            return Err(EngineError::UnsupportedVersion {
                found: version,
                supported: SPILL_VERSION,
            });
        }
        Ok(RunReader {
            run: run.clone(),
            offset: FILE_HEADER_BYTES as u64,
            rows_read: 0,
            block: Vec::new(),
            at: 0,
            failed: false,
        })
    }

    fn corrupt(&self, detail: impl Into<String>) -> EngineError {
        EngineError::Corruption {
            location: format!("{} @ offset {}", self.run.path.display(), self.offset),
            detail: detail.into(),
        }
    }

    /// Reads the next block into `self.block`; `false` at the end of the run.
    fn next_block(&mut self) -> Result<bool> {
        if self.offset >= self.run.len {
            if self.rows_read != self.run.rows || self.offset != self.run.len {
                return Err(self.corrupt(format!(
                    "run ends after {} of {} rows",
                    self.rows_read, self.run.rows
                )));
            }
            return Ok(false);
        }
        let mut head = [0u8; BLOCK_HEADER_BYTES];
        self.run
            .file
            .read_exact_at(&mut head, self.offset)
            .map_err(io(format!("read {}", self.run.path.display())))?;
        let field = |at| read_u32(&head, at).unwrap_or(0);
        let (len, crc, head_crc) = (field(0), field(8), field(12));
        if crc32c::crc32c(head.get(..12).unwrap_or_default()) != head_crc {
            return Err(self.corrupt("block header checksum mismatch"));
        }
        let end = self.offset + (BLOCK_HEADER_BYTES as u64) + u64::from(len);
        if end > self.run.len {
            return Err(self.corrupt("block past the end of the run"));
        }
        self.block.resize(len as usize, 0);
        self.run
            .file
            .read_exact_at(&mut self.block, self.offset + BLOCK_HEADER_BYTES as u64)
            .map_err(io(format!("read {}", self.run.path.display())))?;
        if crc32c::crc32c(&self.block) != crc {
            return Err(self.corrupt("block checksum mismatch"));
        }
        self.offset = end;
        self.at = 0;
        Ok(true)
    }

    fn next_row(&mut self) -> Result<Option<Row>> {
        while self.at >= self.block.len() {
            if !self.next_block()? {
                return Ok(None);
            }
        }
        let b = &self.block;
        let at = self.at;
        let parsed = (|| {
            let index = read_u64(b, at)?;
            let kl = read_u32(b, at + 8)? as usize;
            let vl = read_u32(b, at + 12)? as usize;
            let k0 = at + ROW_HEADER_BYTES;
            let key = b.get(k0..k0 + kl)?.to_vec();
            let value = b.get(k0 + kl..k0 + kl + vl)?.to_vec();
            Some((key, value, index, k0 + kl + vl))
        })();
        let Some((key, value, index, next)) = parsed else {
            return Err(self.corrupt("row runs past its block"));
        };
        self.at = next;
        self.rows_read += 1;
        Ok(Some((key, value, index)))
    }
}

impl Iterator for RunReader {
    type Item = Result<Row>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match self.next_row() {
            Ok(r) => r.map(Ok),
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}
