//! Implementation of the `ftkvctl` command-line tool (not a stable library API; the binary in
//! `src/bin/ftkvctl.rs` only calls [`main`]).
//!
//! Shaped after etcdctl v3: global `--endpoints` (env `FTKV_ENDPOINTS`), `-w simple|json|table`,
//! `--hex` for binary keys, then `put`, `get`, `del`, `scan`, `txn`, `upsert`, `member`,
//! `endpoint status`, `bench put`.
//!
//! Exit codes: 0 on success (including `get` of a missing key: nothing is printed in simple
//! and table mode, `{"found":false}` in JSON mode); 1 on any failure, with a one-line
//! `Error: ...` on stderr; 2 on a command-line usage error (from clap).

pub mod bench;
pub mod hex;
pub mod output;
pub mod txn_script;

use std::io::Read;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use serde_json::json;

use crate::{Client, Error, ReadConsistency, ResponseInfo, RetryPolicy, ScanOptions, TxnOp, UpsertOp};
use output::{Bytes, Format};

/// Command-line client of an ftkv cluster.
#[derive(Debug, Parser)]
#[command(
    name = "ftkvctl",
    version,
    about = "Command-line client of an ftkv cluster",
    max_term_width = 110
)]
pub struct Cli {
    /// Comma-separated client endpoints (host:port). Any reachable node will do.
    #[arg(long, env = "FTKV_ENDPOINTS", default_value = crate::DEFAULT_ENDPOINT, value_delimiter = ',', global = true)]
    pub endpoints: Vec<String>,
    /// Output format.
    #[arg(
        short = 'w',
        long = "write-out",
        value_enum,
        default_value = "simple",
        global = true
    )]
    pub write_out: Format,
    /// Keys and values on the command line, in txn scripts and in the output are hex.
    #[arg(long, global = true)]
    pub hex: bool,
    /// Overall time budget of the command (all retries included), e.g. "10s", "500ms"
    /// (etcdctl's --command-timeout is 5s too).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration, global = true)]
    pub timeout: Duration,
    /// Time budget of one attempt (capped by --timeout).
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration, global = true)]
    pub request_timeout: Duration,
    /// Time budget to open a connection to one endpoint.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration, global = true)]
    pub connect_timeout: Duration,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Write a key. Without VALUE the value is read from stdin, byte for byte (for large or
    /// binary values; with --hex stdin holds hex text).
    Put {
        /// Key.
        key: String,
        /// Value (omit to read it from stdin).
        value: Option<String>,
    },
    /// Read a key, or every key with a prefix. A missing key prints nothing (exit 0);
    /// in JSON mode it prints {"found":false}.
    Get {
        /// Key (or prefix with --prefix).
        key: String,
        /// Read every key that starts with KEY.
        #[arg(long)]
        prefix: bool,
        /// Serve from the answering node's local state (may be stale).
        #[arg(long)]
        serializable: bool,
        /// Print only the value(s), not the key(s).
        #[arg(long)]
        print_value_only: bool,
        /// With --prefix: at most this many pairs (0 = all).
        #[arg(long, default_value_t = 0)]
        limit: usize,
    },
    /// Delete a key, or every key with a prefix.
    Del {
        /// Key (or prefix with --prefix; an empty prefix deletes everything).
        key: String,
        /// Delete every key that starts with KEY.
        #[arg(long)]
        prefix: bool,
    },
    /// Read the range [START, END) in key order (empty START = first key, no END = unbounded).
    Scan {
        /// Inclusive start key.
        start: Option<String>,
        /// Exclusive end key.
        end: Option<String>,
        /// At most this many pairs (0 = all).
        #[arg(long, default_value_t = 0)]
        limit: usize,
        /// Serve from the answering node's local state (may be stale).
        #[arg(long)]
        serializable: bool,
        /// Print keys only.
        #[arg(long)]
        keys_only: bool,
    },
    /// Run a transaction read from stdin: compares, blank line, success ops, blank line,
    /// failure ops. Compares: value("k") = "v" (=, !=, >, <), exists("k"), !exists("k").
    /// Ops: put K V | del K | get K | add K N | append K V | set-if-absent K V | max K V |
    /// del-range START END. Lines starting with # are comments.
    Txn,
    /// Read-free update of one key.
    Upsert(UpsertArgs),
    /// Cluster membership.
    #[command(subcommand)]
    Member(MemberCommand),
    /// Node status.
    #[command(subcommand)]
    Endpoint(EndpointCommand),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
}

