//! Workloads: what the clients do. Each workload is a seeded generator of planned ops (pure,
//! unit-tested) plus their execution against the cluster through `ftkv-client`.
//!
//! | workload   | ops (history `f`, `value`)                                           | checker        |
//! |------------|----------------------------------------------------------------------|----------------|
//! | `register` | `get`, `put` n, `cas` [old,new] on keys that rotate every 200 ops     | `linearizable` |
//! | `set`      | `add` x (`Upsert{append}` of `"x,"` to shard key x mod 4), final `read` | `set`       |
//! | `counter`  | `add` d (`Upsert{add}`), `read`                                       | `counter`      |
//! | `bank`     | `transfer` {from,to,amount} (`Txn` with compares), `read` (one `Txn`)  | `bank`         |
//! | `append`   | `txn` [["append",k,v] / ["r",k,list]] (`Txn` of upsert-append and get) | `append`       |
//! | `load`     | `load` x (R rows by `Kv.BulkLoad` under `jepsen/load/x/`), `read` x (rows seen) | `load`  |
//!
//! Outcome rules (Jepsen): a read that errs is `fail` (reads have no effect); a write is `ok`
//! on success (and on `NotOnAllReplicas`: committed), `info` when the client says the outcome
//! is unknown ([`ftkv_client::Error::is_ambiguous`]), on a timeout or a transport error, and
//! `fail` only when the client says it certainly was not applied.

use std::collections::BTreeMap;
use std::time::Duration;

use ftkv_client::{Client, Compare, CompareResult, Txn, TxnOp, UpsertOp};
use rand::rngs::StdRng;
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::jepsen::history::OpType;

/// The workloads of the harness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadKind {
    /// Per-key get/put/cas registers; checked for linearizability.
    Register,
    /// Unique adds and final reads.
    Set,
    /// Increments with `Upsert{add}` and reads.
    Counter,
    /// Atomic transfers between accounts with `Txn`.
    Bank,
    /// List-append transactions (Elle).
    Append,
    /// Bulk loads of a few rows each and reads counting them; checked for all-or-nothing.
    Load,
}

impl WorkloadKind {
    /// The name used on the command line and in reports.
    pub fn name(&self) -> &'static str {
        match self {
            WorkloadKind::Register => "register",
            WorkloadKind::Set => "set",
            WorkloadKind::Counter => "counter",
            WorkloadKind::Bank => "bank",
            WorkloadKind::Append => "append",
            WorkloadKind::Load => "load",
        }
    }
}

/// One op to run: history `f`, `key` and invoke `value`.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedOp {
    /// Function name.
    pub f: String,
    /// Key, when the op concerns one.
    pub key: Option<Value>,
    /// Invoke value.
    pub value: Value,
}

impl PlannedOp {
    /// True for ops without effect (reads, read-only txns).
    pub fn is_read(&self) -> bool {
        matches!(self.f.as_str(), "get" | "read")
            || (self.f == "txn"
                && self
                    .value
                    .as_array()
                    .is_some_and(|m| m.iter().all(|x| x[0] == "r")))
    }

    fn new(f: &str, key: Option<Value>, value: Value) -> Self {
        PlannedOp {
            f: f.to_string(),
            key,
            value,
        }
    }
}

/// Result of running one op: completion type, value and error text.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// `ok`, `fail` or `info`.
    pub op_type: OpType,
    /// Completion value (reads filled in).
    pub value: Value,
    /// Error text for `fail`/`info`.
    pub error: Option<String>,
}

/// Workload parameters (defaults follow Jepsen's etcd tests, scaled to a 2-core machine).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkloadOptions {
    /// Keys in use at once (register, counter, append).
    pub active_keys: u64,
    /// Ops per register key (appends per append key) before the key is retired for a new one.
    pub ops_per_key: u64,
    /// Set shards (one key each).
    pub set_shards: u64,
    /// Bank accounts.
    pub accounts: u64,
    /// Bank total (divided evenly at setup).
    pub total: i64,
    /// Rows of each bulk load (load).
    pub load_rows: u64,
}

