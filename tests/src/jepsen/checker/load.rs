//! Bulk-load checker (ftkv's own; issue 18): each `load` (`key` = load id x, `value` = its row
//! count R) is one `Kv.BulkLoad` of R rows under its own prefix; each `read` (`key` = x, `ok`
//! value = the rows of x seen by one single-page linearizable scan, a snapshot) counts them. A
//! load is atomic: its rows become visible together, on every node, or never.
//!
//! Invalid when: a read sees some but not all rows of a load (`partial`), or rows of a load
//! never invoked (`unexpected`); a load that `fail`ed is seen (`failed-but-present`); a load
//! acknowledged `ok` is not seen by a read invoked after the acknowledgement (`lost`); a load
//! seen whole is not seen by a read invoked after that read completed (`reverted`). `info` loads
//! may end whole or absent. An invoked load without an `ok` read: `unknown`.

use std::collections::BTreeMap;

use serde_json::json;

use super::{as_i64, key_string, CheckResult, Verdict};
use crate::jepsen::history::{History, OpType};

/// One load's invocation and outcome.
struct Load {
    rows: i64,
    outcome: OpType,
    /// History position of the completion (`None`: never completed).
    completed_at: Option<u64>,
}

/// One `ok` read: where it was invoked and completed, and the rows it saw.
struct Read {
    invoked_at: u64,
    completed_at: u64,
    rows: i64,
}

