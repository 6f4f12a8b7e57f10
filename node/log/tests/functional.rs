//! Functional tests: append/read/truncate/purge/meta/reopen, recovery of torn tails, corruption
//! detection, poisoning, periodic sync.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use bytes::Bytes;
use common::{append_wait, payload, read_all, records};
use ftkv_log::{limits, Log, LogError, LogOptions, SyncMode};
use ftkv_vfs::{FaultVfs, RealVfs, Vfs};

fn opts(segment_size_bytes: u64) -> LogOptions {
    LogOptions {
        segment_size_bytes,
        sync: SyncMode::Always,
    }
}

fn fault_log(vfs: &Arc<FaultVfs>, segment_size_bytes: u64) -> Result<Log, LogError> {
    Log::open(vfs.clone(), Path::new("/log"), opts(segment_size_bytes))
}

/// Segment files (the preallocated next segment, `next-segment.tmp`, is not one).
fn segments(vfs: &Arc<FaultVfs>) -> Vec<PathBuf> {
    let mut segs: Vec<PathBuf> = vfs
        .list_dir(Path::new("/log"))
        .unwrap()
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    segs.sort();
    segs
}

/// Offset of the first record in a segment (64-byte header + two 32-byte durable-mark slots).
const RECORDS_START: u64 = 128;

/// Reads `len` bytes at `offset` of `path`.
fn read_bytes(vfs: &Arc<FaultVfs>, path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let f = vfs.open(path, false).unwrap();
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, offset).unwrap();
    buf
}

/// End of the record stream of a segment: one past its last non-zero byte (a record's crc is
/// never all zero in these tests' data; checked by the callers' expectations).
fn records_end(vfs: &Arc<FaultVfs>, path: &Path) -> u64 {
    let len = vfs.durable_len(path).unwrap();
    let bytes = read_bytes(vfs, path, 0, len as usize);
    bytes.iter().rposition(|&b| b != 0).unwrap() as u64 + 1
}

#[test]
fn append_read_reopen_on_real_files() {
    let dir = tempfile::tempdir().unwrap();
    let vfs: Arc<dyn Vfs> = RealVfs::new();
    {
        let log = Log::open(vfs.clone(), dir.path(), opts(4096)).unwrap();
        assert_eq!((log.first_index(), log.last_index()), (None, None));
        for i in 0..10 {
            append_wait(&log, records(1 + i * 10, 10, 100)).unwrap();
        }
        assert_eq!((log.first_index(), log.last_index()), (Some(1), Some(100)));
        assert_eq!(read_all(&log), records(1, 100, 100));
        let st = log.stats();
        assert_eq!(st.records_appended, 100);
        assert!(
            st.segments > 2,
            "100 records of ~117 bytes roll 4 KiB segments: {st:?}"
        );
        assert!(st.fsyncs >= 10);
    }
    let log = Log::open(vfs, dir.path(), opts(4096)).unwrap();
    assert_eq!((log.first_index(), log.last_index()), (Some(1), Some(100)));
    assert_eq!(read_all(&log), records(1, 100, 100));
    append_wait(&log, records(101, 1, 5)).unwrap();
    assert_eq!(log.read_range(101, 102, 0).unwrap(), records(101, 1, 5));
}

#[test]
fn read_range_bounds_and_max_bytes() {
    let vfs = FaultVfs::new(1);
    let log = fault_log(&vfs, 1 << 20).unwrap();
    append_wait(&log, records(10, 10, 100)).unwrap();
    assert_eq!(log.read_range(12, 15, usize::MAX).unwrap(), records(12, 3, 100));
    assert_eq!(
        log.read_range(0, 12, usize::MAX).unwrap(),
        records(10, 2, 100),
        "clamped to first"
    );
    assert_eq!(
        log.read_range(18, 100, usize::MAX).unwrap(),
        records(18, 2, 100),
        "clamped to last"
    );
    assert_eq!(
        log.read_range(10, 20, 250).unwrap().len(),
        2,
        "stops before exceeding max_bytes"
    );
    assert_eq!(log.read_range(10, 20, 0).unwrap().len(), 1, "at least one record");
    assert!(log.read_range(30, 40, usize::MAX).unwrap().is_empty());
    assert!(log.read_range(15, 12, usize::MAX).unwrap().is_empty());
}

