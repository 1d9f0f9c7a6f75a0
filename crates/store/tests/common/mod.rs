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
        Harness::postgres_through(&postgres_url()).await
    }

    /// A PostgreSQL store that reaches the test database through `through`
    /// (a [`RoundTrips`] proxy's URL); `url` stays the direct one.
    pub async fn postgres_through(through: &str) -> Harness {
        let options = OpenOptions {
            max_connections: 12,
            ..OpenOptions::default()
        };
        Harness::postgres_with(through, options).await
    }

    /// [`Harness::postgres_through`] with `options`.
    pub async fn postgres_with(through: &str, options: OpenOptions) -> Harness {
        let url = postgres_url();
        let schema = unique_schema();
        let store = PostgresStore::open(through, Some(&schema), &options)
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
        share: Default::default(),
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

/// What the clients of a [`RoundTrips`] proxy asked of PostgreSQL.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Trips {
    /// Round trips that carried a statement: a `Sync` closing parse, bind
    /// or execute messages, or a simple `Query`.
    pub statements: u64,
    /// Round trips that carried nothing: a lone `Sync` (a ping).
    pub pings: u64,
}

impl std::ops::Sub for Trips {
    type Output = Trips;
    fn sub(self, before: Trips) -> Trips {
        Trips {
            statements: self.statements - before.statements,
            pings: self.pings - before.pings,
        }
    }
}

/// A loopback TCP proxy in front of the test PostgreSQL that reads the
/// frontend side of the wire protocol and counts the round trips its
/// clients make: what a store path costs in trips to the server, whatever
/// the code that makes them. It can also cut every connection through it,
/// as a server restart or a lost network would.
pub struct RoundTrips {
    /// The test database's URL, through the proxy (TLS off: the proxy reads
    /// the messages).
    pub url: String,
    trips: Arc<std::sync::Mutex<Trips>>,
    connections: Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
    accept: tokio::task::JoinHandle<()>,
    silent: Arc<std::sync::atomic::AtomicBool>,
}

impl RoundTrips {
    pub async fn start() -> RoundTrips {
        let mut url = url::Url::parse(&postgres_url()).expect("a PostgreSQL URL");
        let upstream = format!(
            "{}:{}",
            url.host_str().unwrap_or("127.0.0.1"),
            url.port().unwrap_or(5432)
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        url.set_host(Some("127.0.0.1")).expect("host");
        url.set_port(Some(port)).expect("port");
        url.query_pairs_mut().append_pair("sslmode", "disable");
        let trips = Arc::new(std::sync::Mutex::new(Trips::default()));
        let connections = Arc::new(std::sync::Mutex::new(Vec::new()));
        let silent = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let accept = tokio::spawn({
            let trips = trips.clone();
            let connections = connections.clone();
            let silent = silent.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let Ok(server) = tokio::net::TcpStream::connect(&upstream).await else {
                        continue;
                    };
                    // Each message is forwarded as it is read: no waiting
                    // for more to fill a segment.
                    let _ = (client.set_nodelay(true), server.set_nodelay(true));
                    let task = tokio::spawn(relay(client, server, trips.clone(), silent.clone()));
                    let mut open = connections.lock().expect("connections");
                    open.retain(|handle: &tokio::task::AbortHandle| !handle.is_finished());
                    open.push(task.abort_handle());
                }
            }
        });
        RoundTrips {
            url: url.to_string(),
            trips,
            connections,
            accept,
            silent,
        }
    }

    pub fn trips(&self) -> Trips {
        *self.trips.lock().expect("trips")
    }

    /// From now on nothing a client sends reaches the server, and the
    /// connections stay open: a server gone silent (a network partition, a
    /// hung host).
    pub fn go_silent(&self) {
        self.silent.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Closes every connection open through the proxy.
    pub fn sever(&self) {
        for handle in self.connections.lock().expect("connections").drain(..) {
            handle.abort();
        }
    }
}

impl Drop for RoundTrips {
    fn drop(&mut self) {
        self.accept.abort();
        self.sever();
    }
}

/// Copies bytes both ways, reading the client's messages on the way.
async fn relay(
    client: tokio::net::TcpStream,
    server: tokio::net::TcpStream,
    trips: Arc<std::sync::Mutex<Trips>>,
    silent: Arc<std::sync::atomic::AtomicBool>,
) {
    let (from_client, mut to_client) = client.into_split();
    let (mut from_server, to_server) = server.into_split();
    let down = tokio::io::copy(&mut from_server, &mut to_client);
    tokio::select! {
        _ = down => {}
        _ = count_frontend(from_client, to_server, trips, silent) => {}
    }
}

/// Forwards the frontend's messages, counting its round trips: after the
/// untyped start-up message, each message is a type byte and a length.
async fn count_frontend(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    trips: Arc<std::sync::Mutex<Trips>>,
    silent: Arc<std::sync::atomic::AtomicBool>,
) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let forward = |message: Vec<u8>| {
        // Lost on the way, once the proxy has gone silent.
        let lost = silent.load(std::sync::atomic::Ordering::SeqCst);
        (!lost).then_some(message)
    };
    const PROTOCOL_3: u32 = 196_608;
    loop {
        let mut length = [0u8; 4];
        from.read_exact(&mut length).await?;
        let mut body = vec![0u8; (u32::from_be_bytes(length) as usize).saturating_sub(4)];
        from.read_exact(&mut body).await?;
        if let Some(message) = forward([&length[..], &body].concat()) {
            to.write_all(&message).await?;
        }
        if body
            .get(..4)
            .map(|code| u32::from_be_bytes([code[0], code[1], code[2], code[3]]))
            == Some(PROTOCOL_3)
        {
            break;
        }
    }
    let mut carrying = false;
    loop {
        let mut header = [0u8; 5];
        from.read_exact(&mut header).await?;
        let length = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
        let mut body = vec![0u8; length.saturating_sub(4)];
        from.read_exact(&mut body).await?;
        if let Some(message) = forward([&header[..], &body].concat()) {
            to.write_all(&message).await?;
        }
        let mut trips = trips.lock().expect("trips");
        match header[0] {
            b'S' if carrying => {
                trips.statements += 1;
                carrying = false;
            }
            b'S' => trips.pings += 1,
            b'Q' => trips.statements += 1,
            // Flush, Terminate: no statement.
            b'H' | b'X' => {}
            _ => carrying = true,
        }
    }
}
