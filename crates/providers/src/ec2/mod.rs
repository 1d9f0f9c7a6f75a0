//! `kind = "ec2"`: runners as Amazon EC2 instances, through the AWS SDK for
//! Rust.
//!
//! The provider bids one offer per (instance type, availability zone,
//! purchase option) it is allowed: on-demand at its configured price, spot
//! at the live spot price (`DescribeSpotPriceHistory`, refreshed at most
//! once per `spot_price_refresh`). The reliability of each offer falls with
//! the spot interruptions seen on it; the reconciler adds what it learns
//! from failed launches and backs a failing offer off on its own. The
//! planner's ordinary choice — price per unit of reliable capacity — then
//! does spot first with an on-demand fallback, per zone, with no special
//! case.
//!
//! A launch takes its settings from the pool's worker configuration, whose
//! `ec2` object is written with RunInstances' own names (`ImageId`,
//! `SubnetId`, `SecurityGroupIds`, …; see [`LaunchSettings`]). Instances
//! are tagged with the runner's name, pool, offer, this installation's
//! controller id and this provider's name; creates are idempotent by name
//! (a lookup by tag, and the name as RunInstances' client token), deletes
//! are idempotent, and `list` pages through only this controller's
//! instances and keeps this provider's: two `ec2` providers in one account
//! and region never see each other's. Instances from before the provider
//! tag are listed unproven ([`Provider::proven_own`]). A RunInstances that
//! timed out or whose answer was lost is [`ProviderError::InDoubt`]: its
//! quota slot stays held and the instance, if AWS made it, is adopted by
//! the record's name. The user data is a
//! shell script that exports the runner's bootstrap and runs its command;
//! the machine powers off, and so terminates, when the command ends.

mod bidding;
mod launch;
mod listing;
#[cfg(test)]
mod tests;

pub use bidding::*;
pub use launch::*;
use listing::*;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{
    BlockDeviceMapping, EbsBlockDevice, Filter, IamInstanceProfileSpecification,
    InstanceAttributeName, InstanceInterruptionBehavior, InstanceMarketOptionsRequest,
    InstanceMetadataOptionsRequest, InstanceStateName, InstanceType, MarketType, Placement,
    ResourceType, ShutdownBehavior, SpotInstanceType, SpotMarketOptions, Tag, TagSpecification,
};
use base64::Engine;
use runway_core::planner::Offer;
use runway_core::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::OnceCell;

use crate::{Clock, CreateRequest, Instance, InstanceId, InstanceState, Provider, ProviderError};

/// The tag that names the installation an instance belongs to.
pub const CONTROLLER_TAG: &str = "runway:controller";
/// The tag that names the provider (its `[providers.NAME]`) that launched
/// the instance.
pub const PROVIDER_TAG: &str = "runway:provider";
/// The tag that names the runner (its record's name).
pub const RUNNER_TAG: &str = "runway:runner";
pub const POOL_TAG: &str = "runway:pool";
/// The tag that names the offer the instance was launched on.
pub const OFFER_TAG: &str = "runway:offer";

/// Everything an EC2 provider is declared with.
#[derive(Debug, Clone, PartialEq)]
pub struct Ec2Config {
    pub name: String,
    pub region: String,
    /// Another endpoint than AWS's (an emulator, an EC2-compatible cloud).
    pub endpoint_url: Option<String>,
    /// A named profile of the shared AWS config files.
    pub profile: Option<String>,
    pub instance_types: Vec<String>,
    pub zones: Vec<String>,
    pub purchase_options: Vec<Purchase>,
    /// On-demand $/hour per instance type; a type not named costs
    /// `price_per_hour`.
    pub on_demand_prices: BTreeMap<String, f64>,
    pub price_per_hour: f64,
    pub spot_price_refresh: Duration,
    /// What the machine runs once booted, with the bootstrap exported;
    /// `None`: [`default_boot_command`].
    pub boot_command: Option<String>,
    /// What a stock runner's machine runs on its first boot before it
    /// powers off (`every_boot`); `None`: nothing.
    pub prepare_command: Option<String>,
    pub max_instances: u32,
    pub boot_time: Duration,
    /// How long a launched instance may be missing from
    /// `DescribeInstances` (eventual consistency): it counts against the
    /// quota meanwhile.
    pub list_lag: Duration,
    pub controller_id: String,
    pub legacy_controller_id: Option<String>,
}

