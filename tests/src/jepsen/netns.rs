//! The `netns` substrate: every node in its own Linux network namespace, attached by a veth pair
//! to a bridge in the root namespace, with its own address (`10.213.S.i`, S chosen per run). The
//! harness (clients, nemesis) stays in the root namespace and reaches every node through the
//! bridge; partitions are iptables DROP rules inside the nodes' namespaces, so clients can
//! always reach every node (as in Jepsen, only node-to-node links are cut).
//!
//! Needs root, `ip` (iproute2) and `iptables`. Everything created (namespaces, veths, bridge,
//! rules) is removed by [`NetnsCluster::teardown`], which also runs on drop; `ftkv-jepsen
//! cleanup` removes leftovers of a harness that was SIGKILLed (names start with `fj`).

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use crate::fixture::{send_signal, spawn_tied};

/// Errors of the netns substrate.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// A setup or fault command failed.
    #[error("`{command}` failed: {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// What it printed on stderr (or the spawn error).
        stderr: String,
    },
    /// File trouble (log files, data dirs).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The caller's preparation before the nodes start failed.
    #[error("preparing the nodes: {0}")]
    Prepare(String),
    /// No such node.
    #[error("no node {0}")]
    UnknownNode(u64),
    /// Node state does not allow the operation.
    #[error("node {id}: {message}")]
    State {
        /// The node.
        id: u64,
        /// Why.
        message: String,
    },
}

