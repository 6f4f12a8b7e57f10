//! One test run, start to end (Jepsen's `jepsen.core/run!`): set up the db, run the workload's
//! workers and the nemesis (a random seeded schedule, or a scenario's script) until the time
//! limit, heal everything and restart every node, check liveness, do the final reads, gather
//! every node's state digest, run the checkers and write the report folder
//! `store/<test>/<time>/` (`history.jsonl`, `results.json`, `n<ID>.log`, `timeline.html`,
//! `latency.svg`, `throughput.svg`), pointing `store/latest` at it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::Mutex as AsyncMutex;

use crate::jepsen::checker::bank::BankOptions;
use crate::jepsen::checker::convergence::{check_convergence, check_liveness, NodeFinalState};
use crate::jepsen::checker::linearizable::LinearizableOptions;
use crate::jepsen::checker::{self, CheckResult, Verdict};
use crate::jepsen::db::{Db, DbOptions, SubstrateKind};
use crate::jepsen::history::{History, Op, OpType, Process, Recorder};
use crate::jepsen::nemesis::{self, Nemesis, NemesisKind};
use crate::jepsen::report;
use crate::jepsen::scenario::{self, Step};
use crate::jepsen::security::SecurityOptions;
use crate::jepsen::workload::{self, Workload, WorkloadKind, WorkloadOptions};

/// Liveness bound after the final heal, ms.
pub const LIVENESS_BOUND_MS: u64 = 30_000;

/// Everything a run needs.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TestOptions {
    /// Test name: the store folder (`register-partition,kill` by default).
    pub name: String,
    /// Workload.
    pub workload: WorkloadKind,
    /// Workload parameters.
    pub workload_options: WorkloadOptions,
    /// Faults of the random schedule.
    pub nemeses: Vec<NemesisKind>,
    /// Main phase length, ms.
    pub time_limit_ms: u64,
    /// Substrate.
    pub substrate: SubstrateKind,
    /// Worker count.
    pub concurrency: usize,
    /// Seed of every random choice (ops, fault schedule, fault targets).
    pub seed: u64,
    /// Target total rate, ops/s.
    pub rate: f64,
    /// Report store.
    pub store: PathBuf,
    /// Node count.
    pub nodes: u64,
    /// Extra `ftkv-node run` flags (engine, canaries, snapshot thresholds).
    pub node_args: Vec<String>,
    /// Bound of one client op, ms (past it: info for writes).
    pub op_timeout_ms: u64,
    /// A scenario's script instead of the random schedule.
    pub script: Option<Vec<Step>>,
    /// Checkers to run; `None` = the workload's own plus convergence and liveness.
    pub checks: Option<Vec<String>>,
    /// Image of the `docker` substrate's containers.
    #[serde(default = "default_docker_image")]
    pub docker_image: String,
    /// TLS and auth of the cluster and the harness's clients (off by default).
    #[serde(default)]
    pub security: SecurityOptions,
}

fn default_docker_image() -> String {
    super::db::DEFAULT_DOCKER_IMAGE.to_string()
}

impl TestOptions {
    /// Defaults for `workload` (concurrency 5, 50 ops/s, 60 s, netns, seed from the clock).
    pub fn new(workload: WorkloadKind) -> Self {
        TestOptions {
            name: String::new(),
            workload,
            workload_options: WorkloadOptions::default(),
            nemeses: Vec::new(),
            time_limit_ms: 60_000,
            substrate: SubstrateKind::Netns,
            concurrency: 5,
            seed: 0,
            rate: 50.0,
            store: PathBuf::from("store"),
            nodes: 3,
            node_args: Vec::new(),
            op_timeout_ms: 10_000,
            script: None,
            checks: None,
            docker_image: default_docker_image(),
            security: SecurityOptions::default(),
        }
    }

