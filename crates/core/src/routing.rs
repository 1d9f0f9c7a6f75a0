//! Which pool serves a job, decided from labels alone.
//!
//! A pool can serve a job when every label of the job is one of the pool's
//! labels, compared case-insensitively (as GitHub matches `runs-on`). Among
//! several candidates the configured default pool wins, then the pool with
//! the fewest labels (the most specific fit), then configuration order.
//! So with flavor pools `small` and `large` that share base labels, a job
//! naming no flavor goes to the default pool and a job naming both has no pool.

use std::fmt;

/// A pool as routing sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolLabels {
    pub name: String,
    pub labels: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RoutingPolicy {
    /// Jobs lacking any of these are not ours (GitHub-hosted) and are ignored.
    pub required_labels: Vec<String>,
    /// Preferred when it is one of several pools that can serve a job.
    pub default_pool: Option<String>,
}

/// Why a job was not routed to a pool, as a stable code for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RejectReason {
    /// No configured pool has all of the job's labels.
    NoMatchingPool,
}

impl RejectReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::NoMatchingPool => "no_matching_pool",
        }
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteDecision {
    /// The job lacks a required label: it runs elsewhere (GitHub-hosted).
    Ignore {
        missing: Vec<String>,
    },
    Pool(String),
    Unroutable {
        reason: RejectReason,
        detail: String,
    },
}

fn contains(labels: &[String], label: &str) -> bool {
    labels.iter().any(|l| l.eq_ignore_ascii_case(label))
}

/// Routes a job with `job_labels` to one of `pools` under `policy`: the
/// first of [`candidates`].
pub fn route(job_labels: &[String], pools: &[PoolLabels], policy: &RoutingPolicy) -> RouteDecision {
    match candidates(job_labels, pools, policy) {
        Ok(mut pools) => RouteDecision::Pool(pools.swap_remove(0)),
        Err(decision) => decision,
    }
}

/// Every pool that can serve a job with `job_labels`, best first (the
/// default pool, then the fewest labels, then configuration order): where
/// an access policy refuses the first, the job goes on to the next. Never
/// empty; the decision instead when the job is not ours or no pool fits.
pub fn candidates(
    job_labels: &[String],
    pools: &[PoolLabels],
    policy: &RoutingPolicy,
) -> Result<Vec<String>, RouteDecision> {
    let missing: Vec<String> = policy
        .required_labels
        .iter()
        .filter(|required| !contains(job_labels, required))
        .cloned()
        .collect();
    if !missing.is_empty() {
        return Err(RouteDecision::Ignore { missing });
    }
    let mut fitting: Vec<(usize, &PoolLabels)> = pools
        .iter()
        .enumerate()
        .filter(|(_, pool)| job_labels.iter().all(|label| contains(&pool.labels, label)))
        .collect();
    if fitting.is_empty() {
        return Err(RouteDecision::Unroutable {
            reason: RejectReason::NoMatchingPool,
            detail: unroutable_detail(job_labels, pools),
        });
    }
    let default = policy.default_pool.as_deref();
    fitting.sort_by_key(|(order, pool)| {
        (
            Some(pool.name.as_str()) != default,
            pool.labels.len(),
            *order,
        )
    });
    Ok(fitting
        .into_iter()
        .map(|(_, pool)| pool.name.clone())
        .collect())
}

/// "no pool serves labels [..]; closest: pool `x` lacks [..]" — enough for a
/// user to see which label to fix.
fn unroutable_detail(job_labels: &[String], pools: &[PoolLabels]) -> String {
    let closest = pools
        .iter()
        .map(|pool| {
            let lacking: Vec<&str> = job_labels
                .iter()
                .filter(|label| !contains(&pool.labels, label))
                .map(String::as_str)
                .collect();
            (pool, lacking)
        })
        .min_by_key(|(_, lacking)| lacking.len());
    let labels = job_labels.join(", ");
    match closest {
        Some((pool, lacking)) => format!(
            "no pool serves labels [{labels}]; closest is pool {:?}, which lacks [{}]",
            pool.name,
            lacking.join(", ")
        ),
        None => format!("no pool serves labels [{labels}]; no pools are configured"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pools(spec: &[(&str, &[&str])]) -> Vec<PoolLabels> {
        spec.iter()
            .map(|(name, labels)| PoolLabels {
                name: (*name).to_owned(),
                labels: labels.iter().map(|l| (*l).to_owned()).collect(),
            })
            .collect()
    }

    fn check(job: &[&str], default_pool: Option<&str>, expected: &str) {
        let fleet = pools(&[
            ("small", &["self-hosted", "linux", "small"]),
            ("large", &["self-hosted", "linux", "large"]),
            ("base", &["self-hosted", "linux", "x64", "arm64"]),
            ("gpu", &["self-hosted", "linux", "gpu", "cuda"]),
        ]);
        let policy = RoutingPolicy {
            required_labels: vec!["self-hosted".into()],
            default_pool: default_pool.map(str::to_owned),
        };
        let labels: Vec<String> = job.iter().map(|l| (*l).to_owned()).collect();
        let got = match route(&labels, &fleet, &policy) {
            RouteDecision::Ignore { missing } => format!("ignore (missing {})", missing.join(",")),
            RouteDecision::Pool(pool) => format!("pool {pool}"),
            RouteDecision::Unroutable { reason, detail } => {
                format!("unroutable {reason}: {detail}")
            }
        };
        assert_eq!(got, expected, "labels {job:?}");
    }

    #[test]
    fn routing_table() {
        check(&["ubuntu-latest"], None, "ignore (missing self-hosted)");
        check(&["self-hosted", "linux", "large"], None, "pool large");
        check(&["SELF-HOSTED", "Linux", "Large"], None, "pool large");
        // No flavor: every pool fits; the fewest labels wins, then order.
        check(&["self-hosted", "linux"], None, "pool small");
        check(&["self-hosted"], Some("base"), "pool base");
        // The default only wins among candidates.
        check(&["self-hosted", "large"], Some("small"), "pool large");
        check(
            &["self-hosted", "small", "large"],
            None,
            "unroutable no_matching_pool: no pool serves labels [self-hosted, small, large]; \
             closest is pool \"small\", which lacks [large]",
        );
        check(
            &["self-hosted", "k8s"],
            None,
            "unroutable no_matching_pool: no pool serves labels [self-hosted, k8s]; \
             closest is pool \"small\", which lacks [k8s]",
        );
    }

    #[test]
    fn candidates_come_best_first() {
        let fleet = pools(&[
            ("trusted", &["self-hosted", "linux"]),
            ("untrusted", &["self-hosted", "linux"]),
            ("wide", &["self-hosted", "linux", "x64"]),
        ]);
        let labels = vec!["self-hosted".to_owned(), "linux".to_owned()];
        let order = |default: Option<&str>| {
            let policy = RoutingPolicy {
                required_labels: vec![],
                default_pool: default.map(str::to_owned),
            };
            candidates(&labels, &fleet, &policy).unwrap()
        };
        assert_eq!(order(None), ["trusted", "untrusted", "wide"]);
        assert_eq!(order(Some("wide")), ["wide", "trusted", "untrusted"]);
    }

    #[test]
    fn no_required_labels_and_no_pools() {
        let decision = route(&["x".to_owned()], &[], &RoutingPolicy::default());
        assert_eq!(
            decision,
            RouteDecision::Unroutable {
                reason: RejectReason::NoMatchingPool,
                detail: "no pool serves labels [x]; no pools are configured".into()
            }
        );
    }
}
