//! Runs the service against a runtime until a signal (or the caller's `until`):
//! start-up checks, wiring of outputs and endpoints, and the graceful shutdown.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use std::path::{Path, PathBuf};

use plegd_actors::state::{OpenError, Opened, StateStore};
use plegd_actors::{Health, HintSourceName, Pleg, SubscribeError, Subscription};
use plegd_api::{ApiConfig, ApiServer, BoundSocket, SocketError, DEFAULT_MAX_CONNECTIONS};
use plegd_otlp_events::{EventLogConfig, EventLogExport};
use plegd_runtime::{CriRuntime, RuntimeClient, RuntimeError, RuntimeVersion};
use plegd_telemetry::http::{HealthSource, MetricsServer};
use plegd_telemetry::traces::{sdk_disabled, TraceExport};
use plegd_telemetry::Metrics;

use crate::cursor::Cursor;
use crate::exit::{ConfigError, ExitError};
use crate::output::{open_append, spawn_writer, stdout_is_dev_null, Format, Target};
use crate::service_config::ServiceConfig;
use crate::signals::{Asked, Signals};
use crate::values::{ApiSocket, StateDir};

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

struct HealthAdapter(Health, Option<StateStore>);

impl HealthSource for HealthAdapter {
    fn live(&self) -> Result<(), String> {
        self.0.check()
    }
    fn ready(&self) -> bool {
        self.0.ready()
    }
    fn details(&self) -> Vec<String> {
        vec![match &self.1 {
            None => "state dir: off".to_string(),
            Some(s) if s.failing() => format!(
                "state dir: FAILING, serving from memory ({}); a restart now starts fresh",
                s.error().unwrap_or_default()
            ),
            Some(s) => format!("state dir: stored ({} bytes)", s.size()),
        }]
    }
    fn relist_error(&self) -> Option<String> {
        self.0.last_error()
    }
}

/// `plegd run`: a real CRI runtime.
pub async fn run_real(
    endpoint: &str,
    config: &ServiceConfig,
    signals: &mut Signals,
) -> Result<(), ExitError> {
    // A runtime that does not answer holds the check for a whole request timeout.
    let checked = signals
        .unless_stopped(
            "waiting for the runtime's start-up check",
            connect(endpoint, config),
        )
        .await;
    let Some(connected) = checked else {
        return Ok(());
    };
    let (runtime, version) = connected?;
    let api_socket = api_socket_path(config, || PathBuf::from(plegd_api::DEFAULT_SOCKET));
    let state_dir = state_dir_path(config, || PathBuf::from(DEFAULT_STATE_DIR));
    serve(
        Arc::new(runtime),
        &config.for_runtime(&version),
        signals,
        Format::Json,
        Places {
            api_socket,
            state_dir,
        },
        std::future::pending(),
    )
    .await
}

/// `plegd run`'s state dir unless `--state-dir` says otherwise.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/plegd";

/// Where plegd serves its API and keeps its state (each None when off).
pub struct Places {
    pub api_socket: Option<PathBuf>,
    pub state_dir: Option<PathBuf>,
}

/// Where to keep the state: `--state-dir`, or the command's default; None when off.
pub fn state_dir_path(
    config: &ServiceConfig,
    default: impl FnOnce() -> PathBuf,
) -> Option<PathBuf> {
    StateDir::or_default(config.state_dir.as_ref(), default)
}

