//! What a peer message may claim before it reaches the Raft core.
//!
//! Nothing received from the peer port is trusted. openraft assumes well-formed messages from
//! members: a term of `u64::MAX` makes its election code overflow (`term + 1`) and panic, and
//! the panic comes back at every restart because the vote was saved first; a Vote or
//! AppendEntries from an id outside the membership is acted on like any other. So every
//! request is checked here first, and refused with a gRPC status (the Raft core never sees it):
//!
//! - **Ranges**: terms and log indexes at most [`MAX_TERM`] / [`MAX_LOG_INDEX`] (2^62: far beyond
//!   any real cluster, far enough from `u64::MAX` that no `+ 1` in openraft can overflow).
//! - **Sender**: the claimed sender (`RaftMessage.from`) must be the node the message speaks
//!   for (the candidate of a Vote, the leader of an AppendEntries or InstallSnapshot), and that
//!   node must be a voter of this node's membership (either half of a joint one). A node that has
//!   no membership yet (a fresh node waiting to be added or initialized) accepts any sender: it
//!   has nothing to protect until it is part of a cluster.
//! - **Shape** of AppendEntries: entries are consecutive from `prev_log_id + 1`, no entry is of a
//!   later term than the leader's vote, and terms do not go down along the entries.
//!
//! Refusals from the membership check are `PERMISSION_DENIED` and carry, in the
//! [`MEMBERSHIP_INDEX_HEADER`] metadata, the log index of the membership the refusal was based
//! on, so that a node that was removed can tell (see `removal`).
//!
//! Without peer TLS this stops forged ids, not a forger who claims a real member's id: the peer
//! port must then be on a trusted network. With peer TLS on, `crate::tls::identity` also binds
//! the claimed id to the connection's certificate (README, "Security (TLS)").

use std::collections::BTreeSet;

use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use tonic::Status;

use super::types::{LogId, NodeId, TypeConfig, Vote};
use super::NodeAddr;

/// Largest term a peer message may carry.
pub(crate) const MAX_TERM: u64 = 1 << 62;
/// Largest log index a peer message may carry.
pub(crate) const MAX_LOG_INDEX: u64 = 1 << 62;
/// Metadata key of a membership refusal: the log index of the refusing node's membership.
pub(crate) const MEMBERSHIP_INDEX_HEADER: &str = "ftkv-membership-log-index";

/// The part of this node's membership the checks need.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct MembershipView {
    /// Log index of the membership entry (0 when none).
    pub log_index: u64,
    /// Voters of every half of the (possibly joint) configuration.
    pub voters: BTreeSet<NodeId>,
    /// Every node of the membership, voters and learners.
    pub nodes: BTreeSet<NodeId>,
}

impl MembershipView {
    /// The view of an openraft stored membership.
    pub(crate) fn of(m: &openraft::StoredMembership<NodeId, NodeAddr>) -> Self {
        let membership = m.membership();
        MembershipView {
            log_index: m.log_id().map_or(0, |l| l.index),
            voters: membership.get_joint_config().iter().flatten().copied().collect(),
            nodes: membership.nodes().map(|(id, _)| *id).collect(),
        }
    }

