//! GARM's instance API: what a machine booted by a GARM provider calls back
//! (cloudbase/garm `apiserver/routers`, `runner/metadata.go`), served under
//! [`METADATA_PATH`] and [`CALLBACKS_PATH`]. The machine authenticates with
//! the bootstrap's `instance-token`: an `rwi_` bearer token bound to one
//! runner, stored only as a hash, valid until the runner's boot deadline and
//! only while the runner is still coming up (requested or provisioning; in
//! a GitHub pool also idle, since GitHub, not runway, sees it register) —
//! useless once the runner registered, runs a job or ended. A stock
//! runner's token (issue 60) answers 409 `instance_not_started` until
//! runway starts the runner for a job and arms it ([`arm`]).
//!
//! What the machine gets: a runway-agent pool's runner its one-time
//! registration token (once, as GARM hands out one) and an install script
//! that downloads this very binary (from [`TOOLS_PATH`], checked against its
//! sha256) and runs `runway agent --once`; a GitHub pool's runner its
//! just-in-time configuration split into GARM's files (`.runner`,
//! `.credentials`, `.credentials_rsaparams`), a systemd unit and an install
//! script that starts the GitHub runner from them. Status and system-info
//! callbacks are recorded as the runner's reports; a `failed` status fails
//! the runner with the machine's message.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use base64::Engine as _;
use runway_core::{Runner, RunnerEvent, RunnerState, Timestamp};
use serde::Deserialize;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::app::error::{AppError, ErrorKind};
use crate::app::tokens::{new_token, token_hash};
use crate::app::Service;
use crate::config::Target;

/// Where GARM's `metadata-url` points.
pub const METADATA_PATH: &str = "/api/v1/garm/metadata";
/// Where GARM's `callback-url` points.
pub const CALLBACKS_PATH: &str = "/api/v1/garm/callbacks";
/// Where a machine downloads runway's own binary (the `tools` of a
/// runway-agent pool).
pub const TOOLS_PATH: &str = "/api/v1/garm/tools/runway";

/// The most of a callback's body kept.
pub const MAX_CALLBACK_BYTES: usize = 16 * 1024;

fn unauthenticated(message: impl Into<String>) -> AppError {
    AppError::new(
        ErrorKind::Unauthenticated,
        "invalid_instance_token",
        message,
    )
}

/// A machine's call, authenticated.
#[derive(Debug)]
pub struct Instance {
    pub runner: Runner,
    pub token_hash: String,
    pub jit_files: Option<String>,
}

/// What a new runner's machine gets for the instance API: the URLs and its
/// token (secret). Minted by the reconciler with the runner.
pub async fn mint(
    service: &Service,
    runner: &Runner,
    expires_at: Timestamp,
    jit_config: Option<&str>,
) -> Result<String, runway_store::StoreError> {
    let token = new_token("rwi_");
    let files = jit_config.and_then(jit_files);
    service
        .store
        .create_instance_token(&token_hash(&token), runner.id, expires_at, files.as_deref())
        .await?;
    Ok(token)
}

/// Arms the instance token a stock runner's machine got at its create, for
/// this start of it: valid until `expires_at`, with a GitHub pool's JIT
/// configuration minted for the start. How many tokens it armed (none: the
/// machine has no way to its credential, and must not be started).
pub async fn arm(
    service: &Service,
    runner: &Runner,
    expires_at: Timestamp,
    jit_config: Option<&str>,
) -> Result<u64, runway_store::StoreError> {
    let files = jit_config.and_then(jit_files);
    service
        .store
        .arm_instance_tokens(runner.id, expires_at, files.as_deref())
        .await
}

/// GitHub's encoded JIT configuration is base64 of a JSON object of file
/// name to base64 contents: that object, as text.
fn jit_files(encoded: &str) -> Option<String> {
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let files: BTreeMap<String, String> = serde_json::from_slice(&decoded).ok()?;
    serde_json::to_string(&files).ok()
}