/// Runs a command, failing with its stderr.
pub fn run_cmd(program: &str, args: &[&str]) -> Result<String, NetnsError> {
    let line = format!("{program} {}", args.join(" "));
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| NetnsError::Command {
            command: line.clone(),
            stderr: e.to_string(),
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(NetnsError::Command {
            command: line,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Whether this process can use the netns substrate (root, `ip` and `iptables` present).
pub fn available() -> Result<(), String> {
    #[allow(unsafe_code)]
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        return Err("the netns substrate needs root".into());
    }
    for tool in ["ip", "iptables"] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
            .unwrap_or(false);
        if !found {
            return Err(format!(
                "`{tool}` not found (apt-get install -y iproute2 iptables)"
            ));
        }
    }
    Ok(())
}

/// Removes every namespace and bridge whose name starts with `fj` (leftovers of killed runs),
/// including those of a harness still running: use only when none runs. Returns the names removed.
pub fn cleanup_leftovers() -> Vec<String> {
    let mut removed = Vec::new();
    if let Ok(list) = run_cmd("ip", &["netns", "list"]) {
        for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
            if name.starts_with("fj") && run_cmd("ip", &["netns", "del", name]).is_ok() {
                removed.push(name.to_string());
            }
        }
    }
    if let Ok(list) = run_cmd("ip", &["-o", "link", "show", "type", "bridge"]) {
        for name in list.lines().filter_map(|l| l.split(':').nth(1)).map(str::trim) {
            if name.starts_with("fj") && run_cmd("ip", &["link", "del", name]).is_ok() {
                let _ = run_cmd(
                    "iptables",
                    &["-D", "FORWARD", "-i", name, "-o", name, "-j", "ACCEPT"],
                );
                removed.push(name.to_string());
            }
        }
    }
    removed
}

struct NetNode {
    ns: String,
    host_veth: String,
    addr: String,
    data_dir: PathBuf,
    log_path: PathBuf,
    initial_state: &'static str,
    child: Option<Child>,
}

/// A cluster of `ftkv-node` processes, one per network namespace. See the module doc.
pub struct NetnsCluster {
    tag: String,
    subnet: u8,
    bridge: String,
    dir: PathBuf,
    node_bin: PathBuf,
    extra_args: Vec<String>,
    /// Extra node environment; `{id}` in a value is replaced by the node id.
    env: Vec<(String, String)>,
    initial_cluster: String,
    nodes: Mutex<BTreeMap<u64, NetNode>>,
    torn_down: Mutex<bool>,
}

const CLIENT_PORT: u16 = 7379;
const PEER_PORT: u16 = 7380;
const STATUS_PORT: u16 = 7381;

impl NetnsCluster {
    /// Creates the bridge and `count` namespaces (ids 1..=count) and starts every node with
    /// `extra_args` appended and `env` set (`{id}` in a value is replaced by the node id). Node
    /// folders go under `dir`. On any error what was created is removed again.
    pub fn start(
        count: u64,
        dir: &Path,
        node_bin: &Path,
        extra_args: Vec<String>,
        env: Vec<(String, String)>,
    ) -> Result<Self, NetnsError> {
        Self::start_prepared(count, dir, node_bin, extra_args, env, |_| Ok(()))
    }

    /// [`NetnsCluster::start`], calling `prepare` with the nodes' address pattern
    /// (`10.213.S.{id}`, see [`NetnsCluster::address_pattern`]) once the namespaces exist and
    /// before any node starts (e.g. to issue certificates naming those addresses); its error
    /// aborts the start.
    pub fn start_prepared(
        count: u64,
        dir: &Path,
        node_bin: &Path,
        extra_args: Vec<String>,
        env: Vec<(String, String)>,
        prepare: impl FnOnce(&str) -> Result<(), String>,
    ) -> Result<Self, NetnsError> {
        // Unique per process and per cluster within it (tests may run clusters in parallel).
        static CLUSTERS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = CLUSTERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        let tag = format!("fj{:04x}{}", pid & 0xffff, n % 10);
        let subnet = (20 + (pid + n * 37) % 200) as u8;
        let cluster = NetnsCluster {
            bridge: format!("{tag}br"),
            tag,
            subnet,
            dir: dir.to_path_buf(),
            node_bin: node_bin.to_path_buf(),
            extra_args,
            env,
            initial_cluster: (1..=count)
                .map(|i| format!("{i}=10.213.{subnet}.{i}:{PEER_PORT}"))
                .collect::<Vec<_>>()
                .join(","),
            nodes: Mutex::new(BTreeMap::new()),
            torn_down: Mutex::new(false),
        };
        // On error, Drop tears down what exists.
        cluster.create_bridge()?;
        for id in 1..=count {
            cluster.create_node(id, "new")?;
        }
        prepare(&cluster.address_pattern()).map_err(NetnsError::Prepare)?;
        for id in 1..=count {
            cluster.restart(id)?;
        }
        Ok(cluster)
    }

    /// The address of node `{id}`: `10.213.S.{id}` with this cluster's subnet `S`.
    pub fn address_pattern(&self) -> String {
        format!("10.213.{}.{{id}}", self.subnet)
    }

    fn create_bridge(&self) -> Result<(), NetnsError> {
        let br = self.bridge.as_str();
        run_cmd("ip", &["link", "add", br, "type", "bridge"])?;
        run_cmd(
            "ip",
            &[
                "addr",
                "add",
                &format!("10.213.{}.254/24", self.subnet),
                "dev",
                br,
            ],
        )?;
        run_cmd("ip", &["link", "set", br, "up"])?;
        // With br_netfilter loaded (Docker does that) bridged frames traverse the root FORWARD
        // chain, whose policy Docker sets to DROP: let our bridge's own traffic through.
        run_cmd("iptables", &["-I", "FORWARD", "-i", br, "-o", br, "-j", "ACCEPT"])?;
        Ok(())
    }

    /// Creates namespace, veth and address for node `id` (does not start it).
    fn create_node(&self, id: u64, initial_state: &'static str) -> Result<(), NetnsError> {
        let ns = format!("{}n{id}", self.tag);
        let host_veth = format!("{}v{id}", self.tag);
        let addr = format!("10.213.{}.{id}", self.subnet);
        let node_dir = self.dir.join(format!("n{id}"));
        std::fs::create_dir_all(&node_dir).map_err(|source| NetnsError::Io {
            context: format!("creating {}", node_dir.display()),
            source,
        })?;
        {
            let mut nodes = self.lock();
            nodes.insert(
                id,
                NetNode {
                    ns: ns.clone(),
                    host_veth: host_veth.clone(),
                    addr: addr.clone(),
                    data_dir: node_dir.join("data"),
                    log_path: node_dir.join("node.log"),
                    initial_state,
                    child: None,
                },
            );
        }
        run_cmd("ip", &["netns", "add", &ns])?;
        run_cmd(
            "ip",
            &[
                "link", "add", &host_veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ],
        )?;
        run_cmd("ip", &["link", "set", &host_veth, "master", &self.bridge])?;
        run_cmd("ip", &["link", "set", &host_veth, "up"])?;
        run_cmd(
            "ip",
            &[
                "netns",
                "exec",
                &ns,
                "ip",
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                "eth0",
            ],
        )?;
        run_cmd("ip", &["netns", "exec", &ns, "ip", "link", "set", "eth0", "up"])?;
        run_cmd("ip", &["netns", "exec", &ns, "ip", "link", "set", "lo", "up"])?;
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, NetNode>> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Node ids, ascending.
    pub fn ids(&self) -> Vec<u64> {
        self.lock().keys().copied().collect()
    }

    /// Client endpoint `addr:port` of node `id`.
    pub fn endpoint(&self, id: u64) -> Result<String, NetnsError> {
        self.lock()
            .get(&id)
            .map(|n| format!("{}:{CLIENT_PORT}", n.addr))
            .ok_or(NetnsError::UnknownNode(id))
    }

    /// Peer endpoint `addr:port` of node `id`.
    pub fn peer_endpoint(&self, id: u64) -> Result<String, NetnsError> {
        self.lock()
            .get(&id)
            .map(|n| format!("{}:{PEER_PORT}", n.addr))
            .ok_or(NetnsError::UnknownNode(id))
    }

    /// Data dir of node `id`.
    pub fn data_dir(&self, id: u64) -> Result<PathBuf, NetnsError> {
        self.lock()
            .get(&id)
            .map(|n| n.data_dir.clone())
            .ok_or(NetnsError::UnknownNode(id))
    }

    /// Log file of node `id` (every start appended).
    pub fn log_path(&self, id: u64) -> Result<PathBuf, NetnsError> {
        self.lock()
            .get(&id)
            .map(|n| n.log_path.clone())
            .ok_or(NetnsError::UnknownNode(id))
    }

    /// Starts node `id` (again) inside its namespace.
    pub fn restart(&self, id: u64) -> Result<(), NetnsError> {
        let mut nodes = self.lock();
        let node = nodes.get_mut(&id).ok_or(NetnsError::UnknownNode(id))?;
        if let Some(child) = node.child.as_mut() {
            if matches!(child.try_wait(), Ok(None)) {
                return Err(NetnsError::State {
                    id,
                    message: "already running".into(),
                });
            }
        }
        let initial_cluster = if node.initial_state == "new" {
            self.initial_cluster.clone()
        } else {
            format!("{},{id}={}:{PEER_PORT}", self.initial_cluster, node.addr)
        };
        let mut args: Vec<String> = vec![
            "netns".into(),
            "exec".into(),
            node.ns.clone(),
            self.node_bin.display().to_string(),
            "run".into(),
            "--id".into(),
            id.to_string(),
            "--data-dir".into(),
            node.data_dir.display().to_string(),
            "--listen-client".into(),
            format!("{}:{CLIENT_PORT}", node.addr),
            "--advertise-client".into(),
            format!("{}:{CLIENT_PORT}", node.addr),
            "--listen-peer".into(),
            format!("{}:{PEER_PORT}", node.addr),
            "--advertise-peer".into(),
            format!("{}:{PEER_PORT}", node.addr),
            "--listen-status".into(),
            format!("{}:{STATUS_PORT}", node.addr),
            "--initial-cluster".into(),
            initial_cluster,
            "--initial-cluster-state".into(),
            node.initial_state.into(),
        ];
        args.extend(self.extra_args.iter().cloned());
        let io = |context: String| move |source| NetnsError::Io { context, source };
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log_path)
            .map_err(io(format!("opening {}", node.log_path.display())))?;
        let _ = writeln!(
            log,
            "===== ftkv-jepsen netns: start of node {id}: ip {} =====",
            args.join(" ")
        );
        let err = log.try_clone().map_err(io("cloning log handle".into()))?;
        let mut command = Command::new("ip");
        command.args(&args).stdin(Stdio::null()).stdout(log).stderr(err);
        if std::env::var_os("RUST_LOG").is_none() {
            command.env("RUST_LOG", "info");
        }
        let id_text = id.to_string();
        command.envs(self.env.iter().map(|(k, v)| (k, v.replace("{id}", &id_text))));
        node.child = Some(spawn_tied(command).map_err(io(format!("spawning node {id}")))?);
        Ok(())
    }

    fn signal(&self, id: u64, signal: libc::c_int) -> Result<(), NetnsError> {
        let mut nodes = self.lock();
        let node = nodes.get_mut(&id).ok_or(NetnsError::UnknownNode(id))?;
        let child = node.child.as_mut().ok_or(NetnsError::State {
            id,
            message: "not running".into(),
        })?;
        send_signal(child.id(), signal).map_err(|source| NetnsError::Io {
            context: format!("signal {signal} to node {id}"),
            source,
        })?;
        if signal == libc::SIGKILL {
            let _ = child.wait();
            node.child = None;
        }
        Ok(())
    }

    /// SIGKILLs node `id` and reaps it.
    pub fn kill(&self, id: u64) -> Result<(), NetnsError> {
        let _ = self.signal(id, libc::SIGCONT);
        self.signal(id, libc::SIGKILL)
    }

    /// SIGSTOPs node `id`.
    pub fn pause(&self, id: u64) -> Result<(), NetnsError> {
        self.signal(id, libc::SIGSTOP)
    }

    /// SIGCONTs node `id`.
    pub fn resume(&self, id: u64) -> Result<(), NetnsError> {
        self.signal(id, libc::SIGCONT)
    }

    /// Whether node `id`'s process is alive.
    pub fn is_running(&self, id: u64) -> bool {
        let mut nodes = self.lock();
        nodes
            .get_mut(&id)
            .and_then(|n| n.child.as_mut())
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Cuts the network so that two nodes talk only when some group holds both (groups may
    /// overlap: `[[a,b],[b,c]]` is the bridge a-b-c): in each node's namespace, DROP rules for the
    /// addresses of every node it shares no group with. Heals first.
    pub fn partition(&self, groups: &[Vec<u64>]) -> Result<(), NetnsError> {
        self.heal()?;
        let nodes: Vec<(u64, String, String)> = self
            .lock()
            .iter()
            .map(|(id, n)| (*id, n.ns.clone(), n.addr.clone()))
            .collect();
        let connected = |a: u64, b: u64| groups.iter().any(|g| g.contains(&a) && g.contains(&b));
        for (a, ns, _) in &nodes {
            for (b, _, addr_b) in &nodes {
                if a == b || connected(*a, *b) {
                    continue;
                }
                run_cmd(
                    "ip",
                    &[
                        "netns", "exec", ns, "iptables", "-A", "INPUT", "-s", addr_b, "-j", "DROP",
                    ],
                )?;
                run_cmd(
                    "ip",
                    &[
                        "netns", "exec", ns, "iptables", "-A", "OUTPUT", "-d", addr_b, "-j", "DROP",
                    ],
                )?;
            }
        }
        Ok(())
    }

    /// Removes every partition rule.
    pub fn heal(&self) -> Result<(), NetnsError> {
        let namespaces: Vec<String> = self.lock().values().map(|n| n.ns.clone()).collect();
        for ns in namespaces {
            run_cmd("ip", &["netns", "exec", &ns, "iptables", "-F", "INPUT"])?;
            run_cmd("ip", &["netns", "exec", &ns, "iptables", "-F", "OUTPUT"])?;
        }
        Ok(())
    }

    /// Deletes node `id`'s data dir (it must be stopped).
    pub fn wipe(&self, id: u64) -> Result<(), NetnsError> {
        if self.is_running(id) {
            return Err(NetnsError::State {
                id,
                message: "running".into(),
            });
        }
        let dir = self.data_dir(id)?;
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|source| NetnsError::Io {
                context: format!("wiping {}", dir.display()),
                source,
            })?;
        }
        Ok(())
    }

    /// Creates a namespace for a new node `id` and starts it with `--initial-cluster-state existing`.
    pub fn add_node(&self, id: u64) -> Result<(), NetnsError> {
        if self.lock().contains_key(&id) {
            return Err(NetnsError::State {
                id,
                message: "exists".into(),
            });
        }
        self.create_node(id, "existing")?;
        self.restart(id)
    }

    /// Kills every node and removes namespaces and bridge. Idempotent.
    pub fn teardown(&self) {
        let mut done = self.torn_down.lock().unwrap_or_else(|e| e.into_inner());
        if *done {
            return;
        }
        *done = true;
        let mut nodes = self.lock();
        for node in nodes.values_mut() {
            if let Some(mut child) = node.child.take() {
                let _ = send_signal(child.id(), libc::SIGCONT);
                let _ = child.kill();
                let _ = child.wait();
            }
            let _ = run_cmd("ip", &["netns", "del", &node.ns]);
            let _ = run_cmd("ip", &["link", "del", &node.host_veth]);
        }
        let _ = run_cmd(
            "iptables",
            &[
                "-D",
                "FORWARD",
                "-i",
                &self.bridge,
                "-o",
                &self.bridge,
                "-j",
                "ACCEPT",
            ],
        );
        let _ = run_cmd("ip", &["link", "del", &self.bridge]);
    }
}

impl Drop for NetnsCluster {
    fn drop(&mut self) {
        self.teardown();
    }
}
