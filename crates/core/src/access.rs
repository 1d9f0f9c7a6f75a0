//! Who may use a pool: its access policy, judged against the facts of a
//! job's run (its repository, the event that triggered it, whether it comes
//! from a fork), and the routing that goes on to the next pool serving the
//! job's labels when one refuses it. Pure: the facts are looked up at the
//! edge (`runway_server::github`), the decision is made here.

use std::fmt;

use globset::{GlobBuilder, GlobMatcher};

/// Whether a pool takes jobs of pull requests from forks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Forks {
    /// Any run, whatever its head repository (runway's behaviour before
    /// access policies, and GitHub's for a runner group that allows public
    /// repositories).
    #[default]
    Allow,
    /// Only runs whose head repository is the repository itself. A run
    /// whose origin cannot be learned is refused (fail closed).
    Deny,
}

/// One repository pattern: a glob on `owner/name`, case-insensitive, `*`
/// not crossing the `/`; with a leading `!` it excludes.
#[derive(Debug, Clone)]
struct Pattern {
    text: String,
    exclude: bool,
    matcher: GlobMatcher,
}

/// A pool's access policy. The default admits every job.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// Empty: any repository.
    repositories: Vec<Pattern>,
    pub forks: Forks,
    /// Triggering events admitted (`push`, `pull_request`, `schedule`, …);
    /// `None`: any.
    events: Option<Vec<String>>,
}

/// Why an access policy cannot be built: the index of the bad entry and
/// what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    #[error("repositories[{index}]: {pattern:?} is not a valid pattern: {reason}")]
    BadPattern {
        index: usize,
        pattern: String,
        reason: String,
    },
    #[error("events[{index}]: {event:?} is not an event name (lowercase letters and `_`)")]
    BadEvent { index: usize, event: String },
    #[error("events: an empty list admits no job; leave it out to admit every event")]
    NoEvents,
}

/// What is known of a job's run. `None`: not known (not looked up yet, or
/// the lookup failed).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunFacts {
    /// `owner/name`.
    pub repository: Option<String>,
    /// The triggering event.
    pub event: Option<String>,
    /// Whether the run's head repository is another than its repository.
    pub fork: Option<bool>,
}

/// The rule of a policy that refused a job, as a stable metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    Repository,
    Fork,
    Event,
}

impl Rule {
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::Repository => "repository",
            Rule::Fork => "fork",
            Rule::Event => "event",
        }
    }
}

/// A policy's answer for one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    Refused { rule: Rule, detail: String },
}

impl Verdict {
    pub fn allowed(&self) -> bool {
        matches!(self, Verdict::Allowed)
    }
}

fn event_name(event: &str) -> bool {
    !event.is_empty() && event.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
}

impl Access {
    /// Builds a policy from its configuration: repository patterns (a `!`
    /// first excludes), fork rule and, optionally, the events admitted.
    pub fn new(
        repositories: &[String],
        forks: Forks,
        events: Option<&[String]>,
    ) -> Result<Access, AccessError> {
        let mut patterns = Vec::with_capacity(repositories.len());
        for (index, text) in repositories.iter().enumerate() {
            let (exclude, glob) = match text.strip_prefix('!') {
                Some(rest) => (true, rest),
                None => (false, text.as_str()),
            };
            let bad = |reason: &str| AccessError::BadPattern {
                index,
                pattern: text.clone(),
                reason: reason.to_owned(),
            };
            if glob.matches('/').count() != 1 {
                return Err(bad(
                    "it must be owner/name (one `/`; globs allowed on each side)",
                ));
            }
            let valid_char = |c: char| c.is_ascii_alphanumeric() || "-_.*?/[]!".contains(c);
            if glob.chars().any(|c| !valid_char(c)) {
                return Err(bad(
                    "only letters, digits, `-`, `_`, `.` and the glob characters `*?[]` may appear",
                ));
            }
            let matcher = GlobBuilder::new(glob)
                .literal_separator(true)
                .case_insensitive(true)
                .build()
                .map_err(|e| bad(&e.kind().to_string()))?
                .compile_matcher();
            patterns.push(Pattern {
                text: text.clone(),
                exclude,
                matcher,
            });
        }
        if let Some(events) = events {
            if events.is_empty() {
                return Err(AccessError::NoEvents);
            }
            if let Some((index, event)) = events.iter().enumerate().find(|(_, e)| !event_name(e)) {
                return Err(AccessError::BadEvent {
                    index,
                    event: event.clone(),
                });
            }
        }
        Ok(Access {
            repositories: patterns,
            forks,
            events: events.map(<[String]>::to_vec),
        })
    }

