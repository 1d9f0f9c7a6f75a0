//! Helpers shared by the end-to-end tests that run the real binary.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const RUNWAY: &str = env!("CARGO_BIN_EXE_runway");

/// `runway` run in `dir`, logging at info, with none of the caller's own
/// `RUNWAY_*` settings leaking in.
pub fn runway(dir: &Path) -> Command {
    let mut command = Command::new(RUNWAY);
    command
        .current_dir(dir)
        .env("RUNWAY_LOG", "info")
        .env_remove("RUNWAY_CONFIG")
        .env_remove("RUNWAY_DATABASE_URL")
        .env_remove("RUNWAY_URL")
        .env_remove("RUNWAY_TOKEN");
    command
}

/// `runway-bench` (the load generators, their own binary in
/// `crates/bench`) run in `dir` as [`runway`] runs. Cargo builds it beside
/// `runway` when the workspace's tests are built (`cargo test --workspace`,
/// as `.ci/run` does); alone, build it first: `cargo build -p runway-bench`.
pub fn runway_bench(dir: &Path) -> Command {
    let exe =
        Path::new(RUNWAY).with_file_name(format!("runway-bench{}", std::env::consts::EXE_SUFFIX));
    assert!(
        exe.exists(),
        "no runway-bench at {}: build it first (cargo build -p runway-bench)",
        exe.display()
    );
    let mut command = Command::new(exe);
    command
        .current_dir(dir)
        .env("RUNWAY_LOG", "info")
        .env_remove("RUNWAY_CONFIG")
        .env_remove("RUNWAY_DATABASE_URL")
        .env_remove("RUNWAY_URL")
        .env_remove("RUNWAY_TOKEN");
    command
}

/// `runway serve ARGS` in `dir`, with its base URL.
pub fn serve_in(dir: &Path, args: &[&str]) -> (Process, String) {
    let mut command = runway(dir);
    command.arg("serve").args(args);
    spawn_serve(command)
}

/// An HTTP client that gives up after 10 s.
pub fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("an HTTP client")
}

/// The sum of the `/metrics` samples whose line starts with `series`
/// (a family name, or a name with its labels); NaN when the server does
/// not answer, which equals nothing.
pub fn metric(base: &str, series: &str) -> f64 {
    let Some(text) = client()
        .get(format!("{base}/metrics"))
        .send()
        .and_then(|r| r.text())
        .ok()
    else {
        return f64::NAN;
    };
    text.lines()
        .filter(|l| l.starts_with(series))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A child process, killed (SIGKILL) and reaped on drop, so a failing test
/// leaves nothing running.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Process {
    /// Sends SIGTERM and waits (with a deadline) for the process to exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status()
            .expect("kill -TERM");
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.0.try_wait().expect("wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "runway did not stop within 20 s of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// GET `base` + `path` without a token: (status, body).
pub fn get(base: &str, path: &str) -> (u16, String) {
    let response = client()
        .get(format!("{base}{path}"))
        .send()
        .expect("HTTP request");
    let status = response.status().as_u16();
    (status, response.text().expect("body"))
}

/// Starts `runway serve` from `command` and returns it with its base URL,
/// read from its "runway listening" log line. Its stderr is drained for as
/// long as it runs, so it never blocks on a full pipe.
pub fn spawn_serve(mut command: Command) -> (Process, String) {
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start runway serve");
    let stderr = child.stderr.take().expect("stderr");
    let process = Process(child);
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            // Once the address is known nobody listens; keep draining anyway.
            let _ = sender.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut said = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(line) = receiver.recv_timeout(left) else {
            panic!(
                "runway serve did not report its address within 30 s; it said:\n{}",
                said.join("\n")
            );
        };
        said.push(line.clone());
        if let Some(rest) = line.split("address=http://").nth(1) {
            let address = rest.split_whitespace().next().unwrap_or_default();
            return (process, format!("http://{address}"));
        }
    }
}

/// Polls `done` every 50 ms until it holds; fails the test after `seconds`.
pub fn wait_until(what: &str, seconds: u64, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A loopback port free a moment ago, for a server that must come back on
/// the same port after a restart.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free loopback port")
}

/// Kills (SIGKILL, whole process group) every runner process tracked in a
/// state directory when dropped: a failing test leaves no agent behind.
pub struct RunnerProcesses(pub std::path::PathBuf);

impl RunnerProcesses {
    /// (runner name, pid) of every tracked runner process.
    pub fn tracked(&self) -> Vec<(String, i32)> {
        let Ok(entries) = std::fs::read_dir(&self.0) else {
            return Vec::new();
        };
        let mut found: Vec<(String, i32)> = entries
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .filter_map(|e| {
                let record = serde_json::from_str::<serde_json::Value>(
                    &std::fs::read_to_string(e.path()).ok()?,
                )
                .ok()?;
                Some((
                    record["name"].as_str()?.to_owned(),
                    i32::try_from(record["pid"].as_i64()?).ok()?,
                ))
            })
            .collect();
        found.sort();
        found
    }
}

impl Drop for RunnerProcesses {
    fn drop(&mut self) {
        for (_, pid) in self.tracked() {
            if pid > 1 {
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{pid}")])
                    .status();
            }
        }
    }
}

/// A PostgreSQL schema of its own for one test, dropped when this is
/// dropped: `url` is the database (`RUNWAY_TEST_POSTGRES_URL`, or the
/// machine's service), `scoped` the same URL with the schema as its
/// search path, for `runway serve --database`.
pub struct PgSchema {
    pub url: String,
    pub schema: String,
    pub scoped: String,
}

impl PgSchema {
    pub fn create(prefix: &str) -> PgSchema {
        let url = std::env::var("RUNWAY_TEST_POSTGRES_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_owned());
        let schema = format!("{prefix}_{}", std::process::id());
        let separator = if url.contains('?') { '&' } else { '?' };
        let scoped = format!("{url}{separator}options=-c%20search_path%3D{schema}");
        let created = PgSchema {
            url,
            schema,
            scoped,
        };
        assert!(created
            .psql(&format!("CREATE SCHEMA IF NOT EXISTS {}", created.schema))
            .status
            .success());
        created
    }

    pub fn psql(&self, sql: &str) -> std::process::Output {
        Command::new("psql")
            .args([self.url.as_str(), "-qAtc", sql])
            .output()
            .expect("psql")
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        self.psql(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema));
    }
}

/// `contrib/garm-provider-local`, the GARM provider the exec tests drive.
pub fn contrib_provider() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../contrib/garm-provider-local/garm-provider-local")
        .canonicalize()
        .expect("contrib/garm-provider-local")
}