/// `upsert K (--add N | --append V | --set-if-absent V | --max V)`.
#[derive(Debug, Args)]
pub struct UpsertArgs {
    /// Key.
    pub key: String,
    /// The operation (exactly one).
    #[command(flatten)]
    pub op: UpsertOpArgs,
}

/// Exactly one upsert operation.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct UpsertOpArgs {
    /// Add N to the 8-byte little-endian counter (absent = 0, saturating).
    #[arg(long, allow_negative_numbers = true)]
    pub add: Option<i64>,
    /// Append bytes to the value.
    #[arg(long)]
    pub append: Option<String>,
    /// Store the value only if the key is absent.
    #[arg(long)]
    pub set_if_absent: Option<String>,
    /// Keep the byte-wise maximum of the value and this operand.
    #[arg(long)]
    pub max: Option<String>,
}

/// `member ...`.
#[derive(Debug, Subcommand)]
pub enum MemberCommand {
    /// List voters and learners.
    List,
    /// Add a non-voting learner.
    AddLearner {
        /// New node id.
        id: u64,
        /// Its client endpoint (host:port).
        client_endpoint: String,
        /// Its peer endpoint (host:port).
        peer_endpoint: String,
    },
    /// Turn a learner into a voter.
    Promote {
        /// Node id.
        id: u64,
    },
    /// Remove a voter or learner.
    Remove {
        /// Node id.
        id: u64,
    },
}

/// `endpoint ...`.
#[derive(Debug, Subcommand)]
pub enum EndpointCommand {
    /// Status of each endpoint (--cluster: of every member). Unreachable nodes are reported on
    /// stderr and left out of the output; the exit code is 1 only when none answered.
    Status {
        /// Ask every member of the cluster, not only --endpoints.
        #[arg(long)]
        cluster: bool,
        /// Also compute each node's state digest (a full scan: slow on big data).
        #[arg(long)]
        digest: bool,
    },
}

/// `bench ...`.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Random-key puts from N concurrent clients for a fixed time.
    Put {
        /// Concurrent writers.
        #[arg(long, default_value_t = 64)]
        clients: usize,
        /// How long to write, e.g. "30s".
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        duration: Duration,
        /// Bytes per value.
        #[arg(long, default_value_t = 128)]
        value_size: usize,
        /// Number of distinct keys.
        #[arg(long, default_value_t = 100_000)]
        key_space: u64,
        /// Key prefix.
        #[arg(long, default_value = "bench/")]
        key_prefix: String,
        /// HTTP/2 connections per endpoint shared by the writers.
        #[arg(long, default_value_t = 1)]
        connections: usize,
        /// No progress lines on stderr.
        #[arg(long)]
        quiet: bool,
    },
}

/// Runs `ftkvctl` with the process arguments; returns the exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    // Retries and redirects are logged at debug level: `RUST_LOG=ftkv_client=debug ftkvctl ...`.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .init();
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error: cannot start the async runtime: {e}");
            return 1;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("Error: {}", one_line(&e));
            1
        }
    }
}

/// The error and its causes on one line.
fn one_line(e: &anyhow::Error) -> String {
    let parts: Vec<String> = e.chain().map(|c| c.to_string()).collect();
    let mut out: Vec<String> = Vec::new();
    for p in parts {
        // Skip causes already contained in the previous message.
        if out.last().is_some_and(|last| last.contains(&p)) {
            continue;
        }
        out.push(p);
    }
    out.join(": ").replace('\n', " ")
}

