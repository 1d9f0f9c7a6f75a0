//! The JSON event log (`[telemetry] event_log`): one object per line, each
//! with `event` and `log_timestamp` (epoch seconds), in the shapes of the
//! GitHub-runner metrics spec — `runner_installed`, `runner_start`,
//! `runner_stop`, `reconciliation`, `job_queuing` — plus `webhook`. Meant
//! for Promtail or Grafana Agent to ship to Loki (deploy/loki/).
//!
//! A file is rotated when it would grow past `event_log_max_bytes`:
//! `events.log` becomes `events.log.1`, the older ones shift up to
//! `event_log_keep`, the oldest is removed. Writing never fails a request:
//! an I/O error is logged and counted (`runway_event_log_errors_total`,
//! which the `RunwayEventLogErrors` alert watches) and the event dropped.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use prometheus_client::metrics::counter::Counter;
use runway_core::Timestamp;
use serde_json::{Map, Value};

use crate::config::TelemetryConfig;

enum Sink {
    Stdout,
    File {
        path: PathBuf,
        file: File,
        size: u64,
        max_bytes: u64,
        keep: u32,
    },
}

pub struct EventLog {
    sink: Option<Mutex<Sink>>,
    /// Lines that could not be written and were dropped.
    errors: Counter,
}

fn open_append(path: &Path) -> std::io::Result<(File, u64)> {
    let file = OpenOptions::new().create(true).append(true).open(path)?;
    let size = file.metadata()?.len();
    Ok((file, size))
}

impl EventLog {
    /// No event log: `emit` does nothing.
    pub fn disabled() -> EventLog {
        EventLog {
            sink: None,
            errors: Counter::default(),
        }
    }

    /// The configured log; an error names the file.
    pub fn open(config: &TelemetryConfig) -> Result<EventLog, String> {
        let sink = match config.event_log.as_deref() {
            None => return Ok(EventLog::disabled()),
            Some("-") => Sink::Stdout,
            Some(path) => {
                let path = PathBuf::from(path);
                let (file, size) = open_append(&path)
                    .map_err(|e| format!("cannot open the event log {}: {e}", path.display()))?;
                Sink::File {
                    path,
                    file,
                    size,
                    max_bytes: config.event_log_max_bytes,
                    keep: config.event_log_keep,
                }
            }
        };
        Ok(EventLog {
            sink: Some(Mutex::new(sink)),
            errors: Counter::default(),
        })
    }

    /// Counts the lines it drops in `errors` (the registry's
    /// `runway_event_log_errors_total`) from now on.
    pub fn count_errors_in(mut self, errors: Counter) -> EventLog {
        self.errors = errors;
        self
    }

    pub fn enabled(&self) -> bool {
        self.sink.is_some()
    }

    /// Writes `{"event": event, "log_timestamp": now, ...fields}`.
    pub fn emit(&self, event: &str, fields: Value, now: Timestamp) {
        let Some(sink) = &self.sink else {
            return;
        };
        let mut object = Map::new();
        object.insert("event".into(), Value::from(event));
        object.insert(
            "log_timestamp".into(),
            Value::from(now.as_millis().div_euclid(1000)),
        );
        if let Value::Object(fields) = fields {
            object.extend(fields);
        }
        let mut line = Value::Object(object).to_string();
        line.push('\n');
        let Ok(mut sink) = sink.lock() else {
            self.errors.inc();
            return;
        };
        if let Err(error) = write(&mut sink, line.as_bytes()) {
            // The first of a run is a warning; the rest only counted, so a
            // full disk does not also fill the service's own log.
            if self.errors.inc() == 0 {
                tracing::warn!(%error, event, "cannot write to the event log; event dropped (runway_event_log_errors_total counts the rest)");
            } else {
                tracing::debug!(%error, event, "cannot write to the event log; event dropped");
            }
        }
    }
}

/// What a job was, as `runner_start` and `runner_stop` describe it.
pub struct JobContext<'a> {
    pub flavor: &'a str,
    pub workflow: &'a str,
    pub repo: &'a str,
    pub github_event: &'a str,
}

