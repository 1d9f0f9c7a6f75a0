//! The head of a test's `runway.toml`: every config a test writes starts
//! with a `[server]` table and a fast `[scaling]` round.

use std::path::{Path, PathBuf};

/// `[server]` listening on `listen` with admin token `admin`, and
/// `[scaling]` every `interval`; the test's own tables follow.
pub fn server_head(listen: &str, admin: &str, interval: &str) -> String {
    format!(
        "[server]\nlisten = \"{listen}\"\nadmin_tokens = [\"{admin}\"]\n\n\
         [scaling]\ninterval = \"{interval}\"\n\n"
    )
}

/// Writes `dir/runway.toml`: [`server_head`], then `rest`; its path.
pub fn write_config(dir: &Path, listen: &str, admin: &str, interval: &str, rest: &str) -> PathBuf {
    let path = dir.join("runway.toml");
    std::fs::write(&path, server_head(listen, admin, interval) + rest).expect("write runway.toml");
    path
}
