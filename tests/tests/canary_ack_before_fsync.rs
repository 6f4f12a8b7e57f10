//! Issue 4, acceptance 2: the ack-before-fsync canary is caught by `set` under
//! `kill,lose-unsynced`, and the same run on a safe node is valid.
//!
//! Both runs go through the Jepsen harness on the `local` substrate (no root needed): nodes run
//! with `--unsafe-lose-unsynced-on-kill`, so a SIGKILL loses every write not yet fsynced, like a
//! power cut. A random schedule draws a whole-cluster power cut only now and then; to keep the
//! runs short and deterministic the nemesis is a script of repeated whole-cluster `lose-unsynced`
//! kills under a heavy `set` load, each after 6 s of recovery so that it lands under load. The loss
//! window of the canary is the time between an acknowledgement and the fsync that follows it, and
//! the harness kills the nodes one after the other (a millisecond or so apart): both runs simulate
//! a 50 ms fdatasync (`--unsafe-lose-unsynced-sync-latency-ms 50`; this machine's disk syncs in
//! 0.1 ms), so at about 200 acknowledgements a second every cut of the canary loses some. Log
//! segments are 1 MiB (a config file) so that three nodes recovering at once restart in well under
//! a second in a debug build.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap: a failure is the test failing

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use ftkv_tests::fixture::serial;
use ftkv_tests::jepsen::checker::Verdict;
use ftkv_tests::jepsen::db::SubstrateKind;
use ftkv_tests::jepsen::nemesis::NemesisKind;
use ftkv_tests::jepsen::runner::{run_test, TestOptions};
use ftkv_tests::jepsen::scenario::{Step, TargetSpec};
use ftkv_tests::jepsen::workload::WorkloadKind;

/// Whole-cluster power cuts: every node killed at once, losing what it had not fsynced.
const CUTS: u32 = 3;

fn options(name: &str, canary: bool, store: &std::path::Path) -> TestOptions {
    let config = store.join("node.toml");
    std::fs::write(&config, "[log]\nsegment_size = \"1MiB\"\n").unwrap();
    let mut node_args: Vec<String> = vec![
        "--unsafe-lose-unsynced-sync-latency-ms".into(),
        "50".into(),
        "--config".into(),
        config.display().to_string(),
    ];
    if canary {
        node_args.push("--unsafe-ack-before-fsync".into());
    }
    let mut o = TestOptions::new(WorkloadKind::Set);
    o.name = name.into();
    o.nemeses = vec![NemesisKind::Kill, NemesisKind::LoseUnsynced];
    o.time_limit_ms = 15_000;
    o.substrate = SubstrateKind::Local;
    o.concurrency = 10;
    o.rate = 400.0;
    o.seed = 41;
    o.store = store.to_path_buf();
    o.node_args = node_args;
    let all = || TargetSpec::Name("all".into());
    o.script = Some(vec![Step::Repeat {
        times: CUTS,
        steps: vec![
            Step::Wait {
                duration: "6s".into(),
            },
            Step::LoseUnsynced { target: all() },
            Step::Wait {
                duration: "200ms".into(),
            },
            Step::Restart { target: all() },
        ],
    }]);
    o
}

#[tokio::test(flavor = "multi_thread")]
async fn ack_before_fsync_loses_acknowledged_adds_under_lose_unsynced() {
    let _serial = serial().await;
    let store = tempfile::tempdir().unwrap();
    let o = options("canary-ack-before-fsync", true, store.path());
    let outcome = run_test(&o, Arc::new(AtomicBool::new(false))).await.unwrap();
    let set = outcome.results.iter().find(|r| r.checker == "set").unwrap();
    assert_eq!(
        set.verdict,
        Verdict::Invalid,
        "the canary was not caught: {} (report {})",
        set.summary,
        outcome.dir.display()
    );
    // Invalid for the right reason: acknowledged adds missing from the final read.
    assert!(!set.summary.contains(": 0 lost"), "{}", set.summary);
    assert_eq!(outcome.exit_code(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn safe_node_keeps_every_acknowledged_add_under_the_same_cuts() {
    let _serial = serial().await;
    let store = tempfile::tempdir().unwrap();
    let o = options("canary-ack-before-fsync-control", false, store.path());
    let outcome = run_test(&o, Arc::new(AtomicBool::new(false))).await.unwrap();
    for r in &outcome.results {
        assert_eq!(
            r.verdict,
            Verdict::Valid,
            "{}: {} (report {})",
            r.checker,
            r.summary,
            outcome.dir.display()
        );
    }
    // The cuts really happened: one start-lose-unsynced per cut in the history.
    let history = std::fs::read_to_string(outcome.dir.join("history.jsonl")).unwrap();
    let cuts = history
        .lines()
        .filter(|l| l.contains("\"start-lose-unsynced\"") && l.contains("\"info\""))
        .count();
    assert_eq!(cuts, CUTS as usize, "{}", outcome.dir.display());
}
