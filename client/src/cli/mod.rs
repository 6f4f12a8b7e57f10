//! Implementation of the `ftkvctl` command-line tool (not a stable library API; the binary in
//! `src/bin/ftkvctl.rs` only calls [`main`]).
//!
//! Shaped after etcdctl v3: global `--endpoints` (env `FTKV_ENDPOINTS`), `-w simple|json|table`,
//! `--hex` for binary keys, then `put`, `get`, `del`, `scan`, `txn`, `upsert`, `member`,
//! `endpoint status`, `endpoint health`, `alarm list|disarm`, `snapshot save`, `bench put`,
//! `user`, `role`, `auth` (etcd's auth; global `--user`, password never from a flag: see [`auth`]).
//!
//! Exit codes: 0 on success (including `get` of a missing key: nothing is printed in simple
//! and table mode, `{"found":false}` in JSON mode) and when stdout is closed early (e.g.
//! `ftkvctl scan | head -1`: the rest of the output is dropped quietly, as `cat` does); 1 on any
//! failure, with a one-line `Error: ...` on stderr; 2 on a command-line usage error (from clap,
//! including zero `--timeout`, `--request-timeout`, `--connect-timeout`, bench `--clients`,
//! `--duration`, `--connections`, `--key-space`).
//!
//! Keys and values in the output are lossless (see [`output::Bytes`]): `simple` writes them byte
//! for byte (each followed by a newline), `json` writes text when valid UTF-8 and otherwise hex
//! with a `<field>_encoding: "hex"` marker, `--hex` writes hex everywhere.

pub mod alarm;
pub mod auth;
pub mod bench;
mod endpoint;
pub mod hex;
pub mod load;
pub mod member;
pub mod output;
pub mod snapshot;
pub mod txn_script;

use std::io::{Read, Write};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use serde_json::json;

use crate::{Client, Error, ReadConsistency, ResponseInfo, RetryPolicy, ScanOptions, TxnOp, UpsertOp};
use output::{Bytes, Format};

/// Output notes shown at the end of `ftkvctl --help`.
const AFTER_HELP: &str = "\
Output: in simple mode keys and values are written byte for byte, each followed by a newline \
(binary values are safe to redirect to a file). In json mode a key or value that is not valid \
UTF-8 is written as lower-case hex and its object gets a field \"<name>_encoding\": \"hex\" \
(e.g. {\"key\":\"k\",\"value\":\"00ff\",\"value_encoding\":\"hex\"}); with --hex every key and \
value is hex and carries that marker. A closed stdout (ftkvctl scan | head -1) ends the \
command quietly with exit code 0.";

/// Command-line client of an ftkv cluster.
#[derive(Debug, Parser)]
#[command(
    name = "ftkvctl",
    version,
    about = "Command-line client of an ftkv cluster",
    after_help = AFTER_HELP,
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
    /// (etcdctl's --command-timeout is 5s too). Must be > 0.
    #[arg(long, default_value = "5s", value_parser = positive_duration, global = true)]
    pub timeout: Duration,
    /// Time budget of one attempt (capped by --timeout). Must be > 0.
    #[arg(long, default_value = "5s", value_parser = positive_duration, global = true)]
    pub request_timeout: Duration,
    /// Time budget to open a connection to one endpoint. Must be > 0.
    #[arg(long, default_value = "2s", value_parser = positive_duration, global = true)]
    pub connect_timeout: Duration,
    /// CA certificate (PEM) that signs the nodes' certificates: connect over TLS (https://).
    #[arg(long, id = "cacert_file", env = "FTKV_CACERT", global = true)]
    pub cacert: Option<std::path::PathBuf>,
    /// Client certificate (PEM) to present (a node with --client-cert-auth requires one).
    #[arg(
        long = "cert",
        id = "cert_file",
        env = "FTKV_CERT",
        global = true,
        requires = "key_file"
    )]
    pub cert: Option<std::path::PathBuf>,
    /// Private key (PEM) of --cert.
    #[arg(
        long = "key",
        id = "key_file",
        env = "FTKV_KEY",
        global = true,
        requires = "cert_file"
    )]
    pub key: Option<std::path::PathBuf>,
    /// Authenticate as this user (auth enabled). The password comes from --password-file,
    /// else FTKV_PASSWORD, else a prompt when stdin is a terminal (never a flag).
    #[arg(long, env = "FTKV_USER", global = true)]
    pub user: Option<String>,
    /// File whose first line is the password of --user.
    #[arg(long, env = "FTKV_PASSWORD_FILE", global = true, requires = "user")]
    pub password_file: Option<std::path::PathBuf>,
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
    Member(member::MemberCommand),
    /// Node status.
    #[command(subcommand)]
    Endpoint(EndpointCommand),
    /// NOSPACE alarms of every node (list, disarm).
    #[command(subcommand)]
    Alarm(alarm::AlarmCommand),
    /// Backups (save; `ftkv-node snapshot status|restore` read them).
    #[command(subcommand)]
    Snapshot(snapshot::SnapshotCommand),
    /// Bulk-load a CSV/TSV file (LOAD DATA INFILE): all rows visible together, or none.
    Load(load::LoadArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Users (add, delete, list, get, grant-role, revoke-role, passwd).
    #[command(subcommand)]
    User(auth::UserCommand),
    /// Roles and their permissions on keys and ranges.
    #[command(subcommand)]
    Role(auth::RoleCommand),
    /// Turn auth on or off, or show whether it is on.
    #[command(subcommand)]
    Auth(auth::AuthCommand),
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
    /// Health of each endpoint (--cluster: of every member): healthy when it answers, serves
    /// (leader, follower or learner) and knows a leader. Exit code 1 when any is unhealthy
    /// (a container health check: `ftkvctl --endpoints 127.0.0.1:7379 endpoint health`).
    Health {
        /// Ask every member of the cluster, not only --endpoints.
        #[arg(long)]
        cluster: bool,
    },
}

