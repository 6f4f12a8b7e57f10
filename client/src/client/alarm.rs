//! `Cluster.AlarmList` / `Cluster.AlarmDisarm`: each node's NOSPACE alarm (`ftkvctl alarm`).

use ftkv_proto::v1 as pb;

use super::call::{CallKind, Target};
use super::{normalize_endpoint, Client};
use crate::error::Result;

/// One raised alarm of a node.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Alarm {
    /// `"NOSPACE"`.
    pub alarm: String,
    /// Node that raised it.
    pub node_id: u64,
    /// The setting crossed: `space.quota_bytes`, `space.disk_reserve_bytes` or `disk`.
    pub limit: String,
    /// What the node said.
    pub message: String,
    /// When it was raised, seconds since the Unix epoch.
    pub raised_at_unix_s: u64,
}

/// One node's alarms and space figures.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeAlarms {
    /// Endpoint that was asked.
    pub endpoint: String,
    /// The node's id.
    pub node_id: u64,
    /// Raised alarms (empty: none).
    pub alarms: Vec<Alarm>,
    /// Bytes the node's data dir holds.
    pub data_dir_bytes: u64,
    /// The node's `space.quota_bytes` (0: none).
    pub quota_bytes: u64,
    /// Free bytes of the disk under the data dir.
    pub disk_free_bytes: u64,
    /// The node's `space.disk_reserve_bytes`.
    pub disk_reserve_bytes: u64,
}

impl NodeAlarms {
    fn from_proto(endpoint: &str, r: pb::AlarmResponse) -> Self {
        NodeAlarms {
            endpoint: endpoint.to_string(),
            node_id: r.node_id,
            alarms: r
                .alarms
                .into_iter()
                .map(|a| Alarm {
                    alarm: a.alarm,
                    node_id: a.node_id,
                    limit: a.limit,
                    message: a.message,
                    raised_at_unix_s: a.raised_at_unix_s,
                })
                .collect(),
            data_dir_bytes: r.data_dir_bytes,
            quota_bytes: r.quota_bytes,
            disk_free_bytes: r.disk_free_bytes,
            disk_reserve_bytes: r.disk_reserve_bytes,
        }
    }
}

impl Client {
    /// The alarms of exactly this endpoint (no redirect).
    pub async fn alarm_list(&self, endpoint: &str) -> Result<NodeAlarms> {
        self.alarm_call(endpoint, false).await
    }

    /// Disarms the alarm of exactly this endpoint. The node measures again first and refuses
    /// (an error naming the quota, [`crate::Error::NoSpace`]) while the cause is still there.
    pub async fn alarm_disarm(&self, endpoint: &str) -> Result<NodeAlarms> {
        self.alarm_call(endpoint, true).await
    }

    async fn alarm_call(&self, endpoint: &str, disarm: bool) -> Result<NodeAlarms> {
        let endpoint = normalize_endpoint(endpoint)?;
        let inner = &self.inner;
        let resp = inner
            // Idempotent (disarm measures again), so classified like a read: an error stays itself.
            .call(CallKind::Read, Target::Fixed(endpoint.clone()), |ch| {
                let mut c = inner.cluster(ch);
                async move {
                    if disarm {
                        c.alarm_disarm(pb::AlarmDisarmRequest {}).await
                    } else {
                        c.alarm_list(pb::AlarmListRequest {}).await
                    }
                    .map(|r| r.into_inner())
                }
            })
            .await?;
        Ok(NodeAlarms::from_proto(&endpoint, resp))
    }

    /// Every node's client endpoint: the membership's (when `Members` answers), then every
    /// endpoint this client knows, each once.
    pub async fn all_endpoints(&self) -> Vec<String> {
        let mut endpoints: Vec<String> = Vec::new();
        if let Ok(m) = self.members().await {
            for member in m.members {
                if let Ok(ep) = normalize_endpoint(&member.client_endpoint) {
                    if !endpoints.contains(&ep) {
                        endpoints.push(ep);
                    }
                }
            }
        }
        for ep in self.endpoints() {
            if !endpoints.contains(&ep) {
                endpoints.push(ep);
            }
        }
        endpoints
    }
}
