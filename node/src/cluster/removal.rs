//! Noticing that this node was removed from the cluster.
//!
//! A voter removed by a membership change often never receives the entry that removes it: the
//! leader stops replicating to it once the change commits. It still believes it is a voter, so
//! openraft keeps starting elections with rising terms, and every rejoin then drags the
//! cluster's term up. The other members refuse its Votes (`peer_guard`: `PERMISSION_DENIED`
//! naming the log index of their membership). When peers that, with this node, make a majority
//! of the voters it knows refuse it on the ground of a membership at least as new as its own,
//! it is removed: it stops campaigning (openraft's runtime `elect` switch), reports the role
//! `removed` and refuses client requests. Should a newer membership include it again (it was
//! re-added), it goes back to normal.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::peer_guard::MembershipView;
use super::types::NodeId;

/// Refusals of this node's messages by peers, shared by every replication stream.
#[derive(Debug, Clone, Default)]
pub(crate) struct Refusals {
    /// Peer -> membership log index it refused this node on.
    by_peer: Arc<Mutex<BTreeMap<NodeId, u64>>>,
}

impl Refusals {
    /// `peer` refused this node, citing its membership at `membership_index`.
    pub(crate) fn refused(&self, peer: NodeId, membership_index: u64) {
        self.by_peer.lock().insert(peer, membership_index);
    }

    /// `peer` accepted a message from this node.
    pub(crate) fn accepted(&self, peer: NodeId) {
        let mut by_peer = self.by_peer.lock();
        if !by_peer.is_empty() {
            by_peer.remove(&peer);
        }
    }

    /// Whether `me` is removed, given its own view of the membership: peers that, counted with
    /// `me`, are a majority of the voters `me` knows refuse it on a membership at least as new.
    pub(crate) fn is_removed(&self, me: NodeId, own: &MembershipView) -> bool {
        if !own.voters.contains(&me) {
            return false; // a learner or a fresh node: it does not campaign anyway
        }
        let by_peer = self.by_peer.lock();
        let refusing = own
            .voters
            .iter()
            .filter(|v| **v != me && by_peer.get(v).is_some_and(|&index| index >= own.log_index))
            .count();
        refusing > 0 && (refusing + 1) * 2 > own.voters.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(log_index: u64, voters: &[u64]) -> MembershipView {
        MembershipView {
            log_index,
            voters: voters.iter().copied().collect(),
            nodes: voters.iter().copied().collect(),
        }
    }

    #[test]
    fn removed_only_when_a_majority_refuses_on_a_membership_as_new() {
        let r = Refusals::default();
        let own = view(10, &[1, 2, 3]);
        assert!(!r.is_removed(3, &own));
        // A peer that lags behind (older membership) does not count.
        r.refused(1, 9);
        assert!(!r.is_removed(3, &own));
        r.refused(1, 12);
        assert!(
            r.is_removed(3, &own),
            "node 1 plus node 3 are two of three voters"
        );
        // Accepted again (re-added): not removed.
        r.accepted(1);
        assert!(!r.is_removed(3, &own));
        // Five voters: one refuser is not enough, two are.
        let own5 = view(10, &[1, 2, 3, 4, 5]);
        r.refused(1, 10);
        assert!(!r.is_removed(5, &own5));
        r.refused(2, 11);
        assert!(r.is_removed(5, &own5));
        // A node that is not a voter in its own view never counts as removed.
        assert!(!r.is_removed(9, &own5));
        // A newer own membership (re-added at index 20) outweighs older refusals.
        assert!(!r.is_removed(5, &view(20, &[1, 2, 3, 4, 5])));
    }
}
