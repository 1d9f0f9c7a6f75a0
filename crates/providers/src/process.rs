//! The `process` provider: each runner is a local child process started
//! from a command (an argv list) in a clean environment (the base of
//! [`crate::environment`] and the allow-listed host variables) with the
//! runner's bootstrap variables (`RUNWAY_URL`, `RUNWAY_REGISTRATION_TOKEN`,
//! `RUNWAY_RUNNER_NAME`, …) and its launch configuration
//! (`RUNWAY_LAUNCH_CONFIG`, JSON). Nothing else of runway's environment
//! reaches it. Out of the box, `runway serve` runs `runway agent --once`
//! this way.
//!
//! Every instance is tracked on disk (`STATE_DIR/NAME.json`, with its
//! output in `STATE_DIR/NAME.log`), so a restarted `runway serve` finds the
//! processes the previous one started: the reconciler adopts those a runner
//! record knows and deletes the rest. A tracked process is identified by
//! its pid *and* its start time, so a recycled pid is never mistaken for it
//! (nor signalled). Each runner runs in its own process group: delete sends
//! SIGTERM to the group, then SIGKILL once `stop_grace` has passed.
//!
//! Unix only (it signals process groups and reads `/proc`).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use runway_core::planner::Offer;
use serde_json::{json, Value};

use crate::{CreateRequest, Instance, InstanceId, InstanceState, Provider, ProviderError};

#[derive(Debug, Clone, PartialEq)]
pub struct ProcessConfig {
    pub name: String,
    /// Program and arguments. It runs in a clean environment (see
    /// [`crate::environment`]): the base, the host variables
    /// `environment_variables` names, and the runner's bootstrap variables.
    pub command: Vec<String>,
    /// Host variables (names or prefixes) the runner may inherit.
    pub environment_variables: Vec<String>,
    /// Where instances are tracked. Per provider: two providers must not share one.
    pub state_dir: PathBuf,
    /// After SIGTERM, how long a runner may take to exit before SIGKILL.
    pub stop_grace: Duration,
    pub max_instances: u32,
    pub price_per_hour: f64,
    /// What a bid says a runner takes to become ready.
    pub boot_time: Duration,
    /// This installation's id: instances tagged with another are never touched.
    pub controller_id: String,
    /// The id of an installation from before the UUIDs: its processes are
    /// still ours.
    pub legacy_controller_id: Option<String>,
}

pub struct ProcessProvider {
    config: ProcessConfig,
    /// Instances at the last count (create, delete or list), for bids.
    used: AtomicU32,
    /// Serialises creates so two of the same name cannot both start one.
    creating: tokio::sync::Mutex<()>,
}

/// What is written to `NAME.json`.
#[derive(Debug, Clone, PartialEq)]
struct Tracked {
    name: String,
    pid: i32,
    /// Field 22 of `/proc/PID/stat`: with the pid, names the process uniquely.
    start_time: u64,
    controller_id: String,
    pool: String,
}

impl Tracked {
    fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "pid": self.pid,
            "start_time": self.start_time,
            "controller_id": self.controller_id,
            "pool": self.pool,
        })
    }

    fn from_json(value: &Value) -> Option<Tracked> {
        Some(Tracked {
            name: value.get("name")?.as_str()?.to_owned(),
            pid: i32::try_from(value.get("pid")?.as_i64()?).ok()?,
            start_time: value.get("start_time")?.as_u64()?,
            controller_id: value.get("controller_id")?.as_str()?.to_owned(),
            pool: value.get("pool")?.as_str()?.to_owned(),
        })
    }

    /// Sends `signal` to its group (if it still runs) and waits up to
    /// `within` for it to be gone; whether it is.
    async fn stopped(&self, signal: libc::c_int, within: Duration) -> bool {
        if !self.alive() {
            return true;
        }
        signal_group(self.pid, signal);
        let deadline = tokio::time::Instant::now() + within;
        while self.alive() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        !self.alive()
    }

    /// Whether the very process we started is still there (and not a zombie).
    fn alive(&self) -> bool {
        matches!(process_start_time(self.pid), Some((start, false)) if start == self.start_time)
    }
}

