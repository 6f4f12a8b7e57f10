//! The etcd calls the read and failover workloads make beyond [`crate::etcd::EtcdClient`]'s
//! put and get: point reads with `serializable` set or not, range scans (`range_end` and
//! `limit`), and `Maintenance.Status` of one member (its id, the leader's id, its commit and
//! applied Raft indexes).
//!
//! Reads go round-robin over the members, as the put client's requests do: a linearizable
//! Range is answered by any member after a ReadIndex round with the leader, a serializable one
//! from the member's own state.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tonic::transport::Channel;

use crate::etcd::pb;

/// Reads and status over every member.
#[derive(Clone)]
pub struct EtcdOps {
    kv: Arc<Vec<pb::kv_client::KvClient<Channel>>>,
    maintenance: Arc<Vec<pb::maintenance_client::MaintenanceClient<Channel>>>,
    next: Arc<AtomicUsize>,
}

/// One member's `Maintenance.Status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberStatus {
    /// The answering member's id.
    pub member_id: u64,
    /// The leader's member id as it sees it (0: none).
    pub leader_id: u64,
    /// Its Raft commit index (`raftIndex`).
    pub commit_index: u64,
    /// Its applied index (`raftAppliedIndex`).
    pub applied_index: u64,
}

impl MemberStatus {
    /// Whether the member reports itself leader.
    pub fn is_leader(&self) -> bool {
        self.member_id != 0 && self.member_id == self.leader_id
    }
}

impl EtcdOps {
    /// Connects lazily to `endpoints` (`host:port`), in member order.
    pub fn connect(endpoints: &[String]) -> anyhow::Result<Self> {
        let mut kv = Vec::new();
        let mut maintenance = Vec::new();
        for e in endpoints {
            let ch = tonic::transport::Endpoint::from_shared(format!("http://{e}"))?
                .timeout(Duration::from_secs(10))
                .connect_timeout(Duration::from_secs(2))
                .connect_lazy();
            kv.push(pb::kv_client::KvClient::new(ch.clone()));
            maintenance.push(pb::maintenance_client::MaintenanceClient::new(ch));
        }
        anyhow::ensure!(!kv.is_empty(), "no etcd endpoints");
        Ok(Self {
            kv: Arc::new(kv),
            maintenance: Arc::new(maintenance),
            next: Arc::new(AtomicUsize::new(0)),
        })
    }

    fn next_kv(&self) -> pb::kv_client::KvClient<Channel> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.kv.len();
        self.kv[i].clone()
    }

    /// One point read; `serializable` answers from the member's own state.
    pub async fn get(&self, key: Vec<u8>, serializable: bool) -> anyhow::Result<Option<Vec<u8>>> {
        let r = self
            .next_kv()
            .range(pb::RangeRequest {
                key,
                serializable,
                ..Default::default()
            })
            .await?
            .into_inner();
        Ok(r.kvs.into_iter().next().map(|kv| kv.value))
    }

    /// `[start, end)`, at most `limit` pairs, linearizable.
    pub async fn scan(
        &self,
        start: Vec<u8>,
        end: Vec<u8>,
        limit: i64,
    ) -> anyhow::Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let r = self
            .next_kv()
            .range(pb::RangeRequest {
                key: start,
                range_end: end,
                limit,
                ..Default::default()
            })
            .await?
            .into_inner();
        Ok(r.kvs.into_iter().map(|kv| (kv.key, kv.value)).collect())
    }

    /// `Maintenance.Status` of member `index` (in endpoint order).
    pub async fn status(&self, index: usize) -> anyhow::Result<MemberStatus> {
        let mut c = self
            .maintenance
            .get(index)
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no etcd member {index}"))?;
        let r = c.status(pb::StatusRequest {}).await?.into_inner();
        Ok(MemberStatus {
            member_id: r.header.map_or(0, |h| h.member_id),
            leader_id: r.leader,
            commit_index: r.raft_index,
            applied_index: r.raft_applied_index,
        })
    }

    /// Members (endpoint order).
    pub fn members(&self) -> usize {
        self.maintenance.len()
    }
}
