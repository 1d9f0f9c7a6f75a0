//! The end-to-end tests: the real `runway` binary, on loopback, against
//! real PostgreSQL, Podman, moto, Prometheus, a browser and the fake
//! GitHub.
//!
//! One test binary for the crate (`autotests = false` in its Cargo.toml):
//! one link instead of one a file, and every file's tests share the
//! runner's threads. Each file is a module; run one with its name as the
//! filter, e.g. `cargo test -p runway --test all accounting::`.

mod accounting;
mod admin_write;
mod agent;
mod agent_failover;
mod autoscaling;
mod browser;
mod chaos;
mod common;
mod console;
mod containers;
mod ec2;
mod garm_machine;
mod github;
mod intake_durability;
mod local_runners;
mod observability;
mod openapi;
mod replicas;
mod scale_set;
mod secrets;
mod serve;
mod sim;
