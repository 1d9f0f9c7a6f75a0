//! runway's domain core: the job and runner state machines of DESIGN §3.
//!
//! Architecture invariant: this crate does no I/O and reads no clock. Every
//! function that depends on time takes `now` as a parameter, so the same code
//! runs in `runway serve` and on the simulator's virtual clock.

pub mod forecast;
pub mod github;
pub mod github_budget;
pub mod job;
pub mod moves;
pub mod observe;
pub mod planner;
pub mod routing;
pub mod runner;
pub mod time;
pub mod worker_config;

pub use job::{
    Conclusion, GuardedChange, GuardedSet, Job, JobEvent, JobId, JobSource, JobState,
    JobTransitionError, NewJob, Route, UnknownName,
};
pub use runner::{
    NewRunner, Runner, RunnerEvent, RunnerId, RunnerOrigin, RunnerState, RunnerTransitionError,
};
pub use time::Timestamp;
