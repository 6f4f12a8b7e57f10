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

use std::fs::{self, File};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{Context, Poll};

use ftkv_engine::{Engine, EngineError, KeyValue};
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

fn corrupt(path: &Path, detail: impl Into<String>) -> SnapshotError {
    SnapshotError::Corrupt {
        path: path.display().to_string(),
        detail: detail.into(),
    }
}

/// Creates `dir` and removes unfinished `*.tmp` files left by a crash.
pub fn clean_dir(dir: &Path) -> Result<(), SnapshotError> {
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    remove_tmp_files(dir, "")
}

/// Removes the `*.tmp` files of `dir` whose names start with `prefix`.
pub fn remove_tmp_files(dir: &Path, prefix: &str) -> Result<(), SnapshotError> {
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let path = entry.map_err(io_err(dir))?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        if name.starts_with(prefix) && name.ends_with(".tmp") {
            fs::remove_file(&path).map_err(io_err(&path))?;
        }
    }
    Ok(())
}

fn sync_dir(dir: &Path) -> Result<(), SnapshotError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io_err(dir))
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

/// Writes a snapshot of `engine` (whose metadata blob is `sm_meta`) described by `meta` to
/// `dir/name`, fsyncs it and returns its path. The caller holds the apply lock, so the engine does
/// not change meanwhile.
pub fn write_snapshot(
    dir: &Path,
    name: &str,
    meta: &SnapshotMeta,
    sm_meta: &[u8],
    engine: &dyn Engine,
) -> Result<PathBuf, SnapshotError> {
    let path = dir.join(name);
    let file = File::create(&path).map_err(io_err(&path))?;
    let mut w = BufWriter::new(file);
    let meta_bytes = postcard::to_stdvec(meta).map_err(|e| corrupt(&path, format!("encode meta: {e}")))?;
    let meta_len = u32::try_from(meta_bytes.len()).map_err(|_| corrupt(&path, "meta too large"))?;
    let header = (|| -> io::Result<()> {
        w.write_all(SNAPSHOT_MAGIC)?;
        w.write_all(&SNAPSHOT_FORMAT_VERSION.to_le_bytes())?;
        w.write_all(&meta_len.to_le_bytes())?;
        w.write_all(&meta_bytes)?;
        w.write_all(&xxh3_64(&meta_bytes).to_le_bytes())
    })();
    header.map_err(io_err(&path))?;
    let mut z = zstd::Encoder::new(w, ZSTD_LEVEL).map_err(io_err(&path))?;
    write_frame(&mut z, TAG_META, &[], sm_meta).map_err(io_err(&path))?;
    let mut count: u64 = 0;
    let mut start: Vec<u8> = Vec::new();
    loop {
        let page = engine.scan(&start, None, SCAN_PAGE_PAIRS)?;
        let Some((last_key, _)) = page.last() else { break };
        let mut next = last_key.clone();
        next.push(0);
        for (k, v) in &page {
            write_frame(&mut z, TAG_PAIR, k, v).map_err(io_err(&path))?;
            count += 1;
        }
        if page.len() < SCAN_PAGE_PAIRS {
            break;
        }
        start = next;
    }
    write_frame(&mut z, TAG_END, &[], &count.to_le_bytes()).map_err(io_err(&path))?;
    let w = z.finish().map_err(io_err(&path))?;
    let file = w.into_inner().map_err(|e| SnapshotError::Io {
        path: path.display().to_string(),
        source: e.into_error(),
    })?;
    file.sync_all().map_err(io_err(&path))?;
    Ok(path)
}

/// Reads only the header of a snapshot file.
pub fn read_meta(path: &Path) -> Result<SnapshotMeta, SnapshotError> {
    let mut r = BufReader::new(File::open(path).map_err(io_err(path))?);
    read_header(path, &mut r)
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
    body: BufReader<zstd::Decoder<'static, BufReader<BufReader<File>>>>,
    /// Pairs read so far.
    count: u64,
    /// Key of the last pair (keys must ascend).
    last_key: Option<Vec<u8>>,
    finished: bool,
}