    /// The command line that replays this random run.
    pub fn replay_command(&self) -> String {
        let nemeses: Vec<&str> = self.nemeses.iter().map(|n| n.name()).collect();
        let mut cmd = format!(
            "ftkv-jepsen test --workload {} --nemesis {} --time-limit {}s --substrate {} --concurrency {} --seed {} --rate {}",
            self.workload.name(),
            if nemeses.is_empty() { "none".to_string() } else { nemeses.join(",") },
            self.time_limit_ms / 1000,
            self.substrate.name(),
            self.concurrency,
            self.seed,
            self.rate
        );
        if self.substrate == SubstrateKind::Docker {
            cmd.push_str(&format!(" --image {}", self.docker_image));
        }
        cmd.push_str(&self.security.flags());
        for a in &self.node_args {
            cmd.push_str(&format!(" --node-arg={a}"));
        }
        cmd
    }
}

/// The harness itself failed (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// The cluster could not be set up.
    #[error("setting up the cluster: {0}")]
    Setup(String),
    /// The report folder could not be written.
    #[error("writing the report in {path}: {source}")]
    Report {
        /// Folder or file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Interrupted (Ctrl-C); everything created was removed.
    #[error("interrupted")]
    Interrupted,
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct TestOutcome {
    /// One result per checker (and one `unsupported` per fault that could not run).
    pub results: Vec<CheckResult>,
    /// The report folder.
    pub dir: PathBuf,
    /// Worst verdict.
    pub verdict: Verdict,
}

impl TestOutcome {
    /// Exit code: 0 valid (or only unsupported faults), 1 invalid, 2 undecided.
    pub fn exit_code(&self) -> i32 {
        match self.verdict {
            Verdict::Valid | Verdict::Unsupported => 0,
            Verdict::Invalid => 1,
            Verdict::Unknown => 2,
        }
    }
}

/// `YYYYMMDDTHHMMSS` (UTC) of now, for report folder names.
pub fn timestamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // civil from days (Howard Hinnant's algorithm)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn report_error(path: &Path) -> impl FnOnce(std::io::Error) -> HarnessError + '_ {
    move |source| HarnessError::Report {
        path: path.to_path_buf(),
        source,
    }
}

/// Creates `store/<name>/<time>/` and points `store/latest` at it.
fn make_run_dir(store: &Path, name: &str) -> Result<PathBuf, HarnessError> {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_,.".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let mut dir = store.join(&safe).join(timestamp());
    let mut n = 1;
    while dir.exists() {
        dir = store.join(&safe).join(format!("{}-{n}", timestamp()));
        n += 1;
    }
    std::fs::create_dir_all(&dir).map_err(report_error(&dir))?;
    let latest = store.join("latest");
    let _ = std::fs::remove_file(&latest);
    if let Ok(rel) = dir.strip_prefix(store) {
        let _ = std::os::unix::fs::symlink(rel, &latest);
    }
    Ok(dir)
}

/// Builds a workload client (TLS and the workload user when the run has them) whose first
/// endpoint is `first` (workers spread over nodes that way).
async fn client_for(
    db: &Db,
    endpoints: &[String],
    first: usize,
    op_timeout: Duration,
) -> Result<ftkv_client::Client, String> {
    let mut eps = endpoints.to_vec();
    if !eps.is_empty() {
        let n = eps.len();
        eps.rotate_left(first % n);
    }
    db.client_builder(eps)
        .connect_timeout(Duration::from_secs(2))
        .request_timeout(op_timeout.min(Duration::from_secs(5)))
        .retry(ftkv_client::RetryPolicy {
            deadline: op_timeout,
            ..Default::default()
        })
        .build()
        .await
        .map_err(|e| e.to_string())
}

/// Runs one op as `process`, recording invoke and completion; returns the completion type.
pub async fn run_op(
    recorder: &Recorder,
    kind: WorkloadKind,
    client: &ftkv_client::Client,
    process: Process,
    op: &workload::PlannedOp,
    timeout: Duration,
) -> OpType {
    recorder.record(Op::new(
        process,
        OpType::Invoke,
        &op.f,
        op.key.clone(),
        op.value.clone(),
    ));
    let c = workload::execute(kind, client, op, timeout).await;
    let mut done = Op::new(process, c.op_type, &op.f, op.key.clone(), c.value);
    done.error = c.error;
    recorder.record(done);
    c.op_type
}