/// A PostgreSQL cluster of the test's own, on its own loopback port and in
/// its own temporary directory, for a test that stops and restarts the
/// database (never the machine's shared one). Stopped when dropped.
pub struct PrivatePostgres {
    bin: std::path::PathBuf,
    data: std::path::PathBuf,
    pub port: u16,
    _dir: tempfile::TempDir,
}

impl PrivatePostgres {
    /// `initdb` and start a cluster (trust authentication, user `postgres`).
    pub fn start() -> PrivatePostgres {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL's server binaries under /usr/lib/postgresql")
            .flatten()
            .map(|version| version.path().join("bin"))
            .filter(|bin| bin.join("initdb").exists())
            .max_by_key(|bin| {
                bin.parent()
                    .and_then(|v| v.file_name())
                    .and_then(|v| v.to_str())
                    .and_then(|v| v.parse::<u32>().ok())
                    .unwrap_or(0)
            })
            .expect("an initdb under /usr/lib/postgresql/*/bin");
        let dir = tempfile::tempdir().expect("a directory for the cluster");
        let data = dir.path().join("data");
        std::fs::create_dir(&data).expect("the data directory");
        // PostgreSQL refuses to run as root: its files belong to `postgres`.
        chown_to_postgres(dir.path());
        chown_to_postgres(&data);
        let cluster = PrivatePostgres {
            bin,
            data,
            port: free_port(),
            _dir: dir,
        };
        let initdb = cluster
            .as_postgres("initdb")
            .args(["--auth=trust", "--username=postgres", "--no-sync", "-D"])
            .arg(&cluster.data)
            .output()
            .expect("run initdb");
        assert!(
            initdb.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&initdb.stderr)
        );
        cluster.resume();
        cluster
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Runs `sql` on the cluster's `postgres` database.
    pub fn psql(&self, sql: &str) -> std::process::Output {
        Command::new("psql")
            .args([self.url().as_str(), "-qAtc", sql])
            .output()
            .expect("psql")
    }

    /// Starts the cluster and waits until it accepts connections.
    pub fn resume(&self) {
        let options = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={}",
            self.port,
            self.data.display()
        );
        let started = self
            .as_postgres("pg_ctl")
            .args(["start", "-w", "-t", "60", "-l"])
            .arg(self.data.join("log"))
            .arg("-D")
            .arg(&self.data)
            .args(["-o", &options])
            .output()
            .expect("run pg_ctl start");
        assert!(
            started.status.success(),
            "pg_ctl start: {}{}",
            String::from_utf8_lossy(&started.stderr),
            std::fs::read_to_string(self.data.join("log")).unwrap_or_default()
        );
    }

    /// Stops the cluster at once, as a crash would (`-m immediate`: no
    /// checkpoint, clients cut off; the next start replays the WAL).
    pub fn crash(&self) {
        let stopped = self
            .as_postgres("pg_ctl")
            .args(["stop", "-w", "-m", "immediate", "-D"])
            .arg(&self.data)
            .output()
            .expect("run pg_ctl stop");
        assert!(
            stopped.status.success(),
            "pg_ctl stop: {}",
            String::from_utf8_lossy(&stopped.stderr)
        );
    }

    fn as_postgres(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(path);
            command
        } else {
            Command::new(path)
        }
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = self
            .as_postgres("pg_ctl")
            .args(["stop", "-m", "immediate", "-D"])
            .arg(&self.data)
            .output();
    }
}

