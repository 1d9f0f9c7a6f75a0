//! Everything `runway serve` starts, in one function: the CLI parses flags
//! and calls [`run`], and so can a test, which then starts exactly what a
//! user starts (STYLE rule 23).

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use runway_store::StoreError;
use tokio::net::TcpListener;

use crate::app::Service;
use runway_providers::factory::{self, BuildContext};

use crate::config::{Config, Secret};

/// What `runway serve` decides outside the configuration.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Without a config file the admin API still needs a token: reuse the
    /// one in this file, or write a new one there (mode 0600) for the CLI.
    /// Only used when the configuration has no admin token.
    pub admin_token_file: Option<PathBuf>,
    /// This very binary: a `process` provider's command `runway` means it.
    pub runway_exe: Option<PathBuf>,
    /// The config file `config` was read from (`None`: the built-in
    /// defaults) and the command line's overrides: what a reload (SIGHUP,
    /// `POST /api/v1/config/reload`) reads again.
    pub config_path: Option<PathBuf>,
    pub overrides: crate::config::Overrides,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot read the listening address: {0}")]
    Address(std::io::Error),
    #[error("{0}")]
    EventLog(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot read this installation's controller id: {0}")]
    ControllerId(StoreError),
    #[error("{0}")]
    Providers(String),
    #[error("cannot write the admin token to {path}: {error}")]
    AdminToken {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cannot install the worker configurations of the config file: {0}")]
    WorkerConfigs(StoreError),
    #[error("HTTP server failed: {0}")]
    Http(std::io::Error),
}

/// Serves `config` on `listener` until `shutdown` completes: opens the
/// event log and the store, builds the providers, installs the worker
/// configurations, starts every background worker (leadership, the lease
/// sweeper, the reconciler when there are providers, the GitHub healer with
/// credentials) and the HTTP server; on shutdown, lets them finish and
/// returns.
pub async fn run(
    mut config: Config,
    listener: TcpListener,
    options: RunOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let address = listener.local_addr().map_err(RunError::Address)?;
    if std::env::var_os("RUNWAY_UNSAFE_NO_FENCING").is_some_and(|v| v == "1") {
        crate::app::lease::switch_fencing_off();
        tracing::warn!("RUNWAY_UNSAFE_NO_FENCING=1: provider and GitHub calls are not fenced, so a replica that lost the lead may still make them; for the chaos soak's control run only");
    }
    if config.server.public_url.is_none() {
        config.server.public_url = Some(config.server.runner_url(address));
    }
    // The event log before the store: a bad path must not create a database.
    let events =
        crate::telemetry::events::EventLog::open(&config.telemetry).map_err(RunError::EventLog)?;
    let store = Service::open_store(&config).await?;
    let (controller_id, legacy_controller_id) = controller_ids(store.as_ref())
        .await
        .map_err(RunError::ControllerId)?;
    // Providers ask this right before a call that changes a cloud: the
    // leader's own clock says whether it still leads (`Service::may_lead_now`);
    // the service exists once it is running.
    let serving: Arc<std::sync::OnceLock<std::sync::Weak<Service>>> = Arc::default();
    let fence: runway_providers::Fence = {
        let serving = serving.clone();
        Arc::new(
            move || match serving.get().and_then(std::sync::Weak::upgrade) {
                Some(service) => service.may_lead_now(),
                None => Err("runway is not running yet".into()),
            },
        )
    };
    let context = BuildContext {
        clock: Arc::new(runway_providers::SystemClock),
        controller_id,
        legacy_controller_id,
        runway_exe: options.runway_exe.clone(),
        fence,
    };
    let mut providers = BTreeMap::new();
    for spec in config.provider_specs() {
        let provider =
            factory::build(&spec, &context).map_err(|e| RunError::Providers(e.to_string()))?;
        providers.insert(spec.name, provider);
    }
    // Only once the store is open: a failed start leaves no token file behind.
    let mut generated_admin_token = None;
    if let (Some(path), true) = (
        &options.admin_token_file,
        config.server.admin_tokens.is_empty(),
    ) {
        let token = Secret::literal(&admin_token_file(path)?);
        config.server.admin_tokens.push(token.clone());
        generated_admin_token = Some(token);
    }
    let mut service = Service::new(config, store);
    service.events = events.count_errors_in(service.metrics.event_log_errors.clone());
    let _ = service.reload_source.set(crate::app::reload::ReloadSource {
        path: options.config_path.clone(),
        overrides: options.overrides.clone(),
        generated_admin_token,
        context,
        reconciler: std::sync::Mutex::new(None),
        start_reconciler: std::sync::Mutex::new(None),
    });
    service
        .install_worker_configs()
        .await
        .map_err(RunError::WorkerConfigs)?;
    let config = service.config();
    let pools: Vec<&str> = config.pools.iter().map(|p| p.name.as_str()).collect();
    tracing::info!(
        address = %format!("http://{address}"),
        store = %service.config().server.database,
        pools = ?pools,
        "runway listening"
    );
    // Nothing reconciles until the lead is held (at once on SQLite; on
    // PostgreSQL by the one replica holding the advisory lock).
    service.leading = std::sync::atomic::AtomicBool::new(false);
    service.lease = std::sync::Mutex::new(crate::app::lease::Lease::NotHeld);
    let _ = service.address.set(format!("http://{address}"));
    let service = Arc::new(service);
    let _ = serving.set(Arc::downgrade(&service));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    // The lead is released after every other worker has stopped.
    let (others_stopped, release_lead) = tokio::sync::oneshot::channel();
    let leadership = tokio::spawn(crate::app::background::leadership(
        service.clone(),
        service
            .config()
            .scaling
            .interval
            .clamp(Duration::from_secs(1), Duration::from_secs(2)),
        stopped.clone(),
        release_lead,
    ));
    let mut workers = vec![
        tokio::spawn(crate::app::background::lease_sweeper(
            service.clone(),
            stopped.clone(),
        )),
        tokio::spawn(crate::app::background::replica_heartbeat(
            service.clone(),
            stopped.clone(),
        )),
        tokio::spawn(crate::app::wakeups::announcer(
            service.clone(),
            stopped.clone(),
        )),
        tokio::spawn(crate::app::wakeups::listener(
            service.clone(),
            stopped.clone(),
        )),
        tokio::spawn(crate::app::retention::run(service.clone(), stopped.clone())),
        tokio::spawn(crate::app::intake::run_held(
            service.clone(),
            stopped.clone(),
        )),
        tokio::spawn(crate::app::waiters::safety_net(
            service.clone(),
            stopped.clone(),
        )),
        tokio::spawn(crate::app::history::sampler(
            service.clone(),
            stopped.clone(),
        )),
    ];
    if !providers.is_empty() {
        let (set, worker) = start_reconciler(&service, providers, &stopped);
        if let Some(source) = service.reload_source.get() {
            if let Ok(mut slot) = source.reconciler.lock() {
                *slot = Some(Arc::downgrade(&set));
            }
        }
        workers.push(worker);
    } else if let Some(source) = service.reload_source.get() {
        // Started without providers: a reload that brings some starts the
        // reconciler then (it stops with the others on shutdown).
        // Weak: the service holds this starter; a strong reference here
        // would keep the service alive forever.
        let (service, stopped) = (Arc::downgrade(&service), stopped.clone());
        let start: crate::app::reload::StartReconciler = Box::new(move |providers| {
            let service = service.upgrade()?;
            Some(start_reconciler(&service, providers, &stopped).0)
        });
        if let Ok(mut slot) = source.start_reconciler.lock() {
            *slot = Some(start);
        }
    }
    if let Some(client) = service.github.clone() {
        tracing::info!(
            api = %service.config().github.api_url,
            deliveries = ?service.config().github.deliveries.as_ref().map(ToString::to_string),
            "GitHub API: re-checking old queued jobs{}",
            if service.config().github.deliveries.is_some() { " and redelivering failed webhooks" } else { "" }
        );
        let healer = Arc::new(crate::reconcile::heal::Healer::new(service.clone(), client));
        workers.push(tokio::spawn(crate::reconcile::heal::run(
            healer,
            stopped.clone(),
        )));
    }
    if let Some(client) = service.github.clone() {
        // Scale-set pools: one message-queue listener each, on the leader.
        workers.push(tokio::spawn(crate::reconcile::scale_set::run(
            service.clone(),
            client,
            stopped.clone(),
        )));
    }
    workers.push(tokio::spawn(reload_on_hangup(
        service.clone(),
        stopped.clone(),
    )));
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop.send(true);
    });
    let mut server_stop = stopped;
    let served = crate::http::serve(service, listener, async move {
        let _ = server_stop.wait_for(|stop| *stop).await;
    })
    .await;
    for worker in workers {
        let _ = worker.await;
    }
    let _ = others_stopped.send(());
    let _ = leadership.await;
    served.map_err(RunError::Http)?;
    tracing::info!("runway stopped");
    Ok(())
}

