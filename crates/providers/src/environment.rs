//! The environment of every process runway starts: a clean one.
//!
//! runway's own environment holds its secrets (`env:` admin tokens, webhook
//! secrets, the GitHub token, the database URL). A child that inherited it
//! — a runner, and through it every job, or a third-party provider
//! executable — could read them and take runway over. So a child starts
//! from nothing and gets only:
//!
//! - the **base**: [`BASE`] (`PATH`, `HOME`, `LANG`, `LC_ALL`, `TMPDIR`,
//!   `TZ`, and the proxy variables in both spellings), where set;
//! - the host variables the provider's `environment_variables` allow-list
//!   names, each entry a name or a prefix (`"AWS_"` passes every `AWS_*`),
//!   as GARM reads the same key (cloudbase/garm `config/external.go`);
//! - what the caller adds for that child (the bootstrap variables, GARM's
//!   `GARM_*`, a job's `RUNWAY_JOB_*`).
//!
//! runway's own variables (`RUNWAY_*`) and GARM's (`GARM_*`) are never taken
//! from the host, whatever the allow-list says: `RUNWAY_DATABASE_URL` or an
//! inherited `RUNWAY_REGISTRATION_TOKEN` must not pass because someone
//! allowed the prefix `RUNWAY`.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};

/// The host variables every child gets when they are set: what a program
/// needs to find others, write temporary files, speak the user's language
/// and reach the network through the site's proxy.
pub const BASE: &[&str] = &[
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "TZ",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
];

/// Host variables no allow-list can pass on: runway's and GARM's own.
const NEVER_INHERITED: &[&str] = &["RUNWAY_", "GARM_"];

/// What a child inherits from `host`: the base and what `allow` names
/// (exact names or prefixes), never a `RUNWAY_*` or `GARM_*` variable.
/// Pure, so it is tested on a made-up host.
pub fn inherited<I>(host: I, allow: &[String]) -> BTreeMap<OsString, OsString>
where
    I: IntoIterator<Item = (OsString, OsString)>,
{
    host.into_iter()
        .filter(|(name, _)| {
            let Some(name) = name.to_str() else {
                return false;
            };
            if NEVER_INHERITED.iter().any(|p| name.starts_with(p)) {
                return false;
            }
            BASE.contains(&name)
                || allow
                    .iter()
                    .any(|entry| !entry.is_empty() && name.starts_with(entry.as_str()))
        })
        .collect()
}

/// The same, from this process's environment now.
pub fn inherited_from_host(allow: &[String]) -> BTreeMap<OsString, OsString> {
    inherited(std::env::vars_os(), allow)
}

/// Gives `command` a clean environment: the inherited variables of
/// [`inherited_from_host`] and then `own` (which wins over a host variable
/// of the same name).
pub fn set_clean<K, V>(
    command: &mut tokio::process::Command,
    allow: &[String],
    own: impl IntoIterator<Item = (K, V)>,
) where
    K: AsRef<OsStr>,
    V: AsRef<OsStr>,
{
    command.env_clear();
    command.envs(inherited_from_host(allow));
    command.envs(own);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect()
    }

    fn names(map: &BTreeMap<OsString, OsString>) -> Vec<String> {
        map.keys()
            .map(|k| k.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn only_the_base_and_the_allow_list_pass() {
        let host = host(&[
            ("PATH", "/usr/bin"),
            ("HOME", "/root"),
            ("https_proxy", "http://proxy:3128"),
            ("MY_ADMIN", "rwa_secret"),
            ("MY_HOOK_SECRET", "hook"),
            ("GITHUB_TOKEN", "ghp_x"),
            ("AWS_REGION", "eu-west-1"),
            ("AWS_PROFILE", "ci"),
            ("AZURE_CLIENT_ID", "id"),
            ("RUNWAY_DATABASE_URL", "postgres://u:p@db/r"),
            ("RUNWAY_REGISTRATION_TOKEN", "rwr_x"),
            ("GARM_COMMAND", "CreateInstance"),
        ]);
        let allow = vec!["AWS_".to_owned(), "AZURE_CLIENT_ID".to_owned()];
        assert_eq!(
            names(&inherited(host.clone(), &allow)),
            [
                "AWS_PROFILE",
                "AWS_REGION",
                "AZURE_CLIENT_ID",
                "HOME",
                "PATH",
                "https_proxy"
            ]
        );
        assert_eq!(
            names(&inherited(host.clone(), &[])),
            ["HOME", "PATH", "https_proxy"]
        );
        // An allow-list cannot open runway's or GARM's own variables, and
        // an empty entry is not "every variable".
        let greedy = vec!["RUNWAY".to_owned(), "GARM_".to_owned(), String::new()];
        assert_eq!(
            names(&inherited(host, &greedy)),
            ["HOME", "PATH", "https_proxy"]
        );
    }
}
