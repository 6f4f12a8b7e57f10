//! Model-based tests of [`Buffer`]: the log + hash-index buffer against the previous
//! `BTreeMap`-per-key buffer (kept here as the reference model), over random pushes with
//! out-of-order and repeated MSNs, superseding puts and deletes, range messages and merges.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

/// The previous buffer: point messages by key, each key's list in MSN order (reference model).
#[derive(Debug, Clone, Default)]
struct ModelBuffer {
    points: BTreeMap<Vec<u8>, Vec<(Msn, PointOp)>>,
    ranges: Vec<RangeMsg>,
    bytes: usize,
    delete_bytes: usize,
    count: usize,
}

impl ModelBuffer {
    fn push(&mut self, msg: Msg) {
        let size = msg.size_bytes();
        match msg {
            Msg::Point { msn, key, op } => {
                let key_len = key.len();
                let is_delete = matches!(op, PointOp::Delete);
                let supersedes = matches!(op, PointOp::Put(_) | PointOp::Delete);
                let list = self.points.entry(key).or_default();
                if supersedes {
                    let keep_from = list.partition_point(|(m, _)| *m < msn);
                    for (_, old) in list.drain(..keep_from) {
                        self.bytes -= point_size(&[], &old) + key_len;
                        if matches!(old, PointOp::Delete) {
                            self.delete_bytes -= MSG_OVERHEAD_BYTES;
                        }
                        self.count -= 1;
                    }
                }
                let pos = list.partition_point(|(m, _)| *m < msn);
                if list.get(pos).is_some_and(|(m, _)| *m == msn) {
                    return;
                }
                list.insert(pos, (msn, op));
                self.bytes += size;
                if is_delete {
                    self.delete_bytes += MSG_OVERHEAD_BYTES;
                }
                self.count += 1;
            }
            Msg::Range(r) => {
                let pos = self.ranges.partition_point(|x| x.msn < r.msn);
                if self.ranges.get(pos).is_some_and(|x| x.msn == r.msn) {
                    return;
                }
                if matches!(r.op, RangeOp::Delete) {
                    self.delete_bytes += size;
                }
                self.bytes += size;
                self.count += 1;
                self.ranges.insert(pos, r);
            }
        }
    }

    fn take_all(&mut self) -> Vec<Msg> {
        let taken = std::mem::take(self);
        let mut out = Vec::new();
        for (key, list) in taken.points {
            for (msn, op) in list {
                out.push(Msg::Point {
                    msn,
                    key: key.clone(),
                    op,
                });
            }
        }
        out.extend(taken.ranges.into_iter().map(Msg::Range));
        out.sort_by_key(Msg::msn);
        out
    }

    fn collect_for_key(&self, key: &[u8], out: &mut Vec<Msg>) {
        if let Some(list) = self.points.get(key) {
            for (msn, op) in list {
                out.push(Msg::Point {
                    msn: *msn,
                    key: key.to_vec(),
                    op: op.clone(),
                });
            }
        }
        for r in &self.ranges {
            if r.covers(key) {
                out.push(Msg::Range(r.clone()));
            }
        }
    }

    fn collect_for_range(&self, lo: Option<&[u8]>, hi: Option<&[u8]>, out: &mut Vec<Msg>) {
        if let (Some(l), Some(h)) = (lo, hi) {
            if l >= h {
                return;
            }
        }
        for (key, list) in &self.points {
            if lo.is_some_and(|l| key.as_slice() < l) || hi.is_some_and(|h| key.as_slice() >= h) {
                continue;
            }
            for (msn, op) in list {
                out.push(Msg::Point {
                    msn: *msn,
                    key: key.clone(),
                    op: op.clone(),
                });
            }
        }
        for r in &self.ranges {
            if r.overlaps(lo, hi) {
                out.push(Msg::Range(r.clone()));
            }
        }
    }

    fn msn_bounds(&self) -> Option<(Msn, Msn)> {
        let msns: Vec<Msn> = self
            .points
            .values()
            .flatten()
            .map(|(m, _)| *m)
            .chain(self.ranges.iter().map(|r| r.msn))
            .collect();
        Some((*msns.iter().min()?, *msns.iter().max()?))
    }
}

