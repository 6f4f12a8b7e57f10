//! Who a peer certificate names, and the binding of a node id to its certificate.
//!
//! With peer TLS on, a Raft message is accepted only when the certificate of the connection it
//! came on names the node the message claims to come from (`RaftMessage.from`): its subject CN
//! or one of its DNS SANs is `ftkv-node-<id>` ([`node_name`]). A member holding a valid
//! certificate therefore cannot speak for another member, and a certificate of another CA
//! never gets past the handshake. `tls.peer_cert_allowed_cn`, when set, further restricts the
//! certificates accepted on the peer port to those carrying one of the listed names (checked
//! right after the handshake, see `accept`).

use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
use tonic::Status;
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// Prefix of the name that binds a node id to a peer certificate.
pub const NODE_NAME_PREFIX: &str = "ftkv-node-";

/// The name a peer certificate of node `id` must carry (CN or DNS SAN): `ftkv-node-<id>`.
pub fn node_name(id: u64) -> String {
    format!("{NODE_NAME_PREFIX}{id}")
}

/// The subject common names and DNS SANs of a certificate.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CertNames {
    /// Subject CNs.
    pub common_names: Vec<String>,
    /// DNS subject alternative names.
    pub dns_names: Vec<String>,
}

impl CertNames {
    /// Parses the names of a DER certificate.
    pub fn of(der: &[u8]) -> Result<CertNames, String> {
        let (_, cert) = X509Certificate::from_der(der).map_err(|e| format!("unparsable certificate: {e}"))?;
        let common_names = cert
            .subject()
            .iter_common_name()
            .filter_map(|cn| cn.as_str().ok().map(str::to_string))
            .collect();
        let mut dns_names = Vec::new();
        if let Ok(Some(san)) = cert.subject_alternative_name() {
            for name in &san.value.general_names {
                if let GeneralName::DNSName(dns) = name {
                    dns_names.push((*dns).to_string());
                }
            }
        }
        Ok(CertNames {
            common_names,
            dns_names,
        })
    }

    fn all(&self) -> impl Iterator<Item = &str> {
        self.common_names
            .iter()
            .chain(&self.dns_names)
            .map(String::as_str)
    }

    /// Whether one of the names is in `allowed`.
    pub fn any_of(&self, allowed: &[String]) -> bool {
        self.all().any(|n| allowed.iter().any(|a| a == n))
    }

    /// The node ids the certificate names (`ftkv-node-<id>`).
    pub fn node_ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self
            .all()
            .filter_map(|n| n.strip_prefix(NODE_NAME_PREFIX)?.parse().ok())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// For messages: the names, comma-separated.
    pub fn describe(&self) -> String {
        let all: Vec<&str> = self.all().collect();
        if all.is_empty() {
            "no CN or DNS name".into()
        } else {
            all.join(", ")
        }
    }
}

/// Checks that the connection a peer request came on may speak for node `from`: on a TLS
/// connection its certificate must name `ftkv-node-<from>`; a plaintext connection (peer TLS
/// off) passes. `PERMISSION_DENIED` otherwise.
pub fn check_peer_claim(extensions: &tonic::Extensions, rpc: &str, from: u64) -> Result<(), Status> {
    let Some(info) = extensions.get::<TlsConnectInfo<TcpConnectInfo>>() else {
        return Ok(());
    };
    let certs = info.peer_certs();
    let Some(leaf) = certs.as_ref().and_then(|c| c.first()) else {
        return Err(Status::permission_denied(format!(
            "{rpc} claiming node {from} came without a peer certificate; refused"
        )));
    };
    let names = CertNames::of(leaf.as_ref()).map_err(|e| Status::permission_denied(format!("{rpc}: {e}")))?;
    if names.node_ids().contains(&from) {
        return Ok(());
    }
    Err(Status::permission_denied(format!(
        "{rpc} claims to come from node {from} but the peer certificate names {} (a peer \
         certificate of node {from} must carry {} as CN or DNS SAN); refused",
        names.describe(),
        node_name(from)
    )))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_and_node_ids_come_from_cn_and_dns_sans() {
        let ca = crate::tls::certs::Authority::new("test CA").unwrap();
        let leaf = ca
            .issue(
                "ftkv-node-2",
                &["ftkv-node-2".into(), "localhost".into(), "127.0.0.1".into()],
            )
            .unwrap();
        let der = crate::tls::certs::pem_to_der(&leaf.cert_pem).unwrap();
        let names = CertNames::of(&der).unwrap();
        assert_eq!(names.common_names, vec!["ftkv-node-2".to_string()]);
        assert_eq!(
            names.dns_names,
            vec!["ftkv-node-2".to_string(), "localhost".to_string()]
        );
        assert_eq!(names.node_ids(), vec![2]);
        assert!(names.any_of(&["localhost".into()]));
        assert!(!names.any_of(&["ftkv-node-3".into()]));
        assert!(CertNames::of(b"junk").is_err());
    }

    #[test]
    fn plaintext_connections_pass_the_claim_check() {
        check_peer_claim(&tonic::Extensions::default(), "Vote", 3).unwrap();
    }
}