    /// Whether the policy admits every job (nothing to look up).
    pub fn admits_all(&self) -> bool {
        self.repositories.is_empty() && self.forks == Forks::Allow && self.events.is_none()
    }

    /// Whether judging needs the run's event or origin, which a
    /// `workflow_job` payload does not carry.
    pub fn needs_run_facts(&self) -> bool {
        self.forks == Forks::Deny || self.events.is_some()
    }

    /// Judges a job by its run's facts. Unknown facts refuse where a rule
    /// needs them (fail closed); a policy with no rule on a fact never
    /// asks for it.
    pub fn judge(&self, facts: &RunFacts) -> Verdict {
        if !self.repositories.is_empty() {
            let Some(repository) = facts.repository.as_deref() else {
                return Verdict::Refused {
                    rule: Rule::Repository,
                    detail: "the job's repository is not known".to_owned(),
                };
            };
            let excluded = self
                .repositories
                .iter()
                .find(|p| p.exclude && p.matcher.is_match(repository));
            if let Some(pattern) = excluded {
                return Verdict::Refused {
                    rule: Rule::Repository,
                    detail: format!("repository {repository} is excluded by {:?}", pattern.text),
                };
            }
            let includes: Vec<&Pattern> = self.repositories.iter().filter(|p| !p.exclude).collect();
            if !includes.is_empty() && !includes.iter().any(|p| p.matcher.is_match(repository)) {
                let listed: Vec<&str> = includes.iter().map(|p| p.text.as_str()).collect();
                return Verdict::Refused {
                    rule: Rule::Repository,
                    detail: format!("repository {repository} is not in {listed:?}"),
                };
            }
        }
        if self.forks == Forks::Deny {
            match facts.fork {
                Some(false) => {}
                Some(true) => {
                    return Verdict::Refused {
                        rule: Rule::Fork,
                        detail: "the run comes from a fork and the pool denies forks".to_owned(),
                    }
                }
                None => {
                    return Verdict::Refused {
                        rule: Rule::Fork,
                        detail: "whether the run comes from a fork is not known (its workflow run could not be looked up) and the pool denies forks".to_owned(),
                    }
                }
            }
        }
        if let Some(events) = &self.events {
            match facts.event.as_deref() {
                Some(event) if events.iter().any(|e| e == event) => {}
                Some(event) => {
                    return Verdict::Refused {
                        rule: Rule::Event,
                        detail: format!("event {event} is not in {events:?}"),
                    }
                }
                None => {
                    return Verdict::Refused {
                        rule: Rule::Event,
                        detail: format!(
                            "the run's triggering event is not known (its workflow run could not be looked up) and the pool admits only {events:?}"
                        ),
                    }
                }
            }
        }
        Verdict::Allowed
    }
}

/// A pool refused a job: which, by which rule, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub pool: String,
    pub rule: Rule,
    pub detail: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pool {:?} refuses it: {}", self.pool, self.detail)
    }
}

