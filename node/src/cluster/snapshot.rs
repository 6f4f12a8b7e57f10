//! Snapshot files under `DATA_DIR/snapshots/` and their on-disk format.
//!
//! A snapshot is the engine state at a durable checkpoint, written as one file that is also the
//! byte stream openraft sends to a lagging follower in chunks (`install_snapshot`):
//!
//! ```text
//! header (uncompressed, little-endian):
//!   magic        8 bytes  "FTKVSNAP"
//!   version      u32      SNAPSHOT_FORMAT_VERSION
//!   meta_len     u32      length of the next field
//!   meta         postcard(openraft SnapshotMeta)
//!   meta_hash    u64      xxh3-64 of `meta`
//! body: one zstd stream of frames
//!   tag u8 | key_len u32 | value_len u32 | key | value | xxh3-64(tag..value) u64
//!   tag 1 = state-machine metadata blob (value), exactly once, first
//!   tag 2 = one (key, value) pair, keys strictly ascending
//!   tag 3 = end; value = pair count as u64; nothing may follow
//! ```
//!
//! Files: `current.snap` (the latest complete snapshot; replaced by rename), `building-*.tmp`
//! and `receiving-*.tmp` (in progress; removed on open).
//!
//! Every file operation goes through the node's [`Vfs`] (as the log's do), so the fault
//! harness's lose-unsynced mode loses a snapshot's unsynced bytes when a node dies, and a test
//! file layer can damage them.

use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use ftkv_engine::{Engine, EngineError, KeyValue};
use ftkv_vfs::{Vfs, VfsFile};
use tokio::io::{AsyncRead, AsyncSeek, AsyncWrite, ReadBuf};
use xxhash_rust::xxh3::xxh3_64;

use super::types::SnapshotMeta;

/// File magic.
pub const SNAPSHOT_MAGIC: &[u8; 8] = b"FTKVSNAP";
/// Format version written and read by this build.
pub const SNAPSHOT_FORMAT_VERSION: u32 = 1;
/// Largest key or value accepted in a snapshot frame (guards allocations on corrupt input).
pub const SNAPSHOT_MAX_FIELD_BYTES: u32 = 64 * 1024 * 1024;
/// Pairs read from the engine per scan call while writing a snapshot.
const SCAN_PAGE_PAIRS: usize = 4096;
/// zstd level of the body.
const ZSTD_LEVEL: i32 = 1;
/// Buffer of the sequential reader and writer over a [`VfsFile`].
const IO_BUFFER_BYTES: usize = 1 << 20;

const TAG_META: u8 = 1;
const TAG_PAIR: u8 = 2;
const TAG_END: u8 = 3;

/// Name of the latest complete snapshot.
pub const CURRENT_FILE: &str = "current.snap";

/// Errors reading or writing snapshot files.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// File system error.
    #[error("snapshot I/O error on {path}: {source}")]
    Io {
        /// File concerned.
        path: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The file does not hold a valid snapshot.
    #[error("corrupt snapshot {path}: {detail}")]
    Corrupt {
        /// File concerned.
        path: String,
        /// What did not match.
        detail: String,
    },
    /// Writing the file met a full disk or quota (`ENOSPC`, `EDQUOT`): retryable once space
    /// is freed (a failed fsync is `Io`, whatever its errno).
    #[error("no space to write snapshot {path}: {source}")]
    NoSpace {
        /// File concerned.
        path: String,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The engine failed while being read or replaced.
    #[error("engine error during snapshot: {0}")]
    Engine(#[from] EngineError),
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> SnapshotError + '_ {
    move |source| SnapshotError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// [`io_err`] for a write: a full disk is [`SnapshotError::NoSpace`].
fn write_err(path: &Path) -> impl FnOnce(io::Error) -> SnapshotError + '_ {
    move |source| {
        let path = path.display().to_string();
        if ftkv_engine::is_no_space_io(&source) {
            SnapshotError::NoSpace { path, source }
        } else {
            SnapshotError::Io { path, source }
        }
    }
}

impl SnapshotError {
    /// Whether this is a full disk ([`SnapshotError::NoSpace`], or the engine's checkpoint
    /// meeting one): retryable, not a fault.
    pub fn is_no_space(&self) -> bool {
        match self {
            SnapshotError::NoSpace { .. } => true,
            SnapshotError::Engine(e) => e.is_no_space(),
            _ => false,
        }
    }
}

fn corrupt(path: &Path, detail: impl Into<String>) -> SnapshotError {
    SnapshotError::Corrupt {
        path: path.display().to_string(),
        detail: detail.into(),
    }
}

/// Sequential `Read` over a [`VfsFile`] from an offset.
struct VfsReader {
    file: Arc<dyn VfsFile>,
    offset: u64,
}

impl Read for VfsReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(buf, self.offset)?;
        self.offset += n as u64;
        Ok(n)
    }
}

