//! `[github]` (webhooks, credentials, the request budget, healing) and
//! where GitHub runners register and whose webhook deliveries runway
//! heals, as the config file names them.

use std::time::Duration;

use runway_providers::settings::duration;
use serde::{Deserialize, Serialize};

use crate::config::{Secret, DEFAULT_GITHUB_API};

/// Where runners register: an organisation, one repository, or (scale
/// sets and JIT runners alike) an enterprise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Org(String),
    Repo { owner: String, name: String },
    Enterprise(String),
}

impl Target {
    /// The web address of the organisation, repository or enterprise
    /// (GitHub's "config URL") whose REST API is `api_url`: github.com
    /// and GHE.com serve it at `https://api.HOST`, a GitHub Enterprise
    /// Server at `https://HOST/api/v3` (as GitHub's own scale-set client
    /// maps the two).
    pub fn web_url(&self, api_url: &str) -> String {
        let api = api_url.trim_end_matches('/');
        let web = if api.is_empty() {
            "https://github.com".to_owned()
        } else if let Some(server) = api.strip_suffix("/api/v3") {
            server.to_owned()
        } else {
            match api.split_once("://") {
                Some((scheme, host)) if host.starts_with("api.") && !host.contains('/') => {
                    format!("{scheme}://{}", &host["api.".len()..])
                }
                _ => api.to_owned(),
            }
        };
        match self {
            Target::Org(org) => format!("{web}/{org}"),
            Target::Repo { owner, name } => format!("{web}/{owner}/{name}"),
            Target::Enterprise(slug) => format!("{web}/enterprises/{slug}"),
        }
    }
}

/// Whose webhook deliveries runway heals: the App's, or an organisation's or
/// repository's hook. Written `app`, `orgs/ORG/hooks/ID` or
/// `repos/OWNER/NAME/hooks/ID`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hook {
    App,
    Org {
        org: String,
        hook_id: u64,
    },
    Repo {
        owner: String,
        name: String,
        hook_id: u64,
    },
}

impl Hook {
    /// The REST path of the hook's deliveries.
    pub fn deliveries_path(&self) -> String {
        match self {
            Hook::App => "/app/hook/deliveries".to_owned(),
            Hook::Org { org, hook_id } => format!("/orgs/{org}/hooks/{hook_id}/deliveries"),
            Hook::Repo {
                owner,
                name,
                hook_id,
            } => format!("/repos/{owner}/{name}/hooks/{hook_id}/deliveries"),
        }
    }
}

impl std::fmt::Display for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Hook::App => f.write_str("app"),
            Hook::Org { org, hook_id } => write!(f, "orgs/{org}/hooks/{hook_id}"),
            Hook::Repo {
                owner,
                name,
                hook_id,
            } => write!(f, "repos/{owner}/{name}/hooks/{hook_id}"),
        }
    }
}

impl std::str::FromStr for Hook {
    type Err = String;
    fn from_str(text: &str) -> Result<Hook, String> {
        let parts: Vec<&str> = text.trim_matches('/').split('/').collect();
        let id = |id: &str| id.parse::<u64>().ok().filter(|id| *id > 0);
        let named = |part: &&str| !part.is_empty();
        match parts.as_slice() {
            ["app"] => Ok(Hook::App),
            ["orgs", org, "hooks", hook_id] if named(org) => match id(hook_id) {
                Some(hook_id) => Ok(Hook::Org {
                    org: (*org).to_owned(),
                    hook_id,
                }),
                None => Err(format!("{hook_id:?} is not a hook id")),
            },
            ["repos", owner, name, "hooks", hook_id] if named(owner) && named(name) => {
                match id(hook_id) {
                    Some(hook_id) => Ok(Hook::Repo {
                        owner: (*owner).to_owned(),
                        name: (*name).to_owned(),
                        hook_id,
                    }),
                    None => Err(format!("{hook_id:?} is not a hook id")),
                }
            }
            _ => Err(format!(
                "{text:?} is not \"app\", \"orgs/ORG/hooks/ID\" or \"repos/OWNER/NAME/hooks/ID\""
            )),
        }
    }
}

impl serde::Serialize for Hook {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        runway_providers::settings::text::serialize(self, serializer)
    }
}

impl<'de> serde::Deserialize<'de> for Hook {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Hook, D::Error> {
        runway_providers::settings::text::deserialize(deserializer)
    }
}

/// `[pools.github]`: where a GitHub pool's runners register.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "PoolGithubFile", into = "PoolGithubFile")]
pub struct PoolGithub {
    pub target: Target,
    /// The runner group new runners join (1: the default group).
    pub runner_group_id: u64,
    /// A runner scale set the pool learns its jobs from (GitHub's message
    /// queue, `docs/github.md`), by name; `None`: webhooks only.
    pub scale_set: Option<String>,
    /// The scale set's runner group by name, instead of `runner_group_id`.
    pub runner_group: Option<String>,
}

