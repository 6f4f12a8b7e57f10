//! Linearizability checker for a key-value store of registers: Wing & Gong's search with Lowe's
//! memoization (G. Lowe, "Testing for linearizability", 2017; the algorithm behind Porcupine and,
//! in spirit, Knossos's `wgl`), run independently per key (P-compositionality, Horn & Kroening).
//!
//! Register ops (history `f`, `value`):
//! - `get`: invoke `null`; `ok` value is the integer read, or `null` when the key was absent.
//! - `put`: value is the integer written.
//! - `cas`: value `[old, new]`; `ok` means the compare held and `new` was written; `fail` means
//!   the compare did not hold (no effect).
//! - `delete`: value ignored; the key becomes absent.
//!
//! `fail` ops are dropped (they did not happen). `info` (or never-completed) writes may take
//! effect at any time after their invoke, or never: their return is placed after every definite
//! return, so the search succeeds once every definite op is linearized. `info` reads tell nothing
//! and are dropped. An `info` write whose value no op ever observes (no read returns it, no cas
//! compares against it) is dropped too: with unique written values, such a write can be removed
//! from any linearization without changing any other op's legality, and keeping it would make the
//! memo table grow with every subset of pending info ops.

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

use serde_json::{json, Value};

use super::{as_i64, key_string, CheckResult, Verdict};
use crate::jepsen::history::{History, OpType};

/// Search limits for the linearizability checker.
#[derive(Debug, Clone, Copy)]
pub struct LinearizableOptions {
    /// Maximum search steps per key before the verdict becomes `unknown`.
    pub max_steps_per_key: u64,
}

impl Default for LinearizableOptions {
    fn default() -> Self {
        LinearizableOptions {
            max_steps_per_key: 20_000_000,
        }
    }
}

/// A register operation as the model sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RegisterOp {
    Get(Option<i64>),
    Put(i64),
    Cas(i64, i64),
    Delete,
}

impl RegisterOp {
    /// Applies the op to `state`; `None` when the op's recorded result is impossible in `state`.
    fn step(&self, state: Option<i64>) -> Option<Option<i64>> {
        match *self {
            RegisterOp::Get(v) => (v == state).then_some(state),
            RegisterOp::Put(v) => Some(Some(v)),
            RegisterOp::Delete => Some(None),
            RegisterOp::Cas(old, new) => (state == Some(old)).then_some(Some(new)),
        }
    }

    fn written_value(&self) -> Option<i64> {
        match *self {
            RegisterOp::Put(v) | RegisterOp::Cas(_, v) => Some(v),
            _ => None,
        }
    }
}

/// One op of a per-key sub-history.
#[derive(Debug, Clone)]
struct KeyOp {
    op: RegisterOp,
    /// History position of the invoke (for ordering and reports).
    call: usize,
    /// History position of the completion; `None` for info ops (return at "infinity").
    ret: Option<usize>,
}

