//! Membership changes (etcd's `member add --learner`, `member promote`, `member remove`) and
//! the background watch that keeps membership healthy.
//!
//! Rules, checked before anything is proposed:
//! - **AddLearner**: both addresses are `host:port` (optionally `http://` or `https://`) with a
//!   port in 1..=65535; an id that is already a member keeps its addresses unless the request
//!   asks to update them; if the node answers `GetNodeInfo` at its peer address it must report
//!   the same id (a node that is not up yet may still be added, as etcd allows).
//! - **Promote**: only a learner whose replication has matched the leader's log to within
//!   [`PROMOTE_MAX_LAG_ENTRIES`] entries (etcd refuses to promote a learner that is not in sync):
//!   promoting one that never replicated would make a real node's loss a loss of quorum.
//! - A joint configuration left by a leader that failed between the two steps of a change is
//!   rolled forward to its second half by the next leader (the watch below), and every change
//!   made through this module first finishes one.
//!
//! The watch (every [`MEMBERSHIP_CHECK_INTERVAL_MS`]) also applies `removal`: a node its peers
//! refuse as removed stops campaigning.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

use openraft::error::{ClientWriteError, RaftError};
use openraft::ChangeMembers;

use super::peer_guard::MembershipView;
use super::{errors, network, ClusterError, ClusterNode, Inner, MemberInfo, NodeAddr};

/// Most entries a learner may lag behind the leader's last log index and still be promoted.
pub(crate) const PROMOTE_MAX_LAG_ENTRIES: u64 = 1_000;
/// How often the membership watch runs.
const MEMBERSHIP_CHECK_INTERVAL_MS: u64 = 500;
/// Consecutive checks a leader sees the same joint configuration before it rolls it forward.
const JOINT_ROLL_FORWARD_CHECKS: u32 = 4;

/// Checks one advertised address: `host:port`, optionally with an `http://` or `https://` scheme.
pub(crate) fn validate_address(what: &str, addr: &str) -> Result<(), ClusterError> {
    let bad =
        |why: &str| ClusterError::Invalid(format!("{what} {addr:?} is not a valid host:port address: {why}"));
    let rest = addr
        .strip_prefix("http://")
        .or_else(|| addr.strip_prefix("https://"))
        .unwrap_or(addr);
    let (host, port) = rest.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    match port.parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return Err(bad("the port must be a number in 1..=65535")),
    }
    let host_ok = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        v6.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && host.len() <= 253
            && host.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            })
    };
    if !host_ok {
        return Err(bad("bad host name"));
    }
    Ok(())
}

fn view(inner: &Inner) -> MembershipView {
    MembershipView::of(&inner.raft.metrics().borrow().membership_config)
}

impl ClusterNode {
    /// Current membership (voters and learners, by id).
    pub fn members(&self) -> Vec<MemberInfo> {
        let metrics = self.inner.raft.metrics();
        let m = metrics.borrow();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        membership
            .nodes()
            .map(|(id, addr)| MemberInfo {
                id: *id,
                addr: addr.clone(),
                is_voter: voters.contains(id),
            })
            .collect()
    }

