//! A private moto server (PyPI's `moto[server]`, an EC2 emulator written
//! from AWS's API by others; `.ci/run` installs it into a venv) on a free
//! loopback port, stopped when dropped.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Moto {
    child: Child,
    pub url: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `moto_server` on the PATH, or None (a failure under CI, whose `.ci/run`
/// installs it).
pub fn moto_server() -> Option<std::path::PathBuf> {
    crate::tool("moto_server", "moto[server] from PyPI")
}

/// Starts moto on a free port and waits, with a deadline, until it answers.
pub fn start() -> Option<Moto> {
    let server = moto_server()?;
    let port = crate::free_port();
    let child = Command::new(server)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("moto_server starts");
    let moto = Moto {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Some(moto);
        }
        assert!(
            Instant::now() < deadline,
            "moto_server did not start within 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Credentials moto accepts, for the SDK's environment chain; no instance
/// metadata service is ever asked.
pub fn aws_environment() {
    // Every test of the binary sets the same values.
    std::env::set_var("AWS_ACCESS_KEY_ID", "testing");
    std::env::set_var("AWS_SECRET_ACCESS_KEY", "testing");
    std::env::set_var("AWS_EC2_METADATA_DISABLED", "true");
    std::env::remove_var("AWS_PROFILE");
}

/// An EC2 client of our own on moto, to look at what the provider did.
pub async fn client(url: &str) -> aws_sdk_ec2::Client {
    aws_environment();
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .endpoint_url(url)
        .load()
        .await;
    aws_sdk_ec2::Client::new(&config)
}
