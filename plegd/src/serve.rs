//! Runs the service against a runtime until a signal (or the caller's `until`):
//! start-up checks, wiring of outputs and endpoints, and the graceful shutdown.

use std::future::Future;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _};
use plegd_actors::Health;
use plegd_actors::ReconnectPolicy;
use plegd_actors::{Pleg, PlegConfig};
use plegd_runtime::CriRuntime;
use plegd_runtime::{RuntimeClient, RuntimeError, RuntimeVersion};
use plegd_telemetry::http::{HealthSource, MetricsServer};
use plegd_telemetry::traces::{sdk_disabled, TraceExport};
use plegd_telemetry::Metrics;

use crate::cli::{CommonArgs, MetricsAddr, RunArgs};
use crate::output::{spawn_writer, Format};
use crate::Failure;

/// Queue of the output subscriber: large, so a slow terminal rarely drops events
/// (and when it does, the next line says how many).
const OUTPUT_QUEUE: usize = 65_536;
/// How long shutdown waits for the output to drain what is queued.
const OUTPUT_DRAIN: Duration = Duration::from_millis(250);
/// How long shutdown waits for the relist in progress.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(700);

struct HealthAdapter(Health);

impl HealthSource for HealthAdapter {
    fn live(&self) -> Result<(), String> {
        self.0.check()
    }
    fn ready(&self) -> bool {
        self.0.ready()
    }
}

/// `plegd run`: a real CRI runtime.
pub async fn run_real(args: RunArgs) -> Result<(), Failure> {
    let endpoint = args
        .runtime_endpoint
        .as_deref()
        .ok_or_else(|| Failure::Config(anyhow!("no runtime endpoint")))?;
    let runtime = CriRuntime::new(endpoint, args.common.runtime_request_timeout)
        .map_err(|e| Failure::Config(anyhow!("--runtime-endpoint: {e}")))?;
    let version = runtime.check().await.map_err(|e| {
        Failure::Runtime(anyhow!(e).context("the runtime did not pass the start-up check"))
    })?;
    log_runtime(&version);
    serve(
        Arc::new(runtime),
        &args.common,
        Format::Json,
        std::future::pending(),
    )
    .await
}

pub fn log_runtime(v: &RuntimeVersion) {
    tracing::info!(
        runtime = %v.runtime_name,
        version = %v.runtime_version,
        api = %v.runtime_api_version,
        "connected to CRI runtime"
    );
    if v.runtime_name == "containerd" && v.runtime_version.starts_with("1.7") {
        tracing::warn!(
            "containerd 1.7 splits CRI events between concurrent GetContainerEvents \
             streams: plegd must be their only subscriber on this node; other consumers \
             should subscribe to plegd instead"
        );
    }
}

/// Turns a runtime error at start into the right failure.
pub fn start_error(e: RuntimeError) -> Failure {
    match e {
        RuntimeError::BadEndpoint { .. } => Failure::Config(anyhow!(e)),
        other => Failure::Runtime(anyhow!(other)),
    }
}

async fn wait_for_signal() -> Result<&'static str, Failure> {
    use actix_rt::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())
        .map_err(|e| Failure::Runtime(anyhow!("cannot install the SIGTERM handler: {e}")))?;
    let mut int = signal(SignalKind::interrupt())
        .map_err(|e| Failure::Runtime(anyhow!("cannot install the SIGINT handler: {e}")))?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}