impl SnapshotReader {
    /// Opens `path`, checks the header and reads the metadata frame. Returns the reader, the
    /// header meta and the state-machine metadata blob.
    pub fn open(path: &Path) -> Result<(Self, SnapshotMeta, Vec<u8>), SnapshotError> {
        let mut r = BufReader::new(File::open(path).map_err(io_err(path))?);
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

/// Moves a verified snapshot file to `dir/current.snap` (rename when it is already in `dir`, copy
/// otherwise), fsyncing the file and the directory.
pub fn make_current(dir: &Path, from: &Path) -> Result<PathBuf, SnapshotError> {
    let target = dir.join(CURRENT_FILE);
    if from == target {
        return Ok(target);
    }
    if from.parent() == Some(dir) {
        File::open(from)
            .and_then(|f| f.sync_all())
            .map_err(io_err(from))?;
        fs::rename(from, &target).map_err(io_err(&target))?;
    } else {
        let tmp = dir.join(format!("copy-{}.tmp", std::process::id()));
        fs::copy(from, &tmp).map_err(io_err(&tmp))?;
        File::open(&tmp)
            .and_then(|f| f.sync_all())
            .map_err(io_err(&tmp))?;
        fs::rename(&tmp, &target).map_err(io_err(&target))?;
    }
    sync_dir(dir)?;
    Ok(target)
}

/// openraft's snapshot data handle: an open file plus its path (so `install_snapshot` can verify
/// and keep the very file that was received).
#[derive(Debug)]
pub struct SnapshotFile {
    /// Where the file lives.
    pub path: PathBuf,
    file: tokio::fs::File,
}

impl SnapshotFile {
    /// Opens an existing snapshot for reading (position 0).
    pub async fn open(path: PathBuf) -> io::Result<Self> {
        let file = tokio::fs::File::open(&path).await?;
        Ok(SnapshotFile { path, file })
    }

    /// Creates an empty file for receiving a snapshot.
    pub async fn create(path: PathBuf) -> io::Result<Self> {
        let file = tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .await?;
        Ok(SnapshotFile { path, file })
    }

    /// Flushes written data to disk.
    pub async fn sync(&mut self) -> io::Result<()> {
        use tokio::io::AsyncWriteExt;
        self.file.flush().await?;
        self.file.sync_all().await
    }
}

impl AsyncRead for SnapshotFile {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_read(cx, buf)
    }
}

impl AsyncWrite for SnapshotFile {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.file).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.file).poll_shutdown(cx)
    }
}

impl AsyncSeek for SnapshotFile {
    fn start_seek(mut self: Pin<&mut Self>, position: io::SeekFrom) -> io::Result<()> {
        Pin::new(&mut self.file).start_seek(position)
    }
    fn poll_complete(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<u64>> {
        Pin::new(&mut self.file).poll_complete(cx)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use ftkv_engine::model::ModelEngine;
    use ftkv_engine::WriteOp;

    #[test]
    fn round_trip_and_corruption_detected() {
        let dir = tempfile::tempdir().unwrap();
        let engine = ModelEngine::new();
        let ops: Vec<WriteOp> = (0..10_000u32)
            .map(|i| WriteOp::Put {
                key: format!("k{i:06}").into_bytes(),
                value: vec![(i % 251) as u8; 20],
            })
            .collect();
        engine.write(&ops, Some(b"sm-meta")).unwrap();
        let meta = SnapshotMeta {
            snapshot_id: "s1".into(),
            ..Default::default()
        };
        let path = write_snapshot(dir.path(), "building-1.tmp", &meta, b"sm-meta", &engine).unwrap();
        assert_eq!(read_meta(&path).unwrap(), meta);
        let (reader, meta2, sm_meta) = SnapshotReader::open(&path).unwrap();
        assert_eq!(meta2, meta);
        assert_eq!(sm_meta, b"sm-meta");
        let pairs: Vec<KeyValue> = reader.collect::<Result<_, _>>().unwrap();
        assert_eq!(pairs.len(), 10_000);
        assert_eq!(pairs[17], (b"k000017".to_vec(), vec![17u8; 20]));

        // Flip one byte in the body: reading must fail, never yield wrong data silently.
        let mut bytes = fs::read(&path).unwrap();
        let n = bytes.len();
        bytes[n - 20] ^= 0x40;
        let bad = dir.path().join("bad.snap");
        fs::write(&bad, &bytes).unwrap();
        let result = SnapshotReader::open(&bad).and_then(|(r, _, _)| {
            r.collect::<Result<Vec<_>, _>>()
                .map_err(|e| corrupt(&bad, e.to_string()))
        });
        assert!(result.is_err());
    }
}
