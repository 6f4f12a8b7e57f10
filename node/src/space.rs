//! The space quota and the NOSPACE alarm (etcd's `--quota-backend-bytes` and `alarm`).
//!
//! Every node watches its own data dir, every `space.check_interval_ms`: the bytes its files
//! hold (allocated blocks of every file under it: engine, log segments, snapshots) against
//! `space.quota_bytes`, and the free space of the file system under it against
//! `space.disk_reserve_bytes`. The log also reports a real `ENOSPC` when it cannot create a
//! segment (`ftkv_log::Log::space_error`). Crossing any of these raises the node's NOSPACE
//! alarm (logged as an error): from then on the node, as leader, refuses every write that is
//! not only deletes *before proposing it* (`RESOURCE_EXHAUSTED`, `ErrorInfo` kind `NO_SPACE`:
//! certainly not applied). Reads are never refused.
//!
//! The alarm is sticky, as etcd's: deleting data does not clear it; `ftkvctl alarm disarm` does
//! ([`SpaceMonitor::disarm`]), and only once the cause is gone (it measures again first). The
//! one exception is the alarm a real `ENOSPC` raised (limit `disk`: the log creating a segment,
//! the engine writing blocks, a snapshot build; the node retries each by itself): it clears by
//! itself at the first check that finds each of them done and no limit crossed, so a node whose
//! disk filled up accepts writes again once space is freed, without a restart or an operator.
//!
//! The alarm is this node's own, not replicated through Raft (etcd replicates its alarms): a
//! follower whose disk fills keeps accepting replicated entries until its log cannot create a
//! segment, then its log waits for space without acknowledging, and the two other nodes carry
//! the cluster on. The reserve exists so that the log (which preallocates its next segment) and
//! the engine (checkpoints write new blocks before they free old ones) never meet a real
//! `ENOSPC` in the common case.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use crate::cluster::{Command, TxnOp};

/// The name of the one alarm (etcd's `NOSPACE`).
pub const NOSPACE: &str = "NOSPACE";

/// The reason in `ErrorInfo.reason` of a refused write.
pub const NO_SPACE_REASON: &str = "NO_SPACE";

/// `Alarm::limit` of an alarm raised by a real `ENOSPC` (cleared by itself, see the module docs).
pub const DISK_LIMIT: &str = "disk";

/// `[space]` settings the monitor needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpaceOptions {
    /// Most bytes the data dir may hold; 0: no quota.
    pub quota_bytes: u64,
    /// Least free bytes the data dir's file system must keep; 0: none.
    pub disk_reserve_bytes: u64,
    /// How often to measure, ms.
    pub check_interval_ms: u64,
}

/// What was measured last.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpaceUsage {
    /// Bytes held by the files under the data dir (allocated blocks).
    pub data_dir_bytes: u64,
    /// Bytes of the data dir's file system available to unprivileged users.
    pub disk_free_bytes: u64,
}

/// A raised NOSPACE alarm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alarm {
    /// Node that raised it.
    pub node_id: u64,
    /// The setting crossed: `space.quota_bytes`, `space.disk_reserve_bytes`, or `disk` (a real
    /// `ENOSPC`).
    pub limit: &'static str,
    /// What happened, naming the data dir and the figures.
    pub message: String,
    /// Details for `ErrorInfo.metadata` (node_id, data_dir, figures).
    pub metadata: BTreeMap<String, String>,
    /// When it was raised, seconds since the Unix epoch.
    pub raised_at_unix_s: u64,
}

impl Alarm {
    /// Until when writes are refused, for messages.
    pub fn until(&self) -> &'static str {
        if self.limit == DISK_LIMIT {
            "until the disk has room again (cleared by itself) or `ftkvctl alarm disarm`"
        } else {
            "until `ftkvctl alarm disarm`"
        }
    }
}

#[derive(Debug, Default)]
struct State {
    usage: SpaceUsage,
    alarm: Option<Alarm>,
}

/// One node's space monitor (see the module docs). Shared; cheap to query.
#[derive(Debug)]
pub struct SpaceMonitor {
    node_id: u64,
    data_dir: PathBuf,
    options: SpaceOptions,
    state: Mutex<State>,
}

fn human(bytes: u64) -> String {
    bytesize::ByteSize::b(bytes).to_string_as(true)
}

