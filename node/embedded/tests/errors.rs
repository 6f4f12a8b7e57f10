//! Bad input and faults: unknown or foreign engine metadata, corrupt log records, a log gap, a
//! lost log directory, oversized writes, bad options, and a failed fsync. Each is a clear
//! error (never a panic, never silently skipped data), and a fault stops the database.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use common::{dump, engine_alone, log_alone, open, small_opts, DIR};
use ftkv_embedded::codec::{CodecError, EngineMeta};
use ftkv_embedded::{EmbeddedError, EngineKind};
use ftkv_engine::{Engine, WriteOp};
use ftkv_vfs::{FaultVfs, Vfs};

fn put(k: &str, v: &str) -> WriteOp {
    WriteOp::Put {
        key: k.as_bytes().to_vec(),
        value: v.as_bytes().to_vec(),
    }
}

/// A database holding `n` batches; closed cleanly (checkpointed: the log is purged to `n`)
/// or, with `checkpoint = false`, closed without a checkpoint and then power-cut.
fn database_with(vfs: &Arc<FaultVfs>, n: u64, checkpoint: bool) {
    let mut opts = small_opts();
    opts.checkpoint_on_close = checkpoint;
    let db = open(vfs, &opts).unwrap();
    for i in 0..n {
        db.write(&[put(&format!("k{i}"), "v")]).unwrap();
    }
    db.close().unwrap();
    if !checkpoint {
        vfs.crash(false);
    }
}

/// Replaces the engine's metadata blob (durably).
fn set_engine_meta(vfs: &Arc<FaultVfs>, meta: &[u8]) {
    let e = engine_alone(vfs);
    e.write(&[], Some(meta)).unwrap();
    e.checkpoint().unwrap();
}

fn open_err(vfs: &Arc<FaultVfs>) -> EmbeddedError {
    match open(vfs, &small_opts()) {
        Ok(_) => panic!("open succeeded"),
        Err(e) => e,
    }
}

