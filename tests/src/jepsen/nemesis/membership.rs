//! The `membership` nemesis and the `add` / `remove` scenario steps: membership changes through
//! the cluster's admin API, after each of which the harness reads the membership the cluster
//! actually has and counts exactly those members ([`Db::set_members`]).
//!
//! A change's answer does not tell what happened: a remove that timed out, or that was answered
//! "already undergoing a configuration change" (a retry while the first attempt was still
//! committing), may have been applied; an `ok` promote may be followed by another leader's
//! change. So every change, whatever its answer, is followed by reading `Cluster.Members` until
//! three reads in a row (0.5 s apart) agree, within 10 s; the harness's member list then becomes
//! the cluster's (ids of nodes the harness started). Nodes the cluster no longer has are killed
//! and wiped; a node the cluster has that the harness had dropped (an add reported failed that
//! was applied) is counted again. When the membership cannot be read, the list is kept and the
//! nemesis op says so.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};

use super::{Nemesis, Target};

/// How long the harness waits for the membership to settle after a change.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Gap between membership reads while it settles.
const SETTLE_POLL: Duration = Duration::from_millis(500);
/// Identical reads in a row that count as settled.
const SETTLE_READS: usize = 3;

impl Nemesis {
    async fn admin_client(&self) -> Result<ftkv_client::Client, String> {
        self.db
            .admin_builder(self.db.endpoints())
            .build()
            .await
            .map_err(|e| format!("client: {e}"))
    }

    /// Reads the membership until it settles, then makes the harness count exactly the members
    /// the cluster has; returns what it found and did.
    pub(super) async fn sync_membership(&mut self) -> Value {
        self.membership_changed = true;
        let started = std::time::Instant::now();
        let mut reads: Vec<BTreeSet<u64>> = Vec::new();
        let mut last_error = String::new();
        while started.elapsed() < SETTLE_TIMEOUT {
            // A fresh client each time: the old one may point only at removed nodes.
            match self.admin_client().await {
                Ok(c) => match c.members().await {
                    Ok(m) => reads.push(m.members.iter().map(|m| m.id).collect()),
                    Err(e) => last_error = e.to_string(),
                },
                Err(e) => last_error = e,
            }
            if reads.len() >= SETTLE_READS
                && reads[reads.len() - SETTLE_READS..]
                    .windows(2)
                    .all(|w| w[0] == w[1])
            {
                break;
            }
            tokio::time::sleep(SETTLE_POLL).await;
        }
        let settled = reads.len() >= SETTLE_READS
            && reads[reads.len() - SETTLE_READS..]
                .windows(2)
                .all(|w| w[0] == w[1]);
        let Some(actual) = reads.last().cloned().filter(|_| settled) else {
            return json!({
                "membership": "unknown",
                "error": format!(
                    "membership did not settle within {} s (reads {reads:?}; last error: {last_error})",
                    SETTLE_TIMEOUT.as_secs()
                ),
                "counted": self.db.members(),
            });
        };
        let known: BTreeSet<u64> = self.db.node_ids().into_iter().collect();
        let before: BTreeSet<u64> = self.db.members().into_iter().collect();
        let counted: Vec<u64> = actual.iter().copied().filter(|id| known.contains(id)).collect();
        let unknown: Vec<u64> = actual.difference(&known).copied().collect();
        let dropped: Vec<u64> = before.difference(&actual).copied().collect();
        let regained: Vec<u64> = actual
            .intersection(&known)
            .filter(|id| !before.contains(id))
            .copied()
            .collect();
        self.db.set_members(&counted);
        for &id in &dropped {
            // Removed by the cluster: stop it for good (it is no longer restarted or checked).
            if self.db.is_running(id) {
                let _ = self.kill_node(id);
            } else {
                self.stopped.insert(id);
            }
            let _ = self.db.wipe(id);
            self.corrupted.remove(&id);
        }
        json!({
            "membership": actual,
            "counted": counted,
            "dropped": dropped,
            "regained": regained,
            "unknown_ids": unknown,
        })
    }

    /// Removes a random non-leader member and adds a fresh node in its place.
    pub(super) async fn replace_a_member(&mut self) -> Value {
        let victims = self.resolve(&Target::Follower).await;
        let Some(&old) = victims.first() else {
            return json!({"error": "no follower to replace"});
        };
        self.replace_member(old).await
    }

    /// Removes member `old` from the cluster, stops and wipes it, starts a fresh node under a new
    /// id, adds it as learner and promotes it. Returns what happened.
    pub(super) async fn replace_member(&mut self, old: u64) -> Value {
        let removed = self.remove_member(old).await;
        if self.db.members().contains(&old) {
            return json!({"remove": removed, "added": Value::Null, "error": format!("node {old} is still a member")});
        }
        let added = self.add_member(true).await;
        json!({"remove": removed, "add": added})
    }

    /// Removes member `id` (whatever the answer, the membership is then read back).
    pub(super) async fn remove_member(&mut self, id: u64) -> Value {
        let answer = match self.admin_client().await {
            Ok(c) => match c.remove(id).await {
                Ok(_) => json!("ok"),
                Err(e) => json!(format!("error: {e}")),
            },
            Err(e) => json!(format!("error: {e}")),
        };
        let synced = self.sync_membership().await;
        json!({"node": id, "answer": answer, "after": synced})
    }

    /// Starts a fresh node under a new id, adds it as learner and (with `promote`) promotes it,
    /// retrying the promote while it catches up; then reads the membership back.
    pub(super) async fn add_member(&mut self, promote: bool) -> Value {
        let client = match self.admin_client().await {
            Ok(c) => c,
            Err(e) => return json!({"error": e}),
        };
        let (new, client_ep, peer_ep) = match self.db.add_node() {
            Ok(x) => x,
            Err(e) => return json!({"error": format!("add node: {e}")}),
        };
        // Counted from now on (the read-back below drops it again if the cluster lacks it).
        self.db.add_member(new);
        let mut answer = match client.add_learner(new, &client_ep, &peer_ep).await {
            Ok(_) => json!("ok"),
            Err(e) => json!(format!("add learner: {e}")),
        };
        if promote && answer == json!("ok") {
            // Give the learner time to catch up, then promote (promotion may wait for catch-up).
            let mut last_error = String::new();
            let mut promoted = false;
            for _ in 0..30 {
                tokio::time::sleep(Duration::from_millis(500)).await;
                match client.promote(new).await {
                    Ok(_) => {
                        promoted = true;
                        break;
                    }
                    Err(e) => last_error = e.to_string(),
                }
            }
            if !promoted {
                answer = json!(format!("promote: {last_error}"));
            }
        }
        let synced = self.sync_membership().await;
        json!({"node": new, "endpoint": client_ep, "answer": answer, "after": synced})
    }
}
