//! Test harness shared by the store's integration tests: a fresh store per
//! test, on a temporary SQLite file or in a PostgreSQL schema of its own that
//! is dropped afterwards (even when the test fails).

#![allow(dead_code)]

use std::sync::Arc;

use rand::Rng;
use runway_core::job::{NewJob, Route};
use runway_core::{JobSource, Timestamp};
use runway_store::{OpenOptions, PostgresStore, SqliteStore, Store};

/// The machine's PostgreSQL service unless `RUNWAY_TEST_POSTGRES_URL` says otherwise.
pub fn postgres_url() -> String {
    std::env::var("RUNWAY_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned())
}

pub fn unique_schema() -> String {
    format!("runway_test_{:016x}", rand::thread_rng().gen::<u64>())
}

pub struct Harness {
    pub store: Arc<dyn Store>,
    pub url: String,
    postgres_schema: Option<String>,
    _dir: Option<tempfile::TempDir>,
}

impl Harness {
    pub async fn sqlite() -> Harness {
        let dir = tempfile::tempdir().expect("temporary directory");
        let url = dir.path().join("runway.db").display().to_string();
        let store = SqliteStore::open(&url).await.expect("open SQLite store");
        Harness {
            store: Arc::new(store),
            url,
            postgres_schema: None,
            _dir: Some(dir),
        }
    }

    pub async fn postgres() -> Harness {
        let url = postgres_url();
        let schema = unique_schema();
        let options = OpenOptions {
            max_connections: 12,
            ..OpenOptions::default()
        };
        let store = PostgresStore::open(&url, Some(&schema), &options)
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL must be running for the store tests: {e}"));
        Harness {
            store: Arc::new(store),
            url,
            postgres_schema: Some(schema),
            _dir: None,
        }
    }
}

impl Harness {
    pub fn postgres_schema(&self) -> Option<&str> {
        self.postgres_schema.as_deref()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        if let Some(schema) = self.postgres_schema.take() {
            let url = self.url.clone();
            // Drop may run inside the test's runtime, so clean up on a thread
            // with a runtime of its own.
            let dropped = std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                runtime.block_on(PostgresStore::drop_schema(&url, &schema))
            })
            .join();
            if !matches!(dropped, Ok(Ok(()))) {
                eprintln!("warning: could not drop a test schema: {dropped:?}");
            }
        }
    }
}

pub fn at(millis: i64) -> Timestamp {
    Timestamp::from_millis(millis)
}

pub fn api_job(external_id: &str, pool: &str) -> NewJob {
    NewJob {
        source: JobSource::Api,
        external_id: external_id.to_owned(),
        route: Route::Pool(pool.to_owned()),
        labels: vec!["self-hosted".to_owned(), "linux".to_owned()],
        payload: r#"{"script":"echo hi"}"#.to_owned(),
        max_attempts: 3,
    }
}

/// Runs each named case of `cases` against both backends.
#[macro_export]
macro_rules! on_both_backends {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let harness = $crate::common::Harness::sqlite().await;
                    super::cases::$case(harness.store.clone()).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let harness = $crate::common::Harness::postgres().await;
                    super::cases::$case(harness.store.clone()).await;
                }
            )*
        }
    };
}
