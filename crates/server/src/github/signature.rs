//! `X-Hub-Signature-256`: `sha256=` and the hex HMAC-SHA256 of the raw body,
//! checked in constant time against each configured secret.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::config::Secret;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("no webhook secret is configured ([github] webhook_secrets); refusing every webhook")]
    NoSecretsConfigured,
    #[error("the X-Hub-Signature-256 header is missing")]
    Missing,
    #[error("the X-Hub-Signature-256 header is not \"sha256=\" followed by 64 hex digits")]
    Malformed,
    #[error("the X-Hub-Signature-256 signature does not match any configured secret")]
    Mismatch,
}

/// Accepts `body` if `header` is its signature under any of `secrets`.
pub fn verify(
    secrets: &[Secret],
    body: &[u8],
    header: Option<&[u8]>,
) -> Result<(), SignatureError> {
    if secrets.is_empty() {
        return Err(SignatureError::NoSecretsConfigured);
    }
    let header = header.ok_or(SignatureError::Missing)?;
    let hex_digits = header
        .strip_prefix(b"sha256=")
        .ok_or(SignatureError::Malformed)?;
    let mut expected = [0u8; 32];
    hex::decode_to_slice(hex_digits, &mut expected).map_err(|_| SignatureError::Malformed)?;
    let matches = |secret: &Secret| {
        let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(secret.expose().as_bytes()) else {
            return false;
        };
        mac.update(body);
        // `verify_slice` compares in constant time.
        mac.verify_slice(&expected).is_ok()
    };
    if secrets.iter().any(matches) {
        Ok(())
    } else {
        Err(SignatureError::Mismatch)
    }
}

/// The header value GitHub would send for `body` signed with `secret`.
/// For load generators and tests.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = match Hmac::<Sha256>::new_from_slice(secret) {
        Ok(mac) => mac,
        Err(_) => return String::new(),
    };
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}
