//! `ftkv.v1.Cluster`: status and membership.

use ftkv_proto::v1 as pb;
use ftkv_proto::v1::cluster_server::Cluster;
use tonic::{Request, Response, Status};

use super::errors;
use crate::cluster::{ClusterNode, MemberInfo, NodeAddr};

/// The Cluster service of one node.
#[derive(Clone)]
pub struct ClusterService {
    cluster: ClusterNode,
    auth: std::sync::Arc<super::auth::AuthGuard>,
}

impl ClusterService {
    /// Serves `cluster`; membership changes, alarm disarm and a status with the state digest
    /// (a full scan) need the role root while auth is enabled (status, members and the alarm
    /// list stay open: clients find the leader with them).
    pub fn new(cluster: ClusterNode, auth: std::sync::Arc<super::auth::AuthGuard>) -> Self {
        Self { cluster, auth }
    }

    fn members_response(&self) -> pb::MembersResponse {
        let members = self.cluster.members().into_iter().map(member).collect();
        pb::MembersResponse {
            members,
            leader_id: self.cluster.status().leader_id.unwrap_or(0),
        }
    }
}

fn alarm(a: crate::space::Alarm) -> pb::Alarm {
    pb::Alarm {
        alarm: crate::space::NOSPACE.to_string(),
        node_id: a.node_id,
        limit: a.limit.to_string(),
        message: a.message,
        raised_at_unix_s: a.raised_at_unix_s,
    }
}

impl ClusterService {
    fn alarm_response(&self) -> pb::AlarmResponse {
        let (options, usage) = self.cluster.space_usage();
        pb::AlarmResponse {
            node_id: self.cluster.status().node_id,
            alarms: self.cluster.alarm().into_iter().map(alarm).collect(),
            data_dir_bytes: usage.data_dir_bytes,
            quota_bytes: options.quota_bytes,
            disk_free_bytes: usage.disk_free_bytes,
            disk_reserve_bytes: options.disk_reserve_bytes,
        }
    }
}

fn member(m: MemberInfo) -> pb::Member {
    pb::Member {
        id: m.id,
        client_endpoint: m.addr.client,
        peer_endpoint: m.addr.peer,
        is_voter: m.is_voter,
    }
}