    /// Whether this node is part of no cluster yet.
    fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

fn check_term(what: &str, term: u64) -> Result<(), Status> {
    if term > MAX_TERM {
        return Err(Status::invalid_argument(format!(
            "{what} term {term} is out of range (at most {MAX_TERM})"
        )));
    }
    Ok(())
}

fn check_log_id(what: &str, log_id: Option<&LogId>) -> Result<(), Status> {
    let Some(l) = log_id else { return Ok(()) };
    check_term(what, l.leader_id.term)?;
    if l.index > MAX_LOG_INDEX {
        return Err(Status::invalid_argument(format!(
            "{what} index {} is out of range (at most {MAX_LOG_INDEX})",
            l.index
        )));
    }
    Ok(())
}

fn check_vote(vote: &Vote) -> Result<(), Status> {
    check_term("vote", vote.leader_id.term)
}

/// The sender must speak for itself and be a voter of `membership` (unless it is empty).
fn check_sender(
    rpc: &str,
    from: NodeId,
    speaks_for: NodeId,
    membership: &MembershipView,
) -> Result<(), Status> {
    if from != speaks_for {
        return Err(Status::invalid_argument(format!(
            "{rpc} sent by node {from} on behalf of node {speaks_for}"
        )));
    }
    if membership.is_empty() || membership.voters.contains(&from) {
        return Ok(());
    }
    let mut status = Status::permission_denied(format!(
        "node {from} is not a voter of this cluster (membership at log index {}: voters {:?}, nodes {:?}); \
         {rpc} refused",
        membership.log_index, membership.voters, membership.nodes
    ));
    if let Ok(v) = membership.log_index.to_string().parse() {
        status.metadata_mut().insert(MEMBERSHIP_INDEX_HEADER, v);
    }
    Err(status)
}

/// Checks a Vote request sent as `from`.
pub(crate) fn check_vote_request(
    req: &VoteRequest<NodeId>,
    from: NodeId,
    membership: &MembershipView,
) -> Result<(), Status> {
    check_vote(&req.vote)?;
    check_log_id("last log id", req.last_log_id.as_ref())?;
    check_sender("Vote", from, req.vote.leader_id.node_id, membership)
}

/// Checks an AppendEntries request sent as `from`.
pub(crate) fn check_append_entries(
    req: &AppendEntriesRequest<TypeConfig>,
    from: NodeId,
    membership: &MembershipView,
) -> Result<(), Status> {
    check_vote(&req.vote)?;
    check_log_id("prev log id", req.prev_log_id.as_ref())?;
    check_log_id("leader commit", req.leader_commit.as_ref())?;
    let first = req.prev_log_id.map_or(0, |p| p.index + 1);
    let mut term = req.prev_log_id.map_or(0, |p| p.leader_id.term);
    for (expected, entry) in (first..).zip(&req.entries) {
        check_log_id("entry", Some(&entry.log_id))?;
        if entry.log_id.index != expected {
            return Err(Status::invalid_argument(format!(
                "AppendEntries entry at index {} where {expected} was due",
                entry.log_id.index
            )));
        }
        if entry.log_id.leader_id.term < term || entry.log_id.leader_id.term > req.vote.leader_id.term {
            return Err(Status::invalid_argument(format!(
                "AppendEntries entry {} of term {} (previous term {term}, leader term {})",
                entry.log_id.index, entry.log_id.leader_id.term, req.vote.leader_id.term
            )));
        }
        term = entry.log_id.leader_id.term;
    }
    check_sender("AppendEntries", from, req.vote.leader_id.node_id, membership)
}

/// Checks an InstallSnapshot request sent as `from`.
pub(crate) fn check_install_snapshot(
    req: &InstallSnapshotRequest<TypeConfig>,
    from: NodeId,
    membership: &MembershipView,
) -> Result<(), Status> {
    check_vote(&req.vote)?;
    check_log_id("snapshot last log id", req.meta.last_log_id.as_ref())?;
    check_log_id(
        "snapshot membership log id",
        req.meta.last_membership.log_id().as_ref(),
    )?;
    check_sender("InstallSnapshot", from, req.vote.leader_id.node_id, membership)
}

/// The membership log index a `PERMISSION_DENIED` refusal from [`check_sender`] names.
pub(crate) fn refusal_membership_index(status: &Status) -> Option<u64> {
    if status.code() != tonic::Code::PermissionDenied {
        return None;
    }
    status
        .metadata()
        .get(MEMBERSHIP_INDEX_HEADER)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn view(voters: &[u64], learners: &[u64]) -> MembershipView {
        MembershipView {
            log_index: 7,
            voters: voters.iter().copied().collect(),
            nodes: voters.iter().chain(learners).copied().collect(),
        }
    }

    fn log_id(term: u64, node: u64, index: u64) -> LogId {
        openraft::LogId::new(openraft::CommittedLeaderId::new(term, node), index)
    }

    #[test]
    fn a_vote_at_the_largest_term_is_refused_before_raft_sees_it() {
        // shared/cases 01: term u64::MAX from node 99, last log index 2^63.
        let req = VoteRequest::new(Vote::new(u64::MAX, 99), Some(log_id(u64::MAX, 99, 1 << 63)));
        let err = check_vote_request(&req, 99, &view(&[1, 2, 3], &[])).unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument);
        assert!(err.message().contains("out of range"), "{}", err.message());
        // Even from a member, and even on a node with no membership yet.
        let req = VoteRequest::new(Vote::new(u64::MAX, 1), None);
        assert!(check_vote_request(&req, 1, &view(&[1, 2, 3], &[])).is_err());
        assert!(check_vote_request(&req, 1, &MembershipView::default()).is_err());
        let req = VoteRequest::new(Vote::new(5, 1), Some(log_id(5, 1, u64::MAX)));
        assert!(check_vote_request(&req, 1, &view(&[1, 2, 3], &[])).is_err());
    }

