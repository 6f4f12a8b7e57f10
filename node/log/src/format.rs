//! On-disk format of log segments: pure encode/decode, no I/O. Byte-by-byte description in
//! `node/log/FORMAT.md`. Layout after PerconaFT `ft/logger/` records (`len | type | LSN | payload |
//! checksum`), all integers fixed-width little-endian, every header and record checksummed (crc32c).

use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::limits::{meta_key_len_u16, payload_len_u32, MAX_RECORD_PAYLOAD_BYTES};

/// Magic bytes at offset 0 of every segment file.
pub(crate) const SEGMENT_MAGIC: [u8; 8] = *b"FTKVSEG\0";
/// Segment format version this code writes and reads (2: preallocated segments with the file size
/// in the header and two durable-mark slots; version 1 logs are refused, see FORMAT.md).
pub(crate) const FORMAT_VERSION: u32 = 2;
/// Segment header size in bytes: magic 8 | version u32 | seq u64 | segment_size_bytes u64 |
/// prev_segment_end u64 | reserved 24 | crc32c u32.
pub(crate) const SEGMENT_HEADER_BYTES: u64 = 64;
/// Size of one durable-mark slot in bytes: generation u64 | durable_end u64 | seq u64 | zero u32 |
/// crc32c u32.
pub(crate) const MARK_SLOT_BYTES: u64 = 32;
/// Offset of mark slot 0 (slot 1 follows it); the slot used by a mark is `generation % 2`.
pub(crate) const MARK_SLOTS_OFFSET: u64 = SEGMENT_HEADER_BYTES;
/// Offset of the first record of every segment (after the header and the two mark slots).
pub(crate) const RECORDS_START: u64 = MARK_SLOTS_OFFSET + 2 * MARK_SLOT_BYTES;
/// Record framing before the payload: len u32 | type u8 | index u64.
pub(crate) const RECORD_HEAD_BYTES: usize = 13;
/// Record framing after the payload: crc32c u32.
pub(crate) const RECORD_TAIL_BYTES: usize = 4;
/// Framing bytes per record (head + tail).
pub(crate) const RECORD_OVERHEAD_BYTES: usize = RECORD_HEAD_BYTES + RECORD_TAIL_BYTES;

/// File-name suffix of segment files.
const SEGMENT_SUFFIX: &str = ".seg";
/// Digits in a segment file name (zero-padded sequence number).
const SEGMENT_NAME_DIGITS: usize = 20;

/// Record type byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum RecordType {
    /// A log entry: `index` is its log index, payload the caller's bytes.
    Entry = 1,
    /// A named value: `index` 0, payload `key_len u16 | key | value`.
    Meta = 2,
    /// Truncate marker: every entry with index >= `index` is removed.
    Truncate = 3,
    /// Purge marker: every entry with index <= `index` is forgotten.
    Purge = 4,
}

impl RecordType {
    fn from_byte(b: u8) -> Option<RecordType> {
        match b {
            1 => Some(RecordType::Entry),
            2 => Some(RecordType::Meta),
            3 => Some(RecordType::Truncate),
            4 => Some(RecordType::Purge),
            _ => None,
        }
    }
}

/// A decoded record. `payload` borrows the scanned buffer (zero-copy through `Bytes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) kind: RecordType,
    pub(crate) index: u64,
    pub(crate) payload: Bytes,
}

/// Why bytes at an offset are not a valid record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DecodeError {
    /// The buffer ends inside the record (torn write or truncated file).
    Incomplete {
        needed_bytes: usize,
        available_bytes: usize,
    },
    /// Unknown type byte.
    BadType(u8),
    /// Length field above the record size limit.
    TooLarge(u64),
    /// Stored and computed crc32c differ.
    BadChecksum { stored: u32, computed: u32 },
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Incomplete {
                needed_bytes,
                available_bytes,
            } => {
                write!(
                    f,
                    "record incomplete: needs {needed_bytes} bytes, {available_bytes} present"
                )
            }
            DecodeError::BadType(t) => write!(f, "unknown record type {t}"),
            DecodeError::TooLarge(n) => write!(f, "record length {n} above limit {MAX_RECORD_PAYLOAD_BYTES}"),
            DecodeError::BadChecksum { stored, computed } => {
                write!(
                    f,
                    "crc32c mismatch: stored {stored:#010x}, computed {computed:#010x}"
                )
            }
        }
    }
}

