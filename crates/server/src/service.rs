//! The service root: configuration and store, passed explicitly to every
//! part of the server. Durable facts live in the store; nothing here is
//! state that a restart would lose.

use std::future::Future;
use std::sync::Arc;

use runway_store::{OpenOptions, Store, StoreError};
use tokio::net::TcpListener;

use crate::config::Config;
use crate::http;

pub struct Service {
    pub config: Config,
    pub store: Arc<dyn Store>,
}

impl Service {
    /// Opens the configured store (applying migrations) and builds the root.
    pub async fn open(config: Config) -> Result<Service, StoreError> {
        let options = OpenOptions {
            max_connections: config.server.database_max_connections,
            ..OpenOptions::default()
        };
        let store = runway_store::open(config.server.database.expose(), &options).await?;
        Ok(Service { config, store })
    }
}

/// Serves HTTP on `listener` until `shutdown` completes, then finishes the
/// requests in flight and returns.
pub async fn serve(
    service: Arc<Service>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let router = http::router(service).layer(tower_http::trace::TraceLayer::new_for_http());
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}