/// Bytes held by every file under `dir` (allocated blocks: a preallocated segment counts whole,
/// a sparse file only for what it uses). Files that vanish meanwhile are skipped.
pub fn dir_bytes(dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && d != dir => continue,
            Err(e) => return Err(e),
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total = total.saturating_add(meta.blocks().saturating_mul(512));
            }
        }
    }
    Ok(total)
}

/// Bytes available to unprivileged users on the file system holding `dir` (statvfs).
pub fn disk_free_bytes(dir: &Path) -> std::io::Result<u64> {
    let fs = rustix::fs::statvfs(dir).map_err(std::io::Error::from)?;
    Ok(fs.f_bavail.saturating_mul(fs.f_frsize))
}

/// Whether `command` only removes data (deletes, range deletes, gets): allowed while alarmed,
/// so that an operator can make room (etcd allows deletes and compaction under NOSPACE).
pub fn only_frees_space(command: &Command) -> bool {
    let deletes = |op: &ftkv_engine::WriteOp| {
        matches!(
            op,
            ftkv_engine::WriteOp::Delete { .. } | ftkv_engine::WriteOp::DeleteRange { .. }
        )
    };
    let txn_op = |op: &TxnOp| match op {
        TxnOp::Write(w) => deletes(w),
        TxnOp::Get { .. } => true,
    };
    match command {
        Command::Write { ops, .. } | Command::LimitedWrite { ops, .. } => ops.iter().all(deletes),
        Command::Txn { success, failure, .. } | Command::LimitedTxn { success, failure, .. } => {
            success.iter().chain(failure).all(txn_op)
        }
        // Cancelling a load deletes its staged chunks.
        Command::BulkAbort { .. } => true,
        Command::BulkStage { .. } | Command::BulkCommit { .. } => false,
        // Users and roles are a few bytes: an operator can still manage them.
        Command::Auth(_) => true,
    }
}

impl SpaceMonitor {
    /// A monitor of `data_dir` for node `node_id`, with no alarm raised.
    pub fn new(node_id: u64, data_dir: &Path, options: SpaceOptions) -> SpaceMonitor {
        SpaceMonitor {
            node_id,
            data_dir: data_dir.to_path_buf(),
            options,
            state: Mutex::new(State::default()),
        }
    }

    /// The settings.
    pub fn options(&self) -> SpaceOptions {
        self.options
    }

    /// What the last check measured.
    pub fn usage(&self) -> SpaceUsage {
        self.state.lock().usage
    }

    /// The raised alarm, if any.
    pub fn alarm(&self) -> Option<Alarm> {
        self.state.lock().alarm.clone()
    }

    fn measure(&self) -> std::io::Result<SpaceUsage> {
        Ok(SpaceUsage {
            data_dir_bytes: dir_bytes(&self.data_dir)?,
            disk_free_bytes: disk_free_bytes(&self.data_dir)?,
        })
    }

    /// The alarm `usage` (and the log's `ENOSPC`, if any) calls for, if any.
    fn cause(&self, usage: SpaceUsage, log_space_error: Option<&str>) -> Option<Alarm> {
        let mut metadata = BTreeMap::from([
            ("node_id".to_string(), self.node_id.to_string()),
            ("data_dir".to_string(), self.data_dir.display().to_string()),
            ("data_dir_bytes".to_string(), usage.data_dir_bytes.to_string()),
            ("disk_free_bytes".to_string(), usage.disk_free_bytes.to_string()),
        ]);
        let dir = self.data_dir.display();
        let q = self.options.quota_bytes;
        let r = self.options.disk_reserve_bytes;
        let (limit, message) = if let Some(err) = log_space_error {
            metadata.insert("error".into(), err.to_string());
            (DISK_LIMIT, format!("the disk of data dir {dir} is full: {err}"))
        } else if q > 0 && usage.data_dir_bytes >= q {
            metadata.insert("quota_bytes".into(), q.to_string());
            (
                "space.quota_bytes",
                format!(
                    "data dir {dir} holds {} ({} bytes), at or over its quota space.quota_bytes = {} ({q} bytes)",
                    human(usage.data_dir_bytes),
                    usage.data_dir_bytes,
                    human(q)
                ),
            )
        } else if r > 0 && usage.disk_free_bytes < r {
            metadata.insert("disk_reserve_bytes".into(), r.to_string());
            (
                "space.disk_reserve_bytes",
                format!(
                    "the disk of data dir {dir} has {} free ({} bytes), under space.disk_reserve_bytes = {} ({r} bytes)",
                    human(usage.disk_free_bytes),
                    usage.disk_free_bytes,
                    human(r)
                ),
            )
        } else {
            return None;
        };
        metadata.insert("limit".into(), limit.to_string());
        Some(Alarm {
            node_id: self.node_id,
            limit,
            message: format!("NOSPACE alarm on node {}: {message}", self.node_id),
            metadata,
            raised_at_unix_s: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        })
    }