/// Path of segment `seq` inside `dir`: `<seq as 20 digits>.seg`.
pub(crate) fn segment_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!(
        "{seq:0width$}{SEGMENT_SUFFIX}",
        width = SEGMENT_NAME_DIGITS
    ))
}

/// The sequence number of a segment file name, or None for other files.
pub(crate) fn parse_segment_name(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    let digits = name.strip_suffix(SEGMENT_SUFFIX)?;
    if digits.len() != SEGMENT_NAME_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The decoded fields of a valid segment header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SegmentHeader {
    /// Segment sequence number (equals the file name).
    pub(crate) seq: u64,
    /// The file's length in bytes, fixed when the segment was preallocated.
    pub(crate) segment_size_bytes: u64,
    /// End offset of the last record of the previous segment (0 for the first segment ever).
    pub(crate) prev_segment_end: u64,
}

/// Encodes the 64-byte header of a segment.
pub(crate) fn encode_segment_header(h: &SegmentHeader, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&SEGMENT_MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&h.seq.to_le_bytes());
    out.extend_from_slice(&h.segment_size_bytes.to_le_bytes());
    out.extend_from_slice(&h.prev_segment_end.to_le_bytes());
    out.extend_from_slice(&[0u8; 24]);
    #[allow(clippy::indexing_slicing)] // start was out.len() before the appends above
    let crc = crc32c::crc32c(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
    debug_assert_eq!(out.len() - start, SEGMENT_HEADER_BYTES as usize);
}

/// Checks a segment header; returns its fields, or a description of the problem if invalid.
pub(crate) fn check_segment_header(buf: &[u8], expected_seq: u64) -> Result<SegmentHeader, String> {
    // A version 1 header (32 bytes, crc at 28) is recognised to refuse it with a clear message.
    if let Some(v1) = buf
        .first_chunk::<32>()
        .filter(|h| h.starts_with(&SEGMENT_MAGIC) && u32_at(*h, 8) == 1)
    {
        let crc_ok = v1
            .split_last_chunk::<4>()
            .is_some_and(|(body, crc)| u32::from_le_bytes(*crc) == crc32c::crc32c(body));
        if crc_ok {
            return Err(format!(
                "segment format version 1 (written by an older ftkv build, before preallocated \
                 segments); this build reads only version {FORMAT_VERSION}: restore the older build \
                 or wipe the node's data directory and re-add it to the cluster"
            ));
        }
    }
    let Some(head) = buf.get(..SEGMENT_HEADER_BYTES as usize) else {
        return Err(format!(
            "segment header incomplete: {} of {SEGMENT_HEADER_BYTES} bytes",
            buf.len()
        ));
    };
    let crc_at = SEGMENT_HEADER_BYTES as usize - 4;
    let stored = u32_at(head, crc_at);
    let computed = crc32c::crc32c(head.get(..crc_at).unwrap_or_default());
    if stored != computed {
        return Err(format!(
            "segment header crc32c mismatch: stored {stored:#010x}, computed {computed:#010x}"
        ));
    }
    if !head.starts_with(&SEGMENT_MAGIC) {
        return Err("bad segment magic".to_string());
    }
    let version = u32_at(head, 8);
    if version != FORMAT_VERSION {
        return Err(format!(
            "unsupported segment format version {version} (this build reads {FORMAT_VERSION})"
        ));
    }
    let seq = u64_at(head, 12);
    if seq != expected_seq {
        return Err(format!(
            "header names segment {seq} but the file name says {expected_seq}"
        ));
    }
    let segment_size_bytes = u64_at(head, 20);
    let prev_segment_end = u64_at(head, 28);
    if segment_size_bytes < RECORDS_START {
        return Err(format!(
            "header gives a segment size of {segment_size_bytes} bytes, below the {RECORDS_START} \
             bytes of header and mark slots"
        ));
    }
    Ok(SegmentHeader {
        seq,
        segment_size_bytes,
        prev_segment_end,
    })
}

/// A durable mark: "the records of segment `seq` up to `durable_end` were fdatasynced".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DurableMark {
    /// Bumped by every mark written to a segment (starts at 1); selects the slot (`% 2`).
    pub(crate) generation: u64,
    /// Offset just past the last record known durable.
    pub(crate) durable_end: u64,
}

