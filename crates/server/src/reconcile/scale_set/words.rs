//! What the scale set's messages say in runway's words: labels, conclusions,
//! workflows and the session's key.

use super::*;

/// The store setting that remembers the session the leader holds, so that
/// a restarted or new leader can replace it instead of waiting it out.
pub(super) fn session_key(pool: &str) -> String {
    format!("scale_set_session:{pool}")
}

/// The scale set's labels: its name (what `runs-on: NAME` targets) and
/// the pool's labels.
pub fn scale_set_labels(name: &str, pool_labels: &[String]) -> Vec<String> {
    let mut labels = vec![name.to_owned()];
    for label in pool_labels {
        if !labels.iter().any(|l| l.eq_ignore_ascii_case(label)) {
            labels.push(label.clone());
        }
    }
    labels
}

/// A job's conclusion from the service's result.
pub(super) fn conclusion(result: &str) -> String {
    match result.to_ascii_lowercase().as_str() {
        "succeeded" | "success" => "success",
        "failed" | "failure" => "failure",
        "canceled" | "cancelled" | "abandoned" => "cancelled",
        "skipped" => "skipped",
        other => return other.to_owned(),
    }
    .to_owned()
}

/// The workflow a job ref names: `.github/workflows/ci.yml` of
/// `owner/repo/.github/workflows/ci.yml@refs/heads/main`.
pub(super) fn workflow_of(job_ref: &str) -> Option<String> {
    let path = job_ref.split('@').next()?;
    let at = path.find(".github/workflows/")?;
    Some(path[at..].to_owned()).filter(|p| p.len() > ".github/workflows/".len())
}

pub(super) fn same_labels(have: &[String], want: &[String]) -> bool {
    let norm = |labels: &[String]| -> BTreeSet<String> {
        labels.iter().map(|l| l.to_ascii_lowercase()).collect()
    };
    norm(have) == norm(want)
}
