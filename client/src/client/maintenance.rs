//! `ftkv.v1.Maintenance` calls of one node (no redirect, no retry): backups.

use ftkv_proto::v1 as pb;

use super::{normalize_endpoint, Client};
use crate::error::{classify_status, Result};

impl Client {
    /// Starts streaming a backup of exactly this endpoint's state machine
    /// (`Maintenance.Snapshot`): the concatenated `blob`s of the messages are the backup file
    /// (format: `node/src/backup/format.rs`). One attempt; a failure is the node's or the
    /// connection's error as it came.
    pub async fn snapshot_stream(&self, endpoint: &str) -> Result<tonic::Streaming<pb::SnapshotResponse>> {
        let endpoint = normalize_endpoint(endpoint)?;
        let channel = self.inner.channel(&endpoint)?;
        self.inner.ensure_token().await?;
        let mut client = pb::maintenance_client::MaintenanceClient::with_interceptor(
            channel,
            self.inner.tokens.interceptor(),
        )
        .max_decoding_message_size(self.inner.config.max_message_bytes);
        client
            .snapshot(pb::SnapshotRequest {})
            .await
            .map(|r| r.into_inner())
            .map_err(|s| classify_status(&s).error)
    }
}
