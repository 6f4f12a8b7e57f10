//! The `docker` substrate: every node is a container of the ftkv image (`deploy/Dockerfile`,
//! built by `deploy/build-image.sh`) on a user-defined bridge network of its own, configured as
//! `deploy/docker-compose.yml` configures it (`FTKV_*` variables, peers named by container name
//! and resolved by Docker's DNS, data in `/data`). The harness (clients, nemesis) stays on the
//! host and reaches every node at its fixed bridge address `10.214.S.i:7379` (S chosen per run,
//! the network's gateway is `.254`), which the node advertises as its client address.
//!
//! Faults: kill is `docker kill` (SIGKILL to the node, PID 1 of its container) and restart is
//! `docker start` of the same container, so the data, kept in a host folder bind-mounted on
//! `/data` (`<dir>/n<ID>/data`, owned by the image's uid 10001), survives; the `disk` nemesis
//! and `wipe` work on that folder. Pause is `docker pause`/`unpause` (the cgroup freezer).
//! Partitions are iptables DROP rules inside a container's network namespace, entered from the
//! host (`nsenter -t <pid> -n iptables ...`: the image has neither a shell nor iptables), heal
//! flushes them; as on `netns` clients are never cut off, only node-to-node links. A container
//! restarted while partitioned gets a fresh namespace (its own side of the rules is gone; the
//! other nodes' rules still drop it). Not supported: the `clock` nemesis (it preloads the host's
//! libfaketime into node processes).
//!
//! Node logs are the containers' output (`docker logs`), written to `<dir>/n<ID>/node.log`
//! whenever [`DockerCluster::log_path`] is asked and before the containers are removed.
//!
//! Names: network `ftkv-jepsen-<pid>-<n>`, containers `ftkv-jepsen-<pid>-<n>-n<ID>`, both
//! labelled [`OWNER_LABEL`]`=<pid>`. [`DockerCluster::teardown`] (also on drop) removes the
//! containers (with any anonymous volume) and the network; [`cleanup_leftovers`] removes those of
//! harnesses that no longer run (SIGKILLed), and never touches anything else (other Compose
//! projects on the same daemon). Every docker command is bounded by [`DOCKER_TIMEOUT_S`].

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// Errors of the docker substrate.
#[derive(Debug, thiserror::Error)]
pub enum DockerError {
    /// A docker, nsenter or iptables command failed.
    #[error("`{command}` failed: {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// What it printed on stderr (or the spawn error).
        stderr: String,
    },
    /// The substrate cannot run here (no Docker, no image, not root).
    #[error("{0}")]
    Unavailable(String),
    /// File trouble (log files, data dirs).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
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

/// Prefix of every network and container name this substrate creates.
pub const NAME_PREFIX: &str = "ftkv-jepsen-";

/// Label naming the harness process that created a network or container.
pub const OWNER_LABEL: &str = "ftkv-jepsen.owner-pid";

/// Bound of one docker command, s (a hung daemon must not hang the harness).
pub const DOCKER_TIMEOUT_S: u64 = 60;

/// The image's user (deploy/Dockerfile `USER 10001:10001`): owner of the data folders.
const IMAGE_UID: u32 = 10001;

const CLIENT_PORT: u16 = 7379;
const PEER_PORT: u16 = 7380;
const STATUS_PORT: u16 = 7381;

fn io_error(context: String) -> impl FnOnce(std::io::Error) -> DockerError {
    move |source| DockerError::Io { context, source }
}

/// Runs `program args` under coreutils' `timeout` ([`DOCKER_TIMEOUT_S`]), failing with its stderr.
fn run_bounded(program: &str, args: &[&str]) -> Result<String, DockerError> {
    let line = format!("{program} {}", args.join(" "));
    let limit = DOCKER_TIMEOUT_S.to_string();
    let out = Command::new("timeout")
        .args(["-k", "5", &limit, program])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| DockerError::Command {
            command: line.clone(),
            stderr: format!("cannot run it under `timeout`: {e}"),
        })?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let stderr = if out.status.code() == Some(124) {
        format!("timed out after {DOCKER_TIMEOUT_S} s")
    } else {
        String::from_utf8_lossy(&out.stderr).trim().to_string()
    };
    Err(DockerError::Command {
        command: line,
        stderr,
    })
}