/// Opens the state dir, if there is one: another plegd on it stops this one (exit
/// 1); a dir that cannot be used, or state that cannot be gone on from, is said once
/// and plegd starts fresh.
fn open_state(dir: Option<&Path>, config: &ServiceConfig) -> Result<Option<Opened>, ExitError> {
    let Some(dir) = dir else {
        tracing::info!("no state dir (--state-dir off): plegd starts as a new instance; clients resuming from an earlier one re-list");
        return Ok(None);
    };
    let opened = match plegd_actors::state::open(
        dir,
        config.pleg.history_events,
        config.pleg.tombstone_ttl,
    ) {
        Ok(o) => o,
        Err(e @ OpenError::Locked { .. }) => {
            return Err(ExitError::Runtime(anyhow::Error::new(e)));
        }
        Err(e) => {
            tracing::error!(error = %e, "plegd runs without a state dir: it starts as a new instance, and clients re-list after each restart");
            return Ok(None);
        }
    };
    if let Some(why) = &opened.discarded {
        tracing::warn!(dir = %dir.display(), reason = %why, "the stored state is set aside (state.discarded): plegd starts fresh as a new instance; clients re-list");
    }
    match &opened.loaded {
        Some(l) => tracing::info!(
            dir = %dir.display(),
            instance = l.instance_id(),
            revision = l.revision(),
            pods = l.pods(),
            clean_stop = l.clean(),
            "going on from the state dir as the same instance"
        ),
        None if opened.discarded.is_none() => {
            tracing::info!(dir = %dir.display(), "a new state dir: plegd starts as a new instance");
        }
        None => {}
    }
    Ok(Some(opened))
}

/// Where to serve the subscriber API: `--api-socket`, or the command's default; None
/// when it is off.
pub fn api_socket_path(
    config: &ServiceConfig,
    default: impl FnOnce() -> PathBuf,
) -> Option<PathBuf> {
    ApiSocket::or_default(config.api_socket.as_ref(), default)
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
        .with_max_message_size(config.runtime_max_message_size)
        .with_list_streaming(config.runtime_list_streaming);
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
    places: Places,
    until: impl Future<Output = ()>,
) -> Result<(), ExitError> {
    let state = open_state(places.state_dir.as_deref(), config)?;
    // Going on as an earlier instance: an output with no cursor of it wrote nothing
    // known, and replays the whole stored history.
    let resumed = state.as_ref().is_some_and(|o| o.loaded.is_some());
    let sockets = bind_sockets(config, places.api_socket.as_deref())?;
    let metrics = Arc::new(Metrics::new());
    let output = EventOutput::choose(config, default_format)?;
    let traces = start_traces(config)?;
    let pleg = Pleg::start_with_state(runtime.clone(), &config.pleg, metrics.clone(), state);
    let cursor = places
        .state_dir
        .as_deref()
        .filter(|_| pleg.state().is_some())
        .map(|dir| Cursor::new(dir, "output", pleg.instance_id()));
    let sub =
        subscribe_after_cursor(&pleg, "output", OUTPUT_QUEUE, cursor.as_ref(), resumed).await?;
    let state_dir = places
        .state_dir
        .as_deref()
        .filter(|_| pleg.state().is_some());
    let event_logs = start_event_logs(
        config,
        &pleg,
        runtime.as_ref(),
        &metrics,
        state_dir,
        resumed,
    )
    .await?;
    let (output_failed_tx, output_failed) = tokio::sync::oneshot::channel();
    let writer = spawn_writer(
        sub,
        output.target,
        output.format,
        pleg.instance_id().to_string(),
        cursor,
        output_failed_tx,
    )
    .map_err(ExitError::runtime("cannot start the output thread"))?;
    let api = start_api(config, &pleg, sockets)?;
    let http = start_http(config, &metrics, &pleg).await?;

    let reason = wait_for_stop(signals, until, output_failed, output.reopen.as_deref()).await;
    tracing::info!(reason, "shutting down");
    let running = Running {
        pleg,
        api,
        http,
        traces,
        event_logs,
        writer,
    };
    running.shutdown(config.runtime_request_timeout).await
}