impl Default for WorkloadOptions {
    fn default() -> Self {
        WorkloadOptions {
            active_keys: 5,
            ops_per_key: 200,
            set_shards: 4,
            accounts: 5,
            total: 100,
            load_rows: 2_000,
        }
    }
}

/// Seeded op generator for one workload (shared by all workers behind a lock, so one seed gives
/// one sequence of op choices).
#[derive(Debug)]
pub struct Workload {
    kind: WorkloadKind,
    options: WorkloadOptions,
    next_value: i64,
    /// key slot -> (key id, ops used)
    slots: Vec<(u64, u64)>,
    next_key: u64,
    last_written: BTreeMap<u64, i64>,
}

impl Workload {
    /// A generator for `kind`.
    pub fn new(kind: WorkloadKind, options: WorkloadOptions) -> Self {
        let n = options.active_keys.max(1);
        Workload {
            kind,
            options,
            next_value: 0,
            slots: (0..n).map(|k| (k, 0)).collect(),
            next_key: n,
            last_written: BTreeMap::new(),
        }
    }

    /// The workload kind.
    pub fn kind(&self) -> WorkloadKind {
        self.kind
    }

    /// The parameters.
    pub fn options(&self) -> &WorkloadOptions {
        &self.options
    }

    fn fresh_value(&mut self) -> i64 {
        self.next_value += 1;
        self.next_value
    }

    /// Picks an active key and counts one use; retires it after `ops_per_key` uses.
    fn pick_key(&mut self, rng: &mut StdRng) -> u64 {
        let i = rng.gen_range(0..self.slots.len());
        let (key, used) = self.slots[i];
        if used + 1 >= self.options.ops_per_key.max(1) {
            self.slots[i] = (self.next_key, 0);
            self.next_key += 1;
        } else {
            self.slots[i].1 += 1;
        }
        key
    }

    /// The next op of the main phase.
    pub fn next_op(&mut self, rng: &mut StdRng) -> PlannedOp {
        match self.kind {
            WorkloadKind::Register => {
                let key = self.pick_key(rng);
                match rng.gen_range(0..10) {
                    0..=4 => PlannedOp::new("get", Some(json!(key)), Value::Null),
                    5..=7 => {
                        let v = self.fresh_value();
                        self.last_written.insert(key, v);
                        PlannedOp::new("put", Some(json!(key)), json!(v))
                    }
                    _ => {
                        let old = self.last_written.get(&key).copied().unwrap_or(0);
                        let new = self.fresh_value();
                        self.last_written.insert(key, new);
                        PlannedOp::new("cas", Some(json!(key)), json!([old, new]))
                    }
                }
            }
            WorkloadKind::Set => {
                let x = self.fresh_value();
                let shard = x.unsigned_abs() % self.options.set_shards.max(1);
                PlannedOp::new("add", Some(json!(shard)), json!(x))
            }
            WorkloadKind::Counter => {
                let key = rng.gen_range(0..self.options.active_keys.max(1));
                if rng.gen_bool(0.2) {
                    PlannedOp::new("read", Some(json!(key)), Value::Null)
                } else {
                    PlannedOp::new("add", Some(json!(key)), json!(rng.gen_range(1..=5)))
                }
            }
            WorkloadKind::Bank => {
                let n = self.options.accounts.max(2);
                if rng.gen_bool(0.3) {
                    PlannedOp::new("read", None, Value::Null)
                } else {
                    let from = rng.gen_range(0..n);
                    let to = (from + rng.gen_range(1..n)) % n;
                    PlannedOp::new(
                        "transfer",
                        None,
                        json!({"from": from, "to": to, "amount": rng.gen_range(1..=5)}),
                    )
                }
            }
            WorkloadKind::Append => {
                let count = rng.gen_range(1..=4);
                let mut mops = Vec::with_capacity(count);
                for _ in 0..count {
                    if rng.gen_bool(0.5) {
                        let key = self.pick_key(rng);
                        let v = self.fresh_value();
                        mops.push(json!(["append", key, v]));
                    } else {
                        let i = rng.gen_range(0..self.slots.len());
                        mops.push(json!(["r", self.slots[i].0, Value::Null]));
                    }
                }
                PlannedOp::new("txn", None, Value::Array(mops))
            }
            WorkloadKind::Load => {
                // Reads of one of the last loads (where a commit may be in flight), else a new load.
                if self.next_value > 0 && rng.gen_bool(0.6) {
                    let x = self.next_value - rng.gen_range(0..self.next_value.min(4));
                    PlannedOp::new("read", Some(json!(x)), Value::Null)
                } else {
                    let x = self.fresh_value();
                    PlannedOp::new("load", Some(json!(x)), json!(self.options.load_rows.max(1)))
                }
            }
        }
    }

