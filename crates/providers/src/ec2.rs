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

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::{
    BlockDeviceMapping, EbsBlockDevice, Filter, IamInstanceProfileSpecification,
    InstanceInterruptionBehavior, InstanceMarketOptionsRequest, InstanceMetadataOptionsRequest,
    InstanceStateName, InstanceType, MarketType, Placement, ResourceType, ShutdownBehavior,
    SpotInstanceType, SpotMarketOptions, Tag, TagSpecification,
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

/// How long a spot interruption weighs on its offer's reliability.
const INTERRUPTION_MEMORY: Duration = Duration::from_secs(3600);
/// At most this many pages of spot prices per refresh (the request budget).
const SPOT_PRICE_PAGES: usize = 10;

/// How an instance is bought.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Purchase {
    #[serde(rename = "spot")]
    Spot,
    #[serde(rename = "on-demand")]
    OnDemand,
}

impl Purchase {
    pub const ALL: [Purchase; 2] = [Purchase::Spot, Purchase::OnDemand];
}

impl fmt::Display for Purchase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Purchase::Spot => "spot",
            Purchase::OnDemand => "on-demand",
        })
    }
}

impl FromStr for Purchase {
    type Err = String;
    fn from_str(text: &str) -> Result<Purchase, String> {
        match text {
            "spot" => Ok(Purchase::Spot),
            "on-demand" => Ok(Purchase::OnDemand),
            other => Err(format!("{other:?} is not spot or on-demand")),
        }
    }
}

/// One thing the provider can launch: `TYPE/ZONE/PURCHASE` as an offer key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OfferKey {
    pub instance_type: String,
    pub zone: String,
    pub purchase: Purchase,
}

impl fmt::Display for OfferKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.instance_type, self.zone, self.purchase)
    }
}

impl FromStr for OfferKey {
    type Err = String;
    fn from_str(text: &str) -> Result<OfferKey, String> {
        let mut parts = text.split('/');
        match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(instance_type), Some(zone), Some(purchase), None)
                if !instance_type.is_empty() && !zone.is_empty() =>
            {
                Ok(OfferKey {
                    instance_type: instance_type.to_owned(),
                    zone: zone.to_owned(),
                    purchase: purchase.parse()?,
                })
            }
            _ => Err(format!(
                "{text:?} is not an EC2 offer (INSTANCE_TYPE/ZONE/spot|on-demand)"
            )),
        }
    }
}

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

/// What the machine runs when no `boot_command` is configured: GitHub's
/// runner with its just-in-time configuration on a GitHub pool, runway's
/// agent (which reads the exported `RUNWAY_*` variables) otherwise.
pub fn default_boot_command(bootstrap: &BTreeMap<String, String>) -> &'static str {
    if bootstrap.contains_key("RUNWAY_JIT_CONFIG") {
        "cd /home/runner/actions-runner && runuser -u runner -- ./run.sh --jitconfig \"$RUNWAY_JIT_CONFIG\""
    } else {
        "runway agent --once"
    }
}

