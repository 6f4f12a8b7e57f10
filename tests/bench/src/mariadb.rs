//! MariaDB semi-sync as a benchmark target: the seed's own setup, three MariaDB servers from
//! Debian (`mariadb-server`, 10.11) on loopback, one master and two slaves, started and stopped
//! here.
//!
//! - Each server has its own datadir (one `mariadb-install-db`, copied three times), port,
//!   socket and `server_id`; binary log on every server (`log_slave_updates`, row format,
//!   `gtid_strict_mode`), slaves replicate with GTID (`MASTER_USE_GTID=slave_pos`) and are
//!   `read_only`.
//! - Semi-sync is built into MariaDB 10.11: the master runs with
//!   `rpl_semi_sync_master_enabled=ON`, `rpl_semi_sync_master_wait_point=AFTER_SYNC` and
//!   `rpl_semi_sync_master_timeout` at its maximum (18446744073709551615 ms: it never falls back
//!   to asynchronous replication), `rpl_semi_sync_master_wait_no_slave=ON` (the default); the
//!   slaves with `rpl_semi_sync_slave_enabled=ON`. MariaDB has **no**
//!   `rpl_semi_sync_master_wait_for_slave_count` (MySQL 5.7+ has it): a commit waits for the
//!   first acknowledgement of any one slave, so MariaDB always runs the "1 slave" setting
//!   (ftkv's majority of three, `ack = "majority"`); "all slaves" cannot be expressed.
//! - InnoDB with the seed's settings (`innodb_flush_log_at_trx_commit=2`, `sync_binlog=0`,
//!   [`Durability::Seed`]) or fully durable (`=1`, `=1`, [`Durability::Full`]);
//!   `innodb_buffer_pool_size` 256 MiB, the same as each ftkv node's engine cache;
//!   `innodb_log_file_size` 512 MiB so the short runs are not throttled by redo checkpoints
//!   (both set by [`InnoDbSizes`]; the smoke test makes them small).
//! - As root the servers run as the `mysql` user (`--user=mysql`, datadirs chowned to it);
//!   otherwise as the current user.
//!
//! Semi-sync is switched on at the master only after the setup statements (users, database)
//! and once both slaves are connected (`Rpl_semi_sync_master_clients` = 2): with no slave and
//! an endless timeout the setup itself would wait forever.
//!
//! [`MariaDbCluster::check`] is the validity check of a run: both slaves hold the master's row
//! count after catching up (`MASTER_GTID_WAIT`), and semi-sync never fell back
//! (`Rpl_semi_sync_master_no_tx` = 0, `Rpl_semi_sync_master_no_times` = 0,
//! `Rpl_semi_sync_master_status` = ON).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

/// The database the workload writes to (sysbench's default name).
pub const DATABASE: &str = "sbtest";
/// The user the workload connects as (over the master's socket).
pub const USER: &str = "bench";
/// Its password.
pub const PASSWORD: &str = "bench";

/// InnoDB and binary-log durability of a [`MariaDbCluster`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Durability {
    /// The seed's settings: `innodb_flush_log_at_trx_commit=2`, `sync_binlog=0` (redo and
    /// binlog written at commit, fsynced about once a second).
    Seed,
    /// Fully durable: `innodb_flush_log_at_trx_commit=1`, `sync_binlog=1` (fsync per commit
    /// group).
    Full,
}

impl Durability {
    /// `(innodb_flush_log_at_trx_commit, sync_binlog)`.
    pub fn settings(self) -> (u8, u8) {
        match self {
            Durability::Seed => (2, 0),
            Durability::Full => (1, 1),
        }
    }
}

/// The binaries a MariaDB target needs.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `mariadbd`.
    pub server: PathBuf,
    /// `mariadb-install-db`.
    pub install_db: PathBuf,
    /// `mariadb` (the command-line client, for setup and checks).
    pub client: PathBuf,
    /// `sysbench`.
    pub sysbench: PathBuf,
}