impl Ec2Config {
    fn on_demand_price(&self, instance_type: &str) -> f64 {
        self.on_demand_prices
            .get(instance_type)
            .copied()
            .unwrap_or(self.price_per_hour)
    }

    /// Every offer key the configuration allows, in a stable order.
    pub fn offer_keys(&self) -> Vec<OfferKey> {
        let mut keys = Vec::new();
        for instance_type in &self.instance_types {
            for zone in &self.zones {
                for purchase in &self.purchase_options {
                    keys.push(OfferKey {
                        instance_type: instance_type.clone(),
                        zone: zone.clone(),
                        purchase: *purchase,
                    });
                }
            }
        }
        keys
    }

    /// The offer a create names, or — for a create that names none — the
    /// first on-demand one.
    fn offer_of(&self, key: &str) -> Result<OfferKey, String> {
        if key.is_empty() {
            return Ok(OfferKey {
                instance_type: self.instance_types.first().cloned().unwrap_or_default(),
                zone: self.zones.first().cloned().unwrap_or_default(),
                purchase: Purchase::OnDemand,
            });
        }
        let offer: OfferKey = key.parse()?;
        if !self.instance_types.contains(&offer.instance_type)
            || !self.zones.contains(&offer.zone)
            || !self.purchase_options.contains(&offer.purchase)
        {
            return Err(format!("offer {key} is not one this provider makes"));
        }
        Ok(offer)
    }
}

struct State {
    /// Instances this provider counts against its quota: the last list's,
    /// plus launches the list does not show yet, minus deletes.
    live: BTreeSet<String>,
    /// Quota slots held for runners whose create has not returned (by
    /// runner name): taken by [`Provider::reserve`] before the runner's
    /// record and create, or by `create` itself, before any call to AWS.
    reserved: BTreeSet<String>,
    /// Launches not yet seen in a list, and when each returned: counted
    /// until a list shows them or `list_lag` has passed.
    launched: BTreeMap<String, Instant>,
    /// Instances the latest list saw shutting down or terminated.
    gone: BTreeSet<String>,
    /// Instances the latest list found without this provider's tag.
    unproven: BTreeSet<String>,
    /// Spot $/hour per (instance type, zone).
    spot_prices: BTreeMap<(String, String), f64>,
    prices_read: Option<Instant>,
    /// When spot instances of each offer were interrupted, recently.
    interruptions: BTreeMap<String, Vec<Timestamp>>,
    /// Interrupted instances already counted.
    counted: BTreeSet<String>,
}

impl State {
    /// Slots counted against the quota: live instances and reservations.
    fn used(&self) -> u32 {
        (self.live.len() + self.reserved.len()) as u32
    }
}

pub struct Ec2Provider {
    config: Ec2Config,
    clock: Arc<dyn Clock>,
    /// Asked right before each call that changes an instance.
    fence: crate::Fence,
    client: OnceCell<aws_sdk_ec2::Client>,
    state: Mutex<State>,
}

impl Ec2Provider {
    /// Holds a quota slot for runner `name` (kept if it holds one already),
    /// or refuses with [`ProviderError::Quota`].
    fn take_slot(&self, name: &str) -> Result<(), ProviderError> {
        let mut state = self
            .state
            .lock()
            .map_err(|_| self.transient("state lock poisoned".into()))?;
        if state.reserved.contains(name) {
            return Ok(());
        }
        if state.used() >= self.config.max_instances {
            return Err(ProviderError::Quota {
                provider: self.config.name.clone(),
                limit: self.config.max_instances,
            });
        }
        state.reserved.insert(name.to_owned());
        Ok(())
    }

