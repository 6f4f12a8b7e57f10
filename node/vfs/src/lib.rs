//! File-system seam for ftkv's log and engine.
//!
//! Every byte ftkv puts on disk goes through [`Vfs`] / [`VfsFile`], so crash and fault tests can swap
//! the real file system ([`RealVfs`]) for an in-memory one that keeps the *written* image apart from
//! the *durable* image ([`FaultVfs`]). The design follows redb's `StorageBackend` seam and its
//! `tests/crash_consistency.rs`, and the "fault-injecting file layer" of ftkv's TESTING.md.
//!
//! # Durability model (what callers may assume, and what `FaultVfs` simulates)
//!
//! This is the POSIX/Linux (ext4, xfs) contract, taken pessimistically:
//!
//! * `write_all_at` / `set_len` / `punch_hole` change the file's *current* contents at once (every
//!   handle sees them) but are **not durable**: a power loss may drop them.
//! * `VfsFile::sync_data` (fdatasync) makes the file's current contents *and length* durable.
//! * A file's *name* is a directory entry: creating a file, `rename` and `remove_file` change the
//!   namespace at once but are only durable after `Vfs::sync_dir` of the parent directory. A file
//!   whose contents were synced but whose creating directory was never synced can vanish after a
//!   crash. A rename whose parent was not synced is forgotten (the old name comes back).
//! * A crash may tear the last write in flight: a prefix of it cut at a 512-byte sector boundary
//!   reaches the disk, or its last sector holds garbage. Earlier unsynced writes are dropped.
//! * Simplification: directories made by `create_dir_all` are durable at once in `FaultVfs`
//!   (callers do not need to sync a grandparent directory).
//!
//! [`FaultVfs::crash`] applies exactly this model; [`FaultVfs::fail_after`] and
//! [`FaultVfs::set_crash_point`] make operations fail, to test error paths and to pick crash points.
//! [`FaultVfs::set_capacity`] makes it a small disk: a write or `set_len` that would grow the
//! files past the capacity fails with `ENOSPC` (and nothing changes), until space is freed.
//!
//! [`UnsyncedBufferVfs`] (TEST ONLY) runs over a real file system but keeps every write since a
//! file's last `sync_data` in process memory, so that a SIGKILL of the process loses exactly what
//! was not fsynced, as a power cut would (the fault harness's `lose-unsynced` nemesis).

#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::host_endian_bytes,
    clippy::big_endian_bytes
)]
#![cfg_attr(
    test,
    allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod unsynced;
pub use unsynced::{UnsyncedBufferVfs, UnsyncedFile, OVERLAY_PAGE_BYTES};

/// Sector size the fault layer tears writes at (bytes).
pub const SECTOR_SIZE_BYTES: u64 = 512;

/// A file system: the namespace operations ftkv needs.
///
/// Paths are ordinary `Path`s; implementations must be thread safe.
pub trait Vfs: Send + Sync + Debug + 'static {
    /// Creates `path` and all missing parents (like `mkdir -p`).
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// Opens `path` for read+write; `create`: create it (empty) if missing, else `NotFound`.
    /// A newly created name is durable only after `sync_dir(parent)`.
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn VfsFile>>;
    /// Removes a file name (open handles stay usable). Durable after `sync_dir(parent)`.
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    /// Atomically renames `from` to `to`, replacing `to`. Durable only after `sync_dir(parent)`.
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes the directory entries of `path` (creates, renames, removes) durable (fsync on the dir).
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
    /// The regular files directly inside `path` (full paths, sorted; subdirectories omitted).
    fn list_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>>;
    /// Whether `path` names an existing file or directory.
    fn exists(&self, path: &Path) -> bool;
}

