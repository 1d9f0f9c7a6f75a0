//! What runway's test files share, in one dev-only crate: each test file
//! used to carry its own copy of most of this.
//!
//! - [`process`]: a child killed on drop, `runway serve` read for its
//!   address, polling with a deadline, loopback ports, the metrics a server
//!   shows, the outside tools a test needs;
//! - [`pg`]: a PostgreSQL schema of a test's own, or a private cluster;
//! - [`fake_github`]: GitHub's REST API and webhooks, checked against
//!   GitHub's own OpenAPI description;
//! - [`moto`] and [`podman`]: a private EC2 emulator and container engine;
//! - [`proxy`]: a balancer across replicas and the pieces of a
//!   fault-injecting HTTP proxy;
//! - [`events`]: the event log read back;
//! - [`config`]: the `[server]` head every test config starts with.
//!
//! The `runway` binary itself is not known here (Cargo tells its path only
//! to the CLI crate's own tests): helpers take a `Command` or a path.

pub mod config;
pub mod events;
pub mod fake_github;
pub mod moto;
pub mod pg;
pub mod podman;
pub mod process;
pub mod proxy;

pub use config::{server_head, write_config};
pub use events::{event_log, EventLog};
pub use pg::{PgSchema, PrivatePostgres};
pub use process::*;
pub use proxy::{Balancer, FaultProxy};
