//! Every bound the log enforces, in one place (TigerBeetle TIGER_STYLE: "put a limit on everything").

/// Largest payload of one record (an entry or a meta value plus its key), in bytes: 64 MiB.
/// Larger appends fail with `LogError::Invalid` before anything is queued.
pub const MAX_RECORD_PAYLOAD_BYTES: usize = 64 * 1024 * 1024;

/// Longest meta key, in bytes (UTF-8).
pub const MAX_META_KEY_BYTES: usize = 1024;

/// Default size of a preallocated segment file, in bytes: 64 MiB.
pub const DEFAULT_SEGMENT_SIZE_BYTES: u64 = 64 * 1024 * 1024;

/// Smallest accepted `segment_size_bytes` (1 KiB; tests use small segments to exercise rolling).
/// Must hold the 128 bytes of header and durable-mark slots plus records.
pub const MIN_SEGMENT_SIZE_BYTES: u64 = 1024;

/// Default bound on payload bytes of already-written entries kept in memory for reads: 64 MiB.
/// Entries not yet written by the flusher are always kept (they are the write buffer).
pub const DEFAULT_CACHE_SIZE_BYTES: u64 = 64 * 1024 * 1024;

/// Smallest accepted periodic sync period, in milliseconds.
pub const MIN_SYNC_PERIOD_MS: u64 = 1;

const _: () = assert!(
    MAX_RECORD_PAYLOAD_BYTES <= u32::MAX as usize,
    "record length must fit its u32 field"
);
const _: () = assert!(
    MAX_META_KEY_BYTES <= u16::MAX as usize,
    "meta key length must fit its u16 field"
);
const _: () = assert!(MIN_SEGMENT_SIZE_BYTES <= DEFAULT_SEGMENT_SIZE_BYTES);

/// A record payload's length as its u32 field: the one cast of payload lengths in the log.
/// Infallible by [`MAX_RECORD_PAYLOAD_BYTES`] (asserted above to fit a u32): appends check
/// it before anything is queued and recovery's decoder refuses longer records, so callers
/// pass a length at most that. Debug builds assert it; release builds saturate.
pub(crate) fn payload_len_u32(n: usize) -> u32 {
    debug_assert!(
        n <= MAX_RECORD_PAYLOAD_BYTES,
        "payload of {n} bytes over the checked limit"
    );
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// A meta key's length as its u16 field, infallible by [`MAX_META_KEY_BYTES`] (asserted
/// above to fit a u16; `put_meta` checks it): debug builds assert, release builds saturate.
pub(crate) fn meta_key_len_u16(n: usize) -> u16 {
    debug_assert!(
        n <= MAX_META_KEY_BYTES,
        "meta key of {n} bytes over the checked limit"
    );
    u16::try_from(n).unwrap_or(u16::MAX)
}