/// An open file with positional I/O (`pread`/`pwrite`; no shared cursor).
pub trait VfsFile: Send + Sync + Debug {
    /// Reads up to `buf.len()` bytes at `offset`; returns the count (0 at or past end of file).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// Fills `buf` from `offset`; `UnexpectedEof` if the file ends first.
    fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.read_at(buf, offset) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "file ended before buffer filled",
                    ))
                }
                Ok(n) => {
                    buf = buf.get_mut(n..).ok_or_else(|| {
                        io::Error::other(format!("read_at returned {n} bytes, more than asked"))
                    })?;
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
    /// Writes all of `buf` at `offset`, extending the file (with zeros in any gap). Not durable
    /// until `sync_data`.
    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// fdatasync: the contents and length become durable.
    fn sync_data(&self) -> io::Result<()>;
    /// Sets the length (truncating or zero-extending). Not durable until `sync_data`.
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Current length in bytes.
    fn len(&self) -> io::Result<u64>;
    /// Whether the file is empty.
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// Zeroes `[offset, offset+len)` without changing the file length, releasing the space where
    /// supported (`fallocate(PUNCH_HOLE|KEEP_SIZE)`), else by writing zeros. Not durable until sync.
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Hints that reads will be random (`posix_fadvise(POSIX_FADV_RANDOM)`: no readahead), so a
    /// small read does not pull in pages around it. A hint only: the default does nothing.
    fn advise_random(&self) -> io::Result<()> {
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// RealVfs
// ---------------------------------------------------------------------------------------------

/// The real file system: `std::fs` with positional I/O, fdatasync and `fallocate` hole punching.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealVfs;

impl RealVfs {
    /// A shareable handle.
    pub fn new() -> Arc<Self> {
        Arc::new(RealVfs)
    }
}

/// A file of [`RealVfs`].
#[derive(Debug)]
pub struct RealFile {
    file: File,
    path: PathBuf,
}

impl RealFile {
    /// The path this file was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Vfs for RealVfs {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }

    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn VfsFile>> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(create)
            .open(path)?;
        Ok(Arc::new(RealFile {
            file,
            path: path.to_path_buf(),
        }))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(path)? {
            let entry = entry?;
            if entry.file_type()?.is_file() {
                out.push(entry.path());
            }
        }
        out.sort();
        Ok(out)
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }
}

impl RealFile {
    fn zero_fill(&self, offset: u64, len: u64) -> io::Result<()> {
        const CHUNK: u64 = 64 * 1024;
        let zeros = vec![0u8; CHUNK.min(len) as usize];
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            let n = CHUNK.min(end - pos) as usize;
            #[allow(clippy::indexing_slicing)] // n <= CHUNK.min(len) = zeros.len(), as end - pos <= len
            self.file.write_all_at(&zeros[..n], pos)?;
            pos += n as u64;
        }
        Ok(())
    }

    #[cfg(target_os = "linux")]
    #[allow(unsafe_code)]
    fn fallocate_punch(&self, offset: u64, len: u64) -> io::Result<bool> {
        use std::os::unix::io::AsRawFd;
        let (Ok(off), Ok(l)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "punch_hole range exceeds off_t",
            ));
        };
        // SAFETY: `fallocate` is called on a file descriptor owned by `self.file`, which stays open
        // for the whole call; it takes only integer arguments and touches no memory of ours.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off,
                l,
            )
        };
        if rc == 0 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(code) if code == libc::EOPNOTSUPP || code == libc::ENOSYS => Ok(false),
            _ => Err(err),
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn fallocate_punch(&self, _offset: u64, _len: u64) -> io::Result<bool> {
        Ok(false)
    }

    #[cfg(target_os = "linux")]
    #[allow(unsafe_code)]
    fn fadvise_random(&self) -> io::Result<()> {
        use std::os::unix::io::AsRawFd;
        // SAFETY: `posix_fadvise` is called on a file descriptor owned by `self.file`, which stays
        // open for the whole call; it takes only integer arguments and touches no memory of ours.
        let rc = unsafe { libc::posix_fadvise(self.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::from_raw_os_error(rc))
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn fadvise_random(&self) -> io::Result<()> {
        Ok(())
    }
}

impl VfsFile for RealFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.file.read_at(buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn advise_random(&self) -> io::Result<()> {
        self.fadvise_random()
    }

    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        let file_len = self.len()?;
        if offset >= file_len || len == 0 {
            return Ok(());
        }
        let len = len.min(file_len - offset);
        if self.fallocate_punch(offset, len)? {
            return Ok(());
        }
        self.zero_fill(offset, len)
    }
}

