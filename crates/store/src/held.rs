//! Connections the hot path keeps checked out of the pool between statements.
//!
//! sqlx's pool pings a connection (a round trip to the server: a `Sync`
//! answered by `ReadyForQuery`) every time one is given back, before it is
//! idle again, and, by default, every time one is taken. On PostgreSQL that
//! is up to three round trips for a one-statement write instead of one:
//! `tests/round_trips.rs` counts them on the wire. Acquiring is dealt with
//! by the pool's options (a ping only after a second idle); giving back
//! cannot be turned off, so the store's hot statements (its writes, and the
//! reads every runner API call makes) take their connection from here
//! instead: a connection whose statement finished (ran to its end,
//! succeeded) is kept for the next one, not given back. One whose statement
//! failed, or that was dropped mid-statement (a cancelled request), goes
//! back to the pool, whose ping on release is then exactly what it is for.
//!
//! At most `keep` connections wait here, so the pool always has the rest
//! for everything else; those idle longer than [`PING_AFTER_IDLE`] are
//! pinged before use, and those idle longer than [`GIVE_BACK_AFTER`] go back
//! to the pool at the next statement (the pool's idle timeout and lifetime
//! then apply).

use std::ops::{Deref, DerefMut};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{Connection, Database, Pool};

use crate::StoreError;

/// A connection idle at most this long is used without a ping: it has just
/// answered. One idle for longer is pinged first and replaced if the
/// server does not answer.
pub(crate) const PING_AFTER_IDLE: Duration = Duration::from_secs(1);

/// A kept connection idle this long goes back to the pool.
const GIVE_BACK_AFTER: Duration = Duration::from_secs(30);

/// A kept connection that has been out of the pool this long goes back
/// after its next statement, so the pool's `max_lifetime` applies to it too.
const RECYCLE_AFTER: Duration = Duration::from_secs(300);

struct Kept<DB: Database> {
    connection: PoolConnection<DB>,
    /// When it was taken from the pool.
    taken: Instant,
    /// When its last statement finished.
    since: Instant,
}

/// The hot path's connections: see the module's documentation.
pub(crate) struct Held<DB: Database> {
    pool: Pool<DB>,
    idle: Mutex<Vec<Kept<DB>>>,
    keep: usize,
}

impl<DB: Database> Held<DB> {
    /// Keeps at most `keep` of `pool`'s connections between statements (0:
    /// none, every connection goes back to the pool).
    pub(crate) fn new(pool: Pool<DB>, keep: usize) -> Held<DB> {
        Held {
            pool,
            idle: Mutex::new(Vec::new()),
            keep,
        }
    }

    /// A connection for a statement: the one kept last, or one from the pool.
    pub(crate) async fn acquire(&self) -> Result<HeldConnection<'_, DB>, sqlx::Error> {
        let stale = stale(&mut self.lock(), Instant::now());
        // Dropped outside the lock: each goes back through the pool.
        drop(stale);
        loop {
            let kept = self.lock().pop();
            let Some(mut kept) = kept else { break };
            if kept.since.elapsed() <= PING_AFTER_IDLE {
                return Ok(self.hold(kept));
            }
            // Bounded as the pool bounds its own ping: a server that has
            // gone silent must not hold the caller longer than an acquire.
            let limit = self.pool.options().get_acquire_timeout();
            match tokio::time::timeout(limit, kept.connection.ping()).await {
                Ok(Ok(())) => return Ok(self.hold(kept)),
                Ok(Err(error)) => {
                    tracing::info!(%error, "a kept database connection did not answer; replacing it");
                    kept.connection.close_on_drop();
                }
                Err(_) => {
                    tracing::info!(
                        "a kept database connection did not answer in time; replacing it"
                    );
                    kept.connection.close_on_drop();
                }
            }
        }
        let connection = self.pool.acquire().await?;
        let now = Instant::now();
        Ok(self.hold(Kept {
            connection,
            taken: now,
            since: now,
        }))
    }

    fn hold(&self, kept: Kept<DB>) -> HeldConnection<'_, DB> {
        HeldConnection {
            kept: Some(kept),
            home: self,
            reusable: false,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Kept<DB>>> {
        // A panic while holding the lock leaves a plain list: still sound.
        self.idle
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Keeps `kept` for the next statement, room allowing; gives back to
    /// the pool what it cannot keep and what has waited too long.
    fn put_back(&self, mut kept: Kept<DB>) {
        let now = Instant::now();
        kept.since = now;
        let mut give_back = Vec::new();
        {
            let mut idle = self.lock();
            give_back.extend(stale(&mut idle, now));
            if idle.len() < self.keep && now.duration_since(kept.taken) < RECYCLE_AFTER {
                idle.push(kept);
            } else {
                give_back.push(kept);
            }
        }
        // Dropped outside the lock: each goes back through the pool.
        drop(give_back);
    }
}

impl<DB: Database> Drop for Held<DB> {
    /// A pooled connection given back goes home from a task of its own,
    /// which needs a runtime: with one, the kept connections are given back
    /// as any other; without (a store dropped after `block_on` returned),
    /// they are closed where they are.
    fn drop(&mut self) {
        let kept = std::mem::take(&mut *self.lock());
        if tokio::runtime::Handle::try_current().is_ok() {
            drop(kept);
        } else {
            for kept in kept {
                drop(kept.connection.detach());
            }
        }
    }
}

/// The kept connections idle longer than [`GIVE_BACK_AFTER`], taken out of
/// `idle` (oldest first: the first to be put back).
fn stale<DB: Database>(idle: &mut Vec<Kept<DB>>, now: Instant) -> Vec<Kept<DB>> {
    let count = idle
        .iter()
        .take_while(|waiting| now.duration_since(waiting.since) > GIVE_BACK_AFTER)
        .count();
    idle.drain(..count).collect()
}

/// A connection out of [`Held`] for one statement (or transaction).
/// Dropped, it goes back to the pool unless [`HeldConnection::settle`]
/// found its statement done.
pub(crate) struct HeldConnection<'a, DB: Database> {
    kept: Option<Kept<DB>>,
    home: &'a Held<DB>,
    reusable: bool,
}