/// Sequential `Write` over a [`VfsFile`] from an offset.
struct VfsWriter {
    file: Arc<dyn VfsFile>,
    offset: u64,
}

impl Write for VfsWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write_all_at(buf, self.offset)?;
        self.offset += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The snapshot directory of one node, through its [`Vfs`]. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SnapshotDir {
    vfs: Arc<dyn Vfs>,
    dir: PathBuf,
}

impl SnapshotDir {
    /// The directory `dir` through `vfs`.
    pub fn new(vfs: Arc<dyn Vfs>, dir: &Path) -> Self {
        SnapshotDir {
            vfs,
            dir: dir.to_path_buf(),
        }
    }

    /// Path of `name` in the directory.
    pub fn join(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Creates the directory and removes unfinished `*.tmp` files left by a crash.
    pub fn clean(&self) -> Result<(), SnapshotError> {
        self.vfs.create_dir_all(&self.dir).map_err(io_err(&self.dir))?;
        self.remove_tmp_files("")
    }

    /// Removes the `*.tmp` files whose names start with `prefix`.
    pub fn remove_tmp_files(&self, prefix: &str) -> Result<(), SnapshotError> {
        for path in self.vfs.list_dir(&self.dir).map_err(io_err(&self.dir))? {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            if name.starts_with(prefix) && name.ends_with(".tmp") {
                self.vfs.remove_file(&path).map_err(io_err(&path))?;
            }
        }
        Ok(())
    }

    /// Removes `path` (a damaged file).
    pub fn remove(&self, path: &Path) -> Result<(), SnapshotError> {
        self.vfs.remove_file(path).map_err(io_err(path))?;
        self.vfs.sync_dir(&self.dir).map_err(io_err(&self.dir))
    }

    /// Whether `path` exists.
    pub fn exists(&self, path: &Path) -> bool {
        self.vfs.exists(path)
    }

    fn open(&self, path: &Path, create: bool) -> Result<Arc<dyn VfsFile>, SnapshotError> {
        self.vfs.open(path, create).map_err(io_err(path))
    }
}

fn write_frame(w: &mut impl Write, tag: u8, key: &[u8], value: &[u8]) -> io::Result<()> {
    let key_len = u32::try_from(key.len()).map_err(|_| io::Error::other("key too long for snapshot"))?;
    let value_len =
        u32::try_from(value.len()).map_err(|_| io::Error::other("value too long for snapshot"))?;
    let mut head = [0u8; 9];
    head[0] = tag;
    head[1..5].copy_from_slice(&key_len.to_le_bytes());
    head[5..9].copy_from_slice(&value_len.to_le_bytes());
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    hasher.update(&head);
    hasher.update(key);
    hasher.update(value);
    w.write_all(&head)?;
    w.write_all(key)?;
    w.write_all(value)?;
    w.write_all(&hasher.digest().to_le_bytes())
}

impl SnapshotDir {
    /// Writes a snapshot of `engine` (whose metadata blob is `sm_meta`) described by `meta` to
    /// `name` in the directory, fsyncs it and returns its path. The caller holds the apply lock,
    /// so the engine does not change meanwhile.
    pub fn write_snapshot(
        &self,
        name: &str,
        meta: &SnapshotMeta,
        sm_meta: &[u8],
        engine: &dyn Engine,
    ) -> Result<PathBuf, SnapshotError> {
        let path = self.join(name);
        let file = self.open(&path, true)?;
        file.set_len(0).map_err(io_err(&path))?;
        let mut w = BufWriter::with_capacity(
            IO_BUFFER_BYTES,
            VfsWriter {
                file: file.clone(),
                offset: 0,
            },
        );
        let meta_bytes =
            postcard::to_stdvec(meta).map_err(|e| corrupt(&path, format!("encode meta: {e}")))?;
        let meta_len = u32::try_from(meta_bytes.len()).map_err(|_| corrupt(&path, "meta too large"))?;
        let header = (|| -> io::Result<()> {
            w.write_all(SNAPSHOT_MAGIC)?;
            w.write_all(&SNAPSHOT_FORMAT_VERSION.to_le_bytes())?;
            w.write_all(&meta_len.to_le_bytes())?;
            w.write_all(&meta_bytes)?;
            w.write_all(&xxh3_64(&meta_bytes).to_le_bytes())
        })();
        header.map_err(write_err(&path))?;
        let mut z = zstd::Encoder::new(w, ZSTD_LEVEL).map_err(write_err(&path))?;
        write_frame(&mut z, TAG_META, &[], sm_meta).map_err(write_err(&path))?;
        let mut count: u64 = 0;
        let mut start: Vec<u8> = Vec::new();
        loop {
            let page = engine.scan(&start, None, SCAN_PAGE_PAIRS)?;
            let Some((last_key, _)) = page.last() else { break };
            let mut next = last_key.clone();
            next.push(0);
            for (k, v) in &page {
                write_frame(&mut z, TAG_PAIR, k, v).map_err(write_err(&path))?;
                count += 1;
            }
            if page.len() < SCAN_PAGE_PAIRS {
                break;
            }
            start = next;
        }
        write_frame(&mut z, TAG_END, &[], &count.to_le_bytes()).map_err(write_err(&path))?;
        let mut w = z.finish().map_err(write_err(&path))?;
        w.flush().map_err(write_err(&path))?;
        file.sync_data().map_err(io_err(&path))?;
        Ok(path)
    }