/// An output's subscription: after its cursor (a restart on the same state: what it
/// had not written yet, from the stored history), else from now.
async fn subscribe_after_cursor(
    pleg: &Pleg,
    name: &str,
    queue: usize,
    cursor: Option<&Cursor>,
    resumed: bool,
) -> Result<Subscription, ExitError> {
    let closed = || ExitError::Runtime(anyhow::anyhow!("event publisher did not start"));
    let loaded = cursor.map(Cursor::load).transpose().unwrap_or_else(|why| {
        tracing::warn!(output = name, %why, "the output's cursor cannot be read: the output writes the whole stored history again");
        None
    });
    let after = loaded
        .flatten()
        .or((cursor.is_some() && resumed).then_some(0));
    match pleg.subscribe_after(name, queue, after).await {
        Ok(sub) => Ok(sub),
        Err(SubscribeError::TooOld {
            after,
            oldest_available,
        }) => {
            tracing::warn!(
                output = name,
                after,
                oldest_available,
                "the output's cursor is older than the stored history: events between them are not written"
            );
            pleg.subscribe_after(name, queue, Some(oldest_available - 1))
                .await
                .map_err(|_| closed())
        }
        Err(SubscribeError::Future { after, latest }) => {
            tracing::warn!(
                output = name,
                after,
                latest,
                "the output's cursor is ahead of the stored history: the output goes on from now"
            );
            pleg.subscribe_after(name, queue, None)
                .await
                .map_err(|_| closed())
        }
        Err(SubscribeError::Closed) => Err(closed()),
    }
}

/// The API socket and the control socket, bound before anything starts (so that a
/// second plegd fails fast); no control socket without an API socket.
fn bind_sockets(
    config: &ServiceConfig,
    api_socket: Option<&Path>,
) -> Result<Option<(BoundSocket, Option<BoundSocket>)>, ExitError> {
    let Some(api) = api_socket.map(|p| bind_api(p, config)).transpose()? else {
        return Ok(None);
    };
    let control = control_socket_path(config, api_socket)
        .map(|p| bind_control(&p, config))
        .transpose()?;
    Ok(Some((api, control)))
}

/// Where the event lines go and how they are written.
struct EventOutput {
    target: Target,
    format: Format,
    /// Set by SIGHUP to reopen the events file; None when the events go to stdout.
    reopen: Option<Arc<AtomicBool>>,
}

impl EventOutput {
    /// `--events-json`: stdout in the command's format, `-` for stdout in JSON, or a
    /// file in JSON, opened here too so that a bad path is a configuration error at
    /// start.
    fn choose(config: &ServiceConfig, default_format: Format) -> Result<EventOutput, ExitError> {
        let stdout = |format| {
            if stdout_is_dev_null() {
                tracing::warn!(
                    "events go to stdout, which is /dev/null: no event line is kept \
                     (--events-json PATH keeps them; --events-json /dev/null says none \
                     are wanted)"
                );
            }
            EventOutput {
                target: Target::Stdout,
                format,
                reopen: None,
            }
        };
        match &config.events_json {
            None => Ok(stdout(default_format)),
            Some(p) if p.as_os_str() == "-" => Ok(stdout(Format::Json)),
            Some(p) => {
                open_append(p).map_err(|error| ConfigError::EventsJson {
                    path: p.clone(),
                    error,
                })?;
                let reopen = Arc::new(AtomicBool::new(false));
                let target = Target::File {
                    path: p.clone(),
                    reopen: reopen.clone(),
                };
                Ok(EventOutput {
                    target,
                    format: Format::Json,
                    reopen: Some(reopen),
                })
            }
        }
    }
}

/// The OTLP trace export, when `--otlp-endpoint` asks for it.
fn start_traces(config: &ServiceConfig) -> Result<Option<TraceExport>, ExitError> {
    match &config.otlp_endpoint {
        Some(ep) if !sdk_disabled() => {
            let export =
                TraceExport::start(ep, &config.identity).map_err(ConfigError::OtlpEndpoint)?;
            tracing::info!(endpoint = %ep, "exporting traces over OTLP");
            Ok(Some(export))
        }
        _ => Ok(None),
    }
}