/// The runner of `bearer`, if the token is valid now.
pub async fn authenticate(
    service: &Service,
    bearer: &str,
    now: Timestamp,
) -> Result<Instance, AppError> {
    let hash = token_hash(bearer);
    let record = service
        .store
        .find_instance_token(&hash)
        .await
        .map_err(|e| AppError::store(service, "find_instance_token", e))?
        .ok_or_else(|| unauthenticated("the instance token is not valid"))?;
    if record.expires_at <= now {
        return Err(unauthenticated("the instance token has expired"));
    }
    let runner = service
        .store
        .get_runner(record.runner)
        .await
        .map_err(|e| AppError::store(service, "get_runner", e))?
        .ok_or_else(|| unauthenticated("the instance token's runner is gone"))?;
    if runner.stock {
        // Its machine's warm boot, or a start runway did not make: it
        // waits (the install script and `runway agent` ask again) until
        // runway starts it for a job or stops it.
        return Err(AppError::new(
            ErrorKind::Conflict,
            "instance_not_started",
            format!(
                "runner {} is in its pool's stock of stopped runners: it gets its credential when runway starts it for a job",
                runner.name
            ),
        ));
    }
    let github = is_github(service, &runner);
    let coming_up = matches!(
        runner.state,
        RunnerState::Requested | RunnerState::Provisioning
    ) || (github && runner.state == RunnerState::Idle);
    if !coming_up {
        return Err(unauthenticated(format!(
            "the instance token is spent: runner {} is {}",
            runner.name,
            runner.state.as_str()
        )));
    }
    Ok(Instance {
        runner,
        token_hash: hash,
        jit_files: record.jit_files,
    })
}

fn is_github(service: &Service, runner: &Runner) -> bool {
    github_target(service, runner).is_some()
}

fn github_target(service: &Service, runner: &Runner) -> Option<Target> {
    service
        .config()
        .pool(&runner.pool)
        .and_then(|p| p.github.as_ref())
        .map(|g| g.target.clone())
}

/// GARM's `repo_url` of a GitHub pool: the web address of its organisation
/// or repository, on github.com or on the GitHub Enterprise Server whose
/// API is `api_url` (`https://HOST/api/v3`).
pub fn repo_url(api_url: &str, target: &Target) -> String {
    target.web_url(api_url)
}

/// `runner-registration-token/`: a runway-agent runner's one-time
/// registration token, handed out once (as GARM does); a GitHub pool's
/// runner starts from its JIT configuration instead.
pub async fn registration_token(
    service: &Service,
    instance: &Instance,
    now: Timestamp,
) -> Result<String, AppError> {
    if instance.jit_files.is_some() || is_github(service, &instance.runner) {
        return Err(unauthenticated(
            "this runner starts from a just-in-time configuration: fetch credentials/runner, credentials/credentials and credentials/credentials_rsaparams",
        ));
    }
    let first = service
        .store
        .take_instance_registration(&instance.token_hash, now)
        .await
        .map_err(|e| AppError::store(service, "take_instance_registration", e))?;
    if !first {
        return Err(unauthenticated(
            "this instance has fetched its registration token already",
        ));
    }
    let pool = &instance.runner.pool;
    let boot_timeout = service
        .config()
        .pools
        .iter()
        .find(|p| &p.name == pool)
        .map(|p| p.boot_timeout)
        .unwrap_or(std::time::Duration::from_secs(600));
    let token = new_token("rwr_");
    service
        .store
        .create_registration_token(
            &token_hash(&token),
            pool,
            Some(instance.runner.id),
            instance.runner.requested_at.plus(boot_timeout).max(now),
            now,
        )
        .await
        .map_err(|e| AppError::store(service, "create_registration_token", e))?;
    Ok(token)
}

/// `credentials/{name}`: one file of the runner's JIT configuration
/// (`runner` is `.runner`), decoded.
pub fn jit_file(instance: &Instance, name: &str) -> Result<Vec<u8>, AppError> {
    let files = instance
        .jit_files
        .as_deref()
        .ok_or_else(|| AppError::not_found("instance not configured for JIT"))?;
    let files: BTreeMap<String, String> = serde_json::from_str(files)
        .map_err(|_| AppError::not_found("instance not configured for JIT"))?;
    let contents = files
        .get(&format!(".{name}"))
        .ok_or_else(|| AppError::not_found(format!("could not find file \".{name}\"")))?;
    base64::engine::general_purpose::STANDARD
        .decode(contents)
        .map_err(|_| AppError::not_found(format!("file \".{name}\" is not base64")))
}

