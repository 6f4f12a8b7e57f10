//! Client sessions for exactly-once writes (Raft thesis section 6.3; RIFL, "Implementing
//! Linearizability at Large Scale and Low Latency", SOSP 2015).
//!
//! Per client id the state machine keeps the results of the sequences the client may still retry
//! (`>= first_incomplete`, as the client reports it with every write), each with a 64-bit
//! fingerprint of its command ([`Command::fingerprint`](super::command::Command::fingerprint)). A
//! retried command whose result is kept returns that result without being applied again (or
//! [`CommandResult::SequenceReused`] when the fingerprint differs); one below the window returns
//! [`CommandResult::StaleSequence`], which the server reports as ambiguous.
//!
//! Everything is bounded, deterministically (log indexes, never clocks; ties broken by client id):
//! - a result whose value bytes exceed [`MAX_KEPT_RESULT_BYTES`] is kept as
//!   [`CommandResult::TooLargeToKeep`] (a retry returns that, not a second application);
//! - per client at most [`MAX_RESULTS_PER_CLIENT`] results and [`MAX_RESULT_BYTES_PER_CLIENT`]
//!   bytes: the oldest are dropped and the window raised (their retries become stale);
//! - at most [`MAX_CLIENTS`] clients and [`MAX_TABLE_RESULT_BYTES`] result bytes in all: the least
//!   recently used clients (by log index) are evicted; clients idle for [`SESSION_IDLE_ENTRIES`]
//!   log entries expire (RIFL expires leases the same way).
//!
//! Evicted or expired clients leave a tombstone (client id -> highest sequence ever applied), at
//! most [`MAX_EVICTED_CLIENTS`] of them, oldest evictions dropped first. For a client with no
//! session:
//! - tombstone present: a sequence `<=` the highest applied one is stale (it may have been
//!   applied: ambiguous, never re-applied); a higher one is new and re-creates the session with its
//!   window above the tombstone;
//! - no tombstone: fresh, whatever `first_incomplete` says: a client consumes sequences on
//!   requests the server refuses before they reach the log (validation errors, NOT_LEADER), so a
//!   high `first_incomplete` does not prove the client was ever known (treating it as evicted
//!   locked such clients out for good). **Residual risk**: a client whose writes were applied,
//!   whose session was then evicted and whose tombstone was dropped too (more than
//!   [`MAX_EVICTED_CLIENTS`] later evictions, i.e. several thousand other clients or 1M+ idle log
//!   entries before its retry), gets that retry applied a second time.
//!
//! Persistence is incremental (`session_store.rs`): every client session and every tombstone is
//! its own engine key in the reserved key space (`reserved_keys.rs`, unreachable by clients).
//! The table notes which clients and tombstones an apply round changed; at the end of the
//! round only those are written (or deleted), in the same atomic engine batch as the round's
//! data, so the per-round cost is the sessions the round touched (at most
//! [`MAX_RESULT_BYTES_PER_CLIENT`] of results plus ~30 bytes each), not the whole table.
//! Evictions, expiries and dropped tombstones are changes like any other. The snapshot carries
//! the keys with the data; at open and after a snapshot install the table is read back from
//! them.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::command::{CommandResult, Session};

