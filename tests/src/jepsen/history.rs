//! The history: every client and nemesis operation of a run, in the order the harness saw it.
//!
//! Model: Jepsen's history (jepsen.history). A client op is an `invoke` followed by exactly one
//! completion from the same process: `ok` (it happened), `fail` (it certainly did not happen) or
//! `info` (unknown: a timeout or a connection lost after send). A process that got `info` is
//! retired and its worker continues as a new process, so a process never has two ops open.
//! Nemesis ops (faults) use `"process": "nemesis"` and pair the same way.
//!
//! On disk the history is JSON lines (`history.jsonl`), one [`Op`] per line:
//! `{"index","time_ns","process","type":"invoke|ok|fail|info","f","key","value","error"}`.
//! `time_ns` is nanoseconds since the run started, from one shared monotonic clock.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// Errors reading or writing a history file.
#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    /// The file could not be read or written.
    #[error("history i/o: {0}")]
    Io(#[from] std::io::Error),
    /// A line is not a valid op; `line` is 1-based.
    #[error("history line {line}: {source}")]
    Parse {
        /// 1-based line number in the file.
        line: usize,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// An op could not be encoded.
    #[error("history encode: {0}")]
    Encode(#[from] serde_json::Error),
}

/// Who issued an op: a logical client process (numbered from 0) or the nemesis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Process {
    /// A logical client process; a worker that sees `info` continues as a fresh number.
    Client(u64),
    /// The fault injector; serialized as the string `"nemesis"`.
    Nemesis,
}

impl Serialize for Process {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Process::Client(n) => serializer.serialize_u64(*n),
            Process::Nemesis => serializer.serialize_str("nemesis"),
        }
    }
}

impl<'de> Deserialize<'de> for Process {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Value::deserialize(deserializer)? {
            Value::Number(n) => n
                .as_u64()
                .map(Process::Client)
                .ok_or_else(|| serde::de::Error::custom("process must be a non-negative integer")),
            Value::String(s) if s == "nemesis" => Ok(Process::Nemesis),
            other => Err(serde::de::Error::custom(format!("bad process {other}"))),
        }
    }
}

impl std::fmt::Display for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Process::Client(n) => write!(f, "{n}"),
            Process::Nemesis => f.write_str("nemesis"),
        }
    }
}

/// The kind of history event (Jepsen's `:type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpType {
    /// The op was sent.
    Invoke,
    /// The op took effect (and returned `value`).
    Ok,
    /// The op certainly did not take effect.
    Fail,
    /// Unknown outcome: the op may have taken effect at any time after its invoke, or never.
    Info,
}

/// One history event. `value` is workload-specific JSON (see each workload's doc); `key` is the
/// register/counter key when the op touches one key, `null` otherwise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Op {
    /// Position in the history, from 0, dense.
    pub index: u64,
    /// Nanoseconds since the start of the run (shared monotonic clock).
    pub time_ns: u64,
    /// Issuer.
    pub process: Process,
    /// Event kind.
    #[serde(rename = "type")]
    pub op_type: OpType,
    /// Function name: `get`, `put`, `cas`, `add`, `read`, `transfer`, `txn`, or a nemesis fault name.
    pub f: String,
    /// The key, when the op concerns one key.
    #[serde(default)]
    pub key: Option<Value>,
    /// Argument on invoke, result on completion.
    #[serde(default)]
    pub value: Value,
    /// Error text of a `fail`/`info` completion.
    #[serde(default)]
    pub error: Option<String>,
}

impl Op {
    /// A new event with index and time left at 0 (the [`Recorder`] fills them in).
    pub fn new(process: Process, op_type: OpType, f: &str, key: Option<Value>, value: Value) -> Self {
        Op {
            index: 0,
            time_ns: 0,
            process,
            op_type,
            f: f.to_string(),
            key,
            value,
            error: None,
        }
    }

    /// The same op with `error` set.
    pub fn with_error(mut self, error: impl Into<String>) -> Self {
        self.error = Some(error.into());
        self
    }

    /// The completion of this invocation with the given type and value (same process, f, key).
    pub fn complete(&self, op_type: OpType, value: Value) -> Op {
        Op::new(self.process, op_type, &self.f, self.key.clone(), value)
    }
}

