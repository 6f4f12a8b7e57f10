#![allow(clippy::unwrap_used)]
//! Conformance suite (issue 3, acceptance 1): the same random op sequences (puts, deletes,
//! upserts, range deletes, broadcasts, scans, checkpoints, reopen, snapshot installs) against the
//! fractal tree, sled and the `BTreeMap` model, each compared with the model's reference
//! semantics after every step.
//!
//! Every engine runs through the one suite, [`common::run_conformance`], given an
//! [`common::EngineFactory`] that opens it (again) on its storage.
//!
//! Case counts scale with `PROPTEST_CASES` (defaults keep `cargo test -p ftkv-engine` short).

mod common;

use common::*;
use ftkv_engine::EngineKind;
use ftkv_engine::TreeParams;
use proptest::prelude::*;

fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(1500), max_shrink_iters: 2000, ..ProptestConfig::default() })]

    /// Fractal tree with tiny nodes (many levels), a small cache (evictions) and zstd.
    #[test]
    fn fractal_small_nodes_matches_model(steps in prop::collection::vec(step_strategy(), 1..40), tiny_cache in any::<bool>(), zstd in any::<bool>()) {
        let cache = if tiny_cache { 4 << 10 } else { 1 << 20 };
        let mut s = Subject::new(EngineKind::Fractal, SMALL, cache, zstd.then_some(1));
        run_conformance(&mut s, &steps)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(300), ..ProptestConfig::default() })]

    /// Fractal tree with default (4 MiB) nodes: everything stays in a root leaf or one level.
    #[test]
    fn fractal_default_nodes_matches_model(steps in prop::collection::vec(step_strategy(), 1..30)) {
        let mut s = Subject::new(EngineKind::Fractal, TreeParams::default(), 64 << 20, None);
        run_conformance(&mut s, &steps)?;
    }

    /// The model against itself (the suite's own sanity: reads and meta bookkeeping).
    #[test]
    fn model_matches_model(steps in prop::collection::vec(step_strategy(), 1..30)) {
        let mut s = Subject::new(EngineKind::Model, SMALL, 0, None);
        run_conformance(&mut s, &steps)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(150), ..ProptestConfig::default() })]

    /// sled behind the same trait.
    #[test]
    fn sled_matches_model(steps in prop::collection::vec(step_strategy(), 1..25)) {
        let mut s = Subject::new(EngineKind::Sled, SMALL, 1 << 20, None);
        run_conformance(&mut s, &steps)?;
    }
}
