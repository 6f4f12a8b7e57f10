use proptest::prelude::*;

use super::*;
use crate::fractal::msg::RangeMsg;
use crate::fractal::msg::RangeOp;
use crate::ops::UpsertOp;

fn msg_strategy() -> impl Strategy<Value = (u8, Vec<u8>, Vec<u8>, Option<Vec<u8>>, i64)> {
    (
        0u8..20,
        prop::collection::vec(b'a'..b'h', 1..3),
        prop::collection::vec(any::<u8>(), 0..40),
        prop::option::of(prop::collection::vec(b'a'..b'h', 1..3)),
        -3i64..3,
    )
}

fn make(msn: Msn, (kind, key, value, end, n): (u8, Vec<u8>, Vec<u8>, Option<Vec<u8>>, i64)) -> Msg {
    match kind {
        0..=9 => Msg::Point {
            msn,
            key,
            op: PointOp::Put(value),
        },
        10..=13 => Msg::Point {
            msn,
            key,
            op: PointOp::Delete,
        },
        14..=17 => Msg::Point {
            msn,
            key,
            op: PointOp::Upsert(UpsertOp::Append(value)),
        },
        18 => Msg::Range(RangeMsg {
            msn,
            start: key,
            end,
            op: RangeOp::Delete,
        }),
        _ => Msg::Range(RangeMsg {
            msn,
            start: key,
            end,
            op: RangeOp::Upsert(UpsertOp::Add(n)),
        }),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// In-place `set` (appends, shifts slots, compacts the arena) equals a BTreeMap, and the
    /// counted sizes match the entries.
    #[test]
    // Keys in big-endian so their byte order is their numeric order (test data).
    #[allow(clippy::big_endian_bytes)]
    fn basement_set_matches_a_btreemap(
        ops in prop::collection::vec((0u16..300, prop::option::of(prop::collection::vec(any::<u8>(), 0..200))), 0..600),
    ) {
        let mut b = Basement::empty(0);
        let mut model = std::collections::BTreeMap::new();
        for (k, v) in ops {
            let key = k.to_be_bytes().to_vec();
            b.set(&key, v.as_deref());
            match v {
                Some(v) => { model.insert(key, v); }
                None => { model.remove(&key); }
            }
        }
        prop_assert_eq!(b.to_entries(), model.clone().into_iter().collect::<Vec<_>>());
        prop_assert_eq!(b.data_bytes(), b.recompute_data_bytes());
        prop_assert!(b.garbage_bytes <= 4096 || b.garbage_bytes * 2 <= b.data.len());
        for (k, v) in &model {
            prop_assert_eq!(b.get(k), Some(v.as_slice()));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Batch application (sorted merge per basement, owned keys and values) equals applying
    /// each message on its own in MSN order, including messages at or below the basements'
    /// applied MSN (skipped), and normalizing afterwards keeps the entries.
    #[test]
    fn apply_batch_equals_one_by_one(
        initial in prop::collection::btree_map(prop::collection::vec(b'a'..b'h', 1..3), prop::collection::vec(any::<u8>(), 0..40), 0..40),
        floor in 0u64..20,
        msgs in prop::collection::vec(msg_strategy(), 0..60),
        basement_size_bytes in 64usize..400,
    ) {
        // The model: a BTreeMap with every message above the floor applied in MSN order.
        let mut model = initial.clone();
        let entries: Vec<(Vec<u8>, Vec<u8>)> = initial.into_iter().collect();
        let leaf = Leaf::from_entries(entries, floor, basement_size_bytes);
        let msgs: Vec<Msg> = msgs.into_iter().enumerate().map(|(i, m)| make(i as Msn + 1, m)).collect();
        let mut one = leaf.clone();
        for m in &msgs {
            one.apply(m);
        }
        let msgs_for_model = msgs.clone();
        let mut batch = leaf;
        batch.apply_batch(msgs);
        prop_assert_eq!(batch.basements.len(), one.basements.len());
        for (a, b) in batch.basements.iter().zip(&one.basements) {
            prop_assert_eq!(a.to_entries(), b.to_entries());
            prop_assert_eq!(a.max_msn, b.max_msn);
            prop_assert_eq!(a.data_bytes, b.data_bytes);
        }
        let want = one.clone().into_entries();
        for m in msgs_for_model.iter().filter(|m| m.msn() > floor) {
            match m {
                Msg::Point { key, op, .. } => match apply_point(model.get(key).cloned(), op) {
                    Some(v) => { model.insert(key.clone(), v); }
                    None => { model.remove(key); }
                },
                Msg::Range(r) => {
                    let keys: Vec<Vec<u8>> = model.keys().filter(|k| r.covers(k)).cloned().collect();
                    for k in keys {
                        match model.get(&k).and_then(|v| apply_range(v, &r.op)) {
                            Some(v) => { model.insert(k, v); }
                            None => { model.remove(&k); }
                        }
                    }
                }
            }
        }
        prop_assert_eq!(&want, &model.into_iter().collect::<Vec<_>>());
        batch.normalize(basement_size_bytes);
        for b in &batch.basements {
            prop_assert!(b.size_bytes() <= basement_size_bytes || b.len() == 1);
        }
        prop_assert_eq!(batch.basements.len(), batch.pivots.len() + 1);
        for (i, b) in batch.basements.iter().enumerate() {
            let (lo, hi) = child_bounds(&batch.pivots, i, None, None);
            prop_assert!(b.iter().all(|(k, _)| lo.is_none_or(|l| k >= l) && hi.is_none_or(|h| k < h)));
        }
        prop_assert_eq!(batch.into_entries(), want);
    }
}
