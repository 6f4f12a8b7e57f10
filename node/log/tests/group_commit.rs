//! Group commit: concurrent appenders share fsyncs (real files, real fdatasync).
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Instant;

use common::{append_wait, records};
use ftkv_log::{Log, LogOptions, SyncMode};
use ftkv_vfs::{RealVfs, Vfs};

#[test]
fn concurrent_appends_share_fsyncs() {
    const THREADS: u64 = 8;
    const APPENDS_PER_THREAD: u64 = 500;
    let dir = tempfile::tempdir().unwrap();
    let vfs: Arc<dyn Vfs> = RealVfs::new();
    let log = Log::open(
        vfs,
        dir.path(),
        LogOptions {
            segment_size_bytes: 4 << 20,
            sync: SyncMode::Always,
        },
    )
    .unwrap();
    // Indexes must be contiguous, so appenders take the next index under a lock and then wait
    // for their own callback outside it: up to 8 appends are in flight at any time.
    let next = Arc::new(std::sync::Mutex::new(1u64));
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..THREADS {
            let log = log.clone();
            let next = next.clone();
            s.spawn(move || {
                for _ in 0..APPENDS_PER_THREAD {
                    let (tx, rx) = std::sync::mpsc::channel();
                    {
                        let mut n = next.lock().unwrap();
                        log.append(records(*n, 1, 100), Box::new(move |r| tx.send(r).unwrap()))
                            .unwrap();
                        *n += 1;
                    }
                    rx.recv().unwrap().unwrap();
                }
            });
        }
    });
    let elapsed = start.elapsed();
    let st = log.stats();
    let appends = THREADS * APPENDS_PER_THREAD;
    assert_eq!(st.append_calls, appends);
    assert_eq!(log.last_index(), Some(appends));
    println!(
        "group commit: {appends} appends from {THREADS} threads, {} fsyncs, {:.2} appends/fsync, {:.0} appends/s",
        st.fsyncs,
        appends as f64 / st.fsyncs as f64,
        appends as f64 / elapsed.as_secs_f64()
    );
    assert!(
        st.fsyncs < appends / 2,
        "fsyncs {} not below appends/2 = {}",
        st.fsyncs,
        appends / 2
    );

    // A single sequential appender gets one fsync per append (nothing to share).
    let before = log.stats().fsyncs;
    for i in 0..20 {
        append_wait(&log, records(appends + 1 + i, 1, 10)).unwrap();
    }
    assert_eq!(log.stats().fsyncs - before, 20);
}