/// Most results remembered per client.
pub const MAX_RESULTS_PER_CLIENT: usize = 1024;
/// Most clients remembered; beyond it the least recently used are evicted.
pub const MAX_CLIENTS: usize = 4 * 1024;
/// A client with no command in this many log entries is forgotten (leaving a tombstone).
pub const SESSION_IDLE_ENTRIES: u64 = 1_000_000;
/// A result whose value bytes (plus one per op) exceed this is kept as
/// [`CommandResult::TooLargeToKeep`].
pub const MAX_KEPT_RESULT_BYTES: u64 = 4 * 1024;
/// Most estimated result bytes kept per client; beyond it its oldest results are dropped.
pub const MAX_RESULT_BYTES_PER_CLIENT: u64 = 64 * 1024;
/// Most estimated result bytes kept in the whole table; beyond it the least recently used
/// clients are evicted.
pub const MAX_TABLE_RESULT_BYTES: u64 = 4 * 1024 * 1024;
/// Most tombstones of evicted clients; beyond it the oldest evictions are forgotten.
pub const MAX_EVICTED_CLIENTS: usize = 4 * 1024;
/// Estimated bytes of one kept result besides its values (sequence, fingerprint, framing).
const KEPT_RESULT_OVERHEAD_BYTES: u64 = 32;
/// Idle clients are swept at most once per this many log entries.
const SWEEP_EVERY_ENTRIES: u64 = 4096;
/// Evict down to this many clients when [`MAX_CLIENTS`] is exceeded (amortizes the eviction scan).
const CLIENTS_AFTER_EVICTION: usize = MAX_CLIENTS - MAX_CLIENTS / 8;
/// Evict down to this many result bytes when [`MAX_TABLE_RESULT_BYTES`] is exceeded.
const TABLE_RESULT_BYTES_AFTER_EVICTION: u64 = MAX_TABLE_RESULT_BYTES - MAX_TABLE_RESULT_BYTES / 8;
/// Drop tombstones down to this many when [`MAX_EVICTED_CLIENTS`] is exceeded.
const EVICTED_AFTER_DROP: usize = MAX_EVICTED_CLIENTS - MAX_EVICTED_CLIENTS / 8;

const _: () = assert!(CLIENTS_AFTER_EVICTION < MAX_CLIENTS && CLIENTS_AFTER_EVICTION > 0);
const _: () = assert!(EVICTED_AFTER_DROP < MAX_EVICTED_CLIENTS && EVICTED_AFTER_DROP > 0);
const _: () = assert!(MAX_KEPT_RESULT_BYTES + KEPT_RESULT_OVERHEAD_BYTES <= MAX_RESULT_BYTES_PER_CLIENT);
const _: () = assert!(MAX_RESULT_BYTES_PER_CLIENT <= TABLE_RESULT_BYTES_AFTER_EVICTION);

/// What to do with a command carrying a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionCheck {
    /// Not seen before: apply it, then [`SessionTable::record`] its result.
    Fresh,
    /// Already applied (or a reused sequence): return this result, do not apply.
    Duplicate(CommandResult),
    /// Below the client's window, or possibly applied by a forgotten session: do not apply.
    Stale,
}

/// A remembered result and the fingerprint of the command that produced it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct KeptResult {
    pub(super) fingerprint: u64,
    pub(super) result: CommandResult,
}

impl KeptResult {
    /// Estimated encoded size.
    pub(super) fn size_bytes(&self) -> u64 {
        KEPT_RESULT_OVERHEAD_BYTES + value_bytes(&self.result)
    }
}

/// Value bytes of a result plus one per op (what [`MAX_KEPT_RESULT_BYTES`] bounds).
fn value_bytes(result: &CommandResult) -> u64 {
    match result {
        CommandResult::Txn { results, .. } => results
            .iter()
            .map(|r| 1 + r.as_ref().map_or(0, |v| v.len() as u64))
            .sum(),
        CommandResult::Written
        | CommandResult::StaleSequence
        | CommandResult::TooLargeToKeep
        | CommandResult::SequenceReused
        | CommandResult::ValueTooLarge { .. }
        | CommandResult::ResponseTooLarge { .. }
        | CommandResult::ReservedKey
        | CommandResult::BulkStaged
        | CommandResult::BulkLoaded { .. }
        | CommandResult::BulkCancelled { .. }
        | CommandResult::AuthApplied { .. } => 0,
        CommandResult::AuthRefused(r) => r.message.len() as u64,
        CommandResult::BulkDuplicate { key, .. } => key.len() as u64,
    }
}

/// One client's window of remembered results.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct ClientSession {
    /// Sequences below this are forgotten (answered with `StaleSequence`).
    pub(super) window_low: u64,
    /// Results of applied sequences `>= window_low`.
    pub(super) results: BTreeMap<u64, KeptResult>,
    /// Sum of [`KeptResult::size_bytes`] over `results` (not persisted: recomputed on load).
    pub(super) result_bytes: u64,
    /// Highest sequence ever applied for this client (kept in its tombstone on eviction).
    pub(super) max_applied_sequence: u64,
    /// Log index of the last command of this client (for LRU eviction).
    pub(super) last_used_index: u64,
}

