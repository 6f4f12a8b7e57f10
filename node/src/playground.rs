//! `ftkv-node playground`: a local cluster of real node processes on loopback.
//!
//! Node `i` (1-based) listens on client port `P + 3(i-1)`, peer port `P + 3(i-1) + 1` and status
//! port `P + 3(i-1) + 2`, where `P` is `--base-port` (default 7379), with its data in
//! `DIR/node-i` and its log in `DIR/node-i.log`. Once a leader exists the comma-separated client
//! endpoints are written to `DIR/endpoints`. Ctrl-C (or SIGTERM) stops the children cleanly.
//! `--demo` runs the demo workload ([`crate::playground::demo`]) and exits. `--tls` puts every
//! port on TLS with certificates generated into `DIR/tls` ([`crate::playground::tls`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

pub mod demo;
pub mod tls;

/// Flags of `ftkv-node playground`.
#[derive(clap::Args, Debug, Clone)]
pub struct PlaygroundArgs {
    /// Number of nodes.
    #[arg(long, default_value_t = 3)]
    pub nodes: u64,
    /// Directory for data dirs, logs and the `endpoints` file (default: a new temp dir).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// First port; node i uses base + 3(i-1) (client), +1 (peer), +2 (status).
    #[arg(long, default_value_t = 7379)]
    pub base_port: u16,
    /// Storage engine: fractal | sled.
    #[arg(long)]
    pub engine: Option<String>,
    /// Run the demo workload, print the results, stop the cluster and exit.
    #[arg(long, conflicts_with = "tls")]
    pub demo: bool,
    /// TLS on every port, client-cert auth, authenticated peers: generates a throwaway CA and
    /// certificates into DIR/tls (kept when restarted on the same --dir).
    #[arg(long)]
    pub tls: bool,
    /// Rows the demo writes.
    #[arg(long, default_value_t = 100_000)]
    pub demo_rows: u64,
    /// Extra flags passed to every node (e.g. `--node-arg=--log-sync=100ms`).
    #[arg(long = "node-arg", allow_hyphen_values = true)]
    pub node_args: Vec<String>,
}

/// One node process of the playground.
#[derive(Debug)]
pub struct PlaygroundNode {
    /// Node id.
    pub id: u64,
    /// Client endpoint.
    pub client: String,
    /// Peer endpoint.
    pub peer: String,
    /// Status HTTP endpoint.
    pub status: String,
    /// Data dir.
    pub data_dir: PathBuf,
    /// Log file.
    pub log_path: PathBuf,
    /// Full argument list used to (re)start it.
    pub args: Vec<String>,
    /// Running process.
    pub child: Option<Child>,
}

/// A running playground cluster. Dropping it kills every child.
#[derive(Debug)]
pub struct Playground {
    /// Nodes by id order.
    pub nodes: Vec<PlaygroundNode>,
    /// Base directory.
    pub dir: PathBuf,
    /// The certificates, with `--tls`.
    pub tls: Option<tls::PlaygroundTls>,
    _temp: Option<tempfile::TempDir>,
}

