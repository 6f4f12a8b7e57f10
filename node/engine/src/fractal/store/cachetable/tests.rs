use super::*;
use crate::fractal::msg::{Buffer, PointOp};
use crate::fractal::node::{Internal, Leaf};

fn leaf(rows: usize) -> Node {
    let entries = (0..rows)
        .map(|i| (format!("key{i:04}").into_bytes(), vec![7u8; 100]))
        .collect();
    Node::Leaf(Leaf::from_entries(entries, 1, 1 << 20))
}

fn internal() -> Node {
    Node::Internal(Internal {
        height: 1,
        pivots: vec![b"m".to_vec()],
        children: vec![10, 11],
        buffers: vec![Buffer::new(), Buffer::new()],
    })
}

fn put(i: u64) -> Msg {
    Msg::Point {
        msn: i,
        key: format!("a{i}").into_bytes(),
        op: PointOp::Put(vec![1u8; 50]),
    }
}

/// The counters follow every change and always equal what the entries add up to.
#[test]
fn counters_follow_inserts_marks_pushes_and_removals() {
    let mut ct = Cachetable::new(1 << 20);
    let (a, b, c) = (
        leaf(10).size_bytes(),
        leaf(20).size_bytes(),
        internal().size_bytes(),
    );
    ct.insert(1, leaf(10), false, 1);
    ct.insert(2, leaf(20), true, 1);
    ct.insert(3, internal(), true, CLOCK_MAX);
    assert_eq!((ct.cached_bytes(), ct.dirty_bytes()), (a + b + c, b + c));
    ct.check_counters().unwrap();
    // Replacing an entry counts only the new node.
    ct.insert(1, leaf(20), true, 1);
    assert_eq!((ct.cached_bytes(), ct.dirty_bytes()), (b + b + c, b + b + c));
    ct.mark_clean(1);
    ct.mark_clean(1);
    assert_eq!(ct.dirty_bytes(), b + c, "marking clean twice counts once");
    ct.check_counters().unwrap();
    // A push in place grows the internal node's entry and keeps it dirty.
    assert!(matches!(
        ct.push_in_place(3, put(5), usize::MAX),
        InPlacePush::Done
    ));
    let c2 = ct.entry(3).unwrap().bytes;
    assert!(c2 > c, "the pushed message is counted");
    assert_eq!((ct.cached_bytes(), ct.dirty_bytes()), (b + b + c2, b + c2));
    assert!(matches!(ct.push_in_place(3, put(6), 0), InPlacePush::Gorged));
    assert!(
        matches!(ct.push_in_place(2, put(7), usize::MAX), InPlacePush::NotHere(_)),
        "a leaf"
    );
    assert!(
        matches!(ct.push_in_place(9, put(8), usize::MAX), InPlacePush::NotHere(_)),
        "not cached"
    );
    ct.check_counters().unwrap();
    for id in [1, 2, 3] {
        assert!(ct.remove(id).is_some());
        ct.check_counters().unwrap();
    }
    assert!(ct.remove(3).is_none());
    assert_eq!(
        (ct.cached_bytes(), ct.dirty_bytes(), ct.evicting_bytes()),
        (0, 0, 0)
    );
}

/// Eviction takes clean victims first, passes dirty ones for a ring's length, then queues them
/// for the writeback thread while the background share has room and hands the rest out to be
/// written inline; the pinned node stays.
#[test]
fn eviction_takes_clean_first_then_queues_then_writes_dirty_inline() {
    let one = leaf(20).size_bytes();
    let mut ct = Cachetable::new(100 * one);
    ct.set_background_writes(true);
    // Room in the share for one queued victim beside nothing reserved.
    ct.set_background_share(one);
    for id in 1..=6u64 {
        ct.insert(id, leaf(20), id % 2 == 0, 0);
    }
    let pinned = 1;
    // Target: two nodes' worth.
    let mut walk = ct.eviction_walk(2 * one, pinned, false);
    let victim = ct
        .next_inline_victim(&mut walk)
        .expect("a dirty victim to write inline");
    // Clean 3 and 5 went; 2 was queued (the share had room for one); 1 is pinned.
    assert!(ct.contains(1), "the pinned node stays");
    assert!(!ct.contains(3) && !ct.contains(5), "clean victims go first");
    let stats = ct.eviction_stats();
    assert_eq!((stats.clean, stats.handed_to_writeback), (2, 1), "{stats:?}");
    assert_eq!(ct.evicting_bytes(), one);
    assert!(ct.entry(2).unwrap().evicting, "the first dirty victim is queued");
    assert_eq!(ct.take_write_soon(), vec![2]);
    assert_eq!(victim.id % 2, 0, "a dirty victim");
    assert_ne!(victim.id, 2, "the queued victim is not handed out again");
    assert_eq!((stats.inline_leaves, stats.inline_bytes), (1, one as u64));
    drop(victim.node);
    ct.evict_victim(victim.id);
    assert!(!ct.contains(victim.id));
    ct.check_counters().unwrap();
    // Held bytes: pinned 1 and the other dirty leaf; the queued victim is not counted.
    assert_eq!(ct.held_bytes(), 2 * one);
    assert!(ct.next_inline_victim(&mut walk).is_none(), "within the target");
    // Without a background writer queued victims go back to the ring's course.
    ct.set_background_writes(false);
    ct.unmark_all_evicting();
    assert_eq!(ct.evicting_bytes(), 0);
    ct.check_counters().unwrap();
}

/// Under a full disk's hold the walk evicts clean nodes only.
#[test]
fn a_hold_keeps_dirty_nodes_cached() {
    let one = leaf(20).size_bytes();
    let mut ct = Cachetable::new(100 * one);
    for id in 1..=4u64 {
        ct.insert(id, leaf(20), id > 2, 0);
    }
    let mut walk = ct.eviction_walk(0, 0, true);
    assert!(ct.next_inline_victim(&mut walk).is_none());
    assert!(!ct.contains(1) && !ct.contains(2), "clean nodes go");
    assert!(ct.contains(3) && ct.contains(4), "dirty nodes stay");
    assert!(ct.all_dirty());
    ct.check_counters().unwrap();
}
