//! What a provider's report on a runner's instance means for the runner:
//! the reconciler's observe step, as a pure function. The reconciler lists
//! each provider, asks [`observe`] for every live runner, and applies the
//! event it returns; everything else in that step (deleting, deregistering
//! at GitHub) is I/O around this decision.

use std::time::Duration;

use crate::runner::{Runner, RunnerEvent, RunnerState};
use crate::time::Timestamp;

/// What the provider says of the runner's instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Observed {
    /// Not in the provider's list.
    Absent,
    /// Created, still booting.
    Pending,
    Running,
    /// Powered off but still there (GARM's `stopped`): it is started again
    /// (see [`wants_start`]), not given up on.
    Stopped,
    /// Failed or being deleted (GARM's `error`, an exited process): it will
    /// not run a job.
    Failed,
    /// The provider cannot tell (GARM's `unknown`, a cloud API hiccup):
    /// nothing changes until it can.
    Unknown,
}

/// When a booting runner counts as ready.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Readiness {
    /// When its machine runs (a `sim` instance; a GitHub pool's runner,
    /// which registers with GitHub, not with runway).
    MachineRunning,
    /// When it registers itself with runway (`process`, `exec`): a running
    /// machine is not yet a ready runner.
    RunnerRegisters,
}

/// When the list was taken and how far a provider's list may lag behind
/// its creates: cloud APIs are eventually consistent (EC2 documents that
/// a just-launched instance can be missing from `DescribeInstances` for a
/// while), so a list that began less than `lag` after an instance's create
/// returned says nothing by leaving it out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listing {
    /// When the list call began.
    pub started_at: Timestamp,
    /// The provider's `list_lag`.
    pub lag: Duration,
}

impl Listing {
    /// Whether this list can be trusted to show the instance of `runner`
    /// by its absence: its create returned at least `lag` before the list
    /// began. A runner whose create has not returned (no
    /// `provisioning_at`) is covered by its boot timeout, not by lists.
    pub fn shows_absence_of(&self, runner: &Runner) -> bool {
        match runner.provisioning_at {
            Some(created) => self.started_at.since(created) >= self.lag,
            None => true,
        }
    }
}

/// The event the report means for `runner` (whose instance is
/// `instance_id`), or `None` when it changes nothing. A vanished or failed
/// instance fails a booting or idle runner, crashes a busy one and ends a
/// terminating one; a stopped or unknown one changes nothing (a stopped one
/// is started again, see [`wants_start`]). An instance missing from a list
/// that may still lag behind its create (`listing`) is "not visible yet",
/// not gone: nothing changes. A stock runner ([`Runner::stock`]) is asked
/// to stop once its machine runs, is stopped when its provider says so, and
/// fails if its instance goes (deleted underneath: replaced).
pub fn observe(
    runner: &Runner,
    instance_id: &str,
    instance: Observed,
    readiness: Readiness,
    listing: Listing,
) -> Option<RunnerEvent> {
    if instance == Observed::Absent && !listing.shows_absence_of(runner) {
        return None; // Not visible yet.
    }
    let gone = matches!(instance, Observed::Absent | Observed::Failed);
    // Listed as ended (an exited container or process, GARM's `error`),
    // or no longer listed at all.
    let how = if instance == Observed::Failed {
        "ended"
    } else {
        "vanished"
    };
    if runner.stock {
        // A stock runner is stopped once up (it never registers: it has no
        // credential), and known stopped when its provider says so.
        return match (runner.state, instance) {
            (RunnerState::Provisioning, Observed::Running) => Some(RunnerEvent::StopRequested),
            (RunnerState::Provisioning | RunnerState::Stopping, Observed::Stopped) => {
                Some(RunnerEvent::Stopped)
            }
            (RunnerState::Terminating, _) if gone => Some(RunnerEvent::Terminated),
            (RunnerState::Provisioning | RunnerState::Stopping | RunnerState::Stopped, _)
                if gone =>
            {
                Some(RunnerEvent::Failed {
                    reason: format!("stopped runner's instance {instance_id} {how}"),
                })
            }
            _ => None,
        };
    }
    match runner.state {
        RunnerState::Provisioning
            if instance == Observed::Running && readiness == Readiness::MachineRunning =>
        {
            Some(RunnerEvent::Ready)
        }
        RunnerState::Busy if gone => Some(RunnerEvent::Crashed {
            reason: format!("instance {instance_id} {how} while running a job"),
        }),
        RunnerState::Terminating if gone => Some(RunnerEvent::Terminated),
        RunnerState::Provisioning | RunnerState::Idle if gone => Some(RunnerEvent::Failed {
            reason: format!("instance {instance_id} {how}"),
        }),
        _ => None,
    }
}

