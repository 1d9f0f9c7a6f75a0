//! The `ec2` provider end to end: the real binary against moto's EC2
//! server (PyPI's `moto[server]`, an emulator written by others from AWS's
//! API; `.ci/run` installs it), through a loopback proxy that injects the
//! launch errors AWS gives when it has no capacity. What is checked is
//! read back from moto with the AWS SDK, not from runway.

use crate::common;

use runway_testkit::moto;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use aws_sdk_ec2::types::{Filter, Instance, ResourceType, Tag, TagSpecification};
use axum::response::IntoResponse;
use base64::Engine;
use common::proxy::{self, After, Answer, Before, FaultProxy, Seen};
use common::{wait_until, Process};
use serde_json::{json, Value};

mod stock;

const ADMIN: &str = "ec2-provider-admin-token";

/// Which launches the proxy refuses, and what it saw.
#[derive(Default)]
struct Faults {
    /// Refuse spot launches (InsufficientInstanceCapacity).
    spot: AtomicBool,
    /// Refuse launches in this zone.
    zone: Mutex<Option<String>>,
    /// Every RunInstances: (client token, market, zone, refused).
    launches: Mutex<Vec<(String, String, String, bool)>>,
    /// DescribeInstances leaves out each instance for this long after its
    /// RunInstances answered (EC2's documented eventual consistency).
    hide_for: Mutex<std::time::Duration>,
    /// Every call is answered this much later.
    delay: Mutex<std::time::Duration>,
    /// When each launched instance's RunInstances answered.
    launched_at: Mutex<BTreeMap<String, std::time::Instant>>,
    /// Refuse StartInstances (InsufficientInstanceCapacity).
    refuse_starts: AtomicBool,
    /// Every StartInstances: (instance id, refused).
    starts: Mutex<Vec<(String, bool)>>,
    /// StartInstances is answered this much later.
    start_delay: Mutex<std::time::Duration>,
    /// StartInstances calls that came in, counted before their delay.
    start_calls: std::sync::atomic::AtomicUsize,
    /// Throttle every user-data write (ModifyInstanceAttribute
    /// `Attribute=userData`): HTTP 503 `RequestLimitExceeded`, EC2's
    /// throttling answer.
    throttle_user_data: AtomicBool,
    /// Every user-data write: (instance id, throttled).
    user_data_writes: Mutex<Vec<(String, bool)>>,
}

/// The text of every `<instanceId>` in `xml`.
fn instance_ids(xml: &str) -> Vec<String> {
    xml.split("<instanceId>")
        .skip(1)
        .filter_map(|rest| {
            rest.split_once("</instanceId>")
                .map(|(id, _)| id.to_owned())
        })
        .collect()
}

/// `xml` (a DescribeInstances answer) without the reservations that hold
/// an instance of `hidden`. A reservation is a direct `<item>` of
/// `<reservationSet>`; items nest, so depth is counted.
fn without_instances(xml: &str, hidden: &[String]) -> String {
    let (Some(start), Some(end)) = (xml.find("<reservationSet>"), xml.find("</reservationSet>"))
    else {
        return xml.to_owned();
    };
    let body_start = start + "<reservationSet>".len();
    let body = &xml[body_start..end];
    let mut kept = String::new();
    let mut depth = 0usize;
    let mut item_start = None;
    let mut at = 0;
    while at < body.len() {
        let rest = &body[at..];
        if rest.starts_with("<item>") {
            if depth == 0 {
                item_start = Some(at);
            }
            depth += 1;
            at += "<item>".len();
        } else if rest.starts_with("</item>") {
            depth -= 1;
            at += "</item>".len();
            if depth == 0 {
                let item = &body[item_start.take().unwrap_or(0)..at];
                if !instance_ids(item).iter().any(|id| hidden.contains(id)) {
                    kept.push_str(item);
                }
            }
        } else {
            let step = rest.chars().next().map_or(1, char::len_utf8);
            if depth == 0 {
                kept.push_str(&rest[..step]);
            }
            at += step;
        }
    }
    format!("{}{kept}{}", &xml[..body_start], &xml[end..])
}

impl Faults {
    /// Distinct launches (a create and the SDK's retries of it are one).
    fn launches(&self) -> Vec<(String, String, String, bool)> {
        let mut seen = Vec::new();
        for launch in self.launches.lock().unwrap().iter() {
            if !seen
                .iter()
                .any(|l: &(String, String, String, bool)| l.0 == launch.0)
            {
                seen.push(launch.clone());
            }
        }
        seen
    }
}

