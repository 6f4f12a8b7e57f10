//! Counter checker (Jepsen's `checker/counter`): increments (`f = "add"`, value = a positive
//! delta; the workload uses `Upsert{add}`) and reads (`f = "read"`, `ok` value = the counter, or
//! `null` for absent = 0). Counters are independent per `key`.
//!
//! Every `ok` read must lie in `[lower, upper]` where `lower` is the sum of `ok` adds completed
//! before the read was invoked, and `upper` the sum of `ok` and `info` adds invoked before the read
//! completed (`fail` adds count nowhere). For the final read this is
//! `[acknowledged, acknowledged + ambiguous]`. Below: a lost increment; above: an increment applied
//! twice, or a `fail`ed one that took effect.

use std::collections::BTreeMap;

use serde_json::{json, Value};

use super::{as_i64, key_string, CheckResult, Verdict};
use crate::jepsen::history::{History, OpType};

/// Checks counter bounds; see the module doc.
pub fn check(history: &History) -> CheckResult {
    // Per key: a time-ordered list of events (history position, kind).
    enum Ev {
        AddInvoke(i64),   // delta, counts toward upper (ok or info)
        AddComplete(i64), // delta, counts toward lower (ok)
        ReadInvoke(usize),
        ReadComplete(usize, i64),
    }
    let mut events: BTreeMap<String, Vec<(usize, Ev)>> = BTreeMap::new();
    for pair in history.client_pairs() {
        let Some(inv) = history.ops.get(pair.invoke) else {
            continue;
        };
        let outcome = pair.outcome(history);
        let evs = events.entry(key_string(&inv.key)).or_default();
        match inv.f.as_str() {
            "add" => {
                let Some(delta) = as_i64(&inv.value) else { continue };
                if outcome == OpType::Fail {
                    continue;
                }
                evs.push((pair.invoke, Ev::AddInvoke(delta)));
                if let (OpType::Ok, Some(c)) = (outcome, pair.complete) {
                    evs.push((c, Ev::AddComplete(delta)));
                }
            }
            "read" if outcome == OpType::Ok => {
                let Some(c) = pair.complete else { continue };
                let v = history.ops.get(c).map(|o| &o.value).unwrap_or(&Value::Null);
                let n = if v.is_null() {
                    0
                } else {
                    as_i64(v).unwrap_or(i64::MIN)
                };
                evs.push((pair.invoke, Ev::ReadInvoke(pair.invoke)));
                evs.push((c, Ev::ReadComplete(pair.invoke, n)));
            }
            _ => {}
        }
    }
    let mut verdict = Verdict::Valid;
    let mut errors = Vec::new();
    let mut per_key = serde_json::Map::new();
    let mut reads_n = 0usize;
    for (key, mut evs) in events {
        evs.sort_by_key(|(pos, _)| *pos);
        let (mut lower, mut upper) = (0i64, 0i64);
        let mut lower_at_invoke: BTreeMap<usize, i64> = BTreeMap::new();
        let mut acknowledged = 0i64;
        let mut last_read: Option<(i64, i64, i64)> = None;
        for (_, ev) in &evs {
            match *ev {
                Ev::AddInvoke(d) => {
                    upper = upper.saturating_add(d);
                }
                Ev::AddComplete(d) => {
                    lower = lower.saturating_add(d);
                    acknowledged = acknowledged.saturating_add(d);
                }
                Ev::ReadInvoke(id) => {
                    lower_at_invoke.insert(id, lower);
                }
                Ev::ReadComplete(id, n) => {
                    reads_n += 1;
                    let lo = lower_at_invoke.get(&id).copied().unwrap_or(0);
                    last_read = Some((n, lo, upper));
                    if n < lo || n > upper {
                        verdict = Verdict::Invalid;
                        if errors.len() < 20 {
                            errors.push(json!({
                                "key": key, "read_invoke_index": id, "value": n,
                                "lower": lo, "upper": upper,
                                "kind": if n < lo { "lost-increment" } else { "extra-increment" },
                            }));
                        }
                    }
                }
            }
        }
        per_key.insert(
            key,
            json!({
                "acknowledged": acknowledged,
                "ambiguous": upper - acknowledged,
                "final_read": last_read.map(|(n, lo, hi)| json!({"value": n, "lower": lo, "upper": hi})),
            }),
        );
    }
    if reads_n == 0 {
        verdict = verdict.merge(Verdict::Unknown);
    }
    let summary = match errors.first() {
        Some(e) => format!("{} read(s) out of bounds; first: {e}", errors.len()),
        None => format!("{reads_n} reads within [acknowledged, acknowledged + ambiguous]"),
    };
    CheckResult::new(
        "counter",
        verdict,
        summary,
        json!({"keys": per_key, "errors": errors}),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::jepsen::history::build::*;

    fn add(h: &mut History, p: u64, d: i64, ty: OpType) {
        h.push(invoke(p, "add", None, json!(d)));
        h.push(done(p, ty, "add", None, json!(d)));
    }

    fn read(h: &mut History, n: i64) {
        h.push(invoke(9, "read", None, Value::Null));
        h.push(done(9, OpType::Ok, "read", None, json!(n)));
    }

    #[test]
    fn final_value_within_ambiguous_range_is_valid() {
        for final_value in [3, 5, 8] {
            let mut h = History::default();
            add(&mut h, 0, 1, OpType::Ok);
            add(&mut h, 0, 2, OpType::Ok);
            add(&mut h, 1, 2, OpType::Info);
            add(&mut h, 2, 3, OpType::Info);
            add(&mut h, 3, 100, OpType::Fail);
            read(&mut h, final_value);
            let r = check(&h);
            assert_eq!(r.verdict, Verdict::Valid, "{final_value}: {}", r.summary);
        }
    }

    #[test]
    fn lost_increment_is_rejected() {
        let mut h = History::default();
        add(&mut h, 0, 1, OpType::Ok);
        add(&mut h, 0, 1, OpType::Ok);
        read(&mut h, 1);
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Invalid);
        assert_eq!(r.details["errors"][0]["kind"], json!("lost-increment"));
    }

    #[test]
    fn duplicate_apply_is_rejected() {
        let mut h = History::default();
        add(&mut h, 0, 1, OpType::Ok);
        add(&mut h, 1, 1, OpType::Info);
        read(&mut h, 3);
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Invalid);
        assert_eq!(r.details["errors"][0]["kind"], json!("extra-increment"));
    }

    #[test]
    fn concurrent_read_may_miss_an_in_flight_add() {
        let mut h = History::default();
        h.push(invoke(0, "add", None, json!(5)));
        h.push(invoke(9, "read", None, Value::Null));
        h.push(done(0, OpType::Ok, "add", None, json!(5)));
        h.push(done(9, OpType::Ok, "read", None, Value::Null));
        assert_eq!(check(&h).verdict, Verdict::Valid);
        // but a read invoked after the add completed must see it
        read(&mut h, 0);
        assert_eq!(check(&h).verdict, Verdict::Invalid);
    }
}