/// The OTLP export of lifecycle events, when `--otlp-events` asks for it: a
/// subscriber of its own.
async fn start_event_logs(
    config: &ServiceConfig,
    pleg: &Pleg,
    runtime: &dyn RuntimeClient,
    metrics: &Arc<Metrics>,
    state_dir: Option<&Path>,
    resumed: bool,
) -> Result<Option<EventLogExport>, ExitError> {
    match &config.otlp_events {
        Some(ep) if !sdk_disabled() => {
            // Like the event writer: after a restart, on from what was settled.
            let cursor = state_dir.map(|d| Cursor::new(d, "otlp-events", pleg.instance_id()));
            let sub = subscribe_after_cursor(
                pleg,
                "otlp-events",
                OTLP_EVENTS_QUEUE,
                cursor.as_ref(),
                resumed,
            )
            .await?;
            let runtime_name = match runtime.version().await {
                Ok(v) => Some(v.runtime_name),
                Err(e) => {
                    tracing::warn!(error = %e, "runtime name unknown: container.runtime.name left out");
                    None
                }
            };
            let mut cfg = EventLogConfig::new(ep, config.identity.clone(), runtime_name);
            cfg.instance_id = Some(pleg.instance_id().to_string());
            let mut cursor = cursor;
            let progress = Box::new(move |revision, now| {
                if let Some(c) = &mut cursor {
                    c.save(revision, now);
                }
            });
            let export = EventLogExport::start_with_progress(sub, cfg, metrics.clone(), progress)
                .map_err(|e| ConfigError::OtlpEvents(Box::new(e)))?;
            tracing::info!(endpoint = %ep, "exporting lifecycle events as OTLP log records");
            Ok(Some(export))
        }
        Some(_) => {
            tracing::info!("OTEL_SDK_DISABLED: lifecycle events are not exported over OTLP");
            Ok(None)
        }
        None => Ok(None),
    }
}

/// The subscriber API's server on the sockets [`bind_sockets`] bound.
fn start_api(
    config: &ServiceConfig,
    pleg: &Pleg,
    sockets: Option<(BoundSocket, Option<BoundSocket>)>,
) -> Result<Option<ApiServer>, ExitError> {
    let Some((bound, control_bound)) = sockets else {
        return Ok(None);
    };
    let path = bound.path().display().to_string();
    let api_config = ApiConfig {
        node_name: config.identity.node_name.clone(),
        watch_queue: config.watch_queue,
        max_connections: DEFAULT_MAX_CONNECTIONS,
    };
    let control = control_bound
        .as_ref()
        .map(|c| c.path().display().to_string());
    let server = ApiServer::start_with_control(pleg.clone(), bound, control_bound, api_config)
        .map_err(ExitError::runtime("cannot start the API server"))?;
    tracing::info!(socket = %path, "serving the subscriber API (plegd.v1)");
    if let Some(control) = control {
        tracing::info!(socket = %control, "serving Sync and RequestRelist on the API control socket");
    }
    Ok(Some(server))
}

/// The `/metrics`, `/healthz` and `/readyz` endpoint, running until told to stop.
struct HttpEndpoint {
    stop: tokio::sync::oneshot::Sender<()>,
    task: actix_rt::task::JoinHandle<std::io::Result<()>>,
}

/// A port in use is the moment's (exit 1: a restart may find it free); an address
/// this host does not have, or a port plegd may not bind, is the configuration's.
fn metrics_addr_error(addr: std::net::SocketAddr, error: std::io::Error) -> ExitError {
    if error.kind() == std::io::ErrorKind::AddrInUse {
        return ExitError::Runtime(
            anyhow::Error::new(error).context(format!("--metrics-addr {addr}: the port is in use")),
        );
    }
    ExitError::from(ConfigError::MetricsAddr { addr, error })
}

/// The HTTP endpoint, when `--metrics-addr` asks for it.
async fn start_http(
    config: &ServiceConfig,
    metrics: &Arc<Metrics>,
    pleg: &Pleg,
) -> Result<Option<HttpEndpoint>, ExitError> {
    let Some(addr) = config.metrics_addr else {
        return Ok(None);
    };
    let server = MetricsServer::bind(
        addr,
        metrics.clone(),
        Arc::new(HealthAdapter(pleg.health().clone(), pleg.state().cloned())),
    )
    .await
    .map_err(|error| metrics_addr_error(addr, error))?;
    tracing::info!(addr = %addr, "serving /metrics, /healthz and /readyz");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = actix_rt::spawn(server.serve(async {
        let _ = stopped.await;
    }));
    Ok(Some(HttpEndpoint { stop, task }))
}