impl<DB: Database> HeldConnection<'_, DB> {
    /// `result` of the statement made on this connection. Done, the
    /// connection is kept for the next one. Failed in the database, it is
    /// closed rather than reused ([`crate::conn::close_if_failed`]); any other
    /// failure sends it back to the pool, which pings it first.
    pub(crate) fn settle<T>(mut self, result: Result<T, StoreError>) -> Result<T, StoreError> {
        if result.is_ok() {
            self.reusable = true;
        } else if let Some(kept) = self.kept.as_mut() {
            crate::conn::close_if_failed(&mut kept.connection, &result);
        }
        result
    }
}

impl<DB: Database> Deref for HeldConnection<'_, DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        match &self.kept {
            Some(kept) => &kept.connection,
            None => unreachable!("a held connection is present until dropped"),
        }
    }
}

impl<DB: Database> DerefMut for HeldConnection<'_, DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        match &mut self.kept {
            Some(kept) => &mut kept.connection,
            None => unreachable!("a held connection is present until dropped"),
        }
    }
}

impl<DB: Database> Drop for HeldConnection<'_, DB> {
    fn drop(&mut self) {
        if let Some(kept) = self.kept.take() {
            if self.reusable {
                self.home.put_back(kept);
            }
            // Otherwise `kept` drops here: back to the pool, pinged.
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use sqlx::sqlite::SqlitePoolOptions;

    use super::Held;
    use crate::StoreError;

    async fn pool(max: u32) -> sqlx::SqlitePool {
        SqlitePoolOptions::new()
            .max_connections(max)
            .connect("sqlite::memory:")
            .await
            .expect("an in-memory pool")
    }

    /// Polls `done` until it holds, for at most ten seconds: a connection
    /// given back returns to the pool's idle queue from a task of its own.
    async fn eventually(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !done() {
            assert!(Instant::now() < deadline, "never: {what}");
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn at_most_keep_connections_are_kept_the_rest_go_back_to_the_pool() {
        let pool = pool(3).await;
        let held = Held::new(pool.clone(), 1);
        let first = held.acquire().await.expect("one");
        let second = held.acquire().await.expect("two");
        assert_eq!(pool.size(), 2);
        drop(first.settle(Ok::<_, StoreError>(())));
        drop(second.settle(Ok::<_, StoreError>(())));
        // One kept, out of the pool's idle queue; the other back in it.
        eventually("one connection back in the pool", || pool.num_idle() == 1).await;
        assert_eq!(held.lock().len(), 1);
        // The kept one is the next one used: the pool's idle one stays.
        let again = held.acquire().await.expect("again");
        assert_eq!((held.lock().len(), pool.num_idle()), (0, 1));
        drop(again.settle(Ok::<_, StoreError>(())));
        assert_eq!(held.lock().len(), 1);
    }

    #[tokio::test]
    async fn a_connection_whose_statement_failed_or_was_dropped_is_not_kept() {
        let pool = pool(3).await;
        let held = Held::new(pool.clone(), 2);
        let failed = held.acquire().await.expect("one");
        let result: Result<(), StoreError> = Err(StoreError::Corrupt("a failed read".into()));
        assert!(failed.settle(result).is_err());
        let dropped = held.acquire().await.expect("two");
        drop(dropped);
        assert_eq!(held.lock().len(), 0, "neither is kept");
        eventually("both back in the pool", || pool.num_idle() == 2).await;

        // Failed in the database: closed, not given back to be reused.
        let closed = held.acquire().await.expect("three");
        let result: Result<(), StoreError> = Err(sqlx::Error::PoolTimedOut.into());
        assert!(closed.settle(result).is_err());
        eventually("the pool one connection smaller", || pool.size() == 1).await;
        assert_eq!(held.lock().len(), 0);
    }

    /// As the benchmarks and tests do: a store opened inside `block_on`,
    /// dropped after it returned, where no task can be spawned.
    #[test]
    fn kept_connections_are_closed_when_dropped_outside_a_runtime() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let (pool, held) = runtime.block_on(async {
            let pool = pool(2).await;
            let held = Held::new(pool.clone(), 2);
            let connection = held.acquire().await.expect("one");
            drop(connection.settle(Ok::<_, StoreError>(())));
            (pool, held)
        });
        assert_eq!(held.lock().len(), 1);
        drop(held);
        assert_eq!(pool.size(), 0, "closed, and the pool knows");
    }

    #[tokio::test]
    async fn keeping_none_gives_every_connection_back() {
        let pool = pool(2).await;
        let held = Held::new(pool.clone(), 0);
        let connection = held.acquire().await.expect("one");
        drop(connection.settle(Ok::<_, StoreError>(())));
        assert_eq!(held.lock().len(), 0);
        eventually("back in the pool", || pool.num_idle() == 1).await;
    }
}