    /// Opens the snapshot at `path` for sequential reading (see [`SnapshotReader::open`]).
    pub fn reader(&self, path: &Path) -> Result<(SnapshotReader, SnapshotMeta, Vec<u8>), SnapshotError> {
        SnapshotReader::open(path, self.open(path, false)?)
    }

    /// Reads the whole file at `path` and checks everything [`SnapshotReader`] checks (header,
    /// every frame's checksum, key order, the end frame's count, nothing after it). Returns its
    /// meta.
    pub fn verify_file(&self, path: &Path) -> Result<SnapshotMeta, SnapshotError> {
        let (mut reader, meta, _) = self.reader(path)?;
        while reader.next_pair()?.is_some() {}
        Ok(meta)
    }

    /// Makes the verified snapshot file `from` `current.snap`: fsyncs it, renames it (copies it
    /// in first when it lies elsewhere) and fsyncs the directory.
    pub fn make_current(&self, from: &Path) -> Result<PathBuf, SnapshotError> {
        let target = self.join(CURRENT_FILE);
        if from == target {
            return Ok(target);
        }
        let from = if from.parent() == Some(self.dir.as_path()) {
            from.to_path_buf()
        } else {
            self.copy_in(from)?
        };
        self.open(&from, false)?.sync_data().map_err(io_err(&from))?;
        self.vfs.rename(&from, &target).map_err(io_err(&target))?;
        self.vfs.sync_dir(&self.dir).map_err(io_err(&self.dir))?;
        Ok(target)
    }

    /// Copies a file from elsewhere into `copy-*.tmp` here.
    fn copy_in(&self, from: &Path) -> Result<PathBuf, SnapshotError> {
        let source = self.open(from, false)?;
        let tmp = self.join(&format!("copy-{}.tmp", std::process::id()));
        let file = self.open(&tmp, true)?;
        file.set_len(0).map_err(io_err(&tmp))?;
        let mut buf = vec![0u8; IO_BUFFER_BYTES];
        let mut offset = 0u64;
        loop {
            let n = source.read_at(&mut buf, offset).map_err(io_err(from))?;
            let Some(chunk) = buf.get(..n).filter(|c| !c.is_empty()) else {
                break;
            };
            file.write_all_at(chunk, offset).map_err(io_err(&tmp))?;
            offset += n as u64;
        }
        Ok(tmp)
    }

