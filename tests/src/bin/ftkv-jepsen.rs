//! `ftkv-jepsen`: the Jepsen-style fault harness for ftkv.
//!
//! ```text
//! ftkv-jepsen test --workload register --nemesis partition,kill,pause --time-limit 60s
//! ftkv-jepsen scenario tests/scenarios/
//! ftkv-jepsen test --workload register --nemesis kill,pause,partition --substrate docker --image ftkv:dev
//! ftkv-jepsen check store/latest/history.jsonl --checker linearizable
//! ftkv-jepsen cleanup
//! ```
//! Exit status: 0 every checker valid (faults the node cannot support are printed as
//! `unsupported`), 1 some checker found an anomaly, 2 the harness failed or a checker could not
//! decide. Needs the `ftkv-node` binary next to this one (or `FTKV_BIN_DIR`).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::{Parser, Subcommand};
use ftkv_tests::jepsen::checker::{CheckResult, Verdict};
use ftkv_tests::jepsen::db::{SubstrateKind, DEFAULT_DOCKER_IMAGE};
use ftkv_tests::jepsen::history::History;
use ftkv_tests::jepsen::nemesis::NemesisKind;
use ftkv_tests::jepsen::runner::{self, TestOptions, TestOutcome};
use ftkv_tests::jepsen::scenario::{self, Scenario};
use ftkv_tests::jepsen::security::SecurityOptions;
use ftkv_tests::jepsen::workload::{WorkloadKind, WorkloadOptions};

#[derive(Parser)]
#[command(
    name = "ftkv-jepsen",
    about = "Jepsen-style fault tests against a real ftkv cluster"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one randomized test: a workload under a fault schedule, then check it.
    Test {
        /// Workload.
        #[arg(long, value_enum)]
        workload: WorkloadKind,
        /// Comma-separated faults: partition,kill,pause,clock,disk,lose-unsynced,membership (or none).
        #[arg(long, default_value = "none")]
        nemesis: String,
        /// Main phase length (`60s`, `2m`).
        #[arg(long, default_value = "60s")]
        time_limit: String,
        /// Where the nodes run.
        #[arg(long, value_enum, default_value = "netns")]
        substrate: SubstrateKind,
        /// Image of the docker substrate's containers (deploy/build-image.sh builds it).
        #[arg(long, env = "FTKV_JEPSEN_IMAGE", default_value = DEFAULT_DOCKER_IMAGE)]
        image: String,
        /// Concurrent client workers.
        #[arg(long, default_value_t = 5)]
        concurrency: usize,
        /// Seed (default: from the clock; printed).
        #[arg(long)]
        seed: Option<u64>,
        /// Target total rate, ops/s.
        #[arg(long, default_value_t = 50.0)]
        rate: f64,
        /// Report store.
        #[arg(long, default_value = "store")]
        store: PathBuf,
        /// Node count.
        #[arg(long, default_value_t = 3)]
        nodes: u64,
        /// Extra `ftkv-node run` flag, repeatable (`--node-arg=--unsafe-local-reads`).
        #[arg(long = "node-arg", allow_hyphen_values = true)]
        node_args: Vec<String>,
        /// Test name (store folder); default `<workload>-<nemeses>` (`-tls`, `-auth` appended).
        #[arg(long)]
        name: Option<String>,
        /// TLS on every port (throwaway CA from `ftkv-node certs`), client-cert auth, peers
        /// authenticated by certificate; the harness's clients connect over TLS.
        #[arg(long)]
        tls: bool,
        /// Users, roles and tokens: root and a workload user with READWRITE on `jepsen/`, auth
        /// enabled; the workers authenticate as that user.
        #[arg(long)]
        auth: bool,
        /// Token lifetime with --auth (`10s`, `500ms`); default 10 s, so tokens are renewed and
        /// expire during the run.
        #[arg(long, requires = "auth")]
        token_ttl: Option<String>,
    },
    /// Run scenario files (a file, or every *.toml in a folder).
    Scenario {
        /// File or folder.
        path: PathBuf,
        /// Report store.
        #[arg(long, default_value = "store")]
        store: PathBuf,
        /// Override every scenario's substrate.
        #[arg(long, value_enum)]
        substrate: Option<SubstrateKind>,
        /// Image of the docker substrate's containers (deploy/build-image.sh builds it).
        #[arg(long, env = "FTKV_JEPSEN_IMAGE", default_value = DEFAULT_DOCKER_IMAGE)]
        image: String,
    },
    /// Re-check a recorded history offline.
    Check {
        /// history.jsonl
        history: PathBuf,
        /// linearizable, set, counter, bank or append.
        #[arg(long)]
        checker: String,
    },
    /// Remove namespaces and bridges left by a killed harness (names `fj*`; also a running one's),
    /// and the containers and networks of docker-substrate runs whose harness is gone
    /// (`ftkv-jepsen-*`).
    Cleanup,
}

fn print_verdicts(results: &[CheckResult]) {
    for r in results {
        println!("  {:<22} {:<11} {}", r.checker, r.verdict.to_string(), r.summary);
    }
}

fn interrupt_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let f = flag.clone();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending::<()>().await } } => {}
        }
        eprintln!("ftkv-jepsen: interrupted; healing and tearing down");
        f.store(true, Ordering::Relaxed);
    });
    flag
}

/// Runs one test; returns the exit code and a one-word verdict for summaries.
async fn run_one(options: &TestOptions, interrupted: Arc<AtomicBool>) -> (i32, String) {
    match runner::run_test(options, interrupted).await {
        Ok(outcome) => {
            report(options, &outcome);
            (outcome.exit_code(), outcome.verdict.to_string())
        }
        Err(e) => {
            eprintln!("ftkv-jepsen: harness failure: {e}");
            (2, "harness-failure".into())
        }
    }
}

