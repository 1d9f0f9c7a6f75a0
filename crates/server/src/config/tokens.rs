//! `[[server.tokens]]`: named API tokens with a role and the pools they
//! cover. `[server] admin_tokens` and `read_tokens` remain: an admin or a
//! read token of every pool, named by where it is read from.

use globset::{GlobBuilder, GlobMatcher};
use serde::{Deserialize, Serialize};

use crate::config::Secret;

/// What a token may do. Each role may do what the ones before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Read listings, jobs, runners, pools, logs.
    Read,
    /// Also submit, cancel and retry jobs, pause and resume pools, drain
    /// and terminate runners, mint registration tokens.
    Operate,
    /// Everything: also reload the configuration and change worker
    /// configurations.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Operate => "operate",
            Role::Admin => "admin",
        }
    }
}

/// One named token.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// What the audit trail and the console call its holder.
    pub name: String,
    /// The token (`env:NAME`, `file:PATH`, or the value).
    pub token: Secret,
    pub role: Role,
    /// Globs on pool names the token covers (default: every pool). It
    /// sees only their jobs, runners and pools, and may change only them.
    #[serde(default = "every_pool")]
    pub pools: Vec<String>,
}

fn every_pool() -> Vec<String> {
    vec!["*".to_owned()]
}

/// Which pools a caller covers.
#[derive(Debug, Clone)]
pub struct Scope {
    /// `None`: every pool.
    globs: Option<Vec<GlobMatcher>>,
}

impl PartialEq for Scope {
    fn eq(&self, other: &Scope) -> bool {
        let globs = |s: &Scope| {
            s.globs.as_ref().map(|g| {
                g.iter()
                    .map(|m| m.glob().glob().to_owned())
                    .collect::<Vec<_>>()
            })
        };
        globs(self) == globs(other)
    }
}

impl Eq for Scope {}

impl Scope {
    pub fn every_pool() -> Scope {
        Scope { globs: None }
    }

    /// The scope of `globs`; the index and reason of one that is not a
    /// glob.
    pub fn of(globs: &[String]) -> Result<Scope, (usize, String)> {
        if globs.iter().any(|g| g == "*") {
            return Ok(Scope::every_pool());
        }
        let mut matchers = Vec::with_capacity(globs.len());
        for (index, glob) in globs.iter().enumerate() {
            if glob.trim().is_empty() {
                return Err((index, "is empty".into()));
            }
            let matcher = GlobBuilder::new(glob)
                .case_insensitive(true)
                .build()
                .map_err(|e| (index, format!("{glob:?} is not a valid glob: {}", e.kind())))?
                .compile_matcher();
            matchers.push(matcher);
        }
        Ok(Scope {
            globs: Some(matchers),
        })
    }

    pub fn is_every_pool(&self) -> bool {
        self.globs.is_none()
    }

    /// Whether the scope covers pool `pool` (`None`: a job with no pool,
    /// unroutable — only an every-pool scope covers it).
    pub fn covers(&self, pool: Option<&str>) -> bool {
        match (&self.globs, pool) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(globs), Some(pool)) => globs.iter().any(|g| g.is_match(pool)),
        }
    }
}

impl super::Config {
    /// Part of [`super::Config::load`]'s validation: admin, read and scoped tokens, each long and distinct.
    pub(super) fn check_tokens(&self) -> Result<(), (String, String)> {
        if let Some(index) = self
            .server
            .admin_tokens
            .iter()
            .position(|s| s.expose().len() < 16)
        {
            return Err((
                format!("[server] admin_tokens[{index}]"),
                "is shorter than 16 characters; use a long random token".into(),
            ));
        }
        let mut token_names = std::collections::BTreeSet::new();
        for (i, token) in self.server.tokens.iter().enumerate() {
            let key = |field: &str| format!("[server] tokens[{i}].{field}");
            if token.name.trim().is_empty() {
                return Err((key("name"), "must not be empty".into()));
            }
            if !token_names.insert(token.name.as_str()) {
                return Err((
                    key("name"),
                    format!("duplicate token name {:?}", token.name),
                ));
            }
            if token.token.expose().len() < 16 {
                return Err((
                    key("token"),
                    "is shorter than 16 characters; use a long random token".into(),
                ));
            }
            if token.pools.is_empty() {
                return Err((
                    key("pools"),
                    "covers no pool; leave it out for every pool".into(),
                ));
            }
            Scope::of(&token.pools)
                .map_err(|(index, message)| (key(&format!("pools[{index}]")), message))?;
            for (index, glob) in token.pools.iter().enumerate() {
                let Ok(scope) = Scope::of(std::slice::from_ref(glob)) else {
                    continue;
                };
                if !self.pools.iter().any(|p| scope.covers(Some(&p.name))) {
                    return Err((
                        key(&format!("pools[{index}]")),
                        format!("{glob:?} names no configured pool"),
                    ));
                }
            }
        }
        let every_secret: Vec<&str> = self
            .server
            .admin_tokens
            .iter()
            .chain(&self.server.read_tokens)
            .chain(self.server.tokens.iter().map(|t| &t.token))
            .map(Secret::expose)
            .collect();
        if every_secret.len()
            != every_secret
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .len()
        {
            return Err((
                "[server] tokens".into(),
                "the same token appears twice (admin_tokens, read_tokens, tokens): each must be distinct".into(),
            ));
        }
        Ok(())
    }
}
