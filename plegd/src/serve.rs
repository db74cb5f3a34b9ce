//! Runs the service against a runtime until a signal (or the caller's `until`):
//! start-up checks, wiring of outputs and endpoints, and the graceful shutdown.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use plegd_actors::{Health, HintSourceName, Pleg};
use plegd_runtime::{CriRuntime, RuntimeClient, RuntimeError, RuntimeVersion};
use plegd_telemetry::http::{HealthSource, MetricsServer};
use plegd_telemetry::traces::{sdk_disabled, TraceExport};
use plegd_telemetry::Metrics;

use crate::exit::{ConfigError, ExitError};
use crate::output::{open_append, spawn_writer, Format, Target};
use crate::service_config::ServiceConfig;
use crate::signals::{Asked, Signals};

/// Queue of the output subscriber: large, so a slow terminal rarely drops events
/// (and when it does, the next line says how many).
const OUTPUT_QUEUE: usize = 65_536;
/// How long shutdown waits for the output to drain what is queued.
const OUTPUT_DRAIN: Duration = Duration::from_millis(250);
/// How long shutdown waits for the relist in progress beyond one request timeout
/// (its last call may have just started; what follows the call is quick).
const SHUTDOWN_MARGIN: Duration = Duration::from_millis(700);

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
pub async fn run_real(
    endpoint: &str,
    config: &ServiceConfig,
    signals: &mut Signals,
) -> Result<(), ExitError> {
    let (runtime, version) = connect(endpoint, config).await?;
    serve(
        Arc::new(runtime),
        &config.for_runtime(&version),
        signals,
        Format::Json,
        std::future::pending(),
    )
    .await
}

/// A client of the CRI runtime at `endpoint` that passed the start-up check (the
/// socket exists and a CRI v1 server answers Version).
pub async fn connect(
    endpoint: &str,
    config: &ServiceConfig,
) -> Result<(CriRuntime, RuntimeVersion), ExitError> {
    let start_error = |e: RuntimeError| match e {
        RuntimeError::BadEndpoint { .. } => ExitError::from(ConfigError::RuntimeEndpoint(e)),
        other => ExitError::runtime("the runtime did not pass the start-up check")(other),
    };
    let runtime = CriRuntime::new(endpoint, config.runtime_request_timeout)
        .map_err(start_error)?
        .with_max_message_size(config.runtime_max_message_size);
    let version = runtime.check().await.map_err(start_error)?;
    log_runtime(&version, &config.for_runtime(&version).pleg.hint_sources);
    Ok((runtime, version))
}

/// What plegd found and what it does on this runtime.
fn log_runtime(v: &RuntimeVersion, sources: &[HintSourceName]) {
    let names: Vec<_> = sources.iter().map(|s| s.as_str()).collect();
    let hint_sources = if names.is_empty() {
        "none (polling only)".to_string()
    } else {
        names.join(",")
    };
    tracing::info!(
        runtime = %v.runtime_name,
        version = %v.runtime_version,
        api = %v.runtime_api_version,
        %hint_sources,
        "connected to CRI runtime"
    );
    let cri_events = sources.contains(&HintSourceName::CriEvents);
    if v.runtime_name != "containerd" {
        return;
    }
    if v.runtime_version.starts_with("1.7") && cri_events {
        tracing::warn!(
            "containerd 1.7 splits CRI events between concurrent GetContainerEvents \
             streams: plegd must be their only subscriber on this node (other consumers \
             should subscribe to plegd), or run with --hint-sources=containerd-events, \
             whose events containerd gives every subscriber"
        );
    } else if v.runtime_version.starts_with("1.") && !cri_events {
        tracing::info!("containerd 1.x: plegd opens no CRI event stream");
    } else if !v.runtime_version.starts_with("1.") {
        tracing::info!(
            "containerd 2.x gives every CRI event subscriber every event: other \
             consumers may subscribe beside plegd"
        );
    }
}

