//! The fractal engine's own options beside [`crate::EngineOptions`]: the tree's shape and the
//! cleaner thread's period, in one struct the node and embedded mode open engines with.

use super::limits::{MIN_BASEMENT_SIZE_BYTES, MIN_FANOUT, MIN_NODE_SIZE_BYTES};
use crate::{EngineError, Result};

pub use super::background::cleaner::DEFAULT_CLEANER_PERIOD_MS;

/// What [`super::FractalEngine::open_with`] takes beside [`crate::EngineOptions`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FractalOptions {
    /// Tree shape (small nodes in tests).
    pub tree: TreeParams,
    /// The cleaner thread's period in milliseconds, or `None` for no cleaner (every flush then
    /// runs inside write batches; tests that count flushes use it). Default
    /// [`DEFAULT_CLEANER_PERIOD_MS`].
    pub cleaner_period_ms: Option<u64>,
}

impl Default for FractalOptions {
    fn default() -> Self {
        FractalOptions {
            tree: TreeParams::default(),
            cleaner_period_ms: Some(DEFAULT_CLEANER_PERIOD_MS),
        }
    }
}

impl FractalOptions {
    /// The default options with tree shape `tree`.
    pub fn with_tree(tree: TreeParams) -> Self {
        FractalOptions {
            tree,
            ..FractalOptions::default()
        }
    }
}

/// Shape parameters of a fractal tree (PerconaFT defaults in `ft/ft-internal.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeParams {
    /// Target node size in bytes (uncompressed): a leaf splits above it, an internal node is
    /// "gorged" and flushes above it. Default 4 MiB.
    pub node_size_bytes: usize,
    /// Basement node size in bytes (the unit of partial reads inside a leaf). Default 64 KiB.
    pub basement_size_bytes: usize,
    /// Maximum children per internal node (split above it, merge below a quarter). Default 16.
    pub fanout: usize,
}

impl Default for TreeParams {
    fn default() -> Self {
        TreeParams {
            node_size_bytes: 4 << 20,
            basement_size_bytes: 64 << 10,
            fanout: 16,
        }
    }
}

impl TreeParams {
    /// Rejects shapes the algorithms cannot work with.
    pub fn validate(&self) -> Result<()> {
        if self.fanout < MIN_FANOUT
            || self.node_size_bytes < MIN_NODE_SIZE_BYTES
            || self.basement_size_bytes < MIN_BASEMENT_SIZE_BYTES
        {
            return Err(EngineError::InvalidArgument(format!(
                "tree params need fanout >= 3, node size >= 256 B, basement size >= 64 B: {self:?}"
            )));
        }
        Ok(())
    }
}