// ---------------------------------------------------------------------------------------------
// FaultVfs
// ---------------------------------------------------------------------------------------------

type InodeId = u64;

/// One unsynced write, remembered so a crash can tear it.
#[derive(Debug, Clone)]
struct PendingWrite {
    offset: u64,
    data: Vec<u8>,
}

#[derive(Debug, Default)]
struct Inode {
    /// What every handle reads now.
    current: Vec<u8>,
    /// What survives a crash.
    durable: Vec<u8>,
    /// Writes since the last sync, oldest first.
    pending: Vec<PendingWrite>,
}

struct FaultState {
    rng: StdRng,
    /// Bumped by every crash; handles of older epochs fail.
    epoch: u64,
    next_inode: InodeId,
    inodes: HashMap<InodeId, Inode>,
    /// The namespace every caller sees now.
    names: BTreeMap<PathBuf, InodeId>,
    /// The namespace that survives a crash.
    durable_names: BTreeMap<PathBuf, InodeId>,
    /// Directories (durable at once; see the crate docs).
    dirs: BTreeSet<PathBuf>,
    /// Count of mutating operations so far.
    op_count: u64,
    /// Operations fail once `op_count` reaches this.
    fail_at: Option<u64>,
    /// Set once a fault has tripped: every operation fails until `crash` or `fail_after(None)`.
    tripped: bool,
    /// Most bytes the named files may hold together; growing past it fails with `ENOSPC`.
    capacity_bytes: Option<u64>,
}

/// An in-memory file system that keeps the written image apart from the durable image, for crash
/// and fault tests (used by other crates' tests too, so it is not `cfg(test)`).
///
/// See the crate docs for the durability model. Mutating operations (`write_all_at`, `sync_data`,
/// `set_len`, `punch_hole`, `rename`, `remove_file`, `sync_dir`, and `open` that creates a file) are
/// counted by [`op_count`](FaultVfs::op_count); faults trip on that count.
pub struct FaultVfs {
    state: Arc<Mutex<FaultState>>,
}

/// A handle to a [`FaultVfs`] file. Invalid (every call errors) after [`FaultVfs::crash`].
pub struct FaultFile {
    state: Arc<Mutex<FaultState>>,
    inode: InodeId,
    epoch: u64,
    path: PathBuf,
}

fn injected(what: &str) -> io::Error {
    io::Error::other(format!("injected I/O fault ({what})"))
}

fn stale() -> io::Error {
    io::Error::other("stale file handle: the fault file system crashed since this file was opened")
}

fn parent_of(path: &Path) -> PathBuf {
    path.parent().map(Path::to_path_buf).unwrap_or_default()
}

fn write_into(image: &mut Vec<u8>, offset: u64, data: &[u8]) {
    let start = offset as usize;
    let end = start + data.len();
    if image.len() < end {
        image.resize(end, 0);
    }
    if let Some(dst) = image.get_mut(start..end) {
        dst.copy_from_slice(data);
    }
}

impl FaultState {
    /// Checks the fault triggers for a mutating op; counts it when it may proceed.
    fn begin_mutation(&mut self, what: &str) -> io::Result<()> {
        self.check_tripped(what)?;
        if let Some(at) = self.fail_at {
            if self.op_count >= at {
                self.tripped = true;
                return Err(injected(what));
            }
        }
        self.op_count += 1;
        Ok(())
    }

    fn check_tripped(&self, what: &str) -> io::Result<()> {
        if self.tripped {
            Err(injected(what))
        } else {
            Ok(())
        }
    }

    /// Bytes held by the files that have a name now (each inode once).
    fn used_bytes(&self) -> u64 {
        let named: BTreeSet<InodeId> = self.names.values().copied().collect();
        named
            .iter()
            .filter_map(|id| self.inodes.get(id))
            .map(|i| i.current.len() as u64)
            .sum()
    }

