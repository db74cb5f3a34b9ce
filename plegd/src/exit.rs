//! Why plegd stops with an error, and the exit status that says so: 2 for bad flags
//! or configuration (each [`ConfigError`] names the flag or key), 1 when the runtime
//! cannot be used or the service fails.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use plegd_actors::ReconnectPolicyError;
use plegd_runtime::RuntimeError;
use plegd_telemetry::traces::TraceError;

/// Why plegd could not run, and the exit status that says so.
#[derive(Debug, thiserror::Error)]
pub enum ExitError {
    /// Bad flags or configuration: exit 2.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The runtime cannot be used, or the service failed: exit 1.
    #[error(transparent)]
    Runtime(anyhow::Error),
}

impl ExitError {
    pub fn exit_code(&self) -> u8 {
        match self {
            ExitError::Config(_) => 2,
            ExitError::Runtime(_) => 1,
        }
    }

    /// For `map_err`: the service failed while `doing` something (exit 1).
    pub fn runtime<E>(doing: &'static str) -> impl FnOnce(E) -> ExitError
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        move |e| ExitError::Runtime(anyhow::Error::new(e).context(doing))
    }
}

/// The largest config file plegd reads (a real one is a few hundred bytes).
pub const MAX_CONFIG_FILE: u64 = 1024 * 1024;

/// A bad setting, named by its flag or config file key (exit 2).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("--config {}: cannot read", path.display())]
    ReadFile {
        path: PathBuf,
        #[source]
        error: std::io::Error,
    },
    #[error("--config {}: not a regular file (a config file is read whole, at start)", path.display())]
    NotAFile { path: PathBuf },
    #[error("--config {}: larger than {MAX_CONFIG_FILE} bytes", path.display())]
    FileTooLarge { path: PathBuf },
    #[error("--config {}: not valid TOML", path.display())]
    FileSyntax {
        path: PathBuf,
        #[source]
        error: Box<toml::de::Error>,
    },
    #[error("config file {}: unknown key {key:?} (known: {})", path.display(), known.join(", "))]
    UnknownKey {
        path: PathBuf,
        key: String,
        known: Vec<String>,
    },
    /// `error` is read from a table, not the file's text: its message has no position.
    #[error("config file {}: key {key:?}: {}", path.display(), error.message())]
    FileValue {
        path: PathBuf,
        key: String,
        error: Box<toml::de::Error>,
    },
    #[error(
        "no runtime endpoint: give --runtime-endpoint, PLEGD_RUNTIME_ENDPOINT or \
         runtime-endpoint in the --config file"
    )]
    NoRuntimeEndpoint,
    #[error("--runtime-endpoint (runtime-endpoint in the config file)")]
    RuntimeEndpoint(#[source] RuntimeError),
    #[error("--nri-socket {}: must be an absolute path", path.display())]
    NriSocket { path: PathBuf },
    #[error("--hint-sources: {source_name}: {reason}")]
    HintSource {
        source_name: &'static str,
        reason: String,
    },
    #[error("--reconnect-base/--reconnect-cap")]
    Reconnect(#[source] ReconnectPolicyError),
    #[error("--relist-period {period}: must be at least {}", humantime::format_duration(*min))]
    RelistPeriod { period: String, min: Duration },
    #[error(
        "--health-threshold {threshold}: must be at least twice --relist-period \
         ({period}), or /healthz fails between two good global relists"
    )]
    HealthThreshold { threshold: String, period: String },
    #[error(
        "--node-name {name:?}: must not be empty, begin or end with white space, or hold \
         a control character"
    )]
    NodeNameBlank { name: String },
    #[error(
        "--api-control-socket {}: the same path as --api-socket; the control socket \
         needs its own",
        path.display()
    )]
    SameSockets { path: PathBuf },
    #[error("--events-json {}", path.display())]
    EventsJson {
        path: PathBuf,
        #[source]
        error: std::io::Error,
    },
    #[error("--metrics-addr {addr}")]
    MetricsAddr {
        addr: SocketAddr,
        #[source]
        error: std::io::Error,
    },
    #[error("--node-name: not given and the host name cannot be read ({reason}); set --node-name")]
    NodeName { reason: String },
    #[error("--api-socket-group {group:?}: no such group in /etc/group")]
    ApiSocketGroup { group: String },
    /// A control socket path or group a start refuses, worded with its own flags.
    #[error("{0}")]
    ApiControlSocket(String),
    #[error("--api-socket {}: {len} bytes long; a unix socket path has at most 107", path.display())]
    ApiSocketPath { path: PathBuf, len: usize },
    #[error("--api-socket-group {group:?}: not a group id a file can have (0 to 4294967294)")]
    ApiSocketGroupId { group: String },
    #[error("--otlp-endpoint")]
    OtlpEndpoint(#[source] TraceError),
    #[error(
        "--otlp-events: no collector to send to; give --otlp-events-endpoint or --otlp-endpoint"
    )]
    NoOtlpEventsEndpoint,
    #[error("--otlp-events-endpoint is given but --otlp-events is off; turn it on or leave the endpoint out")]
    OtlpEventsEndpointUnused,
    /// Boxed: this file is also compiled into the config fuzz target, which has no
    /// plegd-otlp-events.
    #[error("--otlp-events")]
    OtlpEvents(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// A setting that TOML cannot hold (a path that is not UTF-8).
    #[error("the configuration cannot be written as TOML")]
    Render(#[source] toml::ser::Error),
}
