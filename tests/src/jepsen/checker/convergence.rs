//! `convergence` and `liveness`: checks of the cluster's state after the final heal, gathered by
//! the runner with `Cluster.Status{with_digest: true}` on every node (not from the history).
//!
//! Convergence: every node answered, all report the same `applied_index` and the same state
//! `digest` (xxh3-64 over every key and value at that index). Liveness: every node served a
//! request within the bound (30 s in the harness) after the final heal.

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{CheckResult, Verdict};

/// One node's status after the final heal, as the runner saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeFinalState {
    /// Node name in the run (`n1`..).
    pub node: String,
    /// `Cluster.Status.node_id`, when the node answered.
    pub node_id: Option<u64>,
    /// Applied index at which `digest` was taken.
    pub applied_index: Option<u64>,
    /// State digest; `None` when the node never answered.
    pub digest: Option<u64>,
    /// Milliseconds from the final heal until the node first served a read; `None` if never.
    pub first_served_ms: Option<u64>,
    /// Last error seen while polling, if any.
    pub error: Option<String>,
}

/// Checks that every replica reports the same digest at the same applied index.
pub fn check_convergence(states: &[NodeFinalState]) -> CheckResult {
    if states.is_empty() {
        return CheckResult::new(
            "convergence",
            Verdict::Unknown,
            "no node states gathered",
            json!({}),
        );
    }
    let silent: Vec<&str> = states
        .iter()
        .filter(|s| s.digest.is_none())
        .map(|s| s.node.as_str())
        .collect();
    let first = &states[0];
    let diverged = states
        .iter()
        .any(|s| s.digest != first.digest || s.applied_index != first.applied_index);
    let all_zero = states.iter().all(|s| s.digest == Some(0));
    let (verdict, summary) = if !silent.is_empty() {
        (Verdict::Invalid, format!("no digest from {}", silent.join(", ")))
    } else if diverged {
        let desc: Vec<String> = states
            .iter()
            .map(|s| {
                format!(
                    "{}@{}={:016x}",
                    s.node,
                    s.applied_index.unwrap_or(0),
                    s.digest.unwrap_or(0)
                )
            })
            .collect();
        (Verdict::Invalid, format!("replicas differ: {}", desc.join(" ")))
    } else if all_zero {
        (
            Verdict::Unsupported,
            format!(
                "every node answered digest 0 at applied index {}: the node does not compute digests",
                first.applied_index.unwrap_or(0)
            ),
        )
    } else {
        (
            Verdict::Valid,
            format!(
                "{} replicas agree: digest {:016x} at applied index {}",
                states.len(),
                first.digest.unwrap_or(0),
                first.applied_index.unwrap_or(0)
            ),
        )
    };
    CheckResult::new("convergence", verdict, summary, json!({ "nodes": states }))
}

/// Checks that every node served within `bound_ms` of the final heal.
pub fn check_liveness(states: &[NodeFinalState], bound_ms: u64) -> CheckResult {
    if states.is_empty() {
        return CheckResult::new("liveness", Verdict::Unknown, "no node states gathered", json!({}));
    }
    let late: Vec<String> = states
        .iter()
        .filter(|s| s.first_served_ms.is_none_or(|ms| ms > bound_ms))
        .map(|s| {
            format!(
                "{} ({})",
                s.node,
                s.error.clone().unwrap_or_else(|| "late".into())
            )
        })
        .collect();
    let slowest = states.iter().filter_map(|s| s.first_served_ms).max().unwrap_or(0);
    if late.is_empty() {
        CheckResult::new(
            "liveness",
            Verdict::Valid,
            format!("every node served within {slowest} ms of the final heal (bound {bound_ms} ms)"),
            json!({"slowest_ms": slowest, "bound_ms": bound_ms}),
        )
    } else {
        CheckResult::new(
            "liveness",
            Verdict::Invalid,
            format!("not serving within {bound_ms} ms: {}", late.join(", ")),
            json!({"late": late, "bound_ms": bound_ms}),
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn st(node: &str, applied: u64, digest: u64, ms: Option<u64>) -> NodeFinalState {
        NodeFinalState {
            node: node.into(),
            node_id: Some(1),
            applied_index: Some(applied),
            digest: Some(digest),
            first_served_ms: ms,
            error: None,
        }
    }

    #[test]
    fn equal_digests_converge() {
        let s = [
            st("n1", 10, 7, Some(5)),
            st("n2", 10, 7, Some(9)),
            st("n3", 10, 7, Some(100)),
        ];
        assert_eq!(check_convergence(&s).verdict, Verdict::Valid);
        assert_eq!(check_liveness(&s, 30_000).verdict, Verdict::Valid);
    }

    #[test]
    fn different_digest_or_index_or_silence_is_rejected() {
        let s = [st("n1", 10, 7, Some(1)), st("n2", 10, 8, Some(1))];
        assert_eq!(check_convergence(&s).verdict, Verdict::Invalid);
        let s = [st("n1", 10, 7, Some(1)), st("n2", 11, 7, Some(1))];
        assert_eq!(check_convergence(&s).verdict, Verdict::Invalid);
        let mut silent = st("n3", 0, 0, None);
        silent.digest = None;
        let s = [st("n1", 10, 7, Some(1)), silent];
        assert_eq!(check_convergence(&s).verdict, Verdict::Invalid);
        assert_eq!(check_liveness(&s, 30_000).verdict, Verdict::Invalid);
    }

    #[test]
    fn all_zero_digests_mean_unsupported_not_valid() {
        let s = [st("n1", 10, 0, Some(1)), st("n2", 10, 0, Some(1))];
        assert_eq!(check_convergence(&s).verdict, Verdict::Unsupported);
        let s = [st("n1", 10, 0, Some(1)), st("n2", 10, 5, Some(1))];
        assert_eq!(check_convergence(&s).verdict, Verdict::Invalid);
    }

    #[test]
    fn slow_node_fails_liveness() {
        let s = [st("n1", 10, 7, Some(1)), st("n2", 10, 7, Some(31_000))];
        assert_eq!(check_liveness(&s, 30_000).verdict, Verdict::Invalid);
    }
}
