//! A full disk (`ENOSPC`) while the log needs a new segment: the log is not poisoned, nothing
//! queued is acknowledged while the disk is full, everything acknowledged stays, and appends go
//! on once space is freed.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{append_wait, payload, read_all, records};
use ftkv_log::{Log, LogOptions, SyncMode};
use ftkv_vfs::FaultVfs;

const SEGMENT_BYTES: u64 = 64 * 1024;
const RECORD_BYTES: usize = 4096;

fn open(vfs: &Arc<FaultVfs>) -> Log {
    Log::open(
        vfs.clone(),
        Path::new("/log"),
        LogOptions {
            segment_size_bytes: SEGMENT_BYTES,
            sync: SyncMode::Always,
        },
    )
    .unwrap()
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_full_disk_stalls_appends_without_poisoning_and_they_resume_once_space_is_freed() {
    let vfs = FaultVfs::new(3);
    let log = open(&vfs);
    append_wait(&log, records(1, 1, RECORD_BYTES)).unwrap();
    // The disk is full from now on: the first segment is preallocated, no second one fits.
    vfs.set_capacity(Some(vfs.used_bytes()));

    // 40 records of 4 KiB: about 15 fit the first 64 KiB segment, the rest need a new one.
    let (tx, rx) = mpsc::channel();
    for i in 2..=41u64 {
        let tx = tx.clone();
        log.append(
            vec![(i, payload(i, RECORD_BYTES))],
            Box::new(move |r| {
                let _ = tx.send((i, r.map_err(|e| e.to_string())));
            }),
        )
        .unwrap();
    }
    wait_until("the log to report the full disk", || log.space_error().is_some());
    let error = log.space_error().unwrap();
    assert!(error.contains("No space left on device"), "{error}");
    assert!(!log.is_poisoned(), "a full disk must not poison the log");

    let mut acked = Vec::new();
    while let Ok((i, r)) = rx.recv_timeout(Duration::from_millis(500)) {
        assert_eq!(r, Ok(()), "record {i} failed instead of waiting");
        acked.push(i);
    }
    assert!(
        acked.len() < 40,
        "every record acknowledged while the disk was full"
    );
    assert_eq!(acked, (2..2 + acked.len() as u64).collect::<Vec<_>>());
    // Every record stays readable while the disk is full, acknowledged or not.
    assert_eq!(read_all(&log), records(1, 41, RECORD_BYTES));

    // Space is freed: the waiting records become durable and are acknowledged, in order.
    vfs.set_capacity(None);
    for _ in acked.len()..40 {
        let (i, r) = rx.recv_timeout(Duration::from_secs(30)).unwrap();
        assert_eq!(r, Ok(()), "record {i}");
        acked.push(i);
    }
    assert_eq!(acked, (2..=41).collect::<Vec<_>>());
    assert_eq!(log.space_error(), None);
    append_wait(&log, records(42, 1, RECORD_BYTES)).unwrap();

    // Power loss: everything acknowledged survives.
    drop(log);
    vfs.crash(false);
    let log = open(&vfs);
    assert_eq!(read_all(&log), records(1, 42, RECORD_BYTES));
}

#[test]
fn a_log_closed_while_the_disk_is_full_loses_nothing_acknowledged() {
    let vfs = FaultVfs::new(4);
    let log = open(&vfs);
    append_wait(&log, records(1, 1, RECORD_BYTES)).unwrap();
    vfs.set_capacity(Some(vfs.used_bytes()));
    let (tx, rx) = mpsc::channel();
    for i in 2..=41u64 {
        let tx = tx.clone();
        log.append(
            vec![(i, payload(i, RECORD_BYTES))],
            Box::new(move |r| {
                let _ = tx.send((i, r.is_ok()));
            }),
        )
        .unwrap();
    }
    wait_until("the log to report the full disk", || log.space_error().is_some());
    drop(log);
    let acked: Vec<u64> = rx.try_iter().filter(|(_, ok)| *ok).map(|(i, _)| i).collect();
    vfs.crash(false);
    vfs.set_capacity(None);
    let log = open(&vfs);
    let kept = read_all(&log);
    assert!(kept.len() > acked.len(), "acked {acked:?}, kept {}", kept.len());
    assert_eq!(kept, records(1, kept.len() as u64, RECORD_BYTES));
}