    /// The provider, asking `fence` right before each call that changes
    /// an instance (RunInstances, TerminateInstances, StartInstances).
    pub fn fenced(mut self, fence: crate::Fence) -> Ec2Provider {
        self.fence = fence;
        self
    }

    /// `Err` when the fence refuses `call`: it is not made.
    fn check_fence(&self, call: &str) -> Result<(), ProviderError> {
        (self.fence)().map_err(|why| self.transient(format!("{call} not made: {why}")))
    }

    pub fn new(config: Ec2Config, clock: Arc<dyn Clock>) -> Ec2Provider {
        Ec2Provider {
            config,
            clock,
            fence: crate::unfenced(),
            client: OnceCell::new(),
            state: Mutex::new(State {
                live: BTreeSet::new(),
                reserved: BTreeSet::new(),
                launched: BTreeMap::new(),
                gone: BTreeSet::new(),
                unproven: BTreeSet::new(),
                spot_prices: BTreeMap::new(),
                prices_read: None,
                interruptions: BTreeMap::new(),
                counted: BTreeSet::new(),
            }),
        }
    }

    async fn client(&self) -> &aws_sdk_ec2::Client {
        self.client
            .get_or_init(|| async {
                let timeouts = aws_config::timeout::TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(5))
                    .operation_attempt_timeout(Duration::from_secs(30))
                    .operation_timeout(Duration::from_secs(60))
                    .build();
                let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
                    .region(aws_config::Region::new(self.config.region.clone()))
                    .timeout_config(timeouts);
                if let Some(url) = &self.config.endpoint_url {
                    loader = loader.endpoint_url(url);
                }
                if let Some(profile) = &self.config.profile {
                    loader = loader.profile_name(profile);
                }
                aws_sdk_ec2::Client::new(&loader.load().await)
            })
            .await
    }

    fn transient(&self, message: String) -> ProviderError {
        ProviderError::transient(&self.config.name, message)
    }

    fn permanent(&self, message: String) -> ProviderError {
        ProviderError::permanent(&self.config.name, message)
    }

    /// An SDK error as a provider error: settings the account refuses are
    /// permanent; capacity, price, quota, throttling and the network are
    /// worth another try (the reconciler backs the offer off meanwhile).
    fn sdk_error<E, R>(
        &self,
        call: &str,
        error: &aws_sdk_ec2::error::SdkError<E, R>,
    ) -> ProviderError
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
        R: fmt::Debug,
    {
        let code = error.code().unwrap_or("");
        let message = match (error.code(), error.message()) {
            (Some(code), Some(message)) => format!("{call}: {code}: {message}"),
            (Some(code), None) => format!("{call}: {code}"),
            _ => format!("{call}: {}", aws_sdk_ec2::error::DisplayErrorContext(error)),
        };
        if is_permanent(code) {
            self.permanent(message)
        } else {
            self.transient(message)
        }
    }

    /// What the machine runs for its job, with `bootstrap` exported.
    fn job_command(&self, bootstrap: &BTreeMap<String, String>) -> String {
        self.config
            .boot_command
            .clone()
            .unwrap_or_else(|| default_boot_command(bootstrap).to_owned())
    }

    fn controller_ids(&self) -> Vec<String> {
        let mut ids = vec![self.config.controller_id.clone()];
        ids.extend(self.config.legacy_controller_id.clone());
        ids
    }
}

/// Error codes that a retry cannot fix: the launch settings or the
/// credentials are wrong.
fn is_permanent(code: &str) -> bool {
    code.starts_with("InvalidAMIID")
        || code.starts_with("InvalidSubnet")
        || code.starts_with("InvalidGroup")
        || code.starts_with("InvalidKeyPair")
        || code.starts_with("InvalidParameter")
        || code.starts_with("InvalidBlockDeviceMapping")
        || code == "InvalidInstanceType"
        || code == "Unsupported"
        || code == "UnauthorizedOperation"
        || code == "AuthFailure"
        || code == "InvalidClientTokenId"
        || code == "OptInRequired"
        || code == "MissingParameter"
}

