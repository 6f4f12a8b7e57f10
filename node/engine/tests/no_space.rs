#![allow(clippy::unwrap_used)]
//! A full disk (`FaultVfs::set_capacity`) is not a storage fault: the fractal tree keeps the
//! nodes it cannot write in memory, serves reads and applies writes, refuses a checkpoint
//! (nothing durable changes) and takes it once space is freed, losing nothing. A failed write
//! that is not a full disk still poisons it.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::{opts, SMALL};
use ftkv_engine::{Engine, FractalEngine, FractalOptions, WriteOp};
use ftkv_vfs::{FaultVfs, Vfs};

/// A small cache, so that dirty nodes must be written (evicted, written back) as writes go on.
const CACHE_BYTES: u64 = 64 * 1024;

fn open(vfs: &Arc<FaultVfs>, cleaner_period_ms: Option<u64>) -> FractalEngine {
    FractalEngine::open_with(
        vfs.clone() as Arc<dyn Vfs>,
        &opts(PathBuf::from("/engine"), CACHE_BYTES, None),
        FractalOptions {
            tree: SMALL,
            cleaner_period_ms,
        },
    )
    .unwrap()
}

fn key(i: u64) -> Vec<u8> {
    format!("key{i:07}").into_bytes()
}

fn value(i: u64) -> Vec<u8> {
    let mut v = format!("value-{i}-").into_bytes();
    v.resize(120, b'x');
    v
}

/// Puts keys `from..to` in batches of 50, each batch with metadata naming its last key.
fn put(e: &dyn Engine, from: u64, to: u64) {
    let mut i = from;
    while i < to {
        let end = (i + 50).min(to);
        let ops: Vec<WriteOp> = (i..end)
            .map(|k| WriteOp::Put {
                key: key(k),
                value: value(k),
            })
            .collect();
        let meta = format!("upto-{end}");
        if let Err(err) = e.write(&ops, Some(meta.as_bytes())) {
            panic!("write of keys {i}..{end} failed: {err}");
        }
        i = end;
    }
}

fn check_all(e: &dyn Engine, to: u64, when: &str) {
    for i in 0..to {
        match e.get(&key(i)) {
            Ok(v) => assert_eq!(v, Some(value(i)), "key {i} {when}"),
            Err(err) => panic!("read of key {i} {when} failed: {err}"),
        }
    }
}

#[test]
fn a_full_disk_keeps_reads_and_writes_going_and_the_checkpoint_is_taken_once_space_is_freed() {
    let vfs = FaultVfs::new(11);
    let e = open(&vfs, None);
    put(&e, 0, 2_000);
    e.checkpoint().unwrap();
    // The disk is full from now on: not one more byte.
    vfs.set_capacity(Some(vfs.used_bytes()));
    // Writes go on (dirty nodes stay in memory: eviction, writeback and spills meet ENOSPC).
    put(&e, 2_000, 8_000);
    check_all(&e, 8_000, "while the disk is full");
    let scanned = e.scan(b"", None, usize::MAX).unwrap();
    assert_eq!(scanned.len(), 8_000);
    // A checkpoint cannot be written: refused, naming the full disk, and nothing is poisoned.
    let err = e.checkpoint().unwrap_err();
    assert!(
        err.to_string().contains("No space left on device"),
        "checkpoint error: {err}"
    );
    put(&e, 8_000, 9_000);
    check_all(&e, 9_000, "after the refused checkpoint");
    let err = e.checkpoint().unwrap_err();
    assert!(
        err.to_string().contains("No space left on device"),
        "second try: {err}"
    );
    // Space is freed: the checkpoint goes through, and everything survives a crash.
    vfs.set_capacity(None);
    e.checkpoint().unwrap();
    assert_eq!(e.meta().unwrap(), Some(b"upto-9000".to_vec()));
    drop(e);
    vfs.crash(true);
    let e = open(&vfs, None);
    assert_eq!(e.meta().unwrap(), Some(b"upto-9000".to_vec()));
    check_all(&e, 9_000, "after the crash");
    e.check_integrity().unwrap();
}

