//! The store's tests: the same conformance suite on SQLite and PostgreSQL,
//! concurrency, crashes, fair share and what each call costs.
//!
//! One test binary for the crate (`autotests = false` in its Cargo.toml):
//! one link instead of one a file, and every file's tests share the
//! runner's threads. Each file is a module; run one with its name as the
//! filter, e.g. `cargo test -p runway-store --test all concurrency::`.

#[macro_use]
mod common;
mod concurrency;
mod conformance;
mod crash;
mod fair_share;
mod live_rows;
mod round_trips;