fn docker(args: &[&str]) -> Result<String, DockerError> {
    run_bounded("docker", args)
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false)
}

fn is_root() -> bool {
    #[allow(unsafe_code)]
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    euid == 0
}

/// Whether this process can use the docker substrate with `image`: the daemon answers, the image
/// exists, and (for partitions) it runs as root with `nsenter` and `iptables`.
pub fn available(image: &str) -> Result<(), String> {
    for tool in ["docker", "timeout"] {
        if !on_path(tool) {
            return Err(format!("the docker substrate needs `{tool}` on PATH"));
        }
    }
    docker(&["version", "--format", "{{.Server.Version}}"])
        .map_err(|e| format!("the docker substrate needs a running Docker daemon: {e}"))?;
    if docker(&["image", "inspect", "--format", "{{.Id}}", image]).is_err() {
        return Err(format!(
            "image {image} not found: build it with `deploy/build-image.sh --profile debug --tag {image}` \
             (or pass --image)"
        ));
    }
    if !is_root() {
        return Err(
            "the docker substrate needs root (nsenter into the containers' network namespaces)".into(),
        );
    }
    for tool in ["nsenter", "iptables"] {
        if !on_path(tool) {
            return Err(format!(
                "`{tool}` not found (apt-get install -y util-linux iptables)"
            ));
        }
    }
    Ok(())
}

/// Whether process `pid` still runs (the owner of a network or container).
fn alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// `(name, owner pid)` of every object of `kind` (`container`, `network`) carrying [`OWNER_LABEL`]
/// whose name starts with [`NAME_PREFIX`].
fn owned(kind: &str) -> Vec<(String, Option<u32>)> {
    let filter = format!("label={OWNER_LABEL}");
    let format = format!("{{{{.Names}}}}\t{{{{.Label \"{OWNER_LABEL}\"}}}}");
    let net_format = format.replace(".Names", ".Name");
    let out = match kind {
        "container" => docker(&["ps", "-a", "--filter", &filter, "--format", &format]),
        _ => docker(&["network", "ls", "--filter", &filter, "--format", &net_format]),
    };
    out.unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (name, pid) = l.split_once('\t')?;
            name.starts_with(NAME_PREFIX)
                .then(|| (name.to_string(), pid.trim().parse().ok()))
        })
        .collect()
}

/// Removes the containers and networks of docker-substrate runs whose harness no longer runs
/// (names `ftkv-jepsen-*` with [`OWNER_LABEL`] naming a dead process); with `all`, also those of
/// running harnesses. Returns the names removed.
pub fn cleanup_leftovers(all: bool) -> Vec<String> {
    let mut removed = Vec::new();
    let stale = |pid: Option<u32>| all || !pid.is_some_and(alive);
    for (name, pid) in owned("container") {
        if stale(pid) && docker(&["rm", "-f", "-v", &name]).is_ok() {
            removed.push(name);
        }
    }
    for (name, pid) in owned("network") {
        if stale(pid) && docker(&["network", "rm", &name]).is_ok() {
            removed.push(name);
        }
    }
    removed
}

struct DockerNode {
    container: String,
    addr: String,
    data_dir: PathBuf,
    log_path: PathBuf,
    initial_state: &'static str,
    /// The container exists (`docker run` was done; later starts are `docker start`).
    created: bool,
}

/// A cluster of ftkv containers on a network of its own. See the module doc.
pub struct DockerCluster {
    tag: String,
    subnet: u8,
    image: String,
    dir: PathBuf,
    extra_args: Vec<String>,
    /// Extra node environment; `{id}` in a value is replaced by the node id.
    env: Vec<(String, String)>,
    initial_cluster: String,
    nodes: Mutex<BTreeMap<u64, DockerNode>>,
    network_created: Mutex<bool>,
    torn_down: Mutex<bool>,
}

