//! `ftkv.v1.Auth`: `Authenticate` (open) and the administration of users, roles and the auth
//! flag (the role `root` once auth is enabled). Changes are proposed as `Command::Auth` and
//! applied by the state machine on every replica; passwords are hashed here, on the blocking
//! pool, before anything is proposed. Reads (get, list, status) follow a read barrier, so they
//! see every change acknowledged before them (a follower redirects to the leader).

use std::sync::Arc;

use ftkv_proto::v1 as pb;
use ftkv_proto::v1::auth_server::Auth;
use tonic::{Request, Response, Status};

use super::AuthGuard;
use crate::auth::state::check_name;
use crate::auth::token::{self, Claims};
use crate::auth::{password, AuthOp, AuthState, PermType, Permission, MAX_PASSWORD_BYTES};
use crate::cluster::{Command, CommandResult};
use crate::limits::Limits;
use crate::server::errors;

/// The service of one node.
#[derive(Clone)]
pub struct AuthService {
    guard: Arc<AuthGuard>,
    limits: Arc<Limits>,
}

impl AuthService {
    /// Serves through `guard`; permission keys are bounded by `limits.max_key_bytes`.
    pub fn new(guard: Arc<AuthGuard>, limits: Limits) -> Self {
        AuthService {
            guard,
            limits: Arc::new(limits),
        }
    }

    /// Proposes `op` (the caller checked root already).
    async fn propose(&self, op: AuthOp) -> Result<(), Status> {
        let (result, _) = self
            .guard
            .cluster()
            .write(Command::Auth(op))
            .await
            .map_err(errors::cluster)?;
        match result {
            CommandResult::AuthApplied { .. } => Ok(()),
            CommandResult::AuthRefused(refusal) => Err(errors::auth_refused(&refusal)),
            other => Err(Status::internal(format!("auth change answered with {other:?}"))),
        }
    }

    /// The state after a read barrier.
    async fn read(&self) -> Result<Arc<AuthState>, Status> {
        self.guard
            .cluster()
            .read_barrier()
            .await
            .map_err(errors::cluster)?;
        Ok(self.guard.state())
    }

    async fn root<T>(&self, request: &Request<T>, what: &str) -> Result<(), Status> {
        self.guard.require_root(request, what).await
    }

    async fn hash(&self, password: String) -> Result<String, Status> {
        check_password(&password)?;
        self.guard
            .hashes()
            .run(move || password::hash(&password))
            .await
            .and_then(|r| r)
            .map_err(hash_error)
    }

    /// Whether `password` matches `hash` (argon2 through the node's gate).
    async fn verify(&self, password: &str, hash: &str) -> Result<bool, Status> {
        let (password, hash) = (password.to_string(), hash.to_string());
        self.guard
            .hashes()
            .run(move || password::verify(&password, &hash))
            .await
            .map_err(hash_error)
    }

    fn check_perm(&self, key: &[u8], range_end: &[u8]) -> Result<(), Status> {
        self.limits.check_bound(key).map_err(|e| errors::limit(&e))?;
        self.limits
            .check_bound(range_end)
            .map_err(|e| errors::limit(&e))?;
        if !range_end.is_empty() && range_end != [0] && range_end <= key {
            return Err(errors::invalid(
                "a permission's range_end must be empty (one key), \"\\0\" (every key from key on) or after key",
            ));
        }
        Ok(())
    }
}

fn name(what: &str, name: &str) -> Result<(), Status> {
    check_name(what, name).map_err(|e| errors::invalid(e.message))
}

fn check_password(password: &str) -> Result<(), Status> {
    if password.is_empty() {
        return Err(errors::invalid("the password is empty"));
    }
    if password.len() > MAX_PASSWORD_BYTES {
        return Err(errors::invalid(format!(
            "the password is {} bytes, over the limit of {MAX_PASSWORD_BYTES}",
            password.len()
        )));
    }
    Ok(())
}

fn perm_type(value: i32) -> Result<PermType, Status> {
    match pb::permission::Type::try_from(value) {
        Ok(pb::permission::Type::Read) => Ok(PermType::Read),
        Ok(pb::permission::Type::Write) => Ok(PermType::Write),
        Ok(pb::permission::Type::Readwrite) => Ok(PermType::ReadWrite),
        Err(_) => Err(errors::invalid(format!("unknown permission type {value}"))),
    }
}

fn to_pb(p: &Permission) -> pb::Permission {
    let t = match p.perm_type {
        PermType::Read => pb::permission::Type::Read,
        PermType::Write => pb::permission::Type::Write,
        PermType::ReadWrite => pb::permission::Type::Readwrite,
    };
    pb::Permission {
        perm_type: t as i32,
        key: p.key.clone(),
        range_end: p.range_end.clone(),
    }
}