impl JobContext<'_> {
    /// `{timestamp, flavor, workflow, repo, github_event}` plus `extra`'s fields.
    pub fn fields(&self, timestamp: Timestamp, extra: Value) -> Value {
        let mut fields = Map::new();
        fields.insert(
            "timestamp".into(),
            Value::from(timestamp.as_millis().div_euclid(1000)),
        );
        fields.insert("flavor".into(), Value::from(self.flavor));
        fields.insert("workflow".into(), Value::from(self.workflow));
        fields.insert("repo".into(), Value::from(self.repo));
        fields.insert("github_event".into(), Value::from(self.github_event));
        if let Value::Object(extra) = extra {
            fields.extend(extra);
        }
        Value::Object(fields)
    }
}

fn write(sink: &mut Sink, line: &[u8]) -> std::io::Result<()> {
    match sink {
        Sink::Stdout => {
            let mut stdout = std::io::stdout().lock();
            stdout.write_all(line)?;
            stdout.flush()
        }
        Sink::File {
            path,
            file,
            size,
            max_bytes,
            keep,
        } => {
            let length = line.len() as u64;
            if *size > 0 && *size + length > *max_bytes {
                rotate(path, *keep)?;
                let (fresh, fresh_size) = open_append(path)?;
                *file = fresh;
                *size = fresh_size;
            }
            file.write_all(line)?;
            *size += length;
            Ok(())
        }
    }
}

/// `path.{keep-1}` → `path.{keep}`, …, `path` → `path.1`.
fn rotate(path: &Path, keep: u32) -> std::io::Result<()> {
    let numbered = |n: u32| {
        let mut name = path.as_os_str().to_owned();
        name.push(format!(".{n}"));
        PathBuf::from(name)
    };
    if keep == 0 {
        return std::fs::remove_file(path);
    }
    let _ = std::fs::remove_file(numbered(keep));
    for n in (1..keep).rev() {
        let from = numbered(n);
        if from.exists() {
            std::fs::rename(&from, numbered(n + 1))?;
        }
    }
    std::fs::rename(path, numbered(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(path: &Path, max_bytes: u64, keep: u32) -> TelemetryConfig {
        TelemetryConfig {
            event_log: Some(path.display().to_string()),
            event_log_max_bytes: max_bytes,
            event_log_keep: keep,
        }
    }

    #[test]
    fn events_are_json_lines_with_event_and_log_timestamp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.log");
        let log = EventLog::open(&config(&path, 1 << 20, 2)).unwrap();
        log.emit(
            "job_queuing",
            serde_json::json!({"flavor": "linux", "duration": 12}),
            Timestamp::from_millis(1_700_000_000_999),
        );
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text,
            "{\"duration\":12,\"event\":\"job_queuing\",\"flavor\":\"linux\",\"log_timestamp\":1700000000}\n"
        );
    }

    #[test]
    fn the_file_rotates_at_its_size_cap_and_keeps_so_many() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.log");
        let log = EventLog::open(&config(&path, 200, 2)).unwrap();
        for i in 0..40 {
            log.emit(
                "webhook",
                serde_json::json!({"n": i}),
                Timestamp::from_millis(0),
            );
        }
        let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        assert!(size(&path) <= 200, "{}", size(&path));
        let one = path.with_extension("log.1");
        let two = path.with_extension("log.2");
        assert!(size(&one) > 0 && size(&two) > 0);
        assert!(!path.with_extension("log.3").exists(), "only two kept");
        let newest = std::fs::read_to_string(&path).unwrap();
        assert!(newest.trim_end().ends_with("\"n\":39}"), "{newest}");
    }

    #[test]
    fn a_full_disk_drops_the_line_and_counts_it() {
        let full = Path::new("/dev/full");
        if !full.exists() {
            return;
        }
        let errors = Counter::default();
        let log = EventLog::open(&config(full, 1 << 40, 1))
            .unwrap()
            .count_errors_in(errors.clone());
        for _ in 0..3 {
            log.emit("webhook", Value::Null, Timestamp::from_millis(0));
        }
        assert_eq!(errors.get(), 3);
    }

    #[test]
    fn disabled_writes_nothing_and_a_bad_path_is_named() {
        EventLog::disabled().emit("webhook", Value::Null, Timestamp::from_millis(0));
        let error = EventLog::open(&config(Path::new("/nonexistent/dir/events.log"), 100, 1))
            .err()
            .unwrap();
        assert!(error.contains("/nonexistent/dir/events.log"), "{error}");
    }
}