    /// `ENOSPC` when growing `inode` to `new_len` bytes would pass the capacity.
    fn check_space(&self, inode: InodeId, new_len: u64) -> io::Result<()> {
        let Some(capacity) = self.capacity_bytes else {
            return Ok(());
        };
        let current = self.inodes.get(&inode).map_or(0, |i| i.current.len() as u64);
        if new_len <= current {
            return Ok(());
        }
        if self.used_bytes() + (new_len - current) > capacity {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        Ok(())
    }

    fn dir_exists(&self, dir: &Path) -> bool {
        dir.as_os_str().is_empty() || self.dirs.contains(dir)
    }
}

impl FaultVfs {
    /// A new empty file system; `seed` drives every random choice (torn-write shapes).
    pub fn new(seed: u64) -> Arc<Self> {
        Arc::new(FaultVfs {
            state: Arc::new(Mutex::new(FaultState {
                rng: StdRng::seed_from_u64(seed),
                epoch: 0,
                next_inode: 1,
                inodes: HashMap::new(),
                names: BTreeMap::new(),
                durable_names: BTreeMap::new(),
                dirs: BTreeSet::new(),
                op_count: 0,
                fail_at: None,
                tripped: false,
                capacity_bytes: None,
            })),
        })
    }

    /// Simulates power loss: every file reverts to its durable image (bytes written but not synced
    /// are dropped), creates/renames/removes not followed by `sync_dir` of the parent are forgotten;
    /// with `torn`, the last unsynced write of a random surviving file is kept partially (a prefix
    /// cut at a 512-byte boundary, or the whole write with random garbage in its last sector).
    /// All open handles become invalid afterwards (reopen through this `FaultVfs`). Fault triggers
    /// (`fail_after`, `set_crash_point`) are cleared: the machine restarts healthy.
    pub fn crash(&self, torn: bool) {
        let mut st = self.state.lock();
        let st = &mut *st;
        st.epoch += 1;
        st.names = st.durable_names.clone();
        let live: BTreeSet<InodeId> = st.names.values().copied().collect();
        st.inodes.retain(|id, _| live.contains(id));
        if torn {
            let candidates: Vec<InodeId> = {
                let mut v: Vec<InodeId> = st
                    .inodes
                    .iter()
                    .filter(|(_, i)| !i.pending.is_empty())
                    .map(|(id, _)| *id)
                    .collect();
                v.sort_unstable();
                v
            };
            if !candidates.is_empty() {
                #[allow(clippy::indexing_slicing)] // gen_range(0..len) of a non-empty Vec
                let pick = candidates[st.rng.gen_range(0..candidates.len())];
                let garbage_mode = st.rng.gen_bool(0.5);
                if let Some(inode) = st.inodes.get_mut(&pick) {
                    if let Some(w) = inode.pending.last().cloned() {
                        Self::tear_into(&mut st.rng, &mut inode.durable, &w, garbage_mode);
                    }
                }
            }
        }
        for inode in st.inodes.values_mut() {
            inode.current = inode.durable.clone();
            inode.pending.clear();
        }
        st.fail_at = None;
        st.tripped = false;
    }

    fn tear_into(rng: &mut StdRng, durable: &mut Vec<u8>, w: &PendingWrite, garbage_mode: bool) {
        let start = w.offset;
        let end = w.offset + w.data.len() as u64;
        if end == start {
            return;
        }
        if garbage_mode {
            write_into(durable, start, &w.data);
            let last_sector_start = ((end - 1) / SECTOR_SIZE_BYTES * SECTOR_SIZE_BYTES).max(start);
            let garbage: Vec<u8> = (last_sector_start..end).map(|_| rng.gen()).collect();
            write_into(durable, last_sector_start, &garbage);
        } else {
            // Cut points: the write's start, every sector boundary inside it, its end.
            let mut cuts = vec![start];
            let mut b = (start / SECTOR_SIZE_BYTES + 1) * SECTOR_SIZE_BYTES;
            while b < end {
                cuts.push(b);
                b += SECTOR_SIZE_BYTES;
            }
            cuts.push(end);
            #[allow(clippy::indexing_slicing)] // gen_range(0..len) of a non-empty Vec
            let cut = cuts[rng.gen_range(0..cuts.len())];
            let keep = (cut - start) as usize;
            #[allow(clippy::indexing_slicing)] // start <= cut <= end = start + w.data.len()
            write_into(durable, start, &w.data[..keep]);
        }
    }

