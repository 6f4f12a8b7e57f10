//! The `disk` nemesis's damage, done to a stopped node's files between its kill and its restart:
//! the newest log segment (`DATA_DIR/log/*.seg`) or the snapshot file
//! (`DATA_DIR/snapshots/current.snap`, header or body).
//!
//! The snapshot format (`node/src/cluster/snapshot.rs`) is read here on its own terms, so that a
//! change of it shows up as a test failure rather than as damage in the wrong place: header =
//! magic (8 bytes) | version u32 | meta_len u32 | meta (meta_len bytes) | meta_hash u64, all
//! little-endian; the body (one zstd stream of frames) is the rest of the file.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use rand::rngs::StdRng;
use rand::Rng;
use serde::{Deserialize, Serialize};

/// Disk corruption modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiskMode {
    /// Cut bytes off the end: 1..4096 of a segment or of a snapshot body; for a snapshot header,
    /// cut the file to a random length inside the header.
    Truncate,
    /// Zero the last 4 KiB page (of a segment or snapshot body; the whole header of a snapshot).
    ZeroPage,
    /// Flip 1..8 bits in a random 4 KiB block (segment, snapshot body) or in the header.
    Bitflip,
}

/// Which file a disk fault damages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiskFile {
    /// The newest log segment.
    Log,
    /// The header of `snapshots/current.snap` (magic, version, metadata, its hash).
    SnapshotHeader,
    /// The body of `snapshots/current.snap` (the compressed frames after the header).
    SnapshotBody,
}

impl DiskFile {
    /// Name in reports and scenario files.
    pub fn name(&self) -> &'static str {
        match self {
            DiskFile::Log => "log",
            DiskFile::SnapshotHeader => "snapshot-header",
            DiskFile::SnapshotBody => "snapshot-body",
        }
    }
}

/// The snapshot file of a node's data dir (it may not exist yet).
pub fn snapshot_file(data_dir: &Path) -> PathBuf {
    data_dir.join("snapshots").join("current.snap")
}

/// Damages `file` of a stopped node's data dir with `mode`; returns the report line.
pub fn corrupt(data_dir: &Path, file: DiskFile, mode: DiskMode, rng: &mut StdRng) -> Result<String, String> {
    match file {
        DiskFile::Log => corrupt_newest_segment(data_dir, mode, rng),
        DiskFile::SnapshotHeader | DiskFile::SnapshotBody => corrupt_snapshot(data_dir, file, mode, rng),
    }
}

/// The newest `*.seg` file under `data_dir/log`.
pub fn newest_segment(data_dir: &Path) -> Result<PathBuf, String> {
    let dir = data_dir.join("log");
    let mut segs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segs.sort();
    segs.pop()
        .ok_or_else(|| format!("no segment in {}", dir.display()))
}