/// Runs plegd over `runtime` until SIGTERM/SIGINT or `until` resolves.
pub async fn serve(
    runtime: Arc<dyn RuntimeClient>,
    config: &ServiceConfig,
    signals: &mut Signals,
    default_format: Format,
    until: impl Future<Output = ()>,
) -> Result<(), ExitError> {
    let metrics = Arc::new(Metrics::new());
    let reopen = Arc::new(AtomicBool::new(false));
    let (target, format) = match &config.events_json {
        None => (Target::Stdout, default_format),
        Some(p) if p.as_os_str() == "-" => (Target::Stdout, Format::Json),
        Some(p) => {
            // Opened here too, so that a bad path is a configuration error at start.
            open_append(p).map_err(|error| ConfigError::EventsJson {
                path: p.clone(),
                error,
            })?;
            let target = Target::File {
                path: p.clone(),
                reopen: reopen.clone(),
            };
            (target, Format::Json)
        }
    };
    let reopens = matches!(target, Target::File { .. });
    let traces = match &config.otlp_endpoint {
        Some(ep) if !sdk_disabled() => {
            let export =
                TraceExport::start(ep, &config.identity).map_err(ConfigError::OtlpEndpoint)?;
            tracing::info!(endpoint = %ep, "exporting traces over OTLP");
            Some(export)
        }
        _ => None,
    };
    let pleg = Pleg::start(runtime, &config.pleg, metrics.clone());
    let sub = pleg
        .subscribe("output", OUTPUT_QUEUE)
        .await
        .map_err(ExitError::runtime("event publisher did not start"))?;
    let (output_failed_tx, output_failed) = tokio::sync::oneshot::channel();
    let writer = spawn_writer(sub, target, format, output_failed_tx)
        .map_err(ExitError::runtime("cannot start the output thread"))?;

    let (http_stop, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let mut http_task = None;
    if let Some(addr) = config.metrics_addr {
        let server = MetricsServer::bind(
            addr,
            metrics.clone(),
            Arc::new(HealthAdapter(pleg.health().clone())),
        )
        .await
        .map_err(|error| ConfigError::MetricsAddr { addr, error })?;
        tracing::info!(addr = %addr, "serving /metrics, /healthz and /readyz");
        http_task = Some(actix_rt::spawn(server.serve(async {
            let _ = http_stopped.await;
        })));
    }

    // Only a failure sends; a writer that ended otherwise drops the sender.
    let output_failed = async move {
        if output_failed.await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::pin!(until, output_failed);
    let reason = loop {
        tokio::select! {
            asked = signals.next() => match asked {
                Asked::Stop(s) => break s,
                Asked::Reopen if reopens => {
                    reopen.store(true, Ordering::SeqCst);
                    tracing::info!("SIGHUP: the events file is reopened at the next event");
                }
                Asked::Reopen => tracing::info!("SIGHUP: events go to stdout; nothing to reopen"),
            },
            _ = &mut until => break "end of run",
            _ = &mut output_failed => break "the event output failed",
        }
    };
    tracing::info!(reason, "shutting down");
    // The endpoint stops now, alongside the relist: it drops its connections within
    // its grace (0.5 s, less than SHUTDOWN_MARGIN), so no client holds up the exit.
    let _ = http_stop.send(());
    // A relist in progress is finished, its events published, if its remaining calls
    // end within one request timeout: the common case of one slow call.
    let deadline = Instant::now() + config.runtime_request_timeout + SHUTDOWN_MARGIN;
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
    if let Some(t) = traces {
        t.shutdown(Duration::from_millis(300));
    }
    // A reader that stopped reading our stdout must not hold plegd up forever.
    let drain_deadline = Instant::now() + OUTPUT_DRAIN;
    while !writer.is_finished() && Instant::now() < drain_deadline {
        actix_rt::time::sleep(Duration::from_millis(2)).await;
    }
    // Told to stop at the signal, the endpoint is done by now or within what is left
    // of its grace (its wait overlaps the relist's and the output's).
    if let Some(t) = http_task {
        let _ = t.await;
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
        // A closed pipe too: whoever read the events is gone, later ones are lost.
        Ok(Err(e)) => Err(ExitError::runtime("writing events")(e)),
        Err(_) => Err(ExitError::Runtime(anyhow::anyhow!(
            "the output thread panicked"
        ))),
    }
}
