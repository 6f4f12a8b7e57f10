//! Users, roles and tokens (etcd's auth model): what the replicated state holds ([`state`]),
//! how a permission covers a key range ([`perm`]), the signed tokens ([`token`]) and the
//! password hashes ([`password`]). No gRPC here: the server enforces it (`server/auth/`), the
//! state machine applies and stores it (`cluster/state_machine.rs`, reserved key
//! `0xFF 0xFF 'a'`).
//!
//! - A **user** has a name, an argon2id password hash (computed by the node that received the
//!   request, before proposing: no plaintext password is ever in the Raft log) and roles.
//! - A **role** has permissions: READ, WRITE or READWRITE on a key or a key range. The role
//!   `root` allows everything. A request is allowed when the union of the caller's permissions
//!   of the needed type covers every key it touches.
//! - **Auth enabled** (a replicated flag) needs the user `root` holding the role `root`.
//! - **Tokens** are stateless: HMAC-SHA256 over the user, the user's revision and the expiry,
//!   under a key generated once (when auth is first enabled) and replicated, so every node
//!   accepts a token any node issued. Every change of a user (password, roles, deletion) gives
//!   it a new revision, which revokes its old tokens.

pub mod password;
pub mod perm;
pub mod state;
pub mod token;

pub use perm::{KeyRange, PermType, Permission};
pub use state::{AuthOp, AuthRefusal, AuthRefusalKind, AuthState, Role, User};

/// Longest user or role name accepted (bytes).
pub const MAX_NAME_BYTES: usize = 128;

/// Most permissions one role may hold.
pub const MAX_PERMISSIONS_PER_ROLE: usize = 1024;

/// Most roles one user may hold.
pub const MAX_ROLES_PER_USER: usize = 1024;

/// Longest password accepted (bytes; argon2 hashes any length, this bounds the work).
pub const MAX_PASSWORD_BYTES: usize = 1024;

/// Most users, and most roles, the cluster keeps (the whole auth state is one reserved key).
pub const MAX_USERS: usize = 10_000;

/// The user and the role that administer auth.
pub const ROOT: &str = "root";

/// Default token lifetime (`auth.token_ttl_ms`).
pub const DEFAULT_TOKEN_TTL_MS: u64 = 300_000;

/// Printable form of a key for messages: ASCII kept, other bytes as `\xNN`.
pub fn show_key(key: &[u8]) -> String {
    key.iter()
        .flat_map(|b| std::ascii::escape_default(*b))
        .map(char::from)
        .collect()
}
