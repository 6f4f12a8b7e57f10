//! Checkers: each takes a [`History`](crate::jepsen::history::History) and returns a
//! [`CheckResult`] with a [`Verdict`] and JSON details (the anomalies found, with the ops involved).
//!
//! Names and semantics follow Jepsen: `linearizable` (Knossos; here the Wing-Gong-Lowe search with
//! memoization, split per key), `set`, `counter`, `bank`, `append` (Elle's list-append analysis),
//! plus `convergence` and `liveness`, which check the cluster's final state after the last heal.

pub mod append;
pub mod bank;
pub mod convergence;
pub mod counter;
pub mod linearizable;
pub mod load;
pub mod set;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A checker's decision (Jepsen's `:valid?` true / false / `:unknown`, plus "unsupported").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// No anomaly found.
    Valid,
    /// At least one anomaly found; `details` names it.
    Invalid,
    /// The checker could not decide (search budget exhausted, no final read).
    Unknown,
    /// The check or fault cannot run on this substrate/build; said explicitly rather than skipped.
    Unsupported,
}

impl Verdict {
    /// Combines two verdicts: invalid beats unknown beats unsupported beats valid.
    pub fn merge(self, other: Verdict) -> Verdict {
        use Verdict::*;
        match (self, other) {
            (Invalid, _) | (_, Invalid) => Invalid,
            (Unknown, _) | (_, Unknown) => Unknown,
            (Unsupported, _) | (_, Unsupported) => Unsupported,
            _ => Valid,
        }
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verdict::Valid => "valid",
            Verdict::Invalid => "INVALID",
            Verdict::Unknown => "unknown",
            Verdict::Unsupported => "unsupported",
        })
    }
}

/// One checker's result: its name, verdict, a one-line summary and structured details.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckResult {
    /// Checker name (`linearizable`, `set`, ...).
    pub checker: String,
    /// The decision.
    pub verdict: Verdict,
    /// One human-readable line (counts, the first anomaly).
    pub summary: String,
    /// Structured evidence (anomalies with op indexes), written to results.json.
    pub details: Value,
}

impl CheckResult {
    /// A result with the given fields.
    pub fn new(checker: &str, verdict: Verdict, summary: impl Into<String>, details: Value) -> Self {
        CheckResult {
            checker: checker.to_string(),
            verdict,
            summary: summary.into(),
            details,
        }
    }

    /// True when the verdict is [`Verdict::Valid`].
    pub fn is_valid(&self) -> bool {
        self.verdict == Verdict::Valid
    }
}

/// Reads an integer from a JSON value (numbers, or strings holding a number).
pub(crate) fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// A key rendered as a string for grouping (`"k1"` and `1` stay distinct: `k1` vs `1`).
pub(crate) fn key_string(v: &Option<Value>) -> String {
    match v {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn merge_prefers_the_worst_verdict() {
        assert_eq!(Verdict::Valid.merge(Verdict::Invalid), Verdict::Invalid);
        assert_eq!(Verdict::Unknown.merge(Verdict::Valid), Verdict::Unknown);
        assert_eq!(Verdict::Unsupported.merge(Verdict::Unknown), Verdict::Unknown);
        assert_eq!(Verdict::Valid.merge(Verdict::Valid), Verdict::Valid);
    }
}
