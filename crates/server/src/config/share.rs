//! `[pools.share]`: fair share within a pool (README, "Fair share"). The
//! rules are `runway_core::share`'s; this is the file's shape and check.

use std::collections::BTreeMap;

use runway_core::share::{Share, ShareError, ShareRules};
use serde::{Deserialize, Serialize};

/// A pool's fair-share settings as written. Without the table every key
/// weighs 1 and none is capped; the queue is still served fairly across
/// keys (a GitHub job's key is its repository, a runway-API job's its
/// submitter: the `tenant` it names, else its token's name).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct PoolShare {
    /// Key pattern (a glob, case-insensitive; `*` does not cross `/`) to
    /// weight (above 0): a key of weight 2 gets twice the hand-outs of a
    /// key of weight 1 while both have jobs queued. The most specific
    /// matching pattern counts.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub weights: BTreeMap<String, f64>,
    /// At most this many of a key's jobs provisioning or running in the
    /// pool at once; its other jobs wait (and, in a webhook-fed GitHub
    /// pool, start no runner).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_running: Option<u32>,
}

impl PoolShare {
    /// The rules, or what is wrong with them (the key relative to the
    /// table).
    pub fn build(&self) -> Result<ShareRules, ShareError> {
        ShareRules::new(&self.weights, self.max_running)
    }
}

/// The share of a job with key `key` in a pool with `share` settings
/// (checked when the configuration was loaded; a pool without them gives
/// weight 1).
pub fn share_of(share: Option<&PoolShare>, key: &str) -> Share {
    match share
        .filter(|s| !s.weights.is_empty())
        .map(PoolShare::build)
    {
        Some(Ok(rules)) => rules.share_of(key),
        _ => Share::new(key, Default::default()),
    }
}