    /// Makes every operation (reads included) fail with an I/O error after `n` more successful
    /// mutating operations; `None` disarms and clears a tripped fault.
    pub fn fail_after(&self, n: Option<u64>) {
        let mut st = self.state.lock();
        st.fail_at = n.map(|n| st.op_count + n);
        if n.is_none() {
            st.tripped = false;
        }
    }

    /// Crash-point hook: once `op_count` reaches `at` (absolute), that operation and every later
    /// one fail, as if power was lost at that moment; call [`crash`](Self::crash) afterwards to
    /// "reboot". `None` disarms.
    pub fn set_crash_point(&self, at: Option<u64>) {
        let mut st = self.state.lock();
        st.fail_at = at;
        if at.is_none() {
            st.tripped = false;
        }
    }

    /// Makes the file system a disk of `bytes` (`None`: unlimited): a `write_all_at` or
    /// `set_len` that would grow the named files past it fails with `ENOSPC` and changes
    /// nothing. Not sticky (unlike [`fail_after`](Self::fail_after)): it succeeds again once
    /// files shrink or are removed, or the capacity is raised. Survives [`crash`](Self::crash).
    pub fn set_capacity(&self, bytes: Option<u64>) {
        self.state.lock().capacity_bytes = bytes;
    }

    /// Bytes held now by the files that have a name (what [`set_capacity`](Self::set_capacity)
    /// counts).
    pub fn used_bytes(&self) -> u64 {
        self.state.lock().used_bytes()
    }

    /// Whether a fault has tripped (operations are failing).
    pub fn is_tripped(&self) -> bool {
        self.state.lock().tripped
    }

    /// Mutating operations counted so far (see the type docs), to pick random crash points.
    pub fn op_count(&self) -> u64 {
        self.state.lock().op_count
    }

    /// Test helper: overwrites bytes of `path` in both the current and durable images, bypassing
    /// faults and counters (to plant corruption). Extends the file with zeros if needed.
    pub fn inject_bytes(&self, path: &Path, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut st = self.state.lock();
        let id = *st
            .names
            .get(path)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        let inode = st
            .inodes
            .get_mut(&id)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        write_into(&mut inode.current, offset, data);
        write_into(&mut inode.durable, offset, data);
        Ok(())
    }

    /// Test helper: sets the length of `path` in both images, bypassing faults and counters.
    pub fn inject_len(&self, path: &Path, len: u64) -> io::Result<()> {
        let mut st = self.state.lock();
        let id = *st
            .names
            .get(path)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        let inode = st
            .inodes
            .get_mut(&id)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        inode.current.resize(len as usize, 0);
        inode.durable.resize(len as usize, 0);
        Ok(())
    }