/// `bench ...`.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Random-key puts from N concurrent clients for a fixed time.
    Put {
        /// Concurrent writers (>= 1).
        #[arg(long, default_value_t = 64, value_parser = at_least_one::<usize>)]
        clients: usize,
        /// How long to write, e.g. "30s" (> 0).
        #[arg(long, default_value = "10s", value_parser = positive_duration)]
        duration: Duration,
        /// Bytes per value.
        #[arg(long, default_value_t = 128)]
        value_size: usize,
        /// Number of distinct keys (>= 1).
        #[arg(long, default_value_t = 100_000, value_parser = at_least_one::<u64>)]
        key_space: u64,
        /// Key prefix.
        #[arg(long, default_value = "bench/")]
        key_prefix: String,
        /// HTTP/2 connections per endpoint shared by the writers (>= 1).
        #[arg(long, default_value_t = 1, value_parser = at_least_one::<usize>)]
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
            output::stderr_line(&format!("Error: cannot start the async runtime: {e}"));
            return 1;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => 0,
        // The reader of stdout went away (`ftkvctl scan | head -1`): a normal end, as for `cat`.
        Err(e) if is_broken_pipe(&e) => 0,
        Err(e) => {
            output::stderr_line(&format!("Error: {}", one_line(&e)));
            1
        }
    }
}

/// Whether the error comes from writing to a closed pipe.
fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

/// A duration argument (humantime syntax, e.g. "500ms", "5s") that must be > 0: a zero budget
/// would fail every request and leave writes in an unknown state.
fn positive_duration(text: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if d.is_zero() {
        return Err("must be greater than zero (e.g. \"500ms\", \"5s\")".to_string());
    }
    Ok(d)
}

/// A count argument that must be >= 1 (0 would run nothing or silently mean 1).
fn at_least_one<T: std::str::FromStr + PartialEq + From<u8>>(text: &str) -> Result<T, String> {
    let n: T = text
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number"))?;
    if n == T::from(0u8) {
        return Err("must be at least 1".to_string());
    }
    Ok(n)
}

