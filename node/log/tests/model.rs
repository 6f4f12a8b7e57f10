//! Property test: the log against a Vec model across clean reopens and crashes after `sync`.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use common::{append_wait, read_all};
use ftkv_log::{Log, LogOptions, SyncMode};
use ftkv_vfs::FaultVfs;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Append { n: u8, size: u16 },
    Truncate { back: u8 },
    Purge { ahead: u8 },
    Meta { key: u8, value: u8, durable: bool },
    Read { from: u8, len: u8, max_bytes: u16 },
    Reopen,
    SyncThenCrash { torn: bool },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1u8..6, 0u16..400).prop_map(|(n, size)| Op::Append { n, size }),
        1 => (0u8..10).prop_map(|back| Op::Truncate { back }),
        1 => (0u8..12).prop_map(|ahead| Op::Purge { ahead }),
        1 => (0u8..3, any::<u8>(), any::<bool>()).prop_map(|(key, value, durable)| Op::Meta { key, value, durable }),
        2 => (0u8..30, 0u8..20, 0u16..2000).prop_map(|(from, len, max_bytes)| Op::Read { from, len, max_bytes }),
        1 => Just(Op::Reopen),
        1 => any::<bool>().prop_map(|torn| Op::SyncThenCrash { torn }),
    ]
}

fn open(vfs: &Arc<FaultVfs>) -> Log {
    Log::open(
        vfs.clone(),
        Path::new("/log"),
        LogOptions {
            segment_size_bytes: 1024,
            sync: SyncMode::Always,
        },
    )
    .unwrap()
}

fn payload(i: u64, size: u16) -> Bytes {
    Bytes::from(vec![(i % 251) as u8; size as usize])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn log_matches_vec_model(ops in prop::collection::vec(op(), 1..80)) {
        let vfs = FaultVfs::new(1);
        let mut log = open(&vfs);
        let mut model: Vec<(u64, Bytes)> = Vec::new();
        let mut metas: BTreeMap<String, Bytes> = BTreeMap::new();
        let mut next: u64 = 1;
        let mut purged: u64 = 0;
        for op in ops {
            match op {
                Op::Append { n, size } => {
                    let recs: Vec<(u64, Bytes)> =
                        (next..next + u64::from(n)).map(|i| (i, payload(i, size))).collect();
                    append_wait(&log, recs.clone()).unwrap();
                    model.extend(recs);
                    next += u64::from(n);
                }
                Op::Truncate { back } => {
                    let from = next.saturating_sub(u64::from(back)).max(1);
                    log.truncate(from).unwrap();
                    model.retain(|(i, _)| *i < from);
                    next = model.last().map_or(from.max(purged + 1), |(l, _)| l + 1);
                }
                Op::Purge { ahead } => {
                    let first = model.first().map_or(next, |e| e.0);
                    let up_to = first + u64::from(ahead);
                    log.purge(up_to).unwrap();
                    model.retain(|(i, _)| *i > up_to);
                    purged = purged.max(up_to);
                    if model.is_empty() { next = next.max(up_to + 1) }
                }
                Op::Meta { key, value, durable } => {
                    let k = format!("k{key}");
                    let v = Bytes::from(vec![value; usize::from(value)]);
                    log.put_meta(&k, v.clone(), durable).unwrap();
                    metas.insert(k, v);
                }
                Op::Read { from, len, max_bytes } => {
                    let first = model.first().map_or(0, |e| e.0);
                    let start = first + u64::from(from);
                    let end = start + u64::from(len);
                    let got = log.read_range(start, end, usize::from(max_bytes)).unwrap();
                    let all: Vec<_> = model.iter().filter(|(i, _)| *i >= start && *i < end).cloned().collect();
                    prop_assert!(got.len() <= all.len());
                    prop_assert_eq!(&got[..], &all[..got.len()]);
                    if !all.is_empty() {
                        prop_assert!(!got.is_empty());
                        let bytes: usize = got.iter().map(|(_, p)| p.len()).sum();
                        prop_assert!(got.len() == 1 || bytes <= usize::from(max_bytes));
                        if got.len() < all.len() {
                            prop_assert!(bytes + all[got.len()].1.len() > usize::from(max_bytes));
                        }
                    }
                }
                Op::Reopen => {
                    drop(log);
                    log = open(&vfs);
                }
                Op::SyncThenCrash { torn } => {
                    log.sync().unwrap();
                    vfs.set_crash_point(Some(vfs.op_count()));
                    drop(log);
                    vfs.crash(torn);
                    log = open(&vfs);
                }
            }
            prop_assert_eq!(log.first_index(), model.first().map(|e| e.0));
            prop_assert_eq!(log.last_index(), model.last().map(|e| e.0));
        }
        prop_assert_eq!(read_all(&log), model);
        for (k, v) in &metas {
            prop_assert_eq!(log.get_meta(k), Some(v.clone()));
        }
    }
}
