//! Proxies in front of a server: a round-robin TCP balancer across
//! replicas, and the pieces of an HTTP proxy that injects faults.

/// A round-robin TCP load balancer on a loopback port, in front of
/// `backends` (`host:port`): each connection goes to the next backend that
/// accepts it, as a load balancer that health-checks would. Stopped when
/// dropped. Bounded: at most 10,000 connections.
pub struct Balancer {
    pub url: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    address: std::net::SocketAddr,
}

impl Balancer {
    pub fn start(backends: Vec<String>) -> Balancer {
        Balancer::start_for(backends, 10_000)
    }

    /// A balancer that serves at most `connections` connections (a bound
    /// for a longer run's load).
    pub fn start_for(backends: Vec<String>, connections: usize) -> Balancer {
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the balancer");
        let address = listener.local_addr().expect("its address");
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        std::thread::spawn(move || {
            let mut next = 0usize;
            for client in listener.incoming().take(connections) {
                if stopping.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(client) = client else { continue };
                let backend = (0..backends.len()).find_map(|i| {
                    let backend = &backends[(next + i) % backends.len()];
                    std::net::TcpStream::connect(backend).ok()
                });
                next += 1;
                let Some(backend) = backend else { continue };
                for (from, to) in [
                    (client.try_clone(), backend.try_clone()),
                    (backend.try_clone(), client.try_clone()),
                ] {
                    if let (Ok(mut from), Ok(mut to)) = (from, to) {
                        std::thread::spawn(move || {
                            let _ = std::io::copy(&mut from, &mut to);
                            let _ = to.shutdown(std::net::Shutdown::Both);
                            let _ = from.shutdown(std::net::Shutdown::Both);
                        });
                    }
                }
            }
        });
        Balancer {
            url: format!("http://{address}"),
            stop,
            address,
        }
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // Wakes the accept loop so it sees the flag.
        let _ = std::net::TcpStream::connect(self.address);
    }
}

/// Sends a request a proxy received on to `upstream`, with its headers
/// (but `host` and `content-length`, which the client sets again).
pub async fn forward(
    client: &reqwest::Client,
    upstream: &str,
    method: axum::http::Method,
    uri: &axum::http::Uri,
    headers: &axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> reqwest::Result<reqwest::Response> {
    let mut request = client.request(method, format!("{upstream}{uri}"));
    for (name, value) in headers {
        if name != "host" && name != "content-length" {
            request = request.header(name, value);
        }
    }
    request.body(body).send().await
}

/// A request a [`FaultProxy`] received, for its [`Faults`] to judge.
pub struct Seen {
    pub method: axum::http::Method,
    pub uri: axum::http::Uri,
    pub headers: axum::http::HeaderMap,
    pub body: axum::body::Bytes,
    /// The proxy's own base URL, and the one it forwards to: an answer
    /// that names the upstream's URL can be pointed at the proxy.
    pub proxy: String,
    pub upstream: String,
}

/// What a [`FaultProxy`] does with a request before the upstream sees it.
pub enum Before {
    Forward,
    /// Answers in the upstream's stead.
    Answer(axum::response::Response),
    /// Closes the connection without an answer.
    Cut,
}

/// The upstream's answer, which [`Faults::after`] may change.
pub struct Answer {
    pub status: axum::http::StatusCode,
    pub content_type: Option<axum::http::HeaderValue>,
    pub body: axum::body::Bytes,
}

/// What a [`FaultProxy`] does with the upstream's answer.
pub enum After {
    Pass(Answer),
    /// Closes the connection: the upstream acted, the client cannot know.
    Cut,
}

/// The faults a [`FaultProxy`] injects. By default it passes everything.
pub trait Faults: Send + Sync + 'static {
    /// How long to hold the request first (a slow upstream).
    fn delay(&self, _seen: &Seen) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    fn before(&self, _seen: &Seen) -> Before {
        Before::Forward
    }

    fn after(&self, _seen: &Seen, answer: Answer) -> After {
        After::Pass(answer)
    }
}

/// A loopback HTTP proxy in front of `upstream` that asks `faults` about
/// every request: what an outside service's documented misbehaviour
/// (refusals, cut connections, slow calls, lists that lag) looks like to
/// runway. An upstream that cannot be reached is a 502. Stopped when
/// dropped.
pub struct FaultProxy {
    pub url: String,
    _runtime: tokio::runtime::Runtime,
}

impl FaultProxy {
    pub fn start(upstream: &str, faults: std::sync::Arc<dyn Faults>) -> FaultProxy {
        use axum::response::IntoResponse;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime for the proxy");
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("a loopback port");
        let url = format!("http://{}", listener.local_addr().expect("its address"));
        let (upstream, proxy) = (upstream.to_owned(), url.clone());
        let client = reqwest::Client::new();
        let app = axum::Router::new().fallback(
            move |method: axum::http::Method,
                  uri: axum::http::Uri,
                  headers: axum::http::HeaderMap,
                  body: axum::body::Bytes| {
                let (faults, client) = (faults.clone(), client.clone());
                let seen = Seen {
                    method,
                    uri,
                    headers,
                    body,
                    proxy: proxy.clone(),
                    upstream: upstream.clone(),
                };
                async move {
                    let delay = faults.delay(&seen);
                    if !delay.is_zero() {
                        tokio::time::sleep(delay).await;
                    }
                    match faults.before(&seen) {
                        Before::Forward => {}
                        Before::Answer(response) => return response,
                        Before::Cut => cut_connection(),
                    }
                    let answer = match forward(
                        &client,
                        &seen.upstream,
                        seen.method.clone(),
                        &seen.uri,
                        &seen.headers,
                        seen.body.clone(),
                    )
                    .await
                    {
                        Ok(answer) => Answer {
                            status: answer.status(),
                            content_type: answer.headers().get("content-type").cloned(),
                            body: answer.bytes().await.unwrap_or_default(),
                        },
                        Err(error) => {
                            return (axum::http::StatusCode::BAD_GATEWAY, error.to_string())
                                .into_response()
                        }
                    };
                    match faults.after(&seen, answer) {
                        After::Pass(answer) => match answer.content_type {
                            Some(kind) => (answer.status, [("content-type", kind)], answer.body)
                                .into_response(),
                            None => (answer.status, answer.body).into_response(),
                        },
                        After::Cut => cut_connection(),
                    }
                }
            },
        );
        runtime.spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FaultProxy {
            url,
            _runtime: runtime,
        }
    }
}

/// Ends the connection's task without an answer: the client sees the
/// connection closed (`resume_unwind` skips the panic hook, so nothing is
/// printed; axum serves each connection in its own task).
fn cut_connection() -> ! {
    std::panic::resume_unwind(Box::new("connection cut by the test proxy"))
}