/// Rejects a range `[start, end)` whose start sorts after its non-empty end (nodes refuse it as
/// INVALID_ARGUMENT); `what` names the command for the message.
fn check_range(what: &str, start: &[u8], end: &[u8], bytes: Bytes) -> anyhow::Result<()> {
    if !end.is_empty() && start > end {
        bail!(
            "{what}: start key {:?} sorts after end key {:?}; the range [START, END) needs START <= END \
             (omit END, or give \"\", for no upper bound)",
            bytes.show(start),
            bytes.show(end)
        );
    }
    Ok(())
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
    let mut builder = Client::builder()
        .endpoints(&cli.endpoints)
        .connect_timeout(cli.connect_timeout)
        .request_timeout(cli.request_timeout.min(cli.timeout))
        .retry(policy)
        .connections_per_endpoint(connections);
    if let Some(tls) = tls_options(cli)? {
        builder = builder.tls(tls);
    }
    if let Some(user) = &cli.user {
        let password = auth::login_password(user, cli.password_file.as_deref())?;
        builder = builder.user(user, password);
    }
    let client = builder.build().await.map_err(|e| match e {
        Error::Unauthenticated { .. } => anyhow::Error::new(e),
        other => anyhow::Error::new(other).context("bad --endpoints"),
    })?;
    Ok(client)
}

/// The TLS settings of `--cacert --cert --key` (`None` without `--cacert`; `--cert` without
/// `--cacert` is refused: the client must know which CA signs the nodes' certificates).
fn tls_options(cli: &Cli) -> anyhow::Result<Option<crate::TlsOptions>> {
    let Some(ca) = &cli.cacert else {
        if cli.cert.is_some() {
            anyhow::bail!("--cert needs --cacert: the CA (PEM) that signs the nodes' certificates");
        }
        return Ok(None);
    };
    let mut tls = crate::TlsOptions::with_ca_file(ca)?;
    if let (Some(cert), Some(key)) = (&cli.cert, &cli.key) {
        tls = tls.identity_files(cert, key)?;
    }
    Ok(Some(tls))
}

/// Writes `out` and a newline to stdout, unless `out` is empty. Errors (a closed pipe
/// included) are returned, never a panic as `println!` does.
fn emit(out: &[u8]) -> anyhow::Result<()> {
    if out.is_empty() {
        return Ok(());
    }
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(out)
        .and_then(|()| stdout.write_all(b"\n"))
        .and_then(|()| stdout.flush())
        .context("cannot write to stdout")
}

/// Adds the command and range to a node's INVALID_ARGUMENT answer (e.g. a range it refuses).
fn explain_invalid(e: Error, what: &str) -> anyhow::Error {
    match e {
        Error::InvalidArgument { .. } => anyhow::Error::new(e).context(format!("{what} refused by the node")),
        other => anyhow::Error::new(other),
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
            emit(write_ok(format, info).as_bytes())?;
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
                emit(&pairs_output(format, bytes, &kvs, *print_value_only))?;
            } else {
                let value = client.get_with(&key, consistency).await?;
                emit(&get_output(
                    format,
                    bytes,
                    &key,
                    value.as_deref(),
                    *print_value_only,
                ))?;
            }
        }
        Command::Del { key, prefix } => {
            let key = arg_bytes(key, hex, "key")?;
            let info = if *prefix {
                client
                    .delete_prefix(&key)
                    .await
                    .map_err(|e| explain_invalid(e, "del --prefix"))?
            } else {
                client.delete(&key).await.map_err(|e| explain_invalid(e, "del"))?
            };
            emit(write_ok(format, info).as_bytes())?;
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
            check_range("scan", &start, &end, bytes)?;
            let kvs = client
                .scan_all(&start, &end, *limit, opts)
                .await
                .map_err(|e| explain_invalid(e, "scan"))?;
            emit(&output::kvs(format, bytes, &kvs, *keys_only))?;
        }
        Command::Txn => {
            let mut script = String::new();
            std::io::stdin()
                .read_to_string(&mut script)
                .context("cannot read the txn script from stdin")?;
            let txn = txn_script::parse(&script, hex)?;
            for op in txn.success.iter().chain(&txn.failure) {
                if let TxnOp::DeleteRange { start, end } = op {
                    check_range("txn del-range", start, end, bytes)?;
                }
            }
            let branch_ops = |succeeded: bool| {
                if succeeded {
                    txn.success.clone()
                } else {
                    txn.failure.clone()
                }
            };
            let result = client
                .txn(txn.clone())
                .await
                .map_err(|e| explain_invalid(e, "txn"))?;
            emit(&txn_output(format, bytes, &branch_ops(result.succeeded), &result))?;
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
            emit(write_ok(format, info).as_bytes())?;
        }
        Command::Member(cmd) => emit(member::run(&client, format, cmd, cli.timeout).await?.as_bytes())?,
        Command::Endpoint(EndpointCommand::Status { cluster, digest }) => {
            endpoint::status(&client, &cli, *cluster, *digest).await?;
        }
        Command::Endpoint(EndpointCommand::Health { cluster }) => {
            endpoint::health(&client, &cli, *cluster).await?;
        }
        Command::Alarm(cmd) => emit(alarm::run(&client, format, cmd).await?.as_bytes())?,
        Command::Snapshot(cmd) => emit(snapshot::run(&client, &cli.endpoints, cmd).await?.as_bytes())?,
        Command::Load(args) => emit(load::run(&client, args).await?.as_bytes())?,
        Command::User(cmd) => emit(auth::run_user(&client, format, cmd).await?.as_bytes())?,
        Command::Role(cmd) => emit(auth::run_role(&client, format, hex, cmd).await?.as_bytes())?,
        Command::Auth(cmd) => emit(auth::run_auth(&client, format, cmd).await?.as_bytes())?,
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
                Format::Json => emit(report.to_json().to_string().as_bytes())?,
                Format::Simple | Format::Table => emit(report.to_text().as_bytes())?,
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

