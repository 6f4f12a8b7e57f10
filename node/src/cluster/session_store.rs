//! The client-session table as engine keys (see `session.rs`, "Persistence is incremental").
//!
//! Keys, all in the reserved key space (`reserved_keys.rs`):
//! - `0xFF 0xFF 's' ++ client_id (u64 LE)`: one client session;
//! - `0xFF 0xFF 't' ++ client_id (u64 LE)`: one tombstone of an evicted client.
//!
//! Values (integers fixed-width little-endian):
//! - `version (u8) ++ checksum (u64 LE, xxh3-64 of the body) ++ body`;
//! - session body: `window_low u64, max_applied_sequence u64, last_used_index u64, result count
//!   u32`, then per kept result in sequence order `sequence u64, fingerprint u64, length u32,
//!   result` where `result` is the postcard encoding of the `CommandResult` (the same serde shape
//!   as in the Raft log). Per-client byte counts are recomputed on load, not stored;
//! - tombstone body: `max_applied_sequence u64, evicted_at_index u64`.
//!
//! A value that fails its checksum, has another version or does not parse is a
//! `Corruption`-like error that stops the node at open (never skipped: a lost session could
//! apply a retried write twice). The table's one scalar, the next idle-sweep index, travels in
//! the state machine's metadata blob.

use std::collections::BTreeMap;

use ftkv_engine::{Engine, WriteOp};

use super::command::CommandResult;
use super::reserved_keys::{is_reserved, RESERVED_KEY_PREFIX};
use super::session::{ClientSession, KeptResult, SessionTable, Tombstone};

/// Version byte of every session and tombstone value.
const RECORD_VERSION: u8 = 1;
/// Tag after the reserved prefix of a client-session key.
const SESSION_TAG: u8 = b's';
const _: () = assert!(super::bulk::STAGING_TAG < SESSION_TAG && SESSION_TAG < TOMBSTONE_TAG);
/// Tag after the reserved prefix of a tombstone key.
const TOMBSTONE_TAG: u8 = b't';
/// Pairs read per engine scan while loading the table.
const LOAD_PAGE_PAIRS: usize = 1024;

/// Why the persisted table could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum SessionStoreError {
    /// A stored record is damaged or of an unknown format.
    #[error("client-session record {key}: {detail}")]
    BadRecord {
        /// The engine key, in hex.
        key: String,
        /// What did not match.
        detail: String,
    },
    /// A result could not be encoded.
    #[error(
        "client-session result of client {client_id} sequence {sequence} could not be encoded: {detail}"
    )]
    Encode {
        /// The client.
        client_id: u64,
        /// The sequence.
        sequence: u64,
        /// The encoder's message.
        detail: String,
    },
    /// The engine failed while the table was read.
    #[error("reading the client-session table: {0}")]
    Engine(#[from] ftkv_engine::EngineError),
}

fn key(tag: u8, client_id: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(RESERVED_KEY_PREFIX.len() + 9);
    k.extend_from_slice(RESERVED_KEY_PREFIX);
    k.push(tag);
    k.extend_from_slice(&client_id.to_le_bytes());
    k
}

/// Engine key of client `client_id`'s session.
pub(super) fn session_key(client_id: u64) -> Vec<u8> {
    key(SESSION_TAG, client_id)
}

/// Engine key of client `client_id`'s tombstone.
pub(super) fn tombstone_key(client_id: u64) -> Vec<u8> {
    key(TOMBSTONE_TAG, client_id)
}

fn frame(body: Vec<u8>) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 9);
    out.push(RECORD_VERSION);
    out.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