fn chown_to_postgres(path: &Path) {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let status = Command::new("chown")
            .args(["postgres:postgres"])
            .arg(path)
            .status()
            .expect("run chown");
        assert!(status.success(), "chown postgres {}", path.display());
    }
}

/// A registration token for pool `pool`, minted on `base` with `admin`.
pub fn registration_token(base: &str, admin: &str, pool: &str) -> String {
    let body: serde_json::Value = client()
        .post(format!("{base}/api/v1/registration-tokens"))
        .bearer_auth(admin)
        .json(&serde_json::json!({"pool": pool, "ttl": 600}))
        .send()
        .expect("mint a registration token")
        .json()
        .expect("a JSON answer");
    body["token"]
        .as_str()
        .expect("a registration token")
        .to_owned()
}

/// `runway agent` named `name` with `labels` in pool `default` of the
/// server at `base`, working under `dir/work-NAME` and logging to
/// `dir/agent-NAME.log` (see [`agent_logs`]).
pub fn agent(
    dir: &Path,
    base: &str,
    admin: &str,
    name: &str,
    labels: &str,
    extra: &[&str],
) -> Process {
    let log = std::fs::File::create(dir.join(format!("agent-{name}.log")))
        .expect("create the agent's log");
    Process(
        runway(dir)
            .args(["agent", "--url", base, "--labels", labels, "--name", name])
            .args(extra)
            .arg("--work-dir")
            .arg(dir.join(format!("work-{name}")))
            .env(
                "RUNWAY_REGISTRATION_TOKEN",
                registration_token(base, admin, "default"),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start runway agent"),
    )
}

/// What every agent started in `dir` wrote to its log, for a failing
/// test's message.
pub fn agent_logs(dir: &Path) -> String {
    let mut logs = String::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("agent-") && name.ends_with(".log") {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            logs.push_str(&format!("\n--- {name}\n{text}"));
        }
    }
    logs
}

/// Submits a job running `script` (labels `linux`); its id.
pub fn submit(base: &str, admin: &str, script: &str) -> i64 {
    let body: serde_json::Value = client()
        .post(format!("{base}/api/v1/jobs"))
        .bearer_auth(admin)
        .json(&serde_json::json!({"labels": ["linux"], "script": script, "timeout_seconds": 60}))
        .send()
        .expect("submit a job")
        .json()
        .expect("a JSON answer");
    body["id"].as_i64().expect("job id")
}

/// `GET /api/v1/jobs/{id}` (null if the server does not answer).
pub fn job(base: &str, admin: &str, id: i64) -> serde_json::Value {
    client()
        .get(format!("{base}/api/v1/jobs/{id}"))
        .bearer_auth(admin)
        .send()
        .and_then(|r| r.json())
        .unwrap_or_default()
}

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

/// The path of the program `name` on PATH, or None when it is missing —
/// which is a failure under CI, whose `.ci/run` installs `package`.
pub fn tool(name: &str, package: &str) -> Option<std::path::PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|path| path.is_file())
    });
    required(found, name, package)
}

/// `found`, or None when a test's outside tool `name` is missing — which
/// is a failure under CI, whose `.ci/run` installs `package`.
pub fn required<T>(found: Option<T>, name: &str, package: &str) -> Option<T> {
    if found.is_none() {
        assert!(
            std::env::var_os("CI").is_none(),
            "{name} is missing; install {package} (.ci/run does)"
        );
        eprintln!(
            "skipped: {name} is not installed (it comes with {package}; .ci/run installs it)"
        );
    }
    found
}

/// Runs `command` (a checker from outside: schemathesis, a browser
/// script) to its end and returns its output, stdout then stderr, after
/// asserting it succeeded; the output is printed either way.
pub fn run_checker(mut command: Command, what: &str) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    eprintln!("{text}");
    assert!(output.status.success(), "{what} failed:\n{text}");
    text
}

/// Serves `app` on a free loopback port from a runtime of its own (kept
/// alive by the returned runtime): a fault-injecting proxy of a test.
pub fn serve_router(app: axum::Router) -> (String, tokio::runtime::Runtime) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime for the proxy");
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("a loopback port");
    let url = format!("http://{}", listener.local_addr().expect("its address"));
    runtime.spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, runtime)
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