/// Output of `get --prefix`: pairs, or only the values (one per line, raw) in simple mode.
fn pairs_output(format: Format, bytes: Bytes, kvs: &[crate::KeyValue], value_only: bool) -> Vec<u8> {
    if value_only && format == Format::Simple {
        output::join_lines(kvs.iter().map(|kv| bytes.raw(&kv.value)))
    } else {
        output::kvs(format, bytes, kvs, false)
    }
}

/// Output of `get KEY`: nothing / `{"found":false}` when absent; the value byte for byte in
/// simple mode.
fn get_output(format: Format, bytes: Bytes, key: &[u8], value: Option<&[u8]>, value_only: bool) -> Vec<u8> {
    match (format, value) {
        (Format::Json, None) => json!({ "found": false }).to_string().into_bytes(),
        (Format::Json, Some(v)) => {
            let mut obj = serde_json::Map::new();
            obj.insert("found".into(), json!(true));
            bytes.insert_json(&mut obj, "key", key);
            bytes.insert_json(&mut obj, "value", v);
            serde_json::Value::Object(obj).to_string().into_bytes()
        }
        (_, None) => Vec::new(),
        (Format::Simple, Some(v)) if value_only => bytes.raw(v).into_owned(),
        (Format::Simple, Some(v)) => output::join_lines([bytes.raw(key), bytes.raw(v)]),
        (Format::Table, Some(v)) => {
            output::table(&["KEY", "VALUE"], &[vec![bytes.show(key), bytes.show(v)]]).into_bytes()
        }
    }
}