/// The first of `names` found in `PATH` or in the sbin folders (not on a normal user's PATH).
fn find_binary(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let dirs = path
        .split(':')
        .map(str::to_string)
        .chain(["/usr/sbin", "/usr/bin", "/sbin"].map(String::from));
    for dir in dirs {
        for n in names {
            let p = Path::new(&dir).join(n);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

impl Binaries {
    /// The installed binaries, or what is missing.
    pub fn find() -> Result<Self, String> {
        let server = find_binary(&["mariadbd", "mysqld"]);
        let install_db = find_binary(&["mariadb-install-db", "mysql_install_db"]);
        let client = find_binary(&["mariadb", "mysql"]);
        let sysbench = find_binary(&["sysbench"]);
        match (server, install_db, client, sysbench) {
            (Some(server), Some(install_db), Some(client), Some(sysbench)) => Ok(Self {
                server,
                install_db,
                client,
                sysbench,
            }),
            (s, i, c, b) => {
                let missing: Vec<&str> = [
                    (s.is_none(), "mariadbd"),
                    (i.is_none(), "mariadb-install-db"),
                    (c.is_none(), "mariadb"),
                    (b.is_none(), "sysbench"),
                ]
                .into_iter()
                .filter_map(|(m, n)| m.then_some(n))
                .collect();
                Err(format!("not installed: {}", missing.join(", ")))
            }
        }
    }
}

/// Whether this process runs as root (`Uid:` of `/proc/self/status`).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().next().map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// The binaries, installing Debian's `mariadb-server` and `sysbench` first when they are
/// missing and this process is root; otherwise an error that says how to install them.
pub fn ensure_installed() -> anyhow::Result<Binaries> {
    let missing = match Binaries::find() {
        Ok(b) => return Ok(b),
        Err(m) => m,
    };
    anyhow::ensure!(
        is_root() && find_binary(&["apt-get"]).is_some(),
        "MariaDB target: {missing}; install them as root: \
         `apt-get install -y mariadb-server sysbench` (Debian 12: MariaDB 10.11, sysbench 1.0)"
    );
    eprintln!("ftkv-bench: {missing}: apt-get install -y mariadb-server sysbench");
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-q", "mariadb-server", "sysbench"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null())
            .status()
    };
    if !install()?.success() {
        // A fresh machine may not have package lists yet.
        let _ = Command::new("apt-get").args(["update", "-q"]).status();
        anyhow::ensure!(
            install()?.success(),
            "apt-get install -y mariadb-server sysbench failed"
        );
    }
    Binaries::find().map_err(|m| anyhow::anyhow!("after apt-get install: {m}"))
}

/// One `mariadbd`.
struct Server {
    child: Child,
    /// `m<i>`: `data/` (the datadir), `mariadbd.sock`, `mariadbd.err`, `mariadbd.pid`.
    dir: PathBuf,
    port: u16,
}

impl Server {
    fn socket(&self) -> PathBuf {
        self.dir.join("mariadbd.sock")
    }
}

/// A master and two semi-sync slaves on loopback. Dropping it stops the servers (SIGTERM, then
/// SIGKILL after 30 s) and removes their directories.
pub struct MariaDbCluster {
    servers: Vec<Server>,
    binaries: Binaries,
    durability: Durability,
    dir: tempfile::TempDir,
}

/// What [`MariaDbCluster::check`] found after a run.
#[derive(Debug, Clone, Serialize)]
pub struct Checks {
    /// Rows in the `sbtest` tables on the master, then each slave.
    pub rows: Vec<u64>,
    /// Every slave caught up with the master's binlog position (`MASTER_GTID_WAIT`).
    pub slaves_caught_up: bool,
    /// `Rpl_semi_sync_master_status` (ON while semi-sync is in force).
    pub semi_sync_status: String,
    /// `Rpl_semi_sync_master_no_tx`: commits not acknowledged by a slave.
    pub semi_sync_no_tx: u64,
    /// `Rpl_semi_sync_master_no_times`: times the master turned semi-sync off.
    pub semi_sync_no_times: u64,
    /// `Rpl_semi_sync_master_yes_tx`: commits acknowledged by a slave.
    pub semi_sync_yes_tx: u64,
    /// The settings read back from the master: `innodb_flush_log_at_trx_commit`,
    /// `sync_binlog`, `rpl_semi_sync_master_wait_point`, `rpl_semi_sync_master_timeout`.
    pub master_settings: Vec<(String, String)>,
    /// Why the run is invalid (empty when valid).
    pub problems: Vec<String>,
}

impl Checks {
    /// No problem found.
    pub fn valid(&self) -> bool {
        self.problems.is_empty()
    }
}

/// InnoDB memory and redo sizes of every server, as `mariadbd` size strings (`256M`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InnoDbSizes {
    /// `innodb_buffer_pool_size`: 256M by default, each ftkv node's engine cache.
    pub buffer_pool_size: String,
    /// `innodb_log_file_size`: 512M by default, so the runs are not throttled by redo
    /// checkpoints; a smoke run sets it small because the servers write it out when they
    /// first start.
    pub log_file_size: String,
}

impl Default for InnoDbSizes {
    fn default() -> Self {
        Self {
            buffer_pool_size: "256M".to_string(),
            log_file_size: "512M".to_string(),
        }
    }
}

/// Checks a `mariadbd` size flag's value: digits with an optional `K`, `M` or `G`.
pub fn parse_size_flag(value: &str) -> Result<String, String> {
    let digits = value.trim_end_matches(['K', 'M', 'G', 'k', 'm', 'g']);
    let suffixes = value.len() - digits.len();
    if digits.is_empty() || suffixes > 1 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "{value:?} is not a MariaDB size (digits with an optional K, M or G, e.g. 256M)"
        ));
    }
    Ok(value.to_string())
}

