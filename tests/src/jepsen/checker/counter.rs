//! Counter checker (Jepsen's `checker/counter`): increments (`f = "add"`, value = a positive
//! delta; the workload uses `Upsert{add}`) and reads (`f = "read"`, `ok` value = the counter, or
//! `null` for absent = 0). Counters are independent per `key`. Two checks per `ok` read:
//!
//! - **Bounds.** The value must lie in `[lower, upper]` where `lower` is the sum of `ok` adds
//!   completed before the read was invoked, and `upper` the sum of `ok` and `info` adds invoked
//!   before the read completed (`fail` adds count nowhere). For the final read this is
//!   `[acknowledged, acknowledged + ambiguous]`. Below: a lost increment (`lost-increment`);
//!   above: an increment applied twice, or a `fail`ed one that took effect (`extra-increment`).
//! - **Monotonic reads** (reads are linearizable and every add is positive, so the counter never
//!   decreases in the linearization order, whatever the outcome of each add: `ok`, `info` or
//!   `fail`). The value must be at least that of every `ok` read that completed before this read
//!   was invoked (reads that overlap may be ordered either way). Below: `read-went-backwards`,
//!   e.g. an `info` add seen by one read and gone from a later one after a restart or a
//!   failover (each read alone is within bounds). A key with an add of a delta <= 0 cannot be
//!   checked this way: its verdict is `unknown`, saying so.

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
    // Per key: the first add with a delta <= 0 (the monotonic check does not apply then).
    let mut non_positive: BTreeMap<String, i64> = BTreeMap::new();
    for pair in history.client_pairs() {
        let Some(inv) = history.ops.get(pair.invoke) else {
            continue;
        };
        let outcome = pair.outcome(history);
        let evs = events.entry(key_string(&inv.key)).or_default();
        match inv.f.as_str() {
            "add" => {
                let Some(delta) = as_i64(&inv.value) else { continue };
                if delta <= 0 {
                    non_positive.entry(key_string(&inv.key)).or_insert(delta);
                }
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
    let mut unknown: Vec<String> = Vec::new();
    for (key, mut evs) in events {
        evs.sort_by_key(|(pos, _)| *pos);
        let monotonic = !non_positive.contains_key(&key);
        let (mut lower, mut upper) = (0i64, 0i64);
        // Per read (by invoke index): `lower` and the highest completed read when it was invoked.
        let mut at_invoke: BTreeMap<usize, (i64, Option<(i64, usize)>)> = BTreeMap::new();
        // The highest value an `ok` read completed with so far, and that read's invoke index.
        let mut highest_read: Option<(i64, usize)> = None;
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
                    at_invoke.insert(id, (lower, highest_read));
                }
                Ev::ReadComplete(id, n) => {
                    reads_n += 1;
                    let (lo, earlier) = at_invoke.get(&id).copied().unwrap_or((0, None));
                    last_read = Some((n, lo, upper));
                    let mut error = None;
                    if n < lo || n > upper {
                        error = Some(json!({
                            "key": key, "read_invoke_index": id, "value": n,
                            "lower": lo, "upper": upper,
                            "kind": if n < lo { "lost-increment" } else { "extra-increment" },
                        }));
                    } else if let Some((before, before_id)) = earlier.filter(|(v, _)| monotonic && n < *v) {
                        error = Some(json!({
                            "key": key, "read_invoke_index": id, "value": n,
                            "earlier_read_invoke_index": before_id, "earlier_read_value": before,
                            "kind": "read-went-backwards",
                        }));
                    }
                    if let Some(e) = error {
                        verdict = Verdict::Invalid;
                        if errors.len() < 20 {
                            errors.push(e);
                        }
                    }
                    if highest_read.is_none_or(|(v, _)| n > v) {
                        highest_read = Some((n, id));
                    }
                }
            }
        }
        let monotonic_reads = match non_positive.get(&key) {
            None => json!("checked"),
            Some(d) => {
                verdict = verdict.merge(Verdict::Unknown);
                unknown.push(format!("key {key:?} has an add of {d}"));
                json!(format!("not decidable: an add of {d} (deltas must be positive)"))
            }
        };
        per_key.insert(
            key,
            json!({
                "acknowledged": acknowledged,
                "ambiguous": upper - acknowledged,
                "final_read": last_read.map(|(n, lo, hi)| json!({"value": n, "lower": lo, "upper": hi})),
                "monotonic_reads": monotonic_reads,
            }),
        );
    }
    if reads_n == 0 {
        verdict = verdict.merge(Verdict::Unknown);
    }
    let summary = match errors.first() {
        Some(e) => format!("{} bad read(s); first: {e}", errors.len()),
        None if !unknown.is_empty() => format!(
            "{reads_n} reads within bounds; monotonic reads not decidable: {}",
            unknown.join(", ")
        ),
        None => format!(
            "{reads_n} reads within [acknowledged, acknowledged + ambiguous], none below an earlier read"
        ),
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

    /// An `info` add (outcome unknown) is seen by one read and missing from a later one: each
    /// read alone is within `[acknowledged, acknowledged + ambiguous]`, but the counter went
    /// backwards (e.g. a new leader without the entry the old one had made visible).
    #[test]
    fn read_below_an_earlier_read_is_rejected() {
        let mut h = History::default();
        add(&mut h, 0, 2, OpType::Ok);
        add(&mut h, 1, 3, OpType::Info);
        read(&mut h, 5);
        read(&mut h, 2);
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Invalid, "{}", r.summary);
        let e = &r.details["errors"][0];
        assert_eq!(e["kind"], json!("read-went-backwards"), "{e}");
        assert_eq!(
            (e["value"].clone(), e["earlier_read_value"].clone()),
            (json!(2), json!(5))
        );
    }

    /// Reads on different processes: the later one began after the earlier one completed.
    #[test]
    fn backwards_read_on_another_process_is_rejected_and_overlapping_is_not() {
        let mut h = History::default();
        add(&mut h, 0, 4, OpType::Info);
        h.push(invoke(7, "read", None, Value::Null));
        h.push(done(7, OpType::Ok, "read", None, json!(4)));
        // Invoked after 7 completed with 4: must not see less.
        h.push(invoke(8, "read", None, Value::Null));
        h.push(done(8, OpType::Ok, "read", None, json!(0)));
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Invalid, "{}", r.summary);

        let mut h = History::default();
        add(&mut h, 0, 4, OpType::Info);
        h.push(invoke(7, "read", None, Value::Null));
        h.push(invoke(8, "read", None, Value::Null));
        h.push(done(7, OpType::Ok, "read", None, json!(4)));
        h.push(done(8, OpType::Ok, "read", None, json!(0)));
        // 8 was invoked before 7 completed: concurrent reads may be ordered either way.
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Valid, "{}", r.summary);
    }

    /// Monotonic reads that each stay within bounds, with failed and ambiguous adds, pass.
    #[test]
    fn monotonic_reads_across_ambiguous_adds_are_valid() {
        let mut h = History::default();
        add(&mut h, 0, 1, OpType::Ok);
        add(&mut h, 1, 2, OpType::Info);
        read(&mut h, 1);
        add(&mut h, 2, 5, OpType::Fail);
        read(&mut h, 3);
        read(&mut h, 3);
        add(&mut h, 3, 1, OpType::Ok);
        read(&mut h, 4);
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Valid, "{}", r.summary);
        assert_eq!(r.details["keys"][""]["monotonic_reads"], json!("checked"));
    }

    /// With a non-positive add the counter may legitimately go down: the check cannot decide
    /// and says so (unknown), rather than passing silently.
    #[test]
    fn non_positive_add_makes_the_monotonic_check_unknown() {
        let mut h = History::default();
        add(&mut h, 0, 3, OpType::Ok);
        read(&mut h, 3);
        add(&mut h, 0, -1, OpType::Ok);
        read(&mut h, 2);
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Unknown, "{}", r.summary);
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
