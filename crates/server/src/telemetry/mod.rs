//! What runway tells its operators: Prometheus metrics and the JSON event log.

pub mod events;
pub mod metrics;
