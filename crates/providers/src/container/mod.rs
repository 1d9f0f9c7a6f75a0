//! The `container` provider: each runner is one fresh container, started
//! through the Docker Engine API (the `bollard` client), so the same
//! configuration works against Docker and against Podman's compatible
//! service. A container is labelled with this installation's controller
//! id, this provider's name, its pool and its runner's name; listing keeps
//! only containers with this controller id and this provider's name, so
//! another installation's containers, another `container` provider's of
//! this one (on the same engine), or anyone else's, are never seen, let
//! alone touched. Containers from before the provider label are listed
//! unproven ([`Provider::proven_own`]): their records find them, but
//! nothing is deleted on them that no record accounts for.
//!
//! What runs inside is a shell command (`command`), started by `/bin/sh`
//! after the runner's bootstrap variables (`RUNWAY_URL`, a one-time
//! registration token or GitHub's JIT configuration, …) have been read
//! from a file runway wrote into a private directory mounted at
//! `/run/runway` — and the file deleted. They are never in the image, nor
//! in the container's configuration (`docker inspect` shows no secret),
//! nor in the job's environment (`runway agent` gives its jobs a clean
//! one). By default this runway's own executable is mounted read-only at
//! `/usr/local/bin/runway`, so the agent always speaks this server's
//! runner API and no image needs rebuilding per release; the image then
//! needs `/bin/sh` and the shared libraries runway links (any glibc
//! distribution image will do).
//!
//! A container that exits ends its runner. One killed by the kernel for
//! memory (`OOMKilled`, or killed by SIGKILL under a memory limit while
//! runway did not stop it) is reported as "out of memory"; the last lines
//! of an ended container's output go with its runner's reason
//! ([`Provider::ended_detail`]). Delete stops a container (SIGTERM, then
//! SIGKILL after `stop_grace`) and removes it with its anonymous volumes.

mod create;
mod scripts;
mod settings;

use scripts::*;
pub use settings::*;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use bollard::models::{ContainerCreateBody, ContainerSummaryStateEnum, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, ListContainersOptionsBuilder,
    LogsOptionsBuilder, RemoveContainerOptionsBuilder, StopContainerOptionsBuilder,
};
use bollard::Docker;
use futures_util::StreamExt;
use runway_core::planner::Offer;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{CreateRequest, Instance, InstanceId, InstanceState, Provider, ProviderError};

/// The labels every runway container carries.
pub const LABEL_CONTROLLER: &str = "io.runway.controller";
/// The provider (its `[providers.NAME]`) that made the container.
pub const LABEL_PROVIDER: &str = "io.runway.provider";
pub const LABEL_POOL: &str = "io.runway.pool";
pub const LABEL_RUNNER: &str = "io.runway.runner";
/// Marks a stock runner's container: created, not started until a job
/// needs it (listed as stopped until then).
pub const LABEL_STOCK: &str = "io.runway.stock";

/// Where the bootstrap directory is mounted in the container.
pub const BOOTSTRAP_MOUNT: &str = "/run/runway";
/// Where runway's own executable is mounted (`mount_runway`).
pub const RUNWAY_MOUNT: &str = "/usr/local/bin/runway";

/// How many of an ended container's last output lines its runner keeps.
const LOG_LINES: usize = 20;
/// At most this much of them.
const LOG_BYTES: usize = 2_048;

