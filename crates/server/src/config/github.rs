//! Where GitHub runners register and whose webhook deliveries runway heals,
//! as the config file names them.

/// Where runners register: an organisation or one repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Org(String),
    Repo { owner: String, name: String },
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
}

/// How the file writes a [`PoolGithub`]: `org = "NAME"` or `repo =
/// "owner/name"`, exactly one. Only serde sees it: the file's two keys
/// become one [`Target`] as they are read.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolGithubFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    org: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    repo: Option<String>,
    #[serde(default = "default_runner_group")]
    runner_group_id: u64,
}

fn default_runner_group() -> u64 {
    1
}

impl TryFrom<PoolGithubFile> for PoolGithub {
    type Error = String;

    fn try_from(file: PoolGithubFile) -> Result<PoolGithub, String> {
        let target = match (file.org, file.repo) {
            (Some(org), None) if !org.trim().is_empty() && !org.contains('/') => Target::Org(org),
            (Some(org), None) => return Err(format!("org: {org:?} is not an organisation name")),
            (None, Some(repo)) => match repo.split_once('/') {
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
            (Some(_), Some(_)) => return Err("org: give org or repo, not both".to_owned()),
            (None, None) => {
                return Err(
                    "org: missing: a GitHub pool needs org = \"NAME\" or repo = \"owner/name\""
                        .to_owned(),
                )
            }
        };
        Ok(PoolGithub {
            target,
            runner_group_id: file.runner_group_id,
        })
    }
}

impl From<PoolGithub> for PoolGithubFile {
    fn from(github: PoolGithub) -> PoolGithubFile {
        let (org, repo) = match github.target {
            Target::Org(org) => (Some(org), None),
            Target::Repo { owner, name } => (None, Some(format!("{owner}/{name}"))),
        };
        PoolGithubFile {
            org,
            repo,
            runner_group_id: github.runner_group_id,
        }
    }
}
