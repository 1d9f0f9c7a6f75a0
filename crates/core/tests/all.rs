//! The core's tests: state machines, the planner, the GitHub budget and
//! worker configurations, many of them property tests.
//!
//! One test binary for the crate (`autotests = false` in its Cargo.toml):
//! one link instead of one a file, and every file's tests share the
//! runner's threads. Each file is a module; run one with its name as the
//! filter, e.g. `cargo test -p runway-core --test all github_budget::`.

mod github_budget;
mod planner;
mod state_machines;
mod worker_config;
