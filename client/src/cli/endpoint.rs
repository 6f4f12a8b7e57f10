//! `ftkvctl endpoint status` and `ftkvctl endpoint health` (etcdctl's commands of those names).
//!
//! Health: a node is healthy when its `Cluster.Status` answers within the command's time budget,
//! its role is `leader`, `follower` or `learner`, and it knows a leader (a node that lost its
//! quorum campaigns and knows none; a removed one reports the role `removed`). `endpoint
//! health` exits 1 when any endpoint it asked is unhealthy, so it serves as a container health
//! check (`ftkvctl --endpoints 127.0.0.1:7379 endpoint health`: no shell needed).

use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::{json, Value};

use super::output::{self, Format};
use super::{emit, Cli};
use crate::{Client, Error, NodeStatus};

/// Roles of a node that serves (reads through the leader, or as the leader).
const SERVING_ROLES: [&str; 3] = ["leader", "follower", "learner"];

/// One endpoint asked.
struct Probe {
    endpoint: String,
    took: Duration,
    result: Result<NodeStatus, Error>,
}

/// Endpoints to ask: with `cluster`, every member's client endpoint (when the membership can be
/// read) then the `--endpoints` not among them; else the `--endpoints`.
async fn targets(client: &Client, cluster: bool) -> Vec<String> {
    let mut endpoints: Vec<String> = Vec::new();
    if cluster {
        if let Ok(m) = client.members().await {
            endpoints.extend(m.members.into_iter().map(|member| member.client_endpoint));
        }
    }
    for ep in client.endpoints() {
        if !endpoints.contains(&ep) {
            endpoints.push(ep);
        }
    }
    endpoints
}

/// Asks every target concurrently. With `cluster`, a node that answered through two endpoints
/// (a member's advertised name and an `--endpoints` address) is listed once, under the first.
async fn probe(client: &Client, cluster: bool, digest: bool) -> Vec<Probe> {
    let endpoints = targets(client, cluster).await;
    let asks = endpoints.iter().map(|ep| async move {
        let started = Instant::now();
        let result = client.status_with(ep, digest).await;
        Probe {
            endpoint: ep.clone(),
            took: started.elapsed(),
            result,
        }
    });
    let mut probes = futures::future::join_all(asks).await;
    if cluster {
        let mut seen = Vec::new();
        probes.retain(|p| match &p.result {
            Ok(s) if seen.contains(&s.node_id) => false,
            Ok(s) => {
                seen.push(s.node_id);
                true
            }
            Err(_) => true,
        });
    }
    probes
}

/// `endpoint status`: unreachable nodes are reported on stderr and left out; exit 1 only when
/// none answered.
pub(super) async fn status(client: &Client, cli: &Cli, cluster: bool, digest: bool) -> anyhow::Result<()> {
    let mut ok = Vec::new();
    let mut failed = Vec::new();
    for p in probe(client, cluster, digest).await {
        match p.result {
            Ok(s) => ok.push(s),
            Err(e) => failed.push(e),
        }
    }
    for e in &failed {
        output::stderr_line(&format!("warning: {e}"));
    }
    if ok.is_empty() {
        let detail = failed.first().map(|e| e.to_string()).unwrap_or_default();
        bail!("no endpoint answered ({detail})");
    }
    emit(output::statuses(cli.write_out, &ok).as_bytes())?;
    Ok(())
}

/// Why a node that answered is not healthy, if it is not.
fn unhealthy_reason(s: &NodeStatus) -> Option<String> {
    let serving = SERVING_ROLES.contains(&s.role.as_str());
    let role = || Some(format!("node {} has the role {:?}", s.node_id, s.role));
    if !serving && s.role != "candidate" {
        return role();
    }
    if s.leader_id == 0 {
        return Some(format!("node {} knows no leader (role {})", s.node_id, s.role));
    }
    if !serving {
        return role();
    }
    None
}

/// One line of `endpoint health`'s result.
struct Health {
    endpoint: String,
    healthy: bool,
    took: Duration,
    /// Node id, role and leader id when the node answered.
    status: Option<(u64, String, u64)>,
    error: Option<String>,
}

impl Health {
    fn of(p: Probe) -> Self {
        let (status, error) = match &p.result {
            Ok(s) => (
                Some((s.node_id, s.role.clone(), s.leader_id)),
                unhealthy_reason(s),
            ),
            Err(e) => (None, Some(e.to_string())),
        };
        Health {
            endpoint: p.endpoint,
            healthy: error.is_none(),
            took: p.took,
            status,
            error,
        }
    }