/// Reloads the config on every SIGHUP until shutdown; a refused reload is
/// logged with its reason and the running config stays.
async fn reload_on_hangup(service: Arc<Service>, mut stopped: tokio::sync::watch::Receiver<bool>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangups = match signal(SignalKind::hangup()) {
            Ok(hangups) => hangups,
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGHUP; reload through the API");
                return;
            }
        };
        loop {
            let stop = async {
                let _ = stopped.wait_for(|stop| *stop).await;
            };
            tokio::select! {
                () = stop => return,
                _ = hangups.recv() => {
                    match crate::app::reload::reload(&service, "signal:SIGHUP").await {
                        Ok(done) => tracing::info!(changed = ?done.changed, restart_needed = ?done.restart_needed, "configuration reloaded"),
                        Err(error) => tracing::error!(%error, "configuration not reloaded; the running one stays"),
                    }
                }
            }
        }
    }
    #[cfg(not(unix))]
    let _ = stopped.wait_for(|stop| *stop).await;
}

/// Reuses the admin token in `path`, or writes a new one there (mode 0600).
fn admin_token_file(path: &Path) -> Result<String, RunError> {
    if let Ok(existing) = std::fs::read_to_string(path) {
        let existing = existing.trim().to_owned();
        if existing.len() >= 16 {
            return Ok(existing);
        }
    }
    let token = crate::app::tokens::new_token("rwa_");
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    use std::io::Write;
    options
        .open(path)
        .and_then(|mut file| file.write_all(format!("{token}\n").as_bytes()))
        .map_err(|error| RunError::AdminToken {
            path: path.to_path_buf(),
            error,
        })?;
    tracing::info!(file = %path.display(), "generated an admin token for the CLI (runway jobs, runway submit)");
    Ok(token)
}