/// A history: events in order. Cheap to build in tests with [`History::push`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    /// The events; `ops[i].index == i`.
    pub ops: Vec<Op>,
}

/// An invocation paired with its completion (if any), by position in [`History::ops`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pair {
    /// Position of the `invoke`.
    pub invoke: usize,
    /// Position of the completion; `None` when the history ended with the op still open.
    pub complete: Option<usize>,
}

impl Pair {
    /// The completion type; an op never completed counts as `info`.
    pub fn outcome(&self, history: &History) -> OpType {
        self.complete
            .and_then(|c| history.ops.get(c))
            .map(|o| o.op_type)
            .unwrap_or(OpType::Info)
    }
}

impl History {
    /// Appends `op`, assigning the next index; `time_ns` is kept as given (tests use the index).
    pub fn push(&mut self, mut op: Op) -> u64 {
        op.index = self.ops.len() as u64;
        if op.time_ns == 0 {
            op.time_ns = op.index;
        }
        self.ops.push(op);
        self.ops.len() as u64 - 1
    }

    /// Pairs every invoke with the next completion of the same process. Completions without an
    /// invoke are ignored. Returns pairs in invoke order. Works for client and nemesis ops alike.
    pub fn pairs(&self) -> Vec<Pair> {
        let mut open: std::collections::HashMap<Process, usize> = std::collections::HashMap::new();
        let mut pairs: Vec<Pair> = Vec::new();
        let mut pair_of_invoke: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
        for (i, op) in self.ops.iter().enumerate() {
            match op.op_type {
                OpType::Invoke => {
                    pair_of_invoke.insert(i, pairs.len());
                    pairs.push(Pair {
                        invoke: i,
                        complete: None,
                    });
                    open.insert(op.process, i);
                }
                _ => {
                    if let Some(inv) = open.remove(&op.process) {
                        if let Some(&p) = pair_of_invoke.get(&inv) {
                            if let Some(pair) = pairs.get_mut(p) {
                                pair.complete = Some(i);
                            }
                        }
                    }
                }
            }
        }
        pairs
    }

    /// Client pairs only (nemesis ops excluded).
    pub fn client_pairs(&self) -> Vec<Pair> {
        self.pairs()
            .into_iter()
            .filter(|p| {
                self.ops
                    .get(p.invoke)
                    .is_some_and(|o| o.process != Process::Nemesis)
            })
            .collect()
    }

    /// Writes the history as JSON lines.
    pub fn write_jsonl(&self, mut out: impl Write) -> Result<(), HistoryError> {
        for op in &self.ops {
            serde_json::to_writer(&mut out, op)?;
            out.write_all(b"\n")?;
        }
        out.flush()?;
        Ok(())
    }

    /// Reads a JSON-lines history (blank lines skipped). Indexes are taken from the file.
    pub fn read_jsonl(input: impl BufRead) -> Result<History, HistoryError> {
        let mut ops = Vec::new();
        for (n, line) in input.lines().enumerate() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let op: Op =
                serde_json::from_str(&line).map_err(|source| HistoryError::Parse { line: n + 1, source })?;
            ops.push(op);
        }
        Ok(History { ops })
    }
}

/// Thread-safe history recorder with the run's shared monotonic clock. Cloning shares it.
/// Every event is stamped with the next index and the nanoseconds since [`Recorder::new`].
#[derive(Clone)]
pub struct Recorder {
    inner: Arc<RecorderInner>,
}

struct RecorderInner {
    start: Instant,
    ops: Mutex<Vec<Op>>,
    next_process: AtomicU64,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    /// A recorder whose clock starts now.
    pub fn new() -> Self {
        Recorder {
            inner: Arc::new(RecorderInner {
                start: Instant::now(),
                ops: Mutex::new(Vec::new()),
                next_process: AtomicU64::new(0),
            }),
        }
    }

    /// Nanoseconds since the recorder was created.
    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.inner.start.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// The run's start instant.
    pub fn start(&self) -> Instant {
        self.inner.start
    }

    /// A fresh client process number (workers take a new one after an `info`).
    pub fn new_process(&self) -> Process {
        Process::Client(self.inner.next_process.fetch_add(1, Ordering::Relaxed))
    }

