#![allow(clippy::unwrap_used)]
//! Crash safety through the fault-injecting file layer (issue 3, acceptance 2): thousands of
//! random crash points (every later operation fails, unsynced data is dropped, the last write
//! may be torn). After reopen the tree equals the model at the last durable checkpoint (or the
//! checkpoint in flight, if its header reached the disk whole) and `check_integrity` holds.
//!
//! Snapshot installs (`replace_all`) are among the crashed operations.
//!
//! `FTKV_CRASH_SEEDS` scales the number of seeds (default 300, 5 crashes each).

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use ftkv_engine::model::apply_ops;
use ftkv_engine::FractalEngine;
use ftkv_engine::{Engine, EngineError};
use ftkv_vfs::{FaultVfs, Vfs};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

type Map = BTreeMap<Vec<u8>, Vec<u8>>;

fn open(vfs: &Arc<FaultVfs>, cache: u64) -> ftkv_engine::Result<FractalEngine> {
    FractalEngine::open_with(
        vfs.clone() as Arc<dyn Vfs>,
        &opts("/engine".into(), cache, Some(1)),
        ftkv_engine::FractalOptions::with_tree(SMALL),
    )
}

struct Durable {
    data: Map,
    meta: Option<Vec<u8>>,
}

#[test]
fn random_crash_points_recover_the_last_checkpoint() {
    let seeds: u64 = std::env::var("FTKV_CRASH_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let mut crashes = 0u64;
    let mut mid_checkpoint = 0u64;
    for seed in 0..seeds {
        let mut seed_bytes = [0u8; 32];
        seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
        let mut runner = TestRunner::new_with_rng(
            Config::default(),
            TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
        );
        let rnd = |runner: &mut TestRunner, hi: u64| (0..hi).new_tree(runner).unwrap().current();
        let batch = proptest::collection::vec(write_op_strategy(), 1..20);
        let vfs = FaultVfs::new(seed);
        let cache = if seed % 2 == 0 { 4 << 10 } else { 1 << 20 };
        let mut durable = Durable {
            data: Map::new(),
            meta: None,
        };
        for cycle in 0..5 {
            // Arm a crash point some operations ahead (sometimes during open itself).
            let ahead = 1 + rnd(&mut runner, if cycle == 0 { 40 } else { 400 });
            vfs.set_crash_point(Some(vfs.op_count() + ahead));
            let mut live = durable.data.clone();
            let mut live_meta;
            let mut in_flight: Option<Durable> = None;
            if let Ok(e) = open(&vfs, cache) {
                assert_eq!(
                    dump(&e),
                    durable.data,
                    "seed {seed} cycle {cycle}: reopened state"
                );
                for step in 0..60 {
                    let ops = batch.new_tree(&mut runner).unwrap().current();
                    let meta = format!("s{seed}c{cycle}n{step}").into_bytes();
                    match e.write(&ops, Some(&meta)) {
                        Ok(()) => {
                            apply_ops(&mut live, &ops);
                            live_meta = Some(meta);
                        }
                        Err(EngineError::Io { .. }) | Err(EngineError::Poisoned) => break,
                        Err(other) => panic!("seed {seed}: unexpected {other}"),
                    }
                    if rnd(&mut runner, 25) == 0 {
                        // Snapshot install: every other key of the live state, durable on return.
                        let snap: Map = live
                            .iter()
                            .step_by(2)
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect();
                        let meta = format!("snap-s{seed}c{cycle}n{step}").into_bytes();
                        let mut pairs = snap.clone().into_iter().map(Ok);
                        let outcome = e.replace_all(&mut pairs, &meta);
                        live = snap;
                        live_meta = Some(meta);
                        match outcome {
                            Ok(()) => {
                                durable = Durable {
                                    data: live.clone(),
                                    meta: live_meta.clone(),
                                }
                            }
                            Err(EngineError::Io { .. }) | Err(EngineError::Poisoned) => {
                                in_flight = Some(Durable {
                                    data: live.clone(),
                                    meta: live_meta.clone(),
                                });
                                break;
                            }
                            Err(other) => panic!("seed {seed}: unexpected {other}"),
                        }
                        continue;
                    }
                    if rnd(&mut runner, 4) == 0 {
                        match e.checkpoint() {
                            Ok(()) => {
                                durable = Durable {
                                    data: live.clone(),
                                    meta: live_meta.clone(),
                                }
                            }
                            Err(EngineError::Io { .. }) | Err(EngineError::Poisoned) => {
                                in_flight = Some(Durable {
                                    data: live.clone(),
                                    meta: live_meta.clone(),
                                });
                                break;
                            }
                            Err(other) => panic!("seed {seed}: unexpected {other}"),
                        }
                    }
                }
            }
            drop(live);
            // Power loss.
            let torn = rnd(&mut runner, 2) == 0;
            vfs.crash(torn);
            crashes += 1;
            let e = open(&vfs, cache)
                .unwrap_or_else(|err| panic!("seed {seed} cycle {cycle}: reopen failed: {err}"));
            let got = dump(&e);
            let got_meta = e.meta().unwrap();
            if got != durable.data || got_meta != durable.meta {
                let Some(f) = in_flight.take() else {
                    panic!("seed {seed} cycle {cycle}: state differs from the last checkpoint (torn {torn})");
                };
                assert_eq!(
                    got, f.data,
                    "seed {seed} cycle {cycle}: neither old nor new checkpoint"
                );
                assert_eq!(got_meta, f.meta);
                mid_checkpoint += 1;
                durable = f;
            }
            e.check_integrity()
                .unwrap_or_else(|err| panic!("seed {seed} cycle {cycle}: {err}"));
        }
    }
    eprintln!("{crashes} crashes, {mid_checkpoint} recovered the checkpoint in flight");
    assert!(crashes >= seeds * 5);
}
