//! [`UnsyncedBufferVfs`]: a file layer that keeps every write since a file's last `sync_data` in
//! process memory, so that killing the process loses exactly what was not fsynced (TEST ONLY).
//!
//! The real file system keeps written-but-unsynced data in the kernel page cache, where it
//! survives a SIGKILL of the process; only a power cut loses it. The fault harness (`ftkv-jepsen`,
//! nemesis `lose-unsynced`) needs the power-cut behaviour from a plain `kill -9`, so a node started
//! with `--unsafe-lose-unsynced-on-kill` opens its files through this layer:
//!
//! * `write_all_at`, `set_len` and `punch_hole` change an in-memory overlay of the file (4 KiB
//!   pages plus a logical length); every handle of the same file reads the overlay at once.
//! * `sync_data` writes the overlay to the real file (length first, then the dirty pages), calls
//!   the real `sync_data` (fdatasync) and drops the overlay. With a simulated sync latency
//!   ([`UnsyncedBufferVfs::with_sync_latency`]) a `sync_data` of a dirty file first sleeps that
//!   long (writes keep landing in the overlay meanwhile and are included): the virtual disks of
//!   test machines fdatasync in about 0.1 ms, which leaves a node that acknowledges before fsync
//!   almost no window in which a kill can lose an acknowledged write; a real disk takes 1-10 ms.
//! * Namespace operations (`open` with create, `rename`, `remove_file`, `create_dir_all`,
//!   `sync_dir`) go straight to the inner file system: a kill does not undo them. Lost directory
//!   entries and torn writes are not modelled here (the `disk` nemesis and [`crate::FaultVfs`]
//!   cover those); a kill loses every unsynced write whole.
//!
//! Memory: the overlay of a file grows with the bytes written to it since its last sync (rounded
//! up to 4 KiB pages) and is not bounded; callers that never sync a file keep all of it in memory.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::{RealVfs, Vfs, VfsFile};

/// Overlay page size (bytes).
pub const OVERLAY_PAGE_BYTES: u64 = 4096;

/// The in-memory state of one file since its last sync.
#[derive(Debug)]
struct Overlay {
    /// Logical length (what `len` reports).
    len: u64,
    /// Bytes of the real file that still hold current data: below this offset, pages not in
    /// `pages` read from the real file; at or above it they read as zeros (a `set_len` cut them
    /// since the last sync). Invariant: `base_len <= len`.
    base_len: u64,
    /// Dirty pages by page index, each `OVERLAY_PAGE_BYTES` long; bytes at or past `len` are zero.
    pages: BTreeMap<u64, Box<[u8]>>,
    /// Whether anything changed since the last sync.
    dirty: bool,
}

/// One file: the real handle plus its overlay, shared by every handle opened on that file.
#[derive(Debug)]
struct BufferedFile {
    real: Arc<dyn VfsFile>,
    overlay: RwLock<Overlay>,
    /// Simulated latency of a `sync_data` of a dirty file.
    sync_latency: Duration,
}

/// A file system that delays every data write until `sync_data` (see the module docs).
pub struct UnsyncedBufferVfs {
    inner: Arc<dyn Vfs>,
    /// Simulated latency of a `sync_data` of a dirty file.
    sync_latency: Duration,
    /// Files by current name (renames move entries; removes drop them).
    files: Mutex<HashMap<PathBuf, Arc<BufferedFile>>>,
}

/// A handle of an [`UnsyncedBufferVfs`] file.
pub struct UnsyncedFile {
    file: Arc<BufferedFile>,
    path: PathBuf,
}

impl UnsyncedBufferVfs {
    /// The layer over `inner` (the file system the synced bytes go to), no simulated latency.
    pub fn new(inner: Arc<dyn Vfs>) -> Arc<Self> {
        Self::with_sync_latency(inner, Duration::ZERO)
    }

    /// The layer over `inner` where a `sync_data` of a file with unsynced changes first sleeps
    /// `sync_latency` (a slow disk; see the module docs).
    pub fn with_sync_latency(inner: Arc<dyn Vfs>, sync_latency: Duration) -> Arc<Self> {
        Arc::new(UnsyncedBufferVfs {
            inner,
            sync_latency,
            files: Mutex::new(HashMap::new()),
        })
    }

    /// The layer over the real file system ([`RealVfs`]) with a simulated sync latency.
    pub fn over_real(sync_latency: Duration) -> Arc<Self> {
        Self::with_sync_latency(RealVfs::new(), sync_latency)
    }