impl proxy::Faults for Faults {
    fn delay(&self, seen: &Seen) -> std::time::Duration {
        let start = form(seen).get("Action").map(String::as_str) == Some("StartInstances");
        let extra = if start {
            self.start_calls.fetch_add(1, Ordering::SeqCst);
            *self.start_delay.lock().unwrap()
        } else {
            std::time::Duration::ZERO
        };
        *self.delay.lock().unwrap() + extra
    }

    /// Refuses the launches the test names, and the starts while
    /// `refuse_starts`, with EC2's own error response (HTTP 500,
    /// `InsufficientInstanceCapacity`).
    fn before(&self, seen: &Seen) -> Before {
        let form = form(seen);
        if form.get("Action").map(String::as_str) == Some("ModifyInstanceAttribute")
            && form.get("Attribute").map(String::as_str) == Some("userData")
        {
            let throttled = self.throttle_user_data.load(Ordering::SeqCst);
            let id = form.get("InstanceId").cloned().unwrap_or_default();
            self.user_data_writes.lock().unwrap().push((id, throttled));
            return if throttled {
                ec2_error(
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    "RequestLimitExceeded",
                    "Request limit exceeded.",
                )
            } else {
                Before::Forward
            };
        }
        if form.get("Action").map(String::as_str) == Some("StartInstances") {
            let refused = self.refuse_starts.load(Ordering::SeqCst);
            let id = form.get("InstanceId.1").cloned().unwrap_or_default();
            self.starts.lock().unwrap().push((id, refused));
            return if refused {
                insufficient_capacity("us-east-1")
            } else {
                Before::Forward
            };
        }
        if form.get("Action").map(String::as_str) != Some("RunInstances") {
            return Before::Forward;
        }
        let market = form
            .get("InstanceMarketOptions.MarketType")
            .cloned()
            .unwrap_or_else(|| "on-demand".into());
        let zone = form
            .get("Placement.AvailabilityZone")
            .cloned()
            .unwrap_or_default();
        let refused = (market == "spot" && self.spot.load(Ordering::SeqCst))
            || self.zone.lock().unwrap().as_deref() == Some(zone.as_str());
        let token = form.get("ClientToken").cloned().unwrap_or_default();
        self.launches
            .lock()
            .unwrap()
            .push((token, market, zone.clone(), refused));
        if !refused {
            return Before::Forward;
        }
        insufficient_capacity(&zone)
    }

    /// Notes when each instance was launched, and leaves it out of
    /// DescribeInstances for `hide_for` after.
    fn after(&self, seen: &Seen, mut answer: Answer) -> After {
        let action = form(seen).get("Action").cloned().unwrap_or_default();
        let text = String::from_utf8_lossy(&answer.body).into_owned();
        if action == "RunInstances" && answer.status.is_success() {
            let mut born = self.launched_at.lock().unwrap();
            for id in instance_ids(&text) {
                born.entry(id).or_insert_with(std::time::Instant::now);
            }
        }
        let hide_for = *self.hide_for.lock().unwrap();
        if action == "DescribeInstances" && !hide_for.is_zero() {
            let hidden: Vec<String> = self
                .launched_at
                .lock()
                .unwrap()
                .iter()
                .filter(|(_, at)| at.elapsed() < hide_for)
                .map(|(id, _)| id.clone())
                .collect();
            answer.body = without_instances(&text, &hidden).into();
        }
        After::Pass(answer)
    }
}

/// EC2's own answer when it has no capacity (HTTP 500,
/// `InsufficientInstanceCapacity`).
fn insufficient_capacity(zone: &str) -> Before {
    ec2_error(
        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
        "InsufficientInstanceCapacity",
        &format!(
            "We currently do not have sufficient capacity in the Availability Zone you requested ({zone})."
        ),
    )
}

/// An error answer in the shape of EC2's Query API.
fn ec2_error(status: axum::http::StatusCode, code: &str, message: &str) -> Before {
    let xml = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error>\
             <Code>{code}</Code><Message>{message}</Message></Error></Errors>\
             <RequestID>00000000-0000-0000-0000-000000000000</RequestID></Response>"
    );
    Before::Answer((status, [("content-type", "text/xml")], xml).into_response())
}

/// The form fields of an EC2 Query API call.
fn form(seen: &Seen) -> BTreeMap<String, String> {
    url::form_urlencoded::parse(&seen.body)
        .into_owned()
        .collect()
}