/// xxh3-64 over every (key, value) in key order, each framed by its length (u32 LE), so that
/// replicas can be compared. Reads the engine in pages.
pub fn state_digest(engine: &dyn ftkv_engine::Engine) -> ftkv_engine::Result<u64> {
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut start: Vec<u8> = Vec::new();
    loop {
        let page = engine.scan(&start, None, 10_000)?;
        let Some((last, _)) = page.last() else { break };
        let mut next = last.clone();
        next.push(0);
        for (k, v) in &page {
            hasher.update(&(k.len() as u32).to_le_bytes());
            hasher.update(k);
            hasher.update(&(v.len() as u32).to_le_bytes());
            hasher.update(v);
        }
        if page.len() < 10_000 {
            break;
        }
        start = next;
    }
    Ok(hasher.digest())
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn status(
        &self,
        request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        if request.get_ref().with_digest {
            // A digest scans every pair: with auth on, an administrator's call.
            self.auth
                .require_root(&request, "endpoint status --digest")
                .await?;
        }
        let req = request.into_inner();
        let engine = self.cluster.engine();
        let (digest, st) = if req.with_digest {
            // Read the status and the digest without an apply in between is not possible without
            // stopping the state machine; callers compare digests once writes have stopped.
            let st = self.cluster.status();
            let e = engine.clone();
            let digest = tokio::task::spawn_blocking(move || state_digest(e.as_ref()))
                .await
                .map_err(|e| Status::internal(format!("digest task failed: {e}")))?
                .map_err(|e| errors::engine(&e))?;
            let after = self.cluster.status();
            if after.applied_index != st.applied_index {
                return Err(errors::status(
                    tonic::Code::Unavailable,
                    pb::ErrorInfo {
                        kind: pb::error_info::Kind::Unavailable as i32,
                        message: "state changed while computing the digest; retry when writes stop".into(),
                        ..Default::default()
                    },
                ));
            }
            (digest, st)
        } else {
            (0, self.cluster.status())
        };
        let size = engine.size_on_disk_bytes().unwrap_or(0);
        let me = self.cluster.members().into_iter().find(|m| m.id == st.node_id);
        Ok(Response::new(pb::StatusResponse {
            node_id: st.node_id,
            leader_id: st.leader_id.unwrap_or(0),
            leader_endpoint: st.leader_client_addr.clone().unwrap_or_default(),
            term: st.term,
            last_log_index: st.last_log_index,
            applied_index: st.applied_index,
            commit_index: st.commit_index,
            engine: engine.kind().as_str().to_string(),
            data_size_bytes: size,
            is_leader: st.leader_id == Some(st.node_id),
            role: st.role.clone(),
            digest,
            client_endpoint: me.map(|m| m.addr.client).unwrap_or_default(),
            ops_per_entry: st.ops_per_entry,
            version: env!("CARGO_PKG_VERSION").to_string(),
            alarms: self.cluster.alarm().into_iter().map(alarm).collect(),
            cluster_id: self.cluster.cluster_id(),
        }))
    }

    async fn alarm_list(
        &self,
        _request: Request<pb::AlarmListRequest>,
    ) -> Result<Response<pb::AlarmResponse>, Status> {
        Ok(Response::new(self.alarm_response()))
    }

    async fn alarm_disarm(
        &self,
        request: Request<pb::AlarmDisarmRequest>,
    ) -> Result<Response<pb::AlarmResponse>, Status> {
        self.auth.require_root(&request, "alarm disarm").await?;
        match self.cluster.disarm_alarm().await {
            Ok(()) => Ok(Response::new(self.alarm_response())),
            Err(crate::cluster::ClusterError::NoSpace(a)) => {
                let message = format!("alarm not disarmed: {}", a.message);
                Err(errors::no_space(tonic::Code::FailedPrecondition, &a, message))
            }
            Err(e) => Err(errors::cluster(e)),
        }
    }

    async fn members(
        &self,
        _request: Request<pb::MembersRequest>,
    ) -> Result<Response<pb::MembersResponse>, Status> {
        Ok(Response::new(self.members_response()))
    }

    async fn add_learner(
        &self,
        request: Request<pb::AddLearnerRequest>,
    ) -> Result<Response<pb::MembersResponse>, Status> {
        self.auth.require_root(&request, "member add-learner").await?;
        let req = request.into_inner();
        if req.id == 0 || req.client_endpoint.is_empty() || req.peer_endpoint.is_empty() {
            return Err(errors::invalid(
                "add-learner needs an id >= 1, a client endpoint and a peer endpoint",
            ));
        }
        let addr = NodeAddr {
            client: req.client_endpoint,
            peer: req.peer_endpoint,
        };
        self.cluster
            .add_learner(req.id, addr, req.update)
            .await
            .map_err(errors::cluster)?;
        Ok(Response::new(self.members_response()))
    }

    async fn promote(
        &self,
        request: Request<pb::PromoteRequest>,
    ) -> Result<Response<pb::MembersResponse>, Status> {
        self.auth.require_root(&request, "member promote").await?;
        self.cluster
            .promote(request.into_inner().id)
            .await
            .map_err(errors::cluster)?;
        Ok(Response::new(self.members_response()))
    }

    async fn remove(
        &self,
        request: Request<pb::RemoveRequest>,
    ) -> Result<Response<pb::MembersResponse>, Status> {
        self.auth.require_root(&request, "member remove").await?;
        self.cluster
            .remove(request.into_inner().id)
            .await
            .map_err(errors::cluster)?;
        Ok(Response::new(self.members_response()))
    }
}