/// `system/service-name/`: the systemd service the runner runs as (GARM's
/// names for GitHub runners).
pub fn service_name(service: &Service, runner: &Runner) -> String {
    match github_target(service, runner) {
        Some(Target::Org(org)) => format!("actions.runner.{org}"),
        Some(Target::Repo { owner, name }) => format!("actions.runner.{owner}.{name}"),
        Some(Target::Enterprise(slug)) => format!("actions.runner.{slug}"),
        None => "runway-agent".to_owned(),
    }
}

/// `systemd/unit-file/?runAsUser=USER`: the unit that runs the runner.
pub fn unit_file(service: &Service, runner: &Runner, run_as_user: Option<&str>) -> String {
    let user = run_as_user
        .filter(|u| {
            !u.is_empty()
                && u.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        })
        .unwrap_or("runner");
    let name = service_name(service, runner);
    let start = if is_github(service, runner) {
        format!("/home/{user}/actions-runner/runsvc.sh")
    } else {
        "/opt/runway-agent/runway agent --once".to_owned()
    };
    format!(
        "[Unit]\nDescription={name} ({runner})\nAfter=network-online.target\n\n\
         [Service]\nExecStart={start}\nUser={user}\nWorkingDirectory=/home/{user}\n\
         KillMode=process\nKillSignal=SIGTERM\nTimeoutStopSec=5min\n\n\
         [Install]\nWantedBy=multi-user.target\n",
        runner = runner.name
    )
}

/// `system/cert-bundle/`: extra CA certificates for the machine (GARM's
/// `CertificateBundle`); runway adds none of its own.
pub fn cert_bundle() -> Value {
    json!({ "root_certificates": {} })
}

/// `runner-metadata/`: what the machine is, for scripts that want it.
pub fn runner_metadata(service: &Service, runner: &Runner) -> Value {
    json!({
        "name": runner.name,
        "pool": runner.pool,
        "labels": runner.labels,
        "runner_url": service.config().server.public_url,
        "jit_enabled": is_github(service, runner),
        "service_name": service_name(service, runner),
    })
}

/// Quotes `text` for a POSIX shell.
fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

/// The wrapper put into `extra_specs.runner_install_template` (as GARM
/// does): run on the machine at boot by the provider's cloud-init, it
/// fetches the real install script with the instance token and runs it. It
/// holds no `{{`, since providers render it as a Go template.
pub fn install_wrapper(metadata_url: &str, callback_url: &str, token: &str) -> String {
    format!(
        r#"#!/bin/bash
# runway: fetch and run this runner's install script.
set -e
METADATA_URL={metadata}
CALLBACK_URL={callback}
BEARER_TOKEN={token}
report_failure() {{
  curl -s --retry 5 --retry-connrefused -X POST -H "Authorization: Bearer $BEARER_TOKEN" \
    -H 'Content-Type: application/json' -d "{{\"status\": \"failed\", \"message\": \"$1\"}}" \
    "$CALLBACK_URL/status/" || true
  exit 1
}}
SCRIPT=$(mktemp)
while :; do
  CODE=$(curl -s --retry 5 --retry-connrefused -w '%{{http_code}}' -o "$SCRIPT" \
    -H "Authorization: Bearer $BEARER_TOKEN" "$METADATA_URL/install-script/" || echo 000)
  # 409: a machine of its pool's stock, warming: runway stops it, and
  # its start for a job arms this token.
  [ "$CODE" = 409 ] || break
  sleep 5
done
[ "$CODE" = 200 ] || report_failure "failed to fetch the install script (HTTP $CODE)"
chmod +x "$SCRIPT"
exec "$SCRIPT"
"#,
        metadata = quoted(metadata_url),
        callback = quoted(callback_url),
        token = quoted(token),
    )
}