/// The launch settings a pool's worker configuration gives, from its `ec2`
/// object, in RunInstances' names. `InstanceType`, placement, market
/// options and user data come from the offer and runway, not from here.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LaunchSettings {
    pub image_id: String,
    pub subnet_id: Option<String>,
    pub security_group_ids: Vec<String>,
    /// A name, or an ARN (`arn:…`).
    pub iam_instance_profile: Option<String>,
    pub key_name: Option<String>,
    pub block_devices: Vec<BlockDevice>,
    pub tags: BTreeMap<String, String>,
    /// `MetadataOptions`: `HttpTokens`, `HttpPutResponseHopLimit`,
    /// `HttpEndpoint`.
    pub metadata: Option<MetadataOptions>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct BlockDevice {
    pub device_name: String,
    pub volume_size: Option<i32>,
    pub volume_type: Option<String>,
    pub delete_on_termination: Option<bool>,
    pub encrypted: Option<bool>,
    pub iops: Option<i32>,
    pub throughput: Option<i32>,
    pub snapshot_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct MetadataOptions {
    pub http_tokens: Option<String>,
    pub hop_limit: Option<i32>,
    pub http_endpoint: Option<String>,
}

/// The keys an `ec2` object may have.
pub const LAUNCH_KEYS: [&str; 10] = [
    "ImageId",
    "SubnetId",
    "SubnetID",
    "SecurityGroupIds",
    "IamInstanceProfile",
    "KeyName",
    "BlockDeviceMappings",
    "Tags",
    "MetadataOptions",
    "InstanceType",
];

/// What is wrong with the `ec2` object of one rule's `values`, naming the
/// key. A rule holds part of the settings (another may give the image), so
/// each key present is checked as [`LaunchSettings::from_launch_config`]
/// reads it, and none is required.
pub fn check_rule_values(values: &Value) -> Result<(), String> {
    let Some(ec2) = values.get("ec2") else {
        return Ok(());
    };
    let Some(object) = ec2.as_object() else {
        return Err("ec2 must be an object of RunInstances settings".into());
    };
    let mut whole = object.clone();
    whole
        .entry("ImageId")
        .or_insert_with(|| Value::String("ami-checked-elsewhere".into()));
    LaunchSettings::from_launch_config(&serde_json::json!({ "ec2": whole })).map(drop)
}

impl LaunchSettings {
    /// The settings in `launch_config` (the evaluated worker
    /// configuration), or what is wrong with them, naming the key.
    pub fn from_launch_config(launch_config: &Value) -> Result<LaunchSettings, String> {
        let Some(ec2) = launch_config.get("ec2") else {
            return Err(
                "the pool's worker configuration gives no ec2 object (ec2.ImageId is needed)"
                    .into(),
            );
        };
        let ec2 = ec2
            .as_object()
            .ok_or("ec2 must be an object of RunInstances settings")?;
        for key in ec2.keys() {
            if !LAUNCH_KEYS.contains(&key.as_str()) {
                return Err(format!(
                    "ec2.{key} is not a launch setting runway knows (known: {})",
                    LAUNCH_KEYS.join(", ")
                ));
            }
        }
        if ec2.contains_key("InstanceType") {
            return Err("ec2.InstanceType: the instance type comes from the offer; list the types in the provider's instance_types".into());
        }
        let string = |key: &str| -> Result<Option<String>, String> {
            match ec2.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
                Some(_) => Err(format!("ec2.{key} must be a non-empty string")),
            }
        };
        let image_id = string("ImageId")?.ok_or("ec2.ImageId is required")?;
        let subnet_id = match (string("SubnetId")?, string("SubnetID")?) {
            (Some(a), Some(b)) if a != b => {
                return Err("ec2.SubnetId and ec2.SubnetID differ; give one".into())
            }
            (a, b) => a.or(b),
        };
        let security_group_ids = match ec2.get("SecurityGroupIds") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(ids)) => ids
                .iter()
                .map(|id| {
                    id.as_str()
                        .map(str::to_owned)
                        .ok_or("ec2.SecurityGroupIds must be a list of strings")
                })
                .collect::<Result<_, _>>()?,
            Some(_) => return Err("ec2.SecurityGroupIds must be a list of strings".into()),
        };
        let iam_instance_profile = match ec2.get("IamInstanceProfile") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(Value::Object(o)) => match (o.get("Arn"), o.get("Name")) {
                (Some(Value::String(arn)), None) => Some(arn.clone()),
                (None, Some(Value::String(name))) => Some(name.clone()),
                _ => {
                    return Err(
                        "ec2.IamInstanceProfile must be a name, or an object with Arn or Name"
                            .into(),
                    )
                }
            },
            Some(_) => {
                return Err(
                    "ec2.IamInstanceProfile must be a name, or an object with Arn or Name".into(),
                )
            }
        };
        let key_name = string("KeyName")?;
        let block_devices = match ec2.get("BlockDeviceMappings") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(devices)) => devices
                .iter()
                .enumerate()
                .map(|(i, d)| block_device(i, d))
                .collect::<Result<_, _>>()?,
            Some(_) => return Err("ec2.BlockDeviceMappings must be a list".into()),
        };
        let tags = match ec2.get("Tags") {
            None | Some(Value::Null) => BTreeMap::new(),
            Some(Value::Object(tags)) => tags
                .iter()
                .map(|(k, v)| match v {
                    Value::String(v) if !k.starts_with("runway:") => Ok((k.clone(), v.clone())),
                    Value::String(_) => Err(format!("ec2.Tags.{k}: runway: tags are runway's own")),
                    _ => Err(format!("ec2.Tags.{k} must be a string")),
                })
                .collect::<Result<_, _>>()?,
            Some(Value::Array(tags)) => tags
                .iter()
                .map(|tag| match (tag.get("Key"), tag.get("Value")) {
                    (Some(Value::String(k)), Some(Value::String(_)))
                        if k.starts_with("runway:") =>
                    {
                        Err(format!("ec2.Tags {k}: runway: tags are runway's own"))
                    }
                    (Some(Value::String(k)), Some(Value::String(v))) => Ok((k.clone(), v.clone())),
                    _ => Err(
                        "ec2.Tags must be an object of strings or a list of {Key, Value}"
                            .to_owned(),
                    ),
                })
                .collect::<Result<_, _>>()?,
            Some(_) => {
                return Err(
                    "ec2.Tags must be an object of strings or a list of {Key, Value}".into(),
                )
            }
        };
        let metadata = match ec2.get("MetadataOptions") {
            None | Some(Value::Null) => None,
            Some(Value::Object(o)) => {
                for key in o.keys() {
                    if !["HttpTokens", "HttpPutResponseHopLimit", "HttpEndpoint"]
                        .contains(&key.as_str())
                    {
                        return Err(format!("ec2.MetadataOptions.{key} is not one runway sets (HttpTokens, HttpPutResponseHopLimit, HttpEndpoint)"));
                    }
                }
                Some(MetadataOptions {
                    http_tokens: opt_str(o.get("HttpTokens"), "ec2.MetadataOptions.HttpTokens")?,
                    hop_limit: opt_int(
                        o.get("HttpPutResponseHopLimit"),
                        "ec2.MetadataOptions.HttpPutResponseHopLimit",
                    )?,
                    http_endpoint: opt_str(
                        o.get("HttpEndpoint"),
                        "ec2.MetadataOptions.HttpEndpoint",
                    )?,
                })
            }
            Some(_) => return Err("ec2.MetadataOptions must be an object".into()),
        };
        Ok(LaunchSettings {
            image_id,
            subnet_id,
            security_group_ids,
            iam_instance_profile,
            key_name,
            block_devices,
            tags,
            metadata,
        })
    }
}

