//! The container's own words: its name, user, the bootstrap and entry scripts
//! it runs, and what its end says (exit code, OOM, log tail).

use super::*;

/// Why a container ended, as its runner's reason says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Ended {
    pub(super) detail: String,
}

/// The engine's socket: `socket`, else `DOCKER_HOST` (unix), else the
/// first of Docker's and Podman's usual sockets that exists.
pub fn engine_socket(socket: Option<&Path>) -> Option<PathBuf> {
    if let Some(socket) = socket {
        return Some(socket.to_path_buf());
    }
    if let Ok(host) = std::env::var("DOCKER_HOST") {
        if let Some(path) = host.strip_prefix("unix://") {
            return Some(PathBuf::from(path));
        }
    }
    let mut candidates = vec![PathBuf::from("/var/run/docker.sock")];
    if let Ok(runtime) = std::env::var("XDG_RUNTIME_DIR") {
        candidates.push(Path::new(&runtime).join("podman/podman.sock"));
        candidates.push(Path::new(&runtime).join("docker.sock"));
    }
    candidates.push(PathBuf::from("/run/podman/podman.sock"));
    candidates.into_iter().find(|path| path.exists())
}

/// A container name from a runner name (the engine allows
/// `[a-zA-Z0-9][a-zA-Z0-9_.-]*`).
pub(super) fn container_name(runner: &str) -> String {
    let clean: String = runner
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("runway-{clean}")
}

/// `UID` or `UID:GID`, as numbers (a name is resolved in the image, not here).
pub(super) fn numeric_user(user: &str) -> Option<(u32, u32)> {
    let (uid, gid) = user.split_once(':').unwrap_or((user, user));
    Some((uid.parse().ok()?, gid.parse().ok()?))
}

/// A value quoted for `sh`: `'…'` with each `'` written `'\''`.
pub(super) fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', "'\\''"))
}

/// The bootstrap file: one `export NAME='value'` a line.
pub fn bootstrap_script(variables: &BTreeMap<String, String>) -> String {
    let mut script = String::new();
    for (name, value) in variables {
        if name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !name.is_empty() {
            script.push_str(&format!("export {name}={}\n", shell_quote(value)));
        }
    }
    script
}

/// What the container's `/bin/sh -c` runs: read the bootstrap, delete it,
/// then `command`.
pub fn entry_script(command: &str) -> String {
    format!(
        "set -e; . {BOOTSTRAP_MOUNT}/bootstrap.sh; rm -f {BOOTSTRAP_MOUNT}/bootstrap.sh; set +e; {command}"
    )
}

/// Why a container that exited ended, from its inspected state: "out of
/// memory" when the kernel killed it for memory (or SIGKILL under a
/// memory limit runway did not send), else its exit code; with the last
/// lines of its output.
pub(super) fn ended_detail(
    oom_killed: bool,
    exit_code: Option<i64>,
    memory_limit: Option<i64>,
    stopped_by_runway: bool,
    error: Option<&str>,
    output: &str,
) -> String {
    let killed = exit_code == Some(137) && !stopped_by_runway;
    let mut detail = if oom_killed {
        "out of memory (killed by the kernel at its memory limit)".to_owned()
    } else if killed && memory_limit.is_some_and(|m| m > 0) {
        let mib = memory_limit.unwrap_or(0) / (1024 * 1024);
        format!("out of memory: killed by SIGKILL under its {mib} MiB memory limit")
    } else {
        match exit_code {
            Some(code) => format!("exited with code {code}"),
            None => "ended".to_owned(),
        }
    };
    if let Some(error) = error.filter(|e| !e.is_empty()) {
        detail.push_str(&format!(" ({error})"));
    }
    let lines: Vec<&str> = output.lines().collect();
    let tail = lines[lines.len().saturating_sub(LOG_LINES)..].join("\n");
    let mut tail: &str = &tail;
    if tail.len() > LOG_BYTES {
        let mut start = tail.len() - LOG_BYTES;
        while !tail.is_char_boundary(start) {
            start += 1;
        }
        tail = &tail[start..];
    }
    if !tail.trim().is_empty() {
        detail.push_str("; last output:\n");
        detail.push_str(tail);
    }
    detail
}

/// Whether an engine call that failed with `error` may still have done
/// what it was asked: it timed out, or its connection broke after the
/// request was sent.
pub(super) fn outcome_unknown(error: &bollard::errors::Error) -> bool {
    use bollard::errors::Error as E;
    matches!(
        error,
        E::RequestTimeoutError | E::HyperResponseError { .. } | E::HyperLegacyError { .. }
    )
}
