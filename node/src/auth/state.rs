//! The replicated auth state and the operations that change it. Applied identically on every
//! replica (`cluster/state_machine.rs`): every check here depends only on the state and the
//! operation, never on the node. Stored as one reserved engine key, [`AuthState::encode`].

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::perm::{covers, KeyRange, PermType, Permission};
use super::{MAX_NAME_BYTES, MAX_PERMISSIONS_PER_ROLE, MAX_ROLES_PER_USER, MAX_USERS, ROOT};

/// A user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    /// argon2id hash in PHC string form (`$argon2id$v=19$...`).
    pub password_hash: String,
    /// Role names.
    pub roles: BTreeSet<String>,
    /// The auth revision of the user's last change; tokens carry it.
    pub revision: u64,
}

/// A role.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Role {
    /// Its permissions (no duplicates).
    pub permissions: Vec<Permission>,
}

/// The whole auth state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthState {
    /// Whether requests are checked.
    pub enabled: bool,
    /// Bumped by every applied change.
    pub revision: u64,
    /// Users by name.
    pub users: BTreeMap<String, User>,
    /// Roles by name.
    pub roles: BTreeMap<String, Role>,
    /// Token signing key, set the first time auth is enabled (empty before).
    #[serde(with = "serde_bytes")]
    pub signing_key: Vec<u8>,
}

/// A change of the auth state (one Raft command). Passwords arrive hashed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthOp {
    /// Turn auth on; `signing_key` is used when the state has none yet.
    Enable {
        /// Fresh random key picked by the proposer.
        #[serde(with = "serde_bytes")]
        signing_key: Vec<u8>,
    },
    /// Turn auth off.
    Disable,
    /// Add a user.
    UserAdd {
        /// Name.
        name: String,
        /// argon2id PHC string.
        password_hash: String,
    },
    /// Delete a user.
    UserDelete {
        /// Name.
        name: String,
    },
    /// Replace a user's password.
    UserChangePassword {
        /// Name.
        name: String,
        /// argon2id PHC string.
        password_hash: String,
    },
    /// Give a user a role.
    UserGrantRole {
        /// User.
        user: String,
        /// Role.
        role: String,
    },
    /// Take a role from a user.
    UserRevokeRole {
        /// User.
        user: String,
        /// Role.
        role: String,
    },
    /// Add a role.
    RoleAdd {
        /// Name.
        name: String,
    },
    /// Delete a role (and take it from every user).
    RoleDelete {
        /// Name.
        name: String,
    },
    /// Add a permission to a role.
    RoleGrantPermission {
        /// Role.
        role: String,
        /// The permission.
        perm: Permission,
    },
    /// Remove the permission on exactly `(key, range_end)` from a role.
    RoleRevokePermission {
        /// Role.
        role: String,
        /// Key or range start.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// Range end as granted.
        #[serde(with = "serde_bytes")]
        range_end: Vec<u8>,
    },
}

/// Why an [`AuthOp`] was refused (nothing changed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuthRefusalKind {
    /// The user, role or permission does not exist.
    NotFound,
    /// It exists already.
    AlreadyExists,
    /// The state does not allow it (enable without root, delete root while enabled).
    FailedPrecondition,
    /// Malformed (a name too long, too many permissions).
    Invalid,
}

/// A refused [`AuthOp`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct AuthRefusal {
    /// Which kind.
    pub kind: AuthRefusalKind,
    /// What is wrong.
    pub message: String,
}

fn refuse<T>(kind: AuthRefusalKind, message: impl Into<String>) -> Result<T, AuthRefusal> {
    Err(AuthRefusal {
        kind,
        message: message.into(),
    })
}

