//! Reading a configuration: the file or the built-in defaults, command-line
//! overrides, secrets resolved from where they live, and the errors that
//! point at the line that is wrong.

use super::*;

impl Config {
    /// Every secret of this configuration, with the key that writes it.
    fn secrets_mut(&mut self) -> Vec<(String, &mut Secret)> {
        fn numbered<'a>(
            key: &str,
            secrets: &'a mut [Secret],
        ) -> impl Iterator<Item = (String, &'a mut Secret)> {
            let key = key.to_owned();
            secrets
                .iter_mut()
                .enumerate()
                .map(move |(i, secret)| (format!("{key}[{i}]"), secret))
        }
        let server = &mut self.server;
        let github = &mut self.github;
        let mut all = vec![("[server] database".to_owned(), &mut server.database)];
        all.extend(numbered("[server] admin_tokens", &mut server.admin_tokens));
        all.extend(numbered("[server] read_tokens", &mut server.read_tokens));
        all.extend(
            server
                .tokens
                .iter_mut()
                .enumerate()
                .map(|(i, t)| (format!("[server] tokens[{i}].token"), &mut t.token)),
        );
        all.extend(numbered(
            "[github] webhook_secrets",
            &mut github.webhook_secrets,
        ));
        all.extend(
            github
                .token
                .as_mut()
                .map(|t| ("[github] token".to_owned(), t)),
        );
        all.extend(
            github
                .private_key
                .as_mut()
                .map(|k| ("[github] private_key".to_owned(), k)),
        );
        all
    }

    /// The environment variables the secrets of this configuration were
    /// read from (`env:NAME`). `runway serve` removes them from its own
    /// environment once loaded, so nothing it starts can inherit them.
    pub fn secret_environment_variables(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .clone()
            .secrets_mut()
            .into_iter()
            .filter_map(|(_, secret)| secret.environment_variable().map(str::to_owned))
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

impl Config {
    /// Reads `path`, or returns the built-in defaults when `path` is `None`;
    /// then applies `overrides` and validates the result.
    pub fn load(path: Option<&Path>, overrides: &Overrides) -> Result<Config, ConfigError> {
        let (mut config, origin) = match path {
            None => (Config::out_of_the_box(), "(built-in defaults)".to_owned()),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
                    path: path.display().to_string(),
                    reason: e.to_string(),
                })?;
                let origin = path.display().to_string();
                (Config::parse(&text, &origin, path.parent())?, origin)
            }
        };
        if let Some(listen) = overrides.listen {
            config.server.listen = listen;
        }
        if let Some(database) = &overrides.database {
            let invalid = |message| ConfigError::Invalid {
                origin: "--database".to_owned(),
                location: "value".to_owned(),
                message,
            };
            config.server.database = Secret::parse(database, None).map_err(invalid)?;
            check_database_url(config.server.database.expose()).map_err(invalid)?;
        }
        config
            .validate()
            .map_err(|(location, message)| ConfigError::Invalid {
                origin,
                location,
                message,
            })?;
        Ok(config)
    }

    /// Parses TOML text. `origin` names it in errors; `base` is where
    /// relative paths and `file:` secrets are looked up (the config file's
    /// directory).
    pub fn parse(text: &str, origin: &str, base: Option<&Path>) -> Result<Config, ConfigError> {
        let mut config: Config = toml::from_str(text).map_err(|e| {
            let message = one_line(e.message());
            // A provider's error names its table itself (TOML's span is
            // the whole `providers` value).
            let (location, message) = match message.split_once(": ") {
                Some((key, rest)) if providers::names_a_provider(key) => {
                    (key.to_owned(), rest.to_owned())
                }
                _ => (describe_location(text, e.span()), message),
            };
            ConfigError::Invalid {
                origin: origin.to_owned(),
                location,
                message,
            }
        })?;
        config
            .resolve(base)
            .map_err(|(location, message)| ConfigError::Invalid {
                origin: origin.to_owned(),
                location,
                message,
            })?;
        Ok(config)
    }

    /// What reading the file leaves to do: read `env:`/`file:` secrets,
    /// make relative paths relative to `base`, fill the defaults that
    /// depend on other keys, read worker configurations, and refuse what a
    /// key cannot say on its own terms.
    pub(super) fn resolve(&mut self, base: Option<&Path>) -> Result<(), (String, String)> {
        for (key, secret) in self.secrets_mut() {
            secret.load(base).map_err(|message| (key, message))?;
        }
        let relative = |path: &mut PathBuf| {
            if let Some(dir) = base.filter(|_| path.is_relative()) {
                *path = dir.join(&*path);
            }
        };
        for provider in &mut self.providers {
            match &mut provider.kind {
                ProviderKind::Process {
                    state_dir: Some(dir),
                    ..
                } => relative(dir),
                ProviderKind::Exec {
                    executable,
                    config_file,
                    ..
                } => {
                    if !executable.as_os_str().is_empty() {
                        relative(executable);
                    }
                    config_file.iter_mut().for_each(relative);
                }
                _ => {}
            }
        }
        match &self.telemetry.event_log {
            Some(path) if path.trim().is_empty() => {
                return Err((
                    "[telemetry] event_log".to_owned(),
                    "is empty; give a file path or \"-\" for standard output".to_owned(),
                ))
            }
            Some(path) if path != "-" && Path::new(path).is_relative() => {
                let mut path = PathBuf::from(path);
                relative(&mut path);
                self.telemetry.event_log = Some(path.display().to_string());
            }
            _ => {}
        }
        if self.telemetry.event_log_max_bytes < 1024 {
            return Err((
                "[telemetry] event_log_max_bytes".to_owned(),
                format!("{} is below 1024", self.telemetry.event_log_max_bytes),
            ));
        }
        self.worker_configs = self
            .worker_config_sources
            .iter()
            .enumerate()
            .map(|(i, source)| {
                worker_config_from_toml(source, base)
                    .map_err(|m| (format!("worker_configs[{i}]"), m))
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.github.check_auth()?;
        if self.github.run_facts_wait.is_zero() {
            return Err((
                "[github] run_facts_wait".to_owned(),
                "must be more than zero: a held job is given up after this long".to_owned(),
            ));
        }
        // An App's own webhook is the one to heal.
        if self.github.deliveries.is_none()
            && matches!(self.github.auth(), Some(GithubAuth::App { .. }))
        {
            self.github.deliveries = Some(Hook::App);
        }
        let url = |key: &str, url: &mut String| {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                return Err((
                    key.to_owned(),
                    format!("{url:?} is not an http:// or https:// URL"),
                ));
            }
            *url = url.trim_end_matches('/').to_owned();
            Ok(())
        };
        url("[github] api_url", &mut self.github.api_url)?;
        if let Some(public_url) = &mut self.server.public_url {
            url("[server] public_url", public_url)?;
        }
        for (key, kept) in [
            ("[retention] finished_jobs", self.retention.finished_jobs),
            ("[retention] deliveries", self.retention.deliveries),
        ] {
            if !kept.is_zero() && kept < MIN_DEDUPE_RETENTION {
                return Err((
                    key.to_owned(),
                    "must be 0 (keep forever) or at least 4 days: GitHub redelivers a webhook for 3 days, and these rows are what make a redelivery a duplicate".to_owned(),
                ));
            }
        }
        if self.retention.interval.is_zero() {
            return Err((
                "[retention] interval".to_owned(),
                "must be more than 0".to_owned(),
            ));
        }
        if self.retention.batch == 0 {
            return Err((
                "[retention] batch".to_owned(),
                "must be at least 1".to_owned(),
            ));
        }
        if let Some(unknown) = self
            .metrics
            .job_labels
            .iter()
            .find(|l| !JOB_LABELS.contains(&l.as_str()))
        {
            return Err((
                "[metrics] job_labels".to_owned(),
                format!("{unknown:?} is not one of {}", JOB_LABELS.join(", ")),
            ));
        }
        for (i, pool) in self.pools.iter_mut().enumerate() {
            if let Some(quantile) = pool.forecast_quantile {
                if !(quantile > 0.0 && quantile <= 1.0) {
                    return Err((
                        format!("pools[{i}].forecast_quantile"),
                        format!("{quantile} is not above 0 and at most 1"),
                    ));
                }
            }
            if !(pool.wait_value.is_finite() && pool.wait_value > 0.0) {
                return Err((
                    format!("pools[{i}].wait_value"),
                    format!(
                        "{} is not a positive number (minutes of a runner a minute of waiting is worth)",
                        pool.wait_value
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// `listen`: an address and port, `127.0.0.1:8080` or `[::1]:8080`.
pub(super) fn check_database_url(url: &str) -> Result<(), String> {
    if url.trim().is_empty() {
        return Err("must not be empty".into());
    }
    match url.split_once("://") {
        Some(("postgres" | "postgresql" | "sqlite", _)) => Ok(()),
        Some((scheme, _)) => Err(format!(
            "unsupported database URL scheme {scheme:?}; use sqlite://PATH or postgres://USER@HOST/DB"
        )),
        // `sqlite:PATH`, `sqlite::memory:` or a plain file path.
        None => Ok(()),
    }
}

/// One `[[worker_configs]]` entry: `{ file = "build.json" }` (JSON, which
/// can say `null`), or the configuration written inline in TOML.
pub(super) fn worker_config_from_toml(
    source: &toml::Value,
    base: Option<&Path>,
) -> Result<WorkerConfig, String> {
    if let Some(file) = source.get("file").and_then(toml::Value::as_str) {
        if source.as_table().map_or(0, |t| t.len()) != 1 {
            return Err("an entry with `file` takes no other keys".into());
        }
        let path = match base {
            Some(base) if Path::new(file).is_relative() => base.join(file),
            _ => PathBuf::from(file),
        };
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        return crate::config::worker_config::parse(&text, &path.display().to_string());
    }
    let json = serde_json::to_value(source).map_err(|e| e.to_string())?;
    let dto: WorkerConfigDto =
        serde_json::from_value(json).map_err(|e| one_line(&e.to_string()))?;
    let id = dto.id.clone().unwrap_or_default();
    Ok(dto.into_core(&id))
}

pub(super) fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// "`[table] key` (line L, column C)" for the start of `span` in `text`.
pub(super) fn describe_location(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    let Some(span) = span else {
        return "(unknown position)".to_owned();
    };
    let before = &text[..span.start.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    let line_text = text.lines().nth(line - 1).unwrap_or("");
    let table = text
        .lines()
        .take(line)
        .filter_map(|l| {
            let l = l.trim();
            l.starts_with('[')
                .then(|| l.split('#').next().unwrap_or(l).trim().to_owned())
        })
        .last();
    let key = line_text
        .split_once('=')
        .map(|(key, _)| key.trim().to_owned())
        .filter(|key| !key.is_empty() && !key.starts_with('['));
    let name = match (table, key) {
        (Some(table), Some(key)) => format!("{table} {key} "),
        (None, Some(key)) => format!("{key} "),
        (Some(table), None) => format!("{table} "),
        (None, None) => String::new(),
    };
    format!("{name}(line {line}, column {column})")
}