/// Runs the test described by `options`. `interrupted` is polled: when set (Ctrl-C) the run
/// stops, tears down and returns [`HarnessError::Interrupted`].
pub async fn run_test(
    options: &TestOptions,
    interrupted: Arc<AtomicBool>,
) -> Result<TestOutcome, HarnessError> {
    let dir = make_run_dir(&options.store, &options.name)?;
    println!(
        "ftkv-jepsen: test {} seed {} -> {}",
        options.name,
        options.seed,
        dir.display()
    );
    std::fs::write(
        dir.join("options.json"),
        serde_json::to_vec_pretty(options).unwrap_or_default(),
    )
    .map_err(report_error(&dir))?;
    let mut kinds: Vec<NemesisKind> = options.nemeses.clone();
    if let Some(steps) = &options.script {
        kinds.extend(scenario::step_kinds(steps));
    }
    let db_options = DbOptions {
        substrate: options.substrate,
        nodes: options.nodes,
        node_args: options.node_args.clone(),
        dir: dir.join("nodes"),
        lose_unsynced_on_kill: kinds.contains(&NemesisKind::LoseUnsynced),
        // Not where the substrate cannot skew clocks: the fault is then reported `unsupported`.
        fake_clock: kinds.contains(&NemesisKind::Clock)
            && NemesisKind::Clock.unsupported_reason(options.substrate).is_none(),
        docker_image: options.docker_image.clone(),
        security: options.security,
    };
    let db = Arc::new(
        Db::start(&db_options, Duration::from_secs(60))
            .await
            .map_err(|e| HarnessError::Setup(e.to_string()))?,
    );
    let result = run_with_db(options, &db, &dir, interrupted).await;
    db.copy_logs(&dir);
    db.teardown();
    result
}

