//! Installing a received snapshot: the engine's contents are replaced by the file's (checked
//! record by record), then the file becomes current. A full disk is not a storage fault here
//! either: openraft stops its Raft core on any error an install returns, so an install that
//! meets `ENOSPC` / `EDQUOT` is retried every [`SNAPSHOT_RETRY_MS`] until space is freed (the
//! engine keeps its old tree, or holds the new one in memory, and serves reads meanwhile; the
//! full disk is reported to the NOSPACE alarm like a build's).

use super::*;

impl StateMachine {
    /// Installs `received` (already synced), waiting out a full disk; returns only once the
    /// install succeeded or met a storage fault.
    pub(super) async fn install_waiting_for_space(
        &mut self,
        meta: &SnapshotMeta,
        received: PathBuf,
    ) -> Result<(), StorageError> {
        let mut failures = 0u64;
        loop {
            let (meta, received) = (meta.clone(), received.clone());
            let installed = self
                .blocking(move |shared| Ok(install_snapshot_blocking(shared, meta, received)))
                .await?;
            match installed {
                Ok(()) => {
                    if self.shared.space_error.lock().take().is_some() {
                        tracing::warn!(failures, "snapshot installed after the disk had room again");
                    }
                    return Ok(());
                }
                Err(BuildError::NoSpace(error)) => {
                    if failures == 0 {
                        tracing::error!(
                            %error,
                            retry_ms = SNAPSHOT_RETRY_MS,
                            "cannot install the received snapshot: the disk is full; the install is retried until space is freed"
                        );
                    }
                    failures += 1;
                    *self.shared.space_error.lock() = Some(error);
                    tokio::time::sleep(std::time::Duration::from_millis(SNAPSHOT_RETRY_MS)).await;
                }
                Err(BuildError::Storage(e)) => return Err(e),
            }
        }
    }
}

/// One attempt. A full disk ([`BuildError::NoSpace`]) changes nothing durable: the engine's
/// `replace_all` either kept the old tree or switched in memory without a checkpoint, and a
/// retry replaces it again from the same file.
fn install_snapshot_blocking(
    shared: &Shared,
    meta: SnapshotMeta,
    received: PathBuf,
) -> Result<(), BuildError> {
    let mut state = shared.state.lock();
    crash_point::hit("install-snapshot:before-engine");
    let (mut reader, _header, sm_meta) = shared.snapshots.reader(&received).map_err(snapshot_error)?;
    let mut persisted = decode_meta(&sm_meta).map_err(snapshot_error)?;
    persisted.last_applied = meta.last_log_id;
    persisted.last_membership = meta.last_membership.clone();
    let encoded = encode_meta(&persisted).map_err(snapshot_error)?;
    // Every session record is checked on its way in: a damaged one fails the install with the
    // old state kept, instead of leaving an engine the node could not reopen.
    {
        let location = format!("received snapshot {}", meta.snapshot_id);
        let mut checked = (&mut reader).map(|pair| {
            let (key, value) = pair?;
            check_record(&key, &value).map_err(|e| EngineError::Corruption {
                location: location.clone(),
                detail: e.to_string(),
            })?;
            Ok((key, value))
        });
        shared.engine.replace_all(&mut checked, &encoded).map_err(|e| {
            if e.is_no_space() {
                BuildError::NoSpace(e.to_string())
            } else {
                BuildError::Storage(snapshot_error(e))
            }
        })?;
    }
    crash_point::hit("install-snapshot:engine-replaced");
    shared.mark_durable(&persisted);
    // The received session keys are the table now.
    let sessions = SessionTable::load(shared.engine.as_ref(), persisted.next_session_sweep_index)
        .map_err(snapshot_error)?;
    shared.snapshots.make_current(&received).map_err(build_error)?;
    crash_point::hit("install-snapshot:file-current");
    shared
        .applied_index
        .store(persisted.last_applied.map_or(0, |l| l.index), Ordering::Release);
    let bulk = StagedLoads::load(shared.engine.as_ref()).map_err(snapshot_error)?;
    let auth = super::auth_store::load(shared.engine.as_ref()).map_err(snapshot_error)?;
    *shared.auth.write() = std::sync::Arc::new(auth.clone());
    *state = SmState {
        meta: persisted,
        sessions,
        bulk,
        auth,
        auth_dirty: false,
    };
    *shared.current.lock() = Some(meta);
    Ok(())
}
