//! Runs the service against a runtime until a signal (or the caller's `until`):
//! start-up checks, wiring of outputs and endpoints, and the graceful shutdown.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::path::{Path, PathBuf};

use plegd_actors::{Health, HintSourceName, Pleg};
use plegd_api::{ApiConfig, ApiServer, BoundSocket, SocketError, DEFAULT_MAX_CONNECTIONS};
use plegd_otlp_events::{EventLogConfig, EventLogExport};
use plegd_runtime::{CriRuntime, RuntimeClient, RuntimeError, RuntimeVersion};
use plegd_telemetry::http::{HealthSource, MetricsServer};
use plegd_telemetry::traces::{sdk_disabled, TraceExport};
use plegd_telemetry::Metrics;

use crate::exit::{ConfigError, ExitError};
use crate::output::{open_append, spawn_writer, Format, Target};
use crate::service_config::ServiceConfig;
use crate::signals::{Asked, Signals};
use crate::values::ApiSocket;

/// Queue of the output subscriber: large, so a slow terminal rarely drops events
/// (and when it does, the next line says how many).
const OUTPUT_QUEUE: usize = 65_536;
/// How long shutdown waits for the output to drain what is queued.
const OUTPUT_DRAIN: Duration = Duration::from_millis(250);
/// How long shutdown waits for the API server to end its streams and connections.
const API_GRACE: Duration = Duration::from_millis(300);
/// Queue of the OTLP event export's subscription: its thread only converts and hands
/// records on, so this absorbs bursts, not a slow collector (its own queue does).
const OTLP_EVENTS_QUEUE: usize = 16_384;
/// How long shutdown waits for the OTLP event export: its drain (300 ms) and the
/// stop of its runtime (100 ms), with a margin.
const OTLP_EVENTS_DRAIN: Duration = Duration::from_millis(500);
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
    let api_socket = api_socket_path(config, || PathBuf::from(plegd_api::DEFAULT_SOCKET));
    serve(
        Arc::new(runtime),
        &config.for_runtime(&version),
        signals,
        Format::Json,
        api_socket,
        std::future::pending(),
    )
    .await
}

/// Where to serve the subscriber API: `--api-socket`, or the command's default; None
/// when it is off.
pub fn api_socket_path(
    config: &ServiceConfig,
    default: impl FnOnce() -> PathBuf,
) -> Option<PathBuf> {
    match &config.api_socket {
        None => Some(default()),
        Some(ApiSocket::Off) => None,
        Some(ApiSocket::Path(p)) => Some(p.clone()),
    }
}

/// Where to serve the control socket (Sync, RequestRelist): `--api-control-socket`,
/// or beside the API socket; None when it is off (by default, when the API socket is).
pub fn control_socket_path(config: &ServiceConfig, api_socket: Option<&Path>) -> Option<PathBuf> {
    match &config.api_control_socket {
        None => api_socket.map(plegd_api::control_socket_beside),
        Some(ApiSocket::Off) => None,
        Some(ApiSocket::Path(p)) => Some(p.clone()),
    }
}

/// Binds the control socket with its own mode and group.
fn bind_control(path: &Path, config: &ServiceConfig) -> Result<BoundSocket, ExitError> {
    let group = config.api_control_socket_group.as_deref();
    plegd_api::bind_with_mode(path, group, config.api_control_socket_mode.0)
        .map_err(control_socket_error)
}

/// The control socket's errors as [`socket_error`] has them, naming its own flags
/// (the socket module names --api-socket's).
pub fn control_socket_error(e: SocketError) -> ExitError {
    let own_flags = |text: String| text.replace("--api-socket", "--api-control-socket");
    match socket_error(e) {
        ExitError::Config(c) => {
            ExitError::from(ConfigError::ApiControlSocket(own_flags(c.to_string())))
        }
        ExitError::Runtime(e) => {
            ExitError::Runtime(anyhow::anyhow!("{}", own_flags(format!("{e:#}"))))
        }
    }
}

/// Binds the API socket (before anything starts, so that a second plegd fails fast).
fn bind_api(path: &Path, config: &ServiceConfig) -> Result<BoundSocket, ExitError> {
    plegd_api::bind(path, config.api_socket_group.as_deref()).map_err(socket_error)
}

