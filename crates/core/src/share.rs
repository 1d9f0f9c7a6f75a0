//! Fair share within a pool: which queued job goes next when several
//! repositories (or submitters) want the same runners.
//!
//! Each job carries a share key (its repository, or the runway-API
//! submitter) and the key's weight. Its place in the pool's queue is a
//! start tag, as in start-time fair queueing: a job gets
//! `max(virtual time, its key's last queued tag + 1 / weight)`, where the
//! pool's virtual time is how far the queue has been served (the highest
//! tag handed out among live jobs, or the lowest still queued). The queue
//! is served in tag order, ties by arrival. So a key that queues 500 jobs at once spaces
//! them one step apart, and a key that then queues one job lands at the
//! served front, not behind the 500; and between two hand-outs to a key
//! with queued work, a key of weight `w` gets about `w / weight` of them.
//! With one key the tags follow arrival: first in, first out.
//!
//! The stores compute the tag where the job is inserted (a trigger, so
//! every insert path does it in the same transaction); [`next_tag`] is the
//! same rule for the simulator and the tests.

use std::fmt;

use globset::{GlobBuilder, GlobMatcher};

/// A key's weight in thousandths: 1000 is a weight of 1. Always at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Weight(u32);

impl Weight {
    pub const ONE: Weight = Weight(1000);

    /// The weight of a configured number; `None` unless it is finite, above
    /// zero and at most a million.
    pub fn from_f64(weight: f64) -> Option<Weight> {
        if !weight.is_finite() || weight <= 0.0 || weight > 1_000_000.0 {
            return None;
        }
        Some(Weight(((weight * 1000.0).round() as u32).max(1)))
    }

    pub fn from_millis(millis: u32) -> Weight {
        Weight(millis.max(1))
    }

    pub fn millis(self) -> u32 {
        self.0
    }

    pub fn as_f64(self) -> f64 {
        f64::from(self.0) / 1000.0
    }

    /// How far one job of this key moves its tag on.
    pub fn step(self) -> f64 {
        1000.0 / f64::from(self.0)
    }
}

impl Default for Weight {
    fn default() -> Weight {
        Weight::ONE
    }
}

impl fmt::Display for Weight {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.as_f64())
    }
}

/// Who a job counts against in its pool's fair share.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Share {
    /// The repository (`owner/name`) of a GitHub job; the submitter (a
    /// token's name or an explicit tenant) of a runway-API job. Empty:
    /// the pool's one anonymous key.
    pub key: String,
    pub weight: Weight,
}

impl Share {
    pub fn new(key: impl Into<String>, weight: Weight) -> Share {
        Share {
            key: key.into(),
            weight,
        }
    }
}

/// A pool's fair-share settings: weights by key pattern and the cap on a
/// key's running jobs.
#[derive(Debug, Clone, Default)]
pub struct ShareRules {
    weights: Vec<(String, GlobMatcher, Weight)>,
    max_running: Option<u32>,
}

/// What is wrong with a pool's fair-share settings; the key is relative to
/// the `share` table.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ShareError {
    #[error("weights.{pattern:?}: {reason}")]
    BadPattern { pattern: String, reason: String },
    #[error(
        "weights.{pattern:?}: {weight} is not a weight (a number above 0 and at most 1000000)"
    )]
    BadWeight { pattern: String, weight: f64 },
    #[error("max_running: must be at least 1 (leave it out for no cap)")]
    ZeroCap,
}

impl PartialEq for ShareRules {
    fn eq(&self, other: &ShareRules) -> bool {
        self.max_running == other.max_running
            && self.weights.len() == other.weights.len()
            && self
                .weights
                .iter()
                .zip(&other.weights)
                .all(|(a, b)| a.0 == b.0 && a.2 == b.2)
    }
}

impl ShareRules {
    /// Builds the rules: `weights` maps a key pattern (a glob, compared
    /// case-insensitively; `*` does not cross a `/`) to its weight.
    pub fn new<'a>(
        weights: impl IntoIterator<Item = (&'a String, &'a f64)>,
        max_running: Option<u32>,
    ) -> Result<ShareRules, ShareError> {
        let mut compiled = Vec::new();
        for (pattern, weight) in weights {
            let matcher = GlobBuilder::new(pattern)
                .literal_separator(true)
                .case_insensitive(true)
                .build()
                .map_err(|e| ShareError::BadPattern {
                    pattern: pattern.clone(),
                    reason: e.kind().to_string(),
                })?
                .compile_matcher();
            if pattern.trim().is_empty() {
                return Err(ShareError::BadPattern {
                    pattern: pattern.clone(),
                    reason: "an empty pattern matches no key".into(),
                });
            }
            let weight = Weight::from_f64(*weight).ok_or(ShareError::BadWeight {
                pattern: pattern.clone(),
                weight: *weight,
            })?;
            compiled.push((pattern.clone(), matcher, weight));
        }
        if max_running == Some(0) {
            return Err(ShareError::ZeroCap);
        }
        Ok(ShareRules {
            weights: compiled,
            max_running,
        })
    }

    /// The share of a job with key `key`: the weight of the most specific
    /// pattern that matches it (the one with the most characters that are
    /// not glob characters; a tie goes to the first in order), else 1.
    pub fn share_of(&self, key: &str) -> Share {
        let literal = |pattern: &str| pattern.chars().filter(|c| !"*?[]{}".contains(*c)).count();
        let weight = self
            .weights
            .iter()
            .filter(|(_, matcher, _)| matcher.is_match(key))
            .max_by(|a, b| {
                literal(&a.0)
                    .cmp(&literal(&b.0))
                    .then(std::cmp::Ordering::Greater)
            })
            .map(|(_, _, weight)| *weight)
            .unwrap_or_default();
        Share::new(key, weight)
    }

    /// The cap on a key's jobs provisioning or running in the pool.
    pub fn max_running(&self) -> Option<u32> {
        self.max_running
    }

    pub fn is_default(&self) -> bool {
        self.weights.is_empty() && self.max_running.is_none()
    }
}