/// Whether a failed call may still have been carried out: it timed out,
/// its connection broke after it was sent, or its answer could not be
/// read.
fn sdk_in_doubt<E, R>(error: &aws_sdk_ec2::error::SdkError<E, R>) -> bool {
    use aws_sdk_ec2::error::SdkError;
    match error {
        SdkError::TimeoutError(_) | SdkError::ResponseError(_) => true,
        SdkError::DispatchFailure(failure) => !failure.is_user(),
        _ => false,
    }
}

fn aws_smithy_types_now(now: Timestamp) -> aws_sdk_ec2::primitives::DateTime {
    aws_sdk_ec2::primitives::DateTime::from_millis(now.as_millis())
}

#[async_trait]
impl Provider for Ec2Provider {
    fn name(&self) -> &str {
        &self.config.name
    }

    async fn create(&self, request: &CreateRequest) -> Result<Instance, ProviderError> {
        let offer = self
            .config
            .offer_of(&request.offer)
            .map_err(|e| self.permanent(e))?;
        let settings = LaunchSettings::from_launch_config(&request.launch_config)
            .map_err(|e| self.permanent(format!("worker configuration: {e}")))?;
        // The quota slot first, before any call: a round that plans while
        // this create looks itself up must see the slot taken.
        self.take_slot(&request.name)?;
        let release = |id: Option<&str>| {
            if let Ok(mut state) = self.state.lock() {
                state.reserved.remove(&request.name);
                if let Some(id) = id {
                    state.live.insert(id.to_owned());
                    state.launched.insert(id.to_owned(), Instant::now());
                }
            }
        };
        match self.find_by_name(&request.name).await {
            Ok(Some(found)) => {
                release(Some(&found.id.0));
                return Ok(found);
            }
            Ok(None) => {}
            Err(error) => {
                release(None);
                return Err(error);
            }
        }
        let script = if request.stock {
            // Warmed once, then stopped: powers itself off.
            every_boot(&user_data(
                &request.bootstrap,
                self.config.prepare_command.as_deref().unwrap_or("true"),
            ))
        } else {
            user_data(&request.bootstrap, &self.job_command(&request.bootstrap))
        };
        let mut tags = vec![
            tag("Name", &request.name),
            tag(CONTROLLER_TAG, &self.config.controller_id),
            tag(PROVIDER_TAG, &self.config.name),
            tag(RUNNER_TAG, &request.name),
            tag(POOL_TAG, &request.pool),
            tag(OFFER_TAG, &offer.to_string()),
        ];
        tags.extend(
            settings
                .tags
                .iter()
                .filter(|(k, _)| k.as_str() != "Name")
                .map(|(k, v)| tag(k, v)),
        );
        let client = self.client().await;
        let mut run = client
            .run_instances()
            .image_id(&settings.image_id)
            .instance_type(InstanceType::from(offer.instance_type.as_str()))
            .min_count(1)
            .max_count(1)
            // RunInstances' own idempotency: a retried request with the
            // same token starts nothing new.
            .client_token(client_token(&self.config.controller_id, &request.name))
            .placement(Placement::builder().availability_zone(&offer.zone).build())
            .instance_initiated_shutdown_behavior(if request.stock {
                ShutdownBehavior::Stop
            } else {
                ShutdownBehavior::Terminate
            })
            .user_data(base64::engine::general_purpose::STANDARD.encode(script))
            .tag_specifications(
                TagSpecification::builder()
                    .resource_type(ResourceType::Instance)
                    .set_tags(Some(tags))
                    .build(),
            )
            .set_subnet_id(settings.subnet_id.clone())
            .set_key_name(settings.key_name.clone());
        if !settings.security_group_ids.is_empty() {
            run = run.set_security_group_ids(Some(settings.security_group_ids.clone()));
        }
        if let Some(profile) = &settings.iam_instance_profile {
            let spec = if profile.starts_with("arn:") {
                IamInstanceProfileSpecification::builder().arn(profile)
            } else {
                IamInstanceProfileSpecification::builder().name(profile)
            };
            run = run.iam_instance_profile(spec.build());
        }
        for device in &settings.block_devices {
            let ebs = EbsBlockDevice::builder()
                .set_volume_size(device.volume_size)
                .set_volume_type(device.volume_type.as_deref().map(Into::into))
                .set_delete_on_termination(device.delete_on_termination.or(Some(true)))
                .set_encrypted(device.encrypted)
                .set_iops(device.iops)
                .set_throughput(device.throughput)
                .set_snapshot_id(device.snapshot_id.clone())
                .build();
            run = run.block_device_mappings(
                BlockDeviceMapping::builder()
                    .device_name(&device.device_name)
                    .ebs(ebs)
                    .build(),
            );
        }
        if let Some(metadata) = &settings.metadata {
            run = run.metadata_options(
                InstanceMetadataOptionsRequest::builder()
                    .set_http_tokens(metadata.http_tokens.as_deref().map(Into::into))
                    .set_http_put_response_hop_limit(metadata.hop_limit)
                    .set_http_endpoint(metadata.http_endpoint.as_deref().map(Into::into))
                    .build(),
            );
        }
        if offer.purchase == Purchase::Spot {
            run = run.instance_market_options(
                InstanceMarketOptionsRequest::builder()
                    .market_type(MarketType::Spot)
                    .spot_options(
                        SpotMarketOptions::builder()
                            .spot_instance_type(SpotInstanceType::OneTime)
                            .instance_interruption_behavior(InstanceInterruptionBehavior::Terminate)
                            .build(),
                    )
                    .build(),
            );
        }
        if let Err(error) = self.check_fence("RunInstances") {
            release(None);
            return Err(error);
        }
        let started = match run.send().await {
            Ok(started) => started,
            Err(error) if sdk_in_doubt(&error) => {
                // AWS may have launched it: the slot stays held, and the
                // instance is adopted by its runner tag if it appears.
                let error = ProviderError::in_doubt(
                    &self.config.name,
                    format!(
                        "RunInstances: {}",
                        aws_sdk_ec2::error::DisplayErrorContext(&error)
                    ),
                );
                tracing::warn!(provider = %self.config.name, runner = %request.name, offer = %offer, %error, "launch outcome unknown");
                return Err(error);
            }
            Err(error) => {
                release(None);
                let error = self.sdk_error("RunInstances", &error);
                tracing::warn!(provider = %self.config.name, runner = %request.name, offer = %offer, %error, "launch failed");
                return Err(error);
            }
        };
        let Some(instance) = started
            .instances()
            .first()
            .and_then(|i| self.instance(i))
            .map(|(instance, _)| instance)
        else {
            release(None);
            return Err(self.transient("RunInstances answered without an instance".into()));
        };
        release(Some(&instance.id.0));
        tracing::info!(provider = %self.config.name, runner = %request.name, instance = %instance.id, offer = %offer, "launched");
        Ok(Instance {
            name: request.name.clone(),
            ..instance
        })
    }