    /// Adds a learner (returns once the membership entry is committed; the learner catches up
    /// in the background). `update` allows changing the addresses of an existing member.
    ///
    /// Errors: `Invalid` for id 0, a malformed address, an existing member with other addresses
    /// (without `update`), or a node at that address that reports another id.
    pub async fn add_learner(&self, id: u64, addr: NodeAddr, update: bool) -> Result<(), ClusterError> {
        if id == 0 {
            return Err(ClusterError::Invalid("node id 0 is reserved".into()));
        }
        validate_address("client address", &addr.client)?;
        validate_address("peer address", &addr.peer)?;
        if let Some(existing) = self.members().into_iter().find(|m| m.id == id) {
            if existing.addr == addr {
                return Ok(());
            }
            if !update {
                return Err(ClusterError::Invalid(format!(
                    "node {id} is already a member with client address {} and peer address {}; \
                     pass --update to change its addresses",
                    existing.addr.client, existing.addr.peer
                )));
            }
        }
        let info = network::get_node_info(
            &self.inner.channels,
            &addr.peer,
            self.inner.config.peer_max_message_bytes,
            std::time::Duration::from_millis(1_000),
        )
        .await;
        match info {
            Ok(info) if info.id != id => {
                return Err(ClusterError::Invalid(format!(
                    "the node at {} is node {}, not node {id}",
                    addr.peer, info.id
                )))
            }
            Ok(_) => {}
            Err(e) => {
                tracing::info!(id, peer = %addr.peer, error = %e, "adding a learner that does not answer yet")
            }
        }
        self.finish_joint().await?;
        let res = if update {
            let nodes: BTreeMap<u64, NodeAddr> = [(id, addr)].into_iter().collect();
            self.inner
                .raft
                .change_membership(ChangeMembers::SetNodes(nodes), true)
                .await
                .map(|_| ())
        } else {
            self.inner.raft.add_learner(id, addr, false).await.map(|_| ())
        };
        self.membership_result(res)
    }

    /// Promotes a learner to voter once it has caught up with the leader.
    ///
    /// Errors: `Invalid` when `id` is not a member, or has not replicated to within
    /// [`PROMOTE_MAX_LAG_ENTRIES`] of the leader; `NotLeader` on a follower.
    pub async fn promote(&self, id: u64) -> Result<(), ClusterError> {
        let Some(member) = self.members().into_iter().find(|m| m.id == id) else {
            return Err(ClusterError::Invalid(format!(
                "node {id} is not a member; add it as a learner first"
            )));
        };
        if member.is_voter {
            return Ok(());
        }
        let progress = {
            let metrics = self.inner.raft.metrics();
            let m = metrics.borrow();
            m.replication
                .as_ref()
                .map(|r| (r.get(&id).copied().flatten(), m.last_log_index.unwrap_or(0)))
        };
        let Some((matched, last)) = progress else {
            return Err(errors::not_leader(&self.inner.raft, None, None));
        };
        match matched {
            None => {
                return Err(ClusterError::Invalid(format!(
                "node {id} has not replicated anything yet; start it and let it catch up before promoting it"
            )))
            }
            Some(m) if m.index.saturating_add(PROMOTE_MAX_LAG_ENTRIES) < last => {
                return Err(ClusterError::Invalid(format!(
                    "node {id} is still catching up: it has log index {} of the leader's {last} \
                     (at most {PROMOTE_MAX_LAG_ENTRIES} behind may be promoted); retry later",
                    m.index
                )))
            }
            Some(_) => {}
        }
        self.finish_joint().await?;
        let ids: BTreeSet<u64> = [id].into_iter().collect();
        let res = self
            .inner
            .raft
            .change_membership(ChangeMembers::AddVoterIds(ids), false)
            .await;
        self.membership_result(res)
    }

    /// Removes a voter or learner.
    pub async fn remove(&self, id: u64) -> Result<(), ClusterError> {
        let Some(member) = self.members().into_iter().find(|m| m.id == id) else {
            return Err(ClusterError::Invalid(format!("node {id} is not a member")));
        };
        self.finish_joint().await?;
        let ids: BTreeSet<u64> = [id].into_iter().collect();
        let change = if member.is_voter {
            ChangeMembers::RemoveVoters(ids)
        } else {
            ChangeMembers::RemoveNodes(ids)
        };
        let res = self.inner.raft.change_membership(change, false).await;
        self.membership_result(res)
    }

