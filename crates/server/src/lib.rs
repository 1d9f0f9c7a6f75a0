//! runway's service: configuration, the HTTP surfaces (GitHub webhooks, the
//! runner API, the admin API, operations), the service root that holds the
//! store, the reconciler, the GitHub client and healer, the background
//! workers and telemetry. [`run`] starts all of it, as `runway serve` does.

pub mod api;
pub mod auth;
pub mod background;
pub mod config;
pub mod error;
pub mod events;
pub mod explain;
pub mod github;
pub mod http;
pub mod intake;
pub mod metrics;
pub mod reconciler;
mod run;
pub mod runner_api;
pub mod runner_reports;
pub mod service;
pub mod tasks;
pub mod worker_configs;

pub use config::{Config, ConfigError, Overrides};
pub use run::{run, RunError, RunOptions};
pub use service::{serve, Service};
