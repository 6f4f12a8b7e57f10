//! CPU seconds of the processes of a target, from `/proc/<pid>/stat` (`utime` + `stime`, and
//! `cutime` + `cstime` for children this process has waited for), so a run can report CPU
//! seconds per acknowledged write summed over every process that served it.
//!
//! Linux reports these in clock ticks of `USER_HZ`, which is 100 on every Linux ABI in use
//! (`sysconf(_SC_CLK_TCK)`); the bench assumes it, as `engine::child` does.

use std::collections::BTreeMap;

/// Clock ticks per second of `/proc/<pid>/stat` times (`USER_HZ`).
const TICKS_PER_SECOND: f64 = 100.0;

/// The fields of `/proc/<pid>/stat` after the parenthesised command name (which may itself hold
/// spaces or parentheses), starting at field 3 (`state`).
fn stat_fields(pid: &str) -> Option<Vec<String>> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = s.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// Field `n` (1-based, as `proc(5)` numbers them) of a [`stat_fields`] list.
fn field(fields: &[String], n: usize) -> Option<u64> {
    fields.get(n.checked_sub(3)?)?.parse().ok()
}

/// User plus system CPU seconds of process `pid` (all its threads); `None` when it is gone.
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let f = stat_fields(&pid.to_string())?;
    Some((field(&f, 14)? + field(&f, 15)?) as f64 / TICKS_PER_SECOND)
}

/// User plus system CPU seconds of this process (every thread: the in-process load generator).
pub fn self_cpu_seconds() -> f64 {
    stat_fields("self")
        .and_then(|f| Some((field(&f, 14)? + field(&f, 15)?) as f64 / TICKS_PER_SECOND))
        .unwrap_or(0.0)
}

/// User plus system CPU seconds of this process's children that have exited and been waited
/// for (`cutime` + `cstime`): the CPU of a load generator run as a child (sysbench), read
/// before it starts and after it is reaped.
pub fn waited_children_cpu_seconds() -> f64 {
    stat_fields("self")
        .and_then(|f| Some((field(&f, 16)? + field(&f, 17)?) as f64 / TICKS_PER_SECOND))
        .unwrap_or(0.0)
}

/// `pid` and every live descendant of it (children, their children, ...), from the parent pid
/// (field 4) of every `/proc/<pid>/stat`.
pub fn process_tree(pid: u32) -> Vec<u32> {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if let Some(parent) = stat_fields(&p.to_string()).and_then(|f| field(&f, 4)) {
                if let Ok(parent) = u32::try_from(parent) {
                    children.entry(parent).or_default().push(p);
                }
            }
        }
    }
    let mut tree = vec![pid];
    let mut i = 0;
    while let Some(&p) = tree.get(i) {
        if let Some(c) = children.get(&p) {
            tree.extend(c.iter().copied());
        }
        i += 1;
    }
    tree
}

/// CPU seconds of a fixed set of processes, read at the start of a measured window.
#[derive(Debug, Clone)]
pub struct CpuMeter {
    start: Vec<(u32, f64)>,
}

impl CpuMeter {
    /// Reads the CPU seconds of `pids` now.
    pub fn start(pids: &[u32]) -> Self {
        Self {
            start: pids
                .iter()
                .map(|&p| (p, process_cpu_seconds(p).unwrap_or(0.0)))
                .collect(),
        }
    }

    /// CPU seconds the processes used since [`CpuMeter::start`] (a process that has gone since
    /// counts up to its last reading, i.e. nothing).
    pub fn elapsed_seconds(&self) -> f64 {
        self.start
            .iter()
            .map(|&(p, s)| process_cpu_seconds(p).map_or(0.0, |now| (now - s).max(0.0)))
            .sum()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn own_cpu_grows_with_work_and_the_tree_holds_a_child() {
        let before = self_cpu_seconds();
        let meter = CpuMeter::start(&[std::process::id()]);
        // Busy until this process has used 0.05 s more CPU (the machine is shared: wall time
        // says little), within 30 s.
        let t = std::time::Instant::now();
        let mut x = 0u64;
        while self_cpu_seconds() - before < 0.05 {
            for _ in 0..100_000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
            assert!(
                t.elapsed() < std::time::Duration::from_secs(30),
                "CPU did not grow"
            );
        }
        assert_ne!(x, 1);
        assert!(meter.elapsed_seconds() >= 0.05);

        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let tree = process_tree(std::process::id());
        let _ = child.kill();
        let _ = child.wait();
        assert!(tree.contains(&child.id()), "{tree:?} lacks {}", child.id());
        assert_eq!(tree.first(), Some(&std::process::id()));
    }

    #[test]
    fn waited_children_cpu_counts_a_reaped_child() {
        let before = waited_children_cpu_seconds();
        // A child that burns about 0.3 s of CPU, then exits and is waited for.
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg("i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done")
            .status()
            .unwrap();
        assert!(status.success());
        assert!(waited_children_cpu_seconds() - before > 0.0);
    }
}