#[test]
fn reads_from_disk_when_cache_is_empty() {
    let vfs = FaultVfs::new(2);
    let log = fault_log(&vfs, 2048).unwrap();
    log.set_cache_limit_bytes(0);
    for i in 0..20 {
        append_wait(&log, records(1 + i * 5, 5, 64)).unwrap();
    }
    assert_eq!(log.stats().cached_bytes, 0, "written payloads evicted");
    assert_eq!(read_all(&log), records(1, 100, 64));
}

#[test]
fn append_rejects_gaps_and_oversized_records() {
    let vfs = FaultVfs::new(3);
    let log = fault_log(&vfs, 1 << 20).unwrap();
    append_wait(&log, records(5, 3, 10)).unwrap();
    let nop = || Box::new(|_| {}) as ftkv_log::AppendCallback;
    assert!(matches!(
        log.append(records(9, 1, 1), nop()),
        Err(LogError::Invalid(_))
    ));
    assert!(matches!(
        log.append(records(7, 1, 1), nop()),
        Err(LogError::Invalid(_))
    ));
    let gap = vec![(8, Bytes::new()), (10, Bytes::new())];
    assert!(matches!(log.append(gap, nop()), Err(LogError::Invalid(_))));
    let huge = vec![(8, Bytes::from(vec![0u8; limits::MAX_RECORD_PAYLOAD_BYTES + 1]))];
    let err = log.append(huge, nop()).unwrap_err();
    assert!(err.to_string().contains("above the limit"), "{err}");
    assert!(matches!(
        log.put_meta(&"k".repeat(2000), Bytes::new(), true),
        Err(LogError::Invalid(_))
    ));
    assert_eq!(log.last_index(), Some(7));
    assert!(
        Log::open(vfs.clone(), Path::new("/other"), opts(10)).is_err(),
        "segment size below minimum"
    );
}

#[test]
fn truncate_then_reappend_survives_reopen() {
    let vfs = FaultVfs::new(4);
    {
        let log = fault_log(&vfs, 2048).unwrap();
        append_wait(&log, records(1, 50, 80)).unwrap();
        log.truncate(30).unwrap();
        assert_eq!(log.last_index(), Some(29));
        assert!(log.read_range(30, 40, usize::MAX).unwrap().is_empty());
        append_wait(&log, records(30, 5, 33)).unwrap();
        log.truncate(100).unwrap(); // beyond the end: no-op
        assert_eq!(log.last_index(), Some(34));
    }
    vfs.crash(true); // all acknowledged: nothing may be lost
    let log = fault_log(&vfs, 2048).unwrap();
    let mut expect = records(1, 29, 80);
    expect.extend(records(30, 5, 33));
    assert_eq!(read_all(&log), expect);
    log.truncate(0).unwrap();
    assert_eq!((log.first_index(), log.last_index()), (None, None));
    append_wait(&log, records(500, 2, 1)).unwrap();
    drop(log);
    vfs.crash(false);
    let log = fault_log(&vfs, 2048).unwrap();
    assert_eq!(
        read_all(&log),
        records(500, 2, 1),
        "after emptying, any index may start the log"
    );
}

