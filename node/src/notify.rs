//! systemd readiness notification (`Type=notify`): `READY=1` once every port serves,
//! `STOPPING=1` when the shutdown begins, each with a `STATUS=` line for `systemctl status`.
//! Without `NOTIFY_SOCKET` (not started by systemd) every call does nothing.

/// The node serves on every port.
pub fn ready(node_id: u64) {
    let status = format!("node {node_id} serving");
    send(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&status),
    ]);
}

/// The node begins to drain and stop.
pub fn stopping() {
    send(&[
        sd_notify::NotifyState::Stopping,
        sd_notify::NotifyState::Status("draining: stopping Raft, syncing the log, checkpointing"),
    ]);
}

fn send(states: &[sd_notify::NotifyState<'_>]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::warn!(error = %e, "cannot notify systemd");
    }
}
