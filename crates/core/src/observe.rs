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
    /// Stopped or failed: it will not run a job.
    Stopped,
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
/// `instance_id`), or `None` when it changes nothing. A vanished instance
/// fails a booting or idle runner, crashes a busy one and ends a
/// terminating one.
pub fn observe(
    runner: &Runner,
    instance_id: &str,
    instance: Observed,
    readiness: Readiness,
) -> Option<RunnerEvent> {
    let gone = matches!(instance, Observed::Absent | Observed::Stopped);
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
        use RunnerState::*;
        let mut runner = NewRunner {
            name: "r".into(),
            pool: "p".into(),
            provider: "sim".into(),
            labels: vec![],
        }
        .initial(RunnerId(1), Timestamp::from_millis(0));
        let mut table = String::new();
        for state in [Requested, Provisioning, Idle, Busy, Terminating] {
            for instance in [Absent, Pending, Running, Stopped] {
                for readiness in [MachineRunning, RunnerRegisters] {
                    runner.state = state;
                    let event = observe(&runner, "i-1", instance, readiness)
                        .map(|e| e.name())
                        .unwrap_or("-");
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
        // as it is, except a booting one that is ready when its machine is).
        expect_test::expect![[r#"
            provisioning Absent   MachineRunning   failure
            provisioning Absent   RunnerRegisters  failure
            provisioning Running  MachineRunning   ready
            provisioning Stopped  MachineRunning   failure
            provisioning Stopped  RunnerRegisters  failure
            idle         Absent   MachineRunning   failure
            idle         Absent   RunnerRegisters  failure
            idle         Stopped  MachineRunning   failure
            idle         Stopped  RunnerRegisters  failure
            busy         Absent   MachineRunning   crash
            busy         Absent   RunnerRegisters  crash
            busy         Stopped  MachineRunning   crash
            busy         Stopped  RunnerRegisters  crash
            terminating  Absent   MachineRunning   termination
            terminating  Absent   RunnerRegisters  termination
            terminating  Stopped  MachineRunning   termination
            terminating  Stopped  RunnerRegisters  termination
        "#]]
        .assert_eq(&table);
    }
}
