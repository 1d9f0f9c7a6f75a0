//! `runway sim --tune`: the cost-versus-mean-wait frontier of the
//! predictive policy on the operator's own trace, so a setting is picked
//! from their data, not from a default. The predictive policy is run at a
//! sweep of quantiles (each the newsvendor quantile of a `wait_value`,
//! `runway_core::forecast::quantile_for`), beside the reactive policy
//! (`runway`) and the oracle (perfect foresight: the floor). A setting is
//! on the frontier when no other setting is as cheap and waits less, or
//! waits as little and is cheaper.
//!
//! The pick: the cheapest setting whose mean wait closes at least 90% of
//! the gap between the reactive policy and the oracle ("within 10% of the
//! oracle", measured on that gap, since the oracle's own mean wait is
//! often zero) at no more than 1.3× the reactive cost; when none does,
//! the report says so and names the closest one within the cost.
//!
//! Pure: it reads summaries, it runs nothing.

use crate::report::Summary;

/// The quantiles swept: the defaults' neighbourhood densely, the ends
/// sparsely.
pub const QUANTILES: [f64; 12] = [
    0.05, 0.2, 0.33, 0.45, 0.5, 0.56, 0.6, 0.67, 0.75, 0.85, 0.9, 0.95,
];

/// How much more than the reactive policy the pick may cost.
pub const COST_LIMIT: f64 = 1.3;
/// The share of the reactive-to-oracle gap in mean wait the pick must close.
pub const GAP_CLOSED: f64 = 0.9;

/// The policies a sweep runs: reactive, oracle, and predictive at each of
/// [`QUANTILES`].
pub fn policies() -> Vec<String> {
    let mut names = vec!["runway".to_owned(), "oracle".to_owned()];
    names.extend(QUANTILES.iter().map(|q| format!("predictive:{q}")));
    names
}

/// The `wait_value` whose newsvendor quantile is `quantile` (the inverse
/// of `quantile_for`: q = 1 − 1/(w + ½)).
pub fn wait_value_for(quantile: f64) -> f64 {
    1.0 / (1.0 - quantile.clamp(0.0, 0.999)) - 0.5
}

/// One setting's point on the plane.
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    pub policy: String,
    /// The predictive quantile (none for the reactive policy and the oracle).
    pub quantile: Option<f64>,
    pub mean_wait_s: f64,
    pub p95_wait_s: f64,
    pub cost: f64,
    pub idle_runner_hours: f64,
    pub on_frontier: bool,
}

impl Point {
    /// What an operator writes in the pool's config to get this point.
    pub fn setting(&self) -> String {
        match (self.policy.as_str(), self.quantile) {
            ("runway", _) => "policy = \"runway\" (reactive)".to_owned(),
            ("oracle", _) => "oracle (perfect foresight, not a setting)".to_owned(),
            (_, Some(q)) => format!(
                "policy = \"predictive\", wait_value = {:.2} (quantile {q})",
                wait_value_for(q)
            ),
            (other, None) => other.to_owned(),
        }
    }
}

/// What a sweep found.
#[derive(Debug, Clone, PartialEq)]
pub struct Tuning {
    /// Every setting, reactive and oracle first, then by quantile.
    pub points: Vec<Point>,
    /// The cheapest predictive setting that closes [`GAP_CLOSED`] of the
    /// wait gap within [`COST_LIMIT`]; `None`: none does.
    pub pick: Option<Point>,
    /// Without a pick: the predictive setting within the cost limit that
    /// waits least.
    pub closest: Option<Point>,
}

/// The frontier and the pick of a sweep's summaries (from [`policies`]).
pub fn tune(summaries: &[Summary]) -> Tuning {
    let quantile_of = |policy: &str| {
        policy
            .strip_prefix("predictive:")
            .and_then(|q| q.parse::<f64>().ok())
    };
    let mut points: Vec<Point> = summaries
        .iter()
        .map(|s| Point {
            policy: s.policy.clone(),
            quantile: quantile_of(&s.policy),
            mean_wait_s: s.queue_mean_s,
            p95_wait_s: s.queue_p95_s,
            cost: s.cost,
            idle_runner_hours: s.idle_runner_hours,
            on_frontier: false,
        })
        .collect();
    // A setting is dominated when another setting (not the oracle, which
    // is no setting) is no worse in both and better in one.
    let settings: Vec<(f64, f64)> = points
        .iter()
        .filter(|p| p.policy != "oracle")
        .map(|p| (p.cost, p.mean_wait_s))
        .collect();
    for point in points.iter_mut().filter(|p| p.policy != "oracle") {
        let dominated = settings.iter().any(|&(cost, wait)| {
            cost <= point.cost
                && wait <= point.mean_wait_s
                && (cost < point.cost || wait < point.mean_wait_s)
        });
        point.on_frontier = !dominated;
    }
    let find = |name: &str| points.iter().find(|p| p.policy == name).cloned();
    let (Some(reactive), Some(oracle)) = (find("runway"), find("oracle")) else {
        return Tuning {
            points,
            pick: None,
            closest: None,
        };
    };
    let within_cost: Vec<&Point> = points
        .iter()
        .filter(|p| p.quantile.is_some() && p.cost <= COST_LIMIT * reactive.cost)
        .collect();
    let target = oracle.mean_wait_s
        + (1.0 - GAP_CLOSED) * (reactive.mean_wait_s - oracle.mean_wait_s).max(0.0);
    let pick = within_cost
        .iter()
        .filter(|p| p.mean_wait_s <= target)
        .min_by(|a, b| a.cost.total_cmp(&b.cost))
        .map(|p| (*p).clone());
    let closest = if pick.is_none() {
        within_cost
            .iter()
            .min_by(|a, b| a.mean_wait_s.total_cmp(&b.mean_wait_s))
            .map(|p| (*p).clone())
    } else {
        None
    };
    Tuning {
        points,
        pick,
        closest,
    }
}