    /// Bytes held in overlays (unsynced pages) across every known file.
    pub fn unsynced_bytes(&self) -> u64 {
        self.files
            .lock()
            .values()
            .map(|f| f.overlay.read().pages.len() as u64 * OVERLAY_PAGE_BYTES)
            .sum()
    }
}

impl Debug for UnsyncedBufferVfs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UnsyncedBufferVfs")
            .field("inner", &self.inner)
            .field("files", &self.files.lock().len())
            .finish()
    }
}

impl Vfs for UnsyncedBufferVfs {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }

    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn VfsFile>> {
        let mut files = self.files.lock();
        // Forget files nobody holds and that have nothing unsynced (their real handle closes).
        files.retain(|_, f| Arc::strong_count(f) > 1 || f.overlay.read().dirty);
        let file = match files.get(path) {
            Some(f) => Arc::clone(f),
            None => {
                let real = self.inner.open(path, create)?;
                let len = real.len()?;
                let f = Arc::new(BufferedFile {
                    real,
                    sync_latency: self.sync_latency,
                    overlay: RwLock::new(Overlay {
                        len,
                        base_len: len,
                        pages: BTreeMap::new(),
                        dirty: false,
                    }),
                });
                files.insert(path.to_path_buf(), Arc::clone(&f));
                f
            }
        };
        Ok(Arc::new(UnsyncedFile {
            file,
            path: path.to_path_buf(),
        }))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut files = self.files.lock();
        self.inner.remove_file(path)?;
        files.remove(path);
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut files = self.files.lock();
        self.inner.rename(from, to)?;
        files.remove(to);
        if let Some(f) = files.remove(from) {
            files.insert(to.to_path_buf(), f);
        }
        Ok(())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.inner.sync_dir(path)
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<PathBuf>> {
        self.inner.list_dir(path)
    }

    fn exists(&self, path: &Path) -> bool {
        self.inner.exists(path)
    }
}

impl Debug for UnsyncedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ov = self.file.overlay.read();
        f.debug_struct("UnsyncedFile")
            .field("path", &self.path)
            .field("len", &ov.len)
            .field("unsynced_pages", &ov.pages.len())
            .finish()
    }
}

impl UnsyncedFile {
    /// The path this file was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Fills `dst` with the base bytes at `offset`: the real file below `base_len`, zeros above.
fn read_base(real: &dyn VfsFile, base_len: u64, dst: &mut [u8], offset: u64) -> io::Result<()> {
    let real_part = base_len.saturating_sub(offset).min(dst.len() as u64) as usize;
    let (from_real, zeros) = dst.split_at_mut(real_part);
    let mut rest = from_real;
    while !rest.is_empty() {
        let n = real.read_at(rest, offset + (real_part - rest.len()) as u64)?;
        if n == 0 {
            // The real file is shorter than the base claims (changed behind our back): zeros.
            rest.fill(0);
            break;
        }
        rest = rest.get_mut(n..).ok_or_else(|| out_of_range("read_at count"))?;
    }
    zeros.fill(0);
    Ok(())
}

/// A span outside the buffer it should lie in (an overlay bookkeeping bug, not bad input).
fn out_of_range(what: &str) -> io::Error {
    io::Error::other(format!("unsynced overlay: {what} out of range"))
}

fn overflow() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "offset + length overflows u64")
}

impl Overlay {
    /// The page `index`, loaded from the base when not yet dirty.
    fn page_mut(&mut self, real: &dyn VfsFile, index: u64) -> io::Result<&mut [u8]> {
        let base_len = self.base_len;
        match self.pages.entry(index) {
            std::collections::btree_map::Entry::Occupied(e) => Ok(e.into_mut()),
            std::collections::btree_map::Entry::Vacant(v) => {
                let mut page = vec![0u8; OVERLAY_PAGE_BYTES as usize].into_boxed_slice();
                read_base(real, base_len, &mut page, index * OVERLAY_PAGE_BYTES)?;
                Ok(v.insert(page))
            }
        }
    }

