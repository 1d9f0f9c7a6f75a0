//! runway's domain core: the job and runner state machines of DESIGN §3.
//!
//! Architecture invariant: this crate does no I/O and reads no clock. Every
//! function that depends on time takes `now` as a parameter, so the same code
//! runs in `runway serve` and on the simulator's virtual clock.

/// A closed set of names a type is stored and sent as (a state, a
/// conclusion): `ALL`, `as_str`, `Display` and `FromStr` (refusing an
/// unknown name with [`job::UnknownName`]) from one list of variant and name.
macro_rules! names {
    ($type:ident, $kind:literal, { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $type {
            pub const ALL: [$type; [$($name),+].len()] = [$($type::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($type::$variant => $name),+
                }
            }
        }

        impl std::fmt::Display for $type {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $type {
            type Err = $crate::job::UnknownName;
            fn from_str(text: &str) -> Result<Self, Self::Err> {
                $type::ALL
                    .into_iter()
                    .find(|value| value.as_str() == text)
                    .ok_or_else(|| $crate::job::UnknownName::new($kind, text))
            }
        }
    };
}

pub mod access;
pub mod forecast;
pub mod github;
pub mod github_budget;
pub mod ids;
pub mod job;
pub mod moves;
pub mod observe;
pub mod planner;
pub mod routing;
pub mod runner;
pub mod share;
pub mod stopped;
pub mod time;
pub mod worker_config;

pub use job::{
    Conclusion, GuardedChange, GuardedSet, Job, JobEvent, JobId, JobSource, JobState, JobStep,
    JobTransitionError, NewJob, Route, UnknownName,
};
pub use runner::{
    NewRunner, Runner, RunnerEvent, RunnerId, RunnerOrigin, RunnerState, RunnerTransitionError,
};
pub use time::Timestamp;