fn encode_session(client_id: u64, c: &ClientSession) -> Result<Vec<u8>, SessionStoreError> {
    let mut body = Vec::with_capacity(28 + c.results.len() * 40);
    body.extend_from_slice(&c.window_low.to_le_bytes());
    body.extend_from_slice(&c.max_applied_sequence.to_le_bytes());
    body.extend_from_slice(&c.last_used_index.to_le_bytes());
    body.extend_from_slice(&(c.results.len() as u32).to_le_bytes());
    for (&sequence, kept) in &c.results {
        let result = postcard::to_stdvec(&kept.result).map_err(|e| SessionStoreError::Encode {
            client_id,
            sequence,
            detail: e.to_string(),
        })?;
        body.extend_from_slice(&sequence.to_le_bytes());
        body.extend_from_slice(&kept.fingerprint.to_le_bytes());
        body.extend_from_slice(&(result.len() as u32).to_le_bytes());
        body.extend_from_slice(&result);
    }
    Ok(frame(body))
}

fn encode_tombstone(t: &Tombstone) -> Vec<u8> {
    let mut body = Vec::with_capacity(16);
    body.extend_from_slice(&t.max_applied_sequence.to_le_bytes());
    body.extend_from_slice(&t.evicted_at_index.to_le_bytes());
    frame(body)
}

/// Reads fixed-width fields off a record body.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.rest.len() < n {
            return Err(format!("truncated: {n} bytes needed, {} left", self.rest.len()));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u64(&mut self) -> Result<u64, String> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }

    fn u32(&mut self) -> Result<u32, String> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b))
    }

    fn finish(&self) -> Result<(), String> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(format!("{} unexpected bytes after the record", self.rest.len()))
        }
    }
}

/// The body of a framed value, its version and checksum verified.
fn unframe(value: &[u8]) -> Result<&[u8], String> {
    let mut r = Reader { rest: value };
    let version = r.take(1)?[0];
    if version != RECORD_VERSION {
        return Err(format!(
            "unsupported record version {version} (this build reads {RECORD_VERSION})"
        ));
    }
    let stored = r.u64()?;
    let body = r.rest;
    let actual = xxhash_rust::xxh3::xxh3_64(body);
    if stored != actual {
        return Err(format!(
            "checksum mismatch (stored {stored:#x}, computed {actual:#x})"
        ));
    }
    Ok(body)
}

fn decode_session(value: &[u8]) -> Result<ClientSession, String> {
    let mut r = Reader {
        rest: unframe(value)?,
    };
    let window_low = r.u64()?;
    let max_applied_sequence = r.u64()?;
    let last_used_index = r.u64()?;
    let count = r.u32()?;
    let mut results = BTreeMap::new();
    let mut result_bytes = 0u64;
    let mut previous: Option<u64> = None;
    for _ in 0..count {
        let sequence = r.u64()?;
        if previous.is_some_and(|p| p >= sequence) || sequence < window_low {
            return Err(format!(
                "result sequence {sequence} out of order or below the window {window_low}"
            ));
        }
        previous = Some(sequence);
        let fingerprint = r.u64()?;
        let len = r.u32()? as usize;
        let result: CommandResult =
            postcard::from_bytes(r.take(len)?).map_err(|e| format!("result of sequence {sequence}: {e}"))?;
        let kept = KeptResult { fingerprint, result };
        result_bytes += kept.size_bytes();
        results.insert(sequence, kept);
    }
    r.finish()?;
    Ok(ClientSession {
        window_low,
        results,
        result_bytes,
        max_applied_sequence,
        last_used_index,
    })
}

