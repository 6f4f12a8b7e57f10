//! The retry loop of every call: endpoint choice (preferred, rotation, redirects), one overall
//! deadline, a deadline per attempt, backoff between attempts, and the final error of a write
//! whose outcome is unknown.
//!
//! Attempt deadlines: a read or write to the leader gets the short attempt timeout
//! (`ClientBuilder::attempt_timeout`), doubled at each timeout of the same endpoint up to the
//! request timeout. An endpoint that timed out is avoided for as long as its attempt waited:
//! the call asks the others (whose `NOT_LEADER` hints name the new leader once it is elected),
//! and a hint naming the avoided endpoint is not followed until then, so a paused leader costs
//! one short attempt while a slow but live one still gets a long enough attempt.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::{normalize_endpoint, Conn, Inner};
use crate::error::{classify_status, Error, Result};
use crate::retry::RetryPolicy;

/// What a call is, for the retry loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CallKind {
    /// Reads: no side effect, always safe to retry.
    Read,
    /// Session-carrying writes of this client id: retried with the same session; unknown
    /// outcome = ambiguous.
    Write {
        /// The session's client id (retired after a `StaleSequence` answer).
        client_id: u64,
    },
    /// Membership changes: retried, unknown outcome = ambiguous.
    Admin,
}

/// Where a call goes.
#[derive(Debug, Clone)]
pub(super) enum Target {
    /// The leader, found through the preferred endpoint, rotation and redirects.
    Leader,
    /// Exactly this endpoint, no redirect.
    Fixed(String),
}

impl Inner {
    /// The preferred endpoint, else the next one in rotation, skipping those `avoid` names
    /// unless every endpoint is avoided.
    fn pick_endpoint(&self, avoid: impl Fn(&str) -> bool) -> Option<String> {
        if let Some(ep) = self.preferred.lock().clone() {
            if !avoid(&ep) {
                return Some(ep);
            }
        }
        let pool = self.pool.lock();
        let n = pool.endpoints.len();
        if n == 0 {
            return None;
        }
        let start = self.rotation.load(Ordering::Relaxed);
        (0..n)
            .filter_map(|k| pool.endpoints.get((start + k) % n))
            .find(|ep| !avoid(ep))
            .or_else(|| pool.endpoints.get(start % n))
            .cloned()
    }

    /// Time allowed to one attempt at an endpoint that has timed out `timeouts` times in this
    /// call. Reads and session-carrying writes to the leader start with the short attempt
    /// timeout (a paused node is left for another one quickly; a write whose attempt timed out
    /// is retried under the same session, so it still applies once) and double it at each
    /// timeout of the same endpoint, up to the request timeout (a slow but live leader is
    /// still waited for). Membership changes and calls to one fixed endpoint get the full
    /// request timeout: a retried change is not de-duplicated.
    fn attempt_budget(&self, kind: CallKind, target: &Target, timeouts: u32) -> Duration {
        let full = self.config.request_timeout;
        if kind == CallKind::Admin || matches!(target, Target::Fixed(_)) {
            return full;
        }
        self.config
            .attempt_timeout()
            .saturating_mul(1u32 << timeouts.min(16))
            .min(full)
    }

    /// After a failure at `endpoint`: stop preferring it and move the rotation past it.
    fn demote(&self, endpoint: &str) {
        {
            let mut preferred = self.preferred.lock();
            if preferred.as_deref() == Some(endpoint) {
                *preferred = None;
            }
        }
        let pool = self.pool.lock();
        if let Some(i) = pool.endpoints.iter().position(|e| e == endpoint) {
            self.rotation.store(i + 1, Ordering::Relaxed);
        }
    }

    pub(super) fn prefer(&self, endpoint: &str) {
        *self.preferred.lock() = Some(endpoint.to_string());
    }

