#![allow(clippy::unwrap_used)]
//! Free space inside the tree file goes back to the file system: after a bulk load whose extra
//! ops delete the rows it was staged as (as the replicated node's commit does), the staging
//! blocks are free once no checkpoint refers to them, and a checkpoint punches them out of the
//! file, so the file's allocated blocks shrink although its length (the live tree's end) stays.

use std::os::unix::fs::MetadataExt as _;

use ftkv_engine::{
    BulkLoadOptions, Engine, EngineOptions, FractalEngine, KeyValue, OnDuplicate, WriteOp, TREE_FILE_NAME,
};

/// A value that zstd cannot shrink much (xorshift bytes), so the staging takes real space.
fn value(i: u64) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..200)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x & 0xFF) as u8
        })
        .collect()
}

fn row(prefix: &str, i: u64) -> KeyValue {
    (format!("{prefix}{i:08}").into_bytes(), value(i))
}

/// (file length, bytes the file system allocated for it).
fn tree_file_sizes(dir: &std::path::Path) -> (u64, u64) {
    let m = std::fs::metadata(dir.join(TREE_FILE_NAME)).unwrap();
    (m.len(), m.blocks() * 512)
}

#[test]
fn freed_staging_space_is_given_back_to_the_file_system() {
    const ROWS: u64 = 60_000; // about 12 MB of values
    let tmp = tempfile::tempdir().unwrap();
    let opts = EngineOptions {
        dir: tmp.path().to_path_buf(),
        cache_size_bytes: 64 << 20,
        compression_level: Some(1),
    };
    let e = FractalEngine::open(ftkv_vfs::RealVfs::new(), &opts).unwrap();
    // Stage the rows as ordinary writes under "s/", durable in a checkpoint.
    for start in (0..ROWS).step_by(1000) {
        let ops: Vec<WriteOp> = (start..start + 1000)
            .map(|i| {
                let (key, value) = row("s/", i);
                WriteOp::Put { key, value }
            })
            .collect();
        e.write(&ops, None).unwrap();
    }
    e.checkpoint().unwrap();
    let (staged_len, staged_alloc) = tree_file_sizes(tmp.path());
    assert!(
        staged_alloc > 8 << 20,
        "the staging takes space: {staged_alloc} bytes"
    );

    // The load: the same rows under "r/", deleting the staging in the same step.
    let extra = [WriteOp::DeleteRange {
        start: b"s/".to_vec(),
        end: Some(b"s0".to_vec()),
    }];
    let mut rows = (0..ROWS).map(|i| Ok(row("r/", i)));
    let load = BulkLoadOptions {
        on_duplicate: OnDuplicate::Error,
        sort_memory_bytes: 64 << 20,
    };
    let report = e.bulk_load(&mut rows, &load, &extra, Some(b"loaded")).unwrap();
    assert_eq!(report.rows_written, ROWS);
    // The staging blocks are free once neither the newest checkpoint nor its fallback refers
    // to them: two more checkpoints.
    for _ in 0..3 {
        e.checkpoint().unwrap();
    }
    let (len, alloc) = tree_file_sizes(tmp.path());
    assert!(
        len > staged_len,
        "the load was built after the staging (file {len} bytes, staging {staged_len})"
    );
    assert!(
        alloc + staged_alloc / 2 < len,
        "the freed staging space ({staged_alloc} bytes) stays allocated: file {len} bytes, {alloc} allocated"
    );
    // Nothing of the tree was harmed, and the file reopens.
    assert_eq!(e.check_integrity().unwrap().keys, ROWS);
    drop(e);
    let e = FractalEngine::open(ftkv_vfs::RealVfs::new(), &opts).unwrap();
    assert_eq!(e.check_integrity().unwrap().keys, ROWS);
    assert_eq!(e.get(b"r/00001234").unwrap(), Some(value(1234)));
    assert_eq!(e.get(b"s/00001234").unwrap(), None);
}