/// Keys of one or two bytes from a small alphabet, so keys repeat and supersede often.
fn key_strategy() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(b'a'..b'f', 1..3)
}

fn upsert_strategy() -> impl Strategy<Value = UpsertOp> {
    prop_oneof![
        (-5i64..5).prop_map(UpsertOp::Add),
        prop::collection::vec(any::<u8>(), 0..3).prop_map(UpsertOp::Append),
        prop::collection::vec(any::<u8>(), 0..3).prop_map(UpsertOp::SetIfAbsent),
        prop::collection::vec(any::<u8>(), 0..3).prop_map(UpsertOp::Max),
    ]
}

/// A message without its MSN (assigned by position in the pool).
fn body_strategy() -> impl Strategy<Value = (u8, Vec<u8>, Vec<u8>, Option<Vec<u8>>, UpsertOp)> {
    (
        0u8..20,
        key_strategy(),
        prop::collection::vec(any::<u8>(), 0..6),
        prop::option::of(key_strategy()),
        upsert_strategy(),
    )
}

fn make_msg(msn: Msn, body: &(u8, Vec<u8>, Vec<u8>, Option<Vec<u8>>, UpsertOp)) -> Msg {
    let (kind, key, value, end, up) = body.clone();
    match kind {
        0..=7 => Msg::Point {
            msn,
            key,
            op: PointOp::Put(value),
        },
        8..=11 => Msg::Point {
            msn,
            key,
            op: PointOp::Delete,
        },
        12..=17 => Msg::Point {
            msn,
            key,
            op: PointOp::Upsert(up),
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
            op: RangeOp::Upsert(up),
        }),
    }
}

/// Every key the strategies can produce, plus one they cannot.
fn all_keys() -> Vec<Vec<u8>> {
    let mut keys = vec![b"zz".to_vec()];
    for a in b'a'..b'f' {
        keys.push(vec![a]);
        for b in b'a'..b'f' {
            keys.push(vec![a, b]);
        }
    }
    keys
}