    /// Stamps `op` with index and time under the lock (so index order equals time order) and
    /// appends it. Returns the stamped op.
    pub fn record(&self, mut op: Op) -> Op {
        let mut ops = self.inner.ops.lock().unwrap_or_else(|e| e.into_inner());
        op.index = ops.len() as u64;
        op.time_ns = self.now_ns();
        ops.push(op.clone());
        op
    }

    /// A copy of the history so far.
    pub fn snapshot(&self) -> History {
        History {
            ops: self.inner.ops.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        }
    }

    /// Number of events so far.
    pub fn len(&self) -> usize {
        self.inner.ops.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// True when nothing was recorded yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Shorthands for building hand-written histories in tests and scenario files.
pub mod build {
    use super::*;

    /// A client invoke.
    pub fn invoke(process: u64, f: &str, key: Option<Value>, value: Value) -> Op {
        Op::new(Process::Client(process), OpType::Invoke, f, key, value)
    }

    /// A client completion of the given type.
    pub fn done(process: u64, op_type: OpType, f: &str, key: Option<Value>, value: Value) -> Op {
        Op::new(Process::Client(process), op_type, f, key, value)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::build::*;
    use super::*;
    use serde_json::json;

    #[test]
    fn jsonl_round_trip_and_exact_field_names() {
        let mut h = History::default();
        h.push(invoke(0, "put", Some(json!("k1")), json!(3)));
        h.push(Op::new(
            Process::Nemesis,
            OpType::Info,
            "kill",
            None,
            json!({"node": 2}),
        ));
        h.push(done(0, OpType::Info, "put", Some(json!("k1")), json!(3)).with_error("timeout"));
        let mut buf = Vec::new();
        h.write_jsonl(&mut buf).unwrap();
        let text = String::from_utf8(buf.clone()).unwrap();
        let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(
            first,
            json!({"index":0,"time_ns":0,"process":0,"type":"invoke","f":"put","key":"k1","value":3,"error":null})
        );
        assert!(text.lines().nth(1).unwrap().contains("\"process\":\"nemesis\""));
        let back = History::read_jsonl(&buf[..]).unwrap();
        assert_eq!(back, h);
    }

    #[test]
    fn bad_line_is_reported_with_its_number() {
        let input =
            b"{\"index\":0,\"time_ns\":1,\"process\":0,\"type\":\"invoke\",\"f\":\"get\"}\nnot json\n";
        match History::read_jsonl(&input[..]) {
            Err(HistoryError::Parse { line, .. }) => assert_eq!(line, 2),
            other => panic!("expected a parse error, got {other:?}"),
        }
    }

    #[test]
    fn pairs_match_invokes_with_completions_per_process() {
        let mut h = History::default();
        h.push(invoke(0, "put", None, json!(1)));
        h.push(invoke(1, "get", None, Value::Null));
        h.push(done(1, OpType::Ok, "get", None, json!(1)));
        h.push(invoke(2, "put", None, json!(2)));
        h.push(done(0, OpType::Ok, "put", None, json!(1)));
        let pairs = h.pairs();
        assert_eq!(pairs.len(), 3);
        assert_eq!(
            pairs[0],
            Pair {
                invoke: 0,
                complete: Some(4)
            }
        );
        assert_eq!(
            pairs[1],
            Pair {
                invoke: 1,
                complete: Some(2)
            }
        );
        assert_eq!(
            pairs[2],
            Pair {
                invoke: 3,
                complete: None
            }
        );
        assert_eq!(pairs[2].outcome(&h), OpType::Info);
    }

    #[test]
    fn recorder_stamps_dense_indexes_and_monotonic_times() {
        let r = Recorder::new();
        let p = r.new_process();
        let a = r.record(Op::new(p, OpType::Invoke, "get", None, Value::Null));
        let b = r.record(Op::new(p, OpType::Ok, "get", None, json!(1)));
        assert_eq!((a.index, b.index), (0, 1));
        assert!(b.time_ns >= a.time_ns);
        assert_ne!(r.new_process(), p);
        assert_eq!(r.snapshot().ops.len(), 2);
    }
}
