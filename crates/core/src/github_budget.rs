//! The GitHub API request budget (issue 9): a token has 5,000 requests an
//! hour, and runway must never be the reason a runner cannot start. Pure:
//! the caller passes the time and what GitHub's response headers said.
//!
//! Two limits apply, and the stricter wins:
//! - runway's own cap, `max_requests_per_hour` over a sliding hour;
//! - GitHub's `X-RateLimit-Remaining` until `X-RateLimit-Reset`, and any
//!   `Retry-After` (a secondary limit), which stops every request.
//!
//! Requests have priorities. The most important may use the whole budget;
//! each lower one must leave a reserve for those above it, so with the
//! budget nearly spent, JIT configurations still go out while re-checks and
//! redeliveries wait.

use std::collections::VecDeque;
use std::time::Duration;

use crate::time::Timestamp;

/// What a request is for, most important first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    /// A just-in-time runner configuration: without it no runner starts.
    JitConfig,
    /// Removing a runner's registration before its instance is deleted.
    Deregister,
    /// Looking a workflow run up for the facts a pool's access policy
    /// needs (its event, whether it comes from a fork): without them such
    /// a pool's jobs get no runner.
    RunFacts,
    /// Checking a queued job that has waited long.
    Recheck,
    /// Asking GitHub to redeliver failed webhooks.
    Redeliver,
    /// Looking a workflow run up only for its triggering event, for the
    /// `event` label and the event log: spends only the top half.
    RunEvent,
}

impl Priority {
    pub const ALL: [Priority; 6] = [
        Priority::JitConfig,
        Priority::Deregister,
        Priority::RunFacts,
        Priority::Recheck,
        Priority::Redeliver,
        Priority::RunEvent,
    ];

    /// The share of a budget this priority must leave unspent for the ones
    /// above it.
    fn reserve(self) -> f64 {
        match self {
            Priority::JitConfig => 0.0,
            Priority::Deregister => 0.05,
            Priority::RunFacts => 0.10,
            Priority::Recheck => 0.20,
            Priority::Redeliver => 0.35,
            Priority::RunEvent => 0.50,
        }
    }

    /// Whether a request of this priority waits until GitHub has said what
    /// is left (`X-RateLimit-Remaining`): one that is only nice to have
    /// never spends a budget runway cannot see.
    fn needs_word(self) -> bool {
        matches!(self, Priority::RunEvent)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Priority::JitConfig => "jit_config",
            Priority::Deregister => "deregister",
            Priority::RunFacts => "run_facts",
            Priority::Recheck => "recheck",
            Priority::Redeliver => "redeliver",
            Priority::RunEvent => "run_event",
        }
    }
}

const HOUR: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    max_per_hour: u32,
    /// When runway's requests of the last hour went out, oldest first.
    spent: VecDeque<Timestamp>,
    /// GitHub's word: requests left until `reset_at`.
    remaining: Option<(u32, Timestamp)>,
    /// The limit GitHub reported with `remaining` (`X-RateLimit-Limit`).
    github_limit: u32,
    /// `Retry-After`: nothing goes out before this.
    blocked_until: Option<Timestamp>,
}

impl Budget {
    pub fn new(max_requests_per_hour: u32) -> Budget {
        Budget {
            max_per_hour: max_requests_per_hour.max(1),
            spent: VecDeque::new(),
            remaining: None,
            github_limit: 5_000,
            blocked_until: None,
        }
    }

    fn forget_old(&mut self, now: Timestamp) {
        while self
            .spent
            .front()
            .is_some_and(|sent| now.since(*sent) >= HOUR)
        {
            self.spent.pop_front();
        }
    }

    /// Requests runway sent in the hour before `now`.
    pub fn spent_last_hour(&self, now: Timestamp) -> u32 {
        self.spent
            .iter()
            .filter(|sent| now.since(**sent) < HOUR)
            .count() as u32
    }

    /// GitHub's last word on what is left, if it has not reset since.
    pub fn github_remaining(&self, now: Timestamp) -> Option<u32> {
        self.remaining
            .filter(|(_, reset_at)| *reset_at > now)
            .map(|(remaining, _)| remaining)
    }

