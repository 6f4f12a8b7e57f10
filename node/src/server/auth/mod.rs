//! Enforcement of users, roles and tokens (`crate::auth`) on the client port, and the
//! `ftkv.v1.Auth` service ([`service`]).
//!
//! With auth enabled (the replicated flag), every call but `Auth.Authenticate`, `AuthStatus`,
//! `Cluster.Status`/`Members`/`AlarmList`, health and reflection must carry the metadata
//! `authorization: Bearer <token>`:
//! - `Kv` calls: the token's user needs READ on every key or range read (Get, Scan, Txn
//!   compares and gets) and WRITE on every key or range written (Put, Delete, Upsert, Write
//!   ops, Txn writes, bulk-load rows); `Kv.Batch` items are checked one by one with the
//!   stream's token;
//! - membership changes, `AlarmDisarm`, `Maintenance.Snapshot` and the Auth administration
//!   calls: the role `root`.
//!
//! Without a token, the CN of a verified client certificate (TLS with `--trusted-ca-file`) is
//! the user when it names one (etcd's `--client-cert-auth`); a token wins over it.
//!
//! `UNAUTHENTICATED`: no token, a malformed, forged or expired one, an unknown user, a token
//! issued before the user's last change (revision), a wrong password. `PERMISSION_DENIED`:
//! names the user, the key range and the permission missing. A check that fails because this
//! node may not have applied the user's latest change yet (unknown user, a token newer than
//! the user here) is retried once after a read barrier.

pub mod needs;
pub mod service;

use std::sync::Arc;

use tonic::metadata::MetadataMap;
use tonic::Status;

use super::errors;
use crate::auth::password::HashGate;
use crate::auth::token::{self, Claims};
use crate::auth::{AuthState, KeyRange, PermType};
use crate::cluster::ClusterNode;

/// The metadata key of the token.
pub const AUTHORIZATION: &str = "authorization";

/// The user a verified client certificate names (its first CN), carried into the requests a
/// `Kv.Batch` stream's items become (they have no connection of their own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertUser(pub String);

/// The CN of the client certificate the connection was verified with (TLS with a trusted CA:
/// rustls checked it against `--trusted-ca-file` during the handshake), if any.
pub fn cert_user(extensions: &tonic::Extensions) -> Option<CertUser> {
    if let Some(user) = extensions.get::<CertUser>() {
        return Some(user.clone());
    }
    use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo};
    let info = extensions.get::<TlsConnectInfo<TcpConnectInfo>>()?;
    let certs = info.peer_certs()?;
    let leaf = certs.first()?;
    let names = crate::tls::identity::CertNames::of(leaf.as_ref()).ok()?;
    names.common_names.into_iter().next().map(CertUser)
}

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// Auth is disabled: everything is allowed.
    Open,
    /// An authenticated user.
    User(String),
}

/// Checks callers against the replicated auth state of one node.
pub struct AuthGuard {
    cluster: ClusterNode,
    token_ttl_ms: u64,
    hashes: HashGate,
}

impl std::fmt::Debug for AuthGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthGuard")
            .field("token_ttl_ms", &self.token_ttl_ms)
            .finish()
    }
}

/// The token of `metadata` (`authorization: Bearer <token>`), if any.
fn bearer(metadata: &MetadataMap) -> Result<Option<&str>, Status> {
    let Some(value) = metadata.get(AUTHORIZATION) else {
        return Ok(None);
    };
    let text = value
        .to_str()
        .map_err(|_| errors::unauthenticated("the authorization metadata is not ASCII"))?;
    match text.strip_prefix("Bearer ") {
        Some(t) => Ok(Some(t.trim())),
        None => Err(errors::unauthenticated(
            "the authorization metadata must be \"Bearer <token>\"",
        )),
    }
}

impl AuthGuard {
    /// The guard of `cluster`'s node; it issues tokens valid for `token_ttl_ms`.
    pub fn new(cluster: ClusterNode, token_ttl_ms: u64) -> Arc<Self> {
        Arc::new(AuthGuard {
            cluster,
            token_ttl_ms,
            hashes: HashGate::default(),
        })
    }

    /// The auth state as applied here.
    pub fn state(&self) -> Arc<AuthState> {
        self.cluster.auth_state()
    }

    /// The state after a read barrier (`None` when the barrier failed: a follower, no quorum).
    async fn fresh_state(&self) -> Option<Arc<AuthState>> {
        self.cluster.read_barrier().await.ok()?;
        Some(self.state())
    }

    /// Who sends `request`: [`Caller::Open`] while auth is disabled, else the token's user,
    /// else (no token) the CN of the verified client certificate when it names a user (etcd's
    /// `--client-cert-auth`); `UNAUTHENTICATED` otherwise.
    pub async fn caller<T>(&self, request: &tonic::Request<T>) -> Result<Caller, Status> {
        self.caller_of(request.metadata(), cert_user(request.extensions()))
            .await
    }

