//! Users, roles and tokens on the client side: [`ClientBuilder::user`](super::ClientBuilder::user)
//! authenticates (`Auth.Authenticate`), caches the token and sends it as
//! `authorization: Bearer <token>` on every call ([`TokenInterceptor`]); a token that is about
//! to expire is renewed before the call, and a call answered `UNAUTHENTICATED` (expired or
//! revoked token, a node that restarted with another key) authenticates again once and is
//! retried. The `Auth` administration calls are methods of [`Client`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use ftkv_proto::v1 as pb;
use ftkv_proto::v1::auth_client::AuthClient;
use parking_lot::RwLock;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::call::{CallKind, Target};
use super::{Client, Inner};
use crate::error::{classify_status, Error, Result};

/// A channel whose requests carry the cached token.
pub(crate) type AuthChannel = InterceptedService<Channel, TokenInterceptor>;

/// A token is renewed when it expires within this much.
const RENEW_BEFORE: Duration = Duration::from_secs(2);

/// User name and password ([`ClientBuilder::user`](super::ClientBuilder::user)); the password
/// is never printed.
#[derive(Clone)]
pub(crate) struct Credentials {
    pub(crate) user: String,
    pub(crate) password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<hidden>")
            .finish()
    }
}

#[derive(Debug, Clone)]
struct Token {
    header: MetadataValue<Ascii>,
    renew_at: Instant,
}

/// The token cache shared by every channel of a client.
#[derive(Debug, Clone, Default)]
pub(crate) struct TokenCache {
    token: Arc<RwLock<Option<Token>>>,
    /// One `Authenticate` at a time: concurrent calls that find the token due (or refused)
    /// wait for it instead of each asking the node to hash the password.
    renewing: Arc<tokio::sync::Mutex<()>>,
    /// Bumped by every answered `Authenticate`.
    generation: Arc<std::sync::atomic::AtomicU64>,
}

impl TokenCache {
    fn set(&self, token: &str, ttl: Duration) -> Result<()> {
        let header = format!("Bearer {token}")
            .parse::<MetadataValue<Ascii>>()
            .map_err(|e| Error::Unauthenticated {
                message: format!("the node sent a token that is not ASCII: {e}"),
            })?;
        *self.token.write() = Some(Token {
            header,
            renew_at: Instant::now() + ttl.saturating_sub(RENEW_BEFORE),
        });
        Ok(())
    }

    fn clear(&self) {
        *self.token.write() = None;
    }

    fn due(&self) -> bool {
        self.token
            .read()
            .as_ref()
            .is_some_and(|t| Instant::now() >= t.renew_at)
    }

    /// The interceptor that adds the token.
    pub(crate) fn interceptor(&self) -> TokenInterceptor {
        TokenInterceptor { cache: self.clone() }
    }
}

/// Adds `authorization: Bearer <token>` when a token is cached.
#[derive(Debug, Clone)]
pub(crate) struct TokenInterceptor {
    cache: TokenCache,
}

impl tonic::service::Interceptor for TokenInterceptor {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> std::result::Result<tonic::Request<()>, tonic::Status> {
        if let Some(t) = self.cache.token.read().as_ref() {
            request.metadata_mut().insert("authorization", t.header.clone());
        }
        Ok(request)
    }
}

impl Inner {
    /// Whether the client authenticates (a user was given).
    pub(super) fn has_credentials(&self) -> bool {
        self.config.credentials.is_some()
    }

    fn needs_token(&self) -> bool {
        self.has_credentials()
            && (self.tokens.due() || !self.authenticated.load(std::sync::atomic::Ordering::Acquire))
    }

    /// Authenticates when credentials are set and the token is missing or due for renewal.
    pub(super) async fn ensure_token(&self) -> Result<()> {
        if self.needs_token() {
            let _one = self.tokens.renewing.lock().await;
            if self.needs_token() {
                self.authenticate_now().await?;
            }
        }
        Ok(())
    }

