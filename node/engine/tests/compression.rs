#![allow(clippy::unwrap_used)]
//! The compression ratio the fractal engine reports (`FractalEngine::compression_stats`, the
//! node's `ftkv_engine_compression_ratio`): node blocks before and after zstd.

mod common;

use std::sync::Arc;

use common::*;
use ftkv_engine::{Engine, FractalEngine, FractalOptions, TreeParams, WriteOp};
use ftkv_vfs::{FaultVfs, Vfs};

fn engine_with(level: Option<i32>) -> FractalEngine {
    let vfs = FaultVfs::new(5);
    FractalEngine::open_with(
        vfs as Arc<dyn Vfs>,
        &opts("/engine".into(), 8 << 20, level),
        FractalOptions {
            tree: TreeParams {
                node_size_bytes: 64 << 10,
                basement_size_bytes: 8 << 10,
                fanout: 8,
            },
            cleaner_period_ms: None,
        },
    )
    .unwrap()
}

/// Rows shaped like a text table: repetitive, so zstd shrinks them several times.
fn load(e: &FractalEngine) {
    for batch in 0..20u64 {
        let ops: Vec<WriteOp> = (0..500u64)
            .map(|i| {
                let id = batch * 500 + i;
                WriteOp::Put {
                    key: format!("user_summary/{id:010}").into_bytes(),
                    value: format!(
                        "{id},active,2026-12-03,plan=basic,region=eu-west,visits={}",
                        id % 97
                    )
                    .into_bytes(),
                }
            })
            .collect();
        e.write(&ops, None).unwrap();
    }
    e.checkpoint().unwrap();
}

#[test]
fn zstd_blocks_report_a_ratio_above_one_and_uncompressed_blocks_exactly_one() {
    let zstd = engine_with(Some(3));
    assert_eq!(zstd.compression_stats().ratio(), None, "no block written yet");
    load(&zstd);
    let stats = zstd.compression_stats();
    assert!(stats.stored_bytes > 0, "{stats:?}");
    let ratio = stats.ratio().unwrap();
    assert!(
        ratio > 2.0,
        "repetitive rows compress only {ratio:.2}x: {stats:?}"
    );

    let plain = engine_with(None);
    load(&plain);
    let stats = plain.compression_stats();
    assert!(stats.stored_bytes > 0, "{stats:?}");
    assert_eq!(
        stats.raw_bytes, stats.stored_bytes,
        "uncompressed blocks: {stats:?}"
    );
}
