//! Exactly-once write sessions: one random client id per [`crate::Client`], a sequence number
//! per write, and the lowest sequence still outstanding.
//!
//! Design source: Raft thesis (Ongaro 2014) section 6.3 "Implementing linearizable semantics"
//! and RIFL (Lee et al., SOSP 2015): the server remembers each client's results for the
//! sequences at or above `first_incomplete`, so a write retried with the same sequence is
//! answered from memory instead of being applied twice, and results below `first_incomplete`
//! can be forgotten because the client will never ask for them again.

use std::collections::BTreeSet;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

/// Default span of outstanding sequences: a new write waits while
/// `next_sequence >= first_incomplete + window`. The node keeps at most 1,024 results per
/// client (`MAX_RESULTS_PER_CLIENT`) and forgets the oldest beyond that, so the client must never
/// have results of more than that many sequences at or above its `first_incomplete`; otherwise
/// a write retried after a long stall would be answered "stale" instead of from memory.
pub const DEFAULT_SESSION_WINDOW: u64 = 1000;

/// Identity of one write: who sent it and which of that client's writes it is.
///
/// Obtained from [`crate::Client::new_write_session`] (test and tooling use). Holding it keeps
/// its sequence "outstanding", so the server keeps the result until it is dropped; holding it
/// for long also holds back new writes once the session window is full.
#[derive(Debug)]
pub struct WriteSession {
    client_id: u64,
    sequence: u64,
    tracker: Arc<SessionTracker>,
}

impl WriteSession {
    /// The random, non-zero id of the client instance.
    pub fn client_id(&self) -> u64 {
        self.client_id
    }

    /// This write's sequence number (1, 2, 3, ... per client instance).
    pub fn sequence(&self) -> u64 {
        self.sequence
    }

    /// The wire form, with `first_incomplete` computed now (it only moves forward).
    pub(crate) fn to_proto(&self) -> ftkv_proto::v1::Session {
        ftkv_proto::v1::Session {
            client_id: self.client_id,
            sequence: self.sequence,
            first_incomplete: self.tracker.first_incomplete(),
        }
    }
}

impl Drop for WriteSession {
    fn drop(&mut self) {
        self.tracker.finish(self.sequence);
    }
}

#[derive(Debug)]
struct Sequences {
    /// Next sequence to hand out (starts at 1).
    next: u64,
    /// Sequences handed out and not yet finished.
    in_flight: BTreeSet<u64>,
}

impl Sequences {
    fn first_incomplete(&self) -> u64 {
        self.in_flight.first().copied().unwrap_or(self.next)
    }
}

/// Allocates sequence numbers, tracks which are still in flight, and bounds how far new
/// sequences may run ahead of the oldest outstanding one.
#[derive(Debug)]
pub(crate) struct SessionTracker {
    client_id: u64,
    window: u64,
    sequences: Mutex<Sequences>,
    /// Woken when the lowest outstanding sequence finishes (the window may have moved).
    window_moved: Notify,
}

impl SessionTracker {
    /// A tracker with a random non-zero client id.
    pub(crate) fn new(window: u64) -> Arc<Self> {
        let mut id = 0u64;
        while id == 0 {
            id = rand::random::<u64>();
        }
        Self::with_client_id(id, window)
    }

    /// A tracker with a given client id (0 is replaced by 1: 0 means "no session" on the wire)
    /// and window (at least 1).
    pub(crate) fn with_client_id(client_id: u64, window: u64) -> Arc<Self> {
        Arc::new(Self {
            client_id: client_id.max(1),
            window: window.max(1),
            sequences: Mutex::new(Sequences {
                next: 1,
                in_flight: BTreeSet::new(),
            }),
            window_moved: Notify::new(),
        })
    }

    /// Allocates the next sequence and marks it outstanding until the returned session drops.
    /// Waits while the window is full (the oldest outstanding write holds it back).
    pub(crate) async fn begin(self: &Arc<Self>) -> WriteSession {
        loop {
            let notified = self.window_moved.notified();
            tokio::pin!(notified);
            // Register before checking, so a finish between the check and the await is seen.
            notified.as_mut().enable();
            if let Some(session) = self.try_begin() {
                return session;
            }
            notified.await;
        }
    }