impl Playground {
    /// Starts `args.nodes` processes of this executable.
    pub fn start(args: &PlaygroundArgs) -> anyhow::Result<Self> {
        let (dir, temp) = match &args.dir {
            Some(d) => (d.clone(), None),
            None => {
                let t = tempfile::Builder::new().prefix("ftkv-playground-").tempdir()?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let _ = std::fs::remove_file(dir.join("endpoints"));
        let port = |i: u64, k: u64| -> anyhow::Result<u16> {
            let p = u64::from(args.base_port) + 3 * (i - 1) + k;
            u16::try_from(p).map_err(|_| anyhow::anyhow!("port {p} out of range; lower --base-port"))
        };
        let mut initial = Vec::new();
        for i in 1..=args.nodes {
            initial.push(format!("{i}=127.0.0.1:{}", port(i, 1)?));
        }
        let initial = initial.join(",");
        let tls = if args.tls {
            Some(tls::PlaygroundTls::prepare(&dir, args.nodes)?)
        } else {
            None
        };
        let mut nodes = Vec::new();
        for i in 1..=args.nodes {
            let client = format!("127.0.0.1:{}", port(i, 0)?);
            let peer = format!("127.0.0.1:{}", port(i, 1)?);
            let status = format!("127.0.0.1:{}", port(i, 2)?);
            let data_dir = dir.join(format!("node-{i}"));
            let mut a = vec![
                "run".to_string(),
                format!("--id={i}"),
                format!("--data-dir={}", data_dir.display()),
                format!("--listen-client={client}"),
                format!("--listen-peer={peer}"),
                format!("--listen-status={status}"),
                format!("--initial-cluster={initial}"),
                "--initial-cluster-state=new".to_string(),
            ];
            if let Some(e) = &args.engine {
                a.push(format!("--engine={e}"));
            }
            if let Some(t) = &tls {
                a.extend(t.node_args(i));
            }
            a.extend(args.node_args.iter().cloned());
            nodes.push(PlaygroundNode {
                id: i,
                client,
                peer,
                status,
                log_path: dir.join(format!("node-{i}.log")),
                data_dir,
                args: a,
                child: None,
            });
        }
        let mut pg = Playground {
            nodes,
            dir,
            tls,
            _temp: temp,
        };
        for i in 0..pg.nodes.len() {
            pg.spawn(i)?;
        }
        Ok(pg)
    }

    fn spawn(&mut self, index: usize) -> anyhow::Result<()> {
        let exe = std::env::current_exe().context("cannot find this executable")?;
        let node = &mut self.nodes[index];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log_path)?;
        let child = Command::new(exe)
            .args(&node.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start node {}", node.id))?;
        node.child = Some(child);
        Ok(())
    }

    /// Client endpoints, comma-separated.
    pub fn endpoints(&self) -> String {
        self.nodes
            .iter()
            .map(|n| n.client.clone())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// SIGKILLs node `id`.
    pub fn kill(&mut self, id: u64) -> anyhow::Result<()> {
        let node = self.node_mut(id)?;
        if let Some(mut c) = node.child.take() {
            c.kill()?;
            c.wait()?;
        }
        Ok(())
    }

    /// Starts node `id` again on its data dir.
    pub fn restart(&mut self, id: u64) -> anyhow::Result<()> {
        let index = self
            .nodes
            .iter()
            .position(|n| n.id == id)
            .context("no such node")?;
        self.spawn(index)
    }

    fn node_mut(&mut self, id: u64) -> anyhow::Result<&mut PlaygroundNode> {
        self.nodes.iter_mut().find(|n| n.id == id).context("no such node")
    }

    /// Waits until some node reports a leader that every running node agrees on.
    pub async fn wait_for_leader(&mut self, timeout: Duration) -> anyhow::Result<u64> {
        let deadline = Instant::now() + timeout;
        loop {
            self.check_children()?;
            let mut leaders = Vec::new();
            for n in self.nodes.iter().filter(|n| n.child.is_some()) {
                if let Ok(st) = self.status_of(&n.client).await {
                    leaders.push(st.leader_id);
                }
            }
            if let Some(&l) = leaders.first() {
                if l != 0 && leaders.iter().all(|x| *x == l) {
                    return Ok(l);
                }
            }
            if Instant::now() > deadline {
                anyhow::bail!(
                    "no leader after {timeout:?}; see the node logs in {}",
                    self.dir.display()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `Cluster.Status` of one endpoint (over TLS with `--tls`).
    pub async fn status_of(&self, endpoint: &str) -> anyhow::Result<ftkv_proto::v1::StatusResponse> {
        match &self.tls {
            None => status(endpoint).await,
            Some(t) => status_with(&format!("https://{endpoint}"), Some(t.tonic_config()?)).await,
        }
    }

    /// Fails when a child exited on its own (printing the tail of its log).
    pub fn check_children(&mut self) -> anyhow::Result<()> {
        for n in &mut self.nodes {
            if let Some(c) = n.child.as_mut() {
                if let Some(code) = c.try_wait()? {
                    let tail = tail(&n.log_path, 20);
                    anyhow::bail!("node {} exited ({code}); its log ends:\n{tail}", n.id);
                }
            }
        }
        Ok(())
    }

    /// Prints (once) each child that exited since the last call, with the tail of its log, and
    /// keeps the others running: a user may kill nodes on purpose to watch the failover.
    pub fn report_exits(&mut self) {
        for n in &mut self.nodes {
            let exited = n.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
            if let Some(code) = exited {
                n.child = None;
                eprintln!(
                    "playground: node {} exited ({code}); the others keep running. Its log ends:\n{}",
                    n.id,
                    tail(&n.log_path, 10)
                );
            }
        }
    }

    /// SIGTERMs every child and waits (SIGKILL after 10 s).
    pub fn stop_all(&mut self) {
        for n in &mut self.nodes {
            if let Some(c) = n.child.as_ref() {
                terminate(c.id());
            }
        }
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    match c.try_wait() {
                        Ok(Some(_)) => break,
                        Ok(None) if Instant::now() < deadline => {
                            std::thread::sleep(Duration::from_millis(50))
                        }
                        _ => {
                            let _ = c.kill();
                            let _ = c.wait();
                            break;
                        }
                    }
                }
            }
        }
    }
}

impl Drop for Playground {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            if let Some(mut c) = n.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

fn terminate(pid: u32) {
    // SIGTERM through the `kill` utility keeps this crate free of unsafe code.
    let _ = Command::new("kill").arg("-TERM").arg(pid.to_string()).status();
}

/// Last `lines` lines of a file.
pub fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `Cluster.Status` of one endpoint with a short timeout.
pub async fn status(endpoint: &str) -> anyhow::Result<ftkv_proto::v1::StatusResponse> {
    status_with(&format!("http://{endpoint}"), None).await
}

async fn status_with(
    uri: &str,
    tls: Option<tonic::transport::ClientTlsConfig>,
) -> anyhow::Result<ftkv_proto::v1::StatusResponse> {
    let mut endpoint = tonic::transport::Endpoint::from_shared(uri.to_string())?
        .connect_timeout(Duration::from_millis(500))
        .timeout(Duration::from_secs(2));
    if let Some(tls) = tls {
        endpoint = endpoint.tls_config(tls)?;
    }
    let channel = endpoint.connect().await?;
    let mut client = ftkv_proto::v1::cluster_client::ClusterClient::new(channel);
    Ok(client
        .status(ftkv_proto::v1::StatusRequest { with_digest: false })
        .await?
        .into_inner())
}

/// Runs the playground command.
pub async fn run(args: PlaygroundArgs) -> anyhow::Result<()> {
    if args.nodes == 0 || args.nodes > 9 {
        anyhow::bail!("--nodes must be between 1 and 9");
    }
    let mut pg = Playground::start(&args)?;
    println!(
        "ftkv playground: {} nodes, data and logs in {}",
        args.nodes,
        pg.dir.display()
    );
    let leader = pg.wait_for_leader(Duration::from_secs(60)).await?;
    std::fs::write(pg.dir.join("endpoints"), pg.endpoints())?;
    println!("leader: node {leader}");
    for n in &pg.nodes {
        println!(
            "  node {}: client {}  peer {}  log {}",
            n.id,
            n.client,
            n.peer,
            n.log_path.display()
        );
    }
    println!(
        "endpoints: {}  (also in {})",
        pg.endpoints(),
        pg.dir.join("endpoints").display()
    );
    match &pg.tls {
        None => println!("try: ftkvctl --endpoints {} put hello world", pg.endpoints()),
        Some(t) => {
            println!(
                "TLS on every port (client-cert auth, peers authenticated); certificates in {}",
                t.dir.display()
            );
            println!(
                "try: ftkvctl --endpoints {} {} put hello world",
                pg.endpoints(),
                t.ctl_flags()
            );
            println!(
                "     curl --cacert {} --cert {} --key {} https://{}/metrics",
                t.ca.display(),
                t.client_cert.display(),
                t.client_key.display(),
                pg.nodes.first().map(|n| n.status.as_str()).unwrap_or_default()
            );
        }
    }
    if args.demo {
        let result = demo::run(&mut pg, args.demo_rows).await;
        pg.stop_all();
        return result;
    }
    println!("press Ctrl-C to stop");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
            _ = tick.tick() => pg.report_exits(),
        }
    }
    println!("stopping the playground");
    pg.stop_all();
    Ok(())
}