    /// Test helper: the durable length of `path` (None if its name is not durable).
    pub fn durable_len(&self, path: &Path) -> Option<u64> {
        let st = self.state.lock();
        let id = st.durable_names.get(path)?;
        st.inodes.get(id).map(|i| i.durable.len() as u64)
    }
}

impl Vfs for FaultVfs {
    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn VfsFile>> {
        let mut st = self.state.lock();
        st.check_tripped("open")?;
        let id = match st.names.get(path) {
            Some(id) => *id,
            None => {
                if st.dirs.contains(path) {
                    return Err(io::Error::new(io::ErrorKind::IsADirectory, "open of a directory"));
                }
                if !create {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("{} not found", path.display()),
                    ));
                }
                if !st.dir_exists(&parent_of(path)) {
                    return Err(io::Error::new(
                        io::ErrorKind::NotFound,
                        "parent directory missing",
                    ));
                }
                st.begin_mutation("create")?;
                let id = st.next_inode;
                st.next_inode += 1;
                st.inodes.insert(id, Inode::default());
                st.names.insert(path.to_path_buf(), id);
                id
            }
        };
        let epoch = st.epoch;
        Ok(Arc::new(FaultFile {
            state: Arc::clone(&self.state),
            inode: id,
            epoch,
            path: path.to_path_buf(),
        }))
    }
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        st.check_tripped("create_dir_all")?;
        let mut p = PathBuf::new();
        for comp in path.components() {
            p.push(comp);
            if st.names.contains_key(&p) {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "a file is in the way",
                ));
            }
            st.dirs.insert(p.clone());
        }
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        st.check_tripped("remove_file")?;
        if !st.names.contains_key(path) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} not found", path.display()),
            ));
        }
        st.begin_mutation("remove_file")?;
        st.names.remove(path);
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        st.check_tripped("rename")?;
        let Some(id) = st.names.get(from).copied() else {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("{} not found", from.display()),
            ));
        };
        if !st.dir_exists(&parent_of(to)) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "target directory missing",
            ));
        }
        if st.dirs.contains(to) {
            return Err(io::Error::new(
                io::ErrorKind::IsADirectory,
                "rename onto a directory",
            ));
        }
        st.begin_mutation("rename")?;
        st.names.remove(from);
        st.names.insert(to.to_path_buf(), id);
        Ok(())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut st = self.state.lock();
        st.check_tripped("sync_dir")?;
        if !st.dir_exists(path) {
            return Err(io::Error::new(io::ErrorKind::NotFound, "directory missing"));
        }
        st.begin_mutation("sync_dir")?;
        let st = &mut *st;
        st.durable_names.retain(|p, _| parent_of(p) != path);
        for (p, id) in st.names.iter() {
            if parent_of(p) == path {
                st.durable_names.insert(p.clone(), *id);
            }
        }
        Ok(())
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        let st = self.state.lock();
        st.check_tripped("list_dir")?;
        if !st.dir_exists(path) {
            return Err(io::Error::new(io::ErrorKind::NotFound, "directory missing"));
        }
        Ok(st
            .names
            .keys()
            .filter(|p| parent_of(p) == path)
            .cloned()
            .collect())
    }

    fn exists(&self, path: &Path) -> bool {
        let st = self.state.lock();
        st.names.contains_key(path) || st.dirs.contains(path)
    }
}

impl Debug for FaultVfs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.state.lock();
        f.debug_struct("FaultVfs")
            .field("epoch", &st.epoch)
            .field("files", &st.names.len())
            .field("op_count", &st.op_count)
            .field("fail_at", &st.fail_at)
            .field("tripped", &st.tripped)
            .finish()
    }
}

impl Debug for FaultFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultFile")
            .field("path", &self.path)
            .field("inode", &self.inode)
            .field("epoch", &self.epoch)
            .finish()
    }
}

impl FaultFile {
    fn with_inode<R>(&self, mutation: Option<&str>, f: impl FnOnce(&mut Inode) -> R) -> io::Result<R> {
        self.with_inode_growing(mutation, None, f)
    }

    /// [`with_inode`](Self::with_inode) for an operation that leaves the file `grow_to` bytes
    /// long (at least): `ENOSPC` first when that passes the capacity.
    fn with_inode_growing<R>(
        &self,
        mutation: Option<&str>,
        grow_to: Option<u64>,
        f: impl FnOnce(&mut Inode) -> R,
    ) -> io::Result<R> {
        let mut st = self.state.lock();
        if st.epoch != self.epoch {
            return Err(stale());
        }
        match mutation {
            Some(what) => st.begin_mutation(what)?,
            None => st.check_tripped("read")?,
        }
        if let Some(len) = grow_to {
            st.check_space(self.inode, len)?;
        }
        let inode = st.inodes.get_mut(&self.inode).ok_or_else(stale)?;
        Ok(f(inode))
    }

