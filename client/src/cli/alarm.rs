//! `ftkvctl alarm list | disarm` (etcdctl's `alarm`): every node's NOSPACE alarm.
//!
//! Both ask every node (the membership's endpoints and `--endpoints`): alarms are per node.
//! `disarm` asks each node to clear its alarm; a node whose data dir is still over its quota
//! (or whose disk is still under its reserve) refuses, and the command then exits 1 naming it.

use anyhow::bail;
use serde_json::json;

use super::output::{self, Format};
use crate::{Client, Error, NodeAlarms};

/// `alarm ...`.
#[derive(Debug, clap::Subcommand)]
pub enum AlarmCommand {
    /// List the raised alarms of every node (nothing printed in simple mode when none is).
    List,
    /// Clear every node's alarm once its cause is gone (delete data first); exits 1 naming each
    /// node that refused because it is still over its quota or reserve.
    Disarm,
}

fn lines(list: &[NodeAlarms]) -> String {
    let mut out = String::new();
    for n in list {
        for a in &n.alarms {
            out.push_str(&format!(
                "memberID:{} alarm:{} limit:{} {}\n",
                a.node_id, a.alarm, a.limit, a.message
            ));
        }
    }
    out
}

fn render(format: Format, list: &[NodeAlarms]) -> String {
    match format {
        Format::Simple => lines(list),
        Format::Json => {
            let nodes: Vec<serde_json::Value> = list
                .iter()
                .map(|n| {
                    json!({
                        "endpoint": n.endpoint,
                        "node_id": n.node_id,
                        "alarms": n.alarms.iter().map(|a| json!({
                            "alarm": a.alarm,
                            "node_id": a.node_id,
                            "limit": a.limit,
                            "message": a.message,
                            "raised_at_unix_s": a.raised_at_unix_s,
                        })).collect::<Vec<_>>(),
                        "data_dir_bytes": n.data_dir_bytes,
                        "quota_bytes": n.quota_bytes,
                        "disk_free_bytes": n.disk_free_bytes,
                        "disk_reserve_bytes": n.disk_reserve_bytes,
                    })
                })
                .collect();
            format!("{}\n", json!({ "nodes": nodes }))
        }
        Format::Table => {
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|n| {
                    vec![
                        n.node_id.to_string(),
                        n.endpoint.clone(),
                        n.alarms
                            .iter()
                            .map(|a| a.alarm.clone())
                            .collect::<Vec<_>>()
                            .join(","),
                        n.data_dir_bytes.to_string(),
                        n.quota_bytes.to_string(),
                        n.disk_free_bytes.to_string(),
                    ]
                })
                .collect();
            output::table(
                &[
                    "ID",
                    "ENDPOINT",
                    "ALARMS",
                    "DATA DIR BYTES",
                    "QUOTA BYTES",
                    "DISK FREE BYTES",
                ],
                &rows,
            )
        }
    }
}

/// Runs `alarm list` or `alarm disarm`; returns the output.
pub async fn run(client: &Client, format: Format, cmd: &AlarmCommand) -> anyhow::Result<String> {
    let endpoints = client.all_endpoints().await;
    let disarm = matches!(cmd, AlarmCommand::Disarm);
    let calls = endpoints.iter().map(|ep| async move {
        if disarm {
            client.alarm_disarm(ep).await
        } else {
            client.alarm_list(ep).await
        }
    });
    let results: Vec<Result<NodeAlarms, Error>> = futures::future::join_all(calls).await;
    let mut ok = Vec::new();
    let mut refused = Vec::new();
    let mut unreachable = Vec::new();
    for (ep, r) in endpoints.iter().zip(results) {
        match r {
            Ok(n) => ok.push(n),
            Err(e @ Error::NoSpace { .. }) => refused.push(format!("{ep}: {e}")),
            Err(e) => unreachable.push(format!("{ep}: {e}")),
        }
    }
    for u in &unreachable {
        output::stderr_line(&format!("warning: {u}"));
    }
    if !refused.is_empty() {
        bail!("{}", refused.join("; "));
    }
    if ok.is_empty() {
        bail!(
            "no endpoint answered ({})",
            unreachable.first().cloned().unwrap_or_default()
        );
    }
    Ok(render(format, &ok))
}