/// Decodes a command-line key or value: hex with `--hex`, else its UTF-8 bytes.
fn arg_bytes(text: &str, hex: bool, what: &str) -> anyhow::Result<Vec<u8>> {
    if hex {
        hex::decode(text).with_context(|| format!("invalid hex {what}"))
    } else {
        Ok(text.as_bytes().to_vec())
    }
}

/// The value of `put K` without V: stdin as bytes (with `--hex`: hex text, whitespace trimmed).
fn read_stdin_value(hex: bool) -> anyhow::Result<Vec<u8>> {
    let mut raw = Vec::new();
    std::io::stdin()
        .read_to_end(&mut raw)
        .context("cannot read the value from stdin")?;
    if hex {
        let text = String::from_utf8(raw).context("stdin is not hex text")?;
        return arg_bytes(text.trim(), true, "value on stdin");
    }
    Ok(raw)
}

async fn connect(cli: &Cli) -> anyhow::Result<Client> {
    let connections = match &cli.command {
        Command::Bench(BenchCommand::Put { connections, .. }) => *connections,
        _ => 1,
    };
    let policy = RetryPolicy {
        deadline: cli.timeout,
        max_attempts: 20,
        ..RetryPolicy::default()
    };
    let client = Client::builder()
        .endpoints(&cli.endpoints)
        .connect_timeout(cli.connect_timeout)
        .request_timeout(cli.request_timeout.min(cli.timeout))
        .retry(policy)
        .connections_per_endpoint(connections)
        .build()
        .await
        .context("bad --endpoints")?;
    Ok(client)
}

fn print(s: &str) {
    if !s.is_empty() {
        println!("{s}");
    }
}

fn write_ok(format: Format, info: ResponseInfo) -> String {
    match format {
        Format::Json => {
            json!({ "ok": true, "node_id": info.node_id, "term": info.term, "log_index": info.log_index })
                .to_string()
        }
        Format::Simple | Format::Table => "OK".to_string(),
    }
}