/// Extra `mariadbd` flags of server `index` (0 = master).
pub fn server_args(index: usize, durability: Durability, sizes: &InnoDbSizes) -> Vec<String> {
    let (trx_commit, sync_binlog) = durability.settings();
    let mut args = vec![
        format!("--server-id={}", index + 1),
        "--log-bin=binlog".to_string(),
        "--binlog-format=ROW".to_string(),
        "--log-slave-updates=ON".to_string(),
        "--gtid-strict-mode=ON".to_string(),
        "--skip-name-resolve".to_string(),
        "--max-connections=2000".to_string(),
        format!("--innodb-buffer-pool-size={}", sizes.buffer_pool_size),
        format!("--innodb-log-file-size={}", sizes.log_file_size),
        format!("--innodb-flush-log-at-trx-commit={trx_commit}"),
        format!("--sync-binlog={sync_binlog}"),
    ];
    if index == 0 {
        // Enabled after setup (see the module docs); these apply from then on.
        args.extend([
            "--rpl-semi-sync-master-wait-point=AFTER_SYNC".to_string(),
            "--rpl-semi-sync-master-timeout=18446744073709551615".to_string(),
            "--rpl-semi-sync-master-wait-no-slave=ON".to_string(),
        ]);
    } else {
        args.extend([
            "--rpl-semi-sync-slave-enabled=ON".to_string(),
            "--read-only=ON".to_string(),
        ]);
    }
    args
}

