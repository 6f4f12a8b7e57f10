//! Exactly-once write sessions: one random client id per [`crate::Client`], a sequence number
//! per write, and the lowest sequence still outstanding.
//!
//! Design source: Raft thesis (Ongaro 2014) section 6.3 "Implementing linearizable semantics"
//! and RIFL (Lee et al., SOSP 2015): the server remembers each client's results for the
//! sequences at or above `first_incomplete`, so a write retried with the same sequence is
//! answered from memory instead of being applied twice, and results below `first_incomplete`
//! can be forgotten because the client will never ask for them again.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

/// Identity of one write: who sent it and which of that client's writes it is.
///
/// Obtained from [`crate::Client::new_write_session`] (test and tooling use). Holding it keeps
/// its sequence "outstanding", so the server keeps the result until it is dropped.
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

/// Allocates sequence numbers and tracks which are still in flight.
#[derive(Debug)]
pub(crate) struct SessionTracker {
    client_id: u64,
    next_sequence: AtomicU64,
    /// Sequences allocated and not yet finished.
    in_flight: Mutex<BTreeSet<u64>>,
}

impl SessionTracker {
    /// A tracker with a random non-zero client id.
    pub(crate) fn new() -> Arc<Self> {
        let mut id = 0u64;
        while id == 0 {
            id = rand::random::<u64>();
        }
        Self::with_client_id(id)
    }

    /// A tracker with a given client id (0 is replaced by 1: 0 means "no session" on the wire).
    pub(crate) fn with_client_id(client_id: u64) -> Arc<Self> {
        Arc::new(Self {
            client_id: client_id.max(1),
            next_sequence: AtomicU64::new(1),
            in_flight: Mutex::new(BTreeSet::new()),
        })
    }

    /// Allocates the next sequence and marks it outstanding until the returned session drops.
    pub(crate) fn begin(self: &Arc<Self>) -> WriteSession {
        // Holding the lock across allocation and insertion keeps `first_incomplete` from ever
        // skipping a sequence that was allocated but not yet recorded.
        let mut in_flight = self.in_flight.lock();
        let sequence = self.next_sequence.fetch_add(1, Ordering::Relaxed);
        in_flight.insert(sequence);
        drop(in_flight);
        WriteSession {
            client_id: self.client_id,
            sequence,
            tracker: Arc::clone(self),
        }
    }

    /// Lowest sequence still outstanding, or the next one to be allocated when none is.
    pub(crate) fn first_incomplete(&self) -> u64 {
        let in_flight = self.in_flight.lock();
        match in_flight.first() {
            Some(&seq) => seq,
            None => self.next_sequence.load(Ordering::Relaxed),
        }
    }

    fn finish(&self, sequence: u64) {
        self.in_flight.lock().remove(&sequence);
    }

    pub(crate) fn client_id(&self) -> u64 {
        self.client_id
    }

    #[cfg(test)]
    fn outstanding(&self) -> usize {
        self.in_flight.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequences_start_at_one_and_increase() {
        let t = SessionTracker::new();
        assert_ne!(t.client_id(), 0);
        let a = t.begin();
        let b = t.begin();
        let c = t.begin();
        assert_eq!((a.sequence(), b.sequence(), c.sequence()), (1, 2, 3));
        assert_eq!(a.client_id(), t.client_id());
    }

    #[test]
    fn first_incomplete_is_the_lowest_outstanding() {
        let t = SessionTracker::with_client_id(9);
        assert_eq!(t.first_incomplete(), 1);
        let s1 = t.begin();
        let s2 = t.begin();
        let s3 = t.begin();
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
        let t = SessionTracker::with_client_id(5);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let t = Arc::clone(&t);
                std::thread::spawn(move || {
                    for _ in 0..2000 {
                        let s = t.begin();
                        let p = s.to_proto();
                        assert!(p.first_incomplete <= p.sequence, "{p:?}");
                        assert!(p.first_incomplete >= 1);
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
        assert_eq!(SessionTracker::with_client_id(0).client_id(), 1);
    }
}