/// Runs one parsed command.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let client = connect(&cli).await?;
    let format = cli.write_out;
    let bytes = Bytes { hex: cli.hex };
    let hex = cli.hex;
    match &cli.command {
        Command::Put { key, value } => {
            let value = match value {
                Some(v) => arg_bytes(v, hex, "value")?,
                None => read_stdin_value(hex)?,
            };
            let info = client.put(arg_bytes(key, hex, "key")?, value).await?;
            print(&write_ok(format, info));
        }
        Command::Get {
            key,
            prefix,
            serializable,
            print_value_only,
            limit,
        } => {
            let consistency = if *serializable {
                ReadConsistency::Serializable
            } else {
                ReadConsistency::Linearizable
            };
            let key = arg_bytes(key, hex, "key")?;
            if *prefix {
                let opts = ScanOptions {
                    consistency,
                    ..ScanOptions::default()
                };
                let kvs = client.scan_prefix(&key, *limit, opts).await?;
                print_pairs(format, bytes, &kvs, *print_value_only);
            } else {
                let value = client.get_with(&key, consistency).await?;
                print(&get_output(
                    format,
                    bytes,
                    &key,
                    value.as_deref(),
                    *print_value_only,
                ));
            }
        }
        Command::Del { key, prefix } => {
            let key = arg_bytes(key, hex, "key")?;
            let info = if *prefix {
                client.delete_prefix(&key).await?
            } else {
                client.delete(&key).await?
            };
            print(&write_ok(format, info));
        }
        Command::Scan {
            start,
            end,
            limit,
            serializable,
            keys_only,
        } => {
            let start = arg_bytes(start.as_deref().unwrap_or(""), hex, "start key")?;
            let end = arg_bytes(end.as_deref().unwrap_or(""), hex, "end key")?;
            let consistency = if *serializable {
                ReadConsistency::Serializable
            } else {
                ReadConsistency::Linearizable
            };
            let opts = ScanOptions {
                consistency,
                keys_only: *keys_only,
                ..ScanOptions::default()
            };
            let kvs = client.scan_all(&start, &end, *limit, opts).await?;
            print(&output::kvs(format, bytes, &kvs, *keys_only));
        }
        Command::Txn => {
            let mut script = String::new();
            std::io::stdin()
                .read_to_string(&mut script)
                .context("cannot read the txn script from stdin")?;
            let txn = txn_script::parse(&script, hex)?;
            let branch_ops = |succeeded: bool| {
                if succeeded {
                    txn.success.clone()
                } else {
                    txn.failure.clone()
                }
            };
            let result = client.txn(txn.clone()).await?;
            print(&txn_output(format, bytes, &branch_ops(result.succeeded), &result));
        }
        Command::Upsert(args) => {
            let op = match (
                &args.op.add,
                &args.op.append,
                &args.op.set_if_absent,
                &args.op.max,
            ) {
                (Some(n), _, _, _) => UpsertOp::Add(*n),
                (_, Some(v), _, _) => UpsertOp::Append(arg_bytes(v, hex, "value")?),
                (_, _, Some(v), _) => UpsertOp::SetIfAbsent(arg_bytes(v, hex, "value")?),
                (_, _, _, Some(v)) => UpsertOp::Max(arg_bytes(v, hex, "value")?),
                _ => bail!("upsert needs one of --add, --append, --set-if-absent, --max"),
            };
            let info = client.upsert(arg_bytes(&args.key, hex, "key")?, op).await?;
            print(&write_ok(format, info));
        }
        Command::Member(cmd) => {
            let (message, membership) = match cmd {
                MemberCommand::List => (None, client.members().await?),
                MemberCommand::AddLearner {
                    id,
                    client_endpoint,
                    peer_endpoint,
                } => (
                    Some(format!("Member {id} added as a learner")),
                    client.add_learner(*id, client_endpoint, peer_endpoint).await?,
                ),
                MemberCommand::Promote { id } => (
                    Some(format!("Member {id} promoted to voter")),
                    client.promote(*id).await?,
                ),
                MemberCommand::Remove { id } => {
                    (Some(format!("Member {id} removed")), client.remove(*id).await?)
                }
            };
            if let (Some(m), Format::Simple | Format::Table) = (&message, format) {
                println!("{m}");
            }
            print(&output::membership(format, &membership));
        }
        Command::Endpoint(EndpointCommand::Status { cluster, digest }) => {
            endpoint_status(&client, &cli, *cluster, *digest).await?;
        }
        Command::Bench(BenchCommand::Put {
            clients,
            duration,
            value_size,
            key_space,
            key_prefix,
            quiet,
            ..
        }) => {
            let cfg = bench::BenchConfig {
                clients: *clients,
                duration: *duration,
                value_size_bytes: *value_size,
                key_space: *key_space,
                key_prefix: key_prefix.clone(),
                progress: !quiet,
            };
            let report = bench::run_put(&client, &cfg).await?;
            match format {
                Format::Json => println!("{}", report.to_json()),
                Format::Simple | Format::Table => println!("{}", report.to_text()),
            }
            if report.ops == 0 {
                bail!(
                    "no write was acknowledged ({} errors; first: {})",
                    report.errors,
                    report.first_error.as_deref().unwrap_or("none")
                );
            }
        }
    }
    Ok(())
}

fn print_pairs(format: Format, bytes: Bytes, kvs: &[crate::KeyValue], value_only: bool) {
    if value_only && format == Format::Simple {
        for kv in kvs {
            println!("{}", bytes.show(&kv.value));
        }
    } else {
        print(&output::kvs(format, bytes, kvs, false));
    }
}

