//! GitHub's side of intake: webhook signatures and `workflow_job` payloads.

pub mod api;
pub mod heal;
pub mod payload;
pub mod signature;
