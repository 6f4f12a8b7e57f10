//! List-append checker after Elle (Kingsbury & Alvaro, "Elle: Inferring Isolation Anomalies from
//! Experimental Observations", VLDB 2020), using Adya's anomaly names (G0, G1a, G1b, G1c,
//! G-single, G2) and strict serializability (real-time edges).
//!
//! History shape: `f = "txn"`, value = a list of micro-ops `["append", key, element]` and
//! `["r", key, list-or-null]`; the `ok` completion carries the read lists. Every appended element
//! is unique per key. Keys are JSON numbers or strings.
//!
//! Analysis:
//! 1. Non-cycle anomalies: an element that nobody appended (`garbage`), an element twice in one
//!    read (`duplicate-elements`, an append applied twice), an element appended by a `fail`ed txn
//!    (`G1a`, aborted read), a read ending in an element its txn later overwrote in the same key
//!    (`G1b`, intermediate read), a txn not seeing its own earlier appends (`internal`), and two
//!    reads of a key that are not prefixes of each other (`incompatible-order`).
//! 2. The version order of each key is its longest read; appends never read come after it.
//! 3. A graph over committed txns (`ok`, and `info` ones whose appends were read) with edges
//!    ww (consecutive versions), wr (writer of a read's last element to the reader), rw (reader
//!    to the writer of the next version) and rt (real time: completed before the other invoked;
//!    transitively reduced with a frontier sweep).
//! 4. Strongly connected components (Tarjan); inside each, cycles are classified: ww only = G0,
//!    ww+wr = G1c, exactly one rw = G-single, two or more rw = G2; cycles that need an rt edge
//!    get the `-realtime` suffix (a strict-serializability violation).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use serde_json::{json, Value};

use super::{as_i64, CheckResult, Verdict};
use crate::jepsen::history::{History, OpType};

const WW: u8 = 1;
const WR: u8 = 2;
const RW: u8 = 4;
const RT: u8 = 8;

fn edge_name(mask: u8) -> &'static str {
    if mask & WW != 0 {
        "ww"
    } else if mask & WR != 0 {
        "wr"
    } else if mask & RW != 0 {
        "rw"
    } else {
        "rt"
    }
}

#[derive(Debug, Clone)]
enum MicroOp {
    Append(String, i64),
    Read(String, Option<Vec<i64>>),
}

#[derive(Debug)]
struct Txn {
    /// History index of the invoke (txns are named by it in reports).
    invoke_index: u64,
    invoke_pos: usize,
    complete_pos: Option<usize>,
    outcome: OpType,
    mops: Vec<MicroOp>,
}

fn key_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn parse_mops(v: &Value) -> Option<Vec<MicroOp>> {
    let mut out = Vec::new();
    for m in v.as_array()? {
        let m = m.as_array()?;
        let f = m.first()?.as_str()?;
        let k = key_of(m.get(1)?);
        match f {
            "append" => out.push(MicroOp::Append(k, as_i64(m.get(2)?)?)),
            "r" => {
                let list = match m.get(2) {
                    None | Some(Value::Null) => None,
                    Some(Value::Array(a)) => Some(a.iter().map(as_i64).collect::<Option<Vec<i64>>>()?),
                    Some(_) => return None,
                };
                out.push(MicroOp::Read(k, list))
            }
            _ => return None,
        }
    }
    Some(out)
}

/// Dependency graph over txn ids (positions in the txn list).
#[derive(Default)]
struct Graph {
    edges: BTreeMap<(usize, usize), u8>,
}

impl Graph {
    fn add(&mut self, from: usize, to: usize, kind: u8) {
        if from != to {
            *self.edges.entry((from, to)).or_insert(0) |= kind;
        }
    }

    fn adjacency(&self, allowed: u8, nodes: &BTreeSet<usize>) -> HashMap<usize, Vec<(usize, u8)>> {
        let mut adj: HashMap<usize, Vec<(usize, u8)>> = HashMap::new();
        for (&(a, b), &m) in &self.edges {
            if m & allowed != 0 && nodes.contains(&a) && nodes.contains(&b) {
                adj.entry(a).or_default().push((b, m & allowed));
            }
        }
        adj
    }
}