/// Checks a user or role name: non-empty, at most [`MAX_NAME_BYTES`], no control characters.
pub fn check_name(what: &str, name: &str) -> Result<(), AuthRefusal> {
    if name.is_empty() {
        return refuse(AuthRefusalKind::Invalid, format!("{what} name is empty"));
    }
    if name.len() > MAX_NAME_BYTES {
        return refuse(
            AuthRefusalKind::Invalid,
            format!(
                "{what} name is {} bytes, over the limit of {MAX_NAME_BYTES}",
                name.len()
            ),
        );
    }
    if name.chars().any(char::is_control) {
        return refuse(
            AuthRefusalKind::Invalid,
            format!("{what} name holds a control character"),
        );
    }
    Ok(())
}

impl AuthState {
    /// Version byte of [`AuthState::encode`].
    pub const VERSION: u8 = 1;

    /// `[VERSION] ++ postcard(self)`.
    pub fn encode(&self) -> Result<Vec<u8>, postcard::Error> {
        let mut out = vec![Self::VERSION];
        out.extend_from_slice(&postcard::to_stdvec(self)?);
        Ok(out)
    }

    /// What [`AuthState::encode`] wrote.
    pub fn decode(bytes: &[u8]) -> Result<AuthState, String> {
        match bytes.split_first() {
            Some((&Self::VERSION, rest)) => postcard::from_bytes(rest).map_err(|e| e.to_string()),
            Some((v, _)) => Err(format!("unsupported auth state version {v}")),
            None => Err("empty auth state".into()),
        }
    }

    /// Whether `user` holds the role `root`.
    pub fn is_root(&self, user: &str) -> bool {
        self.users.get(user).is_some_and(|u| u.roles.contains(ROOT))
    }

    /// Whether `user`'s roles give `needed` (`Read` or `Write`) on every key of `range`.
    pub fn allows(&self, user: &str, needed: PermType, range: &KeyRange) -> bool {
        let Some(u) = self.users.get(user) else {
            return false;
        };
        if u.roles.contains(ROOT) {
            return true;
        }
        let ranges: Vec<KeyRange> = u
            .roles
            .iter()
            .filter_map(|r| self.roles.get(r))
            .flat_map(|r| r.permissions.iter())
            .filter(|p| p.perm_type.allows(needed))
            .map(Permission::range)
            .collect();
        covers(&ranges, range)
    }