#[test]
fn the_engine_reports_the_full_disk_until_a_write_succeeds_again() {
    let vfs = FaultVfs::new(12);
    // With the cleaner thread: it meets the full disk too, and must not poison the engine.
    let e = open(&vfs, Some(5));
    put(&e, 0, 1_000);
    e.checkpoint().unwrap();
    assert_eq!(e.space_error(), None);
    vfs.set_capacity(Some(vfs.used_bytes()));
    put(&e, 1_000, 6_000);
    let err = e.checkpoint().unwrap_err();
    assert!(err.is_no_space(), "checkpoint error: {err}");
    let reported = e.space_error().expect("the engine reports the full disk");
    assert!(reported.contains("No space left on device"), "{reported}");
    assert!(reported.contains("/engine"), "names the file: {reported}");
    // Idle for a while: the cleaner retries writes in the background and keeps failing.
    std::thread::sleep(std::time::Duration::from_millis(1_200));
    check_all(&e, 6_000, "while full, after the cleaner ran");
    vfs.set_capacity(None);
    e.checkpoint().unwrap();
    assert_eq!(e.space_error(), None, "cleared by the checkpoint");
    put(&e, 6_000, 7_000);
    e.checkpoint().unwrap();
    drop(e);
    vfs.crash(true);
    let e = open(&vfs, None);
    check_all(&e, 7_000, "after the crash");
    e.check_integrity().unwrap();
}

#[test]
fn a_failed_write_that_is_not_a_full_disk_still_poisons() {
    let vfs = FaultVfs::new(13);
    let e = open(&vfs, None);
    put(&e, 0, 1_000);
    e.checkpoint().unwrap();
    put(&e, 1_000, 2_000);
    vfs.fail_after(Some(0));
    let err = e.checkpoint().unwrap_err();
    assert!(!err.is_no_space(), "an I/O error is a fault: {err}");
    vfs.fail_after(None);
    let next = e
        .write(
            &[WriteOp::Put {
                key: b"after".to_vec(),
                value: b"v".to_vec(),
            }],
            None,
        )
        .unwrap_err();
    assert!(next.to_string().contains("poisoned"), "got {next}");
}

#[test]
fn a_replace_all_on_a_full_disk_keeps_the_engine_usable_and_succeeds_once_space_is_freed() {
    let vfs = FaultVfs::new(14);
    let e = open(&vfs, None);
    put(&e, 0, 2_000);
    e.checkpoint().unwrap();
    vfs.set_capacity(Some(vfs.used_bytes()));
    let replacement = || (0..3_000u64).map(|i| Ok((format!("new{i:07}").into_bytes(), value(i))));
    let err = e.replace_all(&mut replacement(), b"replaced").unwrap_err();
    assert!(err.is_no_space(), "replace_all error: {err}");
    // Not poisoned: the old tree is served and takes writes (in memory).
    check_all(&e, 2_000, "after the refused replace_all");
    put(&e, 2_000, 2_100);
    check_all(&e, 2_100, "after writes on the full disk");
    // Space is freed: the same replace_all goes through, and survives a crash.
    vfs.set_capacity(None);
    e.replace_all(&mut replacement(), b"replaced").unwrap();
    assert_eq!(e.get(&key(0)).unwrap(), None);
    assert_eq!(e.scan(b"", None, usize::MAX).unwrap().len(), 3_000);
    drop(e);
    vfs.crash(true);
    let e = open(&vfs, None);
    assert_eq!(e.meta().unwrap(), Some(b"replaced".to_vec()));
    assert_eq!(e.get(&key(0)).unwrap(), None);
    assert_eq!(
        e.get(b"new0002999").unwrap(),
        Some(value(2_999)),
        "the replacement after the crash"
    );
    assert_eq!(e.scan(b"", None, usize::MAX).unwrap().len(), 3_000);
    e.check_integrity().unwrap();
}
