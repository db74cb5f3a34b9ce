//! OTLP trace export. The exporter's tonic channel lives on a dedicated tokio
//! runtime on its own thread: a channel built on the actor thread would deadlock a
//! flush there, and one built outside any runtime panics. Spans are batched by the
//! SDK's background thread; export failures are dropped there and never reach the
//! service. The standard OTEL_* variables are honoured (service name, sampler,
//! OTEL_SDK_DISABLED, exporter timeout and headers).

use std::time::Duration;

use opentelemetry::global;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{SpanExporter, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tokio::runtime::Runtime;

use crate::runtime_thread::{self, Workers};

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot start the trace export runtime: {0}")]
    Runtime(#[from] std::io::Error),
    #[error("cannot build the OTLP exporter for {endpoint}: {reason}")]
    Exporter { endpoint: String, reason: String },
}

/// A running trace export. Keep it alive; [`TraceExport::shutdown`] flushes.
pub struct TraceExport {
    provider: SdkTracerProvider,
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// True when OTEL_SDK_DISABLED asks for no telemetry.
pub fn sdk_disabled() -> bool {
    std::env::var("OTEL_SDK_DISABLED").is_ok_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// Who is exporting: the resource attributes of every span (OpenTelemetry semantic
/// conventions), so a cluster-wide backend can tell the nodes' plegds apart.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// `k8s.node.name`.
    pub node_name: String,
    /// `host.name`.
    pub host_name: String,
    /// `service.version`.
    pub service_version: String,
}

impl TraceExport {
    /// Starts exporting spans of the global tracer to `endpoint` (OTLP/gRPC).
    pub fn start(endpoint: &str, identity: &Identity) -> Result<TraceExport, TraceError> {
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let ep = endpoint.to_string();
        let (exporter, thread) = runtime_thread::spawn::<_, TraceError, _>(
            "otlp-export",
            Workers::One("otlp-io"),
            move |rt: &Runtime| {
                let exporter = {
                    let _guard = rt.enter();
                    SpanExporter::builder()
                        .with_tonic()
                        .with_endpoint(ep.clone())
                        .with_timeout(Duration::from_secs(3))
                        .build()
                }
                .map_err(|e| TraceError::Exporter {
                    endpoint: ep,
                    reason: e.to_string(),
                })?;
                // Keep the runtime (and the channel's worker) alive until shutdown.
                Ok((exporter, move |rt: Runtime| {
                    let _ = stop_rx.recv();
                    rt.shutdown_timeout(Duration::from_millis(200));
                }))
            },
        )?;
        let mut resource = Resource::builder().with_attributes([
            KeyValue::new("service.version", identity.service_version.clone()),
            KeyValue::new("host.name", identity.host_name.clone()),
            KeyValue::new("k8s.node.name", identity.node_name.clone()),
        ]);
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name("plegd");
        }
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build();
        global::set_tracer_provider(provider.clone());
        Ok(TraceExport {
            provider,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// Exports what is buffered now (blocking, bounded by the exporter timeout).
    pub fn flush(&self) {
        if let Err(e) = self.provider.force_flush() {
            tracing::debug!(error = %e, "trace flush failed");
        }
    }

    /// Flushes within `timeout` and stops the export thread.
    pub fn shutdown(mut self, timeout: Duration) {
        if let Err(e) = self.provider.shutdown_with_timeout(timeout) {
            tracing::debug!(error = %e, "trace shutdown incomplete");
        }
        self.stop_thread();
    }

    fn stop_thread(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for TraceExport {
    fn drop(&mut self) {
        self.stop_thread();
    }
}