    /// Copies `data` (or zeros when `None`, `len` bytes) into the pages at `offset`.
    fn write_pages(
        &mut self,
        real: &dyn VfsFile,
        offset: u64,
        data: Option<&[u8]>,
        len: u64,
    ) -> io::Result<()> {
        let end = offset.checked_add(len).ok_or_else(overflow)?;
        let mut pos = offset;
        while pos < end {
            let index = pos / OVERLAY_PAGE_BYTES;
            let in_page = (pos % OVERLAY_PAGE_BYTES) as usize;
            let take = (OVERLAY_PAGE_BYTES - in_page as u64).min(end - pos) as usize;
            let page = self.page_mut(real, index)?;
            let dst = page
                .get_mut(in_page..in_page + take)
                .ok_or_else(|| out_of_range("page span"))?;
            match data {
                Some(d) => {
                    let from = (pos - offset) as usize;
                    let src = d
                        .get(from..from + take)
                        .ok_or_else(|| out_of_range("write data"))?;
                    dst.copy_from_slice(src);
                }
                None => dst.fill(0),
            }
            pos += take as u64;
        }
        Ok(())
    }
}

impl VfsFile for UnsyncedFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let ov = self.file.overlay.read();
        if offset >= ov.len || buf.is_empty() {
            return Ok(0);
        }
        let n = (ov.len - offset).min(buf.len() as u64) as usize;
        let end = offset + n as u64;
        let mut pos = offset;
        while pos < end {
            let index = pos / OVERLAY_PAGE_BYTES;
            let dst_from = (pos - offset) as usize;
            match ov.pages.get(&index) {
                Some(page) => {
                    let in_page = (pos % OVERLAY_PAGE_BYTES) as usize;
                    let take = (OVERLAY_PAGE_BYTES - in_page as u64).min(end - pos) as usize;
                    let (Some(dst), Some(src)) = (
                        buf.get_mut(dst_from..dst_from + take),
                        page.get(in_page..in_page + take),
                    ) else {
                        return Err(out_of_range("read span"));
                    };
                    dst.copy_from_slice(src);
                    pos += take as u64;
                }
                None => {
                    // Read the base up to the next dirty page in one go.
                    let next_dirty = ov
                        .pages
                        .range(index..)
                        .next()
                        .map(|(i, _)| i * OVERLAY_PAGE_BYTES)
                        .unwrap_or(u64::MAX);
                    let run_end = end.min(next_dirty);
                    let take = (run_end - pos) as usize;
                    let dst = buf
                        .get_mut(dst_from..dst_from + take)
                        .ok_or_else(|| out_of_range("read span"))?;
                    read_base(&*self.file.real, ov.base_len, dst, pos)?;
                    pos = run_end;
                }
            }
        }
        Ok(n)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut ov = self.file.overlay.write();
        let end = offset.checked_add(buf.len() as u64).ok_or_else(overflow)?;
        ov.write_pages(&*self.file.real, offset, Some(buf), buf.len() as u64)?;
        ov.len = ov.len.max(end);
        ov.dirty = true;
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        if !self.file.sync_latency.is_zero() && self.file.overlay.read().dirty {
            std::thread::sleep(self.file.sync_latency);
        }
        let mut ov = self.file.overlay.write();
        if !ov.dirty {
            return self.file.real.sync_data();
        }
        let real = &*self.file.real;
        // Bytes past `base_len` are stale: cut them, then grow (with zeros) to the logical length.
        if real.len()? > ov.base_len {
            real.set_len(ov.base_len)?;
        }
        real.set_len(ov.len)?;
        let len = ov.len;
        for (&index, page) in &ov.pages {
            let start = index * OVERLAY_PAGE_BYTES;
            if start >= len {
                continue;
            }
            let n = (len - start).min(OVERLAY_PAGE_BYTES) as usize;
            let data = page.get(..n).ok_or_else(|| out_of_range("page"))?;
            real.write_all_at(data, start)?;
        }
        real.sync_data()?;
        ov.pages.clear();
        ov.base_len = len;
        ov.dirty = false;
        Ok(())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut ov = self.file.overlay.write();
        if len < ov.len {
            let partial = len % OVERLAY_PAGE_BYTES;
            let first_gone = len.div_ceil(OVERLAY_PAGE_BYTES);
            ov.pages.retain(|&i, _| i < first_gone);
            if partial != 0 {
                let index = len / OVERLAY_PAGE_BYTES;
                if let Some(tail) = ov
                    .pages
                    .get_mut(&index)
                    .and_then(|p| p.get_mut(partial as usize..))
                {
                    tail.fill(0);
                }
            }
            ov.base_len = ov.base_len.min(len);
        }
        ov.len = len;
        ov.dirty = true;
        Ok(())
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.overlay.read().len)
    }

    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut ov = self.file.overlay.write();
        if offset >= ov.len || len == 0 {
            return Ok(());
        }
        let len = len.min(ov.len - offset);
        ov.write_pages(&*self.file.real, offset, None, len)?;
        ov.dirty = true;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn read_all(f: &dyn VfsFile) -> Vec<u8> {
        let mut buf = vec![0u8; f.len().unwrap() as usize];
        f.read_exact_at(&mut buf, 0).unwrap();
        buf
    }

    #[test]
    fn writes_are_visible_at_once_and_on_disk_only_after_sync() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a");
        let vfs = UnsyncedBufferVfs::over_real(Duration::ZERO);
        let f = vfs.open(&path, true).unwrap();
        f.write_all_at(b"hello", 0).unwrap();
        f.write_all_at(b"world", 10_000).unwrap();
        // A second handle on the same file sees the unsynced bytes.
        let g = vfs.open(&path, false).unwrap();
        assert_eq!(g.len().unwrap(), 10_005);
        let all = read_all(&*g);
        assert_eq!(&all[..5], b"hello");
        assert!(all[5..10_000].iter().all(|&b| b == 0));
        assert_eq!(&all[10_000..], b"world");
        // The real file exists (namespace ops are immediate) but holds nothing yet.
        assert_eq!(std::fs::read(&path).unwrap(), b"");
        assert_eq!(vfs.unsynced_bytes(), 2 * OVERLAY_PAGE_BYTES);
        f.sync_data().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), all);
        assert_eq!(vfs.unsynced_bytes(), 0);
        // After a "kill" (dropping the layer and its handles) only synced bytes remain.
        f.write_all_at(b"LOST", 2).unwrap();
        f.write_all_at(b"tail", 10_005).unwrap();
        assert_eq!(&read_all(&*f)[..6], b"heLOST");
        drop((f, g, vfs));
        assert_eq!(std::fs::read(&path).unwrap(), all);
        // Reopened over the synced file: reads come from disk.
        let vfs = UnsyncedBufferVfs::over_real(Duration::ZERO);
        let f = vfs.open(&path, false).unwrap();
        assert_eq!(read_all(&*f), all);
        assert_eq!(
            vfs.open(&dir.path().join("missing"), false).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn partial_page_writes_keep_the_synced_bytes_around_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a");
        let synced: Vec<u8> = (0..20_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &synced).unwrap();
        let vfs = UnsyncedBufferVfs::over_real(Duration::ZERO);
        let f = vfs.open(&path, false).unwrap();
        f.write_all_at(&[0xAA; 100], 4090).unwrap();
        let mut want = synced.clone();
        want[4090..4190].fill(0xAA);
        assert_eq!(read_all(&*f), want);
        // A read that spans clean and dirty pages.
        let mut buf = vec![0u8; 9000];
        assert_eq!(f.read_at(&mut buf, 1000).unwrap(), 9000);
        assert_eq!(buf, want[1000..10_000]);
        assert_eq!(std::fs::read(&path).unwrap(), synced);
        f.sync_data().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), want);
    }

    #[test]
    fn set_len_truncates_and_extends_with_zeros_durably_only_after_sync() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a");
        std::fs::write(&path, vec![7u8; 10_000]).unwrap();
        let vfs = UnsyncedBufferVfs::over_real(Duration::ZERO);
        let f = vfs.open(&path, false).unwrap();
        f.write_all_at(&[9u8; 3000], 5000).unwrap();
        f.set_len(6000).unwrap();
        assert_eq!(f.len().unwrap(), 6000);
        // Extending again must not resurrect the cut bytes (neither old disk bytes nor overlay).
        f.set_len(12_000).unwrap();
        let all = read_all(&*f);
        assert_eq!(all.len(), 12_000);
        assert!(all[..5000].iter().all(|&b| b == 7));
        assert!(all[5000..6000].iter().all(|&b| b == 9));
        assert!(all[6000..].iter().all(|&b| b == 0), "cut bytes came back");
        // A write past the end leaves a zero gap.
        f.write_all_at(b"x", 13_000).unwrap();
        let all = read_all(&*f);
        assert!(all[12_000..13_000].iter().all(|&b| b == 0));
        assert_eq!(std::fs::read(&path).unwrap(), vec![7u8; 10_000]);
        f.sync_data().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), all);
        // Truncation alone is lost by a kill, and made durable by a sync.
        f.set_len(100).unwrap();
        assert_eq!(std::fs::read(&path).unwrap().len(), 13_001);
        f.sync_data().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), vec![7u8; 100]);
    }

    #[test]
    fn punch_hole_zeroes_within_the_length() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a");
        std::fs::write(&path, vec![5u8; 9000]).unwrap();
        let vfs = UnsyncedBufferVfs::over_real(Duration::ZERO);
        let f = vfs.open(&path, false).unwrap();
        f.punch_hole(100, 100_000).unwrap();
        assert_eq!(f.len().unwrap(), 9000);
        let all = read_all(&*f);
        assert!(all[..100].iter().all(|&b| b == 5) && all[100..].iter().all(|&b| b == 0));
        assert_eq!(std::fs::read(&path).unwrap(), vec![5u8; 9000]);
        f.sync_data().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), all);
    }

    #[test]
    fn rename_and_remove_carry_or_drop_the_overlay() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let vfs = UnsyncedBufferVfs::over_real(Duration::ZERO);
        let f = vfs.open(&a, true).unwrap();
        f.write_all_at(b"data", 0).unwrap();
        vfs.rename(&a, &b).unwrap();
        assert!(!vfs.exists(&a) && vfs.exists(&b));
        // The new name opens the same file, unsynced bytes included.
        let g = vfs.open(&b, false).unwrap();
        assert_eq!(read_all(&*g), b"data");
        assert_eq!(std::fs::read(&b).unwrap(), b"");
        g.sync_data().unwrap();
        assert_eq!(std::fs::read(&b).unwrap(), b"data");
        // A file created under the old name again is a new, empty file.
        let h = vfs.open(&a, true).unwrap();
        assert_eq!(h.len().unwrap(), 0);
        // Remove: the name is gone; an open handle still works; a new file under it is empty.
        g.write_all_at(b"more", 4).unwrap();
        vfs.remove_file(&b).unwrap();
        assert!(!b.exists());
        assert_eq!(read_all(&*g), b"datamore");
        let k = vfs.open(&b, true).unwrap();
        assert_eq!(k.len().unwrap(), 0);
        assert_eq!(vfs.list_dir(dir.path()).unwrap(), vec![a.clone(), b.clone()]);
        // Rename onto an existing name replaces its overlay.
        h.write_all_at(b"from-a", 0).unwrap();
        vfs.rename(&a, &b).unwrap();
        assert_eq!(read_all(&*vfs.open(&b, false).unwrap()), b"from-a");
    }

    #[test]
    fn sync_latency_delays_only_syncs_with_something_to_write() {
        let dir = tempfile::tempdir().unwrap();
        let latency = Duration::from_millis(60);
        let vfs = UnsyncedBufferVfs::over_real(latency);
        let f = vfs.open(&dir.path().join("a"), true).unwrap();
        f.write_all_at(b"x", 0).unwrap();
        let started = std::time::Instant::now();
        f.sync_data().unwrap();
        assert!(started.elapsed() >= latency);
        assert_eq!(std::fs::read(dir.path().join("a")).unwrap(), b"x");
        let started = std::time::Instant::now();
        f.sync_data().unwrap();
        assert!(started.elapsed() < latency, "a clean sync slept");
    }

    #[test]
    fn concurrent_readers_and_writers_agree() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a");
        let vfs = UnsyncedBufferVfs::over_real(Duration::ZERO);
        let f = vfs.open(&path, true).unwrap();
        std::thread::scope(|s| {
            for t in 0..4u8 {
                let f = Arc::clone(&f);
                s.spawn(move || {
                    for i in 0..200u64 {
                        let off = (u64::from(t) * 200 + i) * 1000;
                        f.write_all_at(&[t + 1; 1000], off).unwrap();
                        if i % 50 == 0 {
                            f.sync_data().unwrap();
                        }
                        let mut back = [0u8; 1000];
                        f.read_exact_at(&mut back, off).unwrap();
                        assert!(back.iter().all(|&b| b == t + 1));
                    }
                });
            }
        });
        f.sync_data().unwrap();
        let disk = std::fs::read(&path).unwrap();
        assert_eq!(disk.len(), 800_000);
        for t in 0..4u8 {
            let part = &disk[t as usize * 200_000..(t as usize + 1) * 200_000];
            assert!(part.iter().all(|&b| b == t + 1));
        }
    }
}