#[derive(Debug, Clone, PartialEq)]
pub struct ContainerConfig {
    pub name: String,
    /// The engine's socket; `None`: `DOCKER_HOST` (a `unix://` path),
    /// then Docker's and Podman's usual sockets.
    pub socket: Option<PathBuf>,
    /// The image, unless a worker configuration sets `container.image`.
    pub image: String,
    pub pull: Pull,
    /// CPUs (fractions allowed), memory in MiB, processes: per container.
    pub cpus: Option<f64>,
    pub memory_mb: Option<u64>,
    pub pids_limit: Option<i64>,
    /// `none`, `host`, or a named network.
    pub network: String,
    pub read_only: bool,
    /// The user the container runs as (a name, or UID[:GID]).
    pub user: Option<String>,
    pub mounts: Vec<Mount>,
    /// Host paths a worker configuration's `container.mounts` may name.
    pub allowed_mounts: Vec<PathBuf>,
    /// Capabilities added to every container.
    pub capabilities: Vec<String>,
    /// Capabilities a worker configuration's `container.capabilities` may add.
    pub allowed_capabilities: Vec<String>,
    /// The shell command the container runs once its bootstrap is read;
    /// `None`: [`GITHUB_COMMAND`] for a GitHub pool's runner (its bootstrap
    /// has a JIT configuration), [`AGENT_COMMAND`] otherwise.
    pub command: Option<String>,
    /// Mount this runway's executable at [`RUNWAY_MOUNT`].
    pub runway_exe: Option<PathBuf>,
    /// Host variables (names or prefixes) the container may inherit.
    pub environment_variables: Vec<String>,
    /// Where bootstrap files are written (one private directory a runner).
    pub state_dir: PathBuf,
    /// Between SIGTERM and SIGKILL when a runner is deleted.
    pub stop_grace: Duration,
    pub max_instances: u32,
    pub price_per_hour: f64,
    pub boot_time: Duration,
    pub controller_id: String,
    pub legacy_controller_id: Option<String>,
}

/// The default command: `runway agent --once`, which registers with the
/// bootstrap's token, runs one job and exits.
pub const AGENT_COMMAND: &str = "runway agent --once";

/// The default for GitHub pools: the runner image's own runner, with the
/// just-in-time configuration runway asked GitHub for.
pub const GITHUB_COMMAND: &str =
    "cd /home/runner && exec ./run.sh --jitconfig \"$RUNWAY_JIT_CONFIG\"";

pub struct ContainerProvider {
    config: ContainerConfig,
    /// The engine's client, once its socket was found (a missing engine
    /// is looked for again at every call, so one started later is used).
    docker: Mutex<Option<Docker>>,
    /// Containers at the last count, for bids.
    used: AtomicU32,
    /// Names being created: a slot each, so two creates cannot both pass
    /// the quota.
    reserved: crate::Slots,
    /// Why listed containers ended, by instance id (kept for the
    /// reconciler's next look, dropped once a container is gone).
    ended: Mutex<BTreeMap<String, Ended>>,
    /// Containers runway itself is stopping: their SIGKILL is no crash.
    stopping: Mutex<std::collections::BTreeSet<String>>,
    /// Containers the latest list found without this provider's label.
    unproven: crate::Unproven,
    /// Asked right before each call that changes the engine's containers.
    fence: crate::Fence,
}

impl ContainerProvider {
    pub fn new(config: ContainerConfig) -> Result<ContainerProvider, ProviderError> {
        std::fs::create_dir_all(&config.state_dir).map_err(|e| ProviderError::Permanent {
            provider: config.name.clone(),
            message: format!("cannot create {}: {e}", config.state_dir.display()),
        })?;
        let provider = ContainerProvider {
            config,
            docker: Mutex::new(None),
            used: AtomicU32::new(0),
            reserved: crate::Slots::default(),
            ended: Mutex::new(BTreeMap::new()),
            unproven: crate::Unproven::default(),
            stopping: Mutex::new(Default::default()),
            fence: crate::unfenced(),
        };
        if let Err(error) = provider.docker() {
            tracing::warn!(provider = %provider.config.name, %error, "no container engine yet; creates wait for one");
        }
        Ok(provider)
    }

    /// The provider, asking `fence` right before each call that creates,
    /// starts, stops or removes a container.
    pub fn fenced(mut self, fence: crate::Fence) -> ContainerProvider {
        self.fence = fence;
        self
    }

    /// `Err` when the fence refuses `call`: it is not made.
    fn check_fence(&self, call: &str) -> Result<(), ProviderError> {
        (self.fence)().map_err(|why| self.transient(format!("{call} not made: {why}")))
    }