    /// Runs one call under the retry policy. `attempt` sends one request on a channel.
    pub(super) async fn call<T, F, Fut>(&self, kind: CallKind, target: Target, attempt: F) -> Result<T>
    where
        F: FnMut(Conn) -> Fut,
        Fut: Future<Output = std::result::Result<T, tonic::Status>>,
    {
        self.call_detailed(kind, target, attempt)
            .await
            .map_err(|e| e.error)
    }

    /// [`Inner::call`], telling also whether a write ended on a `StaleSequence` answer to its
    /// first delivery (so it was certainly not applied and may be sent again under a fresh
    /// session).
    pub(super) async fn call_detailed<T, F, Fut>(
        &self,
        kind: CallKind,
        target: Target,
        mut attempt: F,
    ) -> std::result::Result<T, CallError>
    where
        F: FnMut(Conn) -> Fut,
        Fut: Future<Output = std::result::Result<T, tonic::Status>>,
    {
        let policy = match target {
            Target::Leader => self.config.retry,
            Target::Fixed(_) => RetryPolicy {
                max_attempts: 1,
                deadline: self.config.retry.deadline.min(self.config.request_timeout),
                ..self.config.retry
            },
        };
        let start = Instant::now();
        let deadline = start + policy.deadline;
        // True once any attempt may have reached the state machine.
        let mut maybe_applied = false;
        let mut last_error: Option<Error> = None;
        let mut redirect: Option<String> = None;
        // Endpoints whose connection failed during this call: their redirect hints are stale.
        let mut unreachable: Vec<String> = Vec::new();
        // Endpoints that answered NOT_LEADER during this call.
        let mut refused_as_follower: Vec<String> = Vec::new();
        let mut retries = 0u32;
        // Endpoints whose attempt timed out during this call (paused, partitioned, overloaded).
        let mut timed_out = TimedOut::default();
        // Endpoints that answered DRAINING during this call: shutting down, never asked again
        // by it (neither picked nor followed as a redirect while another endpoint is left).
        let mut draining: Vec<String> = Vec::new();
        // Whether this call authenticated again after an UNAUTHENTICATED answer (once).
        let mut reauthenticated = false;
        // No node reachable to authenticate yet: the attempts below find out, under the
        // policy's backoff (and authenticate once they are answered UNAUTHENTICATED).
        if let Err(e) = self.ensure_token().await {
            if !e.is_retryable() {
                return Err(e.into());
            }
        }
        let mut token_generation = self.token_generation();

        for _ in 0..policy.attempts() {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            let endpoint = match (&target, redirect.take()) {
                (Target::Fixed(ep), _) => ep.clone(),
                (Target::Leader, Some(ep)) => ep,
                (Target::Leader, None) => self
                    .pick_endpoint(|ep| timed_out.avoided(ep, now) || draining.iter().any(|d| d == ep))
                    .ok_or(Error::NoEndpoints)?,
            };
            let channel = match self.channel(&endpoint) {
                Ok(ch) => ch,
                Err(e) => {
                    // Only a redirect hint can be malformed here; the initial list was checked.
                    self.demote(&endpoint);
                    last_error = Some(e);
                    continue;
                }
            };
            let budget = self
                .attempt_budget(kind, &target, timed_out.timeouts(&endpoint))
                .min(deadline.saturating_duration_since(now));
            let conn = Conn {
                endpoint: endpoint.clone(),
                channel,
            };
            let result = tokio::time::timeout(budget, attempt(conn)).await;
            let error = match result {
                Ok(Ok(value)) => {
                    if matches!(kind, CallKind::Write { .. }) && self.take_injected_drop() {
                        tracing::debug!(%endpoint, "test fault: dropping a write response");
                        maybe_applied = true;
                        Error::Timeout {
                            elapsed_ms: millis(start.elapsed()),
                        }
                    } else {
                        if matches!(target, Target::Leader) {
                            self.prefer(&endpoint);
                        }
                        return Ok(value);
                    }
                }
                Ok(Err(status)) => {
                    let mut failure = classify_status(&status);
                    if is_draining(&status) && !draining.contains(&endpoint) {
                        draining.push(endpoint.clone());
                    }
                    failure.error = name_endpoint(failure.error, &endpoint);
                    tracing::debug!(%endpoint, code = ?status.code(), error = %failure.error, "attempt failed");
                    let applied_before = maybe_applied;
                    if !failure.not_applied {
                        maybe_applied = true;
                    }
                    if failure.stale_session {
                        if let CallKind::Write { client_id } = kind {
                            let retired = self.retire_client_id(client_id);
                            if !applied_before {
                                // No earlier delivery: the node refused this one, so the write
                                // was certainly not applied.
                                return Err(CallError {
                                    error: failure.error,
                                    stale_not_applied: true,
                                });
                            }
                            if let (true, Error::Ambiguous { message }) = (retired, &mut failure.error) {
                                message.push_str("; later writes of this client use a new client id");
                            }
                        }
                    }
                    if matches!(failure.error, Error::Unauthenticated { .. })
                        && self.has_credentials()
                        && !reauthenticated
                    {
                        // Expired or revoked token: a new one, and the same request again.
                        match self.renew_token_after(token_generation).await {
                            Ok(()) => {
                                reauthenticated = true;
                                token_generation = self.token_generation();
                                last_error = Some(failure.error);
                                continue;
                            }
                            // Nobody answered Authenticate: an attempt failed, try again later.
                            Err(e) if e.is_retryable() => {
                                failure.error = e;
                                failure.retry = true;
                            }
                            // Refused (a changed password): final, but an earlier attempt of a
                            // write may have applied it, which the refusal does not undo.
                            Err(e) => return Err(finish_error(kind, e, maybe_applied).into()),
                        }
                    }
                    if !failure.retry {
                        return Err(finish_error(kind, failure.error, maybe_applied).into());
                    }
                    if matches!(failure.error, Error::NotLeader { .. }) {
                        refused_as_follower.push(endpoint.clone());
                    }
                    if matches!(target, Target::Leader) {
                        let hint = redirect_hint(&failure.error, &endpoint, &unreachable);
                        let hint = hint.filter(|h| !draining.contains(h));
                        if let Some(hint) = hint.filter(|h| !timed_out.avoided(h, Instant::now())) {
                            // A hint naming a node that just timed out is not followed: its
                            // followers have not noticed yet that it is gone (election under
                            // way), so they are asked again after a backoff; once they have
                            // named it for as long as its attempt waited, it is asked again,
                            // with a longer attempt.
                            self.prefer(&hint);
                            let seen = refused_as_follower.contains(&hint);
                            redirect = Some(hint);
                            if !seen {
                                last_error = Some(failure.error);
                                continue; // follow a fresh redirect at once
                            }
                            // Nodes pointing at each other (views changing in an election):
                            // follow the hint, but after a backoff.
                        }
                    }
                    if matches!(failure.error, Error::Unavailable { .. } | Error::Transport { .. }) {
                        unreachable.push(endpoint.clone());
                    }
                    failure.error
                }
                Err(_elapsed) => {
                    if kind != CallKind::Read {
                        maybe_applied = true;
                    }
                    tracing::debug!(%endpoint, budget_ms = millis(budget), "attempt timed out");
                    timed_out.record(&endpoint, budget);
                    Error::Timeout {
                        elapsed_ms: millis(start.elapsed()),
                    }
                }
            };
            self.demote(&endpoint);
            last_error = Some(error);
            retries += 1;
            let remaining = deadline.saturating_duration_since(Instant::now());
            let pause = policy.backoff(retries, &mut rand::thread_rng()).min(remaining);
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
        }
        let error = match last_error {
            Some(Error::Timeout { .. }) | None => Error::Timeout {
                elapsed_ms: millis(start.elapsed()),
            },
            Some(e) => e,
        };
        Err(finish_error(kind, error, maybe_applied).into())
    }