    /// The path this file was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl VfsFile for FaultFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.with_inode(None, |inode| {
            let len = inode.current.len() as u64;
            if offset >= len {
                return 0;
            }
            let n = (len - offset).min(buf.len() as u64) as usize;
            let start = offset as usize;
            match (buf.get_mut(..n), inode.current.get(start..start + n)) {
                (Some(dst), Some(src)) => {
                    dst.copy_from_slice(src);
                    n
                }
                _ => 0,
            }
        })
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.with_inode_growing(Some("write"), Some(offset + buf.len() as u64), |inode| {
            write_into(&mut inode.current, offset, buf);
            inode.pending.push(PendingWrite {
                offset,
                data: buf.to_vec(),
            });
        })
    }

    fn sync_data(&self) -> io::Result<()> {
        self.with_inode(Some("sync_data"), |inode| {
            inode.durable = inode.current.clone();
            inode.pending.clear();
        })
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.with_inode_growing(Some("set_len"), Some(len), |inode| {
            inode.current.resize(len as usize, 0);
        })
    }

    fn len(&self) -> io::Result<u64> {
        self.with_inode(None, |inode| inode.current.len() as u64)
    }

    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        self.with_inode(Some("punch_hole"), |inode| {
            let file_len = inode.current.len() as u64;
            if offset < file_len {
                let end = offset.saturating_add(len).min(file_len) as usize;
                if let Some(hole) = inode.current.get_mut(offset as usize..end) {
                    hole.fill(0);
                }
            }
        })
    }
}

#[cfg(test)]
mod tests;

/// What [`try_lock_file`] found.
#[derive(Debug)]
pub enum FileLock {
    /// This process now holds the lock (and its id is written in the file); dropping the file
    /// releases it.
    Locked(File),
    /// Another holder (this process or another) has it; the file's contents, normally the
    /// holder's process id.
    HeldBy(String),
}

/// Opens (creating it) the lock file at `path` on the real file system and takes an exclusive
/// advisory lock (`flock`) on it without waiting; on success writes this process's id into it.
/// A data directory's `LOCK` (the node's and embedded mode's), so two processes never write one
/// log or tree. Errors: `io::Error` from opening, locking or writing the file.
pub fn try_lock_file(path: &Path) -> io::Result<FileLock> {
    use std::io::Write as _;
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let holder = std::fs::read_to_string(path).unwrap_or_default();
            return Ok(FileLock::HeldBy(holder.trim().to_string()));
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(e),
    }
    file.set_len(0)?;
    write!(file, "{}", std::process::id())?;
    file.sync_all()?;
    Ok(FileLock::Locked(file))
}

/// Turns transparent huge pages off for the calling process (`prctl(PR_SET_THP_DISABLE)`, Linux;
/// inherited by child processes and kept across `exec`). For the binaries' `main`, before any
/// engine runs. mimalloc asks for huge pages on its arenas (`madvise(MADV_HUGEPAGE)`), and a 2 MiB
/// huge page stays resident while any byte of it is live, so memory of freed tree nodes and
/// message buffers was not given back. Measured on the engine bench (2 M random rows, 64 MiB
/// cache, `ftkv-bench engine-child`): peak RSS 184-213 MiB without huge pages against 225-236 MiB
/// with them, at the same insert rate. Errors: the `prctl` error (e.g. on a kernel without THP
/// control); callers only warn, since it costs memory, not correctness. On other systems it does
/// nothing.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
pub fn disable_transparent_huge_pages() -> io::Result<()> {
    // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and touches no memory of ours.
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// See the Linux version; other systems have no per-process switch, so this does nothing.
#[cfg(not(target_os = "linux"))]
pub fn disable_transparent_huge_pages() -> io::Result<()> {
    Ok(())
}

/// Whether transparent huge pages are off for the calling process (`prctl(PR_GET_THP_DISABLE)`,
/// Linux; elsewhere always `false`). Errors: the `prctl` error.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
pub fn transparent_huge_pages_disabled() -> io::Result<bool> {
    // SAFETY: PR_GET_THP_DISABLE takes integer arguments only and returns the flag.
    let rc = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc == 1)
    }
}

/// See the Linux version.
#[cfg(not(target_os = "linux"))]
pub fn transparent_huge_pages_disabled() -> io::Result<bool> {
    Ok(false)
}