    /// The reads of the final phase (after the last heal): every key the run may have touched.
    pub fn final_ops(&self) -> Vec<PlannedOp> {
        match self.kind {
            WorkloadKind::Register => Vec::new(),
            WorkloadKind::Set => (0..self.options.set_shards.max(1))
                .map(|s| PlannedOp::new("read", Some(json!(s)), Value::Null))
                .collect(),
            WorkloadKind::Counter => (0..self.options.active_keys.max(1))
                .map(|k| PlannedOp::new("read", Some(json!(k)), Value::Null))
                .collect(),
            WorkloadKind::Bank => vec![PlannedOp::new("read", None, Value::Null)],
            WorkloadKind::Append => {
                let mops: Vec<Value> = (0..self.next_key).map(|k| json!(["r", k, Value::Null])).collect();
                mops.chunks(16)
                    .map(|c| PlannedOp::new("txn", None, Value::Array(c.to_vec())))
                    .collect()
            }
            WorkloadKind::Load => (1..=self.next_value)
                .map(|x| PlannedOp::new("read", Some(json!(x)), Value::Null))
                .collect(),
        }
    }
}

/// The key bytes of a workload key.
pub fn key_bytes(kind: WorkloadKind, key: &Value) -> Vec<u8> {
    let k = match key {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    format!("jepsen/{}/{k}", kind.name()).into_bytes()
}

/// Parses a comma-terminated list of integers (`"1,5,9,"`) as written by appends.
pub fn parse_list(bytes: &[u8]) -> Result<Vec<i64>, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("list is not UTF-8: {e}"))?;
    text.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<i64>().map_err(|e| format!("bad element {s:?}: {e}")))
        .collect()
}

fn parse_int(bytes: &[u8]) -> Result<i64, String> {
    std::str::from_utf8(bytes)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not an integer: {bytes:?}"))
}

fn ok(value: Value) -> Completion {
    Completion {
        op_type: OpType::Ok,
        value,
        error: None,
    }
}

fn fail(value: Value, error: impl Into<String>) -> Completion {
    Completion {
        op_type: OpType::Fail,
        value,
        error: Some(error.into()),
    }
}

fn info(value: Value, error: impl Into<String>) -> Completion {
    Completion {
        op_type: OpType::Info,
        value,
        error: Some(error.into()),
    }
}

/// Completion of a write that returned `error`.
pub fn classify_write_error(value: Value, error: &ftkv_client::Error) -> Completion {
    use ftkv_client::Error as E;
    match error {
        E::NotOnAllReplicas { .. } => ok(value),
        E::Ambiguous { .. } | E::Timeout { .. } | E::Transport { .. } | E::Server { .. } => {
            info(value, error.to_string())
        }
        _ if error.is_ambiguous() => info(value, error.to_string()),
        _ => fail(value, error.to_string()),
    }
}