fn hash_error(e: password::PasswordError) -> Status {
    match e {
        password::PasswordError::Busy(_) => {
            errors::cluster(crate::cluster::ClusterError::Unavailable(e.to_string()))
        }
        password::PasswordError::Hash(_) => Status::internal(e.to_string()),
    }
}

fn wrong_credentials() -> Status {
    errors::unauthenticated("authentication failed: wrong user name or password")
}

#[tonic::async_trait]
impl Auth for AuthService {
    async fn authenticate(
        &self,
        request: Request<pb::AuthenticateRequest>,
    ) -> Result<Response<pb::AuthenticateResponse>, Status> {
        let req = request.into_inner();
        name("user", &req.name)?;
        check_password(&req.password)?;
        let mut state = self.guard.state();
        if !state.users.contains_key(&req.name) {
            // This node may not have applied the user yet.
            if self.guard.cluster().read_barrier().await.is_ok() {
                state = self.guard.state();
            }
        }
        if !state.enabled {
            return Err(errors::auth_not_enabled());
        }
        let Some(user) = state.users.get(&req.name).cloned() else {
            return Err(wrong_credentials());
        };
        let mut user = user;
        let mut matches = self.verify(&req.password, &user.password_hash).await?;
        if !matches {
            // This node may not have applied a password change yet: ask again after a read
            // barrier when the user changed meanwhile.
            if self.guard.cluster().read_barrier().await.is_ok() {
                let fresh = self.guard.state();
                if let Some(newer) = fresh.users.get(&req.name).filter(|u| u.revision != user.revision) {
                    user = newer.clone();
                    state = fresh.clone();
                    matches = self.verify(&req.password, &user.password_hash).await?;
                }
            }
        }
        if !matches {
            tracing::info!(user = %req.name, "authentication failed: wrong password");
            return Err(wrong_credentials());
        }
        let ttl_ms = self.guard.token_ttl_ms();
        let claims = Claims {
            user: req.name,
            revision: user.revision,
            expires_at_ms: token::now_ms().saturating_add(ttl_ms),
        };
        let token =
            token::encode(&state.signing_key, &claims).map_err(|e| errors::unauthenticated(e.to_string()))?;
        Ok(Response::new(pb::AuthenticateResponse { token, ttl_ms }))
    }

    async fn auth_enable(
        &self,
        request: Request<pb::AuthEnableRequest>,
    ) -> Result<Response<pb::AuthEnableResponse>, Status> {
        self.root(&request, "auth enable").await?;
        let signing_key = rand::random::<[u8; 32]>().to_vec();
        self.propose(AuthOp::Enable { signing_key }).await?;
        Ok(Response::new(pb::AuthEnableResponse {}))
    }

    async fn auth_disable(
        &self,
        request: Request<pb::AuthDisableRequest>,
    ) -> Result<Response<pb::AuthDisableResponse>, Status> {
        self.root(&request, "auth disable").await?;
        self.propose(AuthOp::Disable).await?;
        Ok(Response::new(pb::AuthDisableResponse {}))
    }

    async fn auth_status(
        &self,
        _request: Request<pb::AuthStatusRequest>,
    ) -> Result<Response<pb::AuthStatusResponse>, Status> {
        let state = self.read().await?;
        Ok(Response::new(pb::AuthStatusResponse {
            enabled: state.enabled,
            auth_revision: state.revision,
        }))
    }

    async fn user_add(
        &self,
        request: Request<pb::UserAddRequest>,
    ) -> Result<Response<pb::UserAddResponse>, Status> {
        self.root(&request, "user add").await?;
        let req = request.into_inner();
        name("user", &req.name)?;
        let password_hash = self.hash(req.password).await?;
        self.propose(AuthOp::UserAdd {
            name: req.name,
            password_hash,
        })
        .await?;
        Ok(Response::new(pb::UserAddResponse {}))
    }

    async fn user_get(
        &self,
        request: Request<pb::UserGetRequest>,
    ) -> Result<Response<pb::UserGetResponse>, Status> {
        self.root(&request, "user get").await?;
        let req = request.into_inner();
        name("user", &req.name)?;
        let state = self.read().await?;
        let Some(user) = state.users.get(&req.name) else {
            return Err(errors::not_found(format!("user \"{}\" not found", req.name)));
        };
        Ok(Response::new(pb::UserGetResponse {
            roles: user.roles.iter().cloned().collect(),
        }))
    }

    async fn user_list(
        &self,
        request: Request<pb::UserListRequest>,
    ) -> Result<Response<pb::UserListResponse>, Status> {
        self.root(&request, "user list").await?;
        let state = self.read().await?;
        Ok(Response::new(pb::UserListResponse {
            users: state.users.keys().cloned().collect(),
        }))
    }

    async fn user_delete(
        &self,
        request: Request<pb::UserDeleteRequest>,
    ) -> Result<Response<pb::UserDeleteResponse>, Status> {
        self.root(&request, "user delete").await?;
        let req = request.into_inner();
        name("user", &req.name)?;
        self.propose(AuthOp::UserDelete { name: req.name }).await?;
        Ok(Response::new(pb::UserDeleteResponse {}))
    }

