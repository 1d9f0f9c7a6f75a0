//! The bootstrap document `CreateInstance` reads on standard input: GARM's
//! `BootstrapInstance` with the runner's name, labels, tools and its one-time
//! credential, and the pool's extra specs.

use super::*;

/// Launch-configuration keys that become bootstrap fields, not extra specs.
pub(super) const BOOTSTRAP_KEYS: [&str; 9] = [
    "os_type",
    "arch",
    "flavor",
    "image",
    "ssh_keys",
    "user_data_options",
    "proxy_config",
    "ca_cert_bundle",
    "github_runner_group",
];

/// A pool's GARM extra specs from its launch configuration: its
/// `extra_specs` object when it has one, else the launch configuration
/// without the keys that become bootstrap fields (providers such as
/// garm-provider-lxd refuse extra specs they do not know).
pub fn extra_specs(launch: &Value) -> Value {
    if let Some(specs) = launch.get("extra_specs").filter(|v| v.is_object()) {
        return specs.clone();
    }
    match launch {
        Value::Object(map) => Value::Object(
            map.iter()
                .filter(|(key, _)| !BOOTSTRAP_KEYS.contains(&key.as_str()))
                .map(|(key, value)| (key.clone(), value.clone()))
                .collect(),
        ),
        _ => json!({}),
    }
}

impl ExecProvider {
    /// The bootstrap document `CreateInstance` reads on standard input:
    /// GARM's `BootstrapInstance`, plus `runway_environment`.
    pub fn bootstrap(&self, request: &CreateRequest) -> Value {
        let env = |key: &str| request.bootstrap.get(key).cloned().unwrap_or_default();
        let mut environment = request.bootstrap.clone();
        environment.insert("RUNWAY_RUNNER_NAME".into(), request.name.clone());
        environment.insert("RUNWAY_POOL".into(), request.pool.clone());
        environment.insert("RUNWAY_RUNNER_LABELS".into(), request.labels.join(","));
        let launch = &request.launch_config;
        let text = |key: &str, default: &str| {
            launch
                .get(key)
                .and_then(Value::as_str)
                .unwrap_or(default)
                .to_owned()
        };
        let pool_id = pool_id(&self.config.controller_id, &request.pool);
        let jit = request.bootstrap.contains_key("RUNWAY_JIT_CONFIG");
        let mut labels = request.labels.clone();
        if !jit {
            // As GARM does for a runner without a JIT configuration.
            labels.push(format!(
                "runner-controller-id={}",
                self.config.controller_id
            ));
            labels.push(format!("runner-pool-id={pool_id}"));
        }
        // Go decodes []byte from base64.
        let ca_bundle = launch
            .get("ca_cert_bundle")
            .and_then(Value::as_str)
            .map(|pem| base64::engine::general_purpose::STANDARD.encode(pem));
        let object = |key: &str| launch.get(key).filter(|v| v.is_object()).cloned();
        // The instance API, when runway serves it: as GARM does, the pool's
        // extra specs carry a runner_install_template (base64, as Go
        // encodes bytes) that fetches the install script, unless the
        // launch configuration brings its own.
        let mut extra_specs = extra_specs(launch);
        let (metadata_url, callback_url, instance_token, tools, repo_url) = match &request
            .instance_api
        {
            Some(api) => {
                if let Some(specs) = extra_specs.as_object_mut() {
                    specs.entry("runner_install_template").or_insert_with(|| {
                        Value::String(
                            base64::engine::general_purpose::STANDARD.encode(&api.install_wrapper),
                        )
                    });
                }
                (
                    api.metadata_url.clone(),
                    api.callback_url.clone(),
                    api.token.clone(),
                    api.tools.clone(),
                    api.repo_url.clone(),
                )
            }
            None => (
                env("RUNWAY_URL"),
                env("RUNWAY_URL"),
                env("RUNWAY_REGISTRATION_TOKEN"),
                Vec::new(),
                String::new(),
            ),
        };
        json!({
            "name": request.name,
            "tools": tools,
            "repo_url": repo_url,
            "callback-url": callback_url,
            "metadata-url": metadata_url,
            "instance-token": instance_token,
            "ssh-keys": launch.get("ssh_keys").filter(|v| v.is_array()).cloned().unwrap_or(json!([])),
            "extra_specs": extra_specs,
            "ca-cert-bundle": ca_bundle,
            "github-runner-group": text("github_runner_group", ""),
            "os_type": text("os_type", "linux"),
            "arch": text("arch", "amd64"),
            "flavor": text("flavor", ""),
            "image": text("image", ""),
            "labels": labels,
            "pool_id": pool_id,
            "user_data_options": object("user_data_options").unwrap_or(json!({
                "disable_updates_on_boot": false,
                "extra_packages": [],
                "enable_boot_debug": false,
            })),
            "proxy_config": object("proxy_config").unwrap_or(json!({
                "http_proxy": "",
                "https_proxy": "",
                "no_proxy": "",
            })),
            // GARM's flag for a runner that starts from a JIT configuration
            // (here: runway_environment.RUNWAY_JIT_CONFIG).
            "jit_config_enabled": jit,
            "runway_environment": environment,
        })
    }
}