/// Parses the register ops of `history`, grouped by key. Returns unparseable ops as errors.
fn register_ops(history: &History) -> (BTreeMap<String, Vec<KeyOp>>, Vec<String>) {
    let mut by_key: BTreeMap<String, Vec<KeyOp>> = BTreeMap::new();
    let mut errors = Vec::new();
    for pair in history.client_pairs() {
        let Some(inv) = history.ops.get(pair.invoke) else {
            continue;
        };
        let outcome = pair.outcome(history);
        if outcome == OpType::Fail {
            continue;
        }
        let done = pair.complete.and_then(|c| history.ops.get(c));
        let definite = outcome == OpType::Ok;
        let op = match inv.f.as_str() {
            "get" => {
                if !definite {
                    continue;
                }
                let v = done.map(|d| &d.value).unwrap_or(&Value::Null);
                if v.is_null() {
                    RegisterOp::Get(None)
                } else if let Some(n) = as_i64(v) {
                    RegisterOp::Get(Some(n))
                } else {
                    errors.push(format!("op {}: get returned non-integer {v}", inv.index));
                    continue;
                }
            }
            "put" => match as_i64(&inv.value) {
                Some(v) => RegisterOp::Put(v),
                None => {
                    errors.push(format!("op {}: put of non-integer {}", inv.index, inv.value));
                    continue;
                }
            },
            "cas" => match inv
                .value
                .as_array()
                .map(|a| a.iter().map(as_i64).collect::<Vec<_>>())
            {
                Some(v) if v.len() == 2 && v.iter().all(Option::is_some) => {
                    RegisterOp::Cas(v[0].unwrap_or_default(), v[1].unwrap_or_default())
                }
                _ => {
                    errors.push(format!(
                        "op {}: cas needs [old, new], got {}",
                        inv.index, inv.value
                    ));
                    continue;
                }
            },
            "delete" => RegisterOp::Delete,
            _ => continue,
        };
        let ret = if definite { pair.complete } else { None };
        by_key.entry(key_string(&inv.key)).or_default().push(KeyOp {
            op,
            call: pair.invoke,
            ret,
        });
    }
    // Drop unobserved info writes (see the module doc).
    for ops in by_key.values_mut() {
        let mut observed: HashSet<i64> = HashSet::new();
        for o in ops.iter() {
            match o.op {
                RegisterOp::Get(Some(v)) => {
                    observed.insert(v);
                }
                RegisterOp::Cas(old, _) => {
                    observed.insert(old);
                }
                _ => {}
            }
        }
        ops.retain(|o| o.ret.is_some() || o.op.written_value().is_none_or(|v| observed.contains(&v)));
    }
    (by_key, errors)
}

/// Outcome of the search on one key.
#[derive(Debug)]
enum KeyOutcome {
    Linearizable,
    NotLinearizable {
        /// History index of the op whose return could not be reached with a legal order.
        stuck_op: usize,
        /// Longest linearized prefix found (history indexes of invokes, in order).
        best_prefix: Vec<usize>,
        /// Register state after that prefix.
        state: Option<i64>,
    },
    Budget,
}

/// The WGL search over one key's ops.
fn check_key(ops: &[KeyOp], max_steps: u64) -> KeyOutcome {
    let n = ops.len();
    if n == 0 {
        return KeyOutcome::Linearizable;
    }
    // Entries: call and return of each op, sorted by history position; info returns last.
    // Entry ids: 1..=2n (0 is the list head). entry e: op = (e-1)/2, call if (e-1)%2 == 0.
    let mut order: Vec<(usize, usize, usize)> = Vec::with_capacity(2 * n); // (pos, tiebreak, entry)
    for (i, o) in ops.iter().enumerate() {
        order.push((o.call, 0, 1 + 2 * i));
        order.push((o.ret.unwrap_or(usize::MAX), i, 2 + 2 * i));
    }
    order.sort_unstable();
    let size = 2 * n + 1;
    let mut next = vec![usize::MAX; size];
    let mut prev = vec![usize::MAX; size];
    let mut last = 0usize;
    for &(_, _, e) in &order {
        next[last] = e;
        prev[e] = last;
        last = e;
    }
    let is_call = |e: usize| (e - 1).is_multiple_of(2);
    let op_of = |e: usize| (e - 1) / 2;
    let ret_of_call = |e: usize| e + 1;
    let is_info_return = |e: usize| !is_call(e) && ops[op_of(e)].ret.is_none();

    let words = n.div_ceil(64);
    let mut linearized = vec![0u64; words];
    let mut cache: HashSet<(Vec<u64>, Option<i64>)> = HashSet::new();
    let mut calls: Vec<(usize, Option<i64>)> = Vec::new();
    let mut state: Option<i64> = None;
    let mut entry = next[0];
    let mut steps: u64 = 0;
    let mut best_depth = 0usize;
    let mut best: Option<(usize, Vec<usize>, Option<i64>)> = None;

    loop {
        if entry == usize::MAX || is_info_return(entry) {
            return KeyOutcome::Linearizable;
        }
        steps += 1;
        if steps > max_steps {
            return KeyOutcome::Budget;
        }
        if is_call(entry) {
            let o = op_of(entry);
            let mut advanced = false;
            if let Some(new_state) = ops[o].op.step(state) {
                linearized[o / 64] |= 1 << (o % 64);
                if cache.insert((linearized.clone(), new_state)) {
                    calls.push((entry, state));
                    state = new_state;
                    // lift the call and its return
                    let r = ret_of_call(entry);
                    next[prev[entry]] = next[entry];
                    if next[entry] != usize::MAX {
                        prev[next[entry]] = prev[entry];
                    }
                    next[prev[r]] = next[r];
                    if next[r] != usize::MAX {
                        prev[next[r]] = prev[r];
                    }
                    entry = next[0];
                    advanced = true;
                } else {
                    linearized[o / 64] &= !(1 << (o % 64));
                }
            }
            if !advanced {
                entry = next[entry];
            }
        } else {
            // A return whose call is not linearized yet: backtrack.
            if calls.len() >= best_depth {
                best_depth = calls.len();
                let prefix = calls.iter().map(|&(e, _)| ops[op_of(e)].call).collect();
                best = Some((
                    ops[op_of(entry)].ret.unwrap_or(ops[op_of(entry)].call),
                    prefix,
                    state,
                ));
            }
            let Some((call_entry, old_state)) = calls.pop() else {
                let (stuck_op, best_prefix, state) = best.unwrap_or((0, Vec::new(), None));
                return KeyOutcome::NotLinearizable {
                    stuck_op,
                    best_prefix,
                    state,
                };
            };
            state = old_state;
            let o = op_of(call_entry);
            linearized[o / 64] &= !(1 << (o % 64));
            // unlift: reinsert return then call
            let r = ret_of_call(call_entry);
            next[prev[r]] = r;
            if next[r] != usize::MAX {
                prev[next[r]] = r;
            }
            next[prev[call_entry]] = call_entry;
            if next[call_entry] != usize::MAX {
                prev[next[call_entry]] = call_entry;
            }
            entry = next[call_entry];
        }
    }
}