/// Runs `op` with `client`, bounded by `timeout` (past it: `info` for writes, `fail` for reads).
pub async fn execute(kind: WorkloadKind, client: &Client, op: &PlannedOp, timeout: Duration) -> Completion {
    let is_read = op.is_read();
    match tokio::time::timeout(timeout, execute_inner(kind, client, op)).await {
        Ok(c) => c,
        Err(_) if is_read => fail(Value::Null, format!("timed out after {} ms", timeout.as_millis())),
        Err(_) => info(
            op.value.clone(),
            format!("timed out after {} ms", timeout.as_millis()),
        ),
    }
}

async fn execute_inner(kind: WorkloadKind, client: &Client, op: &PlannedOp) -> Completion {
    let key = op.key.as_ref().map(|k| key_bytes(kind, k)).unwrap_or_default();
    match (kind, op.f.as_str()) {
        (WorkloadKind::Register, "get") => match client.get(&key).await {
            Ok(None) => ok(Value::Null),
            Ok(Some(v)) => match parse_int(&v) {
                Ok(n) => ok(json!(n)),
                Err(e) => ok(json!(e)),
            },
            Err(e) => fail(Value::Null, e.to_string()),
        },
        (WorkloadKind::Register, "put") => match client.put(&key, op.value.to_string()).await {
            Ok(_) => ok(op.value.clone()),
            Err(e) => classify_write_error(op.value.clone(), &e),
        },
        (WorkloadKind::Register, "cas") => {
            let (old, new) = (op.value[0].to_string(), op.value[1].to_string());
            let txn = Txn {
                compares: vec![Compare::value(&key, CompareResult::Equal, old)],
                success: vec![TxnOp::Put {
                    key: key.clone(),
                    value: new.into_bytes(),
                }],
                failure: Vec::new(),
            };
            match client.txn(txn).await {
                Ok(r) if r.succeeded => ok(op.value.clone()),
                Ok(_) => fail(op.value.clone(), "compare failed"),
                Err(e) => classify_write_error(op.value.clone(), &e),
            }
        }
        (WorkloadKind::Set, "add") => {
            match client
                .upsert(&key, UpsertOp::Append(format!("{},", op.value).into_bytes()))
                .await
            {
                Ok(_) => ok(op.value.clone()),
                Err(e) => classify_write_error(op.value.clone(), &e),
            }
        }
        (WorkloadKind::Set, "read") => match client.get(&key).await {
            Ok(v) => match parse_list(&v.unwrap_or_default()) {
                Ok(list) => ok(json!(list)),
                Err(e) => fail(Value::Null, e),
            },
            Err(e) => fail(Value::Null, e.to_string()),
        },
        (WorkloadKind::Counter, "add") => {
            let delta = op.value.as_i64().unwrap_or(0);
            match client.upsert(&key, UpsertOp::Add(delta)).await {
                Ok(_) => ok(op.value.clone()),
                Err(e) => classify_write_error(op.value.clone(), &e),
            }
        }
        (WorkloadKind::Counter, "read") => match client.get(&key).await {
            Ok(None) => ok(json!(0)),
            Ok(Some(v)) => match ftkv_client::decode_counter(&v) {
                Some(n) => ok(json!(n)),
                None => fail(Value::Null, format!("counter of {} bytes", v.len())),
            },
            Err(e) => fail(Value::Null, e.to_string()),
        },
        (WorkloadKind::Bank, "read") => bank_read(kind, client).await,
        (WorkloadKind::Bank, "transfer") => bank_transfer(kind, client, op).await,
        (WorkloadKind::Append, "txn") => append_txn(kind, client, op).await,
        (WorkloadKind::Load, "load") => bulk_load(client, &key, op).await,
        (WorkloadKind::Load, "read") => load_read(client, &key, op).await,
        _ => fail(
            op.value.clone(),
            format!("op {} not part of workload {}", op.f, kind.name()),
        ),
    }
}

/// The prefix of load `x`'s rows (`key` is [`key_bytes`] of x: `jepsen/load/x`).
fn load_prefix(key: &[u8]) -> Vec<u8> {
    let mut p = key.to_vec();
    p.push(b'/');
    p
}

