//! Whose instances these are: the controller id, the per-provider pool ids
//! (`GARM_POOL_ID`), the older scopes still listed as unproven, and which scope
//! each known instance lives in.

use super::*;

/// The `GARM_POOL_ID` runway pool `pool` had under `controller_id` before
/// pool ids named their provider: a UUID (version 5) of the pool's name in
/// the controller's namespace. Instances under it are listed unproven.
pub fn pool_id(controller_id: &str, pool: &str) -> String {
    uuid::Uuid::new_v5(&controller_namespace(controller_id), pool.as_bytes()).to_string()
}

/// The `GARM_POOL_ID` of runway pool `pool` served by provider `provider`
/// under `controller_id`: a UUID (version 5) of `provider/pool` in the
/// controller's namespace, the same on every replica and after every
/// restart, and another for each provider (GARM's pools belong to one).
pub fn provider_pool_id(controller_id: &str, provider: &str, pool: &str) -> String {
    let key = format!("{provider}/{pool}");
    uuid::Uuid::new_v5(&controller_namespace(controller_id), key.as_bytes()).to_string()
}

pub(super) fn controller_namespace(controller_id: &str) -> uuid::Uuid {
    uuid::Uuid::parse_str(controller_id).unwrap_or_else(|_| {
        uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, controller_id.as_bytes())
    })
}

/// Under which ids an instance lives at the provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Scope {
    pub(super) controller_id: String,
    /// `GARM_POOL_ID`.
    pub(super) pool_id: Option<String>,
    /// The runway pool, for its extra specs.
    pub(super) pool: Option<String>,
    /// Whether its ids name this provider: instances listed under an
    /// older scope may be another provider's too.
    pub(super) proven: bool,
}

impl ExecProvider {
    /// The current scope of runway pool `pool`.
    pub(super) fn pool_scope(&self, pool: &str) -> Scope {
        Scope {
            controller_id: self.config.controller_id.clone(),
            pool_id: Some(provider_pool_id(
                &self.config.controller_id,
                &self.config.name,
                pool,
            )),
            pool: Some(pool.to_owned()),
            proven: true,
        }
    }

    /// The scopes `list` asks: each pool's, and its older ones while
    /// instances may be left there.
    pub(super) fn list_scopes(&self) -> Vec<Scope> {
        let mut scopes: Vec<Scope> = self
            .config
            .pools
            .iter()
            .map(|p| self.pool_scope(p))
            .collect();
        if !self.legacy_left.load(Ordering::SeqCst) {
            return scopes;
        }
        scopes.extend(self.config.pools.iter().map(|p| Scope {
            controller_id: self.config.controller_id.clone(),
            pool_id: Some(pool_id(&self.config.controller_id, p)),
            pool: Some(p.clone()),
            proven: false,
        }));
        if let Some(legacy) = &self.config.legacy_controller_id {
            scopes.extend(self.config.pools.iter().map(|p| Scope {
                controller_id: legacy.clone(),
                pool_id: Some(p.clone()),
                pool: Some(p.clone()),
                proven: false,
            }));
        }
        scopes
    }

    /// Where `id` lives, if it was seen; after a fresh list if not.
    pub(super) async fn locate(&self, id: &InstanceId) -> Option<Scope> {
        let known = |this: &Self| this.located.lock().ok().and_then(|l| l.get(id).cloned());
        if let Some(scope) = known(self) {
            return Some(scope);
        }
        let _ = self.list().await;
        known(self)
    }

    pub(super) fn remember(&self, id: &InstanceId, scope: &Scope) {
        if let Ok(mut located) = self.located.lock() {
            located.insert(id.clone(), scope.clone());
        }
    }

    pub(super) fn forget(&self, id: &InstanceId) {
        if let Ok(mut located) = self.located.lock() {
            located.remove(id);
        }
        if let Ok(mut created) = self.created.lock() {
            created.retain(|_, known| known != id);
        }
    }
}