    async fn user_change_password(
        &self,
        request: Request<pb::UserChangePasswordRequest>,
    ) -> Result<Response<pb::UserChangePasswordResponse>, Status> {
        self.root(&request, "user passwd").await?;
        let req = request.into_inner();
        name("user", &req.name)?;
        let password_hash = self.hash(req.password).await?;
        self.propose(AuthOp::UserChangePassword {
            name: req.name,
            password_hash,
        })
        .await?;
        Ok(Response::new(pb::UserChangePasswordResponse {}))
    }

    async fn user_grant_role(
        &self,
        request: Request<pb::UserGrantRoleRequest>,
    ) -> Result<Response<pb::UserGrantRoleResponse>, Status> {
        self.root(&request, "user grant-role").await?;
        let req = request.into_inner();
        name("user", &req.user)?;
        name("role", &req.role)?;
        self.propose(AuthOp::UserGrantRole {
            user: req.user,
            role: req.role,
        })
        .await?;
        Ok(Response::new(pb::UserGrantRoleResponse {}))
    }

    async fn user_revoke_role(
        &self,
        request: Request<pb::UserRevokeRoleRequest>,
    ) -> Result<Response<pb::UserRevokeRoleResponse>, Status> {
        self.root(&request, "user revoke-role").await?;
        let req = request.into_inner();
        name("user", &req.name)?;
        name("role", &req.role)?;
        self.propose(AuthOp::UserRevokeRole {
            user: req.name,
            role: req.role,
        })
        .await?;
        Ok(Response::new(pb::UserRevokeRoleResponse {}))
    }

    async fn role_add(
        &self,
        request: Request<pb::RoleAddRequest>,
    ) -> Result<Response<pb::RoleAddResponse>, Status> {
        self.root(&request, "role add").await?;
        let req = request.into_inner();
        name("role", &req.name)?;
        self.propose(AuthOp::RoleAdd { name: req.name }).await?;
        Ok(Response::new(pb::RoleAddResponse {}))
    }

    async fn role_get(
        &self,
        request: Request<pb::RoleGetRequest>,
    ) -> Result<Response<pb::RoleGetResponse>, Status> {
        self.root(&request, "role get").await?;
        let req = request.into_inner();
        name("role", &req.role)?;
        let state = self.read().await?;
        let Some(role) = state.roles.get(&req.role) else {
            return Err(errors::not_found(format!("role \"{}\" not found", req.role)));
        };
        Ok(Response::new(pb::RoleGetResponse {
            perm: role.permissions.iter().map(to_pb).collect(),
        }))
    }

    async fn role_list(
        &self,
        request: Request<pb::RoleListRequest>,
    ) -> Result<Response<pb::RoleListResponse>, Status> {
        self.root(&request, "role list").await?;
        let state = self.read().await?;
        Ok(Response::new(pb::RoleListResponse {
            roles: state.roles.keys().cloned().collect(),
        }))
    }

    async fn role_delete(
        &self,
        request: Request<pb::RoleDeleteRequest>,
    ) -> Result<Response<pb::RoleDeleteResponse>, Status> {
        self.root(&request, "role delete").await?;
        let req = request.into_inner();
        name("role", &req.role)?;
        self.propose(AuthOp::RoleDelete { name: req.role }).await?;
        Ok(Response::new(pb::RoleDeleteResponse {}))
    }

    async fn role_grant_permission(
        &self,
        request: Request<pb::RoleGrantPermissionRequest>,
    ) -> Result<Response<pb::RoleGrantPermissionResponse>, Status> {
        self.root(&request, "role grant-permission").await?;
        let req = request.into_inner();
        name("role", &req.name)?;
        let Some(perm) = req.perm else {
            return Err(errors::invalid("role grant-permission needs a permission"));
        };
        self.check_perm(&perm.key, &perm.range_end)?;
        let perm = Permission {
            perm_type: perm_type(perm.perm_type)?,
            key: perm.key,
            range_end: perm.range_end,
        };
        self.propose(AuthOp::RoleGrantPermission { role: req.name, perm })
            .await?;
        Ok(Response::new(pb::RoleGrantPermissionResponse {}))
    }

    async fn role_revoke_permission(
        &self,
        request: Request<pb::RoleRevokePermissionRequest>,
    ) -> Result<Response<pb::RoleRevokePermissionResponse>, Status> {
        self.root(&request, "role revoke-permission").await?;
        let req = request.into_inner();
        name("role", &req.role)?;
        self.check_perm(&req.key, &req.range_end)?;
        self.propose(AuthOp::RoleRevokePermission {
            role: req.role,
            key: req.key,
            range_end: req.range_end,
        })
        .await?;
        Ok(Response::new(pb::RoleRevokePermissionResponse {}))
    }
}