#[test]
fn purge_deletes_segments_and_metas_survive() {
    let vfs = FaultVfs::new(5);
    {
        let log = fault_log(&vfs, 1024).unwrap();
        log.put_meta("vote", Bytes::from_static(b"term=3"), true).unwrap();
        log.put_meta("committed", Bytes::from_static(b"c1"), false)
            .unwrap();
        for i in 0..40 {
            append_wait(&log, records(1 + i * 5, 5, 60)).unwrap();
        }
        let before = segments(&vfs).len();
        assert!(before > 10, "{before} segments");
        log.purge(150).unwrap();
        assert_eq!(log.first_index(), Some(151));
        assert_eq!(log.purged_up_to(), Some(150));
        let after = segments(&vfs).len();
        assert!(after < before / 2, "purge deleted segments: {before} -> {after}");
        log.purge(100).unwrap(); // lower purge point: no effect
        assert_eq!(log.first_index(), Some(151));
        assert_eq!(read_all(&log), records(151, 50, 60));
    }
    vfs.crash(true);
    let log = fault_log(&vfs, 1024).unwrap();
    assert_eq!(log.get_meta("vote"), Some(Bytes::from_static(b"term=3")));
    assert_eq!(log.get_meta("committed"), Some(Bytes::from_static(b"c1")));
    assert_eq!(log.get_meta("missing"), None);
    assert_eq!(read_all(&log), records(151, 50, 60));
    assert_eq!(log.purged_up_to(), Some(150));
    // Purge everything: the log is empty, metas still there after reopen.
    log.purge(1000).unwrap();
    assert_eq!(log.first_index(), None);
    drop(log);
    vfs.crash(false);
    let log = fault_log(&vfs, 1024).unwrap();
    assert_eq!(log.first_index(), None);
    assert_eq!(log.get_meta("vote"), Some(Bytes::from_static(b"term=3")));
}

#[test]
fn meta_overwrite_and_durability() {
    let vfs = FaultVfs::new(6);
    let log = fault_log(&vfs, 4096).unwrap();
    log.put_meta("vote", Bytes::from_static(b"1"), true).unwrap();
    log.put_meta("vote", Bytes::from_static(b"2"), true).unwrap();
    log.put_meta("lazy", Bytes::from_static(b"x"), false).unwrap();
    assert_eq!(
        log.get_meta("lazy"),
        Some(Bytes::from_static(b"x")),
        "visible at once"
    );
    vfs.set_crash_point(Some(vfs.op_count())); // power loss now
    drop(log);
    vfs.crash(false);
    let log = fault_log(&vfs, 4096).unwrap();
    assert_eq!(log.get_meta("vote"), Some(Bytes::from_static(b"2")));
}

#[test]
fn torn_tail_is_zeroed_and_log_continues() {
    // A torn, never-acknowledged write after the synced records: a partial record or garbage.
    let partial_record: Vec<u8> = vec![50, 0, 0, 0, 1, 31, 0, 0, 0, 0, 0, 0, 0, 9, 9, 9];
    let garbage: Vec<u8> = (0..700u32).map(|i| (i * 37 + 11) as u8).collect();
    for torn in [partial_record, garbage] {
        let vfs = FaultVfs::new(7);
        {
            let log = fault_log(&vfs, 1 << 20).unwrap();
            for i in 0..10 {
                append_wait(&log, records(1 + i * 3, 3, 50)).unwrap();
            }
        }
        let seg = segments(&vfs).pop().unwrap();
        let end = RECORDS_START + 30 * 67; // 67 = 17 bytes framing + 50 payload
        assert_eq!(records_end(&vfs, &seg), end);
        vfs.inject_bytes(&seg, end, &torn).unwrap();
        let log = fault_log(&vfs, 1 << 20).unwrap();
        assert_eq!(read_all(&log), records(1, 30, 50), "every synced record kept");
        assert_eq!(
            read_bytes(&vfs, &seg, end, torn.len()),
            vec![0u8; torn.len()],
            "the torn bytes are zeroed"
        );
        append_wait(&log, records(31, 2, 9)).unwrap();
        drop(log);
        vfs.crash(false);
        let log = fault_log(&vfs, 1 << 20).unwrap();
        assert_eq!(log.last_index(), Some(32));
        assert_eq!(vfs.durable_len(&seg), Some(1 << 20), "the segment keeps its size");
    }
}