    /// The engine's client: connected once its socket exists.
    fn docker(&self) -> Result<Docker, ProviderError> {
        let mut cached = self
            .docker
            .lock()
            .map_err(|_| self.transient("the engine client is unavailable".into()))?;
        if let Some(docker) = cached.as_ref() {
            return Ok(docker.clone());
        }
        let Some(socket) = engine_socket(self.config.socket.as_deref()) else {
            return Err(self.transient(
                "no container engine: its socket is missing (set `socket` or DOCKER_HOST, or start Docker or Podman: `podman system service`)".into(),
            ));
        };
        let docker = Docker::connect_with_unix(
            &socket.display().to_string(),
            120,
            bollard::API_DEFAULT_VERSION,
        )
        .map_err(|e| self.transient(format!("container engine at {}: {e}", socket.display())))?;
        *cached = Some(docker.clone());
        Ok(docker)
    }

    fn transient(&self, message: String) -> ProviderError {
        ProviderError::transient(&self.config.name, message)
    }

    fn permanent(&self, message: String) -> ProviderError {
        ProviderError::permanent(&self.config.name, message)
    }

    /// An engine error as a provider error: a refusal of what was asked
    /// (4xx but a conflict or not-found) needs a configuration change; the
    /// rest (a busy or absent engine, 5xx) may pass.
    fn engine_error(&self, what: &str, error: bollard::errors::Error) -> ProviderError {
        use bollard::errors::Error as E;
        match error {
            E::DockerResponseServerError {
                status_code,
                message,
            } if (400..500).contains(&status_code) && status_code != 409 && status_code != 429 => {
                self.permanent(format!(
                    "{what}: the engine refused ({status_code}): {message}"
                ))
            }
            E::DockerResponseServerError {
                status_code,
                message,
            } => self.transient(format!(
                "{what}: the engine answered {status_code}: {message}"
            )),
            other => self.transient(format!(
                "{what}: cannot reach the container engine: {other}"
            )),
        }
    }

    /// Whose a container with `labels` is: `None` another's; `Some(true)`
    /// this provider's by its labels; `Some(false)` this installation's
    /// from before the provider label (or under the legacy controller id),
    /// so maybe another provider's of this installation.
    fn ours(&self, labels: Option<&HashMap<String, String>>) -> Option<bool> {
        let labels = labels?;
        let controller = labels.get(LABEL_CONTROLLER)?;
        let legacy = self.config.legacy_controller_id.as_deref() == Some(controller.as_str());
        if controller != &self.config.controller_id && !legacy {
            return None;
        }
        match labels.get(LABEL_PROVIDER) {
            Some(provider) if provider == &self.config.name => Some(!legacy),
            Some(_) => None,
            None => Some(false),
        }
    }

    fn bootstrap_dir(&self, name: &str) -> PathBuf {
        self.config.state_dir.join(name)
    }