fn report(options: &TestOptions, outcome: &TestOutcome) {
    runner::print_results(outcome);
    println!("  verdict: {} (seed {})", outcome.verdict, options.seed);
    // Scenarios print their own replay line (the file) in the scenario loop.
    if outcome.verdict != Verdict::Valid
        && outcome.verdict != Verdict::Unsupported
        && options.script.is_none()
    {
        println!("  replay: {}", options.replay_command());
    }
}

async fn real_main() -> i32 {
    let cli = Cli::parse();
    match cli.command {
        Command::Test {
            workload,
            nemesis,
            time_limit,
            substrate,
            image,
            concurrency,
            seed,
            rate,
            store,
            nodes,
            node_args,
            name,
            tls,
            auth,
            token_ttl,
        } => {
            let nemeses = match NemesisKind::parse_list(&nemesis) {
                Ok(n) => n,
                Err(e) => {
                    eprintln!("ftkv-jepsen: {e}");
                    return 2;
                }
            };
            let limit = match scenario::parse_duration(&time_limit) {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("ftkv-jepsen: {e}");
                    return 2;
                }
            };
            let token_ttl_ms = match token_ttl.as_deref().map(scenario::parse_duration) {
                None => None,
                Some(Ok(d)) => Some(d.as_millis() as u64),
                Some(Err(e)) => {
                    eprintln!("ftkv-jepsen: --token-ttl: {e}");
                    return 2;
                }
            };
            let seed = seed.unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1)
                    % 1_000_000_007
            });
            let mut o = TestOptions::new(workload);
            o.name = name.unwrap_or_else(|| {
                let n: Vec<&str> = nemeses.iter().map(|k| k.name()).collect();
                format!(
                    "{}-{}{}{}",
                    workload.name(),
                    if n.is_empty() { "none".into() } else { n.join(",") },
                    if tls { "-tls" } else { "" },
                    if auth { "-auth" } else { "" }
                )
            });
            o.security = SecurityOptions {
                tls,
                auth,
                token_ttl_ms,
            };
            o.workload_options = WorkloadOptions::default();
            o.nemeses = nemeses;
            o.time_limit_ms = limit.as_millis() as u64;
            o.substrate = substrate;
            o.docker_image = image;
            o.concurrency = concurrency;
            o.seed = seed;
            o.rate = rate;
            o.store = store;
            o.nodes = nodes;
            o.node_args = node_args;
            println!("ftkv-jepsen: seed {seed}");
            run_one(&o, interrupt_flag()).await.0
        }
        Command::Scenario {
            path,
            store,
            substrate,
            image,
        } => {
            let files = match scenario::scenario_files(&path) {
                Ok(f) if !f.is_empty() => f,
                Ok(_) => {
                    eprintln!("ftkv-jepsen: no scenario files in {}", path.display());
                    return 2;
                }
                Err(e) => {
                    eprintln!("ftkv-jepsen: {e}");
                    return 2;
                }
            };
            let interrupted = interrupt_flag();
            let mut worst = 0;
            let mut summary = Vec::new();
            for f in files {
                if interrupted.load(Ordering::Relaxed) {
                    break;
                }
                let s = match Scenario::load(&f) {
                    Ok(s) => s,
                    Err(e) => {
                        eprintln!("ftkv-jepsen: {e}");
                        worst = 2;
                        continue;
                    }
                };
                println!("ftkv-jepsen: scenario {} ({})", s.name, f.display());
                let mut o = s.test_options(&store, substrate);
                o.docker_image.clone_from(&image);
                let (code, verdict) = run_one(&o, interrupted.clone()).await;
                if code != 0 {
                    println!("  replay: ftkv-jepsen scenario {}", f.display());
                }
                summary.push((s.name, code, verdict));
                worst = worst.max(code);
            }
            println!("ftkv-jepsen: scenarios");
            for (n, _, verdict) in &summary {
                println!("  {n:<40} {verdict}");
            }
            let passed = summary.iter().filter(|(_, c, _)| *c == 0).count();
            println!("scenarios: {passed} passed, {} failed", summary.len() - passed);
            worst
        }
        Command::Check { history, checker } => {
            let file = match std::fs::File::open(&history) {
                Ok(f) => f,
                Err(e) => {
                    eprintln!("ftkv-jepsen: {}: {e}", history.display());
                    return 2;
                }
            };
            let h = match History::read_jsonl(std::io::BufReader::new(file)) {
                Ok(h) => h,
                Err(e) => {
                    eprintln!("ftkv-jepsen: {e}");
                    return 2;
                }
            };
            let workload = match checker.as_str() {
                "set" => WorkloadKind::Set,
                "counter" => WorkloadKind::Counter,
                "bank" => WorkloadKind::Bank,
                "append" => WorkloadKind::Append,
                "load" => WorkloadKind::Load,
                _ => WorkloadKind::Register,
            };
            let mut o = TestOptions::new(workload);
            o.checks = Some(vec![checker]);
            let results = runner::run_checkers(&o, &h, &[]);
            print_verdicts(&results);
            let v = results.iter().fold(Verdict::Valid, |v, r| v.merge(r.verdict));
            match v {
                Verdict::Valid | Verdict::Unsupported => 0,
                Verdict::Invalid => 1,
                Verdict::Unknown => 2,
            }
        }
        Command::Cleanup => {
            let mut removed = ftkv_tests::jepsen::netns::cleanup_leftovers();
            removed.extend(ftkv_tests::jepsen::docker::cleanup_leftovers(false));
            println!("removed {} leftover(s): {}", removed.len(), removed.join(" "));
            0
        }
    }
}

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ftkv-jepsen: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let code = runtime.block_on(real_main());
    ExitCode::from(code.clamp(0, 255) as u8)
}
