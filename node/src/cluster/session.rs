//! Client sessions for exactly-once writes (Raft thesis section 6.3; RIFL, "Implementing
//! Linearizability at Large Scale and Low Latency", SOSP 2015).
//!
//! Per client id the state machine keeps the results of the sequences the client may still retry
//! (`>= first_incomplete`, as the client reports it with every write). A retried command whose
//! result is kept returns that result without being applied again; one below the window returns
//! [`CommandResult::StaleSequence`]. Everything is bounded: [`MAX_RESULTS_PER_CLIENT`] results per
//! client (older ones are dropped and the window raised), [`MAX_CLIENTS`] clients (the least
//! recently used are evicted, by log index, so every replica evicts the same ones), and clients
//! idle for [`SESSION_IDLE_ENTRIES`] log entries expire (a one-shot CLI process leaves its session
//! behind; RIFL expires such leases the same way).
//!
//! Cost: the whole table is re-encoded into the engine metadata at every apply round, so its
//! size bounds the per-round overhead (about 20 bytes per client plus its kept results).
//!
//! The table is part of the state machine: it is persisted with the engine metadata atomically with
//! the data, and travels in snapshots.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::command::{CommandResult, Session};

/// Most results remembered per client.
pub const MAX_RESULTS_PER_CLIENT: usize = 1024;
/// Most clients remembered; beyond it the least recently used are evicted.
pub const MAX_CLIENTS: usize = 4 * 1024;
/// A client with no command in this many log entries is forgotten.
pub const SESSION_IDLE_ENTRIES: u64 = 1_000_000;
/// Idle clients are swept at most once per this many log entries.
const SWEEP_EVERY_ENTRIES: u64 = 4096;
/// Evict down to this many clients when [`MAX_CLIENTS`] is exceeded (amortizes the eviction scan).
const CLIENTS_AFTER_EVICTION: usize = MAX_CLIENTS - MAX_CLIENTS / 8;

const _: () = assert!(CLIENTS_AFTER_EVICTION < MAX_CLIENTS && CLIENTS_AFTER_EVICTION > 0);

/// What to do with a command carrying a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionCheck {
    /// Not seen before: apply it, then [`SessionTable::record`] its result.
    Fresh,
    /// Already applied: return this result, do not apply again.
    Duplicate(CommandResult),
    /// Below the client's window: its result was delivered and forgotten.
    Stale,
}

/// One client's window of remembered results.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct ClientSession {
    /// Sequences below this are forgotten (answered with `StaleSequence`).
    window_low: u64,
    /// Results of applied sequences `>= window_low`.
    results: BTreeMap<u64, CommandResult>,
    /// Log index of the last command of this client (for LRU eviction).
    last_used_index: u64,
}

/// All client sessions. Deterministic: every replica given the same commands holds the same table.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionTable {
    clients: BTreeMap<u64, ClientSession>,
    /// Log index at or after which the next idle sweep runs.
    next_sweep_index: u64,
}

impl SessionTable {
    /// Number of clients remembered.
    #[cfg(test)]
    pub fn client_count(&self) -> usize {
        self.clients.len()
    }

    /// Classifies `session`, first forgetting results the client acknowledged
    /// (`< session.first_incomplete`). `log_index` is the entry carrying the command.
    pub fn check(&mut self, session: &Session, log_index: u64) -> SessionCheck {
        let Some(client) = self.clients.get_mut(&session.client_id) else {
            return if session.sequence < session.first_incomplete {
                SessionCheck::Stale
            } else {
                SessionCheck::Fresh
            };
        };
        client.last_used_index = client.last_used_index.max(log_index);
        if session.first_incomplete > client.window_low {
            client.window_low = session.first_incomplete;
            client.results = client.results.split_off(&session.first_incomplete);
        }
        if session.sequence < client.window_low {
            return SessionCheck::Stale;
        }
        match client.results.get(&session.sequence) {
            Some(result) => SessionCheck::Duplicate(result.clone()),
            None => SessionCheck::Fresh,
        }
    }