    /// Writes the runner's bootstrap into a directory only its owner can
    /// read; the container reads and deletes it.
    fn write_bootstrap(
        &self,
        name: &str,
        request: &CreateRequest,
    ) -> Result<PathBuf, ProviderError> {
        use std::os::unix::fs::PermissionsExt;
        let dir = self.bootstrap_dir(name);
        std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)))
            .map_err(|e| self.transient(format!("cannot create {}: {e}", dir.display())))?;
        let mut variables = request.bootstrap.clone();
        variables.insert("RUNWAY_RUNNER_NAME".into(), request.name.clone());
        variables.insert("RUNWAY_POOL".into(), request.pool.clone());
        variables.insert("RUNWAY_RUNNER_LABELS".into(), request.labels.join(","));
        variables.insert(
            "RUNWAY_LAUNCH_CONFIG".into(),
            request.launch_config.to_string(),
        );
        let path = dir.join("bootstrap.sh");
        let temporary = dir.join("bootstrap.sh.tmp");
        std::fs::write(&temporary, bootstrap_script(&variables))
            .and_then(|()| {
                std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o600))
            })
            .and_then(|()| std::fs::rename(&temporary, &path))
            .map_err(|e| self.transient(format!("cannot write the runner's bootstrap: {e}")))?;
        // A numeric `user` must be able to read (and delete) it.
        if let Some((uid, gid)) = self.config.user.as_deref().and_then(numeric_user) {
            for path in [&dir, &path] {
                std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(|e| {
                    self.transient(format!("cannot give the bootstrap to uid {uid}: {e}"))
                })?;
            }
        }
        Ok(dir)
    }

    async fn ensure_image(&self, image: &str) -> Result<(), ProviderError> {
        let present = match self.docker()?.inspect_image(image).await {
            Ok(_) => true,
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => false,
            Err(error) => return Err(self.engine_error("inspect the image", error)),
        };
        let pull = match self.config.pull {
            Pull::Always => true,
            Pull::Missing => !present,
            Pull::Never if present => false,
            Pull::Never => {
                return Err(self.permanent(format!(
                    "image {image:?} is not on the engine and pull = \"never\""
                )))
            }
        };
        if !pull {
            return Ok(());
        }
        let options = CreateImageOptionsBuilder::default()
            .from_image(image)
            .build();
        let docker = self.docker()?;
        let mut progress = docker.create_image(Some(options), None, None);
        while let Some(step) = progress.next().await {
            if let Err(error) = step {
                return Err(match error {
                    bollard::errors::Error::DockerResponseServerError {
                        status_code: 404 | 400 | 401 | 403,
                        message,
                        ..
                    } => self.permanent(format!("cannot pull image {image:?}: {message}")),
                    other => self.engine_error(&format!("pull image {image:?}"), other),
                });
            }
        }
        Ok(())
    }

    /// The container's create body for `request` with its launch settings.
    fn body(
        &self,
        request: &CreateRequest,
        settings: &LaunchSettings,
        bootstrap: &Path,
    ) -> Result<ContainerCreateBody, ProviderError> {
        let config = &self.config;
        let image = settings
            .image
            .clone()
            .unwrap_or_else(|| config.image.clone());
        if image.trim().is_empty() {
            return Err(self.permanent(
                "no image: set `image`, or `container.image` in the pool's worker configuration"
                    .into(),
            ));
        }
        let mut binds = vec![format!("{}:{BOOTSTRAP_MOUNT}:rw", bootstrap.display())];
        if let Some(exe) = &config.runway_exe {
            binds.push(format!("{}:{RUNWAY_MOUNT}:ro", exe.display()));
        }
        let bind = |mount: &Mount| {
            format!(
                "{}:{}:{}",
                mount.source.display(),
                mount.target,
                if mount.read_only { "ro" } else { "rw" }
            )
        };
        binds.extend(config.mounts.iter().map(bind));
        for mount in &settings.mounts {
            if !settings::mount_allowed(&mount.source, &config.allowed_mounts) {
                return Err(self.permanent(format!(
                    "container.mounts: {} is not under allowed_mounts",
                    mount.source.display()
                )));
            }
            binds.push(bind(mount));
        }
        let mut capabilities = config.capabilities.clone();
        for capability in &settings.capabilities {
            if !config.allowed_capabilities.contains(capability) {
                return Err(self.permanent(format!(
                    "container.capabilities: {capability} is not in allowed_capabilities"
                )));
            }
            capabilities.push(capability.clone());
        }
        let memory = settings
            .memory_mb
            .or(config.memory_mb)
            .map(|mb| i64::try_from(mb.saturating_mul(1024 * 1024)).unwrap_or(i64::MAX));
        let cpus = settings.cpus.or(config.cpus);
        // The allow-listed host variables and the proxies, never the
        // host's PATH, HOME or TMPDIR: the image has its own.
        let env: Vec<String> =
            crate::environment::inherited_from_host(&config.environment_variables)
                .into_iter()
                .filter(|(name, _)| !matches!(name.to_str(), Some("PATH" | "HOME" | "TMPDIR")))
                .map(|(name, value)| {
                    format!("{}={}", name.to_string_lossy(), value.to_string_lossy())
                })
                .collect();
        let mut labels = HashMap::from([
            (LABEL_CONTROLLER.to_owned(), config.controller_id.clone()),
            (LABEL_PROVIDER.to_owned(), config.name.clone()),
            (LABEL_POOL.to_owned(), request.pool.clone()),
            (LABEL_RUNNER.to_owned(), request.name.clone()),
        ]);
        if request.stock {
            labels.insert(LABEL_STOCK.to_owned(), "true".to_owned());
        }
        let host_config = HostConfig {
            binds: Some(binds),
            memory,
            // No swap beyond the limit: the limit is the limit.
            memory_swap: memory,
            nano_cpus: cpus.map(|c| (c * 1e9).round() as i64),
            pids_limit: settings.pids_limit.or(config.pids_limit),
            network_mode: Some(config.network.clone()),
            readonly_rootfs: Some(config.read_only),
            cap_add: (!capabilities.is_empty()).then_some(capabilities),
            // Whatever runs as PID 1 never gains privileges it did not start with.
            security_opt: Some(vec!["no-new-privileges".to_owned()]),
            // A read-only root still needs somewhere to write work.
            tmpfs: config
                .read_only
                .then(|| HashMap::from([("/tmp".to_owned(), "rw,nosuid,nodev".to_owned())])),
            ..HostConfig::default()
        };
        Ok(ContainerCreateBody {
            image: Some(image),
            cmd: Some(vec![
                "/bin/sh".to_owned(),
                "-c".to_owned(),
                entry_script(config.command.as_deref().unwrap_or(
                    if request.bootstrap.contains_key("RUNWAY_JIT_CONFIG") {
                        GITHUB_COMMAND
                    } else {
                        AGENT_COMMAND
                    },
                )),
            ]),
            entrypoint: Some(Vec::new()),
            env: Some(env),
            labels: Some(labels),
            user: config.user.clone(),
            // Its own host name, where the network lets it have one.
            hostname: (config.network != "host").then(|| request.name.clone()),
            host_config: Some(host_config),
            ..ContainerCreateBody::default()
        })
    }

    /// Why the container `name` ended, from the engine.
    async fn why_ended(&self, name: &str) -> Option<String> {
        let inspected = self
            .docker()
            .ok()?
            .inspect_container(name, None)
            .await
            .ok()?;
        let state = inspected.state?;
        let memory = inspected.host_config.and_then(|h| h.memory);
        let stopped = self
            .stopping
            .lock()
            .map(|s| s.contains(name))
            .unwrap_or(false);
        let options = LogsOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .tail(&LOG_LINES.to_string())
            .build();
        let mut output = String::new();
        let docker = self.docker().ok()?;
        let mut logs = docker.logs(name, Some(options));
        while let Some(Ok(chunk)) = logs.next().await {
            output.push_str(&chunk.to_string());
            if output.len() > 64 * 1024 {
                break;
            }
        }
        Some(ended_detail(
            state.oom_killed.unwrap_or(false),
            state.exit_code,
            memory,
            stopped,
            state.error.as_deref(),
            &output,
        ))
    }

    fn forget(&self, name: &str) {
        let _ = std::fs::remove_dir_all(self.bootstrap_dir(name));
        if let Ok(mut ended) = self.ended.lock() {
            ended.remove(name);
        }
        if let Ok(mut stopping) = self.stopping.lock() {
            stopping.remove(name);
        }
    }
}