/// `install-script/`: what the machine runs to become a runner.
/// `github_tools` are a GitHub pool's runner downloads (unused otherwise).
pub fn install_script(
    service: &Service,
    instance: &Instance,
    bearer: &str,
    github_tools: &[Value],
) -> String {
    let base = service
        .config()
        .server
        .public_url
        .clone()
        .unwrap_or_default();
    let runner = &instance.runner;
    let header = format!(
        r#"#!/bin/bash
# runway install script for runner {name} (pool {pool}).
set -e
set -o pipefail
METADATA_URL={metadata}
CALLBACK_URL={callback}
BEARER_TOKEN={token}
status() {{
  curl -s --retry 5 --retry-connrefused -X POST -H "Authorization: Bearer $BEARER_TOKEN" \
    -H 'Content-Type: application/json' \
    -d "{{\"status\": \"$1\", \"message\": \"$2\"}}" "$CALLBACK_URL/status/" >/dev/null || true
}}
fail() {{ status failed "$1"; exit 1; }}
fetch() {{
  curl -sf --retry 5 --retry-connrefused -H "Authorization: Bearer $BEARER_TOKEN" "$METADATA_URL/$1" -o "$2"
}}
if [ -f /etc/os-release ]; then . /etc/os-release; fi
curl -s --retry 5 --retry-connrefused -X POST -H "Authorization: Bearer $BEARER_TOKEN" \
  -H 'Content-Type: application/json' \
  -d "{{\"os_name\": \"${{NAME:-}}\", \"os_version\": \"${{VERSION_ID:-}}\"}}" \
  "$CALLBACK_URL/system-info/" >/dev/null || true
"#,
        name = runner.name,
        pool = runner.pool,
        metadata = quoted(&format!("{base}{METADATA_PATH}")),
        callback = quoted(&format!("{base}{CALLBACKS_PATH}")),
        token = quoted(bearer),
    );
    if is_github(service, runner) {
        return header
            + r#"RUN_HOME="${RUNNER_HOME:-$HOME/actions-runner}"
if [ ! -x "$RUN_HOME/run.sh" ]; then
"# + &pick_download(github_tools)
            + r#"  status installing "downloading the GitHub runner"
  mkdir -p "$RUN_HOME" || fail "cannot create $RUN_HOME"
  AUTH=""
  [ -z "$TEMP" ] || AUTH="Authorization: Bearer $TEMP"
  curl -sfL --retry 5 --retry-connrefused ${AUTH:+-H "$AUTH"} -o "$RUN_HOME/$FILE" "$URL" \
    || fail "failed to download the GitHub runner"
  [ -z "$SHA" ] || echo "$SHA  $RUN_HOME/$FILE" | sha256sum -c --status || fail "the GitHub runner's checksum does not match"
  tar xzf "$RUN_HOME/$FILE" -C "$RUN_HOME" || fail "failed to extract the GitHub runner"
fi
status installing "downloading JIT credentials"
fetch credentials/runner "$RUN_HOME/.runner" || fail "failed to get the runner file"
fetch credentials/credentials "$RUN_HOME/.credentials" || fail "failed to get the credentials file"
fetch credentials/credentials_rsaparams "$RUN_HOME/.credentials_rsaparams" || fail "failed to get the credentials_rsaparams file"
status idle "starting the GitHub runner"
cd "$RUN_HOME"
exec ./run.sh
"#;
    }
    let (sha256, _) = runway_binary().unwrap_or_default();
    header
        + &format!(
            r#"DIR="${{RUNWAY_AGENT_DIR:-${{HOME:-/root}}/runway-agent}}"
mkdir -p "$DIR" || fail "cannot create $DIR"
status installing "downloading runway"
curl -sf --retry 5 --retry-connrefused -H "Authorization: Bearer $BEARER_TOKEN" -o "$DIR/runway.part" {tools} \
  || fail "failed to download runway"
echo "{sha256}  $DIR/runway.part" | sha256sum -c --status || fail "runway's checksum does not match"
chmod +x "$DIR/runway.part" && mv "$DIR/runway.part" "$DIR/runway"
TOKEN=$(curl -sf --retry 5 --retry-connrefused -H "Authorization: Bearer $BEARER_TOKEN" "$METADATA_URL/runner-registration-token/") \
  || fail "failed to get a registration token"
status idle "starting runway agent"
export RUNWAY_URL={url} RUNWAY_REGISTRATION_TOKEN="$TOKEN" RUNWAY_RUNNER_NAME={name} RUNWAY_RUNNER_LABELS={labels} RUNWAY_POOL={pool}
unset BEARER_TOKEN TOKEN
exec "$DIR/runway" agent --once
"#,
            tools = quoted(&format!("{base}{TOOLS_PATH}")),
            url = quoted(&base),
            name = quoted(&runner.name),
            labels = quoted(&runner.labels.join(",")),
            pool = quoted(&runner.pool),
        )
}

