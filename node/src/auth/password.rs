//! argon2id password hashes in PHC string form (`argon2` crate, its default parameters: 19 MiB,
//! 2 passes, 1 lane, OWASP's recommendation). Hashing and verifying are slow on purpose: the
//! server runs them on the blocking pool, one at a time ([`HashGate`]), so a guessing loop
//! cannot take more than one core.

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;

/// A hash could not be made or checked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PasswordError {
    /// The hasher failed.
    #[error("password hash: {0}")]
    Hash(String),
    /// [`MAX_WAITING`] jobs already wait for the gate: refused at once.
    #[error("too many password checks in flight on this node ({0} waiting); try again later")]
    Busy(usize),
}

/// Most argon2 jobs that may wait for a node's [`HashGate`]; more are refused
/// ([`PasswordError::Busy`]): a guessing loop gets errors, not an ever longer queue.
pub const MAX_WAITING: usize = 64;

/// argon2id PHC string of `password` under a fresh random salt.
pub fn hash(password: &str) -> Result<String, PasswordError> {
    let salt = SaltString::encode_b64(&rand::random::<[u8; 16]>())
        .map_err(|e| PasswordError::Hash(e.to_string()))?;
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|h| h.to_string())
        .map_err(|e| PasswordError::Hash(e.to_string()))
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
    waiting: std::sync::atomic::AtomicUsize,
}

impl Default for HashGate {
    fn default() -> Self {
        HashGate {
            permits: tokio::sync::Semaphore::new(1),
            waiting: std::sync::atomic::AtomicUsize::new(0),
        }
    }
}

/// Counts a job as waiting while it lives.
struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl HashGate {
    /// Runs `f` on the blocking pool once no other job of this gate runs; refused at once
    /// when [`MAX_WAITING`] jobs wait already.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, PasswordError> {
        let before = self.waiting.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        let waiting = Waiting(&self.waiting);
        if before >= MAX_WAITING {
            return Err(PasswordError::Busy(before));
        }
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|e| PasswordError::Hash(e.to_string()))?;
        drop(waiting);
        tokio::task::spawn_blocking(f)
            .await
            .map_err(|e| PasswordError::Hash(format!("hash task failed: {e}")))
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

    #[tokio::test]
    async fn the_gate_runs_one_job_at_a_time_and_refuses_past_its_queue() {
        let gate = std::sync::Arc::new(HashGate::default());
        let (release, hold) = std::sync::mpsc::channel::<()>();
        let running = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.run(move || hold.recv().is_ok()).await })
        };
        // Wait until the first job holds the permit.
        while gate.permits.available_permits() > 0 {
            tokio::task::yield_now().await;
        }
        let mut queued = Vec::new();
        for _ in 0..MAX_WAITING {
            let gate = gate.clone();
            queued.push(tokio::spawn(async move { gate.run(|| 1).await }));
        }
        while gate.waiting.load(std::sync::atomic::Ordering::Acquire) < MAX_WAITING {
            tokio::task::yield_now().await;
        }
        assert_eq!(gate.run(|| 2).await, Err(PasswordError::Busy(MAX_WAITING)));
        release.send(()).unwrap();
        assert_eq!(running.await.unwrap(), Ok(true));
        for q in queued {
            assert_eq!(q.await.unwrap(), Ok(1));
        }
        assert_eq!(gate.run(|| 3).await, Ok(3), "the queue drained");
    }
}
