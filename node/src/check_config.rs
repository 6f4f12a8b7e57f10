//! `ftkv-node check-config`: checks a node's merged configuration without starting it (what a
//! deployment runs on the configuration each node will get, see `deploy/check-artifacts.sh`),
//! and the node id taken from a StatefulSet hostname (`--id-from-hostname`).
//!
//! Beyond [`Config::validate`] (the checks every start runs) it requires every listen and
//! advertise address to be `host:port`, the three listen addresses to differ, and, when this
//! node bootstraps a new cluster, its `initial_cluster` entry to be its advertised peer address
//! (as etcd requires of `--initial-advertise-peer-urls`): peers would dial the wrong place.

use crate::config::{ClusterState, Config, ConfigError};

/// Errors of the configuration check and of deriving an id from a hostname.
#[derive(Debug, thiserror::Error)]
pub enum CheckConfigError {
    /// What every start checks ([`Config::validate`]).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// An address is not `host:port`.
    #[error("{option} {value:?} is not host:port with a port in 1..=65535")]
    Address {
        /// The option.
        option: &'static str,
        /// Its value.
        value: String,
    },
    /// Two listeners on one address.
    #[error("{first} and {second} are both {addr:?}: each port needs its own address")]
    SameAddress {
        /// One option.
        first: &'static str,
        /// The other.
        second: &'static str,
        /// The shared address.
        addr: String,
    },
    /// `initial_cluster` names another peer address for this node than it advertises.
    #[error(
        "initial_cluster gives node {id} the peer address {listed:?} but it advertises {advertised:?} \
         (advertise_peer, or listen_peer when unset): peers would dial the wrong address"
    )]
    PeerMismatch {
        /// This node's id.
        id: u64,
        /// Address in `initial_cluster`.
        listed: String,
        /// Address it advertises.
        advertised: String,
    },
    /// A TEST ONLY switch is on.
    #[error("[testing] {0} is on: it breaks guarantees on purpose and is for the fault harness only")]
    TestingSwitch(&'static str),
    /// The hostname does not end in `-ORDINAL`.
    #[error(
        "cannot derive the node id from the hostname {0:?}: expected NAME-ORDINAL as a StatefulSet \
         pod has (ftkv-0 is node 1)"
    )]
    Hostname(String),
}

/// What a passing check reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckReport {
    /// One line per fact checked.
    pub lines: Vec<String>,
}

fn host_port(option: &'static str, value: &str) -> Result<(), CheckConfigError> {
    let bad = || CheckConfigError::Address {
        option,
        value: value.to_string(),
    };
    let (host, port) = value.rsplit_once(':').ok_or_else(bad)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match port.parse::<u16>() {
        Ok(p) if p > 0 && !host.is_empty() && !host.contains(char::is_whitespace) => Ok(()),
        _ => Err(bad()),
    }
}

/// Checks `config` (see the module doc).
pub fn check(config: &Config) -> Result<CheckReport, CheckConfigError> {
    config.validate()?;
    let mut listeners = vec![
        ("listen_client", &config.listen_client),
        ("listen_peer", &config.listen_peer),
    ];
    if !config.listen_status.is_empty() {
        listeners.push(("listen_status", &config.listen_status));
    }
    for &(option, value) in &listeners {
        host_port(option, value)?;
    }
    for (i, &(first, a)) in listeners.iter().enumerate() {
        if let Some(&(second, _)) = listeners[i + 1..].iter().find(|&&(_, b)| b == a) {
            return Err(CheckConfigError::SameAddress {
                first,
                second,
                addr: a.clone(),
            });
        }
    }
    host_port("advertise_client", &config.client_addr())?;
    host_port("advertise_peer", &config.peer_addr())?;
    let peers = config.initial_peers()?;
    for (id, addr) in &peers {
        host_port("initial_cluster", addr).map_err(|_| CheckConfigError::Address {
            option: "initial_cluster",
            value: format!("{id}={addr}"),
        })?;
    }
    if config.initial_cluster_state == ClusterState::New {
        if let Some(listed) = peers.get(&config.id) {
            if *listed != config.peer_addr() {
                return Err(CheckConfigError::PeerMismatch {
                    id: config.id,
                    listed: listed.clone(),
                    advertised: config.peer_addr(),
                });
            }
        }
    }
    let t = &config.testing;
    for (on, name) in [
        (t.unsafe_local_reads, "unsafe_local_reads"),
        (t.unsafe_ack_before_fsync, "unsafe_ack_before_fsync"),
        (t.lose_unsynced_on_kill, "lose_unsynced_on_kill"),
    ] {
        if on {
            return Err(CheckConfigError::TestingSwitch(name));
        }
    }
    let cluster = match (config.initial_cluster_state, peers.len()) {
        (ClusterState::Existing, _) => "joins an existing cluster".to_string(),
        (ClusterState::New, 0) => {
            "new cluster, no initial_cluster (only a node already initialized can start)".into()
        }
        (ClusterState::New, n) => format!("new cluster of {n} voters"),
    };
    Ok(CheckReport {
        lines: vec![
            format!("node {} in {}", config.id, config.data_dir.display()),
            format!(
                "client {} (advertised {}), peer {} (advertised {}), status {}",
                config.listen_client,
                config.client_addr(),
                config.listen_peer,
                config.peer_addr(),
                if config.listen_status.is_empty() {
                    "off"
                } else {
                    config.listen_status.as_str()
                }
            ),
            cluster,
        ],
    })
}