/// A bad --api-socket-group or too long a path is a configuration error (exit 2); the
/// rest, exit 1.
pub fn socket_error(e: SocketError) -> ExitError {
    match e {
        SocketError::UnknownGroup { group } => {
            ExitError::from(ConfigError::ApiSocketGroup { group })
        }
        SocketError::GroupOutOfRange { group } => {
            ExitError::from(ConfigError::ApiSocketGroupId { group })
        }
        SocketError::PathTooLong { path, len } => {
            ExitError::from(ConfigError::ApiSocketPath { path, len })
        }
        e => ExitError::Runtime(anyhow::Error::new(e)),
    }
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
    api_socket: Option<PathBuf>,
    until: impl Future<Output = ()>,
) -> Result<(), ExitError> {
    let api_bound = api_socket
        .as_deref()
        .map(|p| bind_api(p, config))
        .transpose()?;
    let control_bound = match &api_bound {
        Some(_) => control_socket_path(config, api_socket.as_deref())
            .map(|p| bind_control(&p, config))
            .transpose()?,
        None => None,
    };
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
    let pleg = Pleg::start(runtime.clone(), &config.pleg, metrics.clone());
    let sub = pleg
        .subscribe("output", OUTPUT_QUEUE)
        .await
        .map_err(ExitError::runtime("event publisher did not start"))?;
    let event_logs = match &config.otlp_events {
        Some(ep) if !sdk_disabled() => {
            let sub = pleg
                .subscribe("otlp-events", OTLP_EVENTS_QUEUE)
                .await
                .map_err(ExitError::runtime("event publisher did not start"))?;
            let runtime_name = match runtime.version().await {
                Ok(v) => Some(v.runtime_name),
                Err(e) => {
                    tracing::warn!(error = %e, "runtime name unknown: container.runtime.name left out");
                    None
                }
            };
            let cfg = EventLogConfig::new(ep, config.identity.clone(), runtime_name);
            let export = EventLogExport::start(sub, cfg, metrics.clone())
                .map_err(|e| ConfigError::OtlpEvents(Box::new(e)))?;
            tracing::info!(endpoint = %ep, "exporting lifecycle events as OTLP log records");
            Some(export)
        }
        Some(_) => {
            tracing::info!("OTEL_SDK_DISABLED: lifecycle events are not exported over OTLP");
            None
        }
        None => None,
    };
    let (output_failed_tx, output_failed) = tokio::sync::oneshot::channel();
    let writer = spawn_writer(sub, target, format, output_failed_tx)
        .map_err(ExitError::runtime("cannot start the output thread"))?;

    let api = match api_bound {
        Some(bound) => {
            let path = bound.path().display().to_string();
            let api_config = ApiConfig {
                node_name: config.identity.node_name.clone(),
                watch_queue: config.watch_queue,
                max_connections: DEFAULT_MAX_CONNECTIONS,
            };
            let control = control_bound
                .as_ref()
                .map(|c| c.path().display().to_string());
            let server =
                ApiServer::start_with_control(pleg.clone(), bound, control_bound, api_config)
                    .map_err(ExitError::runtime("cannot start the API server"))?;
            tracing::info!(socket = %path, "serving the subscriber API (plegd.v1)");
            if let Some(control) = control {
                tracing::info!(socket = %control, "serving Sync and RequestRelist on the API control socket");
            }
            Some(server)
        }
        None => None,
    };

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
    // Every Watch and Sync stream ends (UNAVAILABLE, a held pod released as
    // cancelled), then the socket goes; on its own thread, so the wait is short.
    if let Some(api) = api {
        if !api.stop(API_GRACE) {
            tracing::warn!("the API server did not stop in time; exiting anyway");
        }
    }
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
    // The event export drains its queue for its own drain time once the publisher has
    // closed, alongside the output.
    if let Some(export) = event_logs {
        let deadline = Instant::now() + OTLP_EVENTS_DRAIN;
        while !export.is_finished() && Instant::now() < deadline {
            actix_rt::time::sleep(Duration::from_millis(2)).await;
        }
        if export.is_finished() {
            export.join();
        } else {
            tracing::warn!("the OTLP event export did not stop in time; exiting without it");
        }
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