    async fn delete(&self, id: &InstanceId) -> Result<(), ProviderError> {
        if !id.0.starts_with("i-") {
            // Not an EC2 instance id: nothing of it can exist.
            return Ok(());
        }
        let client = self.client().await;
        self.check_fence("TerminateInstances")?;
        match client
            .terminate_instances()
            .instance_ids(&id.0)
            .send()
            .await
        {
            Ok(_) => {}
            Err(error) if error.code() == Some("InvalidInstanceID.NotFound") => {}
            Err(error) => return Err(self.sdk_error("TerminateInstances", &error)),
        }
        if let Ok(mut state) = self.state.lock() {
            state.live.remove(&id.0);
            state.launched.remove(&id.0);
        }
        Ok(())
    }

    async fn start(
        &self,
        id: &InstanceId,
        fresh: Option<&CreateRequest>,
    ) -> Result<(), ProviderError> {
        let client = self.client().await;
        if let Some(fresh) = fresh {
            // The job's script with its fresh credential, run at this boot
            // (`every_boot`), and a power-off that terminates again. Each
            // must take before the start: a machine started without them
            // would boot with no credential, or stop after its job instead
            // of ending.
            let script = every_boot(&user_data(
                &fresh.bootstrap,
                &self.job_command(&fresh.bootstrap),
            ));
            // The `Attribute=userData` form with base64 text, as EC2's user
            // guide gives it: the `UserData` blob form is encoded by the SDK
            // once, which AWS takes and moto (an independent EC2) does not.
            self.check_fence("ModifyInstanceAttribute")?;
            client
                .modify_instance_attribute()
                .instance_id(&id.0)
                .attribute(InstanceAttributeName::UserData)
                .value(base64::engine::general_purpose::STANDARD.encode(script))
                .send()
                .await
                .map_err(|e| self.sdk_error("ModifyInstanceAttribute (userData)", &e))?;
            self.check_fence("ModifyInstanceAttribute")?;
            client
                .modify_instance_attribute()
                .instance_id(&id.0)
                .attribute(InstanceAttributeName::InstanceInitiatedShutdownBehavior)
                .value("terminate")
                .send()
                .await
                .map_err(|e| {
                    self.sdk_error(
                        "ModifyInstanceAttribute (instanceInitiatedShutdownBehavior)",
                        &e,
                    )
                })?;
        }
        self.check_fence("StartInstances")?;
        client
            .start_instances()
            .instance_ids(&id.0)
            .send()
            .await
            .map_err(|e| self.sdk_error("StartInstances", &e))?;
        Ok(())
    }