/// Output of `get KEY`: nothing / `{"found":false}` when absent.
fn get_output(format: Format, bytes: Bytes, key: &[u8], value: Option<&[u8]>, value_only: bool) -> String {
    match (format, value) {
        (Format::Json, None) => json!({ "found": false }).to_string(),
        (Format::Json, Some(v)) => {
            json!({ "found": true, "key": bytes.show(key), "value": bytes.show(v) }).to_string()
        }
        (_, None) => String::new(),
        (Format::Simple, Some(v)) if value_only => bytes.show(v),
        (Format::Simple, Some(v)) => format!("{}\n{}", bytes.show(key), bytes.show(v)),
        (Format::Table, Some(v)) => output::table(&["KEY", "VALUE"], &[vec![bytes.show(key), bytes.show(v)]]),
    }
}

/// Output of `txn`: SUCCESS/FAILURE, then each get of the branch that ran.
fn txn_output(format: Format, bytes: Bytes, ops: &[TxnOp], result: &crate::TxnResult) -> String {
    let verdict = if result.succeeded { "SUCCESS" } else { "FAILURE" };
    let missing = crate::TxnOpResult::default();
    let pairs = ops
        .iter()
        .zip(result.results.iter().chain(std::iter::repeat(&missing)));
    match format {
        Format::Json => {
            let results: Vec<serde_json::Value> = pairs
                .map(|(op, r)| match op {
                    TxnOp::Get { key } => {
                        let mut v = json!({ "op": "get", "key": bytes.show(key), "found": r.found });
                        if r.found {
                            v["value"] = json!(bytes.show(&r.value));
                        }
                        v
                    }
                    TxnOp::Put { key, .. } => json!({ "op": "put", "key": bytes.show(key) }),
                    TxnOp::Delete { key } => json!({ "op": "del", "key": bytes.show(key) }),
                    TxnOp::Upsert { key, .. } => json!({ "op": "upsert", "key": bytes.show(key) }),
                    TxnOp::DeleteRange { start, end } => {
                        json!({ "op": "del-range", "start": bytes.show(start), "end": bytes.show(end) })
                    }
                })
                .collect();
            json!({ "succeeded": result.succeeded, "log_index": result.info.log_index, "results": results })
                .to_string()
        }
        Format::Simple | Format::Table => {
            let mut lines = vec![verdict.to_string()];
            for (op, r) in pairs {
                if let TxnOp::Get { key } = op {
                    if r.found {
                        lines.push(bytes.show(key));
                        lines.push(bytes.show(&r.value));
                    }
                }
            }
            lines.join("\n")
        }
    }
}