/// How the file writes a [`PoolGithub`]: `org = "NAME"`, `repo =
/// "owner/name"` or `enterprise = "SLUG"`, exactly one. Only serde sees
/// it: the file's keys become one [`Target`] as they are read.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolGithubFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    org: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    repo: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    enterprise: Option<String>,
    #[serde(default = "default_runner_group")]
    runner_group_id: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scale_set: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    runner_group: Option<String>,
}

fn default_runner_group() -> u64 {
    1
}

impl TryFrom<PoolGithubFile> for PoolGithub {
    type Error = String;

    fn try_from(file: PoolGithubFile) -> Result<PoolGithub, String> {
        let target = match (file.org, file.repo, file.enterprise) {
            (Some(org), None, None) if !org.trim().is_empty() && !org.contains('/') => {
                Target::Org(org)
            }
            (Some(org), None, None) => {
                return Err(format!("org: {org:?} is not an organisation name"))
            }
            (None, Some(repo), None) => match repo.split_once('/') {
                Some((owner, name))
                    if !owner.is_empty() && !name.is_empty() && !name.contains('/') =>
                {
                    Target::Repo {
                        owner: owner.to_owned(),
                        name: name.to_owned(),
                    }
                }
                _ => return Err(format!("repo: {repo:?} is not owner/name")),
            },
            (None, None, Some(slug)) if !slug.trim().is_empty() && !slug.contains('/') => {
                Target::Enterprise(slug)
            }
            (None, None, Some(slug)) => {
                return Err(format!("enterprise: {slug:?} is not an enterprise slug"))
            }
            (None, None, None) => {
                return Err(
                    "org: missing: a GitHub pool needs org = \"NAME\", repo = \"owner/name\" or enterprise = \"SLUG\""
                        .to_owned(),
                )
            }
            _ => return Err("org: give one of org, repo and enterprise".to_owned()),
        };
        let named = |key: &str, value: Option<String>| match value {
            Some(text) if text.trim().is_empty() => Err(format!("{key}: must not be empty")),
            other => Ok(other),
        };
        let scale_set = named("scale_set", file.scale_set)?;
        if scale_set
            .as_deref()
            .is_some_and(|name| name.len() > 45 || name.contains(['/', ',']))
        {
            // GitHub's own limits on a scale set's name, which is also
            // the label workflows target.
            return Err("scale_set: at most 45 characters, without \"/\" or \",\"".to_owned());
        }
        let runner_group = named("runner_group", file.runner_group)?;
        if runner_group.is_some() && scale_set.is_none() {
            return Err(
                "runner_group: names a scale set's runner group; without scale_set use runner_group_id"
                    .to_owned(),
            );
        }
        Ok(PoolGithub {
            target,
            runner_group_id: file.runner_group_id,
            scale_set,
            runner_group,
        })
    }
}

