//! Throwaway certificates (rcgen): a CA and the certificates it issues, for
//! `ftkv-node playground --tls` and for tests. Not a production PKI: keys are written in the
//! clear and the certificates never expire before the year 4096.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};

/// An error of certificate generation or of writing the files.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// rcgen refused the parameters.
    #[error("generating a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// A file could not be written.
    #[error("writing {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// A certificate and its key, PEM.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
}

impl Issued {
    /// Writes `DIR/NAME.pem` and `DIR/NAME-key.pem`; returns both paths.
    pub fn write(&self, dir: &Path, name: &str) -> Result<(PathBuf, PathBuf), CertError> {
        let cert = dir.join(format!("{name}.pem"));
        let key = dir.join(format!("{name}-key.pem"));
        write(&cert, &self.cert_pem)?;
        write(&key, &self.key_pem)?;
        Ok((cert, key))
    }
}

fn write(path: &Path, text: &str) -> Result<(), CertError> {
    std::fs::write(path, text).map_err(|source| CertError::Write {
        path: path.to_path_buf(),
        source,
    })
}

/// A self-signed CA.
pub struct Authority {
    cert: rcgen::Certificate,
    key: KeyPair,
}

impl Authority {
    /// A new CA whose subject CN is `name`.
    pub fn new(name: &str) -> Result<Self, CertError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate()?;
        let cert = params.self_signed(&key)?;
        Ok(Self { cert, key })
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    /// The CA's private key, PEM (the playground writes it so that certificates can be rotated
    /// by hand).
    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    /// A certificate for servers and clients with subject CN `common_name` and the SANs
    /// `names` (an IP address becomes an IP SAN, anything else a DNS SAN).
    pub fn issue(&self, common_name: &str, names: &[String]) -> Result<Issued, CertError> {
        let mut params = CertificateParams::new(names.to_vec())?;
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.cert, &self.key)?;
        Ok(Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// The DER bytes of the first certificate of a PEM text.
pub fn pem_to_der(pem: &str) -> Option<Vec<u8>> {
    use tokio_rustls::rustls::pki_types::{pem::PemObject, CertificateDer};
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()?
        .ok()
        .map(|c| c.as_ref().to_vec())
}
