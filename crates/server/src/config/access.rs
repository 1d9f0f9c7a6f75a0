//! `[pools.access]`: which jobs may use a pool (docs/security.md, "Running
//! public repositories safely"). The decision is `runway_core::access`'s;
//! this is the file's shape and its check.

use runway_core::access::{Access, AccessError, Forks};
use serde::{Deserialize, Serialize};

/// A pool's access policy as written. Every key is optional; a pool
/// without the table admits every job that its labels route to it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolAccess {
    /// Globs on `owner/name` (case-insensitive, `*` does not cross the
    /// `/`); a leading `!` excludes. Empty: any repository.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub repositories: Vec<String>,
    /// `allow` (the default) or `deny`: whether jobs of pull requests from
    /// forks may use the pool. `deny` looks each workflow run up once at
    /// GitHub; when it cannot, the job is refused (fail closed).
    pub forks: ForksSetting,
    /// The triggering events admitted (`push`, `pull_request`,
    /// `schedule`, …); absent: any. Looked up as `forks = "deny"` is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<String>>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ForksSetting {
    #[default]
    Allow,
    Deny,
}

impl PoolAccess {
    /// The policy, or what is wrong with it (its key relative to the
    /// table: `repositories[1]`, `events[0]`).
    pub fn build(&self) -> Result<Access, AccessError> {
        let forks = match self.forks {
            ForksSetting::Allow => Forks::Allow,
            ForksSetting::Deny => Forks::Deny,
        };
        Access::new(&self.repositories, forks, self.events.as_deref())
    }
}