#[test]
fn external_truncation_or_extension_refuses_to_open() {
    for new_len in [(1 << 20) - 1, (1 << 20) - 4096, 3000, (1 << 20) + 4096] {
        let vfs = FaultVfs::new(8);
        {
            let log = fault_log(&vfs, 1 << 20).unwrap();
            append_wait(&log, records(1, 20, 50)).unwrap();
        }
        let seg = segments(&vfs).pop().unwrap();
        vfs.inject_len(&seg, new_len).unwrap();
        match fault_log(&vfs, 1 << 20).unwrap_err() {
            LogError::SegmentLength {
                path,
                expected_bytes,
                actual_bytes,
            } => {
                assert_eq!(path, seg);
                assert_eq!((expected_bytes, actual_bytes), (1 << 20, new_len));
            }
            other => panic!("expected SegmentLength, got {other:?}"),
        }
        let msg = fault_log(&vfs, 1 << 20).unwrap_err().to_string();
        assert!(
            msg.contains("00000000000000000001.seg") && msg.contains(&new_len.to_string()),
            "{msg}"
        );
    }
}

#[test]
fn zeroed_last_page_of_the_file_loses_nothing() {
    let vfs = FaultVfs::new(8);
    {
        let log = fault_log(&vfs, 1 << 20).unwrap();
        append_wait(&log, records(1, 200, 50)).unwrap();
    }
    let seg = segments(&vfs).pop().unwrap();
    // The disk nemesis's zero-page mode: the preallocated file's last page holds no records.
    vfs.inject_bytes(&seg, (1 << 20) - 4096, &[0u8; 4096]).unwrap();
    let log = fault_log(&vfs, 1 << 20).unwrap();
    assert_eq!(read_all(&log), records(1, 200, 50));
}

#[test]
fn zeroed_last_page_of_synced_records_refuses_to_open() {
    let vfs = FaultVfs::new(8);
    {
        let log = fault_log(&vfs, 1 << 20).unwrap();
        append_wait(&log, records(1, 200, 50)).unwrap();
    }
    let seg = segments(&vfs).pop().unwrap();
    let end = records_end(&vfs, &seg);
    assert_eq!(end, RECORDS_START + 200 * 67);
    let page = end / 4096 * 4096;
    vfs.inject_bytes(&seg, page, &[0u8; 4096]).unwrap();
    match fault_log(&vfs, 1 << 20).unwrap_err() {
        LogError::SyncedRecordsLost {
            path,
            valid_end,
            durable_end,
            ..
        } => {
            assert_eq!(path, seg);
            assert_eq!(
                durable_end, end,
                "the durable mark covers every acknowledged record"
            );
            assert!(valid_end <= page && valid_end > page - 67, "{valid_end}");
        }
        other => panic!("expected SyncedRecordsLost, got {other:?}"),
    }
}

#[test]
fn flipped_bit_in_the_last_synced_record_refuses_to_open() {
    let vfs = FaultVfs::new(8);
    {
        let log = fault_log(&vfs, 1 << 20).unwrap();
        append_wait(&log, records(1, 20, 50)).unwrap();
    }
    let seg = segments(&vfs).pop().unwrap();
    let last_record = RECORDS_START + 19 * 67;
    let mut byte = read_bytes(&vfs, &seg, last_record + 30, 1);
    byte[0] ^= 0x10;
    vfs.inject_bytes(&seg, last_record + 30, &byte).unwrap();
    let err = fault_log(&vfs, 1 << 20).unwrap_err();
    assert!(
        matches!(err, LogError::SyncedRecordsLost { valid_end, .. } if valid_end == last_record),
        "{err:?}"
    );
}

#[test]
fn bit_flip_in_the_preallocated_zeros_is_zeroed_and_loses_nothing() {
    let vfs = FaultVfs::new(8);
    {
        let log = fault_log(&vfs, 1 << 20).unwrap();
        append_wait(&log, records(1, 20, 50)).unwrap();
    }
    let seg = segments(&vfs).pop().unwrap();
    vfs.inject_bytes(&seg, 500_000, &[0x04]).unwrap();
    let log = fault_log(&vfs, 1 << 20).unwrap();
    assert_eq!(read_all(&log), records(1, 20, 50));
    assert_eq!(read_bytes(&vfs, &seg, 500_000, 1), vec![0]);
}