fn opt_str(value: Option<&Value>, key: &str) -> Result<Option<String>, String> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{key} must be a string")),
    }
}

fn opt_int(value: Option<&Value>, key: &str) -> Result<Option<i32>, String> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .filter(|n| *n >= 0)
            .map(Some)
            .ok_or_else(|| format!("{key} must be a whole number")),
    }
}

fn opt_bool(value: Option<&Value>, key: &str) -> Result<Option<bool>, String> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(format!("{key} must be true or false")),
    }
}

fn block_device(index: usize, device: &Value) -> Result<BlockDevice, String> {
    let at = format!("ec2.BlockDeviceMappings[{index}]");
    let device_name = device
        .get("DeviceName")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("{at}.DeviceName is required"))?
        .to_owned();
    let ebs = device.get("Ebs").cloned().unwrap_or(Value::Null);
    let ebs_at = |key: &str| format!("{at}.Ebs.{key}");
    Ok(BlockDevice {
        device_name,
        volume_size: opt_int(ebs.get("VolumeSize"), &ebs_at("VolumeSize"))?,
        volume_type: opt_str(ebs.get("VolumeType"), &ebs_at("VolumeType"))?,
        delete_on_termination: opt_bool(
            ebs.get("DeleteOnTermination"),
            &ebs_at("DeleteOnTermination"),
        )?,
        encrypted: opt_bool(ebs.get("Encrypted"), &ebs_at("Encrypted"))?,
        iops: opt_int(ebs.get("Iops"), &ebs_at("Iops"))?,
        throughput: opt_int(ebs.get("Throughput"), &ebs_at("Throughput"))?,
        snapshot_id: opt_str(ebs.get("SnapshotId"), &ebs_at("SnapshotId"))?,
    })
}

/// The user data of a runner: a shell script that exports its bootstrap
/// and runs `command`, then powers the machine off (which terminates it:
/// runway launches with `InstanceInitiatedShutdownBehavior=terminate`).
pub fn user_data(bootstrap: &BTreeMap<String, String>, command: &str) -> String {
    let mut script = String::from("#!/bin/sh\n# runway: this machine's runner bootstrap\n");
    for (name, value) in bootstrap {
        script.push_str(&format!("export {name}={}\n", shell_quote(value)));
    }
    script.push_str(command);
    script.push_str("\nshutdown -h now\n");
    script
}

