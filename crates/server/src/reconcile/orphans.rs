//! Instances no live runner record accounts for. Deleting one is the last
//! step, after positive checks (DESIGN §3, docs/scale-out.md's table):
//!
//! - it is this provider's own by its tags ([`Provider::proven_own`]):
//!   one from before provider tags, maybe another provider's, is kept;
//! - it has been unaccounted for longer than the in-flight window
//!   (`list_lag` + `boot_timeout`): a create that answered late, or was
//!   cut off by a restart, may still be adopted by its record meanwhile —
//!   unless no adoption can come: the provider lists it as ended, or its
//!   record has ended knowing this very instance;
//! - it is idle or finished by every source runway has: a GitHub
//!   runner's registration is let go first (204/404; a 422 means it runs
//!   a job: kept, asked again at doubling waits); a runway-API runner
//!   whose record has ended holds no job (the store gives none to an
//!   ended record). An instance with no record at all, of a provider that
//!   serves a GitHub pool, cannot be asked about: it is kept and counted.

use super::*;

impl Inner {
    /// Judges the instances of provider `name` that no live runner record
    /// accounts for, and deletes those positively its own, past their
    /// in-flight window and let go of by every source.
    pub(super) fn orphans(
        self: &Arc<Self>,
        name: &str,
        provider: &Arc<dyn Provider>,
        instances: &[runway_providers::Instance],
        runners: &[runway_core::Runner],
        now: Timestamp,
        report: &mut Report,
    ) -> Vec<Task> {
        let live: std::collections::BTreeSet<&str> = runners
            .iter()
            .filter(|r| r.provider == name && !r.state.is_terminal())
            .flat_map(|r| [Some(r.name.as_str()), r.instance_id.as_deref()])
            .flatten()
            .collect();
        let unaccounted: Vec<&runway_providers::Instance> = instances
            .iter()
            .filter(|i| !live.contains(i.name.as_str()) && !live.contains(i.id.0.as_str()))
            .collect();
        let window = self.longest_window(name);
        // (instance, within its window)
        let mut due = Vec::new();
        if let Ok(mut seen) = self.unaccounted.lock() {
            // Forget what is accounted for again, or gone.
            seen.retain(|(provider, id), _| {
                provider != name || unaccounted.iter().any(|i| &i.id == id)
            });
            for instance in &unaccounted {
                let first = *seen
                    .entry((name.to_owned(), instance.id.clone()))
                    .or_insert(now);
                if provider.proven_own(&instance.id) {
                    due.push(((*instance).clone(), now.since(first) < window));
                } else {
                    report.orphans_kept += 1; // Maybe another provider's.
                }
            }
        }
        self.service
            .metrics
            .instances_unaccounted
            .get_or_create(&crate::telemetry::metrics::ProviderLabels {
                provider: name.to_owned(),
            })
            .set(unaccounted.len() as i64);
        if due.is_empty() {
            return Vec::new();
        }
        let (this, provider, name) = (self.clone(), provider.clone(), name.to_owned());
        self.sweep(format!("orphans:{name}"), async move {
            let mut report = Report::default();
            for (orphan, within_window) in due {
                if !this
                    .may_delete_orphan(&name, &orphan, within_window, now)
                    .await?
                {
                    report.orphans_kept += 1;
                    continue;
                }
                let deleted = {
                    let Ok(_permit) = this.permit_to_act(&name, "delete_orphan").await else {
                        break; // Deposed: the next leader judges them again.
                    };
                    provider.delete(&orphan.id).await
                };
                match deleted {
                    Ok(()) => {
                        tracing::info!(provider = %name, instance = %orphan.id, name = %orphan.name, "deleted an instance no live runner record accounts for, past its in-flight window and let go of by every source");
                        report.orphans_deleted += 1;
                        if let Ok(mut seen) = this.unaccounted.lock() {
                            seen.remove(&(name.clone(), orphan.id.clone()));
                        }
                    }
                    Err(error) => this.provider_error(&name, "delete", &error.to_string()),
                }
            }
            Ok(report)
        })
        .into_iter()
        .collect()
    }

    /// The longest in-flight window of provider `name` over the pools it
    /// may serve (an instance's pool is known only from its record).
    fn longest_window(&self, name: &str) -> Duration {
        let config = self.service.config();
        config
            .pools
            .iter()
            .filter(|p| p.providers.is_empty() || p.providers.iter().any(|n| n == name))
            .map(|p| self.in_flight_window(name, &p.name))
            .max()
            .unwrap_or_else(|| self.in_flight_window(name, ""))
    }

    /// Whether `orphan` of provider `name`, no live record accounting for
    /// it, is let go of by every source and may be deleted. One still
    /// `within_window` may yet be adopted by a late create's record, unless
    /// it has ended or its record ended knowing it.
    async fn may_delete_orphan(
        &self,
        name: &str,
        orphan: &runway_providers::Instance,
        within_window: bool,
        now: Timestamp,
    ) -> Result<bool, StoreError> {
        let record = self.store().find_runner(&orphan.name).await?;
        let settled = orphan.state == runway_providers::InstanceState::Failed
            || record.as_ref().is_some_and(|r| {
                r.state.is_terminal() && r.instance_id.as_deref() == Some(orphan.id.0.as_str())
            });
        if within_window && !settled {
            return Ok(false); // Its create may still be adopted.
        }
        match record {
            Some(runner) if runner.provider != name => {
                // Another provider's record names it: not this one's to judge.
                tracing::warn!(provider = %name, instance = %orphan.id, runner = %runner.name, owner = %runner.provider, "an instance carries the name of another provider's runner; kept");
                Ok(false)
            }
            // Live again (adopted since the list): not an orphan.
            Some(runner) if !runner.state.is_terminal() => Ok(false),
            Some(runner) => match self.github_pool(&runner.pool) {
                // Its job, if any, is GitHub's: GitHub must let it go first.
                Some(github) => Ok(self.let_go_at_github(&github, &runner, now).await?
                    == super::doubt::LetGo::Gone),
                // The store gives no job to an ended record, and took back
                // any it held when it ended.
                None => Ok(true),
            },
            None => {
                let config = self.service.config();
                let serves_github = config.pools.iter().any(|p| {
                    p.github.is_some()
                        && (p.providers.is_empty() || p.providers.iter().any(|n| n == name))
                });
                if serves_github {
                    // No record, so no GitHub id to ask about: it may run
                    // a job. Kept, counted (`runway_instances_unaccounted`).
                    tracing::warn!(provider = %name, instance = %orphan.id, name = %orphan.name, "an instance no runner record names, of a provider serving GitHub pools: kept (delete it by hand once it is idle)");
                    Ok(false)
                } else {
                    Ok(true)
                }
            }
        }
    }
}
