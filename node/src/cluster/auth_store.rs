//! Where the state machine keeps the auth state (`crate::auth`): one reserved engine key,
//! [`AUTH_KEY`] = `0xFF 0xFF 'a'` (below the bulk-load staging `'b'` and the session table
//! `'s'`, `'t'`), written in the same atomic engine batch as the entry that changed it, so it
//! survives restarts and travels in checkpoints and snapshots like the data.

use ftkv_engine::{Engine, WriteOp};

use super::command::CommandResult;
use crate::auth::{AuthOp, AuthState};

/// The engine key of the auth state.
pub(super) const AUTH_KEY: &[u8] = &[0xFF, 0xFF, b'a'];

const _: () = assert!(AUTH_KEY[0] == super::reserved_keys::RESERVED_KEY_PREFIX[0]);

/// Decodes the stored value.
pub(super) fn decode(value: &[u8]) -> Result<AuthState, String> {
    AuthState::decode(value).map_err(|e| format!("auth state: {e}"))
}

/// The stored state (the default, auth off and no users, when there is none).
pub(super) fn load(engine: &dyn Engine) -> Result<AuthState, String> {
    match engine.get(AUTH_KEY).map_err(|e| e.to_string())? {
        Some(v) => decode(&v),
        None => Ok(AuthState::default()),
    }
}

/// The write that stores `state`.
pub(super) fn put(state: &AuthState) -> Result<WriteOp, postcard::Error> {
    Ok(WriteOp::Put {
        key: AUTH_KEY.to_vec(),
        value: state.encode()?,
    })
}

/// Applies `op` to `state`; sets `dirty` when it changed.
pub(super) fn apply(state: &mut AuthState, op: AuthOp, dirty: &mut bool) -> CommandResult {
    let mut next = state.clone();
    match next.apply(op) {
        Ok(()) => {
            *state = next;
            *dirty = true;
            CommandResult::AuthApplied {
                revision: state.revision,
            }
        }
        Err(refusal) => CommandResult::AuthRefused(refusal),
    }
}
