//! GitHub itself: the REST client, `workflow_job` payloads, webhook signatures.

pub mod api;
pub mod payload;
pub mod scaleset;
pub mod signature;
