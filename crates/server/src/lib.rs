//! runway's service: configuration, the HTTP surface and the service root
//! that holds the store. Later: GitHub intake, the runner and admin APIs,
//! the reconciler and telemetry.

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
pub mod runner_api;
pub mod runner_reports;
pub mod service;
pub mod worker_configs;

pub use config::{Config, ConfigError, Overrides};
pub use service::{serve, Service};