    /// Allocates the next sequence if the window has room.
    pub(crate) fn try_begin(self: &Arc<Self>) -> Option<WriteSession> {
        let mut seqs = self.sequences.lock();
        if seqs.next >= seqs.first_incomplete().saturating_add(self.window) {
            return None;
        }
        let sequence = seqs.next;
        seqs.next += 1;
        seqs.in_flight.insert(sequence);
        Some(WriteSession {
            client_id: self.client_id,
            sequence,
            tracker: Arc::clone(self),
        })
    }

    /// Lowest sequence still outstanding, or the next one to be allocated when none is.
    pub(crate) fn first_incomplete(&self) -> u64 {
        self.sequences.lock().first_incomplete()
    }

    fn finish(&self, sequence: u64) {
        let mut seqs = self.sequences.lock();
        let was_lowest = seqs.in_flight.first() == Some(&sequence);
        seqs.in_flight.remove(&sequence);
        drop(seqs);
        if was_lowest {
            self.window_moved.notify_waiters();
        }
    }

    pub(crate) fn client_id(&self) -> u64 {
        self.client_id
    }

    #[cfg(test)]
    fn outstanding(&self) -> usize {
        self.sequences.lock().in_flight.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_full_window_holds_new_writes_until_the_oldest_finishes() {
        let t = SessionTracker::with_client_id(3, 4);
        let oldest = t.begin().await;
        let rest: Vec<WriteSession> = vec![t.begin().await, t.begin().await, t.begin().await];
        assert_eq!(rest.last().map(WriteSession::sequence), Some(4));
        // Sequences 1..=4 outstanding: sequence 5 would be 4 ahead of first_incomplete = 1.
        assert!(t.try_begin().is_none());
        drop(rest); // finishing newer writes does not move the window
        assert!(t.try_begin().is_none());
        let waiter = {
            let t = Arc::clone(&t);
            tokio::spawn(async move { t.begin().await.sequence() })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "must wait while sequence 1 is outstanding");
        drop(oldest);
        let seq = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(seq, 5);
    }

    fn begin(t: &Arc<SessionTracker>) -> WriteSession {
        t.try_begin().unwrap()
    }

    #[test]
    fn sequences_start_at_one_and_increase() {
        let t = SessionTracker::new(DEFAULT_SESSION_WINDOW);
        assert_ne!(t.client_id(), 0);
        let a = begin(&t);
        let b = begin(&t);
        let c = begin(&t);
        assert_eq!((a.sequence(), b.sequence(), c.sequence()), (1, 2, 3));
        assert_eq!(a.client_id(), t.client_id());
    }

    #[test]
    fn first_incomplete_is_the_lowest_outstanding() {
        let t = SessionTracker::with_client_id(9, 100);
        assert_eq!(t.first_incomplete(), 1);
        let s1 = begin(&t);
        let s2 = begin(&t);
        let s3 = begin(&t);
        assert_eq!(s3.to_proto().first_incomplete, 1);
        // Finishing out of order: 2 done, 1 still outstanding.
        drop(s2);
        assert_eq!(t.first_incomplete(), 1);
        drop(s1);
        assert_eq!(t.first_incomplete(), 3);
        let p = s3.to_proto();
        assert_eq!((p.client_id, p.sequence, p.first_incomplete), (9, 3, 3));
        drop(s3);
        assert_eq!(t.first_incomplete(), 4, "nothing outstanding: the next sequence");
        assert_eq!(t.outstanding(), 0);
    }

    #[test]
    fn first_incomplete_never_exceeds_an_outstanding_sequence_under_concurrency() {
        let t = SessionTracker::with_client_id(5, 64);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let t = Arc::clone(&t);
                std::thread::spawn(move || {
                    let mut done = 0;
                    while done < 2000 {
                        // A full window is possible with 4 writers only if one stalls; spin.
                        let Some(s) = t.try_begin() else { continue };
                        done += 1;
                        let p = s.to_proto();
                        assert!(p.first_incomplete <= p.sequence, "{p:?}");
                        assert!(p.first_incomplete >= 1);
                        assert!(p.sequence < p.first_incomplete + 64, "window exceeded: {p:?}");
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        assert_eq!(t.outstanding(), 0);
        assert_eq!(t.first_incomplete(), 8001);
    }

    #[test]
    fn zero_client_id_is_never_used() {
        assert_eq!(SessionTracker::with_client_id(0, 0).client_id(), 1);
    }
}