    /// Opens an existing snapshot for openraft (position 0).
    pub fn open_file(&self, path: &Path) -> Result<SnapshotFile, SnapshotError> {
        Ok(SnapshotFile {
            path: path.to_path_buf(),
            file: self.open(path, false)?,
            pos: 0,
        })
    }

    /// Creates an empty file `name` for receiving a snapshot.
    pub fn create_file(&self, name: &str) -> Result<SnapshotFile, SnapshotError> {
        let path = self.join(name);
        let file = self.open(&path, true)?;
        file.set_len(0).map_err(io_err(&path))?;
        Ok(SnapshotFile { path, file, pos: 0 })
    }
}

fn read_header(path: &Path, r: &mut impl Read) -> Result<SnapshotMeta, SnapshotError> {
    let mut fixed = [0u8; 16];
    r.read_exact(&mut fixed).map_err(io_err(path))?;
    if &fixed[0..8] != SNAPSHOT_MAGIC {
        return Err(corrupt(path, "bad magic"));
    }
    let version = u32::from_le_bytes([fixed[8], fixed[9], fixed[10], fixed[11]]);
    if version != SNAPSHOT_FORMAT_VERSION {
        return Err(corrupt(path, format!("unsupported format version {version}")));
    }
    let meta_len = u32::from_le_bytes([fixed[12], fixed[13], fixed[14], fixed[15]]);
    if meta_len > SNAPSHOT_MAX_FIELD_BYTES {
        return Err(corrupt(path, format!("meta length {meta_len} too large")));
    }
    let mut meta = vec![0u8; meta_len as usize];
    r.read_exact(&mut meta).map_err(io_err(path))?;
    let mut hash = [0u8; 8];
    r.read_exact(&mut hash).map_err(io_err(path))?;
    if u64::from_le_bytes(hash) != xxh3_64(&meta) {
        return Err(corrupt(path, "meta checksum mismatch"));
    }
    postcard::from_bytes(&meta).map_err(|e| corrupt(path, format!("decode meta: {e}")))
}

/// Sequential reader of a snapshot body: the state-machine metadata blob, then the pairs.
pub struct SnapshotReader {
    path: PathBuf,
    body: BufReader<zstd::Decoder<'static, BufReader<BufReader<VfsReader>>>>,
    /// Pairs read so far.
    count: u64,
    /// Key of the last pair (keys must ascend).
    last_key: Option<Vec<u8>>,
    finished: bool,
}

impl SnapshotReader {
    /// Reads `file` (at `path`): checks the header and reads the metadata frame. Returns the
    /// reader, the header meta and the state-machine metadata blob.
    fn open(path: &Path, file: Arc<dyn VfsFile>) -> Result<(Self, SnapshotMeta, Vec<u8>), SnapshotError> {
        let mut r = BufReader::with_capacity(IO_BUFFER_BYTES, VfsReader { file, offset: 0 });
        let meta = read_header(path, &mut r)?;
        let decoder = zstd::Decoder::with_buffer(BufReader::new(r)).map_err(io_err(path))?;
        let mut reader = SnapshotReader {
            path: path.to_path_buf(),
            body: BufReader::new(decoder),
            count: 0,
            last_key: None,
            finished: false,
        };
        let (tag, _, sm_meta) = reader.read_frame()?;
        if tag != TAG_META {
            return Err(corrupt(
                path,
                format!("first frame has tag {tag}, expected metadata"),
            ));
        }
        Ok((reader, meta, sm_meta))
    }