/// Tarjan's strongly connected components (iterative); returns components with more than one node.
fn sccs(nodes: &BTreeSet<usize>, adj: &HashMap<usize, Vec<(usize, u8)>>) -> Vec<BTreeSet<usize>> {
    let mut index: HashMap<usize, usize> = HashMap::new();
    let mut low: HashMap<usize, usize> = HashMap::new();
    let mut on_stack: BTreeSet<usize> = BTreeSet::new();
    let mut stack: Vec<usize> = Vec::new();
    let mut out = Vec::new();
    let mut counter = 0usize;
    let empty = Vec::new();
    for &root in nodes {
        if index.contains_key(&root) {
            continue;
        }
        let mut work: Vec<(usize, usize)> = vec![(root, 0)];
        index.insert(root, counter);
        low.insert(root, counter);
        counter += 1;
        stack.push(root);
        on_stack.insert(root);
        while let Some(&mut (v, ref mut i)) = work.last_mut() {
            let succ = adj.get(&v).unwrap_or(&empty);
            if *i < succ.len() {
                let w = succ[*i].0;
                *i += 1;
                if let std::collections::hash_map::Entry::Vacant(slot) = index.entry(w) {
                    slot.insert(counter);
                    low.insert(w, counter);
                    counter += 1;
                    stack.push(w);
                    on_stack.insert(w);
                    work.push((w, 0));
                } else if on_stack.contains(&w) {
                    let lw = index[&w].min(low[&v]);
                    low.insert(v, lw);
                }
            } else {
                work.pop();
                if let Some(&(parent, _)) = work.last() {
                    let lp = low[&parent].min(low[&v]);
                    low.insert(parent, lp);
                }
                if low[&v] == index[&v] {
                    let mut comp = BTreeSet::new();
                    while let Some(w) = stack.pop() {
                        on_stack.remove(&w);
                        comp.insert(w);
                        if w == v {
                            break;
                        }
                    }
                    if comp.len() > 1 {
                        out.push(comp);
                    }
                }
            }
        }
    }
    out
}

/// Shortest path from `from` to `to` (BFS); returns the edges as (node, mask-to-next) pairs.
fn path(adj: &HashMap<usize, Vec<(usize, u8)>>, from: usize, to: usize) -> Option<Vec<(usize, u8)>> {
    let mut parent: HashMap<usize, (usize, u8)> = HashMap::new();
    let mut queue = VecDeque::from([from]);
    let mut seen = BTreeSet::from([from]);
    while let Some(v) = queue.pop_front() {
        for &(w, m) in adj.get(&v).map(Vec::as_slice).unwrap_or(&[]) {
            if seen.insert(w) {
                parent.insert(w, (v, m));
                if w == to {
                    let mut steps = Vec::new();
                    let mut cur = to;
                    while cur != from {
                        let (p, m) = parent[&cur];
                        steps.push((p, m));
                        cur = p;
                    }
                    steps.reverse();
                    return Some(steps);
                }
                queue.push_back(w);
            }
        }
    }
    None
}

/// Any cycle inside `comp` using edges in `allowed`; `None` when that subgraph is acyclic.
fn cycle_in(graph: &Graph, comp: &BTreeSet<usize>, allowed: u8) -> Option<Vec<(usize, u8)>> {
    let adj = graph.adjacency(allowed, comp);
    let sub = sccs(comp, &adj);
    let c = sub.first()?;
    let adj = graph.adjacency(allowed, c);
    let start = *c.iter().next()?;
    // a cycle through start: an edge start->w, then a path w->start
    for &(w, m) in adj.get(&start)? {
        if let Some(mut rest) = path(&adj, w, start) {
            let mut cyc = vec![(start, m)];
            cyc.append(&mut rest);
            return Some(cyc);
        }
    }
    None
}

/// A cycle with exactly one rw edge and the others in `others`.
fn single_rw_cycle(graph: &Graph, comp: &BTreeSet<usize>, others: u8) -> Option<Vec<(usize, u8)>> {
    let adj = graph.adjacency(others, comp);
    for (&(a, b), &m) in &graph.edges {
        if m & RW != 0 && comp.contains(&a) && comp.contains(&b) {
            if let Some(mut rest) = path(&adj, b, a) {
                let mut cyc = vec![(a, RW)];
                cyc.append(&mut rest);
                return Some(cyc);
            }
        }
    }
    None
}