#[async_trait]
impl Provider for ContainerProvider {
    fn name(&self) -> &str {
        &self.config.name
    }

    fn runners_register(&self) -> bool {
        true
    }

    fn reserve(&self, name: &str) -> Result<(), ProviderError> {
        self.reserved.reserve(
            &self.config.name,
            name,
            self.used.load(Ordering::SeqCst),
            self.config.max_instances,
        )
    }

    fn unreserve(&self, name: &str) {
        self.reserved.release(name);
    }

    async fn create(&self, request: &CreateRequest) -> Result<Instance, ProviderError> {
        let name = container_name(&request.name);
        let result = self.create_named(&name, request).await;
        self.unreserve(&request.name);
        result
    }

    async fn start(
        &self,
        id: &InstanceId,
        fresh: Option<&CreateRequest>,
    ) -> Result<(), ProviderError> {
        if let Some(fresh) = fresh {
            // Its bootstrap with the credentials minted for this start,
            // where the container reads (and deletes) it as it starts.
            self.write_bootstrap(&id.0, fresh)?;
        }
        self.check_fence("start")?;
        match self.docker()?.start_container(&id.0, None).await {
            Ok(()) => Ok(()),
            Err(error) if outcome_unknown(&error) => Err(ProviderError::in_doubt(
                &self.config.name,
                format!("start the container: {error}"),
            )),
            Err(error) => Err(self.engine_error("start the container", error)),
        }
    }

