//! The event log (`[telemetry] event_log`, one JSON object a line) read
//! back, for tests that check what runway wrote there.

use std::path::Path;

use serde_json::Value;

/// Every event in the log at `path`, in order; empty while the file does
/// not exist yet. A line that is not JSON fails the test: runway writes
/// whole lines.
pub fn event_log(path: &Path) -> EventLog {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    EventLog(
        text.lines()
            .map(|line| {
                serde_json::from_str(line)
                    .unwrap_or_else(|e| panic!("event log line is not JSON ({e}): {line}"))
            })
            .collect(),
    )
}

/// The events of one log, read by [`event_log`].
#[derive(Debug, Clone)]
pub struct EventLog(pub Vec<Value>);

impl EventLog {
    /// The events named `name` (their `event` field), in order.
    pub fn of(&self, name: &str) -> Vec<&Value> {
        self.0.iter().filter(|e| e["event"] == name).collect()
    }
}