/// Compares every observable of `b` with the model.
fn assert_same(b: &Buffer, m: &ModelBuffer) -> Result<(), TestCaseError> {
    prop_assert_eq!(b.counters(), (m.bytes, m.delete_bytes, m.count));
    prop_assert_eq!(b.recompute(), b.counters());
    prop_assert_eq!(b.check_index(), Ok(()));
    prop_assert_eq!(b.msn_bounds(), m.msn_bounds());
    prop_assert_eq!(b.len(), m.count);
    for key in all_keys() {
        let (mut got, mut want) = (Vec::new(), Vec::new());
        b.collect_for_key(&key, key_hash(&key), &mut got);
        m.collect_for_key(&key, &mut want);
        prop_assert_eq!(got, want, "collect_for_key {:?}", key);
    }
    let bounds: [Option<&[u8]>; 5] = [None, Some(b"a"), Some(b"bc"), Some(b"d"), Some(b"zz")];
    for lo in bounds {
        for hi in bounds {
            let (mut got, mut want) = (Vec::new(), Vec::new());
            b.collect_for_range(lo, hi, &mut got);
            m.collect_for_range(lo, hi, &mut want);
            prop_assert_eq!(got, want, "collect_for_range {:?}..{:?}", lo, hi);
        }
    }
    for max_keys in [0usize, 1, 3] {
        let mut got = Vec::new();
        let cut = b.collect_for_range_limited(Some(b"b"), None, max_keys, &mut got);
        let mut want = Vec::new();
        m.collect_for_range(Some(b"b"), cut.as_deref(), &mut want);
        let want_keys: std::collections::BTreeSet<Vec<u8>> = m
            .points
            .keys()
            .filter(|k| k.as_slice() >= b"b".as_slice() && cut.as_ref().is_none_or(|c| *k < c))
            .cloned()
            .collect();
        // Complete below the cut, at most `max_keys` (at least one) distinct keys, and the cut
        // is the next buffered key.
        prop_assert!(want_keys.len() <= max_keys.max(1));
        if let Some(c) = &cut {
            prop_assert_eq!(want_keys.len(), max_keys.max(1));
            prop_assert!(m.points.contains_key(c));
        } else {
            prop_assert_eq!(
                want_keys.len(),
                m.points
                    .keys()
                    .filter(|k| k.as_slice() >= b"b".as_slice())
                    .count()
            );
        }
        let ranges_want: Vec<Msg> = m
            .ranges
            .iter()
            .filter(|r| r.overlaps(Some(b"b"), None))
            .cloned()
            .map(Msg::Range)
            .collect();
        let points_want: Vec<Msg> = want
            .into_iter()
            .filter(|x| matches!(x, Msg::Point { .. }))
            .collect();
        let mut full_want = points_want;
        full_want.extend(ranges_want);
        prop_assert_eq!(got, full_want, "collect_for_range_limited {}", max_keys);
    }
    let want = m.clone().take_all();
    prop_assert_eq!(b.messages(), want);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Pushes in arbitrary order with re-deliveries (the same MSN always carries the same
    /// message), checking every observable after each push, then `take_all`.
    #[test]
    fn buffer_matches_model(
        pool in prop::collection::vec(body_strategy(), 1..60),
        order in prop::collection::vec(any::<prop::sample::Index>(), 0..300),
        in_order in any::<bool>(),
    ) {
        let msgs: Vec<Msg> = pool.iter().enumerate().map(|(i, body)| make_msg(i as Msn + 1, body)).collect();
        let picks: Vec<usize> = if in_order {
            (0..msgs.len()).collect()
        } else {
            order.iter().map(|ix| ix.index(msgs.len())).collect()
        };
        let mut b = Buffer::new();
        let mut m = ModelBuffer::default();
        for (step, &i) in picks.iter().enumerate() {
            b.push(msgs[i].clone());
            m.push(msgs[i].clone());
            if step % 7 == 0 || step + 1 == picks.len() {
                assert_same(&b, &m)?;
            }
        }
        let got = b.take_all();
        prop_assert_eq!(got, m.take_all());
        prop_assert!(b.is_empty());
        prop_assert_eq!(b.counters(), (0, 0, 0));
        prop_assert_eq!(b.check_index(), Ok(()));
    }

    /// Long in-order streams over a few keys: most messages get superseded, so the log
    /// compacts repeatedly; results still match the model.
    #[test]
    fn buffer_compacts_like_model(
        pool in prop::collection::vec(body_strategy(), 200..600),
    ) {
        let mut b = Buffer::new();
        let mut m = ModelBuffer::default();
        for (i, body) in pool.iter().enumerate() {
            let msg = make_msg(i as Msn + 1, body);
            b.push(msg.clone());
            m.push(msg);
            if i % 50 == 0 {
                assert_same(&b, &m)?;
            }
        }
        assert_same(&b, &m)?;
        prop_assert!(b.slots.len() <= 2 * b.len() + COMPACT_MIN_DEAD, "{} slots for {} messages", b.slots.len(), b.len());
    }

    /// Merging two buffers (children merge) equals the model's merge, in both directions.
    #[test]
    fn buffer_absorb_matches_model(
        pool in prop::collection::vec(body_strategy(), 1..80),
        side in prop::collection::vec(any::<bool>(), 80),
    ) {
        let mut parts = [Buffer::new(), Buffer::new()];
        let mut models = [ModelBuffer::default(), ModelBuffer::default()];
        for (i, body) in pool.iter().enumerate() {
            let msg = make_msg(i as Msn + 1, body);
            let s = usize::from(side[i]);
            parts[s].push(msg.clone());
            models[s].push(msg);
        }
        let [b0, b1] = parts;
        let [m0, m1] = models;
        let (mut b, mut m) = (b1.clone(), m1.clone());
        b.absorb(b0.clone());
        for msg in m0.clone().take_all() {
            m.push(msg);
        }
        assert_same(&b, &m)?;
        let (mut b, mut m) = (b0, m0);
        b.absorb(b1);
        for msg in m1.clone().take_all() {
            m.push(msg);
        }
        assert_same(&b, &m)?;
    }
}

#[test]
fn put_supersedes_older_messages_of_its_key_only() {
    let mut b = Buffer::new();
    let up = |msn, key: &[u8]| Msg::Point {
        msn,
        key: key.to_vec(),
        op: PointOp::Upsert(UpsertOp::Add(1)),
    };
    b.push(up(1, b"k"));
    b.push(up(2, b"other"));
    b.push(up(4, b"k"));
    // Put at MSN 3 arrives late: supersedes MSN 1 only, MSN 4 stays.
    b.push(Msg::Point {
        msn: 3,
        key: b"k".to_vec(),
        op: PointOp::Put(b"v".to_vec()),
    });
    let mut got = Vec::new();
    b.collect_for_key(b"k", key_hash(b"k"), &mut got);
    assert_eq!(got.iter().map(Msg::msn).collect::<Vec<_>>(), vec![3, 4]);
    assert_eq!(b.len(), 3);
    // Re-delivery of MSN 4 changes nothing.
    let before = b.counters();
    b.push(up(4, b"k"));
    assert_eq!(b.counters(), before);
    assert_eq!(
        b.take_all().iter().map(Msg::msn).collect::<Vec<_>>(),
        vec![2, 3, 4]
    );
}

#[test]
fn delete_bytes_track_point_and_range_deletes() {
    let mut b = Buffer::new();
    b.push(Msg::Point {
        msn: 1,
        key: b"a".to_vec(),
        op: PointOp::Delete,
    });
    assert_eq!(b.flush_weight(), b.bytes() + MSG_OVERHEAD_BYTES);
    // A put supersedes the delete: no delete bytes left.
    b.push(Msg::Point {
        msn: 2,
        key: b"a".to_vec(),
        op: PointOp::Put(b"x".to_vec()),
    });
    assert_eq!(b.flush_weight(), b.bytes());
    assert_eq!(b.bytes(), MSG_OVERHEAD_BYTES + 2);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// `key_cmp`'s 8-byte fast path gives exactly the byte-wise order of slices, for keys that
    /// share prefixes, differ in length, or are shorter than 8 bytes.
    #[test]
    fn key_cmp_is_the_bytewise_order(
        prefix in proptest::collection::vec(any::<u8>(), 0..10),
        a in proptest::collection::vec(prop_oneof![Just(0u8), Just(255u8), any::<u8>()], 0..12),
        b in proptest::collection::vec(prop_oneof![Just(0u8), Just(255u8), any::<u8>()], 0..12),
    ) {
        let ka = [prefix.as_slice(), a.as_slice()].concat();
        let kb = [prefix.as_slice(), b.as_slice()].concat();
        prop_assert_eq!(key_cmp(&ka, &kb), ka.cmp(&kb));
        prop_assert_eq!(key_cmp(&kb, &ka), kb.cmp(&ka));
        prop_assert_eq!(key_cmp(&ka, &ka), std::cmp::Ordering::Equal);
    }

    /// The prefix search finds the same position as a plain `partition_point` over the keys,
    /// for sorted keys with shared prefixes, zero bytes (which pad short prefixes), short keys,
    /// and probes present and absent.
    #[test]
    fn prefix_search_is_partition_point(
        prefix in proptest::collection::vec(prop_oneof![Just(0u8), any::<u8>()], 0..10),
        tails in proptest::collection::vec(
            proptest::collection::vec(prop_oneof![Just(0u8), Just(1u8), any::<u8>()], 0..6), 0..40),
        probe in proptest::collection::vec(prop_oneof![Just(0u8), Just(1u8), any::<u8>()], 0..6),
        probe_existing in any::<bool>(),
    ) {
        let mut keys: Vec<Vec<u8>> = tails.iter().map(|t| [prefix.as_slice(), t.as_slice()].concat()).collect();
        keys.sort();
        keys.dedup();
        let prefixes: Vec<u64> = keys.iter().map(|k| key_prefix(k)).collect();
        let probe = match keys.first() {
            Some(k) if probe_existing => k.clone(),
            _ => [prefix.as_slice(), probe.as_slice()].concat(),
        };
        for key in keys.iter().chain(std::iter::once(&probe)) {
            let want = keys.partition_point(|k| k.as_slice() <= key.as_slice());
            let got = count_at_or_below(&prefixes, key, |i| keys[i].as_slice() <= key.as_slice());
            prop_assert_eq!(got, want);
        }
    }
}