impl DockerCluster {
    /// Removes leftovers of dead harnesses, creates the network and `count` containers of
    /// `image` (ids 1..=count) with `extra_args` appended to `ftkv-node run` and `env` set (`{id}`
    /// in a value is replaced by the node id). Node folders go under `dir`. On any error what was
    /// created is removed again.
    pub fn start(
        count: u64,
        dir: &Path,
        image: &str,
        extra_args: Vec<String>,
        env: Vec<(String, String)>,
    ) -> Result<Self, DockerError> {
        available(image).map_err(DockerError::Unavailable)?;
        let removed = cleanup_leftovers(false);
        if !removed.is_empty() {
            eprintln!(
                "ftkv-jepsen docker: removed leftovers of dead runs: {}",
                removed.join(" ")
            );
        }
        static CLUSTERS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = CLUSTERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let pid = std::process::id();
        let tag = format!("{NAME_PREFIX}{pid}-{n}");
        std::fs::create_dir_all(dir).map_err(io_error(format!("creating {}", dir.display())))?;
        // Absolute: it is bind-mounted by the daemon.
        let dir = std::fs::canonicalize(dir).map_err(io_error(format!("resolving {}", dir.display())))?;
        let mut cluster = DockerCluster {
            initial_cluster: (1..=count)
                .map(|i| format!("{i}={tag}-n{i}:{PEER_PORT}"))
                .collect::<Vec<_>>()
                .join(","),
            tag,
            subnet: 0,
            image: image.to_string(),
            dir,
            extra_args,
            env,
            nodes: Mutex::new(BTreeMap::new()),
            network_created: Mutex::new(false),
            torn_down: Mutex::new(false),
        };
        // On error, Drop tears down what exists.
        cluster.subnet = cluster.create_network(pid, n)?;
        for id in 1..=count {
            cluster.create_node(id, "new")?;
        }
        for id in 1..=count {
            cluster.restart(id)?;
        }
        Ok(cluster)
    }