    /// Rolls a joint configuration forward to its second half (a no-op when uniform).
    async fn finish_joint(&self) -> Result<(), ClusterError> {
        let Some(goal) = joint_goal(&self.inner) else {
            return Ok(());
        };
        tracing::info!(voters = ?goal, "finishing a joint configuration before the next change");
        let res = self
            .inner
            .raft
            .change_membership(ChangeMembers::ReplaceAllVoters(goal), false)
            .await;
        self.membership_result(res)
    }

    fn membership_result<T>(
        &self,
        res: Result<T, RaftError<u64, ClientWriteError<u64, NodeAddr>>>,
    ) -> Result<(), ClusterError> {
        match res {
            Ok(_) => Ok(()),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(errors::not_leader(&self.inner.raft, f.leader_id, f.leader_node))
            }
            Err(RaftError::APIError(ClientWriteError::ChangeMembershipError(e))) => {
                Err(ClusterError::Invalid(e.to_string()))
            }
            Err(RaftError::Fatal(f)) => Err(errors::fatal_to_error(f)),
        }
    }
}

/// The voters of the second half of a joint configuration (None when uniform).
fn joint_goal(inner: &Inner) -> Option<BTreeSet<u64>> {
    let metrics = inner.raft.metrics();
    let m = metrics.borrow();
    let configs = m.membership_config.membership().get_joint_config();
    if configs.len() < 2 {
        return None;
    }
    configs.last().cloned()
}

/// The membership watch: removal (see `removal`) and rolling joint configurations forward on
/// the leader. Ends with the node.
pub(crate) async fn watch(inner: std::sync::Weak<Inner>) {
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(MEMBERSHIP_CHECK_INTERVAL_MS));
    let mut joint_seen: (u64, u32) = (0, 0);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let own = view(&inner);
        check_removed(&inner, &own);
        let is_leader = inner.raft.metrics().borrow().current_leader == Some(inner.config.node_id);
        match joint_goal(&inner) {
            Some(goal) if is_leader => {
                joint_seen = if joint_seen.0 == own.log_index {
                    (own.log_index, joint_seen.1 + 1)
                } else {
                    (own.log_index, 1)
                };
                if joint_seen.1 >= JOINT_ROLL_FORWARD_CHECKS {
                    joint_seen.1 = 0;
                    tracing::warn!(voters = ?goal, membership_index = own.log_index, "rolling a stuck joint configuration forward");
                    let raft = inner.raft.clone();
                    tokio::spawn(async move {
                        if let Err(e) = raft
                            .change_membership(ChangeMembers::ReplaceAllVoters(goal), false)
                            .await
                        {
                            tracing::warn!(error = %e, "rolling the joint configuration forward failed; will retry");
                        }
                    });
                }
            }
            _ => joint_seen = (0, 0),
        }
    }
}

fn check_removed(inner: &Inner, own: &MembershipView) {
    let removed = inner.refusals.is_removed(inner.config.node_id, own);
    let was = inner.removed.swap(removed, Ordering::AcqRel);
    if removed == was {
        return;
    }
    if removed {
        tracing::warn!(
            node_id = inner.config.node_id,
            membership_index = own.log_index,
            "peers refuse this node as removed from the cluster: no more elections, client requests refused"
        );
    } else {
        tracing::info!(
            node_id = inner.config.node_id,
            "peers accept this node again: elections resume"
        );
    }
    inner.raft.runtime_config().elect(!removed);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_host_and_port() {
        for good in [
            "node1:7380",
            "10.0.0.1:1",
            "http://a.b-c.d:65535",
            "https://[::1]:7379",
            "ftkv-0.ftkv:7380",
        ] {
            validate_address("peer address", good).unwrap();
        }
        for bad in [
            "not a url at all",
            "",
            "node1",
            "node1:",
            "node1:0",
            "node1:65536",
            ":7380",
            "a b:1",
            "[zz]:1",
            "a..b:1",
        ] {
            let err = validate_address("peer address", bad).unwrap_err();
            assert!(err.to_string().contains("not a valid host:port"), "{bad}: {err}");
        }
    }
}
