//! What a provider's report on a runner's instance means for the runner:
//! the reconciler's observe step, as a pure function. The reconciler lists
//! each provider, asks [`observe`] for every live runner, and applies the
//! event it returns; everything else in that step (deleting, deregistering
//! at GitHub) is I/O around this decision.

use crate::runner::{Runner, RunnerEvent, RunnerState};

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

/// The event the report means for `runner` (whose instance is
/// `instance_id`), or `None` when it changes nothing. A vanished or failed
/// instance fails a booting or idle runner, crashes a busy one and ends a
/// terminating one; a stopped or unknown one changes nothing (a stopped one
/// is started again, see [`wants_start`]).
pub fn observe(
    runner: &Runner,
    instance_id: &str,
    instance: Observed,
    readiness: Readiness,
) -> Option<RunnerEvent> {
    let gone = matches!(instance, Observed::Absent | Observed::Failed);
    match runner.state {
        RunnerState::Provisioning
            if instance == Observed::Running && readiness == Readiness::MachineRunning =>
        {
            Some(RunnerEvent::Ready)
        }
        RunnerState::Busy if gone => Some(RunnerEvent::Crashed {
            reason: format!("instance {instance_id} vanished while running a job"),
        }),
        RunnerState::Terminating if gone => Some(RunnerEvent::Terminated),
        RunnerState::Provisioning | RunnerState::Idle if gone => Some(RunnerEvent::Failed {
            reason: format!("instance {instance_id} vanished"),
        }),
        _ => None,
    }
}

/// Whether `runner`'s instance, reported `instance`, should be started
/// again: a stopped machine of a runner that still counts on it, as GARM
/// does. A terminating runner's instance is deleted instead.
pub fn wants_start(runner: &Runner, instance: Observed) -> bool {
    instance == Observed::Stopped
        && matches!(
            runner.state,
            RunnerState::Provisioning | RunnerState::Idle | RunnerState::Busy
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::{NewRunner, RunnerId};
    use crate::time::Timestamp;

    /// Every (runner state, report, readiness) the reconciler can meet, and
    /// the event it means.
    #[test]
    fn every_report_on_every_live_state() {
        use Observed::*;
        use Readiness::*;
        use RunnerState::{Busy, Idle, Provisioning, Requested, Terminating};
        let mut runner = NewRunner {
            name: "r".into(),
            pool: "p".into(),
            provider: "sim".into(),
            labels: vec![],
        }
        .initial(RunnerId(1), Timestamp::from_millis(0));
        let mut table = String::new();
        for state in [Requested, Provisioning, Idle, Busy, Terminating] {
            for instance in [Absent, Pending, Running, Stopped, Failed, Unknown] {
                for readiness in [MachineRunning, RunnerRegisters] {
                    runner.state = state;
                    let mut event = observe(&runner, "i-1", instance, readiness)
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
}