#[test]
fn damaged_durable_mark_slot_is_ignored() {
    let vfs = FaultVfs::new(8);
    {
        let log = fault_log(&vfs, 1 << 20).unwrap();
        for i in 0..5 {
            append_wait(&log, records(1 + i * 4, 4, 50)).unwrap();
        }
    }
    let seg = segments(&vfs).pop().unwrap();
    // Garbage in one slot (a torn mark write): the other slot's older mark is used.
    vfs.inject_bytes(&seg, 64, &[0xAB; 32]).unwrap();
    let log = fault_log(&vfs, 1 << 20).unwrap();
    assert_eq!(read_all(&log), records(1, 20, 50));
}

#[test]
fn bad_record_followed_by_valid_ones_is_corruption() {
    let vfs = FaultVfs::new(9);
    {
        let log = fault_log(&vfs, 1 << 20).unwrap();
        append_wait(&log, records(1, 20, 50)).unwrap();
    }
    let seg = segments(&vfs).pop().unwrap();
    // Flip a payload byte of the 5th record (records start at 128, 67 bytes each).
    vfs.inject_bytes(&seg, RECORDS_START + 4 * 67 + 20, &[0xFF])
        .unwrap();
    let err = fault_log(&vfs, 1 << 20).unwrap_err();
    match err {
        LogError::Corruption { location, detail } => {
            assert!(location.contains("00000000000000000001.seg"), "{location}");
            assert!(
                location.contains(&format!("offset {}", RECORDS_START + 4 * 67)),
                "{location}"
            );
            assert!(detail.contains("not a torn tail"), "{detail}");
        }
        other => panic!("expected corruption, got {other:?}"),
    }
}

#[test]
fn damage_in_an_older_segment_is_corruption() {
    let vfs = FaultVfs::new(10);
    {
        let log = fault_log(&vfs, 1024).unwrap();
        for i in 0..20 {
            append_wait(&log, records(1 + i * 4, 4, 50)).unwrap();
        }
    }
    let segs = segments(&vfs);
    assert!(segs.len() > 3);
    // Zero the whole last record of the first segment: only the newest segment may be torn, and the
    // next segment's header records where the first one ended.
    let end = records_end(&vfs, &segs[0]);
    vfs.inject_bytes(&segs[0], end - 67, &[0u8; 67]).unwrap(); // 67 = 17 framing + 50 payload
    let err = fault_log(&vfs, 1024).unwrap_err();
    assert!(
        matches!(&err, LogError::SyncedRecordsLost { path, durable_end, .. } if *path == segs[0] && *durable_end == end),
        "{err}"
    );
    // A flipped byte in a middle record of the first segment: records follow it.
    let vfs = FaultVfs::new(10);
    {
        let log = fault_log(&vfs, 1024).unwrap();
        for i in 0..20 {
            append_wait(&log, records(1 + i * 4, 4, 50)).unwrap();
        }
    }
    let segs = segments(&vfs);
    vfs.inject_bytes(&segs[0], RECORDS_START + 20, &[0xEE]).unwrap();
    let err = fault_log(&vfs, 1024).unwrap_err();
    assert!(
        matches!(&err, LogError::Corruption { detail, .. } if detail.contains("not the newest")),
        "{err}"
    );
    // Non-zero bytes after the end of a completed segment.
    let vfs = FaultVfs::new(10);
    {
        let log = fault_log(&vfs, 1024).unwrap();
        for i in 0..20 {
            append_wait(&log, records(1 + i * 4, 4, 50)).unwrap();
        }
    }
    let segs = segments(&vfs);
    vfs.inject_bytes(&segs[0], 1020, &[0x01]).unwrap();
    let err = fault_log(&vfs, 1024).unwrap_err();
    assert!(
        matches!(&err, LogError::Corruption { detail, .. } if detail.contains("not the newest")),
        "{err}"
    );
}

