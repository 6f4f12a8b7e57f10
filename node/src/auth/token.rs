//! Stateless signed tokens: `ftkv1.<hex claims>.<hex HMAC-SHA256(key, claims)>`, the claims
//! being `postcard(Claims)` (user, the user's auth revision, expiry). Any node holding the
//! replicated signing key verifies any token; nothing is stored per token.

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

/// What a token says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// User name.
    pub user: String,
    /// The user's revision when the token was issued ([`super::User::revision`]).
    pub revision: u64,
    /// Expiry, milliseconds since the Unix epoch.
    pub expires_at_ms: u64,
}

/// Prefix of every token (format version).
const PREFIX: &str = "ftkv1.";

/// Longest token accepted (a name of 128 bytes gives about 400 characters).
pub const MAX_TOKEN_BYTES: usize = 1024;

/// Why a token is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Not a token of this format.
    #[error("malformed token")]
    Malformed,
    /// The signature does not match (tampered, or signed with another key).
    #[error("invalid token signature")]
    BadSignature,
    /// Past its expiry.
    #[error("token expired {0} ms ago")]
    Expired(u64),
    /// The cluster has no signing key (auth never enabled).
    #[error("the cluster has no token signing key (auth was never enabled)")]
    NoKey,
}

fn mac(key: &[u8], body: &[u8]) -> Result<Vec<u8>, TokenError> {
    if key.is_empty() {
        return Err(TokenError::NoKey);
    }
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).map_err(|_| TokenError::NoKey)?;
    m.update(body);
    Ok(m.finalize().into_bytes().to_vec())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len() / 2)
        .map(|i| {
            s.get(2 * i..2 * i + 2)
                .and_then(|b| u8::from_str_radix(b, 16).ok())
        })
        .collect()
}

/// Signs `claims` with `key`.
pub fn encode(key: &[u8], claims: &Claims) -> Result<String, TokenError> {
    let body = postcard::to_stdvec(claims).map_err(|_| TokenError::Malformed)?;
    let sig = mac(key, &body)?;
    Ok(format!("{PREFIX}{}.{}", hex(&body), hex(&sig)))
}

/// Checks the signature and the expiry (against `now_ms`) and returns the claims.
pub fn verify(key: &[u8], token: &str, now_ms: u64) -> Result<Claims, TokenError> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(TokenError::Malformed);
    }
    let rest = token.strip_prefix(PREFIX).ok_or(TokenError::Malformed)?;
    let (body_hex, sig_hex) = rest.split_once('.').ok_or(TokenError::Malformed)?;
    let body = unhex(body_hex).ok_or(TokenError::Malformed)?;
    let sig = unhex(sig_hex).ok_or(TokenError::Malformed)?;
    if key.is_empty() {
        return Err(TokenError::NoKey);
    }
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).map_err(|_| TokenError::NoKey)?;
    m.update(&body);
    // Constant-time comparison.
    m.verify_slice(&sig).map_err(|_| TokenError::BadSignature)?;
    let claims: Claims = postcard::from_bytes(&body).map_err(|_| TokenError::Malformed)?;
    if claims.expires_at_ms <= now_ms {
        return Err(TokenError::Expired(now_ms - claims.expires_at_ms));
    }
    Ok(claims)
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn claims() -> Claims {
        Claims {
            user: "alice".into(),
            revision: 7,
            expires_at_ms: 10_000,
        }
    }

    #[test]
    fn a_token_verifies_until_it_expires() {
        let key = [1u8; 32];
        let t = encode(&key, &claims()).unwrap();
        assert_eq!(verify(&key, &t, 9_999).unwrap(), claims());
        assert_eq!(verify(&key, &t, 10_000), Err(TokenError::Expired(0)));
        assert_eq!(verify(&key, &t, 12_000), Err(TokenError::Expired(2_000)));
    }

    #[test]
    fn tampered_or_foreign_tokens_are_refused() {
        let key = [1u8; 32];
        let t = encode(&key, &claims()).unwrap();
        assert_eq!(verify(&[2u8; 32], &t, 0), Err(TokenError::BadSignature));
        // Claims rewritten (another user, a later expiry) with the old signature.
        let (_, sig) = t.rsplit_once('.').unwrap();
        let forged_body = postcard::to_stdvec(&Claims {
            user: "root".into(),
            ..claims()
        })
        .unwrap();
        let forged = format!("{PREFIX}{}.{sig}", hex(&forged_body));
        assert_eq!(verify(&key, &forged, 0), Err(TokenError::BadSignature));
        // One flipped signature digit.
        let mut flipped = t.clone().into_bytes();
        let last = flipped.len() - 1;
        flipped[last] = if flipped[last] == b'0' { b'1' } else { b'0' };
        let flipped = String::from_utf8(flipped).unwrap();
        assert_eq!(verify(&key, &flipped, 0), Err(TokenError::BadSignature));
        for bad in ["", "ftkv1.", "ftkv1.zz.zz", "Bearer x", "ftkv1.abc.def"] {
            assert_eq!(verify(&key, bad, 0), Err(TokenError::Malformed), "{bad:?}");
        }
        assert_eq!(verify(&key, &"a".repeat(2000), 0), Err(TokenError::Malformed));
        assert_eq!(verify(&[], &t, 0), Err(TokenError::NoKey));
    }
}
