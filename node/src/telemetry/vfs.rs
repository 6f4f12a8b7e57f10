//! A file layer that measures what goes through it: bytes written and the duration of each
//! fdatasync. The node opens the log (`ftkv_disk_wal_fsync_duration_seconds`) and the fractal
//! engine (bytes written, for the write amplification) through it.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ftkv_vfs::{Vfs, VfsFile};

/// What one metered file layer counted.
#[derive(Debug)]
pub struct DiskMeter {
    bytes_written: AtomicU64,
    written_total: metrics::Counter,
    fsync_duration: metrics::Histogram,
}

impl DiskMeter {
    /// A meter that reports its writes to the counter `written_total_name` and each fdatasync
    /// to the histogram `fsync_duration_name` (seconds).
    pub fn new(written_total_name: &'static str, fsync_duration_name: &'static str) -> Arc<Self> {
        Arc::new(DiskMeter {
            bytes_written: AtomicU64::new(0),
            written_total: metrics::counter!(written_total_name),
            fsync_duration: metrics::histogram!(fsync_duration_name),
        })
    }

    /// Bytes written through the layer since it was made.
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written.load(Ordering::Relaxed)
    }

    fn wrote(&self, bytes: u64) {
        self.bytes_written.fetch_add(bytes, Ordering::Relaxed);
        self.written_total.increment(bytes);
    }
}

/// `inner` with every file write counted and every `sync_data` timed by `meter`.
#[derive(Debug)]
pub struct MeteredVfs {
    inner: Arc<dyn Vfs>,
    meter: Arc<DiskMeter>,
}

impl MeteredVfs {
    /// Wraps `inner`.
    pub fn wrap(inner: Arc<dyn Vfs>, meter: Arc<DiskMeter>) -> Arc<dyn Vfs> {
        Arc::new(MeteredVfs { inner, meter })
    }
}

impl Vfs for MeteredVfs {
    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.inner.create_dir_all(path)
    }

    fn open(&self, path: &Path, create: bool) -> io::Result<Arc<dyn VfsFile>> {
        let file = self.inner.open(path, create)?;
        Ok(Arc::new(MeteredFile {
            inner: file,
            meter: self.meter.clone(),
        }))
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        self.inner.remove_file(path)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.inner.rename(from, to)
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

#[derive(Debug)]
struct MeteredFile {
    inner: Arc<dyn VfsFile>,
    meter: Arc<DiskMeter>,
}

impl VfsFile for MeteredFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        self.inner.read_at(buf, offset)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_exact_at(buf, offset)
    }

    fn write_all_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_all_at(buf, offset)?;
        self.meter.wrote(buf.len() as u64);
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let started = std::time::Instant::now();
        let result = self.inner.sync_data();
        self.meter.fsync_duration.record(started.elapsed());
        result
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.inner.set_len(len)
    }

    fn len(&self) -> io::Result<u64> {
        self.inner.len()
    }

    fn is_empty(&self) -> io::Result<bool> {
        self.inner.is_empty()
    }

    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.punch_hole(offset, len)
    }

    fn advise_random(&self) -> io::Result<()> {
        self.inner.advise_random()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_writes_and_passes_data_through() {
        let dir = tempfile::tempdir().expect("tempdir");
        let meter = DiskMeter::new("test_written_bytes_total", "test_fsync_duration_seconds");
        let vfs = MeteredVfs::wrap(ftkv_vfs::RealVfs::new(), meter.clone());
        let path = dir.path().join("f");
        let file = vfs.open(&path, true).expect("open");
        file.write_all_at(b"hello", 0).expect("write");
        file.write_all_at(b"!!", 5).expect("write");
        file.sync_data().expect("sync");
        assert_eq!(meter.bytes_written(), 7);
        let mut buf = [0u8; 7];
        file.read_exact_at(&mut buf, 0).expect("read");
        assert_eq!(&buf, b"hello!!");
        assert_eq!(std::fs::read(&path).expect("read back"), b"hello!!");
    }
}
