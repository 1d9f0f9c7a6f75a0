//! Processes a test starts and waits on: a child killed on drop, `runway
//! serve` read for its address, polling with a deadline, loopback ports,
//! an HTTP client, the metrics a server shows, and the outside tools a
//! test needs.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// An HTTP client that gives up after 10 s.
pub fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("an HTTP client")
}

/// The text of `base`'s `/metrics` (empty when the server does not
/// answer).
pub fn metrics_text(base: &str) -> String {
    client()
        .get(format!("{base}/metrics"))
        .send()
        .and_then(|r| r.text())
        .unwrap_or_default()
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
    sum_of(&text, series)
}

/// The sum of the samples in metrics `text` whose line starts with
/// `series` (a family name, or a name with its labels); 0 when none does.
pub fn sum_of(text: &str, series: &str) -> f64 {
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

/// Waits (as [`wait_until`]) until the file at `path` holds at least
/// `lines` lines, for a test whose jobs or runners append one line each.
pub fn wait_for_lines(what: &str, path: &std::path::Path, lines: usize, seconds: u64) {
    wait_until(what, seconds, || {
        std::fs::read_to_string(path).is_ok_and(|text| text.lines().count() >= lines)
    });
}

/// A loopback port free a moment ago, for a server that must come back on
/// the same port after a restart.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    // Below Linux's ephemeral range (32768–60999 by default): a port the
    // kernel hands out for `bind(0)` or an outgoing connection can be
    // taken by any other test's client between this check and the server's
    // bind, or while a restarted server is down (CI saw `Address already in
    // use` on a restart). Here only another `free_port` could take it, and
    // the counter never hands one out twice in a process; the start is
    // spread by pid for test processes that overlap.
    const LOW: u32 = 20_000;
    const SPAN: u32 = 12_000;
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7_919) % SPAN,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..SPAN {
        let port = LOW + NEXT.fetch_add(1, Ordering::SeqCst) % SPAN;
        let port = u16::try_from(port).expect("a port below 32768");
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {LOW}..{}", LOW + SPAN)
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
