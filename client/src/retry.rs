//! Retry budget and backoff: bounded attempts, exponential backoff with jitter, and one overall
//! deadline per call.
//!
//! Design source: AWS Architecture Blog "Exponential Backoff and Jitter" (the "equal jitter"
//! variant: half the step fixed, half random, so retries neither synchronize nor collapse to
//! zero) and gRPC's connection-backoff spec (initial, multiplier 2, maximum).

use std::time::Duration;

use rand::Rng;

/// How hard a call tries before giving up.
///
/// A call makes at most `max_attempts` attempts and never runs past `deadline` in total
/// (including backoff sleeps). Between attempts it sleeps a jittered, exponentially growing
/// delay between `initial_backoff` and `max_backoff`. A redirect (`NOT_LEADER` with a leader
/// address) is followed at once, without sleeping, but still counts as an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Most attempts per call, counting the first (1 = never retry). At least 1 is used.
    pub max_attempts: u32,
    /// Backoff before the second attempt (doubles after each retry).
    pub initial_backoff: Duration,
    /// Largest backoff between two attempts.
    pub max_backoff: Duration,
    /// Overall time budget of one call, all attempts and sleeps included.
    pub deadline: Duration,
}

impl Default for RetryPolicy {
    /// 20 attempts, 50 ms doubling to 1 s, 15 s overall: enough to ride out a leader election
    /// (a failover takes a few seconds); the deadline is the bound that usually ends a call.
    fn default() -> Self {
        Self {
            max_attempts: 20,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
            deadline: Duration::from_secs(15),
        }
    }
}

impl RetryPolicy {
    /// A policy that makes exactly one attempt within `deadline`.
    pub fn no_retry(deadline: Duration) -> Self {
        Self {
            max_attempts: 1,
            deadline,
            ..Self::default()
        }
    }

    /// The un-jittered backoff after `retry` failed attempts (`retry` = 1 before the second
    /// attempt): `initial_backoff * 2^(retry-1)`, capped at `max_backoff`.
    pub fn backoff_ceiling(&self, retry: u32) -> Duration {
        let shift = retry.saturating_sub(1).min(30);
        let step = self.initial_backoff.saturating_mul(1u32 << shift);
        step.min(self.max_backoff).max(Duration::ZERO)
    }

    /// The jittered backoff after `retry` failed attempts: uniform in
    /// `[ceiling / 2, ceiling]` where `ceiling` is [`RetryPolicy::backoff_ceiling`].
    pub fn backoff(&self, retry: u32, rng: &mut impl Rng) -> Duration {
        let ceiling = self.backoff_ceiling(retry);
        let half = ceiling / 2;
        let spread_ns = u64::try_from((ceiling - half).as_nanos()).unwrap_or(u64::MAX);
        let jitter_ns = if spread_ns == 0 {
            0
        } else {
            rng.gen_range(0..=spread_ns)
        };
        half + Duration::from_nanos(jitter_ns)
    }

    /// `max_attempts`, at least 1.
    pub(crate) fn attempts(&self) -> u32 {
        self.max_attempts.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn ceiling_doubles_and_caps() {
        let p = RetryPolicy {
            max_attempts: 20,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(300),
            deadline: Duration::from_secs(5),
        };
        let got: Vec<u128> = (1..=8).map(|r| p.backoff_ceiling(r).as_millis()).collect();
        assert_eq!(got, vec![10, 20, 40, 80, 160, 300, 300, 300]);
        // Huge retry counts neither overflow nor exceed the cap.
        assert_eq!(p.backoff_ceiling(u32::MAX), Duration::from_millis(300));
    }

    #[test]
    fn jitter_stays_within_half_and_full_ceiling() {
        let p = RetryPolicy::default();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut seen_low = false;
        let mut seen_high = false;
        for retry in 1..12 {
            let ceiling = p.backoff_ceiling(retry);
            for _ in 0..200 {
                let b = p.backoff(retry, &mut rng);
                assert!(
                    b >= ceiling / 2 && b <= ceiling,
                    "retry {retry}: {b:?} not in [{:?}, {ceiling:?}]",
                    ceiling / 2
                );
                seen_low |= b < ceiling * 3 / 4;
                seen_high |= b > ceiling * 3 / 4;
            }
        }
        assert!(seen_low && seen_high, "jitter should spread over the interval");
    }

    #[test]
    fn zero_backoff_and_attempts_floor() {
        let p = RetryPolicy {
            max_attempts: 0,
            initial_backoff: Duration::ZERO,
            max_backoff: Duration::ZERO,
            deadline: Duration::from_secs(1),
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        assert_eq!(p.backoff(3, &mut rng), Duration::ZERO);
        assert_eq!(p.attempts(), 1);
        assert_eq!(RetryPolicy::no_retry(Duration::from_secs(2)).attempts(), 1);
    }
}