    async fn stop(&self, id: &InstanceId) -> Result<(), ProviderError> {
        let client = self.client().await;
        self.check_fence("StopInstances")?;
        client
            .stop_instances()
            .instance_ids(&id.0)
            .send()
            .await
            .map_err(|e| self.sdk_error("StopInstances", &e))?;
        Ok(())
    }

    async fn list(&self) -> Result<Vec<Instance>, ProviderError> {
        self.refresh_spot_prices().await;
        let client = self.client().await;
        let mut pages = client
            .describe_instances()
            .filters(tag_filter(CONTROLLER_TAG, self.controller_ids()))
            // Terminated ones too, for what their state reason teaches.
            .filters(state_filter(&[
                "pending",
                "running",
                "stopping",
                "stopped",
                "shutting-down",
                "terminated",
            ]))
            .max_results(1000)
            .into_paginator()
            .send();
        let mut listed = Vec::new();
        let mut interrupted: Vec<(String, String)> = Vec::new();
        // Every instance described, gone ones too: a launch the list has
        // shown (running or already terminated) is no longer lagging.
        let mut seen = BTreeSet::new();
        let mut gone = BTreeSet::new();
        let mut unproven = BTreeSet::new();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| self.sdk_error("DescribeInstances", &e))?;
            for described in page.reservations().iter().flat_map(|r| r.instances()) {
                let Some((instance, observed)) = self.instance(described) else {
                    continue;
                };
                if observed.interrupted {
                    let offer = tag_value(described.tags(), OFFER_TAG).unwrap_or_default();
                    interrupted.push((instance.id.0.clone(), offer));
                }
                seen.insert(instance.id.0.clone());
                if !observed.proven {
                    unproven.insert(instance.id.0.clone());
                }
                if observed.gone {
                    gone.insert(instance.id.0.clone());
                    continue;
                }
                listed.push(instance);
            }
        }
        let now = self.clock.now();
        if let Ok(mut state) = self.state.lock() {
            // A launch the list does not show yet still counts, until the
            // list shows it or `list_lag` has passed since it returned
            // (then it is gone, or AWS never started it).
            let lag = self.config.list_lag;
            state
                .launched
                .retain(|id, at| !seen.contains(id) && at.elapsed() < lag);
            let unlisted: Vec<String> = state.launched.keys().cloned().collect();
            // A create's slot whose instance the list shows (by its Name
            // tag) is counted in `live` now, or is over (the instance
            // ended): held on, it would shrink the quota for good.
            for instance in &listed {
                state.reserved.remove(&instance.name);
            }
            state.gone = gone;
            state.unproven = unproven;
            state.live = listed
                .iter()
                .filter(|i| i.state != InstanceState::Failed)
                .map(|i| i.id.0.clone())
                .chain(unlisted)
                .collect();
            for (id, offer) in interrupted {
                if state.counted.insert(id.clone()) {
                    tracing::warn!(provider = %self.config.name, instance = %id, offer = %offer, "spot instance interrupted by AWS");
                    state.interruptions.entry(offer).or_default().push(now);
                }
            }
            for times in state.interruptions.values_mut() {
                times.retain(|t| now.since(*t) < INTERRUPTION_MEMORY);
            }
            state.interruptions.retain(|_, times| !times.is_empty());
            if state.counted.len() > 10_000 {
                state.counted.clear();
            }
        }
        Ok(listed)
    }

    fn bid(&self, _pool: &str, capacity: u32) -> Vec<Offer> {
        let (used, prices) = match self.state.lock() {
            Ok(state) => (state.used(), state.spot_prices.clone()),
            Err(_) => return Vec::new(),
        };
        // At quota the offers stay, with capacity 0: what each would cost
        // and how reliable it is stays visible while none can start.
        let left = self.config.max_instances.saturating_sub(used).min(capacity);
        let now = self.clock.now();
        self.config
            .offer_keys()
            .into_iter()
            .filter_map(|key| {
                let price = match key.purchase {
                    Purchase::OnDemand => self.config.on_demand_price(&key.instance_type),
                    // No spot offer until its price is known.
                    Purchase::Spot => {
                        *prices.get(&(key.instance_type.clone(), key.zone.clone()))?
                    }
                };
                let key = key.to_string();
                Some(Offer {
                    provider: self.config.name.clone(),
                    reliability: self.reliability(&key, now),
                    key,
                    capacity: left,
                    price_per_hour: price,
                    boot_time: self.config.boot_time,
                })
            })
            .collect()
    }

    fn offer_inputs(&self, offer: &str) -> BTreeMap<String, String> {
        let Ok(offer) = self.config.offer_of(offer) else {
            return BTreeMap::new();
        };
        BTreeMap::from([
            ("region".to_owned(), self.config.region.clone()),
            ("availabilityZone".to_owned(), offer.zone),
            ("instanceType".to_owned(), offer.instance_type),
            ("purchaseOption".to_owned(), offer.purchase.to_string()),
        ])
    }

    fn stock_stops_itself(&self) -> bool {
        true
    }

    fn runners_register(&self) -> bool {
        true
    }

    fn reserve(&self, name: &str) -> Result<(), ProviderError> {
        self.take_slot(name)
    }

    fn proven_own(&self, id: &InstanceId) -> bool {
        self.state
            .lock()
            .map(|state| !state.unproven.contains(&id.0))
            .unwrap_or(false)
    }

    fn seen_gone(&self, id: &InstanceId) -> bool {
        self.state
            .lock()
            .map(|state| state.gone.contains(&id.0))
            .unwrap_or(false)
    }

    fn unreserve(&self, name: &str) {
        if let Ok(mut state) = self.state.lock() {
            state.reserved.remove(name);
        }
    }
}

/// RunInstances' client token for runner `name` (at most 64 ASCII
/// characters): the same for every retry of one runner's create.
fn client_token(controller_id: &str, name: &str) -> String {
    let token = format!("{}-{name}", controller_id.get(..8).unwrap_or(controller_id));
    token.chars().take(64).collect()
}