    /// The token generation (see [`Inner::renew_token_after`]).
    pub(super) fn token_generation(&self) -> u64 {
        self.tokens.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Authenticates again after a call answered `UNAUTHENTICATED` under the token of
    /// `generation`, unless another call already got a newer one.
    pub(super) async fn renew_token_after(&self, generation: u64) -> Result<()> {
        let _one = self.tokens.renewing.lock().await;
        if self.token_generation() != generation {
            return Ok(());
        }
        self.authenticate_now().await
    }

    /// [`Inner::authenticate_now`], one at a time.
    pub(super) async fn authenticate(&self) -> Result<()> {
        let _one = self.tokens.renewing.lock().await;
        self.authenticate_now().await
    }

    /// Gets a new token (`Auth.Authenticate`), from the preferred endpoint first, then the
    /// others. Auth disabled on the cluster: no token, requests go without. Batch streams are
    /// reopened so that they carry the new token.
    async fn authenticate_now(&self) -> Result<()> {
        let Some(creds) = self.config.credentials.clone() else {
            return Ok(());
        };
        let mut endpoints = self.endpoints();
        if let Some(p) = self.preferred.lock().clone() {
            endpoints.retain(|e| *e != p);
            endpoints.insert(0, p);
        }
        let mut last = Error::NoEndpoints;
        for endpoint in endpoints {
            let channel = self.channel(&endpoint)?;
            let mut client = AuthClient::new(channel);
            let request = pb::AuthenticateRequest {
                name: creds.user.clone(),
                password: creds.password.clone(),
            };
            let answer =
                tokio::time::timeout(self.config.request_timeout, client.authenticate(request)).await;
            match answer {
                Ok(Ok(r)) => {
                    let r = r.into_inner();
                    self.tokens.set(&r.token, Duration::from_millis(r.ttl_ms))?;
                    self.after_new_token();
                    return Ok(());
                }
                Ok(Err(status)) => {
                    let not_enabled = crate::error::error_info(&status)
                        .is_some_and(|i| i.reason == ftkv_proto::status_details::REASON_AUTH_NOT_ENABLED);
                    if not_enabled {
                        self.tokens.clear();
                        self.after_new_token();
                        return Ok(());
                    }
                    let failure = classify_status(&status);
                    if !failure.retry {
                        return Err(failure.error);
                    }
                    last = failure.error;
                }
                Err(_) => {
                    last = Error::Timeout {
                        elapsed_ms: self.config.request_timeout.as_millis() as u64,
                    }
                }
            }
        }
        Err(last)
    }

    fn after_new_token(&self) {
        self.tokens
            .generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.authenticated
            .store(true, std::sync::atomic::Ordering::Release);
        // Streams opened with the old token would keep sending it.
        self.pool.lock().batches.clear();
    }

    fn auth_client(&self, conn: super::Conn) -> AuthClient<AuthChannel> {
        AuthClient::with_interceptor(conn.channel, self.tokens.interceptor())
    }
}

/// What a permission allows (etcd's `READ`, `WRITE`, `READWRITE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PermType {
    /// Get, Scan, Txn compares and gets.
    Read,
    /// Put, Delete, Upsert, ranges of them, bulk loads.
    Write,
    /// Both.
    ReadWrite,
}

impl PermType {
    fn to_proto(self) -> i32 {
        (match self {
            PermType::Read => pb::permission::Type::Read,
            PermType::Write => pb::permission::Type::Write,
            PermType::ReadWrite => pb::permission::Type::Readwrite,
        }) as i32
    }

    fn from_proto(v: i32) -> PermType {
        match pb::permission::Type::try_from(v) {
            Ok(pb::permission::Type::Write) => PermType::Write,
            Ok(pb::permission::Type::Readwrite) => PermType::ReadWrite,
            _ => PermType::Read,
        }
    }

    /// etcd's name.
    pub fn name(self) -> &'static str {
        match self {
            PermType::Read => "READ",
            PermType::Write => "WRITE",
            PermType::ReadWrite => "READWRITE",
        }
    }
}

/// A permission of a role: `key` alone (`range_end` empty), `[key, range_end)`, or every key
/// from `key` on (`range_end` = `[0]`). A prefix `P` is `[P, prefix_end(P))`
/// ([`crate::prefix_end`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Permission {
    /// What it allows.
    pub perm_type: PermType,
    /// The key or the range start.
    pub key: Vec<u8>,
    /// The range end (see above).
    pub range_end: Vec<u8>,
}

/// Auth on the cluster: the flag and the revision of the users and roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuthStatus {
    /// Whether requests are checked.
    pub enabled: bool,
    /// Bumped by every change.
    pub revision: u64,
}

macro_rules! admin {
    ($self:ident, $kind:expr, $method:ident, $req:expr) => {{
        let inner = &$self.inner;
        inner
            .call($kind, Target::Leader, |conn| {
                let mut c = inner.auth_client(conn);
                let req = $req;
                async move { c.$method(req).await.map(|r| r.into_inner()) }
            })
            .await
    }};
}

impl Client {
    /// Authenticates again now (a new token); a no-op without a user.
    pub async fn authenticate(&self) -> Result<()> {
        self.inner.authenticate().await
    }

    /// `Auth.AuthEnable`: needs the user `root` with the role `root`.
    pub async fn auth_enable(&self) -> Result<()> {
        admin!(self, CallKind::Admin, auth_enable, pb::AuthEnableRequest {}).map(|_| ())
    }

    /// `Auth.AuthDisable`.
    pub async fn auth_disable(&self) -> Result<()> {
        admin!(self, CallKind::Admin, auth_disable, pb::AuthDisableRequest {}).map(|_| ())
    }

    /// `Auth.AuthStatus`.
    pub async fn auth_status(&self) -> Result<AuthStatus> {
        let r = admin!(self, CallKind::Read, auth_status, pb::AuthStatusRequest {})?;
        Ok(AuthStatus {
            enabled: r.enabled,
            revision: r.auth_revision,
        })
    }

    /// Adds a user (the node hashes the password).
    pub async fn user_add(&self, name: &str, password: &str) -> Result<()> {
        admin!(
            self,
            CallKind::Admin,
            user_add,
            pb::UserAddRequest {
                name: name.to_string(),
                password: password.to_string(),
            }
        )
        .map(|_| ())
    }