    /// Remembers the result of a freshly applied command.
    pub fn record(&mut self, session: &Session, result: &CommandResult, log_index: u64) {
        let client = self
            .clients
            .entry(session.client_id)
            .or_insert_with(|| ClientSession {
                window_low: session.first_incomplete,
                results: BTreeMap::new(),
                last_used_index: log_index,
            });
        client.last_used_index = client.last_used_index.max(log_index);
        client.results.insert(session.sequence, result.clone());
        while client.results.len() > MAX_RESULTS_PER_CLIENT {
            if let Some((oldest, _)) = client.results.pop_first() {
                client.window_low = client.window_low.max(oldest + 1);
            }
        }
        if self.clients.len() > MAX_CLIENTS {
            self.evict_least_recently_used();
        }
        if log_index >= self.next_sweep_index {
            self.next_sweep_index = log_index.saturating_add(SWEEP_EVERY_ENTRIES);
            let horizon = log_index.saturating_sub(SESSION_IDLE_ENTRIES);
            self.clients.retain(|_, c| c.last_used_index >= horizon);
        }
    }

    fn evict_least_recently_used(&mut self) {
        let mut by_use: Vec<(u64, u64)> = self
            .clients
            .iter()
            .map(|(id, c)| (c.last_used_index, *id))
            .collect();
        by_use.sort_unstable();
        let excess = self.clients.len().saturating_sub(CLIENTS_AFTER_EVICTION);
        for (_, id) in by_use.into_iter().take(excess) {
            self.clients.remove(&id);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

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
        assert_eq!(t.check(&s(7, 1, 1), 10), SessionCheck::Fresh);
        t.record(&s(7, 1, 1), &CommandResult::Written, 10);
        assert_eq!(
            t.check(&s(7, 1, 1), 11),
            SessionCheck::Duplicate(CommandResult::Written)
        );
        // Client acknowledged 1 (first_incomplete = 2): result 1 is forgotten.
        assert_eq!(t.check(&s(7, 2, 2), 12), SessionCheck::Fresh);
        t.record(&s(7, 2, 2), &CommandResult::Written, 12);
        assert_eq!(t.check(&s(7, 1, 1), 13), SessionCheck::Stale);
        // Out-of-order pipelined sequence inside the window is fresh.
        assert_eq!(t.check(&s(7, 4, 2), 14), SessionCheck::Fresh);
    }

    #[test]
    fn per_client_results_are_bounded() {
        let mut t = SessionTable::default();
        let n = MAX_RESULTS_PER_CLIENT as u64 + 10;
        for seq in 1..=n {
            t.record(&s(1, seq, 1), &CommandResult::Written, seq);
        }
        assert_eq!(t.check(&s(1, 1, 1), n + 1), SessionCheck::Stale);
        assert_eq!(
            t.check(&s(1, n, 1), n + 1),
            SessionCheck::Duplicate(CommandResult::Written)
        );
    }

    #[test]
    fn idle_clients_expire() {
        let mut t = SessionTable::default();
        t.record(&s(1, 1, 1), &CommandResult::Written, 10);
        t.record(&s(2, 1, 1), &CommandResult::Written, SESSION_IDLE_ENTRIES);
        let later = SESSION_IDLE_ENTRIES + SWEEP_EVERY_ENTRIES + 20;
        t.record(&s(2, 2, 1), &CommandResult::Written, later);
        assert_eq!(t.client_count(), 1);
        assert_eq!(t.check(&s(1, 1, 1), later + 1), SessionCheck::Fresh);
        assert_eq!(
            t.check(&s(2, 1, 1), later + 1),
            SessionCheck::Duplicate(CommandResult::Written)
        );
    }

    #[test]
    fn clients_are_bounded_and_lru_evicted() {
        let mut t = SessionTable::default();
        for id in 1..=(MAX_CLIENTS as u64 + 1) {
            t.record(&s(id, 1, 1), &CommandResult::Written, id);
        }
        assert_eq!(t.client_count(), CLIENTS_AFTER_EVICTION);
        // The oldest client was evicted (its retry is treated as new), the newest kept.
        assert_eq!(t.check(&s(1, 1, 1), u64::MAX), SessionCheck::Fresh);
        let newest = MAX_CLIENTS as u64 + 1;
        assert_eq!(
            t.check(&s(newest, 1, 1), u64::MAX),
            SessionCheck::Duplicate(CommandResult::Written)
        );
    }
}
