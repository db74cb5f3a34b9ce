//! The operator endpoint: Prometheus text on `/metrics`, liveness on `/healthz`
//! (200 while the Generic PLEG is healthy, else 503 with the reason) and readiness on
//! `/readyz` (200 once the first global relist has succeeded).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use crate::Metrics;

/// What the endpoint asks the service: liveness (Err = reason) and readiness.
pub trait HealthSource: Send + Sync + 'static {
    fn live(&self) -> Result<(), String>;
    fn ready(&self) -> bool;
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    health: Arc<dyn HealthSource>,
}

async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.encode(),
    )
}

async fn healthz(State(s): State<AppState>) -> impl IntoResponse {
    match s.health.live() {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")),
    }
}

async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    if s.health.ready() {
        (StatusCode::OK, "ready\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "waiting for the first global relist\n",
        )
    }
}

/// A bound endpoint; `serve` runs it until `shutdown` resolves.
pub struct MetricsServer {
    listener: tokio::net::TcpListener,
    router: Router,
}

impl MetricsServer {
    /// Binds now, so a bad or busy address fails at start with a clear error.
    pub async fn bind(
        addr: SocketAddr,
        metrics: Arc<Metrics>,
        health: Arc<dyn HealthSource>,
    ) -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let router = Router::new()
            .route("/metrics", get(self::metrics))
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .with_state(AppState { metrics, health });
        Ok(MetricsServer { listener, router })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        axum::serve(self.listener, self.router)
            .with_graceful_shutdown(shutdown)
            .await
    }
}