    /// Measures once; raises the alarm (logged as an error) when a limit is crossed or the log,
    /// the engine or a snapshot build reports `ENOSPC` (`log_space_error`); clears an alarm
    /// raised by `ENOSPC` once that error is gone and no limit is crossed. Returns the alarm
    /// now raised, if any. A measurement that fails is logged and changes nothing.
    pub fn check(&self, log_space_error: Option<&str>) -> Option<Alarm> {
        let usage = match self.measure() {
            Ok(u) => u,
            Err(e) => {
                tracing::warn!(data_dir = %self.data_dir.display(), error = %e, "space check failed");
                return self.alarm();
            }
        };
        let cause = self.cause(usage, log_space_error);
        let mut st = self.state.lock();
        st.usage = usage;
        let disk_alarm = st.alarm.as_ref().is_some_and(|a| a.limit == DISK_LIMIT);
        if disk_alarm && cause.is_none() {
            tracing::warn!(
                alarm = NOSPACE,
                node_id = self.node_id,
                data_dir = %self.data_dir.display(),
                "the disk has room again and every write that met ENOSPC went through: alarm cleared; writes are accepted again"
            );
            st.alarm = None;
            return None;
        }
        if st.alarm.is_none() {
            if let Some(alarm) = cause {
                tracing::error!(
                    alarm = NOSPACE,
                    limit = alarm.limit,
                    "{}; writes other than deletes are refused {}",
                    alarm.message,
                    alarm.until()
                );
                st.alarm = Some(alarm);
            }
        }
        st.alarm.clone()
    }

    /// Clears the alarm once its cause is gone: measures again first, and keeps the alarm
    /// (returning why) while the data dir is still over its quota, the disk under its reserve,
    /// or the log still waiting for space.
    pub fn disarm(&self, log_space_error: Option<&str>) -> Result<(), Alarm> {
        let usage = self.measure().map_err(|e| Alarm {
            node_id: self.node_id,
            limit: "disk",
            message: format!(
                "cannot measure data dir {}: {e}; the alarm stays",
                self.data_dir.display()
            ),
            metadata: BTreeMap::from([("node_id".to_string(), self.node_id.to_string())]),
            raised_at_unix_s: 0,
        })?;
        let cause = self.cause(usage, log_space_error);
        let mut st = self.state.lock();
        st.usage = usage;
        if let Some(alarm) = cause {
            if st.alarm.is_none() {
                st.alarm = Some(alarm.clone());
            }
            return Err(alarm);
        }
        if st.alarm.take().is_some() {
            tracing::warn!(
                alarm = NOSPACE,
                node_id = self.node_id,
                "alarm disarmed; writes are accepted again"
            );
        }
        Ok(())
    }
}

