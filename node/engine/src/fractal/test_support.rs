//! Helpers shared by the fractal tree's in-crate tests: an engine on a [`FaultVfs`] and random
//! write batches from a 64-bit LCG (deterministic per seed).
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;

use ftkv_vfs::{FaultVfs, Vfs};

use super::{FractalEngine, TreeParams};
use crate::{EngineOptions, UpsertOp, WriteOp};

/// Opens (or creates) the tree in `/engine` on `vfs` with zstd level 1; `cleaner_period_ms`
/// as [`super::FractalOptions::cleaner_period_ms`] (`None`: no cleaner thread).
pub(super) fn open_on(
    vfs: &Arc<FaultVfs>,
    params: TreeParams,
    cache_size_bytes: u64,
    cleaner_period_ms: Option<u64>,
) -> FractalEngine {
    FractalEngine::open_with(
        vfs.clone() as Arc<dyn Vfs>,
        &EngineOptions {
            dir: Path::new("/engine").to_path_buf(),
            cache_size_bytes,
            compression_level: Some(1),
        },
        super::FractalOptions {
            tree: params,
            cleaner_period_ms,
        },
    )
    .unwrap()
}

/// `n` random ops over keys `key000000..` below `keys`, from LCG state `x`: one in 11 a delete,
/// one in 11 an `Append("+")` upsert, the rest puts of `r{round}-{n}{value_pad}`; with
/// `range_delete_one_in > 0`, about one op in that many is instead a `DeleteRange` over 7 keys.
pub(super) fn random_batch(
    x: &mut u64,
    round: u64,
    n: usize,
    keys: u64,
    value_pad: &str,
    range_delete_one_in: u64,
) -> Vec<WriteOp> {
    (0..n)
        .map(|_| {
            *x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let k = (*x >> 33) % keys;
            let key = format!("key{k:06}").into_bytes();
            if range_delete_one_in > 0 && (*x >> 13).is_multiple_of(range_delete_one_in) {
                return WriteOp::DeleteRange {
                    start: key,
                    end: Some(format!("key{:06}", k + 7).into_bytes()),
                };
            }
            match *x % 11 {
                0 => WriteOp::Delete { key },
                1 => WriteOp::Upsert {
                    key,
                    op: UpsertOp::Append(b"+".to_vec()),
                },
                _ => WriteOp::Put {
                    key,
                    value: format!("r{round}-{}{value_pad}", *x % 997).into_bytes(),
                },
            }
        })
        .collect()
}