/// What a mark slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotState {
    /// All zero: never written.
    Empty,
    /// A valid mark.
    Valid(DurableMark),
    /// Neither: a torn mark write or damage.
    Invalid,
}

/// Offset of the slot that mark `generation` goes to.
pub(crate) fn mark_slot_offset(generation: u64) -> u64 {
    MARK_SLOTS_OFFSET + (generation % 2) * MARK_SLOT_BYTES
}

/// Encodes a mark of segment `seq` (32 bytes).
pub(crate) fn encode_mark(seq: u64, mark: DurableMark) -> Vec<u8> {
    let mut out = Vec::with_capacity(MARK_SLOT_BYTES as usize);
    out.extend_from_slice(&mark.generation.to_le_bytes());
    out.extend_from_slice(&mark.durable_end.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    debug_assert_eq!(out.len() as u64, MARK_SLOT_BYTES);
    out
}

/// Decodes the slot at `buf[0..32]` of segment `seq`.
pub(crate) fn decode_mark(buf: &[u8], seq: u64) -> SlotState {
    let Some(slot) = buf.get(..MARK_SLOT_BYTES as usize) else {
        return SlotState::Invalid;
    };
    if slot.iter().all(|&b| b == 0) {
        return SlotState::Empty;
    }
    let stored = u32_at(slot, 28);
    if Some(stored) != slot.get(..28).map(crc32c::crc32c) || u64_at(slot, 16) != seq || u32_at(slot, 24) != 0
    {
        return SlotState::Invalid;
    }
    let generation = u64_at(slot, 0);
    if generation == 0 {
        return SlotState::Invalid;
    }
    SlotState::Valid(DurableMark {
        generation,
        durable_end: u64_at(slot, 8),
    })
}

/// Appends one encoded record to `out`; returns its encoded size in bytes.
/// The caller has checked `payload.len() <= MAX_RECORD_PAYLOAD_BYTES`.
pub(crate) fn encode_record(kind: RecordType, index: u64, payload: &[u8], out: &mut Vec<u8>) -> usize {
    let start = out.len();
    out.extend_from_slice(&payload_len_u32(payload.len()).to_le_bytes());
    out.push(kind as u8);
    out.extend_from_slice(&index.to_le_bytes());
    out.extend_from_slice(payload);
    #[allow(clippy::indexing_slicing)] // start was out.len() before the appends above
    let crc = crc32c::crc32c(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
    out.len() - start
}

/// Encodes a meta payload `key_len u16 | key | value`. The caller has checked the key length.
pub(crate) fn encode_meta_payload(key: &str, value: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(2 + key.len() + value.len());
    p.extend_from_slice(&meta_key_len_u16(key.len()).to_le_bytes());
    p.extend_from_slice(key.as_bytes());
    p.extend_from_slice(value);
    p
}

/// Splits a meta payload into key and value; None if malformed.
pub(crate) fn decode_meta_payload(payload: &Bytes) -> Option<(String, Bytes)> {
    let len_bytes = payload.first_chunk::<2>()?;
    let key_len = u16::from_le_bytes(*len_bytes) as usize;
    let key = payload.get(2..2 + key_len)?;
    let key = std::str::from_utf8(key).ok()?.to_string();
    Some((key, payload.slice(2 + key_len..)))
}

/// Decodes the record starting at `buf[0]`. Returns the record and its encoded size in bytes.
pub(crate) fn decode_record(buf: &Bytes) -> Result<(Record, usize), DecodeError> {
    let Some(head) = buf.first_chunk::<RECORD_HEAD_BYTES>() else {
        return Err(DecodeError::Incomplete {
            needed_bytes: RECORD_HEAD_BYTES,
            available_bytes: buf.len(),
        });
    };
    let len = u32_at(head, 0) as usize;
    let type_byte = head[4];
    let index = u64_at(head, 5);
    let kind = RecordType::from_byte(type_byte).ok_or(DecodeError::BadType(type_byte))?;
    if len > MAX_RECORD_PAYLOAD_BYTES {
        return Err(DecodeError::TooLarge(len as u64));
    }
    let total = RECORD_OVERHEAD_BYTES + len;
    let Some(whole) = buf.get(..total) else {
        return Err(DecodeError::Incomplete {
            needed_bytes: total,
            available_bytes: buf.len(),
        });
    };
    // `whole` is RECORD_OVERHEAD_BYTES + len = head, payload and the 4-byte crc.
    let Some((body, crc)) = whole.split_last_chunk::<4>() else {
        return Err(DecodeError::Incomplete {
            needed_bytes: total,
            available_bytes: buf.len(),
        });
    };
    let stored = u32::from_le_bytes(*crc);
    let computed = crc32c::crc32c(body);
    if stored != computed {
        return Err(DecodeError::BadChecksum { stored, computed });
    }
    let payload = buf.slice(RECORD_HEAD_BYTES..RECORD_HEAD_BYTES + len);
    Ok((Record { kind, index, payload }, total))
}

/// The little-endian u32 at `buf[at..at + 4]`. Callers pass a header, slot or record they
/// took with `first_chunk`/`get` of a fixed size that holds the field.
#[allow(clippy::indexing_slicing)] // every caller's `at + 4` is within its fixed-size slice
fn u32_at(buf: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(b)
}

/// The little-endian u64 at `buf[at..at + 8]` (callers as for [`u32_at`]).
#[allow(clippy::indexing_slicing)] // every caller's `at + 8` is within its fixed-size slice
fn u64_at(buf: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn record_round_trip_and_every_bit_flip_is_caught() {
        let mut buf = Vec::new();
        let n = encode_record(RecordType::Entry, 42, b"hello", &mut buf);
        assert_eq!(n, RECORD_OVERHEAD_BYTES + 5);
        let bytes = Bytes::from(buf.clone());
        let (rec, used) = decode_record(&bytes).unwrap();
        assert_eq!(used, n);
        assert_eq!(
            rec,
            Record {
                kind: RecordType::Entry,
                index: 42,
                payload: Bytes::from_static(b"hello")
            }
        );
        for bit in 0..buf.len() * 8 {
            let mut bad = buf.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(
                decode_record(&Bytes::from(bad)).is_err(),
                "flip of bit {bit} not detected"
            );
        }
        for cut in 0..buf.len() {
            let torn = Bytes::from(buf[..cut].to_vec());
            assert!(matches!(
                decode_record(&torn),
                Err(DecodeError::Incomplete { .. })
            ));
        }
    }

    #[test]
    fn zeroed_bytes_are_not_a_record() {
        assert!(decode_record(&Bytes::from(vec![0u8; 64])).is_err());
    }

    #[test]
    fn header_round_trip_and_checks() {
        let fields = SegmentHeader {
            seq: 7,
            segment_size_bytes: 4096,
            prev_segment_end: 1234,
        };
        let mut h = Vec::new();
        encode_segment_header(&fields, &mut h);
        assert_eq!(h.len() as u64, SEGMENT_HEADER_BYTES);
        assert_eq!(check_segment_header(&h, 7), Ok(fields));
        assert!(check_segment_header(&h, 8).unwrap_err().contains("file name"));
        assert!(check_segment_header(&h[..10], 7).is_err());
        let mut bad = h.clone();
        bad[12] ^= 1;
        assert!(check_segment_header(&bad, 7).unwrap_err().contains("crc32c"));
        // A version 1 header is refused with a message that says so.
        let mut v1 = Vec::new();
        v1.extend_from_slice(&SEGMENT_MAGIC);
        v1.extend_from_slice(&1u32.to_le_bytes());
        v1.extend_from_slice(&7u64.to_le_bytes());
        v1.extend_from_slice(&0u64.to_le_bytes());
        let crc = crc32c::crc32c(&v1);
        v1.extend_from_slice(&crc.to_le_bytes());
        v1.resize(64, 0);
        assert!(check_segment_header(&v1, 7).unwrap_err().contains("version 1"));
    }

    #[test]
    fn mark_round_trip_slots_and_damage() {
        let m = DurableMark {
            generation: 5,
            durable_end: 999,
        };
        let enc = encode_mark(3, m);
        assert_eq!(decode_mark(&enc, 3), SlotState::Valid(m));
        assert_eq!(
            decode_mark(&enc, 4),
            SlotState::Invalid,
            "mark of another segment"
        );
        assert_eq!(decode_mark(&[0u8; 32], 3), SlotState::Empty);
        for bit in 0..enc.len() * 8 {
            let mut bad = enc.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(decode_mark(&bad, 3), SlotState::Invalid, "flip of bit {bit}");
        }
        assert_ne!(mark_slot_offset(1), mark_slot_offset(2));
        assert_eq!(mark_slot_offset(1), mark_slot_offset(3));
        assert!(mark_slot_offset(1) + MARK_SLOT_BYTES <= RECORDS_START);
    }

    #[test]
    fn segment_names() {
        let p = segment_path(Path::new("/x/log"), 12);
        assert_eq!(p, PathBuf::from("/x/log/00000000000000000012.seg"));
        assert_eq!(parse_segment_name(&p), Some(12));
        assert_eq!(parse_segment_name(Path::new("/x/log/12.seg")), None);
        assert_eq!(
            parse_segment_name(Path::new("/x/log/00000000000000000012.tmp")),
            None
        );
    }

    #[test]
    fn meta_payload_round_trip() {
        let p = Bytes::from(encode_meta_payload("vote", b"abc"));
        assert_eq!(
            decode_meta_payload(&p),
            Some(("vote".to_string(), Bytes::from_static(b"abc")))
        );
        assert_eq!(decode_meta_payload(&Bytes::from_static(&[9, 0, b'a'])), None);
    }
}

/// Property tests of every record kind's decoder: arbitrary bytes behind a valid checksum decode
/// to an error or a value, never a panic, and never an allocation sized by an untrusted length.
#[cfg(test)]
mod decode_props {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use bytes::Bytes;
    use proptest::prelude::*;

    use super::*;

    /// `len u32 | type u8 | index u64 | payload | crc32c` with the crc right and `len` as given.
    fn record_bytes(len: u32, type_byte: u8, index: u64, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&len.to_le_bytes());
        out.push(type_byte);
        out.extend_from_slice(&index.to_le_bytes());
        out.extend_from_slice(payload);
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn every_record_type_with_a_valid_crc_decodes_or_errs(
            type_byte in 0u8..8,
            index in any::<u64>(),
            payload in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let buf = Bytes::from(record_bytes(payload.len() as u32, type_byte, index, &payload));
            match decode_record(&buf) {
                Ok((rec, size)) => {
                    prop_assert!((1..=4).contains(&type_byte));
                    prop_assert_eq!(size, buf.len());
                    prop_assert_eq!(rec.payload.as_ref(), payload.as_slice());
                    if rec.kind == RecordType::Meta {
                        let _ = decode_meta_payload(&rec.payload);
                    }
                }
                Err(_) => prop_assert!(!(1..=4).contains(&type_byte)),
            }
        }

        #[test]
        fn hostile_record_lengths_are_errors(
            len in any::<u32>(),
            type_byte in any::<u8>(),
            payload in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let buf = Bytes::from(record_bytes(len, type_byte, 1, &payload));
            if let Ok((_, size)) = decode_record(&buf) {
                prop_assert!(size <= buf.len());
            }
        }

        #[test]
        fn meta_payloads_never_panic(payload in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode_meta_payload(&Bytes::from(payload));
        }

        #[test]
        fn segment_headers_and_marks_never_panic(
            body in proptest::collection::vec(any::<u8>(), 0..200),
            seq in 0u64..4,
        ) {
            // Arbitrary bytes after the magic, the crc fixed up where each layout keeps it.
            let mut head = SEGMENT_MAGIC.to_vec();
            head.extend_from_slice(&body);
            let _ = check_segment_header(&head, seq);
            for crc_at in [28usize, SEGMENT_HEADER_BYTES as usize - 4] {
                if head.len() >= crc_at + 4 {
                    let crc = crc32c::crc32c(&head[..crc_at]);
                    head[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
                    let _ = check_segment_header(&head, seq);
                }
            }
            let mut slot = body.clone();
            slot.resize(MARK_SLOT_BYTES as usize, 0);
            let crc = crc32c::crc32c(&slot[..28]);
            slot[28..32].copy_from_slice(&crc.to_le_bytes());
            let _ = decode_mark(&slot, seq);
            let _ = decode_mark(&body, seq);
        }
    }
}