/// `value` as one single-quoted shell word.
fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
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

    fn controller_ids(&self) -> Vec<String> {
        let mut ids = vec![self.config.controller_id.clone()];
        ids.extend(self.config.legacy_controller_id.clone());
        ids
    }

    /// Reads the spot prices again when the last read is older than
    /// `spot_price_refresh`; a failed read keeps the prices it had.
    async fn refresh_spot_prices(&self) {
        if !self.config.purchase_options.contains(&Purchase::Spot) {
            return;
        }
        let due = self
            .state
            .lock()
            .map(|s| {
                s.prices_read
                    .is_none_or(|at| at.elapsed() >= self.config.spot_price_refresh)
            })
            .unwrap_or(false);
        if !due {
            return;
        }
        if let Ok(mut state) = self.state.lock() {
            // One try per interval, whatever its outcome.
            state.prices_read = Some(Instant::now());
        }
        let client = self.client().await;
        let now = aws_smithy_types_now(self.clock.now());
        let mut request = client
            .describe_spot_price_history()
            .product_descriptions("Linux/UNIX")
            .start_time(now)
            .filters(
                Filter::builder()
                    .name("availability-zone")
                    .set_values(Some(self.config.zones.clone()))
                    .build(),
            );
        for instance_type in &self.config.instance_types {
            request = request.instance_types(InstanceType::from(instance_type.as_str()));
        }
        let mut pages = request.into_paginator().send();
        let mut prices: BTreeMap<(String, String), (f64, i64)> = BTreeMap::new();
        let mut read = 0;
        while let Some(page) = pages.next().await {
            let page = match page {
                Ok(page) => page,
                Err(error) => {
                    let error = self.sdk_error("DescribeSpotPriceHistory", &error);
                    tracing::warn!(provider = %self.config.name, %error, "cannot read spot prices; keeping the last ones");
                    return;
                }
            };
            for price in page.spot_price_history() {
                let (Some(instance_type), Some(zone), Some(value)) = (
                    price.instance_type(),
                    price.availability_zone(),
                    price.spot_price().and_then(|p| p.parse::<f64>().ok()),
                ) else {
                    continue;
                };
                let at = price.timestamp().map(|t| t.secs()).unwrap_or(0);
                let key = (instance_type.as_str().to_owned(), zone.to_owned());
                // The newest price of each (type, zone) holds.
                if prices.get(&key).is_none_or(|(_, seen)| at >= *seen) {
                    prices.insert(key, (value, at));
                }
            }
            read += 1;
            if read >= SPOT_PRICE_PAGES {
                break;
            }
        }
        if let Ok(mut state) = self.state.lock() {
            state.spot_prices = prices.into_iter().map(|(k, (v, _))| (k, v)).collect();
        }
    }

    /// The running instance named `name`, if a create of it got through.
    async fn find_by_name(&self, name: &str) -> Result<Option<Instance>, ProviderError> {
        let client = self.client().await;
        let described = client
            .describe_instances()
            .filters(tag_filter(CONTROLLER_TAG, self.controller_ids()))
            .filters(tag_filter(RUNNER_TAG, vec![name.to_owned()]))
            .filters(state_filter(&["pending", "running", "stopping", "stopped"]))
            .send()
            .await
            .map_err(|e| self.sdk_error("DescribeInstances", &e))?;
        Ok(described
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .find_map(|i| self.instance(i).map(|(instance, _)| instance)))
    }

    /// An EC2 instance as runway sees it, with whether AWS interrupted it;
    /// `None` for another provider's (its provider tag names another).
    fn instance(&self, instance: &aws_sdk_ec2::types::Instance) -> Option<(Instance, Observed)> {
        let id = instance.instance_id()?;
        let proven = match tag_value(instance.tags(), PROVIDER_TAG) {
            Some(provider) if provider == self.config.name => true,
            Some(_) => return None,
            None => false,
        };
        let name = tag_value(instance.tags(), RUNNER_TAG).unwrap_or_default();
        let state = instance.state().and_then(|s| s.name());
        let interrupted = instance
            .state_reason()
            .and_then(|r| r.code())
            .is_some_and(|code| code == "Server.SpotInstanceTermination");
        let legacy = tag_value(instance.tags(), CONTROLLER_TAG).as_deref()
            != Some(self.config.controller_id.as_str());
        let observed = Observed {
            interrupted,
            gone: state == Some(&InstanceStateName::Terminated),
            proven: proven && !legacy,
        };
        let state = match state {
            Some(InstanceStateName::Pending) => InstanceState::Pending,
            Some(InstanceStateName::Running) => InstanceState::Running,
            Some(InstanceStateName::Stopping) | Some(InstanceStateName::Stopped) => {
                InstanceState::Stopped
            }
            Some(InstanceStateName::ShuttingDown) | Some(InstanceStateName::Terminated) => {
                InstanceState::Failed
            }
            _ => InstanceState::Unknown,
        };
        Some((
            Instance {
                id: InstanceId(id.to_owned()),
                name,
                state,
            },
            observed,
        ))
    }

    fn reliability(&self, offer: &str, now: Timestamp) -> f64 {
        let recent = self
            .state
            .lock()
            .map(|s| {
                s.interruptions
                    .get(offer)
                    .map(|at| {
                        at.iter()
                            .filter(|t| now.since(**t) < INTERRUPTION_MEMORY)
                            .count()
                    })
                    .unwrap_or(0)
            })
            .unwrap_or(0);
        interruption_reliability(recent)
    }

    /// The spot price of `instance_type` in `zone`, as last read.
    pub fn spot_price(&self, instance_type: &str, zone: &str) -> Option<f64> {
        self.state.lock().ok().and_then(|s| {
            s.spot_prices
                .get(&(instance_type.to_owned(), zone.to_owned()))
                .copied()
        })
    }
}