    /// Deletes a user.
    pub async fn user_delete(&self, name: &str) -> Result<()> {
        admin!(
            self,
            CallKind::Admin,
            user_delete,
            pb::UserDeleteRequest {
                name: name.to_string()
            }
        )
        .map(|_| ())
    }

    /// The user names.
    pub async fn user_list(&self) -> Result<Vec<String>> {
        admin!(self, CallKind::Read, user_list, pb::UserListRequest {}).map(|r| r.users)
    }

    /// The roles of a user.
    pub async fn user_get(&self, name: &str) -> Result<Vec<String>> {
        admin!(
            self,
            CallKind::Read,
            user_get,
            pb::UserGetRequest {
                name: name.to_string()
            }
        )
        .map(|r| r.roles)
    }

    /// Replaces a user's password (its tokens are revoked).
    pub async fn user_change_password(&self, name: &str, password: &str) -> Result<()> {
        admin!(
            self,
            CallKind::Admin,
            user_change_password,
            pb::UserChangePasswordRequest {
                name: name.to_string(),
                password: password.to_string(),
            }
        )
        .map(|_| ())
    }

    /// Gives a user a role.
    pub async fn user_grant_role(&self, user: &str, role: &str) -> Result<()> {
        admin!(
            self,
            CallKind::Admin,
            user_grant_role,
            pb::UserGrantRoleRequest {
                user: user.to_string(),
                role: role.to_string(),
            }
        )
        .map(|_| ())
    }

    /// Takes a role from a user.
    pub async fn user_revoke_role(&self, user: &str, role: &str) -> Result<()> {
        admin!(
            self,
            CallKind::Admin,
            user_revoke_role,
            pb::UserRevokeRoleRequest {
                name: user.to_string(),
                role: role.to_string(),
            }
        )
        .map(|_| ())
    }

    /// Adds a role.
    pub async fn role_add(&self, name: &str) -> Result<()> {
        admin!(
            self,
            CallKind::Admin,
            role_add,
            pb::RoleAddRequest {
                name: name.to_string()
            }
        )
        .map(|_| ())
    }

    /// Deletes a role.
    pub async fn role_delete(&self, name: &str) -> Result<()> {
        admin!(
            self,
            CallKind::Admin,
            role_delete,
            pb::RoleDeleteRequest {
                role: name.to_string()
            }
        )
        .map(|_| ())
    }

    /// The role names.
    pub async fn role_list(&self) -> Result<Vec<String>> {
        admin!(self, CallKind::Read, role_list, pb::RoleListRequest {}).map(|r| r.roles)
    }

    /// The permissions of a role.
    pub async fn role_get(&self, name: &str) -> Result<Vec<Permission>> {
        let r = admin!(
            self,
            CallKind::Read,
            role_get,
            pb::RoleGetRequest {
                role: name.to_string()
            }
        )?;
        Ok(r.perm
            .into_iter()
            .map(|p| Permission {
                perm_type: PermType::from_proto(p.perm_type),
                key: p.key,
                range_end: p.range_end,
            })
            .collect())
    }

    /// Adds a permission to a role (the same key and range end again replaces its type).
    pub async fn role_grant_permission(&self, role: &str, perm: Permission) -> Result<()> {
        admin!(
            self,
            CallKind::Admin,
            role_grant_permission,
            pb::RoleGrantPermissionRequest {
                name: role.to_string(),
                perm: Some(pb::Permission {
                    perm_type: perm.perm_type.to_proto(),
                    key: perm.key.clone(),
                    range_end: perm.range_end.clone(),
                }),
            }
        )
        .map(|_| ())
    }

    /// Removes the permission on exactly `key` and `range_end` from a role.
    pub async fn role_revoke_permission(&self, role: &str, key: &[u8], range_end: &[u8]) -> Result<()> {
        admin!(
            self,
            CallKind::Admin,
            role_revoke_permission,
            pb::RoleRevokePermissionRequest {
                role: role.to_string(),
                key: key.to_vec(),
                range_end: range_end.to_vec(),
            }
        )
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use tonic::service::Interceptor;

    use super::*;

    #[test]
    fn the_interceptor_sends_the_cached_token_and_debug_hides_the_password() {
        let cache = TokenCache::default();
        let mut interceptor = cache.interceptor();
        let r = interceptor.call(tonic::Request::new(())).unwrap();
        assert!(r.metadata().get("authorization").is_none());
        cache.set("ftkv1.ab.cd", Duration::from_secs(60)).unwrap();
        let r = interceptor.call(tonic::Request::new(())).unwrap();
        assert_eq!(r.metadata().get("authorization").unwrap(), "Bearer ftkv1.ab.cd");
        assert!(!cache.due());
        cache.set("t", Duration::from_millis(10)).unwrap();
        assert!(cache.due(), "a token expiring within RENEW_BEFORE is due");
        let creds = Credentials {
            user: "alice".into(),
            password: "s3cret".into(),
        };
        let shown = format!("{creds:?}");
        assert!(shown.contains("alice") && !shown.contains("s3cret"), "{shown}");
    }
}
