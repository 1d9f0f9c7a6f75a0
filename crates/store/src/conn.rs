//! Connection hygiene shared by both backends and the held connections:
//! closing a connection after a failed write, and the database's own words
//! for an error. A leaf: it needs nothing else of the store's.

use sqlx::pool::PoolConnection;
use sqlx::Database;

use crate::StoreError;

/// How many rows a statement changed: each sqlx backend says so in an
/// inherent method of its own result type, this names it once.
pub trait RowsAffected {
    fn rows_affected(&self) -> u64;
}

impl RowsAffected for sqlx::sqlite::SqliteQueryResult {
    fn rows_affected(&self) -> u64 {
        sqlx::sqlite::SqliteQueryResult::rows_affected(self)
    }
}

impl RowsAffected for sqlx::postgres::PgQueryResult {
    fn rows_affected(&self) -> u64 {
        sqlx::postgres::PgQueryResult::rows_affected(self)
    }
}

/// `result` of a write on `connection`, which is closed rather than reused
/// when the write failed in the database ([`close_if_failed`]).
pub(crate) fn settle<DB: Database, T>(
    mut connection: PoolConnection<DB>,
    result: Result<T, StoreError>,
) -> Result<T, StoreError> {
    close_if_failed(&mut connection, &result);
    result
}

/// Marks `connection` to be closed, not reused, when `result` is a failure
/// in the database. A failed transaction can leave a connection out of
/// step with its database: after `SQLITE_FULL` or an I/O error SQLite rolls
/// the transaction back by itself, sqlx's count of open transactions does
/// not know, and its next "transaction" turns out to be a savepoint inside
/// one that never commits, so every later write on that connection would
/// be answered as done and never become durable. A new connection starts
/// clean.
pub(crate) fn close_if_failed<DB: Database, T>(
    connection: &mut PoolConnection<DB>,
    result: &Result<T, StoreError>,
) {
    if matches!(result, Err(StoreError::Database(_))) {
        tracing::warn!(
            "closing a database connection after a failed write; the next write opens a new one"
        );
        connection.close_on_drop();
    }
}

/// The database's own words for what went wrong, without sqlx's wrapping.
pub(crate) fn describe_sqlx_error(error: &sqlx::Error) -> String {
    match error {
        sqlx::Error::Database(e) => match e.code() {
            Some(code) => format!("{} (code {code})", e.message()),
            None => e.message().to_owned(),
        },
        other => other.to_string(),
    }
}