impl From<PoolGithub> for PoolGithubFile {
    fn from(github: PoolGithub) -> PoolGithubFile {
        let (org, repo, enterprise) = match github.target {
            Target::Org(org) => (Some(org), None, None),
            Target::Repo { owner, name } => (None, Some(format!("{owner}/{name}")), None),
            Target::Enterprise(slug) => (None, None, Some(slug)),
        };
        PoolGithubFile {
            org,
            repo,
            enterprise,
            runner_group_id: github.runner_group_id,
            scale_set: github.scale_set,
            runner_group: github.runner_group,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Target;

    #[test]
    fn the_web_address_follows_the_api_address() {
        let org = Target::Org("acme".into());
        for (api, web) in [
            ("https://api.github.com", "https://github.com/acme"),
            ("https://api.github.com/", "https://github.com/acme"),
            ("https://api.octo.ghe.com", "https://octo.ghe.com/acme"),
            (
                "https://ghe.example.com/api/v3",
                "https://ghe.example.com/acme",
            ),
            ("http://127.0.0.1:9/api/v3", "http://127.0.0.1:9/acme"),
            ("", "https://github.com/acme"),
        ] {
            assert_eq!(org.web_url(api), web, "{api}");
        }
        assert_eq!(
            Target::Enterprise("big".into()).web_url("https://api.github.com"),
            "https://github.com/enterprises/big"
        );
        let repo = Target::Repo {
            owner: "o".into(),
            name: "r".into(),
        };
        assert_eq!(
            repo.web_url("https://ghe.example.com/api/v3"),
            "https://ghe.example.com/o/r"
        );
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct GithubConfig {
    /// Secrets a webhook signature may be made with; several, so a secret
    /// can be rotated without downtime. None configured: webhooks are refused.
    pub webhook_secrets: Vec<Secret>,
    /// Jobs lacking any of these labels are GitHub-hosted and ignored.
    pub required_labels: Vec<String>,
    /// Larger webhook bodies are refused with 413 (GitHub's own cap is 25 MiB).
    pub max_body_bytes: usize,
    /// The REST API's root: `https://api.github.com`, or a GitHub
    /// Enterprise Server's `https://HOST/api/v3`.
    pub api_url: String,
    /// A token to authenticate with (or the App's three keys below; see
    /// [`GithubConfig::auth`]). Neither: GitHub pools are refused and no
    /// re-checks or redeliveries happen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<Secret>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub app_id: Option<u64>,
    /// The App's PEM private key (RS256).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub private_key: Option<Secret>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub installation_id: Option<u64>,
    /// Runway's own cap on API requests per hour, below GitHub's.
    pub max_requests_per_hour: u32,
    /// A GitHub job queued this long is looked up in case its webhook was lost.
    #[serde(with = "duration")]
    pub recheck_after: Duration,
    /// How often failed webhook deliveries are listed and redelivered.
    #[serde(with = "duration")]
    pub redeliver_interval: Duration,
    /// How long a job is held when a pool serving its labels needs facts
    /// of its workflow run (a fork? what event?) that GitHub cannot give:
    /// the run is looked up again with backoff meanwhile, and the job is
    /// given up as `unroutable` after this long. Never zero.
    #[serde(with = "duration")]
    pub run_facts_wait: Duration,
    /// Whose webhook deliveries to heal; default: the App's when
    /// authenticating as an App, none otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deliveries: Option<Hook>,
}

impl Default for GithubConfig {
    fn default() -> GithubConfig {
        GithubConfig {
            webhook_secrets: Vec::new(),
            required_labels: vec!["self-hosted".to_owned()],
            max_body_bytes: 25 * 1024 * 1024,
            api_url: DEFAULT_GITHUB_API.to_owned(),
            token: None,
            app_id: None,
            private_key: None,
            installation_id: None,
            max_requests_per_hour: 3000,
            recheck_after: Duration::from_secs(300),
            redeliver_interval: Duration::from_secs(300),
            run_facts_wait: Duration::from_secs(6 * 3600),
            deliveries: None,
        }
    }
}

/// How runway authenticates to GitHub's API.
#[derive(Debug, Clone, PartialEq)]
pub enum GithubAuth {
    Token(Secret),
    App {
        app_id: u64,
        /// The App's PEM private key (RS256).
        private_key: Secret,
        installation_id: u64,
    },
}

impl GithubConfig {
    /// `token`, or the App's `app_id` + `private_key` + `installation_id`
    /// (loading refuses both, or a part of the App's).
    pub fn auth(&self) -> Option<GithubAuth> {
        if let Some(token) = &self.token {
            return Some(GithubAuth::Token(token.clone()));
        }
        match (self.app_id, &self.private_key, self.installation_id) {
            (Some(app_id), Some(private_key), Some(installation_id)) => Some(GithubAuth::App {
                app_id,
                private_key: private_key.clone(),
                installation_id,
            }),
            _ => None,
        }
    }

    /// Authenticate with `auth` from now on (for programs that build a
    /// configuration in code).
    pub fn set_auth(&mut self, auth: GithubAuth) {
        (
            self.token,
            self.app_id,
            self.private_key,
            self.installation_id,
        ) = match auth {
            GithubAuth::Token(token) => (Some(token), None, None, None),
            GithubAuth::App {
                app_id,
                private_key,
                installation_id,
            } => (None, Some(app_id), Some(private_key), Some(installation_id)),
        };
    }

    /// `[github] token` or the App's three keys; never both, never a part.
    pub(crate) fn check_auth(&self) -> Result<(), (String, String)> {
        let app = [
            self.app_id.is_some(),
            self.private_key.is_some(),
            self.installation_id.is_some(),
        ];
        if self.token.is_some() && app.contains(&true) {
            return Err((
                "[github] token".to_owned(),
                "give either token or the App's app_id, private_key and installation_id, not both"
                    .to_owned(),
            ));
        }
        if app.contains(&true) && app.contains(&false) {
            let missing = ["app_id", "private_key", "installation_id"]
                [app.iter().position(|given| !given).unwrap_or(0)];
            return Err((
                format!("[github] {missing}"),
                "missing: authenticating as a GitHub App needs app_id, private_key and installation_id".to_owned(),
            ));
        }
        Ok(())
    }
}

impl super::Config {
    /// Part of [`super::Config::load`]'s validation: GitHub credentials and what needs them.
    pub(super) fn check_github(&self) -> Result<(), (String, String)> {
        let auth = self.github.auth();
        if let Some(GithubAuth::Token(token)) = &auth {
            if token.expose().trim().is_empty() {
                return Err(("[github] token".into(), "is empty".into()));
            }
        }
        if let Some(GithubAuth::App { private_key, .. }) = &auth {
            jsonwebtoken::EncodingKey::from_rsa_pem(private_key.expose().as_bytes()).map_err(
                |e| {
                    (
                        "[github] private_key".to_owned(),
                        format!("not an RSA private key in PEM form ({e})"),
                    )
                },
            )?;
        }
        if self.github.deliveries.is_some() && auth.is_none() {
            return Err((
                "[github] deliveries".into(),
                "redelivering webhooks needs [github] token or App credentials".into(),
            ));
        }
        if matches!(self.github.deliveries, Some(crate::config::Hook::App))
            && !matches!(auth, Some(GithubAuth::App { .. }))
        {
            return Err((
                "[github] deliveries".into(),
                "\"app\" (the App's webhook) needs App credentials (app_id, private_key, installation_id)".into(),
            ));
        }
        Ok(())
    }
}