/// One bulk load of `op.value` rows under `key`'s prefix, each row's value the load id. An
/// error before the commit is sent is `fail` (nothing can commit without it; the server
/// cancels the staged rows); the commit's error is classified like any write's.
async fn bulk_load(client: &Client, key: &[u8], op: &PlannedOp) -> Completion {
    let rows = op.value.as_u64().unwrap_or(1);
    let prefix = load_prefix(key);
    let id = op.key.as_ref().map(|k| k.to_string()).unwrap_or_default();
    let mut loader = match client.bulk_load(ftkv_client::OnDuplicate::Error).await {
        Ok(l) => l,
        Err(e) => return fail(op.value.clone(), format!("starting the load: {e}")),
    };
    for i in 0..rows {
        let mut k = prefix.clone();
        k.extend_from_slice(format!("{i:06}").as_bytes());
        if let Err(e) = loader.push(k, id.clone().into_bytes()).await {
            loader.cancel().await;
            return fail(op.value.clone(), format!("sending row {i}: {e}"));
        }
    }
    match loader.commit().await {
        // A count other than `rows` shows in the reads (`partial`).
        Ok(_) => ok(op.value.clone()),
        Err(e) => classify_write_error(op.value.clone(), &e),
    }
}

/// Counts the rows of load `key` with one linearizable keys-only scan of a single page (one
/// snapshot: a load's rows are all or none of it).
async fn load_read(client: &Client, key: &[u8], _op: &PlannedOp) -> Completion {
    let prefix = load_prefix(key);
    let mut end = prefix.clone();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    let options = ftkv_client::ScanOptions {
        limit: 100_000,
        consistency: ftkv_client::ReadConsistency::Linearizable,
        keys_only: true,
    };
    match client.scan_with(&prefix, &end, options).await {
        Ok(page) if page.more => fail(Value::Null, "a load's rows did not fit one page"),
        Ok(page) => ok(json!(page.kvs.len())),
        Err(e) => fail(Value::Null, e.to_string()),
    }
}

fn account_key(kind: WorkloadKind, account: u64) -> Vec<u8> {
    key_bytes(kind, &json!(account))
}

/// Reads every bank account in one `Txn` (atomic snapshot); the account count comes from the
/// workload's default options when not given (callers pass the real count through setup).
async fn bank_read(kind: WorkloadKind, client: &Client) -> Completion {
    let accounts = BANK_ACCOUNTS.load(std::sync::atomic::Ordering::Relaxed);
    let txn = Txn {
        compares: Vec::new(),
        success: (0..accounts)
            .map(|a| TxnOp::Get {
                key: account_key(kind, a),
            })
            .collect(),
        failure: Vec::new(),
    };
    match client.txn(txn).await {
        Ok(r) => {
            let mut m = serde_json::Map::new();
            for (a, res) in r.results.iter().enumerate() {
                let v = if res.found {
                    parse_int(&res.value).map(|n| json!(n)).unwrap_or(Value::Null)
                } else {
                    Value::Null
                };
                m.insert(a.to_string(), v);
            }
            ok(Value::Object(m))
        }
        Err(e) => fail(Value::Null, e.to_string()),
    }
}

/// Number of bank accounts, set by [`bank_setup`] (reads must cover every account).
static BANK_ACCOUNTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(5);

