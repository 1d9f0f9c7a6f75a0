//! Why a domain operation refused or failed, in the domain's words: a kind
//! (what the caller did wrong, or that runway cannot answer now), a stable
//! code and a clear message. The HTTP layer maps the kind to a status; the
//! full store error goes to the log here, where it is handled.

use runway_store::StoreError;

use crate::app::Service;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed or out of range.
    Invalid,
    /// The caller's credentials are missing, unknown or expired.
    Unauthenticated,
    /// The caller may not do this (another runner's job).
    Forbidden,
    NotFound,
    /// The thing is not in a state that allows this.
    Conflict,
    /// The caller is gone for good (a runner being scaled down).
    Gone,
    /// Well-formed but cannot be served (no pool for these labels).
    Unprocessable,
    /// runway cannot answer now (the store failed, contention): retry.
    Unavailable,
}

#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct AppError {
    pub kind: ErrorKind,
    pub code: &'static str,
    pub message: String,
}

impl AppError {
    pub fn new(kind: ErrorKind, code: &'static str, message: impl Into<String>) -> AppError {
        AppError {
            kind,
            code,
            message: message.into(),
        }
    }

    pub fn invalid(code: &'static str, message: impl Into<String>) -> AppError {
        AppError::new(ErrorKind::Invalid, code, message)
    }

    pub fn not_found(message: impl Into<String>) -> AppError {
        AppError::new(ErrorKind::NotFound, "not_found", message)
    }

    /// The store failed: counted, logged in full, and the caller learns
    /// only that nothing was changed and it should retry.
    pub fn store(service: &Service, operation: &str, error: StoreError) -> AppError {
        service.store_failed(operation);
        tracing::error!(%error, operation, "store operation failed");
        AppError::store_unavailable()
    }

    pub fn store_unavailable() -> AppError {
        AppError::new(
            ErrorKind::Unavailable,
            "store_unavailable",
            "the store is unavailable; nothing was changed, retry later",
        )
    }

    /// A job transition the store refused, as the runner should see it.
    pub fn transition(service: &Service, operation: &str, error: StoreError) -> AppError {
        use runway_core::JobTransitionError as E;
        match error {
            StoreError::JobNotFound(id) => AppError::not_found(format!("no job {id}")),
            StoreError::JobTransition(E::NotHolder { job, runner }) => AppError::new(
                ErrorKind::Forbidden,
                "not_holder",
                format!("job {job} is not held by runner {runner}"),
            ),
            StoreError::JobTransition(other) => {
                AppError::new(ErrorKind::Conflict, "invalid_transition", other.to_string())
            }
            other => AppError::store(service, operation, other),
        }
    }
}