async fn run_with_db(
    options: &TestOptions,
    db: &Arc<Db>,
    dir: &Path,
    interrupted: Arc<AtomicBool>,
) -> Result<TestOutcome, HarnessError> {
    let recorder = Recorder::new();
    let op_timeout = Duration::from_millis(options.op_timeout_ms);
    let endpoints = db.endpoints();
    let kind = options.workload;
    if kind == WorkloadKind::Bank {
        let client = client_for(db, &endpoints, 0, op_timeout)
            .await
            .map_err(HarnessError::Setup)?;
        workload::bank_setup(&client, &options.workload_options, Duration::from_secs(30))
            .await
            .map_err(HarnessError::Setup)?;
    }
    let generator = Arc::new(AsyncMutex::new((
        Workload::new(kind, options.workload_options.clone()),
        StdRng::seed_from_u64(options.seed),
    )));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let deadline = started + Duration::from_millis(options.time_limit_ms);

    // Workers.
    let mut workers = tokio::task::JoinSet::new();
    let concurrency = if options.rate > 0.0 {
        options.concurrency.max(1)
    } else {
        0
    };
    for w in 0..concurrency {
        let (recorder, generator, stop, interrupted, db) = (
            recorder.clone(),
            generator.clone(),
            stop.clone(),
            interrupted.clone(),
            db.clone(),
        );
        let interval_s = concurrency as f64 / options.rate.max(0.001);
        let seed = options.seed.wrapping_add(1000 + w as u64);
        workers.spawn(async move {
            let mut jitter = StdRng::seed_from_u64(seed);
            // Each worker is bound to one node (Jepsen binds clients to nodes), with a second
            // client for reads only: a write's NOT_LEADER redirect makes a client prefer the
            // leader, while the read client keeps asking its own node, which must redirect (or
            // run ReadIndex), never answer from local state.
            let mut pinned = String::new();
            let mut client = None;
            let mut read_client = None;
            let mut process = recorder.new_process();
            // Runs until the main loop says stop: the time limit, or the end of a longer script
            // (scripted faults happen under load).
            while !stop.load(Ordering::Relaxed) && !interrupted.load(Ordering::Relaxed) {
                let endpoints = db.endpoints();
                if client.is_none() || !endpoints.contains(&pinned) {
                    let Some(ep) = endpoints.get(w % endpoints.len().max(1)).cloned() else {
                        return;
                    };
                    pinned = ep;
                    client = client_for(&db, std::slice::from_ref(&pinned), 0, op_timeout)
                        .await
                        .ok();
                    read_client = client_for(&db, std::slice::from_ref(&pinned), 0, op_timeout)
                        .await
                        .ok();
                }
                let (Some(client), Some(read_client)) = (client.as_ref(), read_client.as_ref()) else {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                };
                let op = {
                    let mut g = generator.lock().await;
                    let (wl, rng) = &mut *g;
                    wl.next_op(rng)
                };
                let c = if op.is_read() { read_client } else { client };
                if run_op(&recorder, kind, c, process, &op, op_timeout).await == OpType::Info {
                    process = recorder.new_process();
                }
                let pause = interval_s * jitter.gen_range(0.5..1.5);
                tokio::time::sleep(Duration::from_secs_f64(pause)).await;
            }
        });
    }

    // Nemesis: random schedule or script.
    let unsupported: Vec<(NemesisKind, String)> = options
        .nemeses
        .iter()
        .filter_map(|k| k.unsupported_reason(db.substrate()).map(|r| (*k, r)))
        .collect();
    let mut nemesis_rng = StdRng::seed_from_u64(options.seed ^ 0x9e37_79b9_7f4a_7c15);
    let supported: Vec<NemesisKind> = options
        .nemeses
        .iter()
        .copied()
        .filter(|k| !unsupported.iter().any(|(u, _)| u == k))
        .collect();
    let plan = nemesis::schedule(&supported, options.time_limit_ms, &mut nemesis_rng);
    let nemesis = Arc::new(AsyncMutex::new(Nemesis::new(
        db.clone(),
        recorder.clone(),
        nemesis_rng,
    )));
    let script_result: Arc<AsyncMutex<Vec<CheckResult>>> = Arc::new(AsyncMutex::new(Vec::new()));
    let nemesis_task = {
        let (nemesis, interrupted, recorder, db, script, script_result) = (
            nemesis.clone(),
            interrupted.clone(),
            recorder.clone(),
            db.clone(),
            options.script.clone(),
            script_result.clone(),
        );
        tokio::spawn(async move {
            match script {
                Some(steps) => {
                    let mut ctx =
                        scenario::ScriptContext::new(db, recorder, nemesis, op_timeout, interrupted);
                    ctx.run(&steps).await;
                    script_result.lock().await.extend(ctx.unsupported());
                }
                None => {
                    for p in plan {
                        let at = started + Duration::from_millis(p.at_ms);
                        if !sleep_until(at, &interrupted).await {
                            return;
                        }
                        let active = nemesis.lock().await.start(&p.fault).await;
                        if !sleep_until(Instant::now() + Duration::from_millis(p.hold_ms), &interrupted).await
                        {
                            nemesis.lock().await.stop(p.fault.kind(), active).await;
                            return;
                        }
                        nemesis.lock().await.stop(p.fault.kind(), active).await;
                    }
                }
            }
        })
    };

    // Progress until the time limit (a script may run longer: wait for it too).
    let mut last_print = Instant::now();
    loop {
        if interrupted.load(Ordering::Relaxed) {
            stop.store(true, Ordering::Relaxed);
            break;
        }
        let script_running = options.script.is_some() && !nemesis_task.is_finished();
        if Instant::now() >= deadline && !script_running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        if last_print.elapsed() >= Duration::from_secs(5) {
            last_print = Instant::now();
            let h = recorder.snapshot();
            let count = |t: OpType| {
                h.ops
                    .iter()
                    .filter(|o| o.op_type == t && o.process != Process::Nemesis)
                    .count()
            };
            println!(
                "  [{:>4.0}s] ok {} fail {} info {} | nemesis events {}",
                started.elapsed().as_secs_f64(),
                count(OpType::Ok),
                count(OpType::Fail),
                count(OpType::Info),
                h.ops.iter().filter(|o| o.process == Process::Nemesis).count() / 2
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    while workers.join_next().await.is_some() {}
    let _ = nemesis_task.await;
    if interrupted.load(Ordering::Relaxed) {
        nemesis.lock().await.heal_all().await;
        write_history(dir, &recorder.snapshot())?;
        return Err(HarnessError::Interrupted);
    }

    // Final phase: heal, restart, liveness, final reads, convergence.
    println!("  final phase: heal everything, restart stopped nodes, final reads");
    nemesis.lock().await.heal_all().await;
    let heal_at = Instant::now();
    let mut finals = liveness_probe(db, heal_at).await;
    let final_client = client_for(db, &db.endpoints(), 0, op_timeout).await;
    if let Ok(client) = &final_client {
        let wl = generator.lock().await.0.final_ops();
        let process = recorder.new_process();
        let mut process = process;
        for op in wl {
            for _attempt in 0..10 {
                match run_op(&recorder, kind, client, process, &op, op_timeout).await {
                    OpType::Ok => break,
                    OpType::Info => process = recorder.new_process(),
                    _ => {}
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    gather_digests(db, &mut finals).await;
    let history = recorder.snapshot();
    write_history(dir, &history)?;

    // Checks.
    let mut results = run_checkers(options, &history, &finals);
    for (k, reason) in &unsupported {
        results.push(CheckResult::new(
            &format!("nemesis-{}", k.name()),
            Verdict::Unsupported,
            reason.clone(),
            json!({}),
        ));
    }
    results.extend(script_result.lock().await.iter().cloned());
    results.push(crash_result(&nemesis.lock().await.crashes()));
    let verdict = results.iter().fold(Verdict::Valid, |v, r| v.merge(r.verdict));
    write_report(options, dir, &history, &results, &finals, verdict)?;
    Ok(TestOutcome {
        results,
        dir: dir.to_path_buf(),
        verdict,
    })
}

/// The `crashes` check: no member process may exit on its own (a crash at start-up after a
/// kill, a panic); `crashes` lists what the nemesis found.
pub fn crash_result(crashes: &[Value]) -> CheckResult {
    if crashes.is_empty() {
        CheckResult::new(
            "crashes",
            Verdict::Valid,
            "no node exited on its own",
            json!({"crashes": []}),
        )
    } else {
        CheckResult::new(
            "crashes",
            Verdict::Invalid,
            format!("{} unexpected node exit(s); first: {}", crashes.len(), crashes[0]),
            json!({ "crashes": crashes }),
        )
    }
}

/// Sleeps until `at`; false when interrupted meanwhile.
async fn sleep_until(at: Instant, interrupted: &AtomicBool) -> bool {
    while Instant::now() < at {
        if interrupted.load(Ordering::Relaxed) {
            return false;
        }
        let left = at
            .saturating_duration_since(Instant::now())
            .min(Duration::from_millis(200));
        tokio::time::sleep(left).await;
    }
    !interrupted.load(Ordering::Relaxed)
}

/// Polls every member until it answers `Status` knowing a leader, up to the liveness bound.
async fn liveness_probe(db: &Db, heal_at: Instant) -> Vec<NodeFinalState> {
    let mut states = Vec::new();
    for id in db.members() {
        let mut st = NodeFinalState {
            node: format!("n{id}"),
            node_id: None,
            applied_index: None,
            digest: None,
            first_served_ms: None,
            error: None,
        };
        let Ok(ep) = db.endpoint(id) else { continue };
        while heal_at.elapsed() < Duration::from_millis(LIVENESS_BOUND_MS + 5_000) {
            match db.status(&ep, false, Duration::from_secs(2)).await {
                Ok(s) if s.leader_id != 0 => {
                    st.first_served_ms = Some(heal_at.elapsed().as_millis() as u64);
                    st.node_id = Some(s.node_id);
                    break;
                }
                Ok(_) => st.error = Some("no leader known".into()),
                Err(e) => st.error = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        if st.first_served_ms.is_some() {
            st.error = None;
        }
        states.push(st);
    }
    states
}

/// Waits (up to 30 s) until every member reports the same applied index, then records digests.
async fn gather_digests(db: &Db, finals: &mut [NodeFinalState]) {
    let members = db.members();
    let started = Instant::now();
    loop {
        let mut statuses = Vec::new();
        for &id in &members {
            let ep = db.endpoint(id).unwrap_or_default();
            statuses.push(db.status(&ep, true, Duration::from_secs(10)).await);
        }
        let applied: Vec<Option<u64>> = statuses
            .iter()
            .map(|s| s.as_ref().ok().map(|s| s.applied_index))
            .collect();
        let settled = applied.iter().all(|a| a.is_some() && *a == applied[0]);
        if settled || started.elapsed() > Duration::from_secs(30) {
            for (st, s) in finals.iter_mut().zip(statuses) {
                match s {
                    Ok(s) => {
                        st.applied_index = Some(s.applied_index);
                        st.digest = Some(s.digest);
                        st.node_id = Some(s.node_id);
                    }
                    Err(e) => st.error = Some(e),
                }
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The default checkers of a workload.
pub fn default_checks(kind: WorkloadKind) -> Vec<String> {
    let own = match kind {
        WorkloadKind::Register => "linearizable",
        WorkloadKind::Set => "set",
        WorkloadKind::Counter => "counter",
        WorkloadKind::Bank => "bank",
        WorkloadKind::Append => "append",
        WorkloadKind::Load => "load",
    };
    vec![own.to_string(), "convergence".into(), "liveness".into()]
}

/// Runs the selected checkers.
pub fn run_checkers(options: &TestOptions, history: &History, finals: &[NodeFinalState]) -> Vec<CheckResult> {
    let checks = options
        .checks
        .clone()
        .unwrap_or_else(|| default_checks(options.workload));
    checks
        .iter()
        .map(|c| match c.as_str() {
            "linearizable" => checker::linearizable::check(history, LinearizableOptions::default()),
            "set" => checker::set::check(history),
            "counter" => checker::counter::check(history),
            "bank" => checker::bank::check(
                history,
                &BankOptions {
                    accounts: (0..options.workload_options.accounts.max(2)).collect(),
                    total: options.workload_options.total,
                },
            ),
            "append" => checker::append::check(history),
            "load" => checker::load::check(history),
            "convergence" => check_convergence(finals),
            "liveness" => check_liveness(finals, LIVENESS_BOUND_MS),
            other => CheckResult::new(
                other,
                Verdict::Unknown,
                format!("no checker named {other}"),
                Value::Null,
            ),
        })
        .collect()
}

fn write_history(dir: &Path, history: &History) -> Result<(), HarnessError> {
    let path = dir.join("history.jsonl");
    let file = std::fs::File::create(&path).map_err(report_error(&path))?;
    history
        .write_jsonl(std::io::BufWriter::new(file))
        .map_err(|e| HarnessError::Report {
            path: path.clone(),
            source: std::io::Error::other(e.to_string()),
        })
}

fn write_report(
    options: &TestOptions,
    dir: &Path,
    history: &History,
    results: &[CheckResult],
    finals: &[NodeFinalState],
    verdict: Verdict,
) -> Result<(), HarnessError> {
    let results_json = json!({
        "test": options.name,
        "seed": options.seed,
        "verdict": verdict,
        "replay": options.replay_command(),
        "ops": history.ops.len(),
        "results": results,
        "final_states": finals,
    });
    let write = |name: &str, bytes: Vec<u8>| -> Result<(), HarnessError> {
        let p = dir.join(name);
        std::fs::write(&p, bytes).map_err(report_error(&p))
    };
    write(
        "results.json",
        serde_json::to_vec_pretty(&results_json).unwrap_or_default(),
    )?;
    let title = format!("{} (seed {})", options.name, options.seed);
    write(
        "timeline.html",
        report::timeline_html(history, &title).into_bytes(),
    )?;
    write(
        "latency.svg",
        report::latency_svg(history, &format!("latency: {title}")).into_bytes(),
    )?;
    write(
        "throughput.svg",
        report::throughput_svg(history, &format!("throughput: {title}")).into_bytes(),
    )?;
    Ok(())
}

/// Prints one verdict line per checker.
pub fn print_results(outcome: &TestOutcome) {
    for r in &outcome.results {
        println!("  {:<22} {:<11} {}", r.checker, r.verdict.to_string(), r.summary);
    }
    println!("  report: {}", outcome.dir.display());
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::jepsen::history::build::*;

    #[test]
    fn timestamp_is_a_sortable_utc_stamp() {
        let t = timestamp();
        assert_eq!(t.len(), 15, "{t}");
        assert_eq!(&t[8..9], "T");
        assert!(t[..8].chars().all(|c| c.is_ascii_digit()) && t[9..].chars().all(|c| c.is_ascii_digit()));
        assert!(t.as_str() >= "20240101T000000");
    }

    #[test]
    fn replay_command_names_every_choice() {
        let mut o = TestOptions::new(WorkloadKind::Set);
        o.nemeses = vec![NemesisKind::Kill, NemesisKind::Partition];
        o.seed = 77;
        o.time_limit_ms = 20_000;
        o.node_args = vec!["--unsafe-local-reads".into()];
        assert!(!o.replay_command().contains("--tls"));
        o.security = SecurityOptions {
            tls: true,
            auth: true,
            token_ttl_ms: None,
        };
        let cmd = o.replay_command();
        for part in [
            "--workload set",
            "--nemesis kill,partition",
            "--time-limit 20s",
            "--seed 77",
            "--node-arg=--unsafe-local-reads",
            " --tls --auth",
        ] {
            assert!(cmd.contains(part), "{cmd} lacks {part}");
        }
    }

    #[test]
    fn run_dir_is_created_and_latest_points_at_it() {
        let store = tempfile::tempdir().unwrap();
        let dir = make_run_dir(store.path(), "reg/ister kill").unwrap();
        assert!(dir.is_dir());
        assert!(dir.starts_with(store.path().join("reg_ister_kill")));
        assert_eq!(
            std::fs::canonicalize(store.path().join("latest")).unwrap(),
            std::fs::canonicalize(&dir).unwrap()
        );
    }

    #[test]
    fn checkers_are_chosen_by_workload_and_report_is_written() {
        let mut h = History::default();
        h.push(invoke(0, "add", None, serde_json::json!(1)));
        h.push(done(0, OpType::Ok, "add", None, serde_json::json!(1)));
        h.push(invoke(0, "read", None, Value::Null));
        h.push(done(0, OpType::Ok, "read", None, serde_json::json!([])));
        let mut o = TestOptions::new(WorkloadKind::Set);
        o.name = "t".into();
        let results = run_checkers(&o, &h, &[]);
        let names: Vec<&str> = results.iter().map(|r| r.checker.as_str()).collect();
        assert_eq!(names, vec!["set", "convergence", "liveness"]);
        assert_eq!(
            results[0].verdict,
            Verdict::Invalid,
            "the acknowledged add is lost"
        );
        let dir = tempfile::tempdir().unwrap();
        write_report(&o, dir.path(), &h, &results, &[], Verdict::Invalid).unwrap();
        for f in ["results.json", "timeline.html", "latency.svg", "throughput.svg"] {
            assert!(dir.path().join(f).is_file(), "{f}");
        }
        let r: Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("results.json")).unwrap()).unwrap();
        assert_eq!(r["verdict"], serde_json::json!("invalid"));
    }
}
