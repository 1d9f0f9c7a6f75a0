//! Tokens runway mints: random, with a readable prefix, and stored only as
//! their SHA-256 hash.

use rand::RngCore;
use sha2::{Digest, Sha256};

/// A random token with a readable prefix (`rwr_` registration, `rwt_` runner).
pub fn new_token(prefix: &str) -> String {
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut bytes);
    format!("{prefix}{}", hex::encode(bytes))
}

/// The only form in which tokens are stored.
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}