/// How long GitHub's runner downloads are reused before asked again.
const DOWNLOADS_FRESH: std::time::Duration = std::time::Duration::from_secs(3600);

/// The `tools` of a GitHub pool's bootstrap: GitHub's runner downloads for
/// `target`, fetched at most once an hour (within the request budget); the
/// last ones known when GitHub cannot be asked, none before its first
/// answer.
pub async fn github_tools(service: &Service, target: &Target, now: Timestamp) -> Vec<Value> {
    let key = format!("{target:?}");
    let cached = service
        .runner_downloads
        .lock()
        .ok()
        .and_then(|d| d.get(&key).cloned());
    if let Some((at, tools)) = &cached {
        if now.since(*at) < DOWNLOADS_FRESH {
            return tools.clone();
        }
    }
    let Some(client) = &service.github else {
        return Vec::new();
    };
    match client.runner_downloads(&service.metrics, target).await {
        Ok(tools) => {
            if let Ok(mut downloads) = service.runner_downloads.lock() {
                downloads.insert(key, (now, tools.clone()));
            }
            tools
        }
        Err(error) => {
            tracing::warn!(%error, "cannot list GitHub's runner downloads; the last known are used");
            cached.map(|(_, tools)| tools).unwrap_or_default()
        }
    }
}

/// The shell lines that pick the Linux download of this machine's
/// architecture among `tools` (setting URL, FILE, SHA and TEMP).
fn pick_download(tools: &[Value]) -> String {
    let mut cases = String::new();
    for tool in tools.iter().filter(|t| t["os"] == "linux") {
        let field = |key: &str| quoted(tool[key].as_str().unwrap_or_default());
        cases.push_str(&format!(
            "  {arch}) URL={url}; FILE={file}; SHA={sha}; TEMP={temp};;\n",
            arch = quoted(tool["architecture"].as_str().unwrap_or_default()),
            url = field("download_url"),
            file = field("filename"),
            sha = field("sha256_checksum"),
            temp = field("temp_download_token"),
        ));
    }
    format!(
        "case \"$(uname -m)\" in x86_64|amd64) ARCH=x64;; aarch64|arm64) ARCH=arm64;; arm*) ARCH=arm;; *) ARCH=$(uname -m);; esac\n\
         case \"$ARCH\" in\n{cases}  *) fail \"no GitHub runner download for linux/$ARCH\";;\nesac\n"
    )
}

/// This binary's sha256 (hex) and its path, computed once.
pub fn runway_binary() -> Option<(String, std::path::PathBuf)> {
    static BINARY: OnceLock<Option<(String, std::path::PathBuf)>> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            let path = std::env::current_exe().ok()?;
            let bytes = std::fs::read(&path).ok()?;
            Some((hex::encode(Sha256::digest(&bytes)), path))
        })
        .clone()
}

/// The `tools` of a runway-agent pool's bootstrap: this binary, for this
/// host's OS and architecture (in GitHub's names, as GARM's providers match
/// them).
pub fn runway_tools(base: &str) -> Vec<Value> {
    let architecture = match std::env::consts::ARCH {
        "x86_64" => "x64",
        "aarch64" => "arm64",
        "arm" => "arm",
        other => other,
    };
    let (sha256, _) = runway_binary().unwrap_or_default();
    vec![json!({
        "os": std::env::consts::OS,
        "architecture": architecture,
        "download_url": format!("{base}{TOOLS_PATH}"),
        "filename": "runway",
        "sha256_checksum": sha256,
    })]
}

