//! What an instance is launched with: the launch settings a pool's worker
//! configuration may set (image, type, disks, metadata options, user data) and
//! their checks.

use super::*;

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

pub(super) fn opt_str(value: Option<&Value>, key: &str) -> Result<Option<String>, String> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{key} must be a string")),
    }
}

pub(super) fn opt_int(value: Option<&Value>, key: &str) -> Result<Option<i32>, String> {
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

pub(super) fn opt_bool(value: Option<&Value>, key: &str) -> Result<Option<bool>, String> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(format!("{key} must be true or false")),
    }
}

pub(super) fn block_device(index: usize, device: &Value) -> Result<BlockDevice, String> {
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
pub(super) fn shell_quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

/// The user data of a stock runner's machine (issue 60), for its every
/// boot: EC2 runs user data once per instance, so a cloud-config part asks
/// cloud-init to run the script part at every boot, the one a start
/// writes included. Its first boot exports a bootstrap without any
/// credential, runs `prepare` (warming caches, say) and powers off, which
/// stops the machine (created with `InstanceInitiatedShutdownBehavior=stop`).
/// A start writes the job's script ([`user_data`], with the credential)
/// and switches the shutdown behaviour back to terminate.
pub fn every_boot(script: &str) -> String {
    const BOUNDARY: &str = "==runway-boot==";
    format!(
        "Content-Type: multipart/mixed; boundary=\"{BOUNDARY}\"\nMIME-Version: 1.0\n\n\
         --{BOUNDARY}\nContent-Type: text/cloud-config; charset=\"us-ascii\"\nMIME-Version: 1.0\n\
         Content-Disposition: attachment; filename=\"cloud-config.txt\"\n\n\
         #cloud-config\ncloud_final_modules:\n- [scripts-user, always]\n\n\
         --{BOUNDARY}\nContent-Type: text/x-shellscript; charset=\"us-ascii\"\nMIME-Version: 1.0\n\
         Content-Disposition: attachment; filename=\"userdata.txt\"\n\n\
         {script}\n--{BOUNDARY}--\n"
    )
}