/// A loopback HTTP proxy in front of moto with [`Faults`].
struct Proxy {
    url: String,
    faults: Arc<Faults>,
    _proxy: FaultProxy,
}

fn proxy(moto: &str) -> Proxy {
    let faults = Arc::new(Faults::default());
    let proxy = FaultProxy::start(moto, faults.clone());
    Proxy {
        url: proxy.url.clone(),
        faults,
        _proxy: proxy,
    }
}

/// A VPC with one subnet per zone and a security group, made in moto as an
/// operator would have them.
struct Network {
    subnets: BTreeMap<String, String>,
    security_group: String,
}

fn network(ec2: &aws_sdk_ec2::Client, runtime: &tokio::runtime::Runtime) -> Network {
    runtime.block_on(async {
        let vpc = ec2
            .create_vpc()
            .cidr_block("10.40.0.0/16")
            .send()
            .await
            .expect("a VPC");
        let vpc = vpc.vpc().and_then(|v| v.vpc_id()).unwrap().to_owned();
        let mut subnets = BTreeMap::new();
        for (zone, cidr) in [
            ("us-east-1a", "10.40.1.0/24"),
            ("us-east-1b", "10.40.2.0/24"),
        ] {
            let subnet = ec2
                .create_subnet()
                .vpc_id(&vpc)
                .cidr_block(cidr)
                .availability_zone(zone)
                .send()
                .await
                .expect("a subnet");
            let id = subnet.subnet().and_then(|s| s.subnet_id()).unwrap();
            subnets.insert(zone.to_owned(), id.to_owned());
        }
        let group = ec2
            .create_security_group()
            .group_name("ci-runners")
            .description("runners")
            .vpc_id(&vpc)
            .send()
            .await
            .expect("a security group");
        Network {
            subnets,
            security_group: group.group_id().unwrap().to_owned(),
        }
    })
}

fn serve(dir: &Path, endpoint: &str, provider: &str, worker_config: &Value) -> (Process, String) {
    serve_with_quota(dir, endpoint, provider, 6, worker_config)
}

fn serve_with_quota(
    dir: &Path,
    endpoint: &str,
    provider: &str,
    max_instances: u32,
    worker_config: &Value,
) -> (Process, String) {
    serve_pool(
        (dir, "127.0.0.1:0"),
        endpoint,
        (provider, max_instances),
        "max_runners = 6\n",
        worker_config,
    )
}

/// `runway serve` in `dir` on `listen`, with provider `aws`
/// (`max_instances`, and the keys `provider` adds) and pool `linux` (with
/// the keys `pool` adds).
fn serve_pool(
    (dir, listen): (&Path, &str),
    endpoint: &str,
    (provider, max_instances): (&str, u32),
    pool: &str,
    worker_config: &Value,
) -> (Process, String) {
    std::fs::write(dir.join("worker-config.json"), worker_config.to_string()).unwrap();
    common::write_config(
        dir,
        listen,
        ADMIN,
        "300ms",
        &format!(
            r#"[providers.aws]
kind = "ec2"
region = "us-east-1"
endpoint_url = "{endpoint}"
max_instances = {max_instances}
boot_seconds = 60
{provider}

[[pools]]
name = "linux"
labels = ["linux"]
min_idle = 0
{pool}boot_timeout = "10m"
providers = ["aws"]

[[worker_configs]]
file = "worker-config.json"
"#
        ),
    );
    let mut command = common::runway(dir);
    command
        .args(["serve", "--config", "runway.toml"])
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_REGION");
    common::spawn_serve(command)
}

/// The instances runway launched for pool `linux`, oldest first.
fn launched(ec2: &aws_sdk_ec2::Client, runtime: &tokio::runtime::Runtime) -> Vec<Instance> {
    runtime.block_on(async {
        let described = ec2
            .describe_instances()
            .filters(
                Filter::builder()
                    .name("tag:runway:pool")
                    .values("linux")
                    .build(),
            )
            .send()
            .await
            .expect("describe");
        let mut instances: Vec<Instance> = described
            .reservations()
            .iter()
            .flat_map(|r| r.instances().iter().cloned())
            .collect();
        instances.sort_by_key(|i| i.launch_time().map(|t| t.as_nanos()));
        instances
    })
}

fn tag(instance: &Instance, key: &str) -> String {
    instance
        .tags()
        .iter()
        .find(|t| t.key() == Some(key))
        .and_then(|t| t.value())
        .unwrap_or_default()
        .to_owned()
}

fn state(instance: &Instance) -> String {
    instance
        .state()
        .and_then(|s| s.name())
        .map(|n| n.as_str().to_owned())
        .unwrap_or_default()
}

