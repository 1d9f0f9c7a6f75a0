//! PostgreSQL for tests: a schema of the test's own on the machine's
//! shared service, or a private cluster for a test that stops the database.

use std::path::Path;
use std::process::Command;

use crate::free_port;

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