/// The node id of a StatefulSet pod: its ordinal + 1 (`ftkv-0` is node 1, `ftkv-2` node 3).
/// A fully qualified name counts by its first label.
pub fn id_from_hostname(hostname: &str) -> Result<u64, CheckConfigError> {
    let bad = || CheckConfigError::Hostname(hostname.to_string());
    let label = hostname.split('.').next().unwrap_or_default();
    let (name, ordinal) = label.rsplit_once('-').ok_or_else(bad)?;
    if name.is_empty() || ordinal.is_empty() || !ordinal.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let ordinal: u64 = ordinal.parse().map_err(|_| bad())?;
    ordinal.checked_add(1).ok_or_else(bad)
}

/// This host's name: `$HOSTNAME` when set (Kubernetes sets it to the pod name), else the
/// kernel's node name.
pub fn hostname() -> String {
    match std::env::var("HOSTNAME") {
        Ok(h) if !h.trim().is_empty() => h.trim().to_string(),
        _ => rustix::system::uname().nodename().to_string_lossy().into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_come_from_the_ordinal() {
        assert_eq!(id_from_hostname("ftkv-0").ok(), Some(1));
        assert_eq!(id_from_hostname("ftkv-2").ok(), Some(3));
        assert_eq!(
            id_from_hostname("my-store-11.ftkv-peer.default.svc").ok(),
            Some(12)
        );
        for bad in [
            "ftkv",
            "ftkv-",
            "-1",
            "ftkv-x",
            "ftkv-1a",
            "",
            "ftkv-18446744073709551615",
        ] {
            let err = id_from_hostname(bad).expect_err(bad);
            assert!(err.to_string().contains("NAME-ORDINAL"), "{err}");
        }
    }

    #[test]
    fn the_template_holds_every_option_at_its_default() {
        // deploy/ftkv.toml is the commented template: parsing it gives the defaults exactly, and
        // it spells every option that `--print-config` prints.
        let text = include_str!("../../deploy/ftkv.toml");
        let parsed = Config::from_toml(text).expect("deploy/ftkv.toml parses");
        assert_eq!(parsed.to_toml(), Config::default().to_toml());
        let defaults: toml::Table = toml::from_str(&Config::default().to_toml()).expect("defaults");
        let template: toml::Table = toml::from_str(text).expect("template");
        for (key, value) in &defaults {
            if key == "testing" {
                continue; // TEST ONLY switches stay out of the template
            }
            let Some(t) = template.get(key) else {
                panic!("deploy/ftkv.toml lacks {key}");
            };
            if let (Some(section), Some(t)) = (value.as_table(), t.as_table()) {
                for sub in section.keys() {
                    assert!(t.contains_key(sub), "deploy/ftkv.toml lacks {key}.{sub}");
                }
            }
        }
    }

    #[test]
    fn a_mismatched_peer_address_is_refused() {
        let mut c = Config {
            id: 2,
            initial_cluster: "1=a:7380,2=b:7380,3=c:7380".into(),
            ..Config::default()
        };
        c.advertise_peer = Some("b:7380".into());
        c.listen_status = "127.0.0.1:7391".into();
        assert!(check(&c).is_ok(), "{:?}", check(&c));
        c.advertise_peer = Some("x:7380".into());
        let err = check(&c).expect_err("mismatch");
        assert!(
            err.to_string().contains("peers would dial the wrong address"),
            "{err}"
        );
        c.advertise_peer = Some("b".into());
        assert!(check(&c).expect_err("no port").to_string().contains("host:port"));
        c.advertise_peer = Some("b:7380".into());
        c.listen_status = c.listen_client.clone();
        assert!(check(&c)
            .expect_err("same")
            .to_string()
            .contains("its own address"));
    }
}