impl ClientSession {
    /// Drops the oldest result, raising the window above it; returns the bytes freed.
    fn drop_oldest(&mut self) -> u64 {
        match self.results.pop_first() {
            Some((sequence, kept)) => {
                self.window_low = self.window_low.max(sequence.saturating_add(1));
                let freed = kept.size_bytes();
                self.result_bytes = self.result_bytes.saturating_sub(freed);
                freed
            }
            None => 0,
        }
    }

    /// Forgets results below `low` and raises the window to it; returns the bytes freed.
    fn forget_below(&mut self, low: u64) -> u64 {
        if low <= self.window_low {
            return 0;
        }
        self.window_low = low;
        let kept = self.results.split_off(&low);
        let freed: u64 = self.results.values().map(KeptResult::size_bytes).sum();
        self.results = kept;
        self.result_bytes = self.result_bytes.saturating_sub(freed);
        freed
    }
}

/// What is left of an evicted or expired client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Tombstone {
    /// Highest sequence the client ever had applied: retries up to it are stale.
    pub(super) max_applied_sequence: u64,
    /// Log index of the eviction (oldest tombstones are dropped first).
    pub(super) evicted_at_index: u64,
}

/// All client sessions. Deterministic: every replica given the same commands holds the same table.
///
/// Equality and the serde encoding (the whole table at once, what the tests compare the
/// incremental persistence against) cover the table itself, not the set of changes not yet
/// persisted.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SessionTable {
    pub(super) clients: BTreeMap<u64, ClientSession>,
    /// Tombstones of evicted clients, by client id.
    pub(super) evicted: BTreeMap<u64, Tombstone>,
    /// Sum of `result_bytes` over `clients`.
    pub(super) result_bytes: u64,
    /// Log index at or after which the next idle sweep runs.
    pub(super) next_sweep_index: u64,
    /// Clients changed (or removed) since the changes were last taken (`session_store.rs`).
    #[serde(skip)]
    pub(super) changed_clients: BTreeSet<u64>,
    /// Tombstones changed (or removed) since the changes were last taken.
    #[serde(skip)]
    pub(super) changed_tombstones: BTreeSet<u64>,
}

impl PartialEq for SessionTable {
    fn eq(&self, other: &Self) -> bool {
        self.clients == other.clients
            && self.evicted == other.evicted
            && self.result_bytes == other.result_bytes
            && self.next_sweep_index == other.next_sweep_index
    }
}

impl Eq for SessionTable {}

impl SessionTable {
    /// Number of clients remembered.
    #[cfg(test)]
    pub fn client_count(&self) -> usize {
        self.clients.len()
    }

    /// Estimated bytes of all kept results.
    #[cfg(test)]
    pub fn result_bytes(&self) -> u64 {
        self.result_bytes
    }

    /// Classifies `session` for a command with `fingerprint` ([`Command::fingerprint`]), first
    /// forgetting results the client acknowledged (`< session.first_incomplete`). `log_index` is
    /// the entry carrying the command. A kept sequence whose fingerprint differs yields
    /// `Duplicate(CommandResult::SequenceReused)`.
    ///
    /// [`Command::fingerprint`]: super::command::Command::fingerprint
    pub fn check(&mut self, session: &Session, fingerprint: u64, log_index: u64) -> SessionCheck {
        let Some(client) = self.clients.get_mut(&session.client_id) else {
            if session.sequence < session.first_incomplete {
                return SessionCheck::Stale;
            }
            return match self.evicted.get(&session.client_id) {
                Some(t) if session.sequence <= t.max_applied_sequence => SessionCheck::Stale,
                Some(_) => SessionCheck::Fresh,
                None => SessionCheck::Fresh,
            };
        };
        self.changed_clients.insert(session.client_id);
        client.last_used_index = client.last_used_index.max(log_index);
        let freed = client.forget_below(session.first_incomplete);
        self.result_bytes = self.result_bytes.saturating_sub(freed);
        if session.sequence < client.window_low {
            return SessionCheck::Stale;
        }
        match client.results.get(&session.sequence) {
            Some(kept) if kept.fingerprint != fingerprint => {
                SessionCheck::Duplicate(CommandResult::SequenceReused)
            }
            Some(kept) => SessionCheck::Duplicate(kept.result.clone()),
            None => SessionCheck::Fresh,
        }
    }

