//! GitHub's side of intake: webhook signatures and `workflow_job` payloads.

pub mod payload;
pub mod signature;