#[test]
fn unknown_engine_meta_version_is_refused() {
    let vfs = FaultVfs::new(1);
    database_with(&vfs, 3, true);
    let mut meta = EngineMeta {
        db_id: 1,
        applied_lsn: 3,
    }
    .encode();
    meta[4..8].copy_from_slice(&99u32.to_le_bytes());
    set_engine_meta(&vfs, &meta);
    let e = open_err(&vfs);
    assert!(
        matches!(
            &e,
            EmbeddedError::Codec {
                source: CodecError::UnsupportedVersion {
                    found: 99,
                    supported: 1,
                    ..
                },
                ..
            }
        ),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(msg.contains("engine meta") && msg.contains("version 99"), "{msg}");
}

#[test]
fn foreign_or_damaged_engine_meta_is_refused() {
    let vfs = FaultVfs::new(2);
    database_with(&vfs, 3, true);
    // The engine directory of a cluster node holds the state machine's metadata instead.
    set_engine_meta(&vfs, b"raft state machine metadata");
    assert!(matches!(
        open_err(&vfs),
        EmbeddedError::Codec {
            source: CodecError::BadMagic { .. },
            ..
        }
    ));
    let mut meta = EngineMeta {
        db_id: 1,
        applied_lsn: 3,
    }
    .encode();
    meta[16] ^= 0x40;
    set_engine_meta(&vfs, &meta);
    assert!(matches!(
        open_err(&vfs),
        EmbeddedError::Codec {
            source: CodecError::Checksum { .. },
            ..
        }
    ));
}

#[test]
fn corrupt_log_record_payloads_are_refused() {
    let cases: [(&str, Vec<u8>); 4] = [
        ("unknown batch version", vec![7, 0, 0, 0, 0]),
        ("unknown op tag", vec![1, 1, 0, 0, 0, 42, 0, 0, 0, 0]),
        ("length past the end", vec![1, 1, 0, 0, 0, 2, 200, 0, 0, 0, b'k']),
        ("empty payload", vec![]),
    ];
    for (what, payload) in cases {
        let vfs = FaultVfs::new(3);
        database_with(&vfs, 3, true);
        let log = log_alone(&vfs);
        log.append(vec![(4, Bytes::from(payload))], Box::new(|r| r.unwrap()))
            .unwrap();
        log.sync().unwrap();
        drop(log);
        let e = open_err(&vfs);
        assert!(
            matches!(&e, EmbeddedError::Codec { location, .. } if location.contains("log record 4")),
            "{what}: {e:?}"
        );
        if what == "unknown batch version" {
            assert!(e.to_string().contains("version 7"), "{e}");
        }
    }
}

#[test]
fn a_gap_in_the_log_is_refused() {
    let vfs = FaultVfs::new(4);
    database_with(&vfs, 5, false); // the engine never checkpointed: applied LSN 0
    let log = log_alone(&vfs);
    log.purge(3).unwrap(); // records 1..=3 disappear
    drop(log);
    let e = open_err(&vfs);
    assert!(matches!(e, EmbeddedError::LogGap { applied_lsn: 0, .. }), "{e:?}");
}

#[test]
fn a_lost_log_directory_is_refused() {
    let vfs = FaultVfs::new(5);
    database_with(&vfs, 5, true);
    let log_dir = Path::new(DIR).join(ftkv_embedded::LOG_DIR_NAME);
    for f in vfs.list_dir(&log_dir).unwrap() {
        vfs.remove_file(&f).unwrap();
    }
    vfs.sync_dir(&log_dir).unwrap();
    let e = open_err(&vfs);
    assert!(matches!(e, EmbeddedError::IdentityMismatch(_)), "{e:?}");
}

#[test]
fn oversized_writes_and_bad_options_are_invalid_arguments() {
    let vfs = FaultVfs::new(6);
    let mut opts = small_opts();
    opts.max_key_bytes = 8;
    opts.max_value_bytes = 16;
    opts.max_batch_bytes = 200;
    let db = open(&vfs, &opts).unwrap();
    let bad: [Vec<WriteOp>; 4] = [
        vec![put("a-key-that-is-too-long", "v")],
        vec![put("k", "a value longer than sixteen bytes")],
        vec![WriteOp::DeleteRange {
            start: b"a".to_vec(),
            end: Some(b"range-end-too-long".to_vec()),
        }],
        (0..20).map(|i| put(&format!("k{i}"), "0123456789")).collect(),
    ];
    for ops in &bad {
        let e = db.write(ops).unwrap_err();
        assert!(matches!(e, EmbeddedError::InvalidArgument(_)), "{e:?}");
    }
    // Nothing was logged or applied, and the database still works.
    assert_eq!(db.write(&[put("k", "v")]).unwrap(), 1);
    assert_eq!(dump(&db).len(), 1);
    drop(db);

    let invalid = |o: ftkv_embedded::EmbeddedOptions| {
        let e = open(&vfs, &o).unwrap_err();
        assert!(matches!(e, EmbeddedError::InvalidArgument(_)), "{e:?}");
    };
    invalid(ftkv_embedded::EmbeddedOptions {
        checkpoint_interval_bytes: Some(0),
        ..small_opts()
    });
    invalid(ftkv_embedded::EmbeddedOptions {
        max_batch_bytes: 1 << 30,
        ..small_opts()
    });
    invalid(ftkv_embedded::EmbeddedOptions {
        engine: EngineKind::Sled,
        ..small_opts()
    });
}

#[test]
fn a_failed_fsync_stops_the_database_loudly() {
    let vfs = FaultVfs::new(7);
    let db = open(&vfs, &small_opts()).unwrap();
    assert_eq!(db.write(&[put("a", "1")]).unwrap(), 1);
    vfs.fail_after(Some(0)); // the next write or fsync fails
    let e = db.write(&[put("b", "2")]).unwrap_err();
    assert!(matches!(e, EmbeddedError::Log(_)), "{e:?}");
    vfs.fail_after(None); // the disk works again, but the database stays stopped
    for _ in 0..2 {
        let e = db.write(&[put("c", "3")]).unwrap_err();
        assert!(matches!(e, EmbeddedError::Poisoned { .. }), "{e:?}");
    }
    assert!(matches!(db.get(b"a"), Err(EmbeddedError::Poisoned { .. })));
    assert!(matches!(db.checkpoint(), Err(EmbeddedError::Poisoned { .. })));
    assert!(db.close().is_err());
    vfs.crash(false);
    // Reopen recovers: the acknowledged write is there, the failed one's outcome is unknown
    // (here it never reached the disk), the refused one is absent.
    let db = open(&vfs, &small_opts()).unwrap();
    let all = dump(&db);
    assert_eq!(all.get(b"a".as_slice()), Some(&b"1".to_vec()));
    assert!(!all.contains_key(b"c".as_slice()));
    assert_eq!(db.last_lsn(), all.len() as u64);
}

/// Two opens of one directory on the real file system: the second is refused with `Locked`
/// (two `Db`s writing one log and one tree would corrupt both), the first keeps working, and
/// once it is dropped the directory opens again with everything it wrote.
#[test]
fn a_second_open_of_the_same_directory_is_refused_while_the_first_is_open() {
    let dir = tempfile::tempdir().unwrap();
    let opts = ftkv_embedded::EmbeddedOptions {
        cache_size_bytes: 8 << 20,
        checkpoint_interval_bytes: None,
        checkpoint_interval_ms: None,
        ..ftkv_embedded::EmbeddedOptions::default()
    };
    let first = ftkv_embedded::Db::open_real(dir.path(), opts.clone()).unwrap();
    first.write(&[put("a", "1")]).unwrap();
    let err = ftkv_embedded::Db::open_real(dir.path(), opts.clone()).unwrap_err();
    assert!(matches!(err, EmbeddedError::Locked(_)), "got {err}");
    assert!(err.to_string().contains(&std::process::id().to_string()), "{err}");
    first.write(&[put("b", "2")]).unwrap();
    drop(first);
    let again = ftkv_embedded::Db::open_real(dir.path(), opts).unwrap();
    assert_eq!(again.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
    assert_eq!(again.get(b"b").unwrap().as_deref(), Some(&b"2"[..]));
}