fn is_spot(instance: &Instance) -> bool {
    instance
        .instance_lifecycle()
        .is_some_and(|l| l.as_str() == "spot")
}

fn live(instances: &[Instance]) -> Vec<&Instance> {
    instances
        .iter()
        .filter(|i| matches!(state(i).as_str(), "pending" | "running"))
        .collect()
}

fn submit(base: &str) -> i64 {
    common::submit(base, ADMIN, "true")
}

/// Starts an instance in moto the way someone else would, with `tags`.
fn outside_instance(
    ec2: &aws_sdk_ec2::Client,
    runtime: &tokio::runtime::Runtime,
    tags: &[(&str, &str)],
) -> String {
    runtime.block_on(async {
        let mut run = ec2
            .run_instances()
            .image_id("ami-12c6146b")
            .min_count(1)
            .max_count(1);
        if !tags.is_empty() {
            run = run.tag_specifications(
                TagSpecification::builder()
                    .resource_type(ResourceType::Instance)
                    .set_tags(Some(
                        tags.iter()
                            .map(|(k, v)| Tag::builder().key(*k).value(*v).build())
                            .collect(),
                    ))
                    .build(),
            );
        }
        let started = run.send().await.expect("an outside instance");
        started.instances()[0].instance_id().unwrap().to_owned()
    })
}

fn instance_state(
    ec2: &aws_sdk_ec2::Client,
    runtime: &tokio::runtime::Runtime,
    id: &str,
) -> String {
    runtime.block_on(async {
        let described = ec2
            .describe_instances()
            .instance_ids(id)
            .send()
            .await
            .expect("describe");
        described
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .map(state)
            .next()
            .unwrap_or_default()
    })
}

/// Instance `id`'s attribute `name` (user data or the shutdown
/// behaviour), as DescribeInstanceAttribute answers it.
fn attribute(
    ec2: &aws_sdk_ec2::Client,
    runtime: &tokio::runtime::Runtime,
    id: &str,
    name: aws_sdk_ec2::types::InstanceAttributeName,
) -> String {
    use aws_sdk_ec2::types::InstanceAttributeName;
    runtime.block_on(async {
        let answer = ec2
            .describe_instance_attribute()
            .instance_id(id)
            .attribute(name.clone())
            .send()
            .await
            .expect("an instance attribute");
        let value = match name {
            InstanceAttributeName::UserData => answer.user_data().and_then(|u| u.value()),
            _ => answer
                .instance_initiated_shutdown_behavior()
                .and_then(|v| v.value()),
        };
        value.unwrap_or_default().to_owned()
    })
}

/// Instance `id`'s user data, decoded.
fn user_data(ec2: &aws_sdk_ec2::Client, runtime: &tokio::runtime::Runtime, id: &str) -> String {
    let encoded = attribute(
        ec2,
        runtime,
        id,
        aws_sdk_ec2::types::InstanceAttributeName::UserData,
    );
    String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .expect("base64 user data"),
    )
    .expect("text")
}

fn get_json(base: &str, path: &str) -> Value {
    common::api_get(base, ADMIN, path)
}

/// The RFC's rules, as an operator would write them: the AMI for us-*,
/// a subnet per zone, and the rest of the launch settings.
fn worker_config(network: &Network) -> Value {
    json!({"id": "linux", "pools": ["linux"], "rules": [
        {"rule_id": "ec2-ami", "description": "AMI", "conditions": [{"provider": "aws", "region": "us-*"}],
         "values": {"ec2": {
             "ImageId": "ami-12c6146b",
             "SecurityGroupIds": [network.security_group],
             "KeyName": "ops",
             "BlockDeviceMappings": [{"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": 50, "VolumeType": "gp3"}}],
             "Tags": {"team": "build"}}}},
        {"rule_id": "us-east-1a subnets", "description": "zone a", "conditions": [{"availabilityZone": "us-east-1a"}],
         "values": {"ec2": {"SubnetID": network.subnets["us-east-1a"]}}},
        {"rule_id": "us-east-1b subnets", "description": "zone b", "conditions": [{"availabilityZone": "us-east-1b"}],
         "values": {"ec2": {"SubnetId": network.subnets["us-east-1b"]}}}
    ]})
}