    fn read_frame(&mut self) -> Result<(u8, Vec<u8>, Vec<u8>), SnapshotError> {
        let path = self.path.clone();
        let mut head = [0u8; 9];
        self.body
            .read_exact(&mut head)
            .map_err(|e| corrupt(&path, format!("truncated frame header: {e}")))?;
        let key_len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
        let value_len = u32::from_le_bytes([head[5], head[6], head[7], head[8]]);
        if key_len > SNAPSHOT_MAX_FIELD_BYTES || value_len > SNAPSHOT_MAX_FIELD_BYTES {
            return Err(corrupt(
                &path,
                format!("frame lengths {key_len}/{value_len} too large"),
            ));
        }
        let mut key = vec![0u8; key_len as usize];
        let mut value = vec![0u8; value_len as usize];
        let mut hash = [0u8; 8];
        let body = &mut self.body;
        (|| -> io::Result<()> {
            body.read_exact(&mut key)?;
            body.read_exact(&mut value)?;
            body.read_exact(&mut hash)
        })()
        .map_err(|e| corrupt(&path, format!("truncated frame: {e}")))?;
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        hasher.update(&head);
        hasher.update(&key);
        hasher.update(&value);
        if hasher.digest() != u64::from_le_bytes(hash) {
            return Err(corrupt(
                &path,
                format!("frame checksum mismatch after {} pairs", self.count),
            ));
        }
        Ok((head[0], key, value))
    }

    /// Next pair; `Ok(None)` after the end frame (whose count is verified).
    pub fn next_pair(&mut self) -> Result<Option<KeyValue>, SnapshotError> {
        if self.finished {
            return Ok(None);
        }
        let (tag, key, value) = self.read_frame()?;
        match tag {
            TAG_PAIR => {
                if self.last_key.as_ref().is_some_and(|last| last >= &key) {
                    return Err(corrupt(&self.path, "keys not strictly ascending"));
                }
                self.last_key = Some(key.clone());
                self.count += 1;
                Ok(Some((key, value)))
            }
            TAG_END => {
                let expected = <[u8; 8]>::try_from(value.as_slice()).ok().map(u64::from_le_bytes);
                if expected != Some(self.count) {
                    return Err(corrupt(
                        &self.path,
                        format!("end frame count mismatch (read {})", self.count),
                    ));
                }
                let mut rest = [0u8; 1];
                if self.body.read(&mut rest).map_err(io_err(&self.path))? != 0 {
                    return Err(corrupt(&self.path, "data after end frame"));
                }
                self.finished = true;
                Ok(None)
            }
            other => Err(corrupt(&self.path, format!("unknown frame tag {other}"))),
        }
    }
}

impl Iterator for SnapshotReader {
    type Item = Result<KeyValue, EngineError>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.next_pair() {
            Ok(Some(kv)) => Some(Ok(kv)),
            Ok(None) => None,
            Err(SnapshotError::Engine(e)) => Some(Err(e)),
            Err(e) => {
                self.finished = true;
                Some(Err(EngineError::Corruption {
                    location: self.path.display().to_string(),
                    detail: e.to_string(),
                }))
            }
        }
    }
}

/// openraft's snapshot data handle: a file of the snapshot directory plus its path (so
/// `install_snapshot` can verify and keep the very file that was received).
///
/// The async traits do the file's positional I/O inline: each call is one read or write of at
/// most one snapshot chunk (4 MiB) on a local file, as openraft's chunked transport issues them.
#[derive(Debug)]
pub struct SnapshotFile {
    /// Where the file lives.
    pub path: PathBuf,
    file: Arc<dyn VfsFile>,
    pos: u64,
}

impl SnapshotFile {
    /// Flushes written data to disk.
    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}