    /// Creates the network on a free `10.214.S.0/24` (another network may hold S: the next is
    /// tried); returns S.
    fn create_network(&self, pid: u32, n: u32) -> Result<u8, DockerError> {
        let label = format!("{OWNER_LABEL}={pid}");
        let mut last = None;
        for attempt in 0..40u32 {
            let s = (1 + (pid.wrapping_add(n * 37).wrapping_add(attempt * 7)) % 250) as u8;
            let subnet = format!("10.214.{s}.0/24");
            let gateway = format!("10.214.{s}.254");
            match docker(&[
                "network",
                "create",
                "--driver",
                "bridge",
                "--subnet",
                &subnet,
                "--gateway",
                &gateway,
                "--label",
                &label,
                &self.tag,
            ]) {
                Ok(_) => {
                    *self.network_created.lock().unwrap_or_else(|e| e.into_inner()) = true;
                    return Ok(s);
                }
                Err(DockerError::Command { stderr, command }) if stderr.contains("overlap") => {
                    last = Some(DockerError::Command { command, stderr });
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| DockerError::Unavailable("no free 10.214.S.0/24 subnet".into())))
    }

    /// Registers node `id` and creates its data folder (the container is created at its first
    /// start).
    fn create_node(&self, id: u64, initial_state: &'static str) -> Result<(), DockerError> {
        let node_dir = self.dir.join(format!("n{id}"));
        let data_dir = node_dir.join("data");
        make_data_dir(&data_dir)?;
        self.lock().insert(
            id,
            DockerNode {
                container: format!("{}-n{id}", self.tag),
                addr: format!("10.214.{}.{id}", self.subnet),
                data_dir,
                log_path: node_dir.join("node.log"),
                initial_state,
                created: false,
            },
        );
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, DockerNode>> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn container(&self, id: u64) -> Result<String, DockerError> {
        self.lock()
            .get(&id)
            .map(|n| n.container.clone())
            .ok_or(DockerError::UnknownNode(id))
    }

    /// The network's name.
    pub fn network(&self) -> &str {
        &self.tag
    }

    /// Node ids, ascending.
    pub fn ids(&self) -> Vec<u64> {
        self.lock().keys().copied().collect()
    }

    /// Client endpoint `addr:port` of node `id` (its bridge address, reachable from the host).
    pub fn endpoint(&self, id: u64) -> Result<String, DockerError> {
        self.lock()
            .get(&id)
            .map(|n| format!("{}:{CLIENT_PORT}", n.addr))
            .ok_or(DockerError::UnknownNode(id))
    }

    /// Peer endpoint `container-name:port` of node `id` (resolved by Docker's DNS on the network).
    pub fn peer_endpoint(&self, id: u64) -> Result<String, DockerError> {
        self.container(id).map(|c| format!("{c}:{PEER_PORT}"))
    }

    /// Data folder of node `id` (on the host, mounted on `/data`).
    pub fn data_dir(&self, id: u64) -> Result<PathBuf, DockerError> {
        self.lock()
            .get(&id)
            .map(|n| n.data_dir.clone())
            .ok_or(DockerError::UnknownNode(id))
    }

    /// Log file of node `id`, first rewritten with the container's whole output (every start).
    pub fn log_path(&self, id: u64) -> Result<PathBuf, DockerError> {
        let (container, path, created) = {
            let nodes = self.lock();
            let n = nodes.get(&id).ok_or(DockerError::UnknownNode(id))?;
            (n.container.clone(), n.log_path.clone(), n.created)
        };
        if created {
            save_logs(&container, &path)?;
        }
        Ok(path)
    }

    /// `docker inspect` of `container` with `format`.
    fn inspect(&self, container: &str, format: &str) -> Result<String, DockerError> {
        docker(&["inspect", "--type", "container", "--format", format, container])
            .map(|s| s.trim().to_string())
    }

    /// Starts node `id` (again): `docker run` the first time, then `docker start`.
    pub fn restart(&self, id: u64) -> Result<(), DockerError> {
        let (container, created) = {
            let nodes = self.lock();
            let n = nodes.get(&id).ok_or(DockerError::UnknownNode(id))?;
            (n.container.clone(), n.created)
        };
        if created {
            if self.is_running(id) {
                return Err(DockerError::State {
                    id,
                    message: "already running".into(),
                });
            }
            docker(&["start", &container]).map(|_| ())
        } else {
            let args = self.run_args(id)?;
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            // Marked before the command: a half-created container is still removed at teardown.
            if let Some(n) = self.lock().get_mut(&id) {
                n.created = true;
            }
            docker(&args).map(|_| ())
        }
    }

    /// `docker run` arguments of node `id`: the Compose file's configuration, a fixed address
    /// (advertised to clients), the data folder on `/data`.
    fn run_args(&self, id: u64) -> Result<Vec<String>, DockerError> {
        let nodes = self.lock();
        let n = nodes.get(&id).ok_or(DockerError::UnknownNode(id))?;
        let initial_cluster = if n.initial_state == "new" {
            self.initial_cluster.clone()
        } else {
            format!("{},{id}={}:{PEER_PORT}", self.initial_cluster, n.container)
        };
        let rust_log = std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into());
        let mut env: Vec<(String, String)> = vec![
            ("FTKV_ID".into(), id.to_string()),
            ("FTKV_DATA_DIR".into(), "/data".into()),
            ("FTKV_LISTEN_CLIENT".into(), format!("0.0.0.0:{CLIENT_PORT}")),
            (
                "FTKV_ADVERTISE_CLIENT".into(),
                format!("{}:{CLIENT_PORT}", n.addr),
            ),
            ("FTKV_LISTEN_PEER".into(), format!("0.0.0.0:{PEER_PORT}")),
            (
                "FTKV_ADVERTISE_PEER".into(),
                format!("{}:{PEER_PORT}", n.container),
            ),
            ("FTKV_LISTEN_STATUS".into(), format!("0.0.0.0:{STATUS_PORT}")),
            ("FTKV_INITIAL_CLUSTER".into(), initial_cluster),
            ("FTKV_INITIAL_CLUSTER_STATE".into(), n.initial_state.into()),
            ("RUST_LOG".into(), rust_log),
        ];
        let id_text = id.to_string();
        env.extend(
            self.env
                .iter()
                .map(|(k, v)| (k.clone(), v.replace("{id}", &id_text))),
        );
        let owner = format!("{OWNER_LABEL}={}", std::process::id());
        let mut args: Vec<String> = [
            "run",
            "-d",
            "--name",
            &n.container,
            "--hostname",
            &n.container,
            "--network",
            &self.tag,
            "--ip",
            &n.addr,
            "--label",
            &owner,
            "--restart",
            "no",
            // The image's health check execs ftkvctl every 10 s: load the harness does not need.
            "--no-healthcheck",
            "-v",
            &format!("{}:/data", n.data_dir.display()),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if !is_root() {
            // The data folder is ours, not uid 10001's.
            #[allow(unsafe_code)]
            // SAFETY: getuid and getgid have no preconditions.
            let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
            args.extend(["--user".to_string(), format!("{uid}:{gid}")]);
        }
        for (k, v) in env {
            args.extend(["-e".to_string(), format!("{k}={v}")]);
        }
        args.push(self.image.clone());
        args.push("run".into());
        args.extend(self.extra_args.iter().cloned());
        Ok(args)
    }

    /// `docker kill`s node `id` (SIGKILL; unpaused first: a paused container cannot be killed).
    pub fn kill(&self, id: u64) -> Result<(), DockerError> {
        let container = self.container(id)?;
        if !self.is_running(id) {
            return Err(DockerError::State {
                id,
                message: "not running".into(),
            });
        }
        if self.is_paused(id) {
            docker(&["unpause", &container])?;
        }
        docker(&["kill", "--signal", "KILL", &container])?;
        // `docker kill` returns once the signal is sent: wait until the container has stopped.
        docker(&["wait", &container]).map(|_| ())
    }

    /// `docker pause`s node `id`.
    pub fn pause(&self, id: u64) -> Result<(), DockerError> {
        docker(&["pause", &self.container(id)?]).map(|_| ())
    }

    /// `docker unpause`s node `id`.
    pub fn resume(&self, id: u64) -> Result<(), DockerError> {
        if !self.is_paused(id) {
            return Err(DockerError::State {
                id,
                message: "not paused".into(),
            });
        }
        docker(&["unpause", &self.container(id)?]).map(|_| ())
    }

    /// Whether node `id`'s container runs (paused counts as running, as a stopped process does).
    pub fn is_running(&self, id: u64) -> bool {
        self.container(id)
            .and_then(|c| self.inspect(&c, "{{.State.Running}}"))
            .is_ok_and(|s| s == "true")
    }

    /// Whether node `id`'s container is paused.
    pub fn is_paused(&self, id: u64) -> bool {
        self.container(id)
            .and_then(|c| self.inspect(&c, "{{.State.Paused}}"))
            .is_ok_and(|s| s == "true")
    }

    /// Host pid of node `id`'s process (0 when stopped).
    fn pid(&self, id: u64) -> Result<u32, DockerError> {
        let c = self.container(id)?;
        let s = self.inspect(&c, "{{.State.Pid}}")?;
        s.parse().map_err(|_| DockerError::State {
            id,
            message: format!("docker inspect gave pid {s:?}"),
        })
    }

    /// `iptables args` inside node `id`'s network namespace; `Ok(false)` when it is stopped (no
    /// namespace).
    fn iptables(&self, id: u64, args: &[&str]) -> Result<bool, DockerError> {
        let pid = self.pid(id)?;
        if pid == 0 {
            return Ok(false);
        }
        let pid = pid.to_string();
        let mut full = vec!["-t", &pid, "-n", "iptables"];
        full.extend_from_slice(args);
        run_bounded("nsenter", &full).map(|_| true)
    }

    /// Cuts the network so that two nodes talk only when some group holds both (groups may
    /// overlap: `[[a,b],[b,c]]` is the bridge a-b-c): inside each running node's namespace, DROP
    /// rules for the addresses of every node it shares no group with. Heals first.
    pub fn partition(&self, groups: &[Vec<u64>]) -> Result<(), DockerError> {
        self.heal()?;
        let nodes: Vec<(u64, String)> = self.lock().iter().map(|(id, n)| (*id, n.addr.clone())).collect();
        let connected = |a: u64, b: u64| groups.iter().any(|g| g.contains(&a) && g.contains(&b));
        for (a, _) in &nodes {
            for (b, addr_b) in &nodes {
                if a == b || connected(*a, *b) {
                    continue;
                }
                self.iptables(*a, &["-A", "INPUT", "-s", addr_b, "-j", "DROP"])?;
                self.iptables(*a, &["-A", "OUTPUT", "-d", addr_b, "-j", "DROP"])?;
            }
        }
        Ok(())
    }

    /// Removes every partition rule (in running containers; a stopped one has no namespace).
    pub fn heal(&self) -> Result<(), DockerError> {
        for id in self.ids() {
            self.iptables(id, &["-F", "INPUT"])?;
            self.iptables(id, &["-F", "OUTPUT"])?;
        }
        Ok(())
    }

    /// Empties node `id`'s data folder (it must be stopped).
    pub fn wipe(&self, id: u64) -> Result<(), DockerError> {
        if self.is_running(id) {
            return Err(DockerError::State {
                id,
                message: "running".into(),
            });
        }
        let dir = self.data_dir(id)?;
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(io_error(format!("wiping {}", dir.display())))?;
        }
        // The container's bind mount needs the folder.
        make_data_dir(&dir)
    }

    /// Creates and starts a container for a new node `id` with `--initial-cluster-state existing`.
    pub fn add_node(&self, id: u64) -> Result<(), DockerError> {
        if self.lock().contains_key(&id) {
            return Err(DockerError::State {
                id,
                message: "exists".into(),
            });
        }
        self.create_node(id, "existing")?;
        self.restart(id)
    }

    /// Saves every node's log, removes the containers (with anonymous volumes) and the network.
    /// Idempotent.
    pub fn teardown(&self) {
        let mut done = self.torn_down.lock().unwrap_or_else(|e| e.into_inner());
        if *done {
            return;
        }
        *done = true;
        let nodes: Vec<(String, PathBuf, bool)> = self
            .lock()
            .values()
            .map(|n| (n.container.clone(), n.log_path.clone(), n.created))
            .collect();
        for (container, log_path, created) in nodes {
            if created {
                let _ = save_logs(&container, &log_path);
                let _ = docker(&["rm", "-f", "-v", &container]);
            }
        }
        if *self.network_created.lock().unwrap_or_else(|e| e.into_inner()) {
            let _ = docker(&["network", "rm", &self.tag]);
        }
    }
}

impl Drop for DockerCluster {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// Creates `dir` for a container's `/data`, owned by the image's user when running as root.
fn make_data_dir(dir: &Path) -> Result<(), DockerError> {
    std::fs::create_dir_all(dir).map_err(io_error(format!("creating {}", dir.display())))?;
    if is_root() {
        std::os::unix::fs::chown(dir, Some(IMAGE_UID), Some(IMAGE_UID))
            .map_err(io_error(format!("chown {IMAGE_UID} {}", dir.display())))?;
    }
    Ok(())
}

/// Writes `docker logs <container>` (stdout and stderr) into `path`.
fn save_logs(container: &str, path: &Path) -> Result<(), DockerError> {
    let file = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(path)
        .map_err(io_error(format!("opening {}", path.display())))?;
    let mut err = file
        .try_clone()
        .map_err(io_error("cloning a log handle".into()))?;
    let _ = writeln!(err, "===== ftkv-jepsen docker: docker logs {container} =====");
    let limit = DOCKER_TIMEOUT_S.to_string();
    let status = Command::new("timeout")
        .args(["-k", "5", &limit, "docker", "logs", container])
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(err)
        .status()
        .map_err(io_error(format!("docker logs {container}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(DockerError::Command {
            command: format!("docker logs {container}"),
            stderr: format!("exit {status} (see {})", path.display()),
        })
    }
}