    fn take_injected_drop(&self) -> bool {
        self.drop_write_responses
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// Whether `status` is a node's refusal because it is draining (shutting down): certainly not
/// applied, and that node will not serve again before it restarts.
fn is_draining(status: &tonic::Status) -> bool {
    crate::error::error_info(status).is_some_and(|i| i.reason == ftkv_proto::status_details::REASON_DRAINING)
}

/// How a call failed ([`Inner::call_detailed`]).
#[derive(Debug)]
pub(super) struct CallError {
    /// The error the caller sees.
    pub(super) error: Error,
    /// A write's first delivery was answered `StaleSequence` (the client id was retired): the
    /// write was not applied and may be sent again under a fresh session.
    pub(super) stale_not_applied: bool,
}

impl From<Error> for CallError {
    fn from(error: Error) -> Self {
        Self {
            error,
            stale_not_applied: false,
        }
    }
}

/// The endpoints whose attempt timed out during one call: how often, and until when the call
/// avoids them (as long again as the last attempt there waited).
#[derive(Debug, Default)]
struct TimedOut {
    by_endpoint: HashMap<String, (u32, Instant)>,
}

impl TimedOut {
    fn timeouts(&self, endpoint: &str) -> u32 {
        self.by_endpoint.get(endpoint).map_or(0, |(n, _)| *n)
    }

    fn record(&mut self, endpoint: &str, waited: Duration) {
        let entry = self
            .by_endpoint
            .entry(endpoint.to_string())
            .or_insert((0, Instant::now()));
        entry.0 = entry.0.saturating_add(1);
        entry.1 = Instant::now() + waited;
    }

    fn avoided(&self, endpoint: &str, now: Instant) -> bool {
        self.by_endpoint
            .get(endpoint)
            .is_some_and(|(_, until)| now < *until)
    }
}

/// Puts the endpoint in front of transport-level messages, so "connection refused" says where.
fn name_endpoint(error: Error, endpoint: &str) -> Error {
    match error {
        Error::Unavailable { message } => Error::Unavailable {
            message: format!("{endpoint}: {message}"),
        },
        Error::Transport { message } => Error::Transport {
            message: format!("{endpoint}: {message}"),
        },
        other => other,
    }
}

/// The leader endpoint a `NOT_LEADER` error points to, unless it is the endpoint just asked
/// or one that already failed to connect during this call (a stale hint).
fn redirect_hint(error: &Error, asked: &str, unreachable: &[String]) -> Option<String> {
    let Error::NotLeader {
        leader_endpoint: Some(hint),
        ..
    } = error
    else {
        return None;
    };
    let hint = normalize_endpoint(hint).ok()?;
    (hint != asked && !unreachable.contains(&hint)).then_some(hint)
}

/// The error a call ends with: a write that may have been applied is ambiguous, whatever the
/// last attempt said, unless the last answer was itself definite about the outcome.
fn finish_error(kind: CallKind, error: Error, maybe_applied: bool) -> Error {
    if kind == CallKind::Read || !maybe_applied {
        return error;
    }
    match error {
        // A refusal after an attempt that may have applied the write (e.g. "sequence below the
        // window": the node forgot the result) does not say the write did not happen.
        e @ (Error::Ambiguous { .. } | Error::NotOnAllReplicas { .. }) => e,
        other => Error::Ambiguous {
            message: other.to_string(),
        },
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirect_hints_skip_self_and_unreachable_endpoints() {
        let nl = |ep: Option<&str>| Error::NotLeader {
            leader_id: 2,
            leader_endpoint: ep.map(String::from),
        };
        assert_eq!(
            redirect_hint(&nl(Some("http://b:2")), "a:1", &[]),
            Some("b:2".to_string())
        );
        assert_eq!(redirect_hint(&nl(Some("a:1")), "a:1", &[]), None);
        assert_eq!(redirect_hint(&nl(Some("b:2")), "a:1", &["b:2".to_string()]), None);
        assert_eq!(redirect_hint(&nl(None), "a:1", &[]), None);
        assert_eq!(redirect_hint(&nl(Some("garbage")), "a:1", &[]), None);
        assert_eq!(redirect_hint(&Error::NoEndpoints, "a:1", &[]), None);
    }

    #[test]
    fn final_error_of_a_maybe_applied_write_is_ambiguous() {
        let t = Error::Transport {
            message: "reset".into(),
        };
        assert!(finish_error(CallKind::Write { client_id: 1 }, t.clone(), true).is_ambiguous());
        assert_eq!(
            finish_error(CallKind::Write { client_id: 1 }, t.clone(), false),
            t
        );
        assert_eq!(finish_error(CallKind::Read, t.clone(), true), t);
        let nl = Error::NotLeader {
            leader_id: 0,
            leader_endpoint: None,
        };
        assert!(finish_error(CallKind::Admin, nl, true).is_ambiguous());
        let inv = Error::InvalidArgument {
            message: "x".into(),
            limit: None,
        };
        assert_eq!(
            finish_error(CallKind::Write { client_id: 1 }, inv.clone(), false),
            inv
        );
        assert!(finish_error(CallKind::Write { client_id: 1 }, inv, true).is_ambiguous());
    }

    #[tokio::test]
    async fn attempts_double_per_timeout_up_to_the_request_timeout_except_admin_and_fixed() {
        let c = crate::Client::builder()
            .endpoints(["a:1", "b:2"])
            .request_timeout(Duration::from_secs(5))
            .build()
            .await
            .unwrap();
        let inner = &c.inner;
        let write = CallKind::Write { client_id: 1 };
        let budgets: Vec<u128> = (0..5)
            .map(|k| inner.attempt_budget(write, &Target::Leader, k).as_millis())
            .collect();
        assert_eq!(budgets, vec![1250, 2500, 5000, 5000, 5000]);
        assert_eq!(
            inner
                .attempt_budget(CallKind::Read, &Target::Leader, 0)
                .as_millis(),
            1250
        );
        assert_eq!(
            inner
                .attempt_budget(CallKind::Admin, &Target::Leader, 0)
                .as_secs(),
            5
        );
        let fixed = Target::Fixed("a:1".into());
        assert_eq!(inner.attempt_budget(CallKind::Read, &fixed, 0).as_secs(), 5);
        assert_eq!(
            inner.attempt_budget(write, &Target::Leader, u32::MAX).as_secs(),
            5
        );
    }

    #[tokio::test]
    async fn picking_skips_avoided_endpoints_unless_all_are() {
        let c = crate::Client::builder()
            .endpoints(["a:1", "b:2", "c:3"])
            .build()
            .await
            .unwrap();
        let inner = &c.inner;
        inner.prefer("a:1");
        assert_eq!(inner.pick_endpoint(|_| false).as_deref(), Some("a:1"));
        assert_eq!(inner.pick_endpoint(|e| e == "a:1").as_deref(), Some("b:2"));
        inner.demote("b:2"); // rotation moves past b
        assert_eq!(inner.pick_endpoint(|e| e == "a:1").as_deref(), Some("c:3"));
        assert_eq!(inner.pick_endpoint(|e| e != "b:2").as_deref(), Some("b:2"));
        assert!(
            inner.pick_endpoint(|_| true).is_some(),
            "all avoided: still one to try"
        );
        let mut t = TimedOut::default();
        t.record("a:1", Duration::from_secs(60));
        assert!(t.avoided("a:1", Instant::now()) && !t.avoided("b:2", Instant::now()));
        assert_eq!((t.timeouts("a:1"), t.timeouts("b:2")), (1, 0));
        t.record("a:1", Duration::ZERO);
        assert_eq!(t.timeouts("a:1"), 2);
        assert!(!t.avoided("a:1", Instant::now() + Duration::from_millis(1)));
    }
}