    /// Applies `op` (bumping the revision) or refuses it, leaving the state unchanged.
    pub fn apply(&mut self, op: AuthOp) -> Result<(), AuthRefusal> {
        use AuthRefusalKind::*;
        let next = self.revision + 1;
        match op {
            AuthOp::Enable { signing_key } => {
                if !self.is_root(ROOT) {
                    return refuse(
                        FailedPrecondition,
                        "auth cannot be enabled: the user \"root\" with the role \"root\" must exist first",
                    );
                }
                if self.signing_key.is_empty() {
                    if signing_key.len() < 32 {
                        return refuse(Invalid, "signing key shorter than 32 bytes");
                    }
                    self.signing_key = signing_key;
                }
                self.enabled = true;
            }
            AuthOp::Disable => self.enabled = false,
            AuthOp::UserAdd { name, password_hash } => {
                check_name("user", &name)?;
                if self.users.contains_key(&name) {
                    return refuse(AlreadyExists, format!("user \"{name}\" already exists"));
                }
                if self.users.len() >= MAX_USERS {
                    return refuse(
                        Invalid,
                        format!("the cluster holds {MAX_USERS} users, the most it keeps"),
                    );
                }
                self.users.insert(
                    name,
                    User {
                        password_hash,
                        roles: BTreeSet::new(),
                        revision: next,
                    },
                );
            }
            AuthOp::UserDelete { name } => {
                if self.enabled && name == ROOT {
                    return refuse(
                        FailedPrecondition,
                        "the user \"root\" cannot be deleted while auth is enabled",
                    );
                }
                if self.users.remove(&name).is_none() {
                    return refuse(NotFound, format!("user \"{name}\" not found"));
                }
            }
            AuthOp::UserChangePassword { name, password_hash } => {
                let Some(u) = self.users.get_mut(&name) else {
                    return refuse(NotFound, format!("user \"{name}\" not found"));
                };
                u.password_hash = password_hash;
                u.revision = next;
            }
            AuthOp::UserGrantRole { user, role } => {
                if role != ROOT && !self.roles.contains_key(&role) {
                    return refuse(NotFound, format!("role \"{role}\" not found"));
                }
                if role == ROOT && !self.roles.contains_key(ROOT) {
                    return refuse(NotFound, "role \"root\" not found (add it first)");
                }
                let Some(u) = self.users.get_mut(&user) else {
                    return refuse(NotFound, format!("user \"{user}\" not found"));
                };
                if u.roles.len() >= MAX_ROLES_PER_USER {
                    return refuse(
                        Invalid,
                        format!("user \"{user}\" holds {MAX_ROLES_PER_USER} roles, the most allowed"),
                    );
                }
                if !u.roles.insert(role.clone()) {
                    return refuse(
                        AlreadyExists,
                        format!("user \"{user}\" already has the role \"{role}\""),
                    );
                }
                u.revision = next;
            }
            AuthOp::UserRevokeRole { user, role } => {
                if self.enabled && user == ROOT && role == ROOT {
                    return refuse(
                        FailedPrecondition,
                        "the role \"root\" cannot be revoked from the user \"root\" while auth is enabled",
                    );
                }
                let Some(u) = self.users.get_mut(&user) else {
                    return refuse(NotFound, format!("user \"{user}\" not found"));
                };
                if !u.roles.remove(&role) {
                    return refuse(
                        NotFound,
                        format!("user \"{user}\" does not have the role \"{role}\""),
                    );
                }
                u.revision = next;
            }
            AuthOp::RoleAdd { name } => {
                check_name("role", &name)?;
                if self.roles.contains_key(&name) {
                    return refuse(AlreadyExists, format!("role \"{name}\" already exists"));
                }
                if self.roles.len() >= MAX_USERS {
                    return refuse(
                        Invalid,
                        format!("the cluster holds {MAX_USERS} roles, the most it keeps"),
                    );
                }
                self.roles.insert(name, Role::default());
            }
            AuthOp::RoleDelete { name } => {
                if self.enabled && name == ROOT {
                    return refuse(
                        FailedPrecondition,
                        "the role \"root\" cannot be deleted while auth is enabled",
                    );
                }
                if self.roles.remove(&name).is_none() {
                    return refuse(NotFound, format!("role \"{name}\" not found"));
                }
                for u in self.users.values_mut() {
                    if u.roles.remove(&name) {
                        u.revision = next;
                    }
                }
            }
            AuthOp::RoleGrantPermission { role, perm } => {
                let Some(r) = self.roles.get_mut(&role) else {
                    return refuse(NotFound, format!("role \"{role}\" not found"));
                };
                // Granting the same range again replaces its type (etcd).
                match r
                    .permissions
                    .iter_mut()
                    .find(|p| p.key == perm.key && p.range_end == perm.range_end)
                {
                    Some(existing) => existing.perm_type = perm.perm_type,
                    None => {
                        if r.permissions.len() >= MAX_PERMISSIONS_PER_ROLE {
                            return refuse(
                                Invalid,
                                format!("role \"{role}\" holds {MAX_PERMISSIONS_PER_ROLE} permissions, the most allowed"),
                            );
                        }
                        r.permissions.push(perm);
                        r.permissions.sort();
                    }
                }
            }
            AuthOp::RoleRevokePermission { role, key, range_end } => {
                let Some(r) = self.roles.get_mut(&role) else {
                    return refuse(NotFound, format!("role \"{role}\" not found"));
                };
                let before = r.permissions.len();
                r.permissions
                    .retain(|p| !(p.key == key && p.range_end == range_end));
                if r.permissions.len() == before {
                    return refuse(
                        NotFound,
                        format!(
                            "role \"{role}\" has no permission on {}",
                            KeyRange::from_etcd(&key, &range_end)
                        ),
                    );
                }
            }
        }
        self.revision = next;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn add_user(s: &mut AuthState, name: &str) {
        s.apply(AuthOp::UserAdd {
            name: name.into(),
            password_hash: "h".into(),
        })
        .unwrap();
    }

    #[test]
    fn enable_needs_root_user_with_root_role() {
        let mut s = AuthState::default();
        let enable = AuthOp::Enable {
            signing_key: vec![7; 32],
        };
        let e = s.apply(enable.clone()).unwrap_err();
        assert_eq!(e.kind, AuthRefusalKind::FailedPrecondition);
        add_user(&mut s, ROOT);
        assert_eq!(
            s.apply(enable.clone()).unwrap_err().kind,
            AuthRefusalKind::FailedPrecondition
        );
        s.apply(AuthOp::RoleAdd { name: ROOT.into() }).unwrap();
        s.apply(AuthOp::UserGrantRole {
            user: ROOT.into(),
            role: ROOT.into(),
        })
        .unwrap();
        s.apply(enable).unwrap();
        assert!(s.enabled);
        assert_eq!(s.signing_key, vec![7; 32]);
        // A second enable keeps the key.
        s.apply(AuthOp::Enable {
            signing_key: vec![9; 32],
        })
        .unwrap();
        assert_eq!(s.signing_key, vec![7; 32]);
        assert_eq!(
            s.apply(AuthOp::UserDelete { name: ROOT.into() })
                .unwrap_err()
                .kind,
            AuthRefusalKind::FailedPrecondition
        );
    }

    #[test]
    fn user_changes_bump_its_revision_and_refusals_change_nothing() {
        let mut s = AuthState::default();
        add_user(&mut s, "alice");
        let r0 = s.users["alice"].revision;
        s.apply(AuthOp::UserChangePassword {
            name: "alice".into(),
            password_hash: "h2".into(),
        })
        .unwrap();
        assert!(s.users["alice"].revision > r0);
        let before = s.clone();
        let e = s
            .apply(AuthOp::UserGrantRole {
                user: "alice".into(),
                role: "nope".into(),
            })
            .unwrap_err();
        assert_eq!(e.kind, AuthRefusalKind::NotFound);
        assert_eq!(s, before);
        assert_eq!(
            s.apply(AuthOp::UserAdd {
                name: "x".repeat(129),
                password_hash: "h".into()
            })
            .unwrap_err()
            .kind,
            AuthRefusalKind::Invalid
        );
        let decoded = AuthState::decode(&s.encode().unwrap()).unwrap();
        assert_eq!(decoded, s);
    }

    #[test]
    fn permissions_of_all_roles_are_united() {
        let mut s = AuthState::default();
        add_user(&mut s, "u");
        for (role, key, end, t) in [
            ("ra", b"a/".to_vec(), b"a0".to_vec(), PermType::ReadWrite),
            ("rb", b"b".to_vec(), Vec::new(), PermType::Read),
        ] {
            s.apply(AuthOp::RoleAdd { name: role.into() }).unwrap();
            s.apply(AuthOp::RoleGrantPermission {
                role: role.into(),
                perm: Permission {
                    perm_type: t,
                    key,
                    range_end: end,
                },
            })
            .unwrap();
            s.apply(AuthOp::UserGrantRole {
                user: "u".into(),
                role: role.into(),
            })
            .unwrap();
        }
        assert!(s.allows("u", PermType::Write, &KeyRange::key(b"a/1")));
        assert!(s.allows("u", PermType::Read, &KeyRange::key(b"b")));
        assert!(!s.allows("u", PermType::Write, &KeyRange::key(b"b")));
        assert!(!s.allows("u", PermType::Read, &KeyRange::key(b"c")));
        assert!(!s.allows("nobody", PermType::Read, &KeyRange::key(b"a/1")));
        s.apply(AuthOp::RoleDelete { name: "ra".into() }).unwrap();
        assert!(!s.allows("u", PermType::Write, &KeyRange::key(b"a/1")));
    }
}
