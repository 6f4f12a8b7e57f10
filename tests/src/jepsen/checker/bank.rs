//! Bank checker (Jepsen's `bank` test): accounts hold integer balances; `transfer` ops
//! (value `{"from","to","amount"}`) move money atomically with a multi-key `Txn`; `read` ops
//! (`ok` value = an object mapping account number to balance) read every account in one `Txn`.
//!
//! Every `ok` read must show every account, balances that are not negative, and a sum equal to
//! the constant total (a transfer's two halves are atomic: no torn read, no money created or lost).

use serde_json::json;

use super::{as_i64, CheckResult, Verdict};
use crate::jepsen::history::{History, OpType};

/// The bank's invariant parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BankOptions {
    /// Account numbers.
    pub accounts: Vec<u64>,
    /// Constant sum of all balances.
    pub total: i64,
}

/// Checks every `ok` read against the bank invariants.
pub fn check(history: &History, options: &BankOptions) -> CheckResult {
    let mut errors = Vec::new();
    let mut reads = 0usize;
    for op in &history.ops {
        if op.op_type != OpType::Ok
            || op.f != "read"
            || op.process == crate::jepsen::history::Process::Nemesis
        {
            continue;
        }
        reads += 1;
        let mut sum = 0i64;
        let mut problems = Vec::new();
        for acct in &options.accounts {
            match op.value.get(acct.to_string()).and_then(as_i64) {
                None => problems.push(format!("account {acct} missing")),
                Some(b) => {
                    if b < 0 {
                        problems.push(format!("account {acct} negative ({b})"));
                    }
                    sum = sum.saturating_add(b);
                }
            }
        }
        if problems.is_empty() && sum != options.total {
            problems.push(format!("total {sum} != {}", options.total));
        }
        if !problems.is_empty() {
            errors.push(json!({"index": op.index, "value": op.value, "problems": problems}));
        }
    }
    let verdict = if !errors.is_empty() {
        Verdict::Invalid
    } else if reads == 0 {
        Verdict::Unknown
    } else {
        Verdict::Valid
    };
    let summary = match errors.first() {
        Some(e) => format!(
            "{} of {reads} reads broke the invariant; first at op {}: {}",
            errors.len(),
            e["index"],
            e["problems"]
        ),
        None => format!(
            "{reads} reads, every total {} and no negative balance",
            options.total
        ),
    };
    errors.truncate(50);
    CheckResult::new(
        "bank",
        verdict,
        summary,
        json!({"reads": reads, "errors": errors}),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::jepsen::history::build::*;
    use serde_json::Value;

    fn opts() -> BankOptions {
        BankOptions {
            accounts: vec![0, 1, 2],
            total: 30,
        }
    }

    fn read(h: &mut History, v: Value) {
        h.push(invoke(0, "read", None, Value::Null));
        h.push(done(0, OpType::Ok, "read", None, v));
    }

    #[test]
    fn constant_totals_are_valid_even_with_ambiguous_transfers() {
        let mut h = History::default();
        read(&mut h, json!({"0": 10, "1": 10, "2": 10}));
        h.push(invoke(
            1,
            "transfer",
            None,
            json!({"from": 0, "to": 1, "amount": 5}),
        ));
        h.push(done(
            1,
            OpType::Info,
            "transfer",
            None,
            json!({"from": 0, "to": 1, "amount": 5}),
        ));
        read(&mut h, json!({"0": 5, "1": 15, "2": 10}));
        assert_eq!(check(&h, &opts()).verdict, Verdict::Valid);
    }

    #[test]
    fn torn_transfer_and_negative_balance_are_rejected() {
        let mut h = History::default();
        read(&mut h, json!({"0": 5, "1": 10, "2": 10}));
        let r = check(&h, &opts());
        assert_eq!(r.verdict, Verdict::Invalid);
        assert_eq!(r.details["errors"][0]["index"], json!(1));
        let mut h = History::default();
        read(&mut h, json!({"0": -5, "1": 25, "2": 10}));
        assert_eq!(check(&h, &opts()).verdict, Verdict::Invalid);
        let mut h = History::default();
        read(&mut h, json!({"0": 10, "1": 20}));
        assert_eq!(check(&h, &opts()).verdict, Verdict::Invalid);
    }

    #[test]
    fn no_reads_is_unknown() {
        assert_eq!(check(&History::default(), &opts()).verdict, Verdict::Unknown);
    }
}