/// Checks bulk-load atomicity and durability; see the module doc for the anomalies.
pub fn check(history: &History) -> CheckResult {
    let mut loads: BTreeMap<String, Load> = BTreeMap::new();
    let mut reads: BTreeMap<String, Vec<Read>> = BTreeMap::new();
    for pair in history.client_pairs() {
        let Some(inv) = history.ops.get(pair.invoke) else {
            continue;
        };
        let done = pair.complete.and_then(|c| history.ops.get(c));
        let key = key_string(&inv.key);
        match inv.f.as_str() {
            "load" => {
                let Some(rows) = as_i64(&inv.value) else { continue };
                loads.insert(
                    key,
                    Load {
                        rows,
                        outcome: pair.outcome(history),
                        completed_at: done.map(|d| d.index),
                    },
                );
            }
            "read" => {
                let Some(done) = done.filter(|d| d.op_type == OpType::Ok) else {
                    continue;
                };
                let Some(rows) = as_i64(&done.value) else { continue };
                reads.entry(key).or_default().push(Read {
                    invoked_at: inv.index,
                    completed_at: done.index,
                    rows,
                });
            }
            _ => {}
        }
    }

    let mut verdict = Verdict::Valid;
    let mut anomalies: Vec<serde_json::Value> = Vec::new();
    let mut invalid = |kind: &str, key: &str, detail: serde_json::Value| {
        anomalies.push(json!({"type": kind, "load": key, "detail": detail}));
    };
    let (mut whole, mut absent, mut ambiguous_whole) = (0u64, 0u64, 0u64);
    let mut unread = Vec::new();
    for (key, rs) in &reads {
        let Some(load) = loads.get(key) else {
            for r in rs.iter().filter(|r| r.rows != 0) {
                invalid(
                    "unexpected",
                    key,
                    json!({"read_at": r.completed_at, "rows": r.rows}),
                );
            }
            continue;
        };
        for r in rs {
            if r.rows != 0 && r.rows != load.rows {
                invalid(
                    "partial",
                    key,
                    json!({"read_at": r.completed_at, "rows": r.rows, "of": load.rows}),
                );
            }
            if r.rows == load.rows && load.outcome == OpType::Fail {
                invalid("failed-but-present", key, json!({"read_at": r.completed_at}));
            }
            if r.rows == 0
                && load.outcome == OpType::Ok
                && load.completed_at.is_some_and(|c| r.invoked_at > c)
            {
                invalid(
                    "lost",
                    key,
                    json!({"acknowledged_at": load.completed_at, "read_at": r.completed_at}),
                );
            }
        }
        if let Some(seen) = rs
            .iter()
            .filter(|r| r.rows == load.rows)
            .map(|r| r.completed_at)
            .min()
        {
            for r in rs.iter().filter(|r| r.rows == 0 && r.invoked_at > seen) {
                invalid(
                    "reverted",
                    key,
                    json!({"seen_whole_at": seen, "read_at": r.completed_at}),
                );
            }
        }
    }
    for (key, load) in &loads {
        let last = reads
            .get(key)
            .and_then(|rs| rs.iter().max_by_key(|r| r.invoked_at));
        match last {
            None => unread.push(key.clone()),
            Some(r) if r.rows == load.rows => {
                whole += 1;
                if load.outcome == OpType::Info {
                    ambiguous_whole += 1;
                }
            }
            Some(_) => absent += 1,
        }
    }
    if !anomalies.is_empty() {
        verdict = Verdict::Invalid;
    } else if !unread.is_empty() || loads.is_empty() {
        verdict = Verdict::Unknown;
    }
    let summary = format!(
        "{} loads: {whole} whole at the end ({ambiguous_whole} of them ambiguous), {absent} absent, \
         {} never read; {} anomalies",
        loads.len(),
        unread.len(),
        anomalies.len()
    );
    CheckResult::new(
        "load",
        verdict,
        summary,
        json!({"anomalies": anomalies, "unread": unread}),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::jepsen::history::{Op, Process};
    use serde_json::Value;

    fn load(h: &mut History, p: u64, x: i64, rows: i64, outcome: OpType) {
        h.push(Op::new(
            Process::Client(p),
            OpType::Invoke,
            "load",
            Some(json!(x)),
            json!(rows),
        ));
        h.push(Op::new(
            Process::Client(p),
            outcome,
            "load",
            Some(json!(x)),
            json!(rows),
        ));
    }

    fn read(h: &mut History, p: u64, x: i64, rows: i64) {
        h.push(Op::new(
            Process::Client(p),
            OpType::Invoke,
            "read",
            Some(json!(x)),
            Value::Null,
        ));
        h.push(Op::new(
            Process::Client(p),
            OpType::Ok,
            "read",
            Some(json!(x)),
            json!(rows),
        ));
    }

    fn anomaly_types(r: &CheckResult) -> Vec<String> {
        r.details["anomalies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["type"].as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn whole_absent_and_ambiguous_loads_are_valid() {
        let mut h = History::default();
        load(&mut h, 0, 1, 100, OpType::Ok);
        load(&mut h, 1, 2, 100, OpType::Fail);
        load(&mut h, 0, 3, 100, OpType::Info);
        load(&mut h, 1, 4, 100, OpType::Info);
        read(&mut h, 2, 1, 100);
        read(&mut h, 2, 2, 0);
        read(&mut h, 2, 3, 100);
        read(&mut h, 2, 4, 0);
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Valid, "{r:?}");
        assert!(
            r.summary
                .contains("2 whole at the end (1 of them ambiguous), 2 absent"),
            "{}",
            r.summary
        );
    }

    #[test]
    fn each_anomaly_is_named() {
        type Build = Box<dyn Fn(&mut History)>;
        let cases: Vec<(&str, Build)> = vec![
            (
                "partial",
                Box::new(|h| {
                    load(h, 0, 1, 100, OpType::Info);
                    read(h, 1, 1, 40);
                }),
            ),
            ("unexpected", Box::new(|h| read(h, 1, 9, 100))),
            (
                "failed-but-present",
                Box::new(|h| {
                    load(h, 0, 1, 100, OpType::Fail);
                    read(h, 1, 1, 100);
                }),
            ),
            (
                "lost",
                Box::new(|h| {
                    load(h, 0, 1, 100, OpType::Ok);
                    read(h, 1, 1, 0);
                }),
            ),
            (
                "reverted",
                Box::new(|h| {
                    load(h, 0, 1, 100, OpType::Info);
                    read(h, 1, 1, 100);
                    read(h, 1, 1, 0);
                }),
            ),
        ];
        for (want, build) in cases {
            let mut h = History::default();
            build(&mut h);
            let r = check(&h);
            assert_eq!(r.verdict, Verdict::Invalid, "{want}: {r:?}");
            assert!(anomaly_types(&r).contains(&want.to_string()), "{want}: {r:?}");
        }
    }

    #[test]
    fn a_read_concurrent_with_an_acknowledged_load_may_miss_it() {
        let mut h = History::default();
        // The read is invoked before the load completes: absent is allowed.
        h.push(Op::new(
            Process::Client(0),
            OpType::Invoke,
            "load",
            Some(json!(1)),
            json!(10),
        ));
        h.push(Op::new(
            Process::Client(1),
            OpType::Invoke,
            "read",
            Some(json!(1)),
            Value::Null,
        ));
        h.push(Op::new(
            Process::Client(0),
            OpType::Ok,
            "load",
            Some(json!(1)),
            json!(10),
        ));
        h.push(Op::new(
            Process::Client(1),
            OpType::Ok,
            "read",
            Some(json!(1)),
            json!(0),
        ));
        read(&mut h, 2, 1, 10);
        assert_eq!(check(&h).verdict, Verdict::Valid);
    }

    #[test]
    fn a_load_never_read_is_unknown() {
        let mut h = History::default();
        load(&mut h, 0, 1, 100, OpType::Ok);
        assert_eq!(check(&h).verdict, Verdict::Unknown);
    }
}