    /// Remembers the result of a freshly applied command (one [`SessionTable::check`] called
    /// `Fresh`) with its command `fingerprint`; a result too large to keep is remembered as
    /// [`CommandResult::TooLargeToKeep`]. May evict other clients (see the module docs).
    pub fn record(&mut self, session: &Session, fingerprint: u64, result: &CommandResult, log_index: u64) {
        let kept = KeptResult {
            fingerprint,
            result: if value_bytes(result) > MAX_KEPT_RESULT_BYTES {
                CommandResult::TooLargeToKeep
            } else {
                result.clone()
            },
        };
        let tombstone = self.evicted.remove(&session.client_id);
        if tombstone.is_some() {
            self.changed_tombstones.insert(session.client_id);
        }
        self.changed_clients.insert(session.client_id);
        let client = self
            .clients
            .entry(session.client_id)
            .or_insert_with(|| ClientSession {
                window_low: tombstone.map_or(session.first_incomplete, |t| {
                    session
                        .first_incomplete
                        .max(t.max_applied_sequence.saturating_add(1))
                }),
                results: BTreeMap::new(),
                result_bytes: 0,
                max_applied_sequence: tombstone.map_or(0, |t| t.max_applied_sequence),
                last_used_index: log_index,
            });
        client.last_used_index = client.last_used_index.max(log_index);
        client.max_applied_sequence = client.max_applied_sequence.max(session.sequence);
        let mut added = 0u64;
        let mut freed = 0u64;
        if session.sequence >= client.window_low {
            added = kept.size_bytes();
            client.result_bytes += added;
            if let Some(old) = client.results.insert(session.sequence, kept) {
                let old_bytes = old.size_bytes();
                client.result_bytes = client.result_bytes.saturating_sub(old_bytes);
                freed += old_bytes;
            }
        }
        while client.results.len() > MAX_RESULTS_PER_CLIENT
            || (client.result_bytes > MAX_RESULT_BYTES_PER_CLIENT && client.results.len() > 1)
        {
            freed += client.drop_oldest();
        }
        self.result_bytes = (self.result_bytes + added).saturating_sub(freed);
        if self.clients.len() > MAX_CLIENTS || self.result_bytes > MAX_TABLE_RESULT_BYTES {
            self.evict_least_recently_used(log_index);
        }
        if log_index >= self.next_sweep_index {
            self.next_sweep_index = log_index.saturating_add(SWEEP_EVERY_ENTRIES);
            let horizon = log_index.saturating_sub(SESSION_IDLE_ENTRIES);
            let idle: Vec<u64> = self
                .clients
                .iter()
                .filter(|(_, c)| c.last_used_index < horizon)
                .map(|(id, _)| *id)
                .collect();
            for id in idle {
                self.evict(id, log_index);
            }
        }
        self.drop_old_tombstones();
    }

    /// Evicts least recently used clients (ties: lower id first) down to
    /// `CLIENTS_AFTER_EVICTION` clients and `TABLE_RESULT_BYTES_AFTER_EVICTION` result bytes.
    fn evict_least_recently_used(&mut self, log_index: u64) {
        let mut by_use: Vec<(u64, u64)> = self
            .clients
            .iter()
            .map(|(id, c)| (c.last_used_index, *id))
            .collect();
        by_use.sort_unstable();
        for (_, id) in by_use {
            if self.clients.len() <= CLIENTS_AFTER_EVICTION
                && self.result_bytes <= TABLE_RESULT_BYTES_AFTER_EVICTION
            {
                break;
            }
            self.evict(id, log_index);
        }
    }

    /// Replaces client `id` by a tombstone.
    pub(super) fn evict(&mut self, id: u64, log_index: u64) {
        if let Some(c) = self.clients.remove(&id) {
            self.changed_clients.insert(id);
            self.changed_tombstones.insert(id);
            self.result_bytes = self.result_bytes.saturating_sub(c.result_bytes);
            self.evicted.insert(
                id,
                Tombstone {
                    max_applied_sequence: c.max_applied_sequence,
                    evicted_at_index: log_index,
                },
            );
        }
    }