/// Checks that the register ops of `history` are linearizable, key by key.
///
/// Verdict: `invalid` with the first non-linearizable key (the op that could not be placed, the
/// longest legal prefix and the register state after it); `unknown` when a key exhausts
/// `options.max_steps_per_key` or an op cannot be parsed.
pub fn check(history: &History, options: LinearizableOptions) -> CheckResult {
    let started = Instant::now();
    let (by_key, errors) = register_ops(history);
    let mut verdict = Verdict::Valid;
    let mut anomalies = Vec::new();
    let mut unknown_keys = Vec::new();
    let mut op_count = 0usize;
    for (key, ops) in &by_key {
        op_count += ops.len();
        match check_key(ops, options.max_steps_per_key) {
            KeyOutcome::Linearizable => {}
            KeyOutcome::Budget => {
                verdict = verdict.merge(Verdict::Unknown);
                unknown_keys.push(key.clone());
            }
            KeyOutcome::NotLinearizable {
                stuck_op,
                best_prefix,
                state,
            } => {
                verdict = Verdict::Invalid;
                let op = history.ops.get(stuck_op).cloned();
                anomalies.push(json!({
                    "key": key,
                    "op": op,
                    "state_before": state,
                    "linearized_prefix_invokes": best_prefix.iter().rev().take(20).rev().collect::<Vec<_>>(),
                }));
            }
        }
    }
    if !errors.is_empty() {
        verdict = verdict.merge(Verdict::Unknown);
    }
    let elapsed_ms = started.elapsed().as_millis() as u64;
    let summary = match verdict {
        Verdict::Valid => format!(
            "{op_count} ops on {} keys linearizable ({elapsed_ms} ms)",
            by_key.len()
        ),
        Verdict::Invalid => {
            let first = &anomalies[0];
            format!(
                "{} key(s) not linearizable; first: key {} at op {} (register was {})",
                anomalies.len(),
                first["key"],
                first["op"]["index"],
                first["state_before"]
            )
        }
        _ => format!(
            "undecided: {} key(s) over the search budget, {} unparseable op(s)",
            unknown_keys.len(),
            errors.len()
        ),
    };
    CheckResult::new(
        "linearizable",
        verdict,
        summary,
        json!({
            "keys": by_key.len(),
            "ops": op_count,
            "elapsed_ms": elapsed_ms,
            "anomalies": anomalies,
            "unknown_keys": unknown_keys,
            "errors": errors,
        }),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::jepsen::history::build::*;
    use crate::jepsen::history::Op;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn k() -> Option<Value> {
        Some(json!("k"))
    }

    fn run(h: &History) -> CheckResult {
        check(h, LinearizableOptions::default())
    }

    #[test]
    fn sequential_history_is_valid() {
        let mut h = History::default();
        h.push(invoke(0, "get", k(), Value::Null));
        h.push(done(0, OpType::Ok, "get", k(), Value::Null));
        h.push(invoke(0, "put", k(), json!(1)));
        h.push(done(0, OpType::Ok, "put", k(), json!(1)));
        h.push(invoke(1, "cas", k(), json!([1, 2])));
        h.push(done(1, OpType::Ok, "cas", k(), json!([1, 2])));
        h.push(invoke(1, "get", k(), Value::Null));
        h.push(done(1, OpType::Ok, "get", k(), json!(2)));
        assert_eq!(run(&h).verdict, Verdict::Valid);
    }

    #[test]
    fn stale_read_is_rejected() {
        // put 1 completes, put 2 completes, then a read returns 1: stale.
        let mut h = History::default();
        h.push(invoke(0, "put", k(), json!(1)));
        h.push(done(0, OpType::Ok, "put", k(), json!(1)));
        h.push(invoke(0, "put", k(), json!(2)));
        h.push(done(0, OpType::Ok, "put", k(), json!(2)));
        h.push(invoke(1, "get", k(), Value::Null));
        h.push(done(1, OpType::Ok, "get", k(), json!(1)));
        let r = run(&h);
        assert_eq!(r.verdict, Verdict::Invalid, "{r:?}");
        assert_eq!(r.details["anomalies"][0]["op"]["index"], json!(5));
        assert_eq!(r.details["anomalies"][0]["state_before"], json!(2));
    }

    #[test]
    fn lost_write_is_rejected() {
        // put 1 acknowledged, a later read sees the key absent.
        let mut h = History::default();
        h.push(invoke(0, "put", k(), json!(1)));
        h.push(done(0, OpType::Ok, "put", k(), json!(1)));
        h.push(invoke(1, "get", k(), Value::Null));
        h.push(done(1, OpType::Ok, "get", k(), Value::Null));
        assert_eq!(run(&h).verdict, Verdict::Invalid);
    }

    #[test]
    fn concurrent_ops_may_take_either_order() {
        // put 1 and get overlap: the get may see nothing or 1.
        for seen in [Value::Null, json!(1)] {
            let mut h = History::default();
            h.push(invoke(0, "put", k(), json!(1)));
            h.push(invoke(1, "get", k(), Value::Null));
            h.push(done(1, OpType::Ok, "get", k(), seen.clone()));
            h.push(done(0, OpType::Ok, "put", k(), json!(1)));
            assert_eq!(run(&h).verdict, Verdict::Valid, "seen {seen}");
        }
    }

    #[test]
    fn failed_write_that_is_read_is_rejected() {
        let mut h = History::default();
        h.push(invoke(0, "put", k(), json!(7)));
        h.push(done(0, OpType::Fail, "put", k(), json!(7)));
        h.push(invoke(1, "get", k(), Value::Null));
        h.push(done(1, OpType::Ok, "get", k(), json!(7)));
        assert_eq!(run(&h).verdict, Verdict::Invalid);
    }

    #[test]
    fn info_write_may_take_effect_late_or_never() {
        // put 5 times out; later reads see nothing, then 5: valid (it took effect late).
        let mut h = History::default();
        h.push(invoke(0, "put", k(), json!(5)));
        h.push(done(0, OpType::Info, "put", k(), json!(5)).with_error("timeout"));
        h.push(invoke(1, "get", k(), Value::Null));
        h.push(done(1, OpType::Ok, "get", k(), Value::Null));
        h.push(invoke(1, "get", k(), Value::Null));
        h.push(done(1, OpType::Ok, "get", k(), json!(5)));
        assert_eq!(run(&h).verdict, Verdict::Valid);
        // never observed at all: also valid
        let mut h2 = History::default();
        h2.push(invoke(0, "put", k(), json!(5)));
        h2.push(done(0, OpType::Info, "put", k(), json!(5)));
        h2.push(invoke(1, "get", k(), Value::Null));
        h2.push(done(1, OpType::Ok, "get", k(), Value::Null));
        assert_eq!(run(&h2).verdict, Verdict::Valid);
    }

    #[test]
    fn info_write_cannot_take_effect_before_its_invoke() {
        let mut h = History::default();
        h.push(invoke(1, "get", k(), Value::Null));
        h.push(done(1, OpType::Ok, "get", k(), json!(5)));
        h.push(invoke(0, "put", k(), json!(5)));
        h.push(done(0, OpType::Info, "put", k(), json!(5)));
        assert_eq!(run(&h).verdict, Verdict::Invalid);
    }

    #[test]
    fn value_flip_flop_is_rejected() {
        // Two completed reads see 2 then 1 while both writes completed before: not linearizable.
        let mut h = History::default();
        h.push(invoke(0, "put", k(), json!(1)));
        h.push(invoke(1, "put", k(), json!(2)));
        h.push(done(0, OpType::Ok, "put", k(), json!(1)));
        h.push(done(1, OpType::Ok, "put", k(), json!(2)));
        h.push(invoke(2, "get", k(), Value::Null));
        h.push(done(2, OpType::Ok, "get", k(), json!(2)));
        h.push(invoke(2, "get", k(), Value::Null));
        h.push(done(2, OpType::Ok, "get", k(), json!(1)));
        assert_eq!(run(&h).verdict, Verdict::Invalid);
    }

    #[test]
    fn keys_are_checked_independently() {
        let mut h = History::default();
        h.push(invoke(0, "put", Some(json!("a")), json!(1)));
        h.push(done(0, OpType::Ok, "put", Some(json!("a")), json!(1)));
        h.push(invoke(0, "get", Some(json!("b")), Value::Null));
        h.push(done(0, OpType::Ok, "get", Some(json!("b")), Value::Null));
        h.push(invoke(0, "get", Some(json!("a")), Value::Null));
        h.push(done(0, OpType::Ok, "get", Some(json!("a")), json!(1)));
        assert_eq!(run(&h).verdict, Verdict::Valid);
        h.push(invoke(0, "get", Some(json!("b")), Value::Null));
        h.push(done(0, OpType::Ok, "get", Some(json!("b")), json!(1)));
        assert_eq!(run(&h).verdict, Verdict::Invalid);
    }

    #[test]
    fn cas_against_wrong_state_is_rejected() {
        let mut h = History::default();
        h.push(invoke(0, "put", k(), json!(1)));
        h.push(done(0, OpType::Ok, "put", k(), json!(1)));
        h.push(invoke(0, "cas", k(), json!([3, 4])));
        h.push(done(0, OpType::Ok, "cas", k(), json!([3, 4])));
        assert_eq!(run(&h).verdict, Verdict::Invalid);
    }

    /// Generates a valid single-register history: each op takes effect atomically at a random
    /// moment between its invoke and completion; some completions are lost (info).
    pub(crate) fn simulated_register_history(
        seed: u64,
        processes: u64,
        op_count: usize,
        keys: u64,
    ) -> History {
        #[derive(Clone)]
        struct Pending {
            process: u64,
            f: &'static str,
            key: u64,
            arg: Value,
            result: Option<Value>,
            ok: bool,
        }
        let mut rng = StdRng::seed_from_u64(seed);
        let mut h = History::default();
        let mut state: BTreeMap<u64, Option<i64>> = BTreeMap::new();
        let mut slots: Vec<Option<Pending>> = vec![None; processes as usize];
        let mut proc_ids: Vec<u64> = (0..processes).collect();
        let mut next_proc = processes;
        let mut next_value = 1i64;
        let mut started = 0usize;
        while started < op_count || slots.iter().any(Option::is_some) {
            let s = rng.gen_range(0..processes as usize);
            match slots[s].clone() {
                None if started < op_count => {
                    started += 1;
                    let key = rng.gen_range(0..keys);
                    let (f, arg) = match rng.gen_range(0..10) {
                        0..=4 => ("get", Value::Null),
                        5..=7 => {
                            next_value += 1;
                            ("put", json!(next_value))
                        }
                        _ => {
                            next_value += 1;
                            let old = state.get(&key).copied().flatten().unwrap_or(0);
                            let old = if rng.gen_bool(0.7) { old } else { old + 1 };
                            ("cas", json!([old, next_value]))
                        }
                    };
                    h.push(invoke(proc_ids[s], f, Some(json!(key)), arg.clone()));
                    slots[s] = Some(Pending {
                        process: proc_ids[s],
                        f,
                        key,
                        arg,
                        result: None,
                        ok: true,
                    });
                }
                None => {}
                Some(mut p) if p.result.is_none() => {
                    // take effect now
                    let cur = state.get(&p.key).copied().flatten();
                    let (res, ok) = match p.f {
                        "get" => (cur.map(|v| json!(v)).unwrap_or(Value::Null), true),
                        "put" => {
                            state.insert(p.key, as_i64(&p.arg));
                            (p.arg.clone(), true)
                        }
                        _ => {
                            let a = p.arg.as_array().unwrap();
                            if cur == as_i64(&a[0]) {
                                state.insert(p.key, as_i64(&a[1]));
                                (p.arg.clone(), true)
                            } else {
                                (p.arg.clone(), false)
                            }
                        }
                    };
                    p.result = Some(res);
                    p.ok = ok;
                    slots[s] = Some(p);
                }
                Some(p) => {
                    let lost = rng.gen_bool(0.01);
                    let ty = if lost {
                        OpType::Info
                    } else if p.ok {
                        OpType::Ok
                    } else {
                        OpType::Fail
                    };
                    let mut op: Op = done(p.process, ty, p.f, Some(json!(p.key)), p.result.unwrap());
                    if lost {
                        op = op.with_error("timeout");
                        proc_ids[s] = next_proc;
                        next_proc += 1;
                    }
                    h.push(op);
                    slots[s] = None;
                }
            }
        }
        h
    }

    #[test]
    fn simulated_register_histories_are_valid() {
        for seed in 0..20 {
            let h = simulated_register_history(seed, 5, 300, 2);
            let r = run(&h);
            assert_eq!(r.verdict, Verdict::Valid, "seed {seed}: {}", r.summary);
        }
    }

    #[test]
    fn corrupting_one_read_of_a_simulated_history_is_caught() {
        let mut caught = 0;
        for seed in 0..20 {
            let mut h = simulated_register_history(seed, 5, 300, 1);
            // Change the last ok get that read a value to a value never written.
            if let Some(op) = h
                .ops
                .iter_mut()
                .rev()
                .find(|o| o.op_type == OpType::Ok && o.f == "get" && !o.value.is_null())
            {
                op.value = json!(-99);
                caught += usize::from(run(&h).verdict == Verdict::Invalid);
            }
        }
        assert!(caught >= 15, "caught {caught}");
    }

    #[test]
    fn ten_thousand_ops_ten_processes_decided_valid() {
        let h = simulated_register_history(42, 10, 10_000, 1);
        let started = Instant::now();
        let r = run(&h);
        eprintln!(
            "linearizable: 10000 ops, 10 processes, 1 key: {} in {:?}",
            r.verdict,
            started.elapsed()
        );
        assert_eq!(r.verdict, Verdict::Valid, "{}", r.summary);
    }
}
