//! argon2id password hashes in PHC string form (`argon2` crate, its default parameters: 19 MiB,
//! 2 passes, 1 lane, OWASP's recommendation). Hashing and verifying are slow on purpose: the
//! server runs them on the blocking pool, one at a time ([`HashGate`]), so a guessing loop
//! cannot take more than one core.

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;

/// A hash could not be made or read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("password hash: {0}")]
pub struct PasswordError(String);

/// argon2id PHC string of `password` under a fresh random salt.
pub fn hash(password: &str) -> Result<String, PasswordError> {
    let salt =
        SaltString::encode_b64(&rand::random::<[u8; 16]>()).map_err(|e| PasswordError(e.to_string()))?;
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| PasswordError(e.to_string()))
}

/// Whether `password` matches `phc` (false also for an unreadable hash).
pub fn verify(password: &str, phc: &str) -> bool {
    match PasswordHash::new(phc) {
        Ok(parsed) => Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok(),
        Err(_) => false,
    }
}

/// Runs argon2 work on the blocking pool, one job at a time for the whole node.
#[derive(Debug)]
pub struct HashGate {
    permits: tokio::sync::Semaphore,
}

impl Default for HashGate {
    fn default() -> Self {
        HashGate {
            permits: tokio::sync::Semaphore::new(1),
        }
    }
}

impl HashGate {
    /// Runs `f` on the blocking pool once no other job of this gate runs.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, PasswordError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|e| PasswordError(e.to_string()))?;
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| PasswordError(format!("hash task failed: {e}")))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn hashes_are_salted_argon2id_and_verify() {
        let a = hash("s3cret").unwrap();
        let b = hash("s3cret").unwrap();
        assert!(a.starts_with("$argon2id$"), "{a}");
        assert_ne!(a, b, "fresh salt each time");
        assert!(verify("s3cret", &a) && verify("s3cret", &b));
        assert!(!verify("s3cret!", &a));
        assert!(!verify("s3cret", "not a hash"));
    }
}