/// Checks a list-append history; see the module doc.
pub fn check(history: &History) -> CheckResult {
    let mut txns: Vec<Txn> = Vec::new();
    let mut parse_errors = Vec::new();
    for pair in history.client_pairs() {
        let Some(inv) = history.ops.get(pair.invoke) else {
            continue;
        };
        if inv.f != "txn" {
            continue;
        }
        let outcome = pair.outcome(history);
        let source = match (outcome, pair.complete.and_then(|c| history.ops.get(c))) {
            (OpType::Ok, Some(done)) => &done.value,
            _ => &inv.value,
        };
        match parse_mops(source) {
            Some(mops) => txns.push(Txn {
                invoke_index: inv.index,
                invoke_pos: pair.invoke,
                complete_pos: pair.complete,
                outcome,
                mops,
            }),
            None => parse_errors.push(inv.index),
        }
    }

    let mut anomalies: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut note = |kind: &str, v: Value| {
        let list = anomalies.entry(kind.to_string()).or_default();
        if list.len() < 10 {
            list.push(v);
        }
    };

    // Who appended what; the final append of each txn per key.
    let mut writer: HashMap<(String, i64), usize> = HashMap::new();
    let mut final_append: HashMap<(usize, String), i64> = HashMap::new();
    for (t, txn) in txns.iter().enumerate() {
        for m in &txn.mops {
            if let MicroOp::Append(k, v) = m {
                writer.insert((k.clone(), *v), t);
                final_append.insert((t, k.clone()), *v);
            }
        }
    }

    // Reads of ok txns: non-cycle anomalies, external reads, version orders.
    let mut reads_by_key: BTreeMap<String, Vec<Vec<i64>>> = BTreeMap::new();
    let mut external_reads: Vec<(usize, String, Vec<i64>)> = Vec::new();
    let mut observed: BTreeSet<(String, i64)> = BTreeSet::new();
    for (t, txn) in txns.iter().enumerate() {
        if txn.outcome != OpType::Ok {
            continue;
        }
        let mut own_appends: HashMap<&str, Vec<i64>> = HashMap::new();
        let mut known: HashMap<&str, Vec<i64>> = HashMap::new();
        for m in &txn.mops {
            match m {
                MicroOp::Append(k, v) => {
                    own_appends.entry(k).or_default().push(*v);
                    if let Some(kn) = known.get_mut(k.as_str()) {
                        kn.push(*v);
                    }
                }
                MicroOp::Read(k, list) => {
                    let Some(list) = list else { continue };
                    // internal consistency
                    let expected_ok = match known.get(k.as_str()) {
                        Some(kn) => kn == list,
                        None => {
                            let own = own_appends.get(k.as_str()).map(Vec::as_slice).unwrap_or(&[]);
                            list.ends_with(own)
                        }
                    };
                    if !expected_ok {
                        note(
                            "internal",
                            json!({"txn": txn.invoke_index, "key": k, "read": list}),
                        );
                    }
                    known.insert(k, list.clone());
                    let mut seen = BTreeSet::new();
                    for &e in list {
                        if !seen.insert(e) {
                            note(
                                "duplicate-elements",
                                json!({"txn": txn.invoke_index, "key": k, "element": e}),
                            );
                        }
                        observed.insert((k.clone(), e));
                        match writer.get(&(k.clone(), e)) {
                            None => note(
                                "garbage",
                                json!({"txn": txn.invoke_index, "key": k, "element": e}),
                            ),
                            Some(&w) if txns[w].outcome == OpType::Fail => note(
                                "G1a",
                                json!({"reader": txn.invoke_index, "writer": txns[w].invoke_index, "key": k, "element": e}),
                            ),
                            _ => {}
                        }
                    }
                    if let Some(&last) = list.last() {
                        if let Some(&w) = writer.get(&(k.clone(), last)) {
                            if w != t && final_append.get(&(w, k.clone())) != Some(&last) {
                                note(
                                    "G1b",
                                    json!({"reader": txn.invoke_index, "writer": txns[w].invoke_index, "key": k, "element": last}),
                                );
                            }
                        }
                    }
                    reads_by_key.entry(k.clone()).or_default().push(list.clone());
                    if !own_appends.contains_key(k.as_str()) {
                        external_reads.push((t, k.clone(), list.clone()));
                    }
                }
            }
        }
    }

    // Version order per key: the longest read; every read must be a prefix of it.
    let mut order: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (k, reads) in &reads_by_key {
        let longest = reads.iter().max_by_key(|r| r.len()).cloned().unwrap_or_default();
        for r in reads {
            if !longest.starts_with(r) {
                note(
                    "incompatible-order",
                    json!({"key": k, "read": r, "longest": longest}),
                );
            }
        }
        order.insert(k.clone(), longest);
    }

    // Committed txns: ok, or info/fail whose appends were observed (fail ones are G1a above).
    let committed: BTreeSet<usize> =
        txns.iter()
            .enumerate()
            .filter(|(_, txn)| {
                txn.outcome == OpType::Ok
                    || (txn.outcome == OpType::Info
                        && txn.mops.iter().any(
                            |m| matches!(m, MicroOp::Append(k, v) if observed.contains(&(k.clone(), *v))),
                        ))
            })
            .map(|(t, _)| t)
            .collect();

    let mut graph = Graph::default();
    // Unobserved committed appends per key (after the version order, order among them unknown).
    let mut unobserved: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
    for &t in &committed {
        if txns[t].outcome != OpType::Ok {
            continue;
        }
        for m in &txns[t].mops {
            if let MicroOp::Append(k, v) = m {
                if !observed.contains(&(k.clone(), *v)) {
                    unobserved.entry(k.clone()).or_default().insert(t);
                }
            }
        }
    }
    for (k, vs) in &order {
        let ws: Vec<Option<usize>> = vs.iter().map(|v| writer.get(&(k.clone(), *v)).copied()).collect();
        for pair in ws.windows(2) {
            if let (Some(a), Some(b)) = (pair[0], pair[1]) {
                graph.add(a, b, WW);
            }
        }
        if let (Some(Some(last)), Some(later)) = (ws.last(), unobserved.get(k)) {
            for &b in later {
                graph.add(*last, b, WW);
            }
        }
    }
    for (reader, k, list) in &external_reads {
        let vs = order.get(k).map(Vec::as_slice).unwrap_or(&[]);
        if let Some(last) = list.last() {
            if let Some(&w) = writer.get(&(k.clone(), *last)) {
                graph.add(w, *reader, WR);
            }
        }
        if !vs.starts_with(list) {
            continue;
        }
        match vs.get(list.len()) {
            Some(next) => {
                if let Some(&w) = writer.get(&(k.clone(), *next)) {
                    graph.add(*reader, w, RW);
                }
            }
            None => {
                for &w in unobserved
                    .get(k)
                    .map(|s| s.iter().collect::<Vec<_>>())
                    .unwrap_or_default()
                {
                    graph.add(*reader, w, RW);
                }
            }
        }
    }
    // Real-time edges: frontier sweep over invoke/complete events in history order.
    let mut events: Vec<(usize, bool, usize)> = Vec::new(); // (pos, is_complete, txn)
    for &t in &committed {
        events.push((txns[t].invoke_pos, false, t));
        if txns[t].outcome == OpType::Ok {
            if let Some(c) = txns[t].complete_pos {
                events.push((c, true, t));
            }
        }
    }
    events.sort_unstable();
    let mut frontier: BTreeSet<usize> = BTreeSet::new();
    let mut preds: HashMap<usize, Vec<usize>> = HashMap::new();
    for (_, is_complete, t) in events {
        if is_complete {
            for p in preds.get(&t).map(Vec::as_slice).unwrap_or(&[]) {
                frontier.remove(p);
            }
            frontier.insert(t);
        } else {
            let ps: Vec<usize> = frontier.iter().copied().collect();
            for &p in &ps {
                graph.add(p, t, RT);
            }
            preds.insert(t, ps);
        }
    }

    // Cycles.
    let all = WW | WR | RW | RT;
    let full_adj = graph.adjacency(all, &committed);
    let components = sccs(&committed, &full_adj);
    let describe = |cyc: &[(usize, u8)]| -> Value {
        Value::Array(
            cyc.iter()
                .map(|&(t, m)| json!({"txn": txns[t].invoke_index, "edge_to_next": edge_name(m)}))
                .collect(),
        )
    };
    for comp in &components {
        let found: Option<(&str, Vec<(usize, u8)>)> = cycle_in(&graph, comp, WW)
            .map(|c| ("G0", c))
            .or_else(|| cycle_in(&graph, comp, WW | WR).map(|c| ("G1c", c)))
            .or_else(|| single_rw_cycle(&graph, comp, WW | WR).map(|c| ("G-single", c)))
            .or_else(|| cycle_in(&graph, comp, WW | WR | RW).map(|c| ("G2", c)))
            .or_else(|| single_rw_cycle(&graph, comp, WW | WR | RT).map(|c| ("G-single-realtime", c)))
            .or_else(|| {
                cycle_in(&graph, comp, all).map(|c| {
                    let rws = c.iter().filter(|(_, m)| edge_name(*m) == "rw").count();
                    let wrs = c.iter().filter(|(_, m)| edge_name(*m) == "wr").count();
                    let name = match (rws, wrs) {
                        (0, 0) => "G0-realtime",
                        (0, _) => "G1c-realtime",
                        _ => "G2-realtime",
                    };
                    (name, c)
                })
            });
        if let Some((name, cyc)) = found {
            note(
                name,
                json!({"cycle": describe(&cyc), "component_size": comp.len()}),
            );
        }
    }

    let verdict = if !anomalies.is_empty() {
        Verdict::Invalid
    } else if !parse_errors.is_empty() {
        Verdict::Unknown
    } else {
        Verdict::Valid
    };
    let ok_count = txns.iter().filter(|t| t.outcome == OpType::Ok).count();
    let summary = if anomalies.is_empty() {
        format!(
            "{ok_count} committed txns over {} keys, {} dependency edges: no anomaly",
            order.len(),
            graph.edges.len()
        )
    } else {
        format!(
            "anomalies: {}",
            anomalies.keys().cloned().collect::<Vec<_>>().join(", ")
        )
    };
    CheckResult::new(
        "append",
        verdict,
        summary,
        json!({
            "txns": txns.len(),
            "committed": committed.len(),
            "anomaly_types": anomalies.keys().collect::<Vec<_>>(),
            "anomalies": anomalies,
            "unparseable_ops": parse_errors,
        }),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::jepsen::history::build::*;

    /// Adds a txn that completes at once: `mops` as completed (reads filled in).
    fn txn(h: &mut History, p: u64, ty: OpType, mops: Value) {
        h.push(invoke(p, "txn", None, mops.clone()));
        h.push(done(p, ty, "txn", None, mops));
    }

    /// Two concurrent ok txns (both invoked before either completes).
    fn concurrent(h: &mut History, a: Value, b: Value) {
        h.push(invoke(0, "txn", None, a.clone()));
        h.push(invoke(1, "txn", None, b.clone()));
        h.push(done(0, OpType::Ok, "txn", None, a));
        h.push(done(1, OpType::Ok, "txn", None, b));
    }

    fn kinds(r: &CheckResult) -> Vec<String> {
        r.details["anomaly_types"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn serial_history_is_valid() {
        let mut h = History::default();
        txn(&mut h, 0, OpType::Ok, json!([["append", 1, 1], ["r", 2, []]]));
        txn(
            &mut h,
            1,
            OpType::Ok,
            json!([["r", 1, [1]], ["append", 2, 1], ["append", 1, 2]]),
        );
        txn(&mut h, 0, OpType::Ok, json!([["r", 1, [1, 2]], ["r", 2, [1]]]));
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Valid, "{}", r.details);
    }

    #[test]
    fn ambiguous_txns_observed_or_not_are_valid() {
        let mut h = History::default();
        h.push(invoke(5, "txn", None, json!([["append", 1, 1]])));
        h.push(done(5, OpType::Info, "txn", None, json!([["append", 1, 1]])));
        h.push(invoke(6, "txn", None, json!([["append", 1, 2]])));
        h.push(done(6, OpType::Info, "txn", None, json!([["append", 1, 2]])));
        txn(&mut h, 0, OpType::Ok, json!([["r", 1, [2]]]));
        txn(&mut h, 0, OpType::Ok, json!([["r", 1, [2]]]));
        let r = check(&h);
        assert_eq!(r.verdict, Verdict::Valid, "{}", r.details);
    }

    #[test]
    fn aborted_read_g1a_is_rejected() {
        let mut h = History::default();
        txn(&mut h, 0, OpType::Fail, json!([["append", 1, 1]]));
        txn(&mut h, 1, OpType::Ok, json!([["r", 1, [1]]]));
        assert_eq!(kinds(&check(&h)), vec!["G1a"]);
    }

    #[test]
    fn intermediate_read_g1b_is_rejected() {
        let mut h = History::default();
        concurrent(
            &mut h,
            json!([["append", 1, 1], ["append", 1, 2]]),
            json!([["r", 1, [1]]]),
        );
        assert!(kinds(&check(&h)).contains(&"G1b".to_string()));
    }

    #[test]
    fn duplicate_apply_and_garbage_are_rejected() {
        let mut h = History::default();
        txn(&mut h, 0, OpType::Ok, json!([["append", 1, 1]]));
        txn(&mut h, 1, OpType::Ok, json!([["r", 1, [1, 1]]]));
        assert!(kinds(&check(&h)).contains(&"duplicate-elements".to_string()));
        let mut h = History::default();
        txn(&mut h, 1, OpType::Ok, json!([["r", 1, [9]]]));
        assert_eq!(kinds(&check(&h)), vec!["garbage"]);
    }

    #[test]
    fn g_single_read_skew_is_rejected() {
        // T0 appends x=1 and y=1; T1 sees x's append but not y's.
        let mut h = History::default();
        concurrent(
            &mut h,
            json!([["append", "x", 1], ["append", "y", 1]]),
            json!([["r", "x", [1]], ["r", "y", []]]),
        );
        txn(&mut h, 2, OpType::Ok, json!([["r", "y", [1]]]));
        let r = check(&h);
        assert_eq!(kinds(&r), vec!["G-single"], "{}", r.details);
    }

    #[test]
    fn write_skew_g2_is_rejected() {
        let mut h = History::default();
        concurrent(
            &mut h,
            json!([["r", "x", []], ["append", "y", 1]]),
            json!([["r", "y", []], ["append", "x", 1]]),
        );
        txn(&mut h, 2, OpType::Ok, json!([["r", "x", [1]], ["r", "y", [1]]]));
        let r = check(&h);
        assert_eq!(kinds(&r), vec!["G2"], "{}", r.details);
    }

    #[test]
    fn write_cycle_g0_is_rejected() {
        let mut h = History::default();
        concurrent(
            &mut h,
            json!([["append", "x", 1], ["append", "y", 1]]),
            json!([["append", "x", 2], ["append", "y", 2]]),
        );
        txn(
            &mut h,
            2,
            OpType::Ok,
            json!([["r", "x", [1, 2]], ["r", "y", [2, 1]]]),
        );
        let r = check(&h);
        assert!(kinds(&r).contains(&"G0".to_string()), "{}", r.details);
    }

    #[test]
    fn circular_information_flow_g1c_is_rejected() {
        let mut h = History::default();
        concurrent(
            &mut h,
            json!([["append", "x", 1], ["r", "y", [1]]]),
            json!([["append", "y", 1], ["r", "x", [1]]]),
        );
        let r = check(&h);
        assert_eq!(kinds(&r), vec!["G1c"], "{}", r.details);
    }

    #[test]
    fn stale_read_after_completed_append_is_realtime_anomaly() {
        let mut h = History::default();
        txn(&mut h, 0, OpType::Ok, json!([["append", "x", 1]]));
        txn(&mut h, 1, OpType::Ok, json!([["r", "x", []]]));
        let r = check(&h);
        assert_eq!(kinds(&r), vec!["G-single-realtime"], "{}", r.details);
        // the same read concurrent with the append is fine
        let mut h = History::default();
        concurrent(&mut h, json!([["append", "x", 1]]), json!([["r", "x", []]]));
        assert_eq!(check(&h).verdict, Verdict::Valid);
    }

    #[test]
    fn incompatible_orders_and_internal_inconsistency_are_rejected() {
        let mut h = History::default();
        txn(&mut h, 0, OpType::Ok, json!([["append", "x", 1]]));
        txn(&mut h, 0, OpType::Ok, json!([["append", "x", 2]]));
        txn(&mut h, 1, OpType::Ok, json!([["r", "x", [1, 2]]]));
        txn(&mut h, 2, OpType::Ok, json!([["r", "x", [2, 1]]]));
        assert!(kinds(&check(&h)).contains(&"incompatible-order".to_string()));
        let mut h = History::default();
        txn(&mut h, 0, OpType::Ok, json!([["append", "x", 1], ["r", "x", []]]));
        assert!(kinds(&check(&h)).contains(&"internal".to_string()));
    }

    /// A serial simulation with random txns stays valid; useful as a property check.
    #[test]
    fn simulated_serial_histories_are_valid() {
        use rand::rngs::StdRng;
        use rand::{Rng, SeedableRng};
        for seed in 0..10 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut state: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
            let mut next = 1i64;
            let mut h = History::default();
            for _ in 0..200 {
                let mut mops = Vec::new();
                for _ in 0..rng.gen_range(1..4) {
                    let k = rng.gen_range(0..5u64);
                    if rng.gen_bool(0.5) {
                        state.entry(k).or_default().push(next);
                        mops.push(json!(["append", k, next]));
                        next += 1;
                    } else {
                        mops.push(json!(["r", k, state.get(&k).cloned().unwrap_or_default()]));
                    }
                }
                txn(&mut h, rng.gen_range(0..4), OpType::Ok, Value::Array(mops));
            }
            let r = check(&h);
            assert_eq!(r.verdict, Verdict::Valid, "seed {seed}: {}", r.details);
        }
    }
}