/// The start tag of a job of weight `weight` queued now: `served` is the
/// highest tag among the pool's jobs that were handed out and are still
/// live, `head` the lowest tag still queued (together, the pool's virtual
/// time), `last_of_key` the highest tag its key has queued. A key with
/// queued work goes one step (`1 / weight`) past its last job; a key
/// without joins at the virtual time, next to the job served next.
pub fn next_tag(
    served: Option<f64>,
    head: Option<f64>,
    last_of_key: Option<f64>,
    weight: Weight,
) -> f64 {
    [served, head, last_of_key.map(|last| last + weight.step())]
        .into_iter()
        .flatten()
        .fold(0.0_f64, f64::max)
}

/// Jain's fairness index of `values` (each key's share of what it asked
/// for, or each key's mean wait): 1 when all are equal, `1/n` when one key
/// has everything. `None` for no values or all zero.
pub fn jain_index(values: &[f64]) -> Option<f64> {
    let sum: f64 = values.iter().sum();
    let squares: f64 = values.iter().map(|v| v * v).sum();
    if values.is_empty() || squares == 0.0 {
        return None;
    }
    Some(sum * sum / (values.len() as f64 * squares))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_from_config_numbers() {
        assert_eq!(Weight::from_f64(1.0), Some(Weight::ONE));
        assert_eq!(Weight::from_f64(0.5).map(Weight::millis), Some(500));
        assert_eq!(Weight::from_f64(0.0001).map(Weight::millis), Some(1));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 2e6] {
            assert_eq!(Weight::from_f64(bad), None, "{bad}");
        }
        assert_eq!(Weight::from_f64(2.0).map(Weight::step), Some(0.5));
    }

    #[test]
    fn a_new_key_lands_at_the_served_front() {
        // A queued 500 (tags 1..=500), 4 handed out: served 4, head 5.
        let a_next = next_tag(Some(4.0), Some(5.0), Some(500.0), Weight::ONE);
        assert_eq!(a_next, 501.0);
        // B ties with A's next job and comes after it (by arrival).
        let b = next_tag(Some(4.0), Some(5.0), None, Weight::ONE);
        assert_eq!(b, 5.0);
        // An empty pool starts again at zero; a key of weight 2 steps by half.
        assert_eq!(next_tag(None, None, None, Weight::ONE), 0.0);
        let heavy = Weight::from_f64(2.0).unwrap_or_default();
        assert_eq!(next_tag(None, Some(0.0), Some(0.0), heavy), 0.5);
    }

    #[test]
    fn the_most_specific_pattern_gives_the_weight() {
        let weights: Vec<(String, f64)> = vec![
            ("octo-org/*".into(), 2.0),
            ("octo-org/release".into(), 5.0),
            ("alice".into(), 0.5),
        ];
        let rules = ShareRules::new(weights.iter().map(|(p, w)| (p, w)), Some(3)).unwrap();
        let weight = |key: &str| rules.share_of(key).weight.as_f64();
        assert_eq!(weight("octo-org/release"), 5.0);
        assert_eq!(weight("Octo-Org/app"), 2.0);
        assert_eq!(weight("alice"), 0.5);
        assert_eq!(weight("bob"), 1.0);
        assert_eq!(weight("octo-org/a/b"), 1.0);
        assert_eq!(rules.max_running(), Some(3));
        let bad = |pattern: &str, weight: f64, cap: Option<u32>| {
            let weights = [(pattern.to_owned(), weight)];
            ShareRules::new(weights.iter().map(|(p, w)| (p, w)), cap)
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            bad("a/[", 1.0, None),
            "weights.\"a/[\": unclosed character class; missing ']'"
        );
        assert_eq!(
            bad("a", 0.0, None),
            "weights.\"a\": 0 is not a weight (a number above 0 and at most 1000000)"
        );
        assert_eq!(
            bad("a", -2.0, None),
            "weights.\"a\": -2 is not a weight (a number above 0 and at most 1000000)"
        );
        assert_eq!(
            bad("a", 1.0, Some(0)),
            "max_running: must be at least 1 (leave it out for no cap)"
        );
    }

    #[test]
    fn jain_index_bounds() {
        assert_eq!(jain_index(&[]), None);
        assert_eq!(jain_index(&[0.0, 0.0]), None);
        assert_eq!(jain_index(&[3.0, 3.0, 3.0]), Some(1.0));
        let one_has_all = jain_index(&[1.0, 0.0, 0.0, 0.0]).unwrap_or_default();
        assert!((one_has_all - 0.25).abs() < 1e-9);
    }
}