    #[test]
    fn votes_from_outside_the_voters_are_refused_with_the_membership_index() {
        let m = view(&[1, 2, 3], &[4]);
        for (from, candidate) in [(99, 99), (4, 4), (1, 2)] {
            let req = VoteRequest::new(Vote::new(1_000_000_000_000, candidate), None);
            let err = check_vote_request(&req, from, &m).unwrap_err();
            assert_ne!(err.code(), tonic::Code::Ok);
            if from == candidate {
                assert_eq!(err.code(), tonic::Code::PermissionDenied, "{}", err.message());
                assert_eq!(refusal_membership_index(&err), Some(7));
            }
        }
        let req = VoteRequest::new(Vote::new(9, 2), Some(log_id(8, 1, 40)));
        check_vote_request(&req, 2, &m).unwrap();
        // A fresh node (no membership) takes part in initialization.
        check_vote_request(&req, 2, &MembershipView::default()).unwrap();
    }

    fn append(vote: Vote, prev: Option<LogId>, entries: &[LogId]) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote,
            prev_log_id: prev,
            entries: entries
                .iter()
                .map(|l| openraft::Entry {
                    log_id: *l,
                    payload: openraft::EntryPayload::Blank,
                })
                .collect(),
            leader_commit: None,
        }
    }

    #[test]
    fn append_entries_must_come_from_a_voter_and_be_well_formed() {
        let m = view(&[1, 2, 3], &[]);
        let ok = append(
            Vote::new_committed(4, 1),
            Some(log_id(3, 1, 10)),
            &[log_id(3, 1, 11), log_id(4, 1, 12)],
        );
        check_append_entries(&ok, 1, &m).unwrap();
        // Forged leader id.
        let forged = append(Vote::new_committed(40, 99), None, &[log_id(40, 99, 0)]);
        assert_eq!(
            check_append_entries(&forged, 99, &m).unwrap_err().code(),
            tonic::Code::PermissionDenied
        );
        // Sender speaking for another node.
        assert!(check_append_entries(&ok, 2, &m).is_err());
        // A gap, a term above the leader's, terms going down.
        // openraft's first entry has index 0.
        let gap = append(Vote::new_committed(4, 1), None, &[log_id(4, 1, 1)]);
        assert_eq!(
            check_append_entries(&gap, 1, &m).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        for entries in [
            vec![log_id(3, 1, 12)],
            vec![log_id(5, 1, 11)],
            vec![log_id(4, 1, 11), log_id(3, 1, 12)],
            vec![log_id(2, 1, 11)],
        ] {
            let bad = append(Vote::new_committed(4, 1), Some(log_id(3, 1, 10)), &entries);
            assert_eq!(
                check_append_entries(&bad, 1, &m).unwrap_err().code(),
                tonic::Code::InvalidArgument
            );
        }
    }
}
