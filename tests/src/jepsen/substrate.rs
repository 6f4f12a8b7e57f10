//! What [`crate::jepsen::db::Db`] needs of a substrate: start, stop, pause and cut off nodes.
//! `local` ([`Cluster`], loopback processes), `netns` ([`NetnsCluster`]) and `docker`
//! ([`DockerCluster`]) each implement [`Substrate`] once, so the `Db` holds one
//! `Box<dyn Substrate>` instead of matching on the kind at every call.

use std::path::PathBuf;

use crate::fixture::Cluster;
use crate::jepsen::db::{DbError, SubstrateKind};
use crate::jepsen::docker::DockerCluster;
use crate::jepsen::netns::NetnsCluster;

/// One substrate's nodes. Errors are the substrate's own, as [`DbError::Substrate`] text.
pub(crate) trait Substrate: Send + Sync {
    /// Which substrate this is.
    fn kind(&self) -> SubstrateKind;
    /// Every node it started, members or not.
    fn ids(&self) -> Vec<u64>;
    /// Client endpoint of node `id`.
    fn endpoint(&self, id: u64) -> Result<String, DbError>;
    /// Data folder of node `id`.
    fn data_dir(&self, id: u64) -> Result<PathBuf, DbError>;
    /// Log file of node `id`.
    fn log_path(&self, id: u64) -> Result<PathBuf, DbError>;
    /// SIGKILL node `id` (a paused node too).
    fn kill(&self, id: u64) -> Result<(), DbError>;
    /// Starts stopped node `id` on its data.
    fn restart(&self, id: u64) -> Result<(), DbError>;
    /// Whether node `id` runs.
    fn is_running(&self, id: u64) -> bool;
    /// SIGSTOP (or `docker pause`) node `id`.
    fn pause(&self, id: u64) -> Result<(), DbError>;
    /// Undoes [`Substrate::pause`].
    fn resume(&self, id: u64) -> Result<(), DbError>;
    /// Cuts the network between `groups`.
    fn partition(&self, groups: &[Vec<u64>]) -> Result<(), DbError>;
    /// Removes every partition rule.
    fn heal(&self) -> Result<(), DbError>;
    /// Empties stopped node `id`'s data.
    fn wipe(&self, id: u64) -> Result<(), DbError>;
    /// Starts a new node `id` with `--initial-cluster-state existing`; its (client, peer)
    /// endpoints.
    fn add_node(&self, id: u64) -> Result<(String, String), DbError>;
    /// Stops everything and removes what the substrate created.
    fn teardown(&self);
}

fn sub<E: std::fmt::Display>(e: E) -> DbError {
    DbError::Substrate(e.to_string())
}

impl Substrate for Cluster {
    fn kind(&self) -> SubstrateKind {
        SubstrateKind::Local
    }
    fn ids(&self) -> Vec<u64> {
        Cluster::ids(self)
    }
    fn endpoint(&self, id: u64) -> Result<String, DbError> {
        Cluster::endpoint(self, id).map_err(sub)
    }
    fn data_dir(&self, id: u64) -> Result<PathBuf, DbError> {
        Cluster::data_dir(self, id).map_err(sub)
    }
    fn log_path(&self, id: u64) -> Result<PathBuf, DbError> {
        self.node(id).map(|n| n.log_path).map_err(sub)
    }
    fn kill(&self, id: u64) -> Result<(), DbError> {
        if self.is_paused(id) {
            let _ = Cluster::resume(self, id);
        }
        Cluster::kill(self, id).map_err(sub)
    }
    fn restart(&self, id: u64) -> Result<(), DbError> {
        Cluster::restart(self, id).map_err(sub)
    }
    fn is_running(&self, id: u64) -> bool {
        Cluster::is_running(self, id)
    }
    fn pause(&self, id: u64) -> Result<(), DbError> {
        Cluster::pause(self, id).map_err(sub)
    }
    fn resume(&self, id: u64) -> Result<(), DbError> {
        Cluster::resume(self, id).map_err(sub)
    }
    fn partition(&self, _groups: &[Vec<u64>]) -> Result<(), DbError> {
        Err(DbError::Unsupported(
            "partitions need the netns or docker substrate".into(),
        ))
    }
    fn heal(&self) -> Result<(), DbError> {
        Ok(())
    }
    fn wipe(&self, id: u64) -> Result<(), DbError> {
        Cluster::wipe(self, id).map_err(sub)
    }
    fn add_node(&self, id: u64) -> Result<(String, String), DbError> {
        let info = Cluster::add_node(self, id).map_err(sub)?;
        Ok((info.client_addr, info.peer_addr))
    }
    fn teardown(&self) {
        for id in Cluster::ids(self) {
            if self.is_paused(id) {
                let _ = Cluster::resume(self, id);
            }
            if Cluster::is_running(self, id) {
                let _ = Cluster::kill(self, id);
            }
        }
    }
}

/// The substrates with namespaces of their own (netns, docker) have the same shape of methods;
/// each forwards to its inherent one.
macro_rules! isolated_substrate {
    ($ty:ty, $kind:expr) => {
        impl Substrate for $ty {
            fn kind(&self) -> SubstrateKind {
                $kind
            }
            fn ids(&self) -> Vec<u64> {
                <$ty>::ids(self)
            }
            fn endpoint(&self, id: u64) -> Result<String, DbError> {
                <$ty>::endpoint(self, id).map_err(sub)
            }
            fn data_dir(&self, id: u64) -> Result<PathBuf, DbError> {
                <$ty>::data_dir(self, id).map_err(sub)
            }
            fn log_path(&self, id: u64) -> Result<PathBuf, DbError> {
                <$ty>::log_path(self, id).map_err(sub)
            }
            fn kill(&self, id: u64) -> Result<(), DbError> {
                <$ty>::kill(self, id).map_err(sub)
            }
            fn restart(&self, id: u64) -> Result<(), DbError> {
                <$ty>::restart(self, id).map_err(sub)
            }
            fn is_running(&self, id: u64) -> bool {
                <$ty>::is_running(self, id)
            }
            fn pause(&self, id: u64) -> Result<(), DbError> {
                <$ty>::pause(self, id).map_err(sub)
            }
            fn resume(&self, id: u64) -> Result<(), DbError> {
                <$ty>::resume(self, id).map_err(sub)
            }
            fn partition(&self, groups: &[Vec<u64>]) -> Result<(), DbError> {
                <$ty>::partition(self, groups).map_err(sub)
            }
            fn heal(&self) -> Result<(), DbError> {
                <$ty>::heal(self).map_err(sub)
            }
            fn wipe(&self, id: u64) -> Result<(), DbError> {
                <$ty>::wipe(self, id).map_err(sub)
            }
            fn add_node(&self, id: u64) -> Result<(String, String), DbError> {
                <$ty>::add_node(self, id).map_err(sub)?;
                Ok((
                    <$ty>::endpoint(self, id).map_err(sub)?,
                    <$ty>::peer_endpoint(self, id).map_err(sub)?,
                ))
            }
            fn teardown(&self) {
                <$ty>::teardown(self)
            }
        }
    };
}

isolated_substrate!(NetnsCluster, SubstrateKind::Netns);
isolated_substrate!(DockerCluster, SubstrateKind::Docker);