/// The sweep as text: every setting with its mean and p95 wait, cost and
/// idle runner-hours, the frontier marked, then the pick.
pub fn report(tuning: &Tuning) -> String {
    let mut text = format!(
        "{:<62} {:>10} {:>10} {:>10} {:>10}  {}\n",
        "setting", "mean_s", "p95_s", "cost", "idle_h", "frontier"
    );
    for point in &tuning.points {
        text.push_str(&format!(
            "{:<62} {:>10.1} {:>10.1} {:>10.2} {:>10.1}  {}\n",
            point.setting(),
            point.mean_wait_s,
            point.p95_wait_s,
            point.cost,
            point.idle_runner_hours,
            if point.on_frontier { "*" } else { "" }
        ));
    }
    let find = |name: &str| tuning.points.iter().find(|p| p.policy == name);
    if let (Some(reactive), Some(oracle)) = (find("runway"), find("oracle")) {
        match (&tuning.pick, &tuning.closest) {
            (Some(pick), _) => text.push_str(&format!(
                "pick: {} — mean wait {:.1} s (reactive {:.1} s, oracle {:.1} s) at {:.2}× the reactive cost\n",
                pick.setting(),
                pick.mean_wait_s,
                reactive.mean_wait_s,
                oracle.mean_wait_s,
                pick.cost / reactive.cost.max(f64::MIN_POSITIVE),
            )),
            (None, Some(closest)) => text.push_str(&format!(
                "no setting closes {:.0}% of the wait gap to the oracle at ≤ {COST_LIMIT}× the reactive cost; closest within the cost: {} — mean wait {:.1} s (reactive {:.1} s, oracle {:.1} s)\n",
                GAP_CLOSED * 100.0,
                closest.setting(),
                closest.mean_wait_s,
                reactive.mean_wait_s,
                oracle.mean_wait_s,
            )),
            (None, None) => text.push_str(&format!(
                "no predictive setting stays within {COST_LIMIT}× the reactive cost\n"
            )),
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(policy: &str, mean: f64, cost: f64) -> Summary {
        Summary {
            policy: policy.to_owned(),
            jobs: 100,
            queue_p50_s: mean,
            queue_p95_s: mean * 2.0,
            queue_p99_s: mean * 3.0,
            queue_max_s: mean * 4.0,
            queue_mean_s: mean,
            runner_hours: cost * 10.0,
            idle_runner_hours: cost,
            cost,
            delete_requests: 0,
            failed_creates: 0,
            unfinished: 0,
            unroutable: 0,
            stopped_hours: 0.0,
            starts: 0,
            wait_vs_runway: None,
            wait_vs_oracle: None,
            cost_vs_runway: None,
            fairness: None,
            keys: Vec::new(),
        }
    }

    #[test]
    fn the_quantiles_wait_values_are_the_newsvendors() {
        for q in QUANTILES {
            let back = runway_core::forecast::quantile_for(wait_value_for(q));
            assert!((back - q).abs() < 1e-9, "{q} → {back}");
        }
    }

    #[test]
    fn the_frontier_and_the_pick_follow_the_gap_and_the_cost_limit() {
        let summaries = [
            summary("runway", 100.0, 10.0),
            summary("oracle", 0.0, 10.1),
            summary("predictive:0.2", 60.0, 10.5),
            // Dominated by 0.2: costs more, waits longer.
            summary("predictive:0.33", 70.0, 11.0),
            summary("predictive:0.5", 9.0, 12.5),
            summary("predictive:0.75", 5.0, 12.9),
            // Closes the gap but costs too much.
            summary("predictive:0.95", 1.0, 20.0),
        ];
        let tuning = tune(&summaries);
        let frontier: Vec<&str> = tuning
            .points
            .iter()
            .filter(|p| p.on_frontier)
            .map(|p| p.policy.as_str())
            .collect();
        assert_eq!(
            frontier,
            [
                "runway",
                "predictive:0.2",
                "predictive:0.5",
                "predictive:0.75",
                "predictive:0.95"
            ]
        );
        // 90% of the 100 s gap: at most 10 s, at ≤ 13: 0.5 is the cheapest.
        assert_eq!(
            tuning.pick.as_ref().map(|p| p.policy.as_str()),
            Some("predictive:0.5")
        );
        assert!(report(&tuning).contains("pick: policy = \"predictive\", wait_value = 1.50"));
        // Tighter: nothing closes the gap within the cost; the closest says so.
        let tuning = tune(&summaries[..4]);
        assert_eq!(tuning.pick, None);
        assert_eq!(
            tuning.closest.as_ref().map(|p| p.policy.as_str()),
            Some("predictive:0.2")
        );
        assert!(report(&tuning).contains("no setting closes 90%"));
    }
}