/// Sets the space gauges of `/metrics`: `ftkv_server_alarm{alarm="nospace"}` (1 while raised),
/// `ftkv_space_data_dir_bytes`, `ftkv_space_disk_free_bytes`, `ftkv_space_quota_bytes`.
pub fn record_metrics(cluster: &crate::cluster::ClusterNode) {
    let (options, usage) = cluster.space_usage();
    let raised = if cluster.alarm().is_some() { 1.0 } else { 0.0 };
    metrics::gauge!("ftkv_server_alarm", "alarm" => "nospace").set(raised);
    metrics::gauge!("ftkv_space_data_dir_bytes").set(usage.data_dir_bytes as f64);
    metrics::gauge!("ftkv_space_disk_free_bytes").set(usage.disk_free_bytes as f64);
    metrics::gauge!("ftkv_space_quota_bytes").set(options.quota_bytes as f64);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, bytes: usize) {
        std::fs::write(dir.join(name), vec![7u8; bytes]).unwrap();
    }

    #[test]
    fn the_quota_alarm_is_sticky_until_disarmed_below_the_quota() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("log")).unwrap();
        let m = SpaceMonitor::new(
            2,
            dir.path(),
            SpaceOptions {
                quota_bytes: 1 << 20,
                disk_reserve_bytes: 0,
                check_interval_ms: 1000,
            },
        );
        assert_eq!(m.check(None), None);
        write(&dir.path().join("log"), "a", 2 << 20);
        let alarm = m.check(None).unwrap();
        assert_eq!(alarm.limit, "space.quota_bytes");
        assert_eq!(alarm.node_id, 2);
        assert!(alarm.message.contains("space.quota_bytes"), "{}", alarm.message);
        assert_eq!(alarm.metadata["quota_bytes"], (1u64 << 20).to_string());
        assert!(m.usage().data_dir_bytes >= 2 << 20);
        // Still over: disarm refuses and the alarm stays.
        assert!(m.disarm(None).is_err());
        assert!(m.alarm().is_some());
        // Deleting data alone does not clear it; disarm then does.
        std::fs::remove_file(dir.path().join("log/a")).unwrap();
        assert!(m.check(None).is_some());
        m.disarm(None).unwrap();
        assert_eq!(m.alarm(), None);
        // The log's ENOSPC raises it too, and keeps it while it lasts.
        let alarm = m.check(Some("No space left on device")).unwrap();
        assert_eq!(alarm.limit, "disk");
        assert!(m.disarm(Some("No space left on device")).is_err());
        m.disarm(None).unwrap();
    }

    #[test]
    fn an_alarm_raised_by_enospc_clears_itself_once_the_error_is_gone_and_a_quota_alarm_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let m = SpaceMonitor::new(
            3,
            dir.path(),
            SpaceOptions {
                quota_bytes: 1 << 20,
                disk_reserve_bytes: 0,
                check_interval_ms: 1000,
            },
        );
        let full = "engine out of disk space during write node 7 @ 4096 of /data/engine/tree.ftkv";
        let alarm = m.check(Some(full)).unwrap();
        assert_eq!(alarm.limit, DISK_LIMIT);
        assert!(alarm.message.contains(full), "{}", alarm.message);
        assert_eq!(alarm.metadata["data_dir"], dir.path().display().to_string());
        // Kept while the error lasts, cleared at the first check without it.
        assert!(m.check(Some(full)).is_some());
        assert_eq!(m.check(None), None);
        assert_eq!(m.alarm(), None);
        // An ENOSPC while over the quota: the error going does not clear it.
        write(dir.path(), "big", 2 << 20);
        assert!(m.check(Some(full)).is_some());
        assert!(m.check(None).is_some(), "still over the quota");
        std::fs::remove_file(dir.path().join("big")).unwrap();
        assert_eq!(m.check(None), None, "disk alarm, error gone, under the quota");
        // A quota alarm stays until disarmed.
        write(dir.path(), "big", 2 << 20);
        assert_eq!(m.check(None).unwrap().limit, "space.quota_bytes");
        std::fs::remove_file(dir.path().join("big")).unwrap();
        assert!(m.check(None).is_some(), "sticky");
    }

    #[test]
    fn the_disk_reserve_raises_the_alarm() {
        let dir = tempfile::tempdir().unwrap();
        let m = SpaceMonitor::new(
            1,
            dir.path(),
            SpaceOptions {
                quota_bytes: 0,
                disk_reserve_bytes: u64::MAX,
                check_interval_ms: 1000,
            },
        );
        let alarm = m.check(None).unwrap();
        assert_eq!(alarm.limit, "space.disk_reserve_bytes");
        assert!(alarm.message.contains(&dir.path().display().to_string()));
    }

    #[test]
    fn deletes_pass_an_alarm_and_other_writes_do_not() {
        use ftkv_engine::WriteOp;
        let del = Command::Write {
            session: None,
            ops: vec![
                WriteOp::Delete { key: b"a".to_vec() },
                WriteOp::DeleteRange {
                    start: b"b".to_vec(),
                    end: None,
                },
            ],
        };
        assert!(only_frees_space(&del));
        let put = Command::Write {
            session: None,
            ops: vec![
                WriteOp::Delete { key: b"a".to_vec() },
                WriteOp::Put {
                    key: b"a".to_vec(),
                    value: b"v".to_vec(),
                },
            ],
        };
        assert!(!only_frees_space(&put));
    }
}