/// What a listed instance says beyond its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Observed {
    /// AWS took or is taking it back (a spot interruption).
    interrupted: bool,
    /// Terminated: no longer runway's concern, but for what it teaches.
    gone: bool,
    /// Tagged with this provider's name under this controller's id.
    proven: bool,
}

/// An offer's reliability after `recent` spot interruptions within the
/// last hour: each halves it, never below 0.05.
pub fn interruption_reliability(recent: usize) -> f64 {
    0.5f64.powi(recent.min(16) as i32).max(0.05)
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

fn state_filter(states: &[&str]) -> Filter {
    Filter::builder()
        .name("instance-state-name")
        .set_values(Some(states.iter().map(|s| (*s).to_owned()).collect()))
        .build()
}

fn tag_filter(key: &str, values: Vec<String>) -> Filter {
    Filter::builder()
        .name(format!("tag:{key}"))
        .set_values(Some(values))
        .build()
}

fn tag_value(tags: &[Tag], key: &str) -> Option<String> {
    tags.iter()
        .find(|t| t.key() == Some(key))
        .and_then(|t| t.value())
        .map(str::to_owned)
}

fn tag(key: &str, value: &str) -> Tag {
    Tag::builder().key(key).value(value).build()
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
        let command = self
            .config
            .boot_command
            .clone()
            .unwrap_or_else(|| default_boot_command(&request.bootstrap).to_owned());
        let script = user_data(&request.bootstrap, &command);
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
            .instance_initiated_shutdown_behavior(ShutdownBehavior::Terminate)
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

    async fn start(&self, id: &InstanceId) -> Result<(), ProviderError> {
        let client = self.client().await;
        self.check_fence("StartInstances")?;
        client
            .start_instances()
            .instance_ids(&id.0)
            .send()
            .await
            .map_err(|e| self.sdk_error("StartInstances", &e))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn offer_keys_round_trip_and_refuse_what_is_not_one() {
        let key = OfferKey {
            instance_type: "m5.large".into(),
            zone: "us-east-1a".into(),
            purchase: Purchase::Spot,
        };
        assert_eq!(key.to_string(), "m5.large/us-east-1a/spot");
        assert_eq!("m5.large/us-east-1a/spot".parse::<OfferKey>(), Ok(key));
        for bad in [
            "",
            "m5.large",
            "m5.large/us-east-1a",
            "m5.large/us-east-1a/reserved",
            "a/b/spot/x",
        ] {
            assert!(bad.parse::<OfferKey>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_rfc_example_values_make_launch_settings() {
        let config = json!({
            "scalingRatio": 1,
            "ec2": {"ImageId": "ami-12345abcdef", "SubnetID": "sn-302433abcdef"}
        });
        let settings = LaunchSettings::from_launch_config(&config).expect("settings");
        assert_eq!(settings.image_id, "ami-12345abcdef");
        assert_eq!(settings.subnet_id.as_deref(), Some("sn-302433abcdef"));
    }

    #[test]
    fn every_launch_setting_is_read() {
        let config = json!({"ec2": {
            "ImageId": "ami-1",
            "SubnetId": "subnet-1",
            "SecurityGroupIds": ["sg-1", "sg-2"],
            "IamInstanceProfile": {"Arn": "arn:aws:iam::1:instance-profile/ci"},
            "KeyName": "ops",
            "BlockDeviceMappings": [{"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 100, "VolumeType": "gp3", "Encrypted": true}}],
            "Tags": {"team": "build"},
            "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 1}
        }});
        let settings = LaunchSettings::from_launch_config(&config).expect("settings");
        assert_eq!(
            settings,
            LaunchSettings {
                image_id: "ami-1".into(),
                subnet_id: Some("subnet-1".into()),
                security_group_ids: vec!["sg-1".into(), "sg-2".into()],
                iam_instance_profile: Some("arn:aws:iam::1:instance-profile/ci".into()),
                key_name: Some("ops".into()),
                block_devices: vec![BlockDevice {
                    device_name: "/dev/xvda".into(),
                    volume_size: Some(100),
                    volume_type: Some("gp3".into()),
                    encrypted: Some(true),
                    ..BlockDevice::default()
                }],
                tags: BTreeMap::from([("team".into(), "build".into())]),
                metadata: Some(MetadataOptions {
                    http_tokens: Some("required".into()),
                    hop_limit: Some(1),
                    http_endpoint: None,
                }),
            }
        );
    }

    #[test]
    fn wrong_launch_settings_are_named() {
        let cases = [
            (json!({}), "no ec2 object"),
            (json!({"ec2": {}}), "ec2.ImageId is required"),
            (
                json!({"ec2": {"ImageId": "ami-1", "ImageID": "x"}}),
                "ec2.ImageID is not a launch setting",
            ),
            (
                json!({"ec2": {"ImageId": "ami-1", "InstanceType": "m5.large"}}),
                "comes from the offer",
            ),
            (
                json!({"ec2": {"ImageId": "ami-1", "SecurityGroupIds": "sg-1"}}),
                "list of strings",
            ),
            (
                json!({"ec2": {"ImageId": "ami-1", "Tags": {"runway:pool": "x"}}}),
                "runway's own",
            ),
            (
                json!({"ec2": {"ImageId": "ami-1", "BlockDeviceMappings": [{"Ebs": {}}]}}),
                "BlockDeviceMappings[0].DeviceName",
            ),
            (
                json!({"ec2": {"ImageId": "ami-1", "SubnetId": "a", "SubnetID": "b"}}),
                "differ",
            ),
        ];
        for (config, expected) in cases {
            let error = LaunchSettings::from_launch_config(&config).expect_err("refused");
            assert!(error.contains(expected), "{config}: {error}");
        }
    }

    #[test]
    fn user_data_exports_the_bootstrap_quoted_and_powers_off() {
        let bootstrap = BTreeMap::from([
            ("RUNWAY_URL".to_owned(), "http://10.0.0.1:8080".to_owned()),
            ("RUNWAY_RUNNER_LABELS".to_owned(), "it's,linux".to_owned()),
        ]);
        let script = user_data(&bootstrap, default_boot_command(&bootstrap));
        assert_eq!(
            script,
            "#!/bin/sh\n# runway: this machine's runner bootstrap\n\
             export RUNWAY_RUNNER_LABELS='it'\\''s,linux'\n\
             export RUNWAY_URL='http://10.0.0.1:8080'\n\
             runway agent --once\nshutdown -h now\n"
        );
        let jit = BTreeMap::from([("RUNWAY_JIT_CONFIG".to_owned(), "abc".to_owned())]);
        assert!(default_boot_command(&jit).contains("run.sh --jitconfig"));
    }

    #[test]
    fn interruptions_halve_reliability() {
        assert_eq!(interruption_reliability(0), 1.0);
        assert_eq!(interruption_reliability(1), 0.5);
        assert_eq!(interruption_reliability(2), 0.25);
        assert_eq!(interruption_reliability(100), 0.05);
    }

    #[test]
    fn error_codes_that_settings_cause_are_permanent() {
        for code in [
            "InvalidAMIID.NotFound",
            "InvalidSubnetID.NotFound",
            "UnauthorizedOperation",
            "InvalidParameterValue",
        ] {
            assert!(is_permanent(code), "{code}");
        }
        for code in [
            "InsufficientInstanceCapacity",
            "SpotMaxPriceTooLow",
            "InstanceLimitExceeded",
            "VcpuLimitExceeded",
            "MaxSpotInstanceCountExceeded",
            "RequestLimitExceeded",
            "",
        ] {
            assert!(!is_permanent(code), "{code}");
        }
    }

    #[test]
    fn client_tokens_are_stable_and_short() {
        let token = client_token("5f0c6a2e-1111-2222-3333-444444444444", "linux-0000abcd");
        assert_eq!(token, "5f0c6a2e-linux-0000abcd");
        assert!(client_token("c", &"x".repeat(100)).len() <= 64);
    }
}