    /// `Ok` if a request of `priority` may go out at `now`; otherwise the
    /// earliest time worth asking again.
    pub fn permit(&self, priority: Priority, now: Timestamp) -> Result<(), Timestamp> {
        if let Some(until) = self.blocked_until.filter(|until| *until > now) {
            return Err(until);
        }
        // runway's own cap over a sliding hour.
        let ours = (f64::from(self.max_per_hour) * (1.0 - priority.reserve())).floor() as u32;
        let recent: Vec<Timestamp> = self
            .spent
            .iter()
            .copied()
            .filter(|sent| now.since(*sent) < HOUR)
            .collect();
        if recent.len() as u32 >= ours.max(1) {
            // Enough of the oldest must age out to get below the cap.
            let must_age = recent.len() - ours.max(1) as usize;
            let retry = recent
                .get(must_age)
                .map_or(now.plus(HOUR), |sent| sent.plus(HOUR));
            return Err(retry);
        }
        if priority.needs_word() && self.github_remaining(now).is_none() {
            return Err(now.plus(Duration::from_secs(60)));
        }
        // GitHub's remaining, keeping the same reserve of its limit.
        if let Some((remaining, reset_at)) = self.remaining.filter(|(_, reset)| *reset > now) {
            let reserve = (f64::from(self.github_limit) * priority.reserve()).ceil() as u32;
            if remaining <= reserve {
                return Err(reset_at);
            }
        }
        Ok(())
    }

    /// A request went out at `now`.
    pub fn spend(&mut self, now: Timestamp) {
        self.forget_old(now);
        self.spent.push_back(now);
        if let Some((remaining, reset_at)) = self.remaining {
            self.remaining = Some((remaining.saturating_sub(1), reset_at));
        }
    }

    /// What a response's headers said: `X-RateLimit-Remaining`,
    /// `X-RateLimit-Limit`, `X-RateLimit-Reset` (as a time) and
    /// `Retry-After`.
    pub fn observe(
        &mut self,
        remaining: Option<u32>,
        limit: Option<u32>,
        reset_at: Option<Timestamp>,
        retry_after: Option<Duration>,
        now: Timestamp,
    ) {
        if let (Some(remaining), Some(reset_at)) = (remaining, reset_at) {
            self.remaining = Some((remaining, reset_at));
        }
        if let Some(limit) = limit.filter(|l| *l > 0) {
            self.github_limit = limit;
        }
        if let Some(wait) = retry_after {
            let until = now.plus(wait);
            self.blocked_until = Some(self.blocked_until.map_or(until, |b| b.max(until)));
        }
        // Remaining at 0: nothing until the reset. (A secondary limit with
        // no Retry-After is read by the caller, which knows the status, as
        // a Retry-After of a minute, as GitHub documents.)
        if remaining == Some(0) {
            if let Some(reset_at) = reset_at {
                self.blocked_until = Some(self.blocked_until.map_or(reset_at, |b| b.max(reset_at)));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_millis(seconds * 1000)
    }

    #[test]
    fn with_the_budget_nearly_spent_jit_goes_out_and_rechecks_wait() {
        let mut budget = Budget::new(100);
        for i in 0..85 {
            assert_eq!(budget.permit(Priority::JitConfig, at(i)), Ok(()));
            budget.spend(at(i));
        }
        assert_eq!(budget.permit(Priority::JitConfig, at(90)), Ok(()));
        assert_eq!(budget.permit(Priority::Deregister, at(90)), Ok(()));
        assert!(budget.permit(Priority::Recheck, at(90)).is_err());
        assert!(budget.permit(Priority::Redeliver, at(90)).is_err());
        // An hour after the first requests, room again.
        assert_eq!(budget.permit(Priority::Recheck, at(3_620)), Ok(()));
    }

    #[test]
    fn github_s_remaining_and_retry_after_are_honoured() {
        let mut budget = Budget::new(3_000);
        budget.observe(Some(300), Some(5_000), Some(at(1_000)), None, at(0));
        assert_eq!(budget.permit(Priority::JitConfig, at(1)), Ok(()));
        assert_eq!(
            budget.permit(Priority::Deregister, at(1)),
            Ok(()),
            "300 > 250"
        );
        assert_eq!(budget.permit(Priority::Recheck, at(1)), Err(at(1_000)));
        assert_eq!(budget.permit(Priority::Recheck, at(1_000)), Ok(()), "reset");
        budget.observe(None, None, None, Some(Duration::from_secs(60)), at(10));
        assert_eq!(budget.permit(Priority::JitConfig, at(20)), Err(at(70)));
        assert_eq!(budget.permit(Priority::JitConfig, at(70)), Ok(()));
        budget.observe(Some(0), Some(5_000), Some(at(2_000)), None, at(100));
        assert_eq!(budget.permit(Priority::JitConfig, at(101)), Err(at(2_000)));
    }
}
