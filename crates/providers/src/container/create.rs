//! A runner's container: created, then started (a stock runner's is left
//! created, for a start with its credentials).

use super::*;

impl ContainerProvider {
    pub(super) async fn create_named(
        &self,
        name: &str,
        request: &CreateRequest,
    ) -> Result<Instance, ProviderError> {
        // A retried create finds the first attempt's container.
        match self.docker()?.inspect_container(name, None).await {
            Ok(existing) => {
                if self
                    .ours(existing.config.as_ref().and_then(|c| c.labels.as_ref()))
                    .is_none()
                {
                    return Err(self.permanent(format!(
                        "a container named {name} exists and is not this runway's"
                    )));
                }
                let running = existing
                    .state
                    .as_ref()
                    .and_then(|s| s.running)
                    .unwrap_or(false);
                return Ok(Instance {
                    id: InstanceId(name.to_owned()),
                    name: request.name.clone(),
                    state: if running {
                        InstanceState::Running
                    } else {
                        InstanceState::Pending
                    },
                });
            }
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => {}
            Err(error) => return Err(self.engine_error("inspect the container", error)),
        }
        let used = self.used.load(Ordering::SeqCst);
        if used + self.reserved.held_besides(&request.name) >= self.config.max_instances {
            return Err(ProviderError::Quota {
                provider: self.config.name.clone(),
                limit: self.config.max_instances,
            });
        }
        let settings = LaunchSettings::of(&request.launch_config).map_err(|e| self.permanent(e))?;
        let image = settings
            .image
            .clone()
            .unwrap_or_else(|| self.config.image.clone());
        self.ensure_image(&image).await?;
        let bootstrap = self.write_bootstrap(name, request)?;
        let body = self.body(request, &settings, &bootstrap)?;
        let options = CreateContainerOptionsBuilder::default().name(name).build();
        if let Err(error) = self.check_fence("create") {
            let _ = std::fs::remove_dir_all(&bootstrap);
            return Err(error);
        }
        if let Err(error) = self.docker()?.create_container(Some(options), body).await {
            if outcome_unknown(&error) {
                // The engine may have made it: kept, bootstrap and all, for
                // the next look (a retried create finds it by name).
                return Err(ProviderError::in_doubt(
                    &self.config.name,
                    format!("create the container: {error}"),
                ));
            }
            let _ = std::fs::remove_dir_all(&bootstrap);
            return Err(self.engine_error("create the container", error));
        }
        if request.stock {
            // Started for a job, with its credentials (`Provider::start`).
            self.used.fetch_add(1, Ordering::SeqCst);
            tracing::info!(provider = %self.config.name, runner = %request.name, container = %name, "stock runner container created");
            return Ok(Instance {
                id: InstanceId(name.to_owned()),
                name: request.name.clone(),
                state: InstanceState::Stopped,
            });
        }
        if let Err(error) = self.docker()?.start_container(name, None).await {
            if outcome_unknown(&error) {
                // It may be running its job by now: nothing is removed.
                return Err(ProviderError::in_doubt(
                    &self.config.name,
                    format!("start the container: {error}"),
                ));
            }
            // Not started: removed, so nothing half-made is left.
            let remove = RemoveContainerOptionsBuilder::default()
                .force(true)
                .v(true)
                .build();
            if let Ok(docker) = self.docker() {
                let _ = docker.remove_container(name, Some(remove)).await;
            }
            let _ = std::fs::remove_dir_all(&bootstrap);
            return Err(self.engine_error("start the container", error));
        }
        self.used.fetch_add(1, Ordering::SeqCst);
        tracing::info!(provider = %self.config.name, runner = %request.name, container = %name, "runner container started");
        Ok(Instance {
            id: InstanceId(name.to_owned()),
            name: request.name.clone(),
            state: InstanceState::Running,
        })
    }
}