/// A process's start time and whether it is a zombie, from `/proc/PID/stat`.
fn process_start_time(pid: i32) -> Option<(u64, bool)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state); the start time is field 22.
    let zombie = matches!(fields.first(), Some(&"Z") | Some(&"X"));
    Some((fields.get(19)?.parse().ok()?, zombie))
}

fn signal_group(pid: i32, signal: libc::c_int) {
    if pid <= 1 {
        return; // Never signal init or "every process".
    }
    // SAFETY: kill(2) has no memory effects; a negative pid names the
    // process group the runner leads (it was started with process_group(0)).
    unsafe {
        libc::kill(-pid, signal);
    }
}

impl ProcessProvider {
    pub fn new(config: ProcessConfig) -> Result<ProcessProvider, ProviderError> {
        if config.command.is_empty() {
            return Err(ProviderError::Permanent {
                provider: config.name.clone(),
                message: "`command` is empty".to_owned(),
            });
        }
        std::fs::create_dir_all(&config.state_dir).map_err(|e| ProviderError::Permanent {
            provider: config.name.clone(),
            message: format!("cannot create {}: {e}", config.state_dir.display()),
        })?;
        let provider = ProcessProvider {
            config,
            used: AtomicU32::new(0),
            creating: tokio::sync::Mutex::new(()),
        };
        provider.used.store(
            provider.tracked().map(|t| t.len() as u32).unwrap_or(0),
            Ordering::SeqCst,
        );
        Ok(provider)
    }

    fn error(&self, message: String) -> ProviderError {
        ProviderError::Transient {
            provider: self.config.name.clone(),
            message,
        }
    }

    fn record_path(&self, name: &str) -> PathBuf {
        self.config.state_dir.join(format!("{name}.json"))
    }

    fn log_path(&self, name: &str) -> PathBuf {
        self.config.state_dir.join(format!("{name}.log"))
    }

    /// Every instance of this installation tracked in the state directory.
    fn tracked(&self) -> Result<Vec<Tracked>, ProviderError> {
        let entries = std::fs::read_dir(&self.config.state_dir).map_err(|e| {
            self.error(format!(
                "cannot read {}: {e}",
                self.config.state_dir.display()
            ))
        })?;
        let mut tracked = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            if let Some(record) = read_record(&path) {
                if self.ours(&record) {
                    tracked.push(record);
                }
            }
        }
        tracked.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(tracked)
    }

    /// Whether `record` belongs to this installation.
    fn ours(&self, record: &Tracked) -> bool {
        record.controller_id == self.config.controller_id
            || self.config.legacy_controller_id.as_deref() == Some(record.controller_id.as_str())
    }

    fn find(&self, name: &str) -> Option<Tracked> {
        read_record(&self.record_path(name)).filter(|record| self.ours(record))
    }

    fn instance(record: &Tracked) -> Instance {
        Instance {
            id: InstanceId(record.name.clone()),
            name: record.name.clone(),
            state: if record.alive() {
                InstanceState::Running
            } else {
                InstanceState::Failed
            },
        }
    }

    fn spawn(&self, request: &CreateRequest) -> Result<Tracked, ProviderError> {
        let log = std::fs::File::create(self.log_path(&request.name))
            .map_err(|e| self.error(format!("cannot create the runner's log: {e}")))?;
        let stderr = log
            .try_clone()
            .map_err(|e| self.error(format!("cannot share the runner's log: {e}")))?;
        let mut command = tokio::process::Command::new(&self.config.command[0]);
        let own = request.bootstrap.clone().into_iter().chain([
            ("RUNWAY_RUNNER_NAME".to_owned(), request.name.clone()),
            ("RUNWAY_POOL".to_owned(), request.pool.clone()),
            ("RUNWAY_RUNNER_LABELS".to_owned(), request.labels.join(",")),
            (
                "RUNWAY_LAUNCH_CONFIG".to_owned(),
                request.launch_config.to_string(),
            ),
        ]);
        crate::environment::set_clean(&mut command, &self.config.environment_variables, own);
        command
            .args(&self.config.command[1..])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr)
            // Its own group: a Ctrl-C to `runway serve` does not reach it,
            // and a delete reaches everything it started.
            .process_group(0)
            .kill_on_drop(false);
        let mut child = command.spawn().map_err(|e| ProviderError::Permanent {
            provider: self.config.name.clone(),
            message: format!("cannot start {:?}: {e}", self.config.command[0]),
        })?;
        let pid = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .ok_or_else(|| self.error("the runner exited at once".to_owned()))?;
        // Reap it when it exits, so it never lingers as a zombie.
        tokio::spawn(async move {
            let _ = child.wait().await;
        });
        let start_time = process_start_time(pid).map(|(start, _)| start).unwrap_or(0);
        Ok(Tracked {
            name: request.name.clone(),
            pid,
            start_time,
            controller_id: self.config.controller_id.clone(),
            pool: request.pool.clone(),
        })
    }

    fn write_record(&self, record: &Tracked) -> Result<(), ProviderError> {
        // Written to a temporary file and renamed: a crash leaves the old
        // record or the new one, never half of one.
        let path = self.record_path(&record.name);
        let temporary = path.with_extension("json.tmp");
        std::fs::write(&temporary, record.to_json().to_string())
            .and_then(|()| std::fs::rename(&temporary, &path))
            .map_err(|e| self.error(format!("cannot record the runner's process: {e}")))
    }

    fn refresh_count(&self) {
        if let Ok(tracked) = self.tracked() {
            self.used.store(tracked.len() as u32, Ordering::SeqCst);
        }
    }
}

