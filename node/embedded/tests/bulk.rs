#![allow(clippy::unwrap_used)]
//! `Db::bulk_load`: durable on return without the log (a reopen sees every row), atomic on a
//! duplicate, and ordinary writes around it keep working and replay.

use ftkv_embedded::{BulkLoadOptions, Db, EmbeddedError, EmbeddedOptions, OnDuplicate, WriteOp};

fn row(i: u64) -> (Vec<u8>, Vec<u8>) {
    (i.to_be_bytes().to_vec(), format!("summary-{i:032}").into_bytes())
}

#[test]
fn a_bulk_load_is_durable_and_atomic() {
    let dir = tempfile::tempdir().unwrap();
    let n = 50_000u64;
    {
        let db = Db::open_real(dir.path(), EmbeddedOptions::default()).unwrap();
        db.write(&[WriteOp::Put {
            key: b"before".to_vec(),
            value: b"1".to_vec(),
        }])
        .unwrap();
        // Unsorted rows with a small sort memory (spills).
        let opts = BulkLoadOptions {
            on_duplicate: OnDuplicate::Error,
            sort_memory_bytes: 64 << 10,
        };
        let mut rows = (0..n).map(|i| Ok(row((i * 7919) % n)));
        let r = db.bulk_load(&mut rows, &opts).unwrap();
        assert_eq!(r.rows_written, n);
        assert!(r.runs_spilled > 1, "{r:?}");
        // A duplicate of an existing key: nothing of this load is visible.
        let mut dup = [Ok((b"zz-new".to_vec(), b"x".to_vec())), Ok(row(5))].into_iter();
        let e = db.bulk_load(&mut dup, &opts).unwrap_err();
        assert!(
            matches!(
                e,
                EmbeddedError::Engine(ftkv_engine::EngineError::DuplicateKey { .. })
            ),
            "{e}"
        );
        assert_eq!(db.get(b"zz-new").unwrap(), None);
        db.write(&[WriteOp::Put {
            key: b"after".to_vec(),
            value: b"2".to_vec(),
        }])
        .unwrap();
        // Dropped without close: the write after the load replays on top of it.
    }
    let db = Db::open_real(dir.path(), EmbeddedOptions::default()).unwrap();
    let all = db.scan(b"", None, usize::MAX).unwrap();
    assert_eq!(all.len() as u64, n + 2);
    for i in [0, 1, n / 2, n - 1] {
        assert_eq!(db.get(&row(i).0).unwrap(), Some(row(i).1));
    }
    assert_eq!(db.get(b"before").unwrap(), Some(b"1".to_vec()));
    assert_eq!(db.get(b"after").unwrap(), Some(b"2".to_vec()));
    db.close().unwrap();
}
