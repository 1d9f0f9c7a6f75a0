//! `[server]`: where runway listens, its store, its tokens and the URL its
//! runners reach it at.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::config::{Secret, TokenConfig, DEFAULT_DATABASE};

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    #[serde(with = "listen_address")]
    pub listen: SocketAddr,
    pub database: Secret,
    /// PostgreSQL connection pool size.
    pub database_max_connections: u32,
    /// Bearer tokens for the admin API (read and write).
    pub admin_tokens: Vec<Secret>,
    /// Bearer tokens that may only read the admin API.
    pub read_tokens: Vec<Secret>,
    /// Named tokens with a role and the pools they cover.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<TokenConfig>,
    /// The URL runners reach this server at (`RUNWAY_URL` of the runners
    /// runway starts). Default: `http://` and the listening address, with
    /// an unspecified address (0.0.0.0, ::) as loopback.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub public_url: Option<String>,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            database: Secret::literal(DEFAULT_DATABASE),
            database_max_connections: 16,
            admin_tokens: Vec::new(),
            read_tokens: Vec::new(),
            tokens: Vec::new(),
            public_url: None,
        }
    }
}

impl ServerConfig {
    /// Where runners reach this server, given the address it listens on.
    pub fn runner_url(&self, bound: SocketAddr) -> String {
        if let Some(url) = &self.public_url {
            return url.clone();
        }
        let mut address = bound;
        if address.ip().is_unspecified() {
            address.set_ip(if address.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
        }
        format!("http://{address}")
    }
}

mod listen_address {
    use std::net::SocketAddr;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(
        address: &SocketAddr,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_str(address)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<SocketAddr, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(|_| {
            serde::de::Error::custom(format!(
                "{text:?} is not an address like 127.0.0.1:8080 or [::1]:8080"
            ))
        })
    }
}
