use super::{drop_superseded, Msg, PointOp};
use crate::UpsertOp;

fn point(key: &[u8], msn: u64, op: PointOp) -> Msg {
    Msg::Point {
        key: key.to_vec(),
        msn,
        op,
    }
}

/// Sorted (key, MSN) input: a Put or Delete drops the older messages of its key (however
/// many), re-delivered duplicates collapse to one, and upserts after the newest Put stay.
#[test]
fn drop_superseded_keeps_what_can_still_change_the_outcome() {
    let add = || PointOp::Upsert(UpsertOp::Add(1));
    let mut msgs = vec![
        point(b"a", 1, add()),
        point(b"a", 2, add()),
        point(b"a", 3, PointOp::Put(b"x".to_vec())),
        point(b"a", 3, PointOp::Put(b"x".to_vec())),
        point(b"a", 5, add()),
        point(b"b", 1, PointOp::Put(b"y".to_vec())),
        point(b"b", 4, add()),
        point(b"b", 4, add()),
        point(b"c", 2, add()),
        point(b"c", 6, PointOp::Delete),
    ];
    drop_superseded(&mut msgs);
    assert_eq!(
        msgs,
        vec![
            point(b"a", 3, PointOp::Put(b"x".to_vec())),
            point(b"a", 5, add()),
            point(b"b", 1, PointOp::Put(b"y".to_vec())),
            point(b"b", 4, add()),
            point(b"c", 6, PointOp::Delete),
        ]
    );
}
