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