fn run_checked(cmd: &mut Command, what: &str) -> anyhow::Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("{what}: cannot start"))?;
    anyhow::ensure!(
        out.status.success(),
        "{what} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim(),
        String::from_utf8_lossy(&out.stdout).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl MariaDbCluster {
    /// Creates the datadirs, starts the three servers on free ports, sets up GTID replication
    /// and the workload's user and database, then turns semi-sync on and waits until both
    /// slaves are semi-sync clients.
    pub fn start(binaries: &Binaries, durability: Durability, sizes: &InnoDbSizes) -> anyhow::Result<Self> {
        let root = is_root();
        let dir = tempfile::Builder::new().prefix("ftkv-bench-mariadb-").tempdir()?;
        // The servers run as `mysql` and must reach their folders inside.
        run_checked(
            Command::new("chmod").arg("755").arg(dir.path()),
            "chmod of the MariaDB folder",
        )?;
        let seed = dir.path().join("seed");
        std::fs::create_dir(&seed)?;
        if root {
            run_checked(
                Command::new("chown").arg("mysql:mysql").arg(&seed),
                "chown mysql:mysql (is there a mysql user? it comes with mariadb-server)",
            )?;
        }
        let mut install = Command::new(&binaries.install_db);
        install
            .arg("--no-defaults")
            .arg(format!("--datadir={}", seed.display()))
            .arg("--auth-root-authentication-method=normal")
            .arg("--skip-test-db");
        if root {
            install.arg("--user=mysql");
        }
        run_checked(&mut install, "mariadb-install-db")?;
        let base_port = crate::ports::free_port_block(3)?;
        let mut cluster = Self {
            servers: Vec::new(),
            binaries: binaries.clone(),
            durability,
            dir,
        };
        for i in 0..3 {
            let sdir = cluster.dir.path().join(format!("m{i}"));
            std::fs::create_dir(&sdir)?;
            run_checked(
                Command::new("cp").arg("-a").arg(&seed).arg(sdir.join("data")),
                "copy of the datadir",
            )?;
            if root {
                run_checked(
                    Command::new("chown").arg("-R").arg("mysql:mysql").arg(&sdir),
                    "chown of a datadir",
                )?;
            }
            let port = base_port + i as u16;
            let log = std::fs::File::create(cluster.dir.path().join(format!("m{i}.out")))?;
            let mut cmd = Command::new(&binaries.server);
            cmd.arg("--no-defaults")
                .arg(format!("--datadir={}", sdir.join("data").display()))
                .arg(format!("--socket={}", sdir.join("mariadbd.sock").display()))
                .arg(format!("--pid-file={}", sdir.join("mariadbd.pid").display()))
                .arg(format!("--log-error={}", sdir.join("mariadbd.err").display()))
                .arg(format!("--port={port}"))
                .arg("--bind-address=127.0.0.1")
                .args(server_args(i, durability, sizes));
            if root {
                cmd.arg("--user=mysql");
            }
            let child = cmd
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .with_context(|| format!("cannot start {}", binaries.server.display()))?;
            cluster.servers.push(Server {
                child,
                dir: sdir,
                port,
            });
        }
        for i in 0..cluster.servers.len() {
            cluster.wait_ready(i)?;
        }
        let master_port = cluster.servers.first().map(|s| s.port).unwrap_or(0);
        cluster.sql(
            0,
            &format!(
                "CREATE USER repl@'127.0.0.1' IDENTIFIED BY 'repl'; \
                 GRANT REPLICATION SLAVE ON *.* TO repl@'127.0.0.1'; \
                 CREATE USER {USER}@'localhost' IDENTIFIED BY '{PASSWORD}'; \
                 GRANT ALL ON *.* TO {USER}@'localhost'; \
                 CREATE DATABASE {DATABASE};"
            ),
        )?;
        for i in 1..cluster.servers.len() {
            cluster.sql(
                i,
                &format!(
                    "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={master_port}, \
                     MASTER_USER='repl', MASTER_PASSWORD='repl', MASTER_USE_GTID=slave_pos, \
                     MASTER_CONNECT_RETRY=1; START SLAVE;"
                ),
            )?;
        }
        cluster.sql(0, "SET GLOBAL rpl_semi_sync_master_enabled=ON")?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let clients = cluster.status(0, "Rpl_semi_sync_master_clients")?;
            if clients == "2" {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "MariaDB: {clients} semi-sync slaves connected after 60 s, want 2 (logs in {})",
                cluster.dir.path().display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(cluster)
    }

    /// The durability the servers run with.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// The master's socket (the workload connects there).
    pub fn master_socket(&self) -> PathBuf {
        self.servers.first().map(Server::socket).unwrap_or_default()
    }

    /// Process ids of the three servers.
    pub fn pids(&self) -> Vec<u32> {
        self.servers.iter().map(|s| s.child.id()).collect()
    }

    fn wait_ready(&mut self, i: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.sql(i, "SELECT 1").is_ok() {
                return Ok(());
            }
            if let Some(s) = self.servers.get_mut(i) {
                if let Ok(Some(status)) = s.child.try_wait() {
                    let err = std::fs::read_to_string(s.dir.join("mariadbd.err")).unwrap_or_default();
                    anyhow::bail!("mariadbd {i} exited ({status}): {}", tail(&err, 20));
                }
            }
            anyhow::ensure!(Instant::now() < deadline, "mariadbd {i} not ready after 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Runs `sql` on server `i` as root over its socket; the output in batch form (tab
    /// separated, no column names).
    pub fn sql(&self, i: usize, sql: &str) -> anyhow::Result<String> {
        let s = self
            .servers
            .get(i)
            .with_context(|| format!("no MariaDB server {i}"))?;
        run_checked(
            Command::new(&self.binaries.client)
                .arg("--no-defaults")
                .arg(format!("--socket={}", s.socket().display()))
                .args(["-uroot", "-N", "-B", "-e", sql]),
            &format!("mariadb client on server {i}"),
        )
    }

    /// A global status variable of server `i`.
    fn status(&self, i: usize, name: &str) -> anyhow::Result<String> {
        let out = self.sql(i, &format!("SHOW GLOBAL STATUS LIKE '{name}'"))?;
        Ok(out
            .split('\t')
            .nth(1)
            .map(|v| v.trim().to_string())
            .unwrap_or_default())
    }

    /// Rows in tables `sbtest1..=sbtest<tables>` of server `i` (missing tables count 0).
    pub fn rows(&self, i: usize, tables: u32) -> anyhow::Result<u64> {
        let existing = self.sql(
            i,
            &format!("SELECT table_name FROM information_schema.tables WHERE table_schema='{DATABASE}'"),
        )?;
        let mut total = 0;
        for t in 1..=tables {
            let name = format!("sbtest{t}");
            if existing.lines().any(|l| l.trim() == name) {
                let n = self.sql(i, &format!("SELECT COUNT(*) FROM {DATABASE}.{name}"))?;
                total += n
                    .trim()
                    .parse::<u64>()
                    .with_context(|| format!("row count {n:?}"))?;
            }
        }
        Ok(total)
    }

    /// The validity check of a run over `tables` sbtest tables: waits (up to 300 s) until each
    /// slave has applied the master's binlog, then compares row counts and reads the semi-sync
    /// status. Errors are MariaDB failures; a failed check is a [`Checks::problems`] entry.
    pub fn check(&self, tables: u32) -> anyhow::Result<Checks> {
        let mut problems = Vec::new();
        let pos = self.sql(0, "SELECT @@gtid_binlog_pos")?.trim().to_string();
        let mut slaves_caught_up = true;
        for i in 1..self.servers.len() {
            let waited = self.sql(i, &format!("SELECT MASTER_GTID_WAIT('{pos}', 300)"))?;
            if waited.trim() != "0" {
                slaves_caught_up = false;
                problems.push(format!(
                    "slave {i} did not reach the master's GTID position {pos} within 300 s"
                ));
            }
        }
        let mut rows = Vec::new();
        for i in 0..self.servers.len() {
            rows.push(self.rows(i, tables)?);
        }
        let master_rows = rows.first().copied().unwrap_or(0);
        for (i, r) in rows.iter().enumerate().skip(1) {
            if *r != master_rows {
                problems.push(format!("slave {i} holds {r} rows, the master {master_rows}"));
            }
        }
        if master_rows == 0 {
            problems.push("the master holds no rows".to_string());
        }
        let number = |name: &str| -> anyhow::Result<u64> {
            let v = self.status(0, name)?;
            v.parse().with_context(|| format!("{name} = {v:?}"))
        };
        let semi_sync_status = self.status(0, "Rpl_semi_sync_master_status")?;
        let semi_sync_no_tx = number("Rpl_semi_sync_master_no_tx")?;
        let semi_sync_no_times = number("Rpl_semi_sync_master_no_times")?;
        let semi_sync_yes_tx = number("Rpl_semi_sync_master_yes_tx")?;
        if semi_sync_status != "ON" {
            problems.push(format!(
                "Rpl_semi_sync_master_status is {semi_sync_status}, not ON"
            ));
        }
        if semi_sync_no_tx != 0 {
            problems.push(format!(
                "Rpl_semi_sync_master_no_tx = {semi_sync_no_tx}: commits without a slave's ack"
            ));
        }
        if semi_sync_no_times != 0 {
            problems.push(format!(
                "Rpl_semi_sync_master_no_times = {semi_sync_no_times}: semi-sync was switched off"
            ));
        }
        if semi_sync_yes_tx == 0 {
            problems.push("Rpl_semi_sync_master_yes_tx = 0: no commit was acknowledged".to_string());
        }
        let settings = self.sql(
            0,
            "SELECT @@innodb_flush_log_at_trx_commit, @@sync_binlog, \
             @@rpl_semi_sync_master_wait_point, @@rpl_semi_sync_master_timeout, \
             @@rpl_semi_sync_master_enabled",
        )?;
        let names = [
            "innodb_flush_log_at_trx_commit",
            "sync_binlog",
            "rpl_semi_sync_master_wait_point",
            "rpl_semi_sync_master_timeout",
            "rpl_semi_sync_master_enabled",
        ];
        let master_settings = names
            .iter()
            .zip(settings.trim().split('\t'))
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        Ok(Checks {
            rows,
            slaves_caught_up,
            semi_sync_status,
            semi_sync_no_tx,
            semi_sync_no_times,
            semi_sync_yes_tx,
            master_settings,
            problems,
        })
    }

    /// Stops the servers, slaves first (SIGTERM: a clean InnoDB shutdown; SIGKILL after 30 s).
    pub fn stop(&mut self) {
        for s in self.servers.iter_mut().rev() {
            if let Ok(Some(_)) = s.child.try_wait() {
                continue;
            }
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(s.child.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = s.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if let Ok(None) = s.child.try_wait() {
                let _ = s.child.kill();
                let _ = s.child.wait();
            }
        }
    }
}

impl Drop for MariaDbCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durability_variants_set_innodb_and_binlog_sync() {
        let seed = server_args(0, Durability::Seed, &InnoDbSizes::default());
        assert!(seed.contains(&"--innodb-flush-log-at-trx-commit=2".to_string()));
        assert!(seed.contains(&"--sync-binlog=0".to_string()));
        assert!(seed.contains(&"--rpl-semi-sync-master-wait-point=AFTER_SYNC".to_string()));
        let full = server_args(2, Durability::Full, &InnoDbSizes::default());
        assert!(full.contains(&"--innodb-flush-log-at-trx-commit=1".to_string()));
        assert!(full.contains(&"--sync-binlog=1".to_string()));
        assert!(full.contains(&"--server-id=3".to_string()));
        assert!(full.contains(&"--rpl-semi-sync-slave-enabled=ON".to_string()));
        assert!(!full.iter().any(|a| a.starts_with("--rpl-semi-sync-master")));
    }
}
