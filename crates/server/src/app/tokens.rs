//! Tokens runway mints: random, with a readable prefix, and stored only as
//! their SHA-256 hash.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use rand::RngCore;
use runway_core::Runner;
use sha2::{Digest, Sha256};

use crate::app::{AppError, ErrorKind, Service};

/// A random token with a readable prefix (`rwr_` registration, `rwt_` runner,
/// [`REPORT_TOKEN_PREFIX`] a runner's report-only token).
pub fn new_token(prefix: &str) -> String {
    let mut bytes = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut bytes);
    format!("{prefix}{}", hex::encode(bytes))
}

/// The only form in which tokens are stored.
pub fn token_hash(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// The prefix of a runner's report token: it authenticates that runner's
/// own reports (`POST /api/v1/runners/{id}/metrics`) and nothing else — a
/// GitHub pool's just-in-time runner gets one in its environment, where its
/// jobs can read it.
pub const REPORT_TOKEN_PREFIX: &str = "rwp_";

/// How long a long-polling runner's renewals are let through on the runner
/// as an earlier poll read it (`Renewals`).
pub const RENEWAL_TTL: Duration = Duration::from_secs(300);

/// Past this many remembered runners, the stale ones are forgotten (and
/// all of them, were none stale).
const RENEWALS_KEPT: usize = 100_000;

/// Runners by their token's hash, as runway last read them from the store
/// for a long poll or wrote them for one of its starts or completions,
/// for up to [`RENEWAL_TTL`]. A renewal that waits without a look (nothing
/// was queued for its runner since its last look found nothing) then
/// needs no store read at all: at 10,000 waiting runners that read was a
/// third of what waiting cost. A poll that starts its job and the
/// completion that ends it need none either.
///
/// Trusted only where a write checks it: a start's and a completion's
/// compare-and-set of the runner's version, which anything that changes
/// the runner moves on (drained, ended, its token replaced). Where such a
/// write does not hold, and before any other look (a claim that does not
/// start), `jobs` reads the runner by its token again (a token replaced or
/// a runner ended answers 401, a runner draining 410), so a remembered
/// runner never takes or ends a job it could not. What staleness costs: a
/// runner drained or ended elsewhere (another replica, the reconciler) and
/// never woken here keeps waiting until its poll times out, for at most
/// [`RENEWAL_TTL`] plus one poll. One drained or ended on this replica is
/// woken, and looks, at once.
#[derive(Default)]
pub struct Renewals {
    runners: Mutex<Remembered>,
}

/// By token hash: the runner (shared with the polls renewed on it, not
/// copied for each), and when it was read.
type Remembered = HashMap<String, (Arc<Runner>, Instant)>;

impl Renewals {
    /// The runner `token_hash` named when a poll last read it, if that was
    /// within [`RENEWAL_TTL`] of `now`.
    pub fn get(&self, token_hash: &str, now: Instant) -> Option<Arc<Runner>> {
        let runners = self.lock();
        let (runner, read_at) = runners.get(token_hash)?;
        (now.saturating_duration_since(*read_at) < RENEWAL_TTL).then(|| Arc::clone(runner))
    }

    /// Remembers `runner`, read from the store at `now` by `token_hash`.
    pub fn put(&self, token_hash: &str, runner: Arc<Runner>, now: Instant) {
        let mut runners = self.lock();
        if runners.len() >= RENEWALS_KEPT && !runners.contains_key(token_hash) {
            runners.retain(|_, (_, read_at)| now.saturating_duration_since(*read_at) < RENEWAL_TTL);
            if runners.len() >= RENEWALS_KEPT {
                runners.clear();
            }
        }
        runners.insert(token_hash.to_owned(), (runner, now));
    }

    /// Forgets what `token_hash` named: its runner ended, or the token no
    /// longer names one.
    pub fn forget(&self, token_hash: &str) {
        self.lock().remove(token_hash);
    }

    fn lock(&self) -> MutexGuard<'_, Remembered> {
        self.runners.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A runner as a runner API call named it by its token: read from the
/// store, or `remembered` from [`Renewals`] (not proven current until a
/// write guarded by its version holds, or it is read again).
pub struct ByToken {
    pub runner: Arc<Runner>,
    /// The hash of the runner token the call was made with.
    pub token_hash: String,
    pub remembered: bool,
}

/// The runner a runner token named, if it may still call the runner API;
/// else why not, as the refusal's reason (`runway_runner_reports_rejected_total`)
/// and the 401's message: no runner has the token, or its runner ended.
pub fn admitted(found: Option<Runner>) -> Result<Runner, (&'static str, String)> {
    match found {
        Some(runner) if !runner.state.is_terminal() => Ok(runner),
        Some(runner) => Err((
            "runner_ended",
            format!(
                "runner {} is {}; register a new one",
                runner.name, runner.state
            ),
        )),
        None => Err(("unauthorized", "the runner token is not valid".to_owned())),
    }
}

/// The runner `token_hash` names, read from the store again (and
/// remembered again for the renewals), refused as its authentication
/// refuses it ([`admitted`]).
pub async fn read_again(service: &Service, token_hash: &str) -> Result<Arc<Runner>, AppError> {
    service.metrics.long_poll_runner_reads.inc();
    let found = service
        .store
        .find_runner_by_token(token_hash)
        .await
        .map_err(|e| AppError::store(service, "find_runner_by_token", e))?;
    match admitted(found) {
        Ok(runner) => {
            let runner = Arc::new(runner);
            service
                .renewals
                .put(token_hash, runner.clone(), Instant::now());
            Ok(runner)
        }
        Err((reason, message)) => {
            service.renewals.forget(token_hash);
            service.metrics.report_refused(reason);
            Err(AppError::new(
                ErrorKind::Unauthenticated,
                "unauthorized",
                message,
            ))
        }
    }
}
