//! `ftkvctl member list | add | add-learner | update | promote | remove` (etcdctl's `member`).
//!
//! `member add ID CLIENT PEER --learner` is etcd's shape for adding a learner (`add-learner` is
//! the same command under its older name). Without `--learner`, `member add` adds the learner
//! and then promotes it as soon as it has caught up with the leader: ftkv never adds a voter that
//! has no log (it would count towards the quorum before it can acknowledge anything), so this is
//! what etcd's `member add` of a voter becomes. The promotion is retried while the node answers
//! that the learner is still catching up, until `--timeout` has passed.

use std::time::{Duration, Instant};

use super::output::{self, Format};
use crate::{Client, Error, Membership};

/// `member ...`.
#[derive(Debug, clap::Subcommand)]
pub enum MemberCommand {
    /// List voters and learners (simple format: ID, voter|learner, CLIENT, PEER, leader|-).
    List,
    /// Add a node (started with --initial-cluster-state existing): with --learner as a
    /// non-voting learner; without, as a learner promoted to voter once it has caught up
    /// (waits up to --timeout, e.g. --timeout 5m for a large data set).
    Add {
        /// New node id.
        id: u64,
        /// Its client endpoint (host:port).
        client_endpoint: String,
        /// Its peer endpoint (host:port).
        peer_endpoint: String,
        /// Add it as a learner only (promote it later with `member promote`).
        #[arg(long)]
        learner: bool,
    },
    /// Add a non-voting learner (the same as `member add --learner`).
    AddLearner {
        /// New node id.
        id: u64,
        /// Its client endpoint (host:port).
        client_endpoint: String,
        /// Its peer endpoint (host:port).
        peer_endpoint: String,
    },
    /// Change the client and peer endpoints of an existing member (etcd's `member update`).
    Update {
        /// Node id.
        id: u64,
        /// Its new client endpoint (host:port).
        client_endpoint: String,
        /// Its new peer endpoint (host:port).
        peer_endpoint: String,
    },
    /// Turn a learner into a voter (refused until it has caught up with the leader).
    Promote {
        /// Node id.
        id: u64,
    },
    /// Remove a voter or learner.
    Remove {
        /// Node id.
        id: u64,
    },
}

/// Whether `error` is the leader's refusal to promote a learner that has not caught up yet
/// (an `INVALID_ARGUMENT` saying so): worth retrying, unlike any other refusal.
fn is_still_catching_up(error: &Error) -> bool {
    match error {
        Error::InvalidArgument { message, .. } => {
            message.contains("still catching up") || message.contains("has not replicated anything yet")
        }
        _ => false,
    }
}

/// Promotes `id`, retrying while it is still catching up, until `timeout` has passed since
/// `started`.
async fn promote_when_caught_up(
    client: &Client,
    id: u64,
    started: Instant,
    timeout: Duration,
) -> anyhow::Result<Membership> {
    loop {
        match client.promote(id).await {
            Ok(membership) => return Ok(membership),
            Err(error) if is_still_catching_up(&error) && started.elapsed() < timeout => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(error) if is_still_catching_up(&error) => {
                return Err(anyhow::Error::new(error).context(format!(
                    "member {id} was added as a learner but has not caught up within {} \
                     (raise --timeout, or run `ftkvctl member promote {id}` later)",
                    humantime::format_duration(timeout)
                )))
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// Runs `cmd`; the text to print (the outcome, then the membership).
pub async fn run(
    client: &Client,
    format: Format,
    cmd: &MemberCommand,
    timeout: Duration,
) -> anyhow::Result<String> {
    let started = Instant::now();
    let (messages, membership) = match cmd {
        MemberCommand::List => (vec![], client.members().await?),
        MemberCommand::Add {
            id,
            client_endpoint,
            peer_endpoint,
            learner,
        } => {
            let added = client.add_learner(*id, client_endpoint, peer_endpoint).await?;
            let mut messages = vec![format!("Member {id} added as a learner")];
            if *learner {
                (messages, added)
            } else {
                let promoted = promote_when_caught_up(client, *id, started, timeout).await?;
                messages.push(format!("Member {id} promoted to voter"));
                (messages, promoted)
            }
        }
        MemberCommand::AddLearner {
            id,
            client_endpoint,
            peer_endpoint,
        } => (
            vec![format!("Member {id} added as a learner")],
            client.add_learner(*id, client_endpoint, peer_endpoint).await?,
        ),
        MemberCommand::Update {
            id,
            client_endpoint,
            peer_endpoint,
        } => (
            vec![format!("Member {id} updated")],
            client.update_member(*id, client_endpoint, peer_endpoint).await?,
        ),
        MemberCommand::Promote { id } => (
            vec![format!("Member {id} promoted to voter")],
            client.promote(*id).await?,
        ),
        MemberCommand::Remove { id } => (vec![format!("Member {id} removed")], client.remove(*id).await?),
    };
    let mut out = String::new();
    if matches!(format, Format::Simple | Format::Table) {
        for message in messages {
            out.push_str(&message);
            out.push('\n');
        }
    }
    out.push_str(&output::membership(format, &membership));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_catching_up_refusals_are_retried() {
        let invalid = |message: &str| Error::InvalidArgument {
            message: message.into(),
            limit: None,
        };
        assert!(is_still_catching_up(&invalid(
            "node 4 is still catching up: it has log index 10 of the leader's 5000"
        )));
        assert!(is_still_catching_up(&invalid(
            "node 4 has not replicated anything yet; start it and let it catch up before promoting it"
        )));
        assert!(!is_still_catching_up(&invalid(
            "node 4 is not a member; add it as a learner first"
        )));
        assert!(!is_still_catching_up(&Error::Unavailable {
            message: "still catching up".into()
        }));
    }
}