fn decode_tombstone(value: &[u8]) -> Result<Tombstone, String> {
    let mut r = Reader {
        rest: unframe(value)?,
    };
    let t = Tombstone {
        max_applied_sequence: r.u64()?,
        evicted_at_index: r.u64()?,
    };
    r.finish()?;
    Ok(t)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Checks one engine pair: a pair outside the reserved key space passes; a reserved one must be
/// a well-formed session or tombstone record (what [`SessionTable::load`] would accept).
pub(super) fn check_record(k: &[u8], v: &[u8]) -> Result<(), SessionStoreError> {
    if !is_reserved(k) {
        return Ok(());
    }
    if k == super::auth_store::AUTH_KEY {
        return super::auth_store::decode(v)
            .map(|_| ())
            .map_err(|e| SessionStoreError::BadRecord {
                key: hex(k),
                detail: e,
            });
    }
    if k.get(RESERVED_KEY_PREFIX.len()) == Some(&super::bulk::STAGING_TAG) {
        // A staged bulk-load chunk: its key must parse and the chunk must decode.
        return match super::bulk::parse_staging_key(k) {
            Some(_) => super::bulk::decode_chunk(v, "in a snapshot")
                .map(|_| ())
                .map_err(|e| SessionStoreError::BadRecord {
                    key: hex(k),
                    detail: e.to_string(),
                }),
            None => Err(SessionStoreError::BadRecord {
                key: hex(k),
                detail: "not a staging key".into(),
            }),
        };
    }
    parse_record(k, v).map(|_| ())
}

/// A reserved pair, parsed.
enum Record {
    Session(u64, ClientSession),
    Tombstone(u64, Tombstone),
}

fn parse_record(k: &[u8], v: &[u8]) -> Result<Record, SessionStoreError> {
    let bad = |detail: String| SessionStoreError::BadRecord { key: hex(k), detail };
    let id = match k.get(RESERVED_KEY_PREFIX.len() + 1..) {
        Some(id) if id.len() == 8 && is_reserved(k) => {
            let mut b = [0u8; 8];
            b.copy_from_slice(id);
            u64::from_le_bytes(b)
        }
        _ => return Err(bad("not a client-session key".into())),
    };
    match k.get(RESERVED_KEY_PREFIX.len()) {
        Some(&SESSION_TAG) => Ok(Record::Session(id, decode_session(v).map_err(bad)?)),
        Some(&TOMBSTONE_TAG) => Ok(Record::Tombstone(id, decode_tombstone(v).map_err(bad)?)),
        _ => Err(bad("not a client-session key".into())),
    }
}

impl SessionTable {
    /// Appends to `ops` the engine writes that persist every change since the last call (a Put
    /// of each changed session or tombstone, a Delete of each removed one) and forgets the
    /// changes. The caller writes `ops` in the same atomic engine batch as the data they go with.
    pub(super) fn take_changes(&mut self, ops: &mut Vec<WriteOp>) -> Result<(), SessionStoreError> {
        for id in std::mem::take(&mut self.changed_clients) {
            let key = session_key(id);
            ops.push(match self.clients.get(&id) {
                Some(c) => WriteOp::Put {
                    key,
                    value: encode_session(id, c)?,
                },
                None => WriteOp::Delete { key },
            });
        }
        for id in std::mem::take(&mut self.changed_tombstones) {
            let key = tombstone_key(id);
            ops.push(match self.evicted.get(&id) {
                Some(t) => WriteOp::Put {
                    key,
                    value: encode_tombstone(t),
                },
                None => WriteOp::Delete { key },
            });
        }
        Ok(())
    }

    /// Whether changes wait for [`SessionTable::take_changes`].
    #[cfg(test)]
    pub(super) fn has_changes(&self) -> bool {
        !self.changed_clients.is_empty() || !self.changed_tombstones.is_empty()
    }

    /// Reads the table back from `engine`'s reserved keys, with the persisted
    /// `next_sweep_index`. A damaged or unknown record is an error (see the module docs).
    pub(super) fn load(engine: &dyn Engine, next_sweep_index: u64) -> Result<Self, SessionStoreError> {
        let mut table = SessionTable {
            next_sweep_index,
            ..SessionTable::default()
        };
        // Sessions and tombstones sort after the bulk-load staging area (`'b' < 's' < 't'`).
        let mut from = RESERVED_KEY_PREFIX.to_vec();
        from.push(SESSION_TAG);
        loop {
            let page = engine.scan(&from, None, LOAD_PAGE_PAIRS)?;
            let full = page.len() >= LOAD_PAGE_PAIRS;
            for (k, v) in page {
                match parse_record(&k, &v)? {
                    Record::Session(id, c) => {
                        table.result_bytes += c.result_bytes;
                        table.clients.insert(id, c);
                    }
                    Record::Tombstone(id, t) => {
                        table.evicted.insert(id, t);
                    }
                }
                from = k;
            }
            if !full {
                return Ok(table);
            }
            from.push(0);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::cluster::command::Session;
    use ftkv_engine::model::ModelEngine;

    fn s(client_id: u64, sequence: u64, first_incomplete: u64) -> Session {
        Session {
            client_id,
            sequence,
            first_incomplete,
        }
    }

    /// Writes the table's changes to `engine` and reads a table back.
    fn persist_and_load(t: &mut SessionTable, engine: &ModelEngine) -> SessionTable {
        let mut ops = Vec::new();
        t.take_changes(&mut ops).unwrap();
        assert!(!t.has_changes());
        engine.write(&ops, None).unwrap();
        SessionTable::load(engine, t.next_sweep_index).unwrap()
    }

    #[test]
    fn records_round_trip_and_removals_delete_their_keys() {
        let engine = ModelEngine::new();
        let mut t = SessionTable::default();
        let txn = CommandResult::Txn {
            succeeded: true,
            results: vec![Some(b"v".to_vec()), None],
        };
        t.record(&s(1, 1, 1), 11, &CommandResult::Written, 1);
        t.record(&s(1, 2, 1), 12, &txn, 2);
        t.record(&s(u64::MAX, 7, 3), 13, &CommandResult::SequenceReused, 3);
        assert_eq!(persist_and_load(&mut t, &engine), t);
        // Evict everyone: sessions become tombstones, their keys are deleted.
        t.evict(1, 4);
        t.evict(u64::MAX, 4);
        let loaded = persist_and_load(&mut t, &engine);
        assert_eq!(loaded, t);
        assert!(engine.get(&session_key(1)).unwrap().is_none());
        assert!(engine.get(&tombstone_key(1)).unwrap().is_some());
        // A client coming back removes its tombstone.
        t.record(&s(1, 3, 3), 14, &CommandResult::Written, 5);
        assert_eq!(persist_and_load(&mut t, &engine), t);
        assert!(engine.get(&tombstone_key(1)).unwrap().is_none());
    }

    #[test]
    fn damaged_records_are_refused_not_skipped() {
        let engine = ModelEngine::new();
        let mut t = SessionTable::default();
        t.record(&s(5, 1, 1), 1, &CommandResult::Written, 1);
        persist_and_load(&mut t, &engine);
        let mut v = engine.get(&session_key(5)).unwrap().unwrap();
        let last = v.len() - 1;
        v[last] ^= 1;
        let put = |value: Vec<u8>| {
            engine
                .write(
                    &[WriteOp::Put {
                        key: session_key(5),
                        value,
                    }],
                    None,
                )
                .unwrap()
        };
        put(v.clone());
        let err = SessionTable::load(&engine, 0).unwrap_err().to_string();
        assert!(err.contains("checksum mismatch"), "{err}");
        v[0] = 9;
        put(v);
        let err = SessionTable::load(&engine, 0).unwrap_err().to_string();
        assert!(err.contains("unsupported record version 9"), "{err}");
        engine
            .write(&[WriteOp::Delete { key: session_key(5) }], None)
            .unwrap();
        let mut odd = RESERVED_KEY_PREFIX.to_vec();
        odd.push(b'x');
        engine
            .write(
                &[WriteOp::Put {
                    key: odd,
                    value: vec![],
                }],
                None,
            )
            .unwrap();
        let err = SessionTable::load(&engine, 0).unwrap_err().to_string();
        assert!(err.contains("not a client-session key"), "{err}");
    }
}