/// Among `candidates` (the pools serving a job's labels, best first), the
/// first whose policy admits the job, and the refusals of those before it.
/// `None` when every candidate refuses.
pub fn first_admitting<'a>(
    candidates: &[(&'a str, &Access)],
    facts: &RunFacts,
) -> (Option<&'a str>, Vec<Refusal>) {
    let mut refusals = Vec::new();
    for (pool, access) in candidates {
        match access.judge(facts) {
            Verdict::Allowed => return (Some(pool), refusals),
            Verdict::Refused { rule, detail } => refusals.push(Refusal {
                pool: (*pool).to_owned(),
                rule,
                detail,
            }),
        }
    }
    (None, refusals)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn facts(repository: &str, event: Option<&str>, fork: Option<bool>) -> RunFacts {
        RunFacts {
            repository: Some(repository.to_owned()),
            event: event.map(str::to_owned),
            fork,
        }
    }

    #[test]
    fn repositories_forks_and_events_are_judged_as_written() {
        let trusted = Access::new(
            &strings(&["octo-org/*", "!octo-org/secret-*", "friends/tool"]),
            Forks::Deny,
            Some(&strings(&["push", "schedule", "pull_request"])),
        )
        .unwrap();
        let cases: [(RunFacts, Option<Rule>); 10] = [
            (facts("octo-org/app", Some("push"), Some(false)), None),
            (facts("Octo-Org/App", Some("push"), Some(false)), None),
            (facts("friends/tool", Some("schedule"), Some(false)), None),
            (
                facts("octo-org/secret-keys", Some("push"), Some(false)),
                Some(Rule::Repository),
            ),
            (
                facts("other/app", Some("push"), Some(false)),
                Some(Rule::Repository),
            ),
            // `*` does not cross the `/`.
            (
                facts("octo-org/app/x", Some("push"), Some(false)),
                Some(Rule::Repository),
            ),
            (
                facts("octo-org/app", Some("pull_request"), Some(true)),
                Some(Rule::Fork),
            ),
            (
                facts("octo-org/app", Some("pull_request"), None),
                Some(Rule::Fork),
            ),
            (
                facts("octo-org/app", Some("workflow_dispatch"), Some(false)),
                Some(Rule::Event),
            ),
            (facts("octo-org/app", None, Some(false)), Some(Rule::Event)),
        ];
        for (facts, refused_by) in cases {
            let verdict = trusted.judge(&facts);
            let rule = match &verdict {
                Verdict::Allowed => None,
                Verdict::Refused { rule, .. } => Some(*rule),
            };
            assert_eq!(rule, refused_by, "{facts:?}: {verdict:?}");
        }
        let unknown = RunFacts::default();
        assert!(matches!(
            trusted.judge(&unknown),
            Verdict::Refused {
                rule: Rule::Repository,
                ..
            }
        ));
    }

    #[test]
    fn the_default_policy_admits_all_and_needs_no_lookup() {
        let open = Access::default();
        assert!(open.admits_all() && !open.needs_run_facts());
        assert_eq!(open.judge(&RunFacts::default()), Verdict::Allowed);
        let only_excluding =
            Access::new(&strings(&["!octo-org/secret"]), Forks::Allow, None).unwrap();
        assert!(only_excluding
            .judge(&facts("anyone/else", None, None))
            .allowed());
        assert!(!only_excluding.needs_run_facts());
    }

    #[test]
    fn bad_policies_name_the_entry() {
        for (repositories, events, expected) in [
            (vec!["octo-org"], None, "repositories[0]"),
            (vec!["a/b", "a/b/c"], None, "repositories[1]"),
            (vec!["a/[b"], None, "repositories[0]"),
            (vec!["a/b c"], None, "repositories[0]"),
            (vec!["a/b"], Some(vec!["Push"]), "events[0]"),
            (vec!["a/b"], Some(vec![]), "events"),
        ] {
            let events = events.map(|e| strings(&e));
            let error = Access::new(&strings(&repositories), Forks::Allow, events.as_deref())
                .expect_err("refused");
            assert!(error.to_string().starts_with(expected), "{error}");
        }
    }

    #[test]
    fn routing_goes_on_to_the_first_pool_that_admits() {
        let trusted = Access::new(&strings(&["octo-org/*"]), Forks::Deny, None).unwrap();
        let untrusted = Access::default();
        let candidates = [("trusted", &trusted), ("untrusted", &untrusted)];
        let fork = facts("octo-org/app", Some("pull_request"), Some(true));
        let (pool, refusals) = first_admitting(&candidates, &fork);
        assert_eq!(pool, Some("untrusted"));
        assert_eq!(refusals.len(), 1);
        assert_eq!(refusals[0].rule, Rule::Fork);
        let own = facts("octo-org/app", Some("push"), Some(false));
        assert_eq!(
            first_admitting(&candidates, &own),
            (Some("trusted"), vec![])
        );
        let (none, refusals) = first_admitting(&candidates[..1], &fork);
        assert_eq!(none, None);
        assert_eq!(
            refusals[0].to_string(),
            "pool \"trusted\" refuses it: the run comes from a fork and the pool denies forks"
        );
    }
}