#[test]
fn missing_middle_segment_is_corruption() {
    let vfs = FaultVfs::new(11);
    {
        let log = fault_log(&vfs, 1024).unwrap();
        for i in 0..20 {
            append_wait(&log, records(1 + i * 4, 4, 50)).unwrap();
        }
    }
    let segs = segments(&vfs);
    vfs.remove_file(&segs[2]).unwrap();
    vfs.sync_dir(Path::new("/log")).unwrap();
    let err = fault_log(&vfs, 1024).unwrap_err();
    assert!(
        matches!(&err, LogError::Corruption { detail, .. } if detail.contains("missing")),
        "{err}"
    );
}

#[test]
fn torn_segment_creation_is_removed() {
    let vfs = FaultVfs::new(12);
    {
        let log = fault_log(&vfs, 1 << 20).unwrap();
        append_wait(&log, records(1, 5, 50)).unwrap();
    }
    // A crash right after creating the next segment: the name is durable, the header is not.
    let f = vfs
        .open(Path::new("/log/00000000000000000002.seg"), true)
        .unwrap();
    f.write_all_at(&[0xAB; 10], 0).unwrap();
    f.sync_data().unwrap();
    vfs.sync_dir(Path::new("/log")).unwrap();
    let log = fault_log(&vfs, 1 << 20).unwrap();
    assert_eq!(read_all(&log), records(1, 5, 50));
    assert_eq!(segments(&vfs).len(), 1);
    append_wait(&log, records(6, 1, 1)).unwrap();
}

#[test]
fn failed_fsync_poisons_the_log() {
    let vfs = FaultVfs::new(13);
    let log = fault_log(&vfs, 1 << 20).unwrap();
    append_wait(&log, records(1, 3, 10)).unwrap();
    vfs.fail_after(Some(1)); // the write succeeds, the fsync fails
    let err = append_wait(&log, records(4, 2, 10)).unwrap_err();
    assert!(matches!(err, LogError::Io { .. }), "{err:?}");
    assert!(log.is_poisoned());
    let nop = || Box::new(|_| {}) as ftkv_log::AppendCallback;
    assert!(matches!(
        log.append(records(6, 1, 1), nop()),
        Err(LogError::Poisoned)
    ));
    assert!(matches!(log.truncate(2), Err(LogError::Poisoned)));
    assert!(matches!(log.purge(2), Err(LogError::Poisoned)));
    assert!(matches!(
        log.put_meta("k", Bytes::new(), false),
        Err(LogError::Poisoned)
    ));
    assert!(matches!(log.sync(), Err(LogError::Poisoned)));
    assert!(matches!(log.read_range(1, 2, 10), Err(LogError::Poisoned)));
    drop(log);
    vfs.crash(false);
    let log = fault_log(&vfs, 1 << 20).unwrap();
    assert_eq!(
        read_all(&log),
        records(1, 3, 10),
        "the failed batch was never acknowledged"
    );
}

#[test]
fn poison_fails_every_queued_callback() {
    let vfs = FaultVfs::new(14);
    let log = fault_log(&vfs, 1 << 20).unwrap();
    vfs.fail_after(Some(0));
    let results = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    let mut queued = 0;
    for i in 0..50u64 {
        let r = results.clone();
        let tx = tx.clone();
        let cb = Box::new(move |res: Result<(), LogError>| {
            r.lock().unwrap().push(res.is_ok());
            let _ = tx.send(());
        });
        match log.append(records(1 + i, 1, 10), cb) {
            Ok(()) => queued += 1,
            Err(e) => {
                assert!(matches!(e, LogError::Poisoned));
                break;
            }
        }
    }
    for _ in 0..queued {
        rx.recv().unwrap();
    }
    let results = results.lock().unwrap();
    assert_eq!(results.len(), queued);
    assert!(results.iter().all(|ok| !ok), "no callback may report success");
}

