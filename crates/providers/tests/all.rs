//! The providers' tests: one conformance suite over every provider kind,
//! and GARM's external-provider protocol.
//!
//! One test binary for the crate (`autotests = false` in its Cargo.toml):
//! one link instead of one a file, and every file's tests share the
//! runner's threads. Each file is a module; run one with its name as the
//! filter, e.g. `cargo test -p runway-providers --test all conformance::`.

mod conformance;
mod garm_protocol;