/// A status callback (GARM's `InstanceUpdateMessage`).
#[derive(Debug, Deserialize)]
pub struct StatusUpdate {
    pub status: String,
    #[serde(default)]
    pub message: String,
    #[serde(default)]
    pub agent_id: Option<i64>,
}

/// `callbacks/status/`: recorded as a `garm-status` report; `failed` fails
/// the runner with the machine's message.
pub async fn status(
    service: &Service,
    instance: &Instance,
    update: &StatusUpdate,
    now: Timestamp,
) -> Result<(), AppError> {
    let body = json!({
        "status": update.status,
        "message": update.message,
        "agent_id": update.agent_id,
    });
    service
        .store
        .add_runner_report(instance.runner.id, "garm-status", &body.to_string(), now)
        .await
        .map_err(|e| AppError::store(service, "add_runner_report", e))?;
    if update.status == "failed" {
        let reason = format!("the machine reported: {}", update.message);
        tracing::warn!(runner = %instance.runner.name, %reason, "runner failed while installing");
        match service
            .store
            .apply_runner_event(instance.runner.id, &RunnerEvent::Failed { reason }, now)
            .await
        {
            Ok(_) => service.want_reconcile(),
            Err(runway_store::StoreError::RunnerTransition(_)) => {}
            Err(e) => return Err(AppError::store(service, "apply_runner_event", e)),
        }
    }
    Ok(())
}

/// `callbacks/system-info/`: recorded as a `garm-system-info` report.
pub async fn system_info(
    service: &Service,
    instance: &Instance,
    info: &Value,
    now: Timestamp,
) -> Result<(), AppError> {
    let text = |key: &str| info.get(key).and_then(Value::as_str).unwrap_or_default();
    let body = json!({
        "os_name": text("os_name"),
        "os_version": text("os_version"),
        "agent_id": info.get("agent_id").and_then(Value::as_i64),
    });
    service
        .store
        .add_runner_report(
            instance.runner.id,
            "garm-system-info",
            &body.to_string(),
            now,
        )
        .await
        .map_err(|e| AppError::store(service, "add_runner_report", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jit_configuration_splits_into_garms_files() {
        let files = json!({".runner": "eyJhIjoxfQ==", ".credentials": "Yw==", ".credentials_rsaparams": "cg=="});
        let encoded = base64::engine::general_purpose::STANDARD.encode(files.to_string());
        let stored = jit_files(&encoded).expect("decodes");
        let instance = Instance {
            runner: runway_core::runner::NewRunner {
                name: "r".into(),
                pool: "p".into(),
                provider: "lxd".into(),
                labels: vec![],
                stock: false,
            }
            .initial(runway_core::RunnerId(1), Timestamp::from_millis(0)),
            token_hash: String::new(),
            jit_files: Some(stored),
        };
        assert_eq!(jit_file(&instance, "runner").unwrap(), br#"{"a":1}"#);
        assert_eq!(jit_file(&instance, "credentials").unwrap(), b"c");
        assert_eq!(jit_file(&instance, "credentials_rsaparams").unwrap(), b"r");
        assert_eq!(
            jit_file(&instance, "other").unwrap_err().message,
            "could not find file \".other\""
        );
        assert_eq!(jit_files("not base64"), None);
    }

    #[test]
    fn repo_urls_are_github_web_addresses() {
        let org = Target::Org("acme".into());
        let repo = Target::Repo {
            owner: "acme".into(),
            name: "app".into(),
        };
        assert_eq!(
            repo_url("https://api.github.com", &org),
            "https://github.com/acme"
        );
        assert_eq!(
            repo_url("https://ghe.example.com/api/v3/", &repo),
            "https://ghe.example.com/acme/app"
        );
    }

    #[test]
    fn the_wrapper_is_no_go_template_and_quotes_its_values() {
        let wrapper = install_wrapper("http://h/m", "http://h/c", "rwi_x'y");
        assert!(!wrapper.contains("{{"), "{wrapper}");
        assert!(wrapper.contains(r"BEARER_TOKEN='rwi_x'\''y'"), "{wrapper}");
    }
}
