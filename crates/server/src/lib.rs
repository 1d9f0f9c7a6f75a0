//! runway's service, in layers (ARCHITECTURE.md; `tests/layers.rs` checks
//! the import graph):
//!
//! - `config`: the file's types, validation and secrets; depends on nothing
//!   above it.
//! - `clock`, `telemetry` (metrics, the event log), `tasks` (the one
//!   background-worker shape) and `github` (REST client, payloads,
//!   signatures): used by what is above.
//! - `app`: the service root ([`Service`]) and the domain operations every
//!   edge calls (apply a GitHub job event, submit, claim, accept, complete,
//!   sweep leases, explain), with typed results and no HTTP types.
//! - `reconcile`: observe, plan (runway-core's planner), act; the GitHub
//!   healer.
//! - `http`: routers per surface (webhooks, runner API, admin API, ops),
//!   DTOs and one error type; handlers call `app`, never the reverse.
//! - [`run`]: everything `runway serve` starts.

pub mod app;
pub mod clock;
pub mod config;
pub mod github;
pub mod http;
pub mod reconcile;
mod run;
pub mod tasks;
pub mod telemetry;

pub use app::Service;
pub use config::{Config, ConfigError, Overrides};
pub use http::serve;
pub use run::{run, RunError, RunOptions};
