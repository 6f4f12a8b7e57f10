//! Set checker (Jepsen's `checker/set`): unique integers are added (`f = "add"`, value = the
//! element), then read back (`f = "read"`, `ok` value = the list of elements present). Sets are
//! independent per `key`. The last `ok` read of each key is the final read.
//!
//! Invalid when, in the final read: an acknowledged add is missing (`lost`); an element appears
//! that was never added (`unexpected`); an element whose add `fail`ed appears (`failed-but-present`:
//! a write reported as failed had committed); an element appears twice (`duplicated`: the add was
//! applied more than once, an exactly-once violation). `info` adds may be present or absent
//! (`recovered` counts those present). No final read: `unknown`.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::json;

use super::{as_i64, key_string, CheckResult, Verdict};
use crate::jepsen::history::{History, OpType};

#[derive(Default)]
struct KeyState {
    ok: BTreeSet<i64>,
    info: BTreeSet<i64>,
    failed: BTreeSet<i64>,
    final_read: Option<(u64, Vec<i64>)>,
}

/// Checks set semantics; see the module doc for the anomalies.
pub fn check(history: &History) -> CheckResult {
    let mut keys: BTreeMap<String, KeyState> = BTreeMap::new();
    for pair in history.client_pairs() {
        let Some(inv) = history.ops.get(pair.invoke) else {
            continue;
        };
        let outcome = pair.outcome(history);
        let st = keys.entry(key_string(&inv.key)).or_default();
        match inv.f.as_str() {
            "add" => {
                let Some(x) = as_i64(&inv.value) else { continue };
                match outcome {
                    OpType::Ok => st.ok.insert(x),
                    OpType::Fail => st.failed.insert(x),
                    _ => st.info.insert(x),
                };
            }
            "read" if outcome == OpType::Ok => {
                let Some(done) = pair.complete.and_then(|c| history.ops.get(c)) else {
                    continue;
                };
                let elems: Vec<i64> = done
                    .value
                    .as_array()
                    .map(|a| a.iter().filter_map(as_i64).collect())
                    .unwrap_or_default();
                st.final_read = Some((done.index, elems));
            }
            _ => {}
        }
    }
    keys.retain(|_, s| {
        !(s.ok.is_empty() && s.info.is_empty() && s.failed.is_empty() && s.final_read.is_none())
    });
    let mut verdict = Verdict::Valid;
    let mut per_key = serde_json::Map::new();
    let (mut lost_n, mut unexpected_n, mut dup_n, mut failed_n, mut ok_n, mut recovered_n) =
        (0, 0, 0, 0, 0, 0);
    for (key, st) in &keys {
        ok_n += st.ok.len();
        let Some((read_index, elems)) = &st.final_read else {
            verdict = verdict.merge(Verdict::Unknown);
            per_key.insert(key.clone(), json!({"error": "no final read"}));
            continue;
        };
        let mut seen = BTreeSet::new();
        let mut duplicated = BTreeSet::new();
        for &e in elems {
            if !seen.insert(e) {
                duplicated.insert(e);
            }
        }
        let lost: Vec<i64> = st.ok.difference(&seen).copied().collect();
        let unexpected: Vec<i64> = seen
            .iter()
            .filter(|e| !st.ok.contains(e) && !st.info.contains(e) && !st.failed.contains(e))
            .copied()
            .collect();
        let failed_present: Vec<i64> = st.failed.intersection(&seen).copied().collect();
        let recovered = st.info.intersection(&seen).count();
        recovered_n += recovered;
        lost_n += lost.len();
        unexpected_n += unexpected.len();
        dup_n += duplicated.len();
        failed_n += failed_present.len();
        if !lost.is_empty() || !unexpected.is_empty() || !duplicated.is_empty() || !failed_present.is_empty()
        {
            verdict = Verdict::Invalid;
        }
        per_key.insert(
            key.clone(),
            json!({
                "final_read_index": read_index,
                "acknowledged": st.ok.len(),
                "ambiguous": st.info.len(),
                "recovered": recovered,
                "lost": lost,
                "unexpected": unexpected,
                "duplicated": duplicated,
                "failed_but_present": failed_present,
            }),
        );
    }
    if keys.is_empty() {
        verdict = Verdict::Unknown;
    }
    let summary = format!(
        "{ok_n} acknowledged adds: {lost_n} lost, {unexpected_n} unexpected, {dup_n} duplicated, \
         {failed_n} failed-but-present, {recovered_n} ambiguous recovered"
    );
    CheckResult::new("set", verdict, summary, json!({ "keys": per_key }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::jepsen::history::build::*;
    use serde_json::Value;

    fn add(h: &mut History, p: u64, x: i64, ty: OpType) {
        h.push(invoke(p, "add", None, json!(x)));
        h.push(done(p, ty, "add", None, json!(x)));
    }

    fn read(h: &mut History, elems: Value) {
        h.push(invoke(9, "read", None, Value::Null));
        h.push(done(9, OpType::Ok, "read", None, elems));
    }

    #[test]
    fn all_present_with_ambiguous_either_way_is_valid() {
        let mut h = History::default();
        add(&mut h, 0, 1, OpType::Ok);
        add(&mut h, 1, 2, OpType::Info);
        add(&mut h, 2, 3, OpType::Info);
        add(&mut h, 3, 4, OpType::Fail);
        read(&mut h, json!([1, 3]));
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Valid, "{}", r.summary);
        assert_eq!(r.details["keys"][""]["recovered"], json!(1));
    }

    #[test]
    fn lost_write_is_rejected() {
        let mut h = History::default();
        add(&mut h, 0, 1, OpType::Ok);
        add(&mut h, 0, 2, OpType::Ok);
        read(&mut h, json!([1]));
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Invalid);
        assert_eq!(r.details["keys"][""]["lost"], json!([2]));
    }

    #[test]
    fn duplicate_apply_is_rejected() {
        let mut h = History::default();
        add(&mut h, 0, 1, OpType::Ok);
        read(&mut h, json!([1, 1]));
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Invalid);
        assert_eq!(r.details["keys"][""]["duplicated"], json!([1]));
    }

    #[test]
    fn failed_add_that_appears_and_unknown_element_are_rejected() {
        let mut h = History::default();
        add(&mut h, 0, 1, OpType::Fail);
        read(&mut h, json!([1]));
        assert_eq!(check(&h).verdict, Verdict::Invalid);
        let mut h = History::default();
        add(&mut h, 0, 1, OpType::Ok);
        read(&mut h, json!([1, 77]));
        assert_eq!(check(&h).details["keys"][""]["unexpected"], json!([77]));
    }

    #[test]
    fn missing_final_read_is_unknown() {
        let mut h = History::default();
        add(&mut h, 0, 1, OpType::Ok);
        assert_eq!(check(&h).verdict, Verdict::Unknown);
    }
}