/// Serves SIGHUP until SIGTERM/SIGINT, `until` or a failed output; says which.
async fn wait_for_stop(
    signals: &mut Signals,
    until: impl Future<Output = ()>,
    output_failed: tokio::sync::oneshot::Receiver<()>,
    reopen: Option<&AtomicBool>,
) -> &'static str {
    // Only a failure sends; a writer that ended otherwise drops the sender.
    let output_failed = async move {
        if output_failed.await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    tokio::pin!(until, output_failed);
    loop {
        tokio::select! {
            asked = signals.next() => match (asked, reopen) {
                (Asked::Stop(s), _) => break s,
                (Asked::Reopen, Some(reopen)) => {
                    reopen.store(true, Ordering::SeqCst);
                    tracing::info!("SIGHUP: the events file is reopened at the next event");
                }
                (Asked::Reopen, None) => tracing::info!("SIGHUP: events go to stdout; nothing to reopen"),
            },
            _ = &mut until => break "end of run",
            _ = &mut output_failed => break "the event output failed",
        }
    }
}

/// What runs once plegd has started, in the order it is stopped.
struct Running {
    pleg: Pleg,
    api: Option<ApiServer>,
    http: Option<HttpEndpoint>,
    traces: Option<TraceExport>,
    event_logs: Option<EventLogExport>,
    writer: JoinHandle<std::io::Result<()>>,
}

impl Running {
    /// The graceful shutdown: the endpoints, the relist in progress, the publisher,
    /// then the outputs drain. Errs only when writing the events failed.
    async fn shutdown(self, request_timeout: Duration) -> Result<(), ExitError> {
        let (pleg, writer) = (&self.pleg, &self.writer);
        // The endpoint stops now, alongside the relist: it drops its connections within
        // its grace (0.5 s, less than SHUTDOWN_MARGIN), so no client holds up the exit.
        let http_task = self.http.map(|h| {
            let _ = h.stop.send(());
            h.task
        });
        // Every Watch and Sync stream ends (UNAVAILABLE, a held pod released as
        // cancelled), then the socket goes; on its own thread, so the wait is short.
        if let Some(api) = self.api {
            if !api.stop(API_GRACE) {
                tracing::warn!("the API server did not stop in time; exiting anyway");
            }
        }
        // A relist in progress is finished, its events published, if its remaining calls
        // end within one request timeout: the common case of one slow call.
        let deadline = Instant::now() + request_timeout + SHUTDOWN_MARGIN;
        pleg.stop();
        wait_until(deadline, Duration::from_millis(5), || pleg.stopped()).await;
        if !pleg.stopped() {
            tracing::warn!(
                "the relist in progress did not finish in time; its events are not published"
            );
        }
        // The stop is recorded only once the last relist is stored.
        if pleg.state().is_some() && !pleg.close_state().await {
            tracing::warn!("the state dir's clean stop could not be recorded: the next start goes on from it only after a crash-consistent check (or fresh after a reboot)");
        }
        // Closing the publisher drops every subscriber's sender: the output thread then
        // drains what is queued and exits.
        pleg.close_publisher().await;
        if let Some(t) = self.traces {
            t.shutdown(Duration::from_millis(300));
        }
        // A reader that stopped reading our stdout must not hold plegd up forever.
        let drain_deadline = Instant::now() + OUTPUT_DRAIN;
        wait_until(drain_deadline, Duration::from_millis(2), || {
            writer.is_finished()
        })
        .await;
        // The event export drains its queue for its own drain time once the publisher has
        // closed, alongside the output.
        if let Some(export) = self.event_logs {
            let deadline = Instant::now() + OTLP_EVENTS_DRAIN;
            wait_until(deadline, Duration::from_millis(2), || export.is_finished()).await;
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
        match self.writer.join() {
            Ok(Ok(())) => Ok(()),
            // A closed pipe too: whoever read the events is gone, later ones are lost.
            Ok(Err(e)) => Err(ExitError::runtime("writing events")(e)),
            Err(_) => Err(ExitError::Runtime(anyhow::anyhow!(
                "the output thread panicked"
            ))),
        }
    }
}

/// Polls `done` every `every` until it holds or `deadline` passes.
async fn wait_until(deadline: Instant, every: Duration, done: impl Fn() -> bool) {
    while !done() && Instant::now() < deadline {
        actix_rt::time::sleep(every).await;
    }
}