    async fn delete(&self, id: &InstanceId) -> Result<(), ProviderError> {
        if let Ok(mut stopping) = self.stopping.lock() {
            stopping.insert(id.0.clone());
        }
        let grace = i32::try_from(self.config.stop_grace.as_secs()).unwrap_or(i32::MAX);
        let stop = StopContainerOptionsBuilder::default().t(grace).build();
        self.check_fence("stop")?;
        match self.docker()?.stop_container(&id.0, Some(stop)).await {
            Ok(()) => {}
            // Gone already, or stopped already.
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 304 | 404,
                ..
            }) => {}
            Err(error) => return Err(self.engine_error("stop the container", error)),
        }
        let remove = RemoveContainerOptionsBuilder::default()
            .force(true)
            .v(true)
            .build();
        match self.docker()?.remove_container(&id.0, Some(remove)).await {
            Ok(())
            | Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => {}
            Err(error) => return Err(self.engine_error("remove the container", error)),
        }
        self.forget(&id.0);
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                Some(n.saturating_sub(1))
            })
            .ok();
        Ok(())
    }

    async fn list(&self) -> Result<Vec<Instance>, ProviderError> {
        let filters = HashMap::from([("label".to_owned(), vec![format!("{LABEL_CONTROLLER}")])]);
        let options = ListContainersOptionsBuilder::default()
            .all(true)
            .filters(&filters)
            .build();
        let listed = self
            .docker()?
            .list_containers(Some(options))
            .await
            .map_err(|e| self.engine_error("list containers", e))?;
        let mut instances = Vec::new();
        let mut unproven = std::collections::BTreeSet::new();
        for container in listed {
            let Some(proven) = self.ours(container.labels.as_ref()) else {
                continue;
            };
            let Some(name) = container
                .names
                .as_ref()
                .and_then(|names| names.first())
                .map(|n| n.trim_start_matches('/').to_owned())
            else {
                continue;
            };
            let stock = container
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(LABEL_STOCK));
            let state = match container.state {
                // A stock runner's container waits created: stopped.
                Some(ContainerSummaryStateEnum::CREATED) if stock => InstanceState::Stopped,
                Some(ContainerSummaryStateEnum::CREATED) => InstanceState::Pending,
                Some(ContainerSummaryStateEnum::RUNNING) => InstanceState::Running,
                Some(
                    ContainerSummaryStateEnum::EXITED
                    | ContainerSummaryStateEnum::DEAD
                    | ContainerSummaryStateEnum::REMOVING,
                ) => InstanceState::Failed,
                _ => InstanceState::Unknown,
            };
            if state == InstanceState::Failed {
                let known = self
                    .ended
                    .lock()
                    .map(|e| e.contains_key(&name))
                    .unwrap_or(true);
                if !known {
                    if let Some(detail) = self.why_ended(&name).await {
                        if let Ok(mut ended) = self.ended.lock() {
                            ended.insert(name.clone(), Ended { detail });
                        }
                    }
                }
            }
            let runner = container
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_RUNNER))
                .cloned()
                .unwrap_or_else(|| name.clone());
            if !proven {
                unproven.insert(InstanceId(name.clone()));
            }
            instances.push(Instance {
                id: InstanceId(name),
                name: runner,
                state,
            });
        }
        self.unproven.replace(unproven);
        self.used.store(instances.len() as u32, Ordering::SeqCst);
        self.reserved.release_listed(&instances);
        Ok(instances)
    }

    fn proven_own(&self, id: &InstanceId) -> bool {
        self.unproven.proves(id)
    }

    fn ended_detail(&self, id: &InstanceId) -> Option<String> {
        self.ended
            .lock()
            .ok()?
            .get(&id.0)
            .map(|ended| ended.detail.clone())
    }

    fn bid(&self, _pool: &str, capacity: u32) -> Vec<Offer> {
        let reserved = self.reserved.held();
        crate::quota_offer(
            &self.config.name,
            self.config.max_instances,
            self.used.load(Ordering::SeqCst) + reserved,
            capacity,
            self.config.price_per_hour,
            self.config.boot_time,
            1.0,
        )
    }
}

#[cfg(test)]
mod tests;