fn read_record(path: &Path) -> Option<Tracked> {
    let text = std::fs::read_to_string(path).ok()?;
    Tracked::from_json(&serde_json::from_str(&text).ok()?)
}

#[async_trait]
impl Provider for ProcessProvider {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn runners_register(&self) -> bool {
        true
    }

    async fn create(&self, request: &CreateRequest) -> Result<Instance, ProviderError> {
        let _one_at_a_time = self.creating.lock().await;
        if let Some(existing) = self.find(&request.name) {
            return Ok(ProcessProvider::instance(&existing));
        }
        let used = self.tracked()?.len() as u32;
        if used >= self.config.max_instances {
            return Err(ProviderError::Quota {
                provider: self.config.name.clone(),
                limit: self.config.max_instances,
            });
        }
        let record = self.spawn(request)?;
        if let Err(error) = self.write_record(&record) {
            // Untracked, it could never be deleted: stop it now.
            signal_group(record.pid, libc::SIGKILL);
            return Err(error);
        }
        self.used.store(used + 1, Ordering::SeqCst);
        tracing::info!(provider = %self.config.name, runner = %record.name, pid = record.pid, "runner process started");
        Ok(ProcessProvider::instance(&record))
    }

    async fn delete(&self, id: &InstanceId) -> Result<(), ProviderError> {
        let Some(record) = self.find(&id.0) else {
            return Ok(());
        };
        if !record.stopped(libc::SIGTERM, self.config.stop_grace).await {
            tracing::warn!(provider = %self.config.name, runner = %record.name, "runner ignored SIGTERM; killing it");
            if !record.stopped(libc::SIGKILL, Duration::from_secs(5)).await {
                return Err(self.error(format!(
                    "process {} of runner {} survived SIGKILL",
                    record.pid, record.name
                )));
            }
        }
        let _ = std::fs::remove_file(self.log_path(&record.name));
        std::fs::remove_file(self.record_path(&record.name))
            .or_else(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    Ok(())
                } else {
                    Err(e)
                }
            })
            .map_err(|e| self.error(format!("cannot forget runner {}: {e}", record.name)))?;
        self.refresh_count();
        Ok(())
    }

    async fn list(&self) -> Result<Vec<Instance>, ProviderError> {
        let tracked = self.tracked()?;
        self.used.store(tracked.len() as u32, Ordering::SeqCst);
        Ok(tracked.iter().map(ProcessProvider::instance).collect())
    }

    fn bid(&self, _pool: &str, capacity: u32) -> Vec<Offer> {
        crate::quota_offer(
            &self.config.name,
            self.config.max_instances,
            self.used.load(Ordering::SeqCst),
            capacity,
            self.config.price_per_hour,
            self.config.boot_time,
            1.0,
        )
    }
}
