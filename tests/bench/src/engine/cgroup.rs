//! A memory cgroup for one child process, so "data larger than memory" means the same budget
//! for every engine, page cache included (BENCH.md).
//!
//! cgroup v1 (`/sys/fs/cgroup/memory/<name>/memory.limit_in_bytes`, pid into `tasks`) when the
//! memory controller is mounted there, else cgroup v2 (`/sys/fs/cgroup/<name>/memory.max`, pid
//! into `cgroup.procs`). The group is removed on drop.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

/// A memory cgroup created by the bench.
pub struct MemoryCgroup {
    dir: PathBuf,
    v1: bool,
}

impl MemoryCgroup {
    /// Creates group `name` with a hard limit of `limit_bytes` (memory plus page cache).
    /// Errors: no memory controller, or no permission (run as root).
    pub fn create(name: &str, limit_bytes: u64) -> anyhow::Result<Self> {
        let v1_root = Path::new("/sys/fs/cgroup/memory");
        let (dir, v1) = if v1_root.join("memory.limit_in_bytes").exists() {
            (v1_root.join(name), true)
        } else if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            (Path::new("/sys/fs/cgroup").join(name), false)
        } else {
            anyhow::bail!("no memory cgroup controller found under /sys/fs/cgroup");
        };
        std::fs::create_dir(&dir).with_context(|| format!("create cgroup {}", dir.display()))?;
        let group = MemoryCgroup { dir, v1 };
        let file = if v1 { "memory.limit_in_bytes" } else { "memory.max" };
        std::fs::write(group.dir.join(file), limit_bytes.to_string())
            .with_context(|| format!("set {file} of {}", group.dir.display()))?;
        if v1 {
            // No swap here, but make sure the group cannot escape into it either.
            let _ = std::fs::write(
                group.dir.join("memory.memsw.limit_in_bytes"),
                limit_bytes.to_string(),
            );
        }
        Ok(group)
    }

    /// Moves process `pid` into the group.
    pub fn add(&self, pid: u32) -> anyhow::Result<()> {
        let file = if self.v1 { "tasks" } else { "cgroup.procs" };
        std::fs::write(self.dir.join(file), pid.to_string())
            .with_context(|| format!("add pid {pid} to {}", self.dir.display()))
    }

    /// Moves every thread of the running process `pid` into the group (`cgroup.procs`), with
    /// the memory it has charged already (v1 `memory.move_charge_at_immigrate`).
    pub fn add_process(&self, pid: u32) -> anyhow::Result<()> {
        if self.v1 {
            let _ = std::fs::write(self.dir.join("memory.move_charge_at_immigrate"), "3");
        }
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())
            .with_context(|| format!("add process {pid} to {}", self.dir.display()))
    }

    /// Peak memory charged to the group (v1 `memory.max_usage_in_bytes`, v2 `memory.peak`).
    pub fn peak_bytes(&self) -> Option<u64> {
        let file = if self.v1 {
            "memory.max_usage_in_bytes"
        } else {
            "memory.peak"
        };
        std::fs::read_to_string(self.dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Times the OOM killer acted in this group (v1 `memory.oom_control` `oom_kill`, v2
    /// `memory.events` `oom_kill`), when the kernel reports it.
    pub fn oom_kills(&self) -> Option<u64> {
        let file = if self.v1 {
            "memory.oom_control"
        } else {
            "memory.events"
        };
        let s = std::fs::read_to_string(self.dir.join(file)).ok()?;
        s.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
    }

    /// How often the limit was hit (v1 `memory.failcnt`; v2 `max` in `memory.events`).
    pub fn limit_hits(&self) -> Option<u64> {
        if self.v1 {
            std::fs::read_to_string(self.dir.join("memory.failcnt"))
                .ok()?
                .trim()
                .parse()
                .ok()
        } else {
            let s = std::fs::read_to_string(self.dir.join("memory.events")).ok()?;
            s.lines()
                .find_map(|l| l.strip_prefix("max "))
                .and_then(|v| v.trim().parse().ok())
        }
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        if self.v1 {
            // Move leftover page-cache charges out so the group can go.
            let _ = std::fs::write(self.dir.join("memory.force_empty"), "0");
        }
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("warning: could not remove cgroup {}", self.dir.display());
    }
}
