//! The server's tests: a `Service` on a real store driven through the real
//! router, the reconciler against fake and real providers, and the house
//! rules.
//!
//! One test binary for the crate (`autotests = false` in its Cargo.toml):
//! one link instead of one a file, and every file's tests share the
//! runner's threads. Each file is a module; run one with its name as the
//! filter, e.g. `cargo test -p runway-server --test all console::`.

mod common;
mod console;
mod dashboard;
mod fencing;
mod garm_instance_api;
mod github_api;
mod github_pools;
mod layers;
mod reconciler;
mod retention;
mod runner_api;
mod scoped_tokens;
mod stock;
mod webhook_properties;
mod webhooks;
mod worker_configs;
