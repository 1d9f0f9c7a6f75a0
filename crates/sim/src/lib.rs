//! `runway sim`: CI workloads replayed against scaling policies on a
//! virtual clock. The `runway` and `predictive` policies call the
//! production planner (`runway_core::planner::plan`) — the very function
//! `runway serve`'s reconciler calls — so what the simulator says of them
//! is what runway does.

pub mod engine;
pub mod model;
pub mod plot;
pub mod policy;
pub mod report;
pub mod stopped;
pub mod trace;
pub mod tune;

pub use engine::{run, Outcome, PoolModel, ProviderModel, Setup};
pub use trace::{TraceJob, Workload, WorkloadKind};