/// This installation's controller id, a UUID as GARM's (providers use it in
/// tags and labels of limited length), and the `rwc_…` id an installation
/// from before the UUIDs tagged its instances with, if there is one: the
/// providers still look after those.
async fn controller_ids(
    store: &dyn runway_store::Store,
) -> Result<(String, Option<String>), runway_store::StoreError> {
    let legacy = store.get_setting("controller_id").await?;
    let candidate = legacy
        .as_deref()
        .and_then(|id| uuid::Uuid::parse_str(id).ok())
        .unwrap_or_else(uuid::Uuid::new_v4)
        .to_string();
    let current = store.init_setting("controller_uuid", &candidate).await?;
    let legacy = legacy.filter(|id| *id != current);
    Ok((current, legacy))
}

/// The reconciler over `providers`, running until `stopped`.
fn start_reconciler(
    service: &Arc<Service>,
    providers: BTreeMap<String, Arc<dyn runway_providers::Provider>>,
    stopped: &tokio::sync::watch::Receiver<bool>,
) -> (
    Arc<dyn crate::app::reload::ProviderSet>,
    tokio::task::JoinHandle<()>,
) {
    let reconciler = Arc::new(crate::reconcile::Reconciler::new(
        service.clone(),
        providers,
    ));
    let worker = tokio::spawn(crate::reconcile::run(
        reconciler.clone(),
        service.config().scaling.interval,
        stopped.clone(),
    ));
    (reconciler, worker)
}