/// Runs plegd over `runtime` until SIGTERM/SIGINT or `until` resolves.
pub async fn serve(
    runtime: Arc<dyn RuntimeClient>,
    common: &CommonArgs,
    default_format: Format,
    until: impl Future<Output = ()>,
) -> Result<(), Failure> {
    let metrics = Arc::new(Metrics::new());
    let (out, format): (Box<dyn Write + Send>, Format) = match &common.events_json {
        None => (Box::new(std::io::stdout()), default_format),
        Some(p) if p.as_os_str() == "-" => (Box::new(std::io::stdout()), Format::Json),
        Some(p) => {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("--events-json {}", p.display()))
                .map_err(Failure::Config)?;
            (Box::new(f), Format::Json)
        }
    };
    let cfg = PlegConfig {
        relist_period: common.relist_period,
        health_threshold: common.health_threshold,
        queue_capacity: common.queue_capacity as usize,
        status_concurrency: common.status_concurrency as usize,
        evented: common.evented,
        reconnect: ReconnectPolicy::new(
            common.reconnect_base,
            common.reconnect_cap,
            common.reconnect_healthy_reset,
        )
        .map_err(|e| Failure::Config(anyhow!("--reconnect-base/--reconnect-cap: {e}")))?,
        gate_idle: Duration::from_secs(5),
    };
    let metrics_server = match common.metrics_addr {
        MetricsAddr::Off => None,
        MetricsAddr::On(addr) => Some((addr, ())),
    };

    let traces = match &common.otlp_endpoint {
        Some(ep) if !sdk_disabled() => {
            let export = TraceExport::start(ep)
                .map_err(|e| Failure::Config(anyhow!("--otlp-endpoint: {e}")))?;
            tracing::info!(endpoint = %ep, "exporting traces over OTLP");
            Some(export)
        }
        _ => None,
    };
    let pleg = Pleg::start(runtime, &cfg, metrics.clone());
    let sub = pleg
        .subscribe("output", OUTPUT_QUEUE)
        .await
        .map_err(|e| Failure::Runtime(anyhow!("event publisher did not start: {e}")))?;
    let writer = spawn_writer(sub, out, format)
        .map_err(|e| Failure::Runtime(anyhow!("cannot start the output thread: {e}")))?;

    let (http_stop, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let mut http_task = None;
    if let Some((addr, ())) = metrics_server {
        let server = MetricsServer::bind(
            addr,
            metrics.clone(),
            Arc::new(HealthAdapter(pleg.health().clone())),
        )
        .await
        .with_context(|| format!("--metrics-addr {addr}"))
        .map_err(Failure::Config)?;
        tracing::info!(addr = %addr, "serving /metrics, /healthz and /readyz");
        http_task = Some(actix_rt::spawn(server.serve(async {
            let _ = http_stopped.await;
        })));
    }

    let reason = tokio::select! {
        s = wait_for_signal() => s?,
        _ = until => "end of run",
    };
    tracing::info!(reason, "shutting down");
    let deadline = Instant::now() + SHUTDOWN_GRACE;
    pleg.stop();
    while !pleg.stopped() && Instant::now() < deadline {
        actix_rt::time::sleep(Duration::from_millis(5)).await;
    }
    if !pleg.stopped() {
        tracing::warn!(
            "the relist in progress did not finish in time; its events are not published"
        );
    }
    // Closing the publisher drops every subscriber's sender: the output thread then
    // drains what is queued and exits.
    pleg.close_publisher().await;
    let _ = http_stop.send(());
    if let Some(t) = http_task {
        let _ = t.await;
    }
    if let Some(t) = traces {
        t.shutdown(Duration::from_millis(300));
    }
    // A reader that stopped reading our stdout must not hold plegd up forever.
    let drain_deadline = Instant::now() + OUTPUT_DRAIN;
    while !writer.is_finished() && Instant::now() < drain_deadline {
        actix_rt::time::sleep(Duration::from_millis(2)).await;
    }
    if !writer.is_finished() {
        tracing::warn!(
            "the event output is blocked (is its reader still reading?); exiting without \
             writing the rest"
        );
        return Ok(());
    }
    match writer.join() {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Ok(Err(e)) => Err(Failure::Runtime(anyhow!("writing events: {e}"))),
        Err(_) => Err(Failure::Runtime(anyhow!("the output thread panicked"))),
    }
}
