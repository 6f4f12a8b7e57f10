//! Crashing and restarting one server process of a running cluster from outside it: the
//! failover workload kills an ftkv node (a child of the playground) or an etcd member (a child
//! of [`crate::etcd::EtcdCluster`]) with SIGKILL and later starts it again, with the command
//! line, working directory and environment it had (read from `/proc/<pid>` before the kill), so
//! it comes back on the same data dir and ports. The restarted process is this process's child
//! ([`Restarted`]), killed when dropped and when this process dies.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

const SIGKILL: i32 = 9;

/// How a process was started: enough to start it again.
#[derive(Debug, Clone)]
pub struct ProcSpec {
    /// The executable.
    pub exe: PathBuf,
    /// Arguments after `argv[0]`.
    pub args: Vec<OsString>,
    /// Working directory.
    pub cwd: PathBuf,
    /// Environment.
    pub env: Vec<(OsString, OsString)>,
}

fn nul_separated(bytes: Vec<u8>) -> Vec<OsString> {
    bytes
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| OsString::from_vec(s.to_vec()))
        .collect()
}

impl ProcSpec {
    /// Reads `/proc/<pid>`'s `cmdline`, `cwd` and `environ`.
    pub fn of(pid: u32) -> anyhow::Result<Self> {
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        let argv =
            nul_separated(std::fs::read(proc_dir.join("cmdline")).with_context(|| format!("process {pid}"))?);
        let argv0 = argv.first().context("empty command line")?;
        let exe = PathBuf::from(argv0);
        let env = nul_separated(std::fs::read(proc_dir.join("environ"))?)
            .into_iter()
            .filter_map(|kv| {
                let bytes = kv.into_vec();
                let eq = bytes.iter().position(|&b| b == b'=')?;
                Some((
                    OsString::from_vec(bytes[..eq].to_vec()),
                    OsString::from_vec(bytes[eq + 1..].to_vec()),
                ))
            })
            .collect();
        Ok(Self {
            exe,
            args: argv[1..].to_vec(),
            cwd: std::fs::read_link(proc_dir.join("cwd"))?,
            env,
        })
    }

    /// Whether one argument is exactly `arg`.
    pub fn has_arg(&self, arg: &str) -> bool {
        self.args.iter().any(|a| a == arg)
    }
}

/// The process of `pids` whose command line has the argument `arg` exactly.
pub fn find_with_arg(pids: &[u32], arg: &str) -> Option<u32> {
    pids.iter()
        .copied()
        .find(|&p| ProcSpec::of(p).is_ok_and(|s| s.has_arg(arg)))
}

/// Whether `pid` is gone or a zombie (dead, not yet reaped: its sockets are closed).
pub fn is_dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

/// SIGKILLs `pid` and waits (up to 10 s) until it is dead.
pub async fn kill9(pid: u32) -> anyhow::Result<()> {
    ftkv_tests::fixture::send_signal(pid, SIGKILL).with_context(|| format!("kill -9 {pid}"))?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !is_dead(pid) {
        anyhow::ensure!(
            Instant::now() < deadline,
            "process {pid} still alive 10 s after SIGKILL"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// A process this bench started again. Dropping it kills it.
pub struct Restarted {
    child: Child,
}

impl Restarted {
    /// Starts `spec` with its output appended to `log`.
    pub fn start(spec: &ProcSpec, log: &Path) -> anyhow::Result<Self> {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
        let mut cmd = Command::new(&spec.exe);
        cmd.args(&spec.args)
            .current_dir(&spec.cwd)
            .env_clear()
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        let child = ftkv_tests::fixture::spawn_tied(cmd)
            .with_context(|| format!("cannot start {}", spec.exe.display()))?;
        Ok(Self { child })
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Restarted {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_killed_process_restarts_with_its_command_line() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = Command::new("sleep")
            .arg("30")
            .current_dir(dir.path())
            .env("FTKV_PROCS_TEST", "1")
            .spawn()
            .unwrap();
        let spec = sleep_spec(first.id());
        assert_eq!(spec.cwd, dir.path().canonicalize().unwrap());
        assert!(spec.env.iter().any(|(k, v)| k == "FTKV_PROCS_TEST" && v == "1"));
        assert_eq!(
            find_with_arg(&[std::process::id(), first.id()], "30"),
            Some(first.id())
        );
        kill9(first.id()).await.unwrap();
        assert!(is_dead(first.id()));
        let _ = first.wait();
        let mut again = Restarted::start(&spec, &dir.path().join("log")).unwrap();
        assert!(again.is_running());
        assert!(sleep_spec(again.pid()).has_arg("30"));
    }

    /// The spec of a `sleep 30` child. spawn returns once the child has begun its exec, which
    /// may be before the kernel has set up the new command line (reading it then gives
    /// nothing): wait for it.
    fn sleep_spec(pid: u32) -> ProcSpec {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match ProcSpec::of(pid) {
                Ok(spec) if spec.has_arg("30") => return spec,
                other => assert!(std::time::Instant::now() < deadline, "{other:?}"),
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}