/// Output of `txn`: SUCCESS/FAILURE, then each get of the branch that ran (raw bytes in simple
/// mode, lossless JSON fields in JSON mode).
fn txn_output(format: Format, bytes: Bytes, ops: &[TxnOp], result: &crate::TxnResult) -> Vec<u8> {
    let verdict = if result.succeeded { "SUCCESS" } else { "FAILURE" };
    let missing = crate::TxnOpResult::default();
    let pairs = ops
        .iter()
        .zip(result.results.iter().chain(std::iter::repeat(&missing)));
    match format {
        Format::Json => {
            let results: Vec<serde_json::Value> = pairs
                .map(|(op, r)| {
                    let (name, mut obj) = match op {
                        TxnOp::Get { key } => {
                            let mut obj = bytes.json_object(&[("key", key)]);
                            obj.insert("found".into(), json!(r.found));
                            if r.found {
                                bytes.insert_json(&mut obj, "value", &r.value);
                            }
                            ("get", obj)
                        }
                        TxnOp::Put { key, .. } => ("put", bytes.json_object(&[("key", key)])),
                        TxnOp::Delete { key } => ("del", bytes.json_object(&[("key", key)])),
                        TxnOp::Upsert { key, .. } => ("upsert", bytes.json_object(&[("key", key)])),
                        TxnOp::DeleteRange { start, end } => {
                            ("del-range", bytes.json_object(&[("start", start), ("end", end)]))
                        }
                    };
                    obj.insert("op".into(), json!(name));
                    serde_json::Value::Object(obj)
                })
                .collect();
            json!({ "succeeded": result.succeeded, "log_index": result.info.log_index, "results": results })
                .to_string()
                .into_bytes()
        }
        Format::Simple | Format::Table => {
            let mut lines = vec![std::borrow::Cow::Borrowed(verdict.as_bytes())];
            for (op, r) in pairs {
                if let TxnOp::Get { key } = op {
                    if r.found {
                        lines.push(bytes.raw(key));
                        lines.push(bytes.raw(&r.value));
                    }
                }
            }
            output::join_lines(lines)
        }
    }
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
            br#"{"found":false}"#
        );
        assert_eq!(get_output(Format::Simple, b, b"k", None, false), b"");
        assert_eq!(get_output(Format::Simple, b, b"k", Some(b"v"), false), b"k\nv");
        assert_eq!(get_output(Format::Simple, b, b"k", Some(b"v"), true), b"v");
        let v: serde_json::Value =
            serde_json::from_slice(&get_output(Format::Json, b, b"k", Some(b"v"), false)).unwrap();
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
        assert_eq!(txn_output(Format::Simple, b, &ops, &result), b"SUCCESS\na\n1");
        let v: serde_json::Value =
            serde_json::from_slice(&txn_output(Format::Json, b, &ops, &result)).unwrap();
        assert_eq!(v["succeeded"], true);
        assert_eq!(v["results"][1]["value"], "1");
        assert_eq!(v["results"][0]["op"], "put");
    }

    #[test]
    fn zero_durations_are_rejected() {
        assert_eq!(positive_duration("500ms"), Ok(Duration::from_millis(500)));
        assert!(positive_duration("0ms")
            .unwrap_err()
            .contains("greater than zero"));
        assert!(positive_duration("0s").is_err());
        assert!(positive_duration("soon").is_err());
        let e = Cli::try_parse_from(["ftkvctl", "--request-timeout", "0ms", "put", "k", "v"]).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--request-timeout"), "{e}");
        let e = Cli::try_parse_from(["ftkvctl", "bench", "put", "--clients", "0"]).unwrap_err();
        assert!(e.to_string().contains("must be at least 1"), "{e}");
        assert!(Cli::try_parse_from(["ftkvctl", "bench", "put", "--key-space", "x"]).is_err());
        assert!(Cli::try_parse_from(["ftkvctl", "bench", "put", "--duration", "0s"]).is_err());
        assert!(Cli::try_parse_from(["ftkvctl", "bench", "put", "--clients", "1"]).is_ok());
    }

    #[test]
    fn reversed_ranges_are_refused() {
        let b = Bytes { hex: false };
        assert!(check_range("scan", b"a", b"b", b).is_ok());
        assert!(check_range("scan", b"a", b"a", b).is_ok());
        assert!(check_range("scan", b"z", b"", b).is_ok(), "empty end = unbounded");
        let e = check_range("scan", b"b", b"a", b).unwrap_err();
        assert!(
            one_line(&e).starts_with("scan: start key \"b\" sorts after end key \"a\""),
            "{e}"
        );
        let e = check_range("txn del-range", &[2], &[1], Bytes { hex: true }).unwrap_err();
        assert!(one_line(&e).contains("\"02\" sorts after end key \"01\""), "{e}");
    }

    #[test]
    fn invalid_argument_from_the_node_names_the_command() {
        let e = explain_invalid(
            Error::InvalidArgument {
                message: "start > end".into(),
                limit: None,
            },
            "scan",
        );
        assert_eq!(
            one_line(&e),
            "scan refused by the node: invalid argument: start > end"
        );
        let e = explain_invalid(Error::Timeout { elapsed_ms: 5 }, "scan");
        assert_eq!(one_line(&e), "timed out after 5 ms");
    }

    #[test]
    fn broken_pipe_is_recognised_through_context() {
        let io = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        let e = anyhow::Error::new(io).context("cannot write to stdout");
        assert!(is_broken_pipe(&e));
        let other = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::PermissionDenied));
        assert!(!is_broken_pipe(&other));
        assert!(!is_broken_pipe(&anyhow::anyhow!("broken pipe")));
    }

    #[test]
    fn one_line_joins_causes() {
        let e = anyhow::anyhow!("inner cause").context("outer");
        assert_eq!(one_line(&e), "outer: inner cause");
    }
}