#[test]
fn periodic_mode_acks_before_sync_and_sync_makes_durable() {
    let vfs = FaultVfs::new(15);
    let periodic = LogOptions {
        segment_size_bytes: 1 << 20,
        sync: SyncMode::Periodic { period_ms: 60_000 },
    };
    {
        let log = Log::open(vfs.clone(), Path::new("/log"), periodic.clone()).unwrap();
        append_wait(&log, records(1, 5, 10)).unwrap();
        log.sync().unwrap();
        append_wait(&log, records(6, 5, 10)).unwrap(); // acknowledged, not yet synced
        vfs.set_crash_point(Some(vfs.op_count()));
    }
    vfs.crash(false);
    let log = Log::open(vfs.clone(), Path::new("/log"), periodic).unwrap();
    assert_eq!(
        read_all(&log),
        records(1, 5, 10),
        "documented weaker durability: unsynced acks lost"
    );

    // A short period syncs by itself.
    let vfs = FaultVfs::new(16);
    let fast = LogOptions {
        segment_size_bytes: 1 << 20,
        sync: SyncMode::Periodic { period_ms: 5 },
    };
    let log = Log::open(vfs.clone(), Path::new("/log"), fast).unwrap();
    append_wait(&log, records(1, 5, 10)).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while log.stats().fsyncs == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    assert!(log.stats().fsyncs >= 1, "the timer synced");
}

#[test]
fn callbacks_fire_in_append_order() {
    let vfs = FaultVfs::new(17);
    let log = fault_log(&vfs, 4096).unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    for i in 0..200u64 {
        let order = order.clone();
        let tx = tx.clone();
        log.append(
            vec![(i + 1, payload(i, 20))],
            Box::new(move |r| {
                r.unwrap();
                order.lock().unwrap().push(i);
                let _ = tx.send(());
            }),
        )
        .unwrap();
    }
    for _ in 0..200 {
        rx.recv().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), (0..200).collect::<Vec<_>>());
}

#[test]
fn dropping_the_log_flushes_pending_appends() {
    let vfs = FaultVfs::new(18);
    let fired = Arc::new(AtomicU64::new(0));
    {
        let log = fault_log(&vfs, 4096).unwrap();
        for i in 0..30u64 {
            let fired = fired.clone();
            log.append(
                records(1 + i, 1, 30),
                Box::new(move |r| {
                    assert!(r.is_ok());
                    fired.fetch_add(1, Ordering::SeqCst);
                }),
            )
            .unwrap();
        }
    }
    assert_eq!(fired.load(Ordering::SeqCst), 30);
    vfs.crash(true);
    let log = fault_log(&vfs, 4096).unwrap();
    assert_eq!(read_all(&log), records(1, 30, 30));
}

#[test]
fn periodic_mode_recovers_point_in_time_across_a_hole() {
    let vfs = FaultVfs::new(19);
    let periodic = LogOptions {
        segment_size_bytes: 1 << 20,
        sync: SyncMode::Periodic { period_ms: 60_000 },
    };
    {
        let log = Log::open(vfs.clone(), Path::new("/log"), periodic.clone()).unwrap();
        append_wait(&log, records(1, 20, 50)).unwrap();
        log.sync().unwrap();
    }
    // Unsynced writes persisted out of order: a zeroed record with valid ones after it, and the
    // durable marks (written unsynced) not persisted.
    let seg = segments(&vfs).pop().unwrap();
    vfs.inject_bytes(&seg, RECORDS_START + 10 * 67, &[0u8; 67])
        .unwrap();
    vfs.inject_bytes(&seg, 64, &[0u8; 64]).unwrap();
    let strict = Log::open(vfs.clone(), Path::new("/log"), opts(1 << 20)).unwrap_err();
    assert!(
        matches!(strict, LogError::Corruption { .. }),
        "sync = always refuses: {strict}"
    );
    let log = Log::open(vfs.clone(), Path::new("/log"), periodic).unwrap();
    assert_eq!(
        read_all(&log),
        records(1, 10, 50),
        "cut at the first invalid record"
    );
}