/// Whether `runner`'s instance, reported `instance`, should be started
/// again: a stopped machine of a runner that still counts on it, as GARM
/// does. A terminating runner's instance is deleted instead.
pub fn wants_start(runner: &Runner, instance: Observed) -> bool {
    // A stock runner was stopped on purpose: it is started for a job only.
    instance == Observed::Stopped
        && !runner.stock
        && matches!(
            runner.state,
            RunnerState::Provisioning | RunnerState::Idle | RunnerState::Busy
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::{NewRunner, RunnerId};

    /// A list taken long after every create, with no lag.
    const TRUSTED: Listing = Listing {
        started_at: Timestamp::from_millis(1_000_000),
        lag: Duration::ZERO,
    };

    /// The event every (state, report, readiness) means for a runner
    /// (`stock` or not), one row each that changes something; `(start)`
    /// where the list has its instance started again.
    fn report_table(stock: bool, states: &[RunnerState]) -> String {
        use Observed::*;
        let mut runner = NewRunner {
            name: "r".into(),
            pool: "p".into(),
            provider: "sim".into(),
            labels: vec![],
            stock,
        }
        .initial(RunnerId(1), Timestamp::from_millis(0));
        let mut table = String::new();
        for &state in states {
            for instance in [Absent, Pending, Running, Stopped, Failed, Unknown] {
                for readiness in [Readiness::MachineRunning, Readiness::RunnerRegisters] {
                    runner.state = state;
                    let mut event = observe(&runner, "i-1", instance, readiness, TRUSTED)
                        .map(|e| e.name())
                        .unwrap_or("-");
                    if wants_start(&runner, instance) {
                        assert_eq!(event, "-", "a started instance changes no state");
                        event = "(start)";
                    }
                    if event != "-" {
                        table.push_str(&format!(
                            "{:<12} {:<8} {:<16} {event}\n",
                            state.as_str(),
                            format!("{instance:?}"),
                            format!("{readiness:?}")
                        ));
                    }
                }
            }
        }
        table
    }

    /// Every (runner state, report, readiness) the reconciler can meet, and
    /// the event it means.
    #[test]
    fn every_report_on_every_live_state() {
        use RunnerState::{Busy, Idle, Provisioning, Requested, Terminating};
        let table = report_table(false, &[Requested, Provisioning, Idle, Busy, Terminating]);
        // Rows not listed change nothing (a requested runner has no
        // instance yet; a pending or running instance leaves a live runner
        // as it is, except a booting one that is ready when its machine is;
        // an unknown one is left alone, as GARM does).
        expect_test::expect![[r#"
            provisioning Absent   MachineRunning   failure
            provisioning Absent   RunnerRegisters  failure
            provisioning Running  MachineRunning   ready
            provisioning Stopped  MachineRunning   (start)
            provisioning Stopped  RunnerRegisters  (start)
            provisioning Failed   MachineRunning   failure
            provisioning Failed   RunnerRegisters  failure
            idle         Absent   MachineRunning   failure
            idle         Absent   RunnerRegisters  failure
            idle         Stopped  MachineRunning   (start)
            idle         Stopped  RunnerRegisters  (start)
            idle         Failed   MachineRunning   failure
            idle         Failed   RunnerRegisters  failure
            busy         Absent   MachineRunning   crash
            busy         Absent   RunnerRegisters  crash
            busy         Stopped  MachineRunning   (start)
            busy         Stopped  RunnerRegisters  (start)
            busy         Failed   MachineRunning   crash
            busy         Failed   RunnerRegisters  crash
            terminating  Absent   MachineRunning   termination
            terminating  Absent   RunnerRegisters  termination
            terminating  Failed   MachineRunning   termination
            terminating  Failed   RunnerRegisters  termination
        "#]]
        .assert_eq(&table);
    }

    /// The same table for a stock runner (booted once to be stopped): it
    /// is asked to stop once its machine runs, whatever its readiness (it
    /// never registers), known stopped when listed stopped, never started
    /// again by the list, and failed if its instance goes.
    #[test]
    fn every_report_on_every_state_of_a_stock_runner() {
        use RunnerState::{Provisioning, Requested, Stopped, Stopping, Terminating};
        let table = report_table(
            true,
            &[Requested, Provisioning, Stopping, Stopped, Terminating],
        );
        expect_test::expect![[r#"
            provisioning Absent   MachineRunning   failure
            provisioning Absent   RunnerRegisters  failure
            provisioning Running  MachineRunning   stop request
            provisioning Running  RunnerRegisters  stop request
            provisioning Stopped  MachineRunning   stop
            provisioning Stopped  RunnerRegisters  stop
            provisioning Failed   MachineRunning   failure
            provisioning Failed   RunnerRegisters  failure
            stopping     Absent   MachineRunning   failure
            stopping     Absent   RunnerRegisters  failure
            stopping     Stopped  MachineRunning   stop
            stopping     Stopped  RunnerRegisters  stop
            stopping     Failed   MachineRunning   failure
            stopping     Failed   RunnerRegisters  failure
            stopped      Absent   MachineRunning   failure
            stopped      Absent   RunnerRegisters  failure
            stopped      Failed   MachineRunning   failure
            stopped      Failed   RunnerRegisters  failure
            terminating  Absent   MachineRunning   termination
            terminating  Absent   RunnerRegisters  termination
            terminating  Failed   MachineRunning   termination
            terminating  Failed   RunnerRegisters  termination
        "#]]
        .assert_eq(&table);
    }

    /// An instance missing from a list that began within the provider's
    /// lag after its create returned is not visible yet: nothing changes,
    /// whatever the runner's state; once the lag has passed, it is gone.
    #[test]
    fn a_just_created_instance_missing_from_the_list_is_not_visible_yet() {
        let mut runner = NewRunner {
            name: "r".into(),
            pool: "p".into(),
            provider: "ec2".into(),
            labels: vec![],
            stock: false,
        }
        .initial(RunnerId(1), Timestamp::from_millis(0));
        runner.provisioning_at = Some(Timestamp::from_millis(10_000));
        let lag = Duration::from_secs(5);
        for state in [
            RunnerState::Provisioning,
            RunnerState::Idle,
            RunnerState::Busy,
        ] {
            runner.state = state;
            for (listed_at, gone) in [(10_000, false), (14_999, false), (15_000, true)] {
                let listing = Listing {
                    started_at: Timestamp::from_millis(listed_at),
                    lag,
                };
                let event = observe(
                    &runner,
                    "i-1",
                    Observed::Absent,
                    Readiness::RunnerRegisters,
                    listing,
                );
                assert_eq!(event.is_some(), gone, "{state} listed at {listed_at}");
                // A failed instance is reported, not hidden: it counts at once.
                let failed = observe(
                    &runner,
                    "i-1",
                    Observed::Failed,
                    Readiness::RunnerRegisters,
                    listing,
                );
                assert!(failed.is_some(), "{state}: a failed instance is not lag");
            }
        }
    }
}
