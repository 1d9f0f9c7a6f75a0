//! Config reload (SIGHUP or `POST /api/v1/config/reload`): the file is read
//! and validated exactly as `runway config check` does; an invalid file is
//! refused with the same errors and the running config stays. A valid one
//! replaces the running config whole — pools, routing, providers, worker
//! configurations, tokens and webhook secrets — between two requests: a
//! request in flight finishes on the config it started with.
//!
//! What a running process cannot change (where it listens, its store, its
//! GitHub API credentials) keeps its running value and is named in the
//! answer as needing a restart. A pool removed from the file gets no more
//! runners; its jobs stay in the store, visible, explained as
//! `pool_not_configured`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Weak};

use runway_providers::factory::{self, BuildContext};
use runway_providers::Provider;
use serde_json::json;

use crate::app::{AppError, ErrorKind, Service};
use crate::clock::now;
use crate::config::{Config, Overrides, Secret};

/// What works with the providers (the reconciler, a layer above `app`):
/// a reload hands it the new ones.
pub trait ProviderSet: Send + Sync {
    fn replace_providers(&self, providers: BTreeMap<String, Arc<dyn Provider>>);
}

/// Where the running config came from, to read it again.
pub struct ReloadSource {
    /// The config file; `None`: the built-in defaults.
    pub path: Option<PathBuf>,
    pub overrides: Overrides,
    /// The admin token `runway serve` made for a config without one.
    pub generated_admin_token: Option<Secret>,
    /// What providers are built with.
    pub context: BuildContext,
    /// The reconciler whose providers a reload replaces (none when runway
    /// started without providers).
    pub reconciler: std::sync::Mutex<Option<Weak<dyn ProviderSet>>>,
    /// Starts a reconciler with the providers a reload brings, when runway
    /// started without any (set by `runway serve`; taken on first use).
    pub start_reconciler: std::sync::Mutex<Option<StartReconciler>>,
}

/// Starts the reconciler with these providers and gives back what a later
/// reload hands new providers to.
pub type StartReconciler =
    Box<dyn FnOnce(BTreeMap<String, Arc<dyn Provider>>) -> Option<Arc<dyn ProviderSet>> + Send>;

/// What a reload did.
#[derive(Debug, Clone, PartialEq)]
pub struct Reloaded {
    /// Top-level sections whose content changed.
    pub changed: Vec<String>,
    /// Keys that changed in the file but need a restart; their running
    /// values stay.
    pub restart_needed: Vec<String>,
}

/// Reloads the config `service` was started from. `actor` is recorded in
/// the audit trail.
pub async fn reload(service: &Service, actor: &str) -> Result<Reloaded, AppError> {
    let Some(source) = service.reload_source.get() else {
        return Err(AppError::new(
            ErrorKind::Conflict,
            "reload_unavailable",
            "this server was not started by `runway serve`; there is nothing to reload from",
        ));
    };
    let mut next = Config::load(source.path.as_deref(), &source.overrides)
        .map_err(|error| AppError::invalid("invalid_config", error.to_string()))?;
    let current = service.config();
    let mut restart_needed = Vec::new();
    // What the process set up at start stays as it is.
    if next.server.listen != current.server.listen {
        restart_needed.push("server.listen".to_owned());
        next.server.listen = current.server.listen;
    }
    if next.server.database != current.server.database
        || next.server.database_max_connections != current.server.database_max_connections
    {
        restart_needed.push("server.database".to_owned());
        next.server.database = current.server.database.clone();
        next.server.database_max_connections = current.server.database_max_connections;
    }
    if next.server.public_url.is_none() {
        next.server.public_url = current.server.public_url.clone();
    }
    if next.server.admin_tokens.is_empty() {
        if let Some(token) = &source.generated_admin_token {
            next.server.admin_tokens.push(token.clone());
        }
    }
    let (github_now, github_next) = (&current.github, &next.github);
    if github_now.api_url != github_next.api_url
        || github_now.token != github_next.token
        || github_now.app_id != github_next.app_id
        || github_now.private_key != github_next.private_key
        || github_now.installation_id != github_next.installation_id
        || github_now.max_requests_per_hour != github_next.max_requests_per_hour
    {
        restart_needed.push("github credentials".to_owned());
    }
    // A scale-set pool's listener is bound to the target it started with
    // (a pool a reload makes a scale-set pool gets one within a second;
    // one a reload takes away lets go of its session).
    for pool in &next.pools {
        let target = |config: &Config| {
            config
                .pool(&pool.name)
                .and_then(|p| p.github.as_ref())
                .filter(|g| g.scale_set.is_some())
                .map(|g| g.target.clone())
        };
        if let (Some(now), Some(wanted)) = (target(&current), target(&next)) {
            if now != wanted {
                restart_needed.push(format!(
                    "pools.{}.github (the scale set's target)",
                    pool.name
                ));
            }
        }
    }
    if next.telemetry != current.telemetry {
        restart_needed.push("telemetry".to_owned());
    }
    let mut providers: BTreeMap<String, Arc<dyn Provider>> = BTreeMap::new();
    for spec in next.provider_specs() {
        let name = spec.name.clone();
        let provider = factory::build(&spec, &source.context).map_err(|error| {
            AppError::invalid("invalid_config", format!("providers.{name}: {error}"))
        })?;
        providers.insert(name, provider);
    }
    let reconciler = source
        .reconciler
        .lock()
        .ok()
        .and_then(|reconciler| reconciler.as_ref().and_then(Weak::upgrade));
    // Without a reconciler yet, the first providers start one.
    let starter = match (&reconciler, providers.is_empty()) {
        (None, false) => {
            let starter = source
                .start_reconciler
                .lock()
                .ok()
                .and_then(|mut s| s.take());
            if starter.is_none() {
                restart_needed.push("providers (this server cannot start a reconciler)".to_owned());
            }
            starter
        }
        _ => None,
    };
    let changed = changed_sections(&current, &next);
    service.replace_config(next);
    if let Some(reconciler) = reconciler {
        reconciler.replace_providers(providers);
    } else if let Some(start) = starter {
        // After the config swap: the reconciler reads the new pools.
        if let Some(started) = start(providers) {
            if let Ok(mut slot) = source.reconciler.lock() {
                *slot = Some(Arc::downgrade(&started));
            }
            tracing::info!("the reloaded config has providers: the reconciler runs now");
        }
    }
    service
        .install_worker_configs()
        .await
        .map_err(|e| AppError::store(service, "install_worker_configs", e))?;
    service.evaluations.forget_all();
    service.want_reconcile();
    service.wake_runners(None);
    let at = now();
    crate::app::admin::audit(
        service,
        actor,
        "config.reload",
        "config",
        json!({"changed": changed, "restart_needed": restart_needed}),
        at,
    )
    .await;
    Ok(Reloaded {
        changed,
        restart_needed,
    })
}

/// The top-level sections of the redacted config that differ.
fn changed_sections(current: &Config, next: &Config) -> Vec<String> {
    let as_table = |config: &Config| -> BTreeMap<String, toml::Value> {
        toml::from_str(&config.to_redacted_toml()).unwrap_or_default()
    };
    let (before, after) = (as_table(current), as_table(next));
    let mut keys: Vec<String> = before.keys().chain(after.keys()).cloned().collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|key| before.get(key) != after.get(key))
        .collect()
}