/// Corrupts the newest log segment of a stopped node; returns what was done.
pub fn corrupt_newest_segment(data_dir: &Path, mode: DiskMode, rng: &mut StdRng) -> Result<String, String> {
    let path = newest_segment(data_dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let len = file_len(&path)?;
    if len == 0 {
        return Err(format!("{} is empty", path.display()));
    }
    damage_range(&path, &name, 0..len, mode, rng)
}

/// Length of the snapshot header of the file at `path` (16 fixed bytes, the metadata and its
/// 8-byte hash), capped at the file's length. A header too damaged to give a length (short file)
/// is the whole file.
pub fn snapshot_header_len(path: &Path) -> Result<u64, String> {
    let len = file_len(path)?;
    let mut fixed = [0u8; 16];
    let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if len < 16 || f.read_exact(&mut fixed).is_err() {
        return Ok(len);
    }
    let meta_len = u32::from_le_bytes([fixed[12], fixed[13], fixed[14], fixed[15]]) as u64;
    Ok((16 + meta_len + 8).min(len))
}

fn corrupt_snapshot(
    data_dir: &Path,
    file: DiskFile,
    mode: DiskMode,
    rng: &mut StdRng,
) -> Result<String, String> {
    let path = snapshot_file(data_dir);
    if !path.is_file() {
        return Err(format!("no snapshot file {}", path.display()));
    }
    let len = file_len(&path)?;
    let header = snapshot_header_len(&path)?;
    let (range, what) = match file {
        DiskFile::SnapshotHeader => (0..header, "current.snap header"),
        _ => (header..len, "current.snap body"),
    };
    if range.is_empty() {
        return Err(format!(
            "{} has no {what} (length {len}, header {header})",
            path.display()
        ));
    }
    if file == DiskFile::SnapshotHeader && mode == DiskMode::Truncate {
        // Inside the header: the file then ends before its header does.
        let keep = rng.gen_range(0..header);
        set_len(&path, keep)?;
        return Ok(format!(
            "truncated {what}: {len} -> {keep} bytes (header is {header})"
        ));
    }
    damage_range(&path, what, range, mode, rng)
}

fn file_len(path: &Path) -> Result<u64, String> {
    std::fs::metadata(path)
        .map(|m| m.len())
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn set_len(path: &Path, len: u64) -> Result<(), String> {
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    f.set_len(len).map_err(|e| e.to_string())?;
    f.sync_all().map_err(|e| e.to_string())
}

/// Damages bytes `range` (non-empty) of the file at `path`: truncate cuts 1..4096 bytes off its
/// end (the range must end the file), zero-page zeroes its last 4 KiB, bitflip flips 1..8 bits in
/// a random 4 KiB block of it.
fn damage_range(
    path: &Path,
    name: &str,
    range: std::ops::Range<u64>,
    mode: DiskMode,
    rng: &mut StdRng,
) -> Result<String, String> {
    let len = file_len(path)?;
    let span = range.end - range.start;
    match mode {
        DiskMode::Truncate => {
            let cut = rng.gen_range(1..=4096u64).min(span);
            set_len(path, len - cut)?;
            Ok(format!(
                "truncated {name} by {cut} bytes ({len} -> {})",
                len - cut
            ))
        }
        DiskMode::ZeroPage => {
            let start = range.end.saturating_sub(4096).max(range.start);
            write_at(path, start, &vec![0u8; (range.end - start) as usize])?;
            Ok(format!("zeroed {name} bytes {start}..{}", range.end))
        }
        DiskMode::Bitflip => {
            let blocks = span.div_ceil(4096);
            let block = rng.gen_range(0..blocks);
            let start = range.start + block * 4096;
            let size = (range.end - start).min(4096) as usize;
            let mut buf = vec![0u8; size];
            let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
            f.seek(SeekFrom::Start(start)).map_err(|e| e.to_string())?;
            f.read_exact(&mut buf).map_err(|e| e.to_string())?;
            let flips = rng.gen_range(1..=8);
            for _ in 0..flips {
                let i = rng.gen_range(0..size);
                buf[i] ^= 1 << rng.gen_range(0..8);
            }
            write_at(path, start, &buf)?;
            Ok(format!(
                "flipped {flips} bit(s) in {name} block {block} (bytes {start}..{})",
                start + size as u64
            ))
        }
    }
}

fn write_at(path: &Path, at: u64, bytes: &[u8]) -> Result<(), String> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    f.seek(SeekFrom::Start(at)).map_err(|e| e.to_string())?;
    f.write_all(bytes).map_err(|e| e.to_string())?;
    f.sync_all().map_err(|e| e.to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn disk_corruption_modes_change_the_newest_segment_only() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        std::fs::create_dir_all(&log).unwrap();
        let old = log.join("00000000000000000001.seg");
        let new = log.join("00000000000000000002.seg");
        std::fs::write(&old, vec![7u8; 10_000]).unwrap();
        let mut rng = StdRng::seed_from_u64(3);
        std::fs::write(&new, vec![7u8; 10_000]).unwrap();
        corrupt_newest_segment(dir.path(), DiskMode::Truncate, &mut rng).unwrap();
        let len = std::fs::metadata(&new).unwrap().len();
        assert!((10_000 - 4096..10_000).contains(&len));
        std::fs::write(&new, vec![7u8; 10_000]).unwrap();
        corrupt_newest_segment(dir.path(), DiskMode::ZeroPage, &mut rng).unwrap();
        let bytes = std::fs::read(&new).unwrap();
        assert!(
            bytes[10_000 - 4096..].iter().all(|&b| b == 0) && bytes[..10_000 - 4096].iter().all(|&b| b == 7)
        );
        std::fs::write(&new, vec![7u8; 10_000]).unwrap();
        corrupt_newest_segment(dir.path(), DiskMode::Bitflip, &mut rng).unwrap();
        let bytes = std::fs::read(&new).unwrap();
        assert!(bytes.iter().any(|&b| b != 7));
        assert_eq!(std::fs::read(&old).unwrap(), vec![7u8; 10_000]);
    }

    /// A snapshot-shaped file: 16 fixed header bytes, `meta_len` bytes of metadata, an 8-byte
    /// hash, then `body` bytes of 7.
    fn fake_snapshot(dir: &Path, meta_len: u32, body: usize) -> (PathBuf, u64) {
        let path = snapshot_file(dir);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut bytes = b"FTKVSNAP".to_vec();
        bytes.extend_from_slice(&1u32.to_le_bytes());
        bytes.extend_from_slice(&meta_len.to_le_bytes());
        bytes.extend(std::iter::repeat_n(5u8, meta_len as usize + 8));
        bytes.extend(std::iter::repeat_n(7u8, body));
        std::fs::write(&path, &bytes).unwrap();
        (path, 16 + meta_len as u64 + 8)
    }

    #[test]
    fn snapshot_header_damage_stays_in_the_header() {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = StdRng::seed_from_u64(4);
        for mode in [DiskMode::Bitflip, DiskMode::ZeroPage] {
            let (path, header) = fake_snapshot(dir.path(), 40, 20_000);
            let before = std::fs::read(&path).unwrap();
            assert_eq!(snapshot_header_len(&path).unwrap(), header);
            let line = corrupt(dir.path(), DiskFile::SnapshotHeader, mode, &mut rng).unwrap();
            let after = std::fs::read(&path).unwrap();
            let h = header as usize;
            assert_eq!(after.len(), before.len(), "{line}");
            assert_ne!(
                after[..h],
                before[..h],
                "{mode:?} left the header unchanged: {line}"
            );
            assert_eq!(after[h..], before[h..], "{mode:?} damaged the body: {line}");
        }
        let (path, header) = fake_snapshot(dir.path(), 40, 20_000);
        let line = corrupt(dir.path(), DiskFile::SnapshotHeader, DiskMode::Truncate, &mut rng).unwrap();
        assert!(std::fs::metadata(&path).unwrap().len() < header, "{line}");
        assert!(line.contains("header"), "{line}");
    }

    #[test]
    fn snapshot_body_damage_leaves_the_header_intact() {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = StdRng::seed_from_u64(5);
        for mode in [DiskMode::Bitflip, DiskMode::ZeroPage, DiskMode::Truncate] {
            let (path, header) = fake_snapshot(dir.path(), 40, 20_000);
            let before = std::fs::read(&path).unwrap();
            let line = corrupt(dir.path(), DiskFile::SnapshotBody, mode, &mut rng).unwrap();
            let after = std::fs::read(&path).unwrap();
            let h = header as usize;
            assert_eq!(after[..h], before[..h], "{mode:?} damaged the header: {line}");
            assert_ne!(after, before, "{mode:?} changed nothing: {line}");
            assert!(after.len() > h, "{mode:?} cut into the header: {line}");
            assert!(line.contains("body"), "{line}");
        }
    }

    #[test]
    fn missing_snapshot_file_is_an_error_not_a_silent_success() {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = StdRng::seed_from_u64(6);
        let e = corrupt(dir.path(), DiskFile::SnapshotBody, DiskMode::Bitflip, &mut rng).unwrap_err();
        assert!(e.contains("no snapshot file"), "{e}");
    }
}