    /// Drops the oldest tombstones (ties: lower id first) once there are too many.
    fn drop_old_tombstones(&mut self) {
        if self.evicted.len() <= MAX_EVICTED_CLIENTS {
            return;
        }
        let mut by_age: Vec<(u64, u64)> = self
            .evicted
            .iter()
            .map(|(id, t)| (t.evicted_at_index, *id))
            .collect();
        by_age.sort_unstable();
        let excess = self.evicted.len().saturating_sub(EVICTED_AFTER_DROP);
        for (_, id) in by_age.into_iter().take(excess) {
            self.evicted.remove(&id);
            self.changed_tombstones.insert(id);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Fingerprint used by tests that do not exercise fingerprints.
    const F: u64 = 0xF1;

    fn s(client_id: u64, sequence: u64, first_incomplete: u64) -> Session {
        Session {
            client_id,
            sequence,
            first_incomplete,
        }
    }

    #[test]
    fn duplicate_returns_stored_result_and_stale_below_window() {
        let mut t = SessionTable::default();
        assert_eq!(t.check(&s(7, 1, 1), F, 10), SessionCheck::Fresh);
        t.record(&s(7, 1, 1), F, &CommandResult::Written, 10);
        assert_eq!(
            t.check(&s(7, 1, 1), F, 11),
            SessionCheck::Duplicate(CommandResult::Written)
        );
        // Client acknowledged 1 (first_incomplete = 2): result 1 is forgotten.
        assert_eq!(t.check(&s(7, 2, 2), F, 12), SessionCheck::Fresh);
        t.record(&s(7, 2, 2), F, &CommandResult::Written, 12);
        assert_eq!(t.check(&s(7, 1, 1), F, 13), SessionCheck::Stale);
        // Out-of-order pipelined sequence inside the window is fresh.
        assert_eq!(t.check(&s(7, 4, 2), F, 14), SessionCheck::Fresh);
    }

    #[test]
    fn per_client_results_are_bounded() {
        let mut t = SessionTable::default();
        let n = MAX_RESULTS_PER_CLIENT as u64 + 10;
        for seq in 1..=n {
            t.record(&s(1, seq, 1), F, &CommandResult::Written, seq);
        }
        assert_eq!(t.check(&s(1, 1, 1), F, n + 1), SessionCheck::Stale);
        assert_eq!(
            t.check(&s(1, n, 1), F, n + 1),
            SessionCheck::Duplicate(CommandResult::Written)
        );
    }

    #[test]
    fn idle_clients_expire() {
        let mut t = SessionTable::default();
        t.record(&s(1, 1, 1), F, &CommandResult::Written, 10);
        t.record(&s(2, 1, 1), F, &CommandResult::Written, SESSION_IDLE_ENTRIES);
        let later = SESSION_IDLE_ENTRIES + SWEEP_EVERY_ENTRIES + 20;
        t.record(&s(2, 2, 1), F, &CommandResult::Written, later);
        assert_eq!(t.client_count(), 1);
        // Expired, but its tombstone still refuses the retry; the next sequence is new.
        assert_eq!(t.check(&s(1, 1, 1), F, later + 1), SessionCheck::Stale);
        assert_eq!(t.check(&s(1, 2, 1), F, later + 1), SessionCheck::Fresh);
        assert_eq!(
            t.check(&s(2, 1, 1), F, later + 1),
            SessionCheck::Duplicate(CommandResult::Written)
        );
    }

    #[test]
    fn clients_are_bounded_and_lru_evicted() {
        let mut t = SessionTable::default();
        for id in 1..=(MAX_CLIENTS as u64 + 1) {
            t.record(&s(id, 1, 1), F, &CommandResult::Written, id);
        }
        assert_eq!(t.client_count(), CLIENTS_AFTER_EVICTION);
        // The oldest client was evicted: its retry is stale (ambiguous), never applied again.
        assert_eq!(t.check(&s(1, 1, 1), F, u64::MAX), SessionCheck::Stale);
        let newest = MAX_CLIENTS as u64 + 1;
        assert_eq!(
            t.check(&s(newest, 1, 1), F, u64::MAX),
            SessionCheck::Duplicate(CommandResult::Written)
        );
    }

    /// Sum of the per-client accounting, recomputed from the results.
    fn recomputed_result_bytes(t: &SessionTable) -> u64 {
        t.clients
            .values()
            .flat_map(|c| c.results.values())
            .map(KeptResult::size_bytes)
            .sum()
    }

    #[test]
    fn evicted_client_retry_is_never_reapplied() {
        let mut t = SessionTable::default();
        let x = 1_000_000;
        assert_eq!(t.check(&s(x, 1, 1), F, 1), SessionCheck::Fresh);
        t.record(&s(x, 1, 1), F, &CommandResult::Written, 1);
        // 4,700 other clients push X out of the LRU.
        for id in 1..=4_700u64 {
            t.record(&s(id, 1, 1), F, &CommandResult::Written, 1 + id);
        }
        assert!(t.client_count() <= MAX_CLIENTS);
        assert!(!t.clients.contains_key(&x));
        let now = 10_000;
        // The retry of the applied sequence is stale (ambiguous), not applied again.
        assert_eq!(t.check(&s(x, 1, 1), F, now), SessionCheck::Stale);
        // A new sequence is fresh and re-creates the session with its window above the tombstone.
        assert_eq!(t.check(&s(x, 2, 1), F, now), SessionCheck::Fresh);
        t.record(&s(x, 2, 1), F, &CommandResult::Written, now);
        assert_eq!(t.check(&s(x, 1, 1), F, now + 1), SessionCheck::Stale);
        assert_eq!(
            t.check(&s(x, 2, 1), F, now + 1),
            SessionCheck::Duplicate(CommandResult::Written)
        );
        assert!(!t.evicted.contains_key(&x));
        // An unknown client without a tombstone is fresh, also when its first sequences were
        // consumed by requests refused before the log (first_incomplete > 1).
        assert_eq!(t.check(&s(77_777_777, 5, 3), F, now), SessionCheck::Fresh);
        assert_eq!(t.check(&s(77_777_777, 1, 1), F, now), SessionCheck::Fresh);
    }

    #[test]
    fn tombstones_are_bounded_oldest_dropped_first() {
        let mut t = SessionTable::default();
        let n = (MAX_CLIENTS + MAX_EVICTED_CLIENTS) as u64 * 2;
        for id in 1..=n {
            t.record(&s(id, 1, 1), F, &CommandResult::Written, id);
            assert!(t.evicted.len() <= MAX_EVICTED_CLIENTS);
            assert!(t.client_count() <= MAX_CLIENTS);
        }
        // The most recently evicted client still has its tombstone; the very first lost it
        // (the documented residual risk: its first_incomplete == 1 retry looks new).
        let (&recent, _) = t
            .evicted
            .iter()
            .max_by_key(|(id, tb)| (tb.evicted_at_index, **id))
            .unwrap();
        assert_eq!(t.check(&s(recent, 1, 1), F, n + 1), SessionCheck::Stale);
        assert_eq!(t.check(&s(1, 1, 1), F, n + 1), SessionCheck::Fresh);
    }

    #[test]
    fn big_txn_result_is_not_kept() {
        let mut t = SessionTable::default();
        let big = CommandResult::Txn {
            succeeded: true,
            results: vec![Some(vec![7u8; 1024 * 1024]); 20],
        };
        assert_eq!(t.check(&s(1, 1, 1), F, 1), SessionCheck::Fresh);
        t.record(&s(1, 1, 1), F, &big, 1);
        assert_eq!(
            t.check(&s(1, 1, 1), F, 2),
            SessionCheck::Duplicate(CommandResult::TooLargeToKeep)
        );
        assert!(t.result_bytes() <= KEPT_RESULT_OVERHEAD_BYTES);
        assert!(postcard::to_stdvec(&t).unwrap().len() < 256);
        // A small result is kept verbatim.
        let small = CommandResult::Txn {
            succeeded: false,
            results: vec![Some(vec![1u8; 100]), None],
        };
        t.record(&s(1, 2, 1), F, &small, 3);
        assert_eq!(t.check(&s(1, 2, 1), F, 4), SessionCheck::Duplicate(small));
        assert_eq!(t.result_bytes(), recomputed_result_bytes(&t));
    }

    #[test]
    fn reused_sequence_with_different_command_is_detected() {
        use crate::cluster::command::{Command, TxnOp};
        use ftkv_engine::WriteOp;
        let session = Some(s(1, 1, 1));
        let put = Command::Write {
            session,
            ops: vec![WriteOp::Put {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
            }],
        };
        let txn = Command::Txn {
            session,
            compares: vec![],
            success: vec![TxnOp::Get { key: b"k".to_vec() }],
            failure: vec![],
        };
        // The fingerprint ignores the session (a retry may carry a higher first_incomplete).
        let put_retry = match put.clone() {
            Command::Write { ops, .. } => Command::Write {
                session: Some(s(1, 1, 0)),
                ops,
            },
            other => other,
        };
        assert_eq!(put.fingerprint(), put_retry.fingerprint());
        assert_ne!(put.fingerprint(), txn.fingerprint());

        let mut t = SessionTable::default();
        assert_eq!(t.check(&s(1, 1, 1), put.fingerprint(), 1), SessionCheck::Fresh);
        t.record(&s(1, 1, 1), put.fingerprint(), &CommandResult::Written, 1);
        assert_eq!(
            t.check(&s(1, 1, 1), txn.fingerprint(), 2),
            SessionCheck::Duplicate(CommandResult::SequenceReused)
        );
        assert_eq!(
            t.check(&s(1, 1, 1), put_retry.fingerprint(), 3),
            SessionCheck::Duplicate(CommandResult::Written)
        );
    }

    #[test]
    fn table_bytes_are_bounded() {
        let result = |fill: u8| CommandResult::Txn {
            succeeded: true,
            results: vec![Some(vec![fill; 4000])],
        };
        // Per client: oldest results dropped, their retries stale.
        let mut t = SessionTable::default();
        for seq in 1..=100u64 {
            t.record(&s(1, seq, 1), F, &result(seq as u8), seq);
            assert!(t.result_bytes() <= MAX_RESULT_BYTES_PER_CLIENT);
        }
        assert_eq!(t.check(&s(1, 1, 1), F, 101), SessionCheck::Stale);
        assert_eq!(
            t.check(&s(1, 100, 1), F, 101),
            SessionCheck::Duplicate(result(100))
        );
        assert_eq!(t.result_bytes(), recomputed_result_bytes(&t));

        // Whole table: least recently used clients evicted beyond the byte budget, and their
        // retries are stale, never re-applied.
        let mut t = SessionTable::default();
        let mut index = 0;
        for id in 1..=200u64 {
            for seq in 1..=16u64 {
                index += 1;
                t.record(&s(id, seq, 1), F, &result(seq as u8), index);
                assert!(t.result_bytes() <= MAX_TABLE_RESULT_BYTES);
            }
        }
        assert_eq!(t.result_bytes(), recomputed_result_bytes(&t));
        let encoded = postcard::to_stdvec(&t).unwrap().len() as u64;
        assert!(encoded <= MAX_TABLE_RESULT_BYTES + 64 * 1024, "encoded {encoded}");
        assert!(t.client_count() < 200);
        assert_eq!(t.check(&s(1, 16, 1), F, index + 1), SessionCheck::Stale);
        assert_eq!(
            t.check(&s(200, 16, 1), F, index + 1),
            SessionCheck::Duplicate(result(16))
        );
    }

    #[test]
    fn acknowledged_results_are_freed() {
        let mut t = SessionTable::default();
        for seq in 1..=4u64 {
            let r = CommandResult::Txn {
                succeeded: true,
                results: vec![Some(vec![0u8; 1000])],
            };
            t.record(&s(1, seq, 1), F, &r, seq);
        }
        let before = t.result_bytes();
        assert_eq!(t.check(&s(1, 5, 4), F, 5), SessionCheck::Fresh);
        assert!(t.result_bytes() < before / 2);
        assert_eq!(t.result_bytes(), recomputed_result_bytes(&t));
    }
}
