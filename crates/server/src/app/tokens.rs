//! Tokens runway mints: random, with a readable prefix, and stored only as
//! their SHA-256 hash.

use rand::RngCore;
use sha2::{Digest, Sha256};

/// A random token with a readable prefix (`rwr_` registration, `rwt_` runner,
/// [`REPORT_TOKEN_PREFIX`] a runner's report-only token).
pub fn new_token(prefix: &str) -> String {
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut bytes);
    format!("{prefix}{}", hex::encode(bytes))
}

/// The only form in which tokens are stored.
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// The prefix of a runner's report token: it authenticates that runner's
/// own reports (`POST /api/v1/runners/{id}/metrics`) and nothing else — a
/// GitHub pool's just-in-time runner gets one in its environment, where its
/// jobs can read it.
pub const REPORT_TOKEN_PREFIX: &str = "rwp_";