async fn endpoint_status(client: &Client, cli: &Cli, cluster: bool, digest: bool) -> anyhow::Result<()> {
    let results: Vec<(String, Result<crate::NodeStatus, Error>)> = if cluster {
        client.status_all_with(digest).await
    } else {
        let targets = client.endpoints();
        let futures = targets.iter().map(|ep| client.status_with(ep, digest));
        let results = futures::future::join_all(futures).await;
        targets.into_iter().zip(results).collect()
    };
    let mut ok = Vec::new();
    let mut failed: Vec<(String, Error)> = Vec::new();
    for (ep, r) in results {
        match r {
            Ok(s) => ok.push(s),
            Err(e) => failed.push((ep, e)),
        }
    }
    for (_, e) in &failed {
        eprintln!("warning: {e}");
    }
    if ok.is_empty() {
        let detail = failed.first().map(|(_, e)| e.to_string()).unwrap_or_default();
        bail!("no endpoint answered ({detail})");
    }
    print(&output::statuses(cli.write_out, &ok));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_parses_globals_anywhere() {
        let cli = Cli::try_parse_from([
            "ftkvctl",
            "get",
            "k",
            "--endpoints",
            "a:1,b:2",
            "-w",
            "json",
            "--hex",
        ])
        .unwrap();
        assert_eq!(cli.endpoints, vec!["a:1".to_string(), "b:2".to_string()]);
        assert_eq!(cli.write_out, Format::Json);
        assert!(cli.hex);
        assert!(matches!(cli.command, Command::Get { ref key, prefix: false, .. } if key == "k"));
    }

    #[test]
    fn upsert_needs_exactly_one_op() {
        let cli = Cli::try_parse_from(["ftkvctl", "upsert", "k", "--add", "-5"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Upsert(UpsertArgs {
                op: UpsertOpArgs { add: Some(-5), .. },
                ..
            })
        ));
        assert!(Cli::try_parse_from(["ftkvctl", "upsert", "k"]).is_err());
        assert!(Cli::try_parse_from(["ftkvctl", "upsert", "k", "--add", "1", "--append", "x"]).is_err());
    }

    #[test]
    fn bench_and_status_parse() {
        let cli = Cli::try_parse_from([
            "ftkvctl",
            "-w",
            "json",
            "bench",
            "put",
            "--clients",
            "128",
            "--duration",
            "30s",
            "--value-size",
            "64",
        ])
        .unwrap();
        match cli.command {
            Command::Bench(BenchCommand::Put {
                clients,
                duration,
                value_size,
                ..
            }) => {
                assert_eq!(
                    (clients, duration, value_size),
                    (128, Duration::from_secs(30), 64)
                );
            }
            other => panic!("{other:?}"),
        }
        let cli = Cli::try_parse_from(["ftkvctl", "endpoint", "status", "--cluster"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Endpoint(EndpointCommand::Status { cluster: true, .. })
        ));
        assert_eq!(cli.endpoints, vec![crate::DEFAULT_ENDPOINT.to_string()]);
    }

    #[test]
    fn hex_arguments() {
        assert_eq!(arg_bytes("00ff", true, "key").unwrap(), vec![0, 255]);
        assert_eq!(arg_bytes("00ff", false, "key").unwrap(), b"00ff".to_vec());
        let e = arg_bytes("0g", true, "key").unwrap_err();
        assert!(one_line(&e).contains("invalid hex key"), "{}", one_line(&e));
    }

    #[test]
    fn get_output_for_missing_and_present_keys() {
        let b = Bytes { hex: false };
        assert_eq!(
            get_output(Format::Json, b, b"k", None, false),
            r#"{"found":false}"#
        );
        assert_eq!(get_output(Format::Simple, b, b"k", None, false), "");
        assert_eq!(get_output(Format::Simple, b, b"k", Some(b"v"), false), "k\nv");
        assert_eq!(get_output(Format::Simple, b, b"k", Some(b"v"), true), "v");
        let v: serde_json::Value =
            serde_json::from_str(&get_output(Format::Json, b, b"k", Some(b"v"), false)).unwrap();
        assert_eq!(v["found"], true);
        assert_eq!(v["value"], "v");
    }

    #[test]
    fn txn_output_lists_gets_of_the_branch() {
        let ops = vec![
            TxnOp::Put {
                key: b"a".to_vec(),
                value: b"1".to_vec(),
            },
            TxnOp::Get { key: b"a".to_vec() },
        ];
        let result = crate::TxnResult {
            succeeded: true,
            results: vec![
                crate::TxnOpResult::default(),
                crate::TxnOpResult {
                    found: true,
                    value: b"1".to_vec(),
                },
            ],
            info: ResponseInfo::default(),
        };
        let b = Bytes { hex: false };
        assert_eq!(txn_output(Format::Simple, b, &ops, &result), "SUCCESS\na\n1");
        let v: serde_json::Value = serde_json::from_str(&txn_output(Format::Json, b, &ops, &result)).unwrap();
        assert_eq!(v["succeeded"], true);
        assert_eq!(v["results"][1]["value"], "1");
        assert_eq!(v["results"][0]["op"], "put");
    }

    #[test]
    fn one_line_joins_causes() {
        let e = anyhow::anyhow!("inner cause").context("outer");
        assert_eq!(one_line(&e), "outer: inner cause");
    }
}
