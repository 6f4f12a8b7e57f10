//! Every bound of the fractal engine, in one place, with compile-time checks of how they relate
//! (TigerBeetle TIGER_STYLE: "put a limit on everything"). Format constants (magics, header
//! sizes) are in `codec/layout.rs`; tunables a user sets are in [`super::TreeParams`].

use super::codec::{BLOCK_ALIGN_BYTES, DATA_START, HEADER_BYTES, HEADER_SLOT_BYTES};

/// Uncompressed bytes per frame of a run: a point lookup reads and decompresses one
/// frame, not the whole run.
pub(crate) const RUN_FRAME_RAW_BYTES: usize = 4 << 10;
/// Uncompressed bytes per frame of an internal node's buffer: the unit a point read
/// through an uncached internal node decompresses.
pub(crate) const BUFFER_FRAME_RAW_BYTES: usize = 4 << 10;
/// Uncompressed bytes per frame of a basement: the unit a point read decompresses.
pub(crate) const BASEMENT_FRAME_RAW_BYTES: usize = 4 << 10;

/// Block buffers [`super::codec::recycle_block_buf`] keeps per thread.
pub(crate) const BLOCK_BUFS_KEPT: usize = 2;
/// Larger block buffers are not kept.
pub(crate) const BLOCK_BUF_MAX_BYTES: usize = 64 << 20;

/// A buffer is flushed into its child once this many runs have spilled from it, whatever their
/// size (bounds the runs a point read may consult per level).
pub(crate) const MAX_RUNS_PER_BUFFER: usize = 16;
/// Threads a checkpoint encodes its nodes on, at most.
pub(crate) const MAX_CHECKPOINT_LANES: usize = 4;
/// Background leaf flushes in flight at most: each holds a decoded leaf and its runs in memory.
pub(crate) const MAX_IN_FLIGHT: usize = 2;
/// Cleaner steps per round at most (then the thread sleeps until the next wake or period).
pub(crate) const MAX_STEPS_PER_ROUND: usize = 256;

/// Free extents of the tree file at least this long are given back to the file system at a
/// checkpoint (`punch_hole`); smaller ones only wait for reuse.
pub(crate) const PUNCH_MIN_BYTES: u64 = 1 << 20;
/// Holes are punched on this alignment (the file system's block size on ext4 and xfs).
pub(crate) const PUNCH_ALIGN_BYTES: u64 = 4 << 10;

/// Smallest accepted [`super::TreeParams::fanout`].
pub(crate) const MIN_FANOUT: usize = 3;
/// Smallest accepted [`super::TreeParams::node_size_bytes`].
pub(crate) const MIN_NODE_SIZE_BYTES: usize = 256;
/// Smallest accepted [`super::TreeParams::basement_size_bytes`].
pub(crate) const MIN_BASEMENT_SIZE_BYTES: usize = 64;

const _: () = assert!(HEADER_BYTES as u64 <= HEADER_SLOT_BYTES, "a header fits its slot");
const _: () = assert!(
    DATA_START == 2 * HEADER_SLOT_BYTES,
    "blocks start after both header slots"
);
const _: () = assert!(
    DATA_START.is_multiple_of(BLOCK_ALIGN_BYTES),
    "the block area starts aligned"
);
const _: () = assert!(BLOCK_ALIGN_BYTES.is_power_of_two());
const _: () = assert!(
    PUNCH_ALIGN_BYTES.is_multiple_of(BLOCK_ALIGN_BYTES) && PUNCH_MIN_BYTES >= 2 * PUNCH_ALIGN_BYTES,
    "a punched range is whole blocks and long enough to be worth a system call"
);
const _: () = assert!(
    RUN_FRAME_RAW_BYTES <= BLOCK_BUF_MAX_BYTES
        && BUFFER_FRAME_RAW_BYTES <= BLOCK_BUF_MAX_BYTES
        && BASEMENT_FRAME_RAW_BYTES <= BLOCK_BUF_MAX_BYTES,
    "a frame fits a kept block buffer"
);
const _: () = assert!(
    BLOCK_BUF_MAX_BYTES <= u32::MAX as usize,
    "block lengths are u32 in the BTT"
);
const _: () = assert!(
    MIN_BASEMENT_SIZE_BYTES <= MIN_NODE_SIZE_BYTES,
    "a basement fits a node"
);
const _: () = assert!(
    MIN_FANOUT >= 3,
    "a split leaves two children and a merge needs a neighbour"
);
const _: () = assert!(MAX_RUNS_PER_BUFFER >= 1 && MAX_CHECKPOINT_LANES >= 1 && MAX_IN_FLIGHT >= 1);

/// A length as the u32 field that stores it; `what` names the field in the error. The one
/// checked cast of lengths (and counts) to u32 in the engine: block, partition, frame and
/// frame-index lengths, counts of children, basements, frames and messages.
pub(crate) fn len_u32(n: usize, what: &str) -> crate::Result<u32> {
    u32::try_from(n)
        .map_err(|_| crate::EngineError::InvalidArgument(format!("{what} of {n} does not fit a u32")))
}

/// A length *inside* an encoded partition, frame or block as its u32 field, for the encoders
/// that cannot fail (`W::bytes` for keys, values and pivots, key filters, frame-table rows,
/// the BTT's meta blob). Infallible by this limit: such a length is below the length of the
/// partition, frame or block that holds it, and that one goes through [`len_u32`] before
/// anything is written (`compress_partition`/`assemble_node`, `FrameWriter::cut`,
/// `encode_run`, `write_fresh_block`/`write_encoded`), so an encoding with a length over
/// `u32::MAX` fails there with `InvalidArgument`. Debug builds assert; release builds
/// saturate (never wrap to a small, plausible length).
pub(crate) fn inner_len_u32(n: usize) -> u32 {
    debug_assert!(
        u32::try_from(n).is_ok(),
        "a length of {n} inside a block: its block's len_u32 check fails the encoding"
    );
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// [`len_u32`] for a constant, at compile time (a format constant such as the header length).
pub(crate) const fn const_len_u32(n: usize) -> u32 {
    assert!(n <= u32::MAX as usize, "a format constant fits its u32 field");
    n as u32
}