    fn took_ms(&self) -> f64 {
        (self.took.as_secs_f64() * 1e6).round() / 1e3
    }

    fn json(&self) -> Value {
        let mut v = json!({
            "endpoint": self.endpoint,
            "health": self.healthy,
            "took_ms": self.took_ms(),
        });
        if let Some((id, role, leader)) = &self.status {
            v["id"] = json!(id);
            v["role"] = json!(role);
            v["leader_id"] = json!(leader);
        }
        if let Some(e) = &self.error {
            v["error"] = json!(e);
        }
        v
    }

    fn line(&self) -> String {
        match (&self.error, &self.status) {
            (None, Some((id, role, leader))) => format!(
                "{} is healthy: node {id}, {role}, leader {leader}, took {:.3}ms",
                self.endpoint,
                self.took_ms()
            ),
            (Some(e), _) => format!("{} is unhealthy: {e}", self.endpoint),
            (None, None) => format!("{} is unhealthy", self.endpoint),
        }
    }
}

/// The health results in the chosen format.
fn health_output(format: Format, list: &[Health]) -> String {
    match format {
        Format::Json => Value::Array(list.iter().map(Health::json).collect()).to_string(),
        Format::Simple => list.iter().map(Health::line).collect::<Vec<_>>().join("\n"),
        Format::Table => {
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|h| {
                    vec![
                        h.endpoint.clone(),
                        h.healthy.to_string(),
                        format!("{:.3}ms", h.took_ms()),
                        h.error.clone().unwrap_or_default(),
                    ]
                })
                .collect();
            output::table(&["ENDPOINT", "HEALTH", "TOOK", "ERROR"], &rows)
        }
    }
}

/// `endpoint health`: one result per endpoint on stdout; exit 1 when any is unhealthy.
pub(super) async fn health(client: &Client, cli: &Cli, cluster: bool) -> anyhow::Result<()> {
    let list: Vec<Health> = probe(client, cluster, false)
        .await
        .into_iter()
        .map(Health::of)
        .collect();
    emit(health_output(cli.write_out, &list).as_bytes())?;
    let unhealthy = list.iter().filter(|h| !h.healthy).count();
    if unhealthy > 0 {
        bail!("{unhealthy} of {} endpoints unhealthy", list.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(role: &str, leader_id: u64) -> NodeStatus {
        NodeStatus {
            node_id: 2,
            role: role.into(),
            leader_id,
            ..Default::default()
        }
    }

    #[test]
    fn healthy_means_serving_and_knowing_a_leader() {
        assert_eq!(unhealthy_reason(&status("follower", 1)), None);
        assert_eq!(unhealthy_reason(&status("leader", 2)), None);
        assert_eq!(unhealthy_reason(&status("learner", 1)), None);
        let reason = unhealthy_reason(&status("candidate", 0)).unwrap_or_default();
        assert!(reason.contains("knows no leader (role candidate)"), "{reason}");
        let reason = unhealthy_reason(&status("follower", 0)).unwrap_or_default();
        assert!(reason.contains("knows no leader"), "{reason}");
        let reason = unhealthy_reason(&status("candidate", 3)).unwrap_or_default();
        assert!(reason.contains("candidate"), "{reason}");
        let reason = unhealthy_reason(&status("removed", 0)).unwrap_or_default();
        assert!(reason.contains("role \"removed\""), "{reason}");
        let reason = unhealthy_reason(&status("shutdown", 1)).unwrap_or_default();
        assert!(reason.contains("shutdown"), "{reason}");
    }

    #[test]
    fn health_json_carries_the_fields_scripts_read() {
        let h = Health::of(Probe {
            endpoint: "h:1".into(),
            took: Duration::from_micros(1500),
            result: Ok(status("follower", 1)),
        });
        let v = h.json();
        assert_eq!(v["endpoint"], "h:1");
        assert_eq!(v["health"], true);
        assert_eq!(v["took_ms"], 1.5);
        assert_eq!(v["id"], 2);
        assert_eq!(v["leader_id"], 1);
        assert!(v.get("error").is_none(), "{v}");
        assert!(
            h.line().starts_with("h:1 is healthy: node 2, follower, leader 1"),
            "{}",
            h.line()
        );
    }
}
