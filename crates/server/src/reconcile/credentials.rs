//! What a runner's machine boots with: its bootstrap environment and, when
//! it boots for a job, its one-time credentials (a GitHub JIT
//! configuration, a runway registration token, a GARM instance-API
//! token). They are minted when the machine boots for a job: at its create,
//! or, for a runner of a pool's stock of stopped runners, at its start
//! (issue 60). A stock runner's first boot gets none, so a stopped disk
//! never holds one, and a stopped machine started without runway's start
//! has nothing to take a job with. A GARM machine (`exec`), whose start
//! carries nothing, keeps the instance token of its create instead: inert
//! while its runner is in the stock, armed at the start
//! ([`Inner::arm_instance_token`]), and single-use as any.

use super::*;

/// What [`Inner::boot_request`] made of a runner's boot.
pub(super) enum Minted {
    Request(Box<CreateRequest>),
    /// GitHub refused a JIT configuration (the record is failed).
    Refused,
    /// This replica can no longer show it leads: nothing was minted.
    Deposed,
}

/// What [`Inner::arm_instance_token`] did.
pub(super) enum Arming {
    Armed,
    /// Nothing the machine could take a job with: why.
    Refused(String),
    /// This replica can no longer show it leads: nothing was armed.
    Deposed,
}

impl Inner {
    /// Arms the instance token stock runner `runner`'s machine got at its
    /// create, for a start of it (`start_reads_instance_api`): valid for
    /// the pool's `boot_timeout` from `now`, with a GitHub pool's JIT
    /// configuration minted now.
    pub(super) async fn arm_instance_token(
        &self,
        runner: &runway_core::Runner,
        pool_config: &PoolConfig,
        now: Timestamp,
    ) -> Result<Arming, StoreError> {
        let jit = match &pool_config.github {
            Some(github) => {
                if self.service.may_act("github_jit_config").await.is_err() {
                    return Ok(Arming::Deposed);
                }
                match self
                    .jit_config(github, runner, &pool_config.labels, now)
                    .await?
                {
                    Some(encoded) => Some(encoded),
                    None => {
                        return Ok(Arming::Refused(
                            "GitHub refused its JIT configuration".into(),
                        ))
                    }
                }
            }
            None => None,
        };
        let armed = crate::app::garm::arm(
            &self.service,
            runner,
            now.plus(pool_config.boot_timeout),
            jit.as_deref(),
        )
        .await?;
        Ok(if armed == 0 {
            Arming::Refused(
                "its machine holds no instance token to read a credential with (a stock runner created before runway armed tokens at a start)".into(),
            )
        } else {
            Arming::Armed
        })
    }

    /// The request `runner`'s machine boots with on `offer`, with
    /// `launch_config`: with `for_job`, its one-time credentials minted
    /// now, valid for the pool's `boot_timeout`.
    pub(super) async fn boot_request(
        &self,
        runner: &runway_core::Runner,
        pool_config: &PoolConfig,
        backend: &Arc<dyn Provider>,
        (offer, launch_config): (&str, &serde_json::Value),
        for_job: bool,
        now: Timestamp,
    ) -> Result<Minted, StoreError> {
        let store = self.store();
        let (name, pool, labels) = (&runner.name, &pool_config.name, &pool_config.labels);
        let mut bootstrap = BTreeMap::from([
            ("RUNWAY_URL".to_owned(), self.runner_url()),
            ("RUNWAY_RUNNER_NAME".to_owned(), name.clone()),
            ("RUNWAY_RUNNER_LABELS".to_owned(), labels.join(",")),
            ("RUNWAY_POOL".to_owned(), pool.clone()),
        ]);
        if let (Some(github), true) = (&pool_config.github, for_job) {
            if self.service.may_act("github_jit_config").await.is_err() {
                return Ok(Minted::Deposed);
            }
            let Some(encoded) = self.jit_config(github, runner, labels, now).await? else {
                return Ok(Minted::Refused);
            };
            bootstrap.insert("RUNWAY_JIT_CONFIG".to_owned(), encoded);
            // For its job-started hook: it can only post this runner's
            // reports (its jobs can read it).
            let token = crate::app::tokens::new_token(crate::app::tokens::REPORT_TOKEN_PREFIX);
            store
                .set_runner_token(runner.id, &crate::app::tokens::token_hash(&token))
                .await?;
            bootstrap.insert("RUNWAY_RUNNER_ID".to_owned(), runner.id.0.to_string());
            bootstrap.insert("RUNWAY_RUNNER_TOKEN".to_owned(), token);
        }
        if backend.runners_register() && pool_config.github.is_none() && for_job {
            // One-time, bound to this record, valid while it may boot.
            let token = crate::app::tokens::new_token("rwr_");
            store
                .create_registration_token(
                    &crate::app::tokens::token_hash(&token),
                    pool,
                    Some(runner.id),
                    now.plus(pool_config.boot_timeout),
                    now,
                )
                .await?;
            bootstrap.insert("RUNWAY_REGISTRATION_TOKEN".to_owned(), token);
        }
        // A stock runner whose machine reads its credential at its start
        // (`start_reads_instance_api`) gets its instance token now: inert
        // while the runner is in the stock, armed by its start, and valid
        // meanwhile for as long as the stock may keep it.
        let inert = !for_job && backend.start_reads_instance_api();
        let instance_api = if backend.uses_instance_api() && (for_job || inert) {
            let base = self.runner_url();
            let expires_at = if inert {
                now.plus(pool_config.stopped_max_age + pool_config.boot_timeout)
            } else {
                now.plus(pool_config.boot_timeout)
            };
            let token = crate::app::garm::mint(
                &self.service,
                runner,
                expires_at,
                bootstrap.get("RUNWAY_JIT_CONFIG").map(String::as_str),
            )
            .await?;
            if inert {
                // For a machine that runs `runway agent` itself (no
                // install script): it asks the instance API for its
                // registration token once started.
                bootstrap.insert("RUNWAY_INSTANCE_TOKEN".to_owned(), token.clone());
            }
            let metadata_url = format!("{base}{}", crate::app::garm::METADATA_PATH);
            let callback_url = format!("{base}{}", crate::app::garm::CALLBACKS_PATH);
            Some(runway_providers::InstanceApi {
                install_wrapper: crate::app::garm::install_wrapper(
                    &metadata_url,
                    &callback_url,
                    &token,
                ),
                // A GitHub pool's machine installs GitHub's runner.
                tools: match &pool_config.github {
                    Some(github) => {
                        crate::app::garm::github_tools(&self.service, &github.target, now).await
                    }
                    None => crate::app::garm::runway_tools(&base),
                },
                metadata_url,
                callback_url,
                token,
                repo_url: pool_config
                    .github
                    .as_ref()
                    .map(|github| {
                        crate::app::garm::repo_url(
                            &self.service.config().github.api_url,
                            &github.target,
                        )
                    })
                    .unwrap_or_default(),
            })
        } else {
            None
        };
        Ok(Minted::Request(Box::new(CreateRequest {
            name: name.clone(),
            pool: pool.clone(),
            offer: offer.to_owned(),
            labels: labels.clone(),
            bootstrap,
            launch_config: launch_config.clone(),
            instance_api,
            stock: !for_job,
        })))
    }
}
