//! [`Secret`]: a configuration value that may be secret, written in the
//! file as itself, `env:NAME` or `file:PATH`, read once at load, and never
//! printed: its `Debug`, `Display` and `Serialize` show only where it came
//! from.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize};

/// Where a value came from: written in the file, or read from the
/// environment or a file at load time.
#[derive(Clone, PartialEq, Eq)]
pub enum SecretSource {
    Literal,
    Env(String),
    File(PathBuf),
}

/// A configuration value that may be secret. Its `Debug`, `Display` and
/// `Serialize` never show the value.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    source: SecretSource,
    value: String,
}

/// `env:` secrets read before they were removed from the environment
/// (`remember_environment`), so a config reload finds them again.
static REMEMBERED: std::sync::OnceLock<
    std::sync::Mutex<std::collections::BTreeMap<String, String>>,
> = std::sync::OnceLock::new();

/// Keeps the values of these environment variables in this process's
/// memory (and nowhere else), for `runway serve` to scrub them from its
/// environment — children never see them — and still reload its config.
pub fn remember_environment(names: &[String]) {
    let map = REMEMBERED.get_or_init(Default::default);
    if let Ok(mut map) = map.lock() {
        for name in names {
            if let Ok(value) = std::env::var(name) {
                map.insert(name.clone(), value);
            }
        }
    }
}

fn remembered(name: &str) -> Option<String> {
    REMEMBERED.get()?.lock().ok()?.get(name).cloned()
}

impl Secret {
    pub fn literal(value: &str) -> Secret {
        Secret {
            source: SecretSource::Literal,
            value: value.to_owned(),
        }
    }

    /// What the file wrote, not yet read: `env:NAME` and `file:PATH` are
    /// read by [`Secret::load`].
    pub fn written(text: &str) -> Secret {
        let source = if let Some(name) = text.strip_prefix("env:") {
            SecretSource::Env(name.to_owned())
        } else if let Some(path) = text.strip_prefix("file:") {
            SecretSource::File(PathBuf::from(path))
        } else {
            return Secret::literal(text);
        };
        Secret {
            source,
            value: String::new(),
        }
    }

    /// Reads an `env:` or `file:` secret (a relative path is relative to
    /// `base`; one trailing newline is dropped). A literal is already read.
    pub fn load(&mut self, base: Option<&Path>) -> Result<(), String> {
        match &self.source {
            SecretSource::Literal => Ok(()),
            SecretSource::Env(name) => {
                self.value = std::env::var(name)
                    .ok()
                    .or_else(|| remembered(name))
                    .ok_or_else(|| format!("environment variable {name} is not set"))?;
                Ok(())
            }
            SecretSource::File(path) => {
                let path = match base {
                    Some(base) if path.is_relative() => base.join(path),
                    _ => path.clone(),
                };
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                let value = text.strip_suffix('\n').unwrap_or(&text);
                self.value = value.strip_suffix('\r').unwrap_or(value).to_owned();
                self.source = SecretSource::File(path);
                Ok(())
            }
        }
    }

    /// `env:NAME` reads the environment variable, `file:PATH` the file
    /// (relative to `base`); anything else is the value itself.
    pub fn parse(written: &str, base: Option<&Path>) -> Result<Secret, String> {
        let mut secret = Secret::written(written);
        secret.load(base)?;
        Ok(secret)
    }

    /// The environment variable it was read from (`env:NAME`), if any.
    pub fn environment_variable(&self) -> Option<&str> {
        match &self.source {
            SecretSource::Env(name) => Some(name),
            _ => None,
        }
    }

    /// Where the value comes from, safe to show: `env:NAME`, `file:NAME`
    /// (the file's name, not its directory), or `None` for a literal.
    pub fn origin(&self) -> Option<String> {
        match &self.source {
            SecretSource::Literal => None,
            SecretSource::Env(name) => Some(format!("env:{name}")),
            SecretSource::File(path) => Some(format!(
                "file:{}",
                path.file_name()
                    .map(|name| name.to_string_lossy().into_owned())
                    .unwrap_or_default()
            )),
        }
    }

    /// The value itself. Only for handing to the code that needs it.
    pub fn expose(&self) -> &str {
        &self.value
    }

    /// Safe to print: `env:NAME`, `file:PATH`, or for a value written in the
    /// file, `***` (a URL keeps everything but its password).
    pub fn redacted(&self) -> String {
        match &self.source {
            SecretSource::Env(name) => format!("env:{name}"),
            SecretSource::File(path) => format!("file:{}", path.display()),
            // A URL keeps everything but its password; anything else is all secret.
            SecretSource::Literal if self.value.contains("://") => {
                runway_store::redact_url(&self.value)
            }
            SecretSource::Literal => "***".to_owned(),
        }
    }
}

/// A secret serialises as its [`Secret::redacted`] form: whatever carries
/// one (an API answer, a dump of the configuration, the event log) can
/// never write its value.
impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.redacted())
    }
}

/// Read as [`Secret::written`]: `Config::parse` loads it afterwards, where
/// the config file's directory is known.
impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Secret, D::Error> {
        let text = String::deserialize(deserializer)?;
        Ok(Secret::written(&text))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({})", self.redacted())
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}