/// Writes the initial balances (total split evenly) in one atomic `Write`. Retries until it
/// succeeds or `deadline` passes.
pub async fn bank_setup(
    client: &Client,
    options: &WorkloadOptions,
    deadline: Duration,
) -> Result<(), String> {
    let n = options.accounts.max(2);
    BANK_ACCOUNTS.store(n, std::sync::atomic::Ordering::Relaxed);
    let each = options.total / n as i64;
    let mut ops = Vec::new();
    for a in 0..n {
        let extra = if a == 0 {
            options.total - each * n as i64
        } else {
            0
        };
        ops.push(ftkv_client::Op::put(
            account_key(WorkloadKind::Bank, a),
            (each + extra).to_string(),
        ));
    }
    let started = std::time::Instant::now();
    loop {
        match client.write(ops.clone()).await {
            Ok(_) => return Ok(()),
            Err(e) if started.elapsed() < deadline => {
                tracing::warn!("bank setup: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(format!("bank setup failed: {e}")),
        }
    }
}

async fn bank_transfer(kind: WorkloadKind, client: &Client, op: &PlannedOp) -> Completion {
    let (Some(from), Some(to), Some(amount)) = (
        op.value["from"].as_u64(),
        op.value["to"].as_u64(),
        op.value["amount"].as_i64(),
    ) else {
        return fail(op.value.clone(), "malformed transfer");
    };
    let (kf, kt) = (account_key(kind, from), account_key(kind, to));
    let read = Txn {
        compares: Vec::new(),
        success: vec![TxnOp::Get { key: kf.clone() }, TxnOp::Get { key: kt.clone() }],
        failure: Vec::new(),
    };
    let balances = match client.txn(read).await {
        Ok(r) if r.results.len() == 2 && r.results.iter().all(|x| x.found) => {
            match (parse_int(&r.results[0].value), parse_int(&r.results[1].value)) {
                (Ok(a), Ok(b)) => (a, b, r.results[0].value.clone(), r.results[1].value.clone()),
                _ => return fail(op.value.clone(), "unparseable balance"),
            }
        }
        Ok(_) => return fail(op.value.clone(), "account missing"),
        Err(e) => return fail(op.value.clone(), e.to_string()),
    };
    let (bf, bt, raw_f, raw_t) = balances;
    if bf < amount {
        return fail(op.value.clone(), "insufficient funds");
    }
    let txn = Txn {
        compares: vec![
            Compare::value(&kf, CompareResult::Equal, raw_f),
            Compare::value(&kt, CompareResult::Equal, raw_t),
        ],
        success: vec![
            TxnOp::Put {
                key: kf,
                value: (bf - amount).to_string().into_bytes(),
            },
            TxnOp::Put {
                key: kt,
                value: (bt + amount).to_string().into_bytes(),
            },
        ],
        failure: Vec::new(),
    };
    match client.txn(txn).await {
        Ok(r) if r.succeeded => ok(op.value.clone()),
        Ok(_) => fail(op.value.clone(), "balances changed"),
        Err(e) => classify_write_error(op.value.clone(), &e),
    }
}

async fn append_txn(kind: WorkloadKind, client: &Client, op: &PlannedOp) -> Completion {
    let Some(mops) = op.value.as_array() else {
        return fail(op.value.clone(), "malformed txn");
    };
    let mut success = Vec::with_capacity(mops.len());
    for m in mops {
        let key = key_bytes(kind, &m[1]);
        if m[0] == "append" {
            success.push(TxnOp::Upsert {
                key,
                op: UpsertOp::Append(format!("{},", m[2]).into_bytes()),
            });
        } else {
            success.push(TxnOp::Get { key });
        }
    }
    let read_only = mops.iter().all(|m| m[0] == "r");
    match client
        .txn(Txn {
            compares: Vec::new(),
            success,
            failure: Vec::new(),
        })
        .await
    {
        Ok(r) => {
            let mut out = Vec::with_capacity(mops.len());
            for (i, m) in mops.iter().enumerate() {
                if m[0] == "r" {
                    let res = r.results.get(i);
                    let list = match res {
                        Some(x) if x.found => match parse_list(&x.value) {
                            Ok(l) => json!(l),
                            Err(e) => return info(op.value.clone(), format!("unparseable read: {e}")),
                        },
                        Some(_) => json!([]),
                        None => return info(op.value.clone(), "missing txn result"),
                    };
                    out.push(json!(["r", m[1], list]));
                } else {
                    out.push(m.clone());
                }
            }
            ok(Value::Array(out))
        }
        Err(e) if read_only => fail(op.value.clone(), e.to_string()),
        Err(e) => classify_write_error(op.value.clone(), &e),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn ops(kind: WorkloadKind, seed: u64, n: usize) -> Vec<PlannedOp> {
        let mut w = Workload::new(kind, WorkloadOptions::default());
        let mut rng = StdRng::seed_from_u64(seed);
        (0..n).map(|_| w.next_op(&mut rng)).collect()
    }

    #[test]
    fn same_seed_same_ops_different_seed_different_ops() {
        for kind in [
            WorkloadKind::Register,
            WorkloadKind::Set,
            WorkloadKind::Counter,
            WorkloadKind::Bank,
            WorkloadKind::Append,
        ] {
            assert_eq!(ops(kind, 7, 50), ops(kind, 7, 50), "{kind:?}");
        }
        assert_ne!(
            ops(WorkloadKind::Register, 7, 50),
            ops(WorkloadKind::Register, 8, 50)
        );
    }

    #[test]
    fn written_values_are_unique() {
        let mut seen = std::collections::HashSet::new();
        for op in ops(WorkloadKind::Register, 1, 2000) {
            let v = match op.f.as_str() {
                "put" => op.value.as_i64(),
                "cas" => op.value[1].as_i64(),
                _ => None,
            };
            if let Some(v) = v {
                assert!(seen.insert(v), "value {v} written twice");
            }
        }
        let mut seen = std::collections::HashSet::new();
        for op in ops(WorkloadKind::Append, 1, 2000) {
            for m in op.value.as_array().unwrap() {
                if m[0] == "append" {
                    assert!(seen.insert((m[1].as_u64(), m[2].as_i64())));
                }
            }
        }
    }

    #[test]
    fn register_keys_rotate_and_final_reads_cover_every_append_key() {
        let keys: std::collections::BTreeSet<String> = ops(WorkloadKind::Register, 3, 3000)
            .iter()
            .map(|o| o.key.clone().unwrap().to_string())
            .collect();
        assert!(keys.len() > 5, "keys should rotate: {keys:?}");
        let mut w = Workload::new(WorkloadKind::Append, WorkloadOptions::default());
        let mut rng = StdRng::seed_from_u64(3);
        let mut touched = std::collections::BTreeSet::new();
        for _ in 0..3000 {
            for m in w.next_op(&mut rng).value.as_array().unwrap() {
                touched.insert(m[1].as_u64().unwrap());
            }
        }
        let finals: std::collections::BTreeSet<u64> = w
            .final_ops()
            .iter()
            .flat_map(|o| {
                o.value
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| m[1].as_u64().unwrap())
                    .collect::<Vec<_>>()
            })
            .collect();
        assert!(touched.is_subset(&finals));
    }

    #[test]
    fn bank_transfers_never_move_to_the_same_account() {
        for op in ops(WorkloadKind::Bank, 5, 500) {
            if op.f == "transfer" {
                assert_ne!(op.value["from"], op.value["to"]);
            }
        }
    }

    #[test]
    fn list_parsing() {
        assert_eq!(parse_list(b"1,22,3,").unwrap(), vec![1, 22, 3]);
        assert_eq!(parse_list(b"").unwrap(), Vec::<i64>::new());
        assert!(parse_list(b"1,x,").is_err());
    }

    #[test]
    fn write_errors_are_never_turned_into_fail_when_ambiguous() {
        let e = ftkv_client::Error::Ambiguous {
            message: "lost leadership".into(),
        };
        assert_eq!(classify_write_error(json!(1), &e).op_type, OpType::Info);
        let e = ftkv_client::Error::Timeout { elapsed_ms: 5 };
        assert_eq!(classify_write_error(json!(1), &e).op_type, OpType::Info);
        let e = ftkv_client::Error::InvalidArgument {
            message: "too big".into(),
            limit: None,
        };
        assert_eq!(classify_write_error(json!(1), &e).op_type, OpType::Fail);
    }
}