    /// [`AuthGuard::caller`] of a request's metadata and certificate user.
    pub async fn caller_of(&self, metadata: &MetadataMap, cert: Option<CertUser>) -> Result<Caller, Status> {
        let state = self.state();
        if !state.enabled {
            return Ok(Caller::Open);
        }
        let Some(tok) = bearer(metadata)? else {
            if let Some(CertUser(cn)) = cert {
                return self.cert_caller(&state, cn).await;
            }
            return Err(errors::unauthenticated(
                "auth is enabled and the request carries no token (authenticate with a user \
                 and password, then send \"authorization: Bearer <token>\")",
            ));
        };
        let claims = token::verify(&state.signing_key, tok, token::now_ms())
            .map_err(|e| errors::unauthenticated(e.to_string()))?;
        match token_user(&state, &claims) {
            Ok(()) => Ok(Caller::User(claims.user)),
            Err(TokenUser::Revoked) => Err(revoked(&claims)),
            Err(TokenUser::MaybeLagging) => match self.fresh_state().await {
                Some(fresh) => match token_user(&fresh, &claims) {
                    Ok(()) => Ok(Caller::User(claims.user)),
                    Err(TokenUser::Revoked) => Err(revoked(&claims)),
                    Err(TokenUser::MaybeLagging) => Err(unknown_user(&fresh, &claims)),
                },
                None => Err(unknown_user(&self.state(), &claims)),
            },
        }
    }

    /// The user a client certificate's CN names (re-checked after a read barrier when this
    /// node does not know it yet).
    async fn cert_caller(&self, state: &AuthState, cn: String) -> Result<Caller, Status> {
        if state.users.contains_key(&cn) {
            return Ok(Caller::User(cn));
        }
        match self.fresh_state().await {
            Some(fresh) if fresh.users.contains_key(&cn) => Ok(Caller::User(cn)),
            _ => Err(errors::unauthenticated(format!(
                "no token, and the client certificate's CN \"{cn}\" is not a user"
            ))),
        }
    }

    /// Refuses `caller` unless its roles give `needed` on every range of `ranges`.
    pub fn allow<'a>(
        &self,
        caller: &Caller,
        needed: impl IntoIterator<Item = &'a (PermType, KeyRange)>,
    ) -> Result<(), Status> {
        let Caller::User(user) = caller else {
            return Ok(());
        };
        let state = self.state();
        for (perm, range) in needed {
            if !state.allows(user, *perm, range) {
                return Err(errors::permission_denied(format!(
                    "user \"{user}\" has no {} permission on {range}",
                    perm.name()
                )));
            }
        }
        Ok(())
    }

    /// Refuses a caller without the role `root` while auth is enabled; `what` names the call.
    pub async fn require_root<T>(&self, request: &tonic::Request<T>, what: &str) -> Result<(), Status> {
        match self.caller(request).await? {
            Caller::Open => Ok(()),
            Caller::User(user) if self.state().is_root(&user) => Ok(()),
            Caller::User(user) => Err(errors::permission_denied(format!(
                "user \"{user}\" lacks the root role, which {what} needs"
            ))),
        }
    }

    /// The password-hash gate (one argon2 job at a time).
    pub fn hashes(&self) -> &HashGate {
        &self.hashes
    }

    /// Lifetime of issued tokens, ms.
    pub fn token_ttl_ms(&self) -> u64 {
        self.token_ttl_ms
    }

    /// The cluster node.
    pub fn cluster(&self) -> &ClusterNode {
        &self.cluster
    }
}

/// Why a token's user does not hold.
enum TokenUser {
    /// The user changed after the token was issued: revoked for good.
    Revoked,
    /// Unknown here, or newer than here: this node may lag behind.
    MaybeLagging,
}

fn token_user(state: &AuthState, claims: &Claims) -> Result<(), TokenUser> {
    match state.users.get(&claims.user) {
        Some(u) if u.revision == claims.revision => Ok(()),
        Some(u) if u.revision > claims.revision => Err(TokenUser::Revoked),
        _ => Err(TokenUser::MaybeLagging),
    }
}

fn revoked(claims: &Claims) -> Status {
    errors::unauthenticated(format!(
        "the token of user \"{}\" was revoked (the user's password or roles changed since it \
         was issued): authenticate again",
        claims.user
    ))
}

fn unknown_user(state: &AuthState, claims: &Claims) -> Status {
    if state.users.contains_key(&claims.user) {
        return errors::unauthenticated(format!(
            "the token of user \"{}\" is newer than this node's copy of the user (the node lags \
             behind the leader): retry, or ask the leader",
            claims.user
        ));
    }
    errors::unauthenticated(format!("the token's user \"{}\" does not exist", claims.user))
}