impl AsyncRead for SnapshotFile {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let pos = self.pos;
        let n = self.file.read_at(buf.initialize_unfilled(), pos)?;
        buf.advance(n);
        self.pos += n as u64;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for SnapshotFile {
    fn poll_write(mut self: Pin<&mut Self>, _cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let pos = self.pos;
        self.file.write_all_at(buf, pos)?;
        self.pos += buf.len() as u64;
        Poll::Ready(Ok(buf.len()))
    }
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl AsyncSeek for SnapshotFile {
    fn start_seek(mut self: Pin<&mut Self>, position: io::SeekFrom) -> io::Result<()> {
        let base = match position {
            io::SeekFrom::Start(p) => {
                self.pos = p;
                return Ok(());
            }
            io::SeekFrom::End(d) => (self.file.len()?, d),
            io::SeekFrom::Current(d) => (self.pos, d),
        };
        self.pos = base
            .0
            .checked_add_signed(base.1)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek out of range"))?;
        Ok(())
    }
    fn poll_complete(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        Poll::Ready(Ok(self.pos))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use ftkv_engine::model::ModelEngine;
    use ftkv_engine::WriteOp;

    fn engine_with(n: u32) -> ModelEngine {
        let engine = ModelEngine::new();
        let ops: Vec<WriteOp> = (0..n)
            .map(|i| WriteOp::Put {
                key: format!("k{i:06}").into_bytes(),
                value: vec![(i % 251) as u8; 20],
            })
            .collect();
        engine.write(&ops, Some(b"sm-meta")).unwrap();
        engine
    }

    fn meta() -> SnapshotMeta {
        SnapshotMeta {
            snapshot_id: "s1".into(),
            ..Default::default()
        }
    }

    #[test]
    fn round_trip_and_corruption_detected() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = SnapshotDir::new(Arc::new(ftkv_vfs::RealVfs), tmp.path());
        dir.clean().unwrap();
        let engine = engine_with(10_000);
        let path = dir
            .write_snapshot("building-1.tmp", &meta(), b"sm-meta", &engine)
            .unwrap();
        assert_eq!(dir.verify_file(&path).unwrap(), meta());
        let (reader, meta2, sm_meta) = dir.reader(&path).unwrap();
        assert_eq!(meta2, meta());
        assert_eq!(sm_meta, b"sm-meta");
        let pairs: Vec<KeyValue> = reader.collect::<Result<_, _>>().unwrap();
        assert_eq!(pairs.len(), 10_000);
        assert_eq!(pairs[17], (b"k000017".to_vec(), vec![17u8; 20]));

        // Any flipped byte, in the header or the body, and any truncation is found by a full
        // verification: never wrong data silently.
        let bytes = std::fs::read(&path).unwrap();
        let n = bytes.len();
        let bad = tmp.path().join("bad.snap");
        for at in [3, 10, 14, 20, n / 2, n - 20, n - 1] {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x40;
            std::fs::write(&bad, &damaged).unwrap();
            assert!(dir.verify_file(&bad).is_err(), "flip at {at} of {n} not detected");
        }
        for len in [0, 7, 16, 40, n / 2, n - 1] {
            std::fs::write(&bad, &bytes[..len]).unwrap();
            assert!(
                dir.verify_file(&bad).is_err(),
                "truncation to {len} of {n} not detected"
            );
        }
        let mut longer = bytes.clone();
        longer.extend_from_slice(b"trailing");
        std::fs::write(&bad, &longer).unwrap();
        assert!(dir.verify_file(&bad).is_err(), "trailing bytes not detected");
    }

    #[test]
    fn received_bytes_not_synced_are_lost_with_the_process_in_lose_unsynced_mode() {
        let tmp = tempfile::tempdir().unwrap();
        let real = SnapshotDir::new(Arc::new(ftkv_vfs::RealVfs), tmp.path());
        real.clean().unwrap();
        let source = real
            .write_snapshot("building-1.tmp", &meta(), b"sm-meta", &engine_with(100))
            .unwrap();
        let bytes = std::fs::read(&source).unwrap();
        {
            let unsynced = SnapshotDir::new(
                ftkv_vfs::UnsyncedBufferVfs::over_real(std::time::Duration::ZERO),
                tmp.path(),
            );
            let mut file = unsynced.create_file("receiving-1.tmp").unwrap();
            let written = futures::executor::block_on(async {
                use tokio::io::AsyncWriteExt;
                file.write_all(&bytes).await
            });
            written.unwrap();
            // Readable through the same file layer before the sync...
            assert_eq!(unsynced.verify_file(&file.path).unwrap(), meta());
            // ... and gone when the process dies without it.
        }
        assert!(real.verify_file(&tmp.path().join("receiving-1.tmp")).is_err());
    }
}
