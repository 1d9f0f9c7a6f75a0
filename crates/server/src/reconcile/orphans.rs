//! Instances no live runner record accounts for.

use super::*;

impl Inner {
    /// Deletes the instances of this installation that no live runner
    /// record accounts for: left behind by a runway that stopped between
    /// a create and its record, or whose runner ended while runway was down.
    pub(super) fn orphans(
        self: &Arc<Self>,
        name: &str,
        provider: &Arc<dyn Provider>,
        instances: &[runway_providers::Instance],
        runners: &[runway_core::Runner],
    ) -> Vec<Task> {
        let live: std::collections::BTreeSet<&str> = runners
            .iter()
            .filter(|r| r.provider == name && !r.state.is_terminal())
            .flat_map(|r| [Some(r.name.as_str()), r.instance_id.as_deref()])
            .flatten()
            .collect();
        let orphans: Vec<runway_providers::Instance> = instances
            .iter()
            .filter(|i| !live.contains(i.name.as_str()) && !live.contains(i.id.0.as_str()))
            .cloned()
            .collect();
        if orphans.is_empty() {
            return Vec::new();
        }
        let (this, provider, name) = (self.clone(), provider.clone(), name.to_owned());
        self.spawn(None, async move {
            let mut report = Report::default();
            for orphan in orphans {
                let deleted = {
                    let Ok(_permit) = this.permit_to_act(&name, "delete_orphan").await else {
                        break; // Deposed: the next leader judges them again.
                    };
                    provider.delete(&orphan.id).await
                };
                match deleted {
                    Ok(()) => {
                        tracing::info!(provider = %name, instance = %orphan.id, name = %orphan.name, "deleted an instance no runner record accounts for");
                        report.orphans_deleted += 1;
                    }
                    Err(error) => this.provider_error(&name, "delete", &error.to_string()),
                }
            }
            Ok(report)
        })
        .into_iter()
        .collect()
    }
}
