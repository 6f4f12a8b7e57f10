//! Canary runs: a node in a test-only unsafe mode must be caught. A harness that cannot fail
//! proves nothing. These start real clusters in network namespaces (root, `ip`, `iptables`, the
//! binaries built), so they are ignored by default:
//! `cargo test -p ftkv-tests --lib jepsen::canary -- --ignored --nocapture`.
//! `tests/scenarios/ci-suite.sh` runs the same canary through the CLI.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::jepsen::checker::Verdict;
use crate::jepsen::db::SubstrateKind;
use crate::jepsen::nemesis::NemesisKind;
use crate::jepsen::runner::{run_test, TestOptions};
use crate::jepsen::workload::WorkloadKind;

fn options(name: &str, node_args: &[&str]) -> (TestOptions, tempfile::TempDir) {
    let store = tempfile::tempdir().unwrap();
    let mut o = TestOptions::new(WorkloadKind::Register);
    o.name = name.into();
    o.nemeses = vec![NemesisKind::Partition];
    o.time_limit_ms = 30_000;
    o.substrate = SubstrateKind::Netns;
    o.concurrency = 6;
    o.rate = 60.0;
    o.seed = 4;
    o.store = store.path().to_path_buf();
    o.node_args = node_args.iter().map(|s| s.to_string()).collect();
    (o, store)
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "starts a cluster in network namespaces (root); run with --ignored"]
async fn unsafe_local_reads_are_caught_by_register_under_partition() {
    let (o, _store) = options("canary-local-reads", &["--unsafe-local-reads"]);
    let outcome = run_test(&o, Arc::new(AtomicBool::new(false))).await.unwrap();
    let lin = outcome
        .results
        .iter()
        .find(|r| r.checker == "linearizable")
        .unwrap();
    assert_eq!(lin.verdict, Verdict::Invalid, "{}", lin.summary);
    assert_eq!(outcome.exit_code(), 1);
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "starts a cluster in network namespaces (root); run with --ignored"]
async fn safe_node_is_valid_under_the_same_schedule() {
    let (o, _store) = options("canary-control", &[]);
    let outcome = run_test(&o, Arc::new(AtomicBool::new(false))).await.unwrap();
    for r in &outcome.results {
        assert_eq!(r.verdict, Verdict::Valid, "{}: {}", r.checker, r.summary);
    }
}