/// Waits until `offer` no longer backs off, as job `job`'s explanation
/// shows it.
fn wait_until_backoff_ends(base: &str, job: i64, offer: &str) {
    wait_until(&format!("the backoff of {offer} to end"), 30, || {
        common::job(base, ADMIN, job)["waiting"]["details"]["offers"]
            .as_array()
            .and_then(|offers| offers.iter().find(|o| o["offer"] == offer).cloned())
            .is_some_and(|o| o["backoff"].is_null())
    });
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// moto behind the fault proxy, with a network, a runtime and a client
/// for the test's own calls, and a directory for runway.
pub(super) struct Cloud {
    moto: moto::Moto,
    runtime: tokio::runtime::Runtime,
    ec2: aws_sdk_ec2::Client,
    network: Network,
    proxy: Proxy,
    dir: tempfile::TempDir,
}

impl Cloud {
    /// `None` where moto cannot run (outside CI).
    pub(super) fn start() -> Option<Cloud> {
        let moto = moto::start()?;
        let runtime = runtime();
        let ec2 = runtime.block_on(moto::client(&moto.url));
        let network = network(&ec2, &runtime);
        let proxy = proxy(&moto.url);
        Some(Cloud {
            moto,
            runtime,
            ec2,
            network,
            proxy,
            dir: tempfile::tempdir().unwrap(),
        })
    }
}

/// Launches carry the worker configuration's values for their zone, the
/// runner's tags and its bootstrap in the user data; a zone that has no
/// capacity passes the launch to the next zone; runway sees only its own
/// instances, deletes an orphan of its own, and replaces a runner whose
/// instance AWS terminated.
#[test]
fn launches_carry_the_worker_configuration_and_runway_sees_only_its_own_instances() {
    let Some(cloud) = Cloud::start() else {
        return;
    };
    let Cloud {
        runtime,
        ec2,
        network,
        proxy,
        dir,
        ..
    } = &cloud;
    let foreign = outside_instance(ec2, runtime, &[("runway:controller", "another-runway")]);
    let untagged = outside_instance(ec2, runtime, &[]);
    *proxy.faults.zone.lock().unwrap() = Some("us-east-1a".into());
    let (_runway, base) = serve(
        dir.path(),
        &proxy.url,
        "instance_types = [\"m5.large\"]\nzones = [\"us-east-1a\", \"us-east-1b\"]\npurchase_options = [\"on-demand\"]\non_demand_prices = { \"m5.large\" = 0.096 }",
        &worker_config(network),
    );

    // Zone a has no capacity: the launch goes to zone b, with b's subnet.
    let first = submit(&base);
    wait_until("a launch in us-east-1b", 30, || {
        live(&launched(ec2, runtime)).len() == 1
    });
    let instances = launched(ec2, runtime);
    let instance = &instances[0];
    let zone = instance
        .placement()
        .and_then(|p| p.availability_zone())
        .unwrap_or_default();
    assert_eq!(zone, "us-east-1b");
    assert_eq!(
        instance.subnet_id(),
        Some(network.subnets["us-east-1b"].as_str())
    );
    let refused: Vec<_> = proxy
        .faults
        .launches()
        .into_iter()
        .filter(|l| l.3)
        .collect();
    assert!(
        refused.iter().all(|l| l.2 == "us-east-1a") && !refused.is_empty(),
        "{refused:?}"
    );

    // The worker configuration's values, the offer's type, runway's tags.
    assert_eq!(instance.image_id(), Some("ami-12c6146b"));
    assert_eq!(
        instance.instance_type().map(|t| t.as_str()),
        Some("m5.large")
    );
    assert_eq!(instance.key_name(), Some("ops"));
    assert!(!is_spot(instance), "on-demand only");
    let groups: Vec<&str> = instance
        .security_groups()
        .iter()
        .filter_map(|g| g.group_id())
        .collect();
    assert_eq!(groups, [network.security_group.as_str()]);
    let name = tag(instance, "runway:runner");
    assert!(name.starts_with("linux-"), "{name}");
    assert_eq!(tag(instance, "Name"), name);
    assert_eq!(tag(instance, "runway:pool"), "linux");
    assert_eq!(
        tag(instance, "runway:offer"),
        "m5.large/us-east-1b/on-demand"
    );
    assert_eq!(tag(instance, "team"), "build");
    let controller = tag(instance, "runway:controller");
    assert_eq!(
        controller.len(),
        36,
        "this installation's UUID: {controller}"
    );
    let volumes: Vec<&str> = instance
        .block_device_mappings()
        .iter()
        .filter_map(|b| b.device_name())
        .collect();
    assert!(volumes.contains(&"/dev/xvda"), "{volumes:?}");

    // The user data boots the runner with its bootstrap, and powers off.
    let script = user_data(ec2, runtime, instance.instance_id().unwrap());
    assert!(script.starts_with("#!/bin/sh\n"), "{script}");
    assert!(
        script.contains(&format!("export RUNWAY_RUNNER_NAME='{name}'\n")),
        "{script}"
    );
    assert!(
        script.contains(&format!("export RUNWAY_URL='{base}'\n")),
        "{script}"
    );
    assert!(
        script.contains("export RUNWAY_REGISTRATION_TOKEN='rwr_"),
        "{script}"
    );
    assert!(
        script.ends_with("runway agent --once\nshutdown -h now\n"),
        "{script}"
    );
    assert!(
        !script.contains("AWS_") && !script.contains("testing"),
        "runway's own credentials never reach a runner: {script}"
    );

    // Zone a recovers, zone b runs out: once a's backoff is over, the next
    // runner goes to a (b, learnt more reliable, is tried first), with a's
    // subnet.
    *proxy.faults.zone.lock().unwrap() = Some("us-east-1b".into());
    wait_until_backoff_ends(&base, first, "m5.large/us-east-1a/on-demand");
    let second = submit(&base);
    wait_until("a launch in us-east-1a", 30, || {
        live(&launched(ec2, runtime)).len() == 2
    });
    let instances = launched(ec2, runtime);
    let in_a = instances
        .iter()
        .find(|i| tag(i, "runway:offer") == "m5.large/us-east-1a/on-demand")
        .expect("zone a again");
    assert_eq!(
        in_a.subnet_id(),
        Some(network.subnets["us-east-1a"].as_str())
    );

    // Instances with this installation's tag and no runner record: one of
    // this provider's (its `runway:provider` tag) is unaccounted for and
    // deleted only past its in-flight window (`list_lag` + `boot_timeout`,
    // ten minutes here: the deletion itself is tested in the server's
    // reconciler and fencing tests); one without a provider tag may be
    // another provider's and is never deleted as an orphan. Both are
    // counted. Another installation's, and an untagged one, are never
    // touched nor counted.
    let orphan = outside_instance(
        ec2,
        runtime,
        &[
            ("runway:controller", &controller),
            ("runway:provider", "aws"),
            ("runway:runner", "linux-orphan"),
        ],
    );
    let unproven = outside_instance(
        ec2,
        runtime,
        &[
            ("runway:controller", &controller),
            ("runway:runner", "linux-before-provider-tags"),
        ],
    );
    wait_until("both counted as unaccounted for", 30, || {
        common::metric(&base, r#"runway_instances_unaccounted{provider="aws"}"#) == 2.0
    });
    assert_eq!(instance_state(ec2, runtime, &orphan), "running");
    assert_eq!(instance_state(ec2, runtime, &unproven), "running");
    assert_eq!(instance_state(ec2, runtime, &foreign), "running");
    assert_eq!(instance_state(ec2, runtime, &untagged), "running");
    let runners = get_json(&base, "/api/v1/runners");
    let names: Vec<&str> = runners
        .as_array()
        .or_else(|| runners["runners"].as_array())
        .expect("runners")
        .iter()
        .filter(|r| {
            !matches!(
                r["state"].as_str(),
                Some("failed" | "terminated" | "crashed")
            )
        })
        .filter_map(|r| r["name"].as_str())
        .collect();
    let mut tagged: Vec<String> = live(&launched(ec2, runtime))
        .iter()
        .map(|i| tag(i, "runway:runner"))
        .collect();
    tagged.sort();
    let mut names: Vec<String> = names.into_iter().map(str::to_owned).collect();
    names.sort();
    assert_eq!(
        names, tagged,
        "runway's runners are its own instances, no others"
    );

    // AWS terminates a runner's instance: the runner is lost and its job
    // gets another.
    let victim = instances[0].instance_id().unwrap().to_owned();
    runtime.block_on(async {
        ec2.terminate_instances()
            .instance_ids(&victim)
            .send()
            .await
            .expect("terminate")
    });
    wait_until("a replacement launched", 30, || {
        live(&launched(ec2, runtime)).len() == 2 && launched(ec2, runtime).len() == 3
    });
    for job in [first, second] {
        assert_eq!(common::job(&base, ADMIN, job)["state"], "queued");
    }
}

/// Bidding: spot while it is cheaper, on-demand in the very next round
/// when spot launches fail, and spot again once they work, with price and
/// reliability per offer in the metrics and in "why is my job waiting?".
#[test]
fn spot_first_on_demand_when_spot_fails_and_back_to_spot() {
    let Some(cloud) = Cloud::start() else {
        return;
    };
    let Cloud {
        runtime,
        ec2,
        network,
        proxy,
        dir,
        ..
    } = &cloud;
    let (_runway, base) = serve(
        dir.path(),
        &proxy.url,
        "instance_types = [\"m5.large\"]\nzones = [\"us-east-1a\"]\non_demand_prices = { \"m5.large\" = 0.096 }",
        &worker_config(network),
    );
    let spot = "m5.large/us-east-1a/spot";
    let on_demand = "m5.large/us-east-1a/on-demand";

    // Spot is cheaper (moto's spot price): once runway has read it, the
    // first runner is spot. (Before the first read there is no spot offer.)
    let price = |offer: &str| {
        common::metric(
            &base,
            &format!("runway_offer_price_per_hour{{provider=\"aws\",offer=\"{offer}\"}}"),
        )
    };
    wait_until("the spot price read", 30, || price(spot) > 0.0);
    let first = submit(&base);
    wait_until("a spot launch", 30, || {
        live(&launched(ec2, runtime)).len() == 1
    });
    let instances = launched(ec2, runtime);
    assert!(is_spot(&instances[0]), "{:?}", instances[0]);
    assert_eq!(tag(&instances[0], "runway:offer"), spot);
    assert!(
        price(spot) < price(on_demand),
        "{} {}",
        price(spot),
        price(on_demand)
    );
    assert_eq!(price(on_demand), 0.096);
    let explained = common::job(&base, ADMIN, first);
    let offers = explained["waiting"]["details"]["offers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(offers.len(), 2, "{explained}");
    assert_eq!(offers[0]["offer"], spot, "cheapest first: {explained}");
    assert_eq!(offers[0]["chosen"], true);
    assert_eq!(offers[1]["offer"], on_demand);
    // The same, as `runway jobs --explain` prints it.
    let printed = common::runway(dir.path())
        .args(["jobs", "--explain", "--url", &base, "--token", ADMIN])
        .output()
        .expect("runway jobs");
    let printed = String::from_utf8_lossy(&printed.stdout);
    assert!(
        printed.contains(&format!(
            "offers=aws/{spot} $0.0000/h r=1.00 chosen > aws/{on_demand} $0.0960/h r=1.00"
        )),
        "{printed}"
    );

    // Spot has no capacity: one refused spot launch, then on-demand.
    proxy.faults.spot.store(true, Ordering::SeqCst);
    let before = proxy.faults.launches().len();
    let second = submit(&base);
    wait_until("an on-demand launch", 30, || {
        live(&launched(ec2, runtime)).len() == 2
    });
    let instances = launched(ec2, runtime);
    assert!(!is_spot(&instances[1]));
    assert_eq!(tag(&instances[1], "runway:offer"), on_demand);
    let since: Vec<_> = proxy.faults.launches()[before..].to_vec();
    assert_eq!(
        since
            .iter()
            .map(|l| (l.1.as_str(), l.3))
            .collect::<Vec<_>>(),
        [("spot", true), ("on-demand", false)],
        "one failed spot launch, then on-demand in the next round: {since:?}"
    );
    let failed = common::metric(
        &base,
        &format!(
            "runway_offer_creates_total{{provider=\"aws\",offer=\"{spot}\",result=\"failed\"}}"
        ),
    );
    assert_eq!(failed, 1.0);
    let reliability = common::metric(
        &base,
        &format!("runway_offer_reliability{{provider=\"aws\",offer=\"{spot}\"}}"),
    );
    assert!(reliability < 1.0, "{reliability}");
    let explained = common::job(&base, ADMIN, second);
    let offers = explained["waiting"]["details"]["offers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let spot_offer = offers
        .iter()
        .find(|o| o["offer"] == spot)
        .expect("the spot offer");
    assert!(
        spot_offer["reliability"].as_f64().is_some_and(|r| r < 1.0),
        "the failed launch is learnt: {explained}"
    );
    if spot_offer["backoff"].is_object() {
        assert!(
            spot_offer["backoff"]["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("InsufficientInstanceCapacity")),
            "{explained}"
        );
        assert_eq!(spot_offer["chosen"], false);
    }

    // Spot recovers: once its backoff is over, spot again.
    proxy.faults.spot.store(false, Ordering::SeqCst);
    wait_until_backoff_ends(&base, second, spot);
    let _third = submit(&base);
    wait_until("spot again", 30, || {
        live(&launched(ec2, runtime)).len() == 3
    });
    let instances = launched(ec2, runtime);
    assert!(is_spot(&instances[2]), "{:?}", instances[2]);
    assert_eq!(tag(&instances[2], "runway:offer"), spot);
}

#[test]
fn the_proxy_hides_exactly_the_reservations_of_hidden_instances() {
    let xml = "<DescribeInstancesResponse><requestId>r</requestId><reservationSet>\
        <item><reservationId>r-1</reservationId><instancesSet><item><instanceId>i-1</instanceId>\
        <tagSet><item><key>a</key></item></tagSet></item></instancesSet></item>\
        <item><reservationId>r-2</reservationId><instancesSet><item><instanceId>i-2</instanceId>\
        </item></instancesSet></item></reservationSet></DescribeInstancesResponse>";
    let kept = without_instances(xml, &["i-1".to_owned()]);
    assert_eq!(instance_ids(&kept), ["i-2"]);
    assert!(kept.ends_with("</reservationSet></DescribeInstancesResponse>"));
    assert_eq!(without_instances(xml, &[]), xml);
}

/// What runway's runners of pool `linux` are, by state.
fn runner_states(base: &str) -> BTreeMap<String, usize> {
    let mut states = BTreeMap::new();
    for runner in get_json(base, "/api/v1/runners?pool=linux")["runners"]
        .as_array()
        .cloned()
        .unwrap_or_default()
    {
        *states
            .entry(runner["state"].as_str().unwrap_or_default().to_owned())
            .or_default() += 1;
    }
    states
}

/// EC2's eventual consistency: with each new instance missing from
/// `DescribeInstances` for 1, 2 and 5 s (a proxy in front of moto hides
/// it), 3 jobs on a quota of 3 get 3 launches, never more than 3 live
/// instances, and no runner failed for the lag. Then the slow-calls case:
/// every call 0.3 s late and twice as many jobs as quota — no runner
/// failed, no launch counted failed (the quota is capacity), 3 launches.
#[test]
fn a_lagging_describe_and_slow_calls_launch_once_per_job_within_the_quota() {
    for (hide_secs, delay_ms, jobs) in [(1, 0, 3), (2, 0, 3), (5, 0, 3), (0, 300, 6)] {
        let Some(cloud) = Cloud::start() else {
            return;
        };
        let Cloud {
            runtime,
            ec2,
            network,
            proxy,
            dir,
            ..
        } = &cloud;
        *proxy.faults.hide_for.lock().unwrap() = std::time::Duration::from_secs(hide_secs);
        *proxy.faults.delay.lock().unwrap() = std::time::Duration::from_millis(delay_ms);
        let (_runway, base) = serve_with_quota(
            dir.path(),
            &proxy.url,
            "instance_types = [\"m5.large\"]\nzones = [\"us-east-1a\", \"us-east-1b\"]\npurchase_options = [\"on-demand\"]\non_demand_prices = { \"m5.large\" = 0.096 }",
            3,
            &worker_config(network),
        );
        for _ in 0..jobs {
            submit(&base);
        }
        let case = format!("hidden {hide_secs}s, calls {delay_ms}ms late, {jobs} jobs");
        wait_until(&format!("three launches ({case})"), 60, || {
            proxy.faults.launches().len() >= 3
        });
        // Watch for twice the hiding time and a few rounds more: what
        // breaks under lag shows in that window.
        let watch = std::time::Instant::now() + std::time::Duration::from_secs(2 * hide_secs + 4);
        while std::time::Instant::now() < watch {
            std::thread::sleep(std::time::Duration::from_millis(100));
            let live_now = live(&launched(ec2, runtime)).len();
            assert!(
                live_now <= 3,
                "{case}: {live_now} instances live against a quota of 3"
            );
            let states = runner_states(&base);
            assert_eq!(
                states.get("failed"),
                None,
                "{case}: runners failed: {states:?}"
            );
        }
        assert_eq!(
            proxy.faults.launches().len(),
            3,
            "{case}: launches {:?}",
            proxy.faults.launches()
        );
        let failed_creates = common::metric(
            &base,
            r#"runway_offer_creates_total{provider="aws",offer="m5.large/us-east-1a/on-demand",result="failed"}"#,
        ) + common::metric(
            &base,
            r#"runway_offer_creates_total{provider="aws",offer="m5.large/us-east-1b/on-demand",result="failed"}"#,
        );
        assert_eq!(failed_creates, 0.0, "{case}: a create counted failed");
    }
}
