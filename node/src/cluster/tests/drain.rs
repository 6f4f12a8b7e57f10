//! The leadership hand-off of a drain (`TimeoutNow`) between in-process nodes.

use super::*;

/// A follower that is draining itself refuses `TimeoutNow` (it is about to stop and would drop
/// the leadership at once), and a draining leader hands its leadership to the other follower.
/// Before the refusal, the draining follower took the leadership.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_draining_follower_refuses_the_leadership_and_the_leader_hands_it_to_another() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (nodes, peers) = start_three_model_nodes(&dirs).await;
    nodes[0].node.initialize(peers.clone(), 10_000).await.unwrap();
    let all: Vec<&ClusterNode> = nodes.iter().map(|n| &n.node).collect();
    let leader_id = wait_for_leader(&all, Duration::from_secs(15)).await;
    let leader = nodes[(leader_id - 1) as usize].node.clone();
    let followers: Vec<u64> = (1..=3).filter(|id| *id != leader_id).collect();
    let (stopping, other) = (followers[0], followers[1]);
    // Both followers hold the leader's whole log (the membership entry at least).
    let deadline = Instant::now() + Duration::from_secs(15);
    while followers
        .iter()
        .any(|id| nodes[(*id - 1) as usize].node.status().applied_index < leader.status().commit_index)
    {
        assert!(Instant::now() < deadline, "followers did not catch up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    nodes[(stopping - 1) as usize].node.begin_drain();
    let refused = network::timeout_now(
        &network::Channels::with_tls(None),
        &peers[&stopping],
        leader_id,
        leader.cluster_id(),
        Duration::from_secs(5),
    )
    .await
    .expect_err("a draining follower must refuse to take the leadership");
    assert!(refused.to_string().contains("draining"), "{refused}");
    assert_ne!(
        nodes[(stopping - 1) as usize].node.status().role,
        "leader",
        "the draining follower campaigned"
    );

    match leader.drain(Duration::from_secs(20)).await {
        DrainOutcome::HandedOff { to } => assert_eq!(to, other, "handed to the draining node"),
        outcome => panic!("the leader did not hand its leadership over: {outcome:?}"),
    }
    for node in nodes {
        node.stop().await;
    }
}