#[test]
fn segments_are_preallocated_and_the_next_one_is_prepared_ahead() {
    let vfs = FaultVfs::new(21);
    let size = 16 * 1024;
    let log = fault_log(&vfs, size).unwrap();
    let first = segments(&vfs).pop().unwrap();
    assert_eq!(vfs.durable_len(&first), Some(size), "preallocated at open");
    let tmp = Path::new("/log/next-segment.tmp");
    assert!(
        !vfs.exists(tmp),
        "nothing prepared while the segment is nearly empty"
    );
    // The current length of a file (its name need not be durable yet).
    let len_of = |p: &Path| vfs.open(p, false).ok().map(|f| f.len().unwrap());
    // A quarter of the segment: the preparer makes the next file, zero-filled and synced (its
    // contents durable) before handing it over.
    append_wait(&log, records(1, 70, 50)).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let prepared = || {
        len_of(tmp) == Some(size) && {
            vfs.sync_dir(Path::new("/log")).unwrap();
            vfs.durable_len(tmp) == Some(size)
        }
    };
    while !prepared() {
        assert!(std::time::Instant::now() < deadline, "next segment not prepared");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(read_bytes(&vfs, tmp, 0, size as usize), vec![0u8; size as usize]);
    // Fill past the end: the roll renames the prepared file; every segment keeps its size.
    for i in 0..10 {
        append_wait(&log, records(71 + i * 50, 50, 50)).unwrap();
    }
    let segs = segments(&vfs);
    assert!(segs.len() >= 3, "{segs:?}");
    for s in &segs {
        assert_eq!(vfs.durable_len(s), Some(size), "{}", s.display());
    }
    drop(log);
    let log = fault_log(&vfs, size).unwrap();
    assert_eq!(read_all(&log), records(1, 570, 50));
}

#[test]
fn a_record_larger_than_the_segment_size_gets_a_larger_segment() {
    let vfs = FaultVfs::new(22);
    {
        let log = fault_log(&vfs, 4096).unwrap();
        append_wait(&log, records(1, 1, 10)).unwrap();
        append_wait(&log, records(2, 1, 10_000)).unwrap();
        append_wait(&log, records(3, 1, 10)).unwrap();
    }
    let segs = segments(&vfs);
    assert_eq!(
        vfs.durable_len(&segs[1]),
        Some(12_288),
        "10,145 bytes rounded up to 4 KiB"
    );
    let log = fault_log(&vfs, 4096).unwrap();
    assert_eq!(
        read_all(&log),
        [records(1, 1, 10), records(2, 1, 10_000), records(3, 1, 10)].concat()
    );
}

/// Regression (CI, session 4): a roll that found no prepared file preallocated
/// `next-segment.tmp` itself while the preparer thread, woken by the request made at a quarter
/// full, opened the same name. The preparer then kept a handle to the file the flusher had just
/// renamed into a live segment; the next roll failed ("rename next-segment.tmp: not found") and
/// on a real file system it would have reset or overwritten that segment. The race needs an
/// unlucky schedule (seen once, in a loaded CI run); this test makes it as likely as it can
/// without hooks: every append fills most of a 1 KiB segment, so every append rolls right after
/// a request, eight logs run at once, and reopening starts a new preparer with a request
/// already pending.
#[test]
fn rolls_racing_the_preparer_keep_every_record() {
    let logs: Vec<_> = (0..8u64)
        .map(|seed| {
            std::thread::spawn(move || {
                let vfs = FaultVfs::new(seed + 1);
                let mut log = fault_log(&vfs, 1024).unwrap();
                for i in 1..=300u64 {
                    append_wait(&log, records(i, 1, 700)).unwrap();
                    if i % 3 == 0 {
                        // Reopened at more than a quarter full, the log asks its new preparer
                        // thread for a file at once, and the next append rolls.
                        drop(log);
                        log = fault_log(&vfs, 1024).unwrap();
                    }
                }
                let expected = records(1, 300, 700);
                assert_eq!(read_all(&log), expected);
                drop(log);
                let log = fault_log(&vfs, 1024).unwrap();
                assert_eq!(read_all(&log), expected, "after reopen (log {seed})");
                assert!(segments(&vfs).len() >= 300, "every append rolled a segment");
            })
        })
        .collect();
    for t in logs {
        t.join().unwrap();
    }
}
