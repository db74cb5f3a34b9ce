//! The plugin's connection to the runtime (containerd/nri `pkg/stub` behaviour): dial
//! the NRI socket, multiplex it, serve the plugin service on connection 1, call
//! `RegisterPlugin` on connection 2, wait for `Configure` — all within the
//! registration timeout — then serve hooks until the runtime closes the connection.
//! The runtime never reconnects to a plugin; the plugin dials again, after a delay the
//! caller chooses (plegd uses the CRI stream's capped backoff).

use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::UnixStream;
use tokio::sync::watch;
use ttrpc::r#async::transport::{Listener, Socket};
use ttrpc::r#async::{Client, Server};

use crate::api;
use crate::handler::{Counters, PluginService, RuntimeInfo};
use crate::hint::HintSink;
use crate::mux::{multiplex, MuxEnd, MuxTask};

/// NRI's default socket.
pub const DEFAULT_SOCKET: &str = "/var/run/nri/nri.sock";
/// The name plegd registers under.
pub const PLUGIN_NAME: &str = "plegd";
/// plegd's plugin index. Plugins are called in index order, one after another; plegd
/// answers at once, so going first costs the others nothing and keeps its hints from
/// waiting behind slower plugins.
pub const DEFAULT_INDEX: &str = "00";
/// NRI's default registration timeout (RegisterPlugin through Configure).
pub const DEFAULT_REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A bad plugin setting.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("NRI plugin index {0:?} must be two digits (00-99)")]
    BadIndex(String),
    #[error("the NRI registration timeout must be greater than zero")]
    ZeroRegistrationTimeout,
}

/// Validated plugin settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PluginConfig {
    socket: PathBuf,
    index: String,
    registration_timeout: Duration,
}

impl PluginConfig {
    /// The plugin for the runtime's NRI socket at `socket`, index [`DEFAULT_INDEX`].
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            index: DEFAULT_INDEX.to_owned(),
            registration_timeout: DEFAULT_REGISTRATION_TIMEOUT,
        }
    }

    pub fn with_index(mut self, index: &str) -> Result<Self, ConfigError> {
        if index.len() != 2 || !index.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ConfigError::BadIndex(index.to_owned()));
        }
        self.index = index.to_owned();
        Ok(self)
    }

    pub fn with_registration_timeout(mut self, timeout: Duration) -> Result<Self, ConfigError> {
        if timeout.is_zero() {
            return Err(ConfigError::ZeroRegistrationTimeout);
        }
        self.registration_timeout = timeout;
        Ok(self)
    }

    pub fn socket(&self) -> &std::path::Path {
        &self.socket
    }
}

/// How one connection to the runtime ended.
#[derive(Debug, thiserror::Error)]
pub enum SessionEnd {
    #[error("cannot connect to the NRI socket: {0}")]
    Connect(io::Error),
    #[error("timed out connecting to the NRI socket")]
    ConnectTimeout,
    #[error("cannot start the ttRPC plugin service: {0}")]
    Serve(ttrpc::Error),
    #[error("the runtime refused the registration: {0}")]
    Register(ttrpc::Error),
    #[error("the runtime did not register and configure the plugin within {0:?}")]
    RegistrationTimeout(Duration),
    #[error("the connection ended before the plugin was configured: {0}")]
    ClosedBeforeConfigured(MuxEnd),
    #[error("the connection ended: {0}")]
    Closed(MuxEnd),
}

impl SessionEnd {
    /// Whether the runtime had configured the plugin (the session was healthy).
    pub fn was_configured(&self) -> bool {
        matches!(self, Self::Closed(_))
    }
}

/// The plugin's connection state, for logs, metrics and readiness.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// Dialing, registering or waiting for Configure.
    Connecting,
    /// Configured: hooks are flowing.
    Connected(RuntimeInfo),
    /// The last connection failed or ended; a reconnect is pending.
    Disconnected { reason: String },
}

/// plegd's NRI plugin.
pub struct Plugin {
    config: PluginConfig,
    sink: Arc<dyn HintSink>,
    status: watch::Sender<Status>,
    counters: Arc<Counters>,
}

impl Plugin {
    pub fn new(config: PluginConfig, sink: impl HintSink) -> Self {
        Self {
            config,
            sink: Arc::new(sink),
            status: watch::channel(Status::Connecting).0,
            counters: Arc::default(),
        }
    }

    pub fn status(&self) -> watch::Receiver<Status> {
        self.status.subscribe()
    }

    pub fn counters(&self) -> Arc<Counters> {
        Arc::clone(&self.counters)
    }

    /// Connects, serves until the connection ends, and after each end waits
    /// `reconnect_delay(end, how long the session lasted)` before dialing again.
    /// Runs until dropped.
    pub async fn run(&self, mut reconnect_delay: impl FnMut(&SessionEnd, Duration) -> Duration) {
        loop {
            let started = Instant::now();
            let end = self.run_session().await;
            let delay = reconnect_delay(&end, started.elapsed());
            tracing::warn!(error = %end, retry_in = ?delay, socket = %self.config.socket.display(), "NRI plugin disconnected");
            tokio::time::sleep(delay).await;
        }
    }

    /// One connection: returns when it ends. Dropping the future closes it.
    pub async fn run_session(&self) -> SessionEnd {
        self.status.send_replace(Status::Connecting);
        let end = match self.establish().await {
            Ok(established) => {
                self.status
                    .send_replace(Status::Connected(established.runtime().clone()));
                established.ended().await
            }
            Err(end) => end,
        };
        self.status.send_replace(Status::Disconnected {
            reason: end.to_string(),
        });
        end
    }

    /// Dials the runtime, registers and waits to be configured (within the
    /// registration timeout). The returned connection serves hooks until the runtime
    /// closes it or it is dropped.
    pub async fn establish(&self) -> Result<Established, SessionEnd> {
        let connect = UnixStream::connect(&self.config.socket);
        let trunk = match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            Err(_) => return Err(SessionEnd::ConnectTimeout),
            Ok(Err(e)) => return Err(SessionEnd::Connect(e)),
            Ok(Ok(trunk)) => trunk,
        };
        let mux = multiplex(trunk);
        let mut mux_task = mux.task;

        let (configured_tx, mut configured_rx) = watch::channel(None);
        let service = PluginService::new(
            Arc::clone(&self.sink),
            configured_tx,
            Arc::clone(&self.counters),
        );
        let incoming = futures::stream::iter([Ok::<_, io::Error>(mux.plugin_service)]);
        // Kept with the connection: dropping a ttrpc server closes its connections.
        let mut server = Server::new()
            .add_listener(Listener::new(incoming))
            .register_service(api::create_plugin(Arc::new(service)));
        if let Err(e) = server.start().await {
            return Err(SessionEnd::Serve(e));
        }
        let runtime = api::RuntimeClient::new(Client::new(Socket::new(mux.runtime_service)));

        let timeout = self.config.registration_timeout;
        let request = api::RegisterPluginRequest {
            plugin_name: PLUGIN_NAME.to_owned(),
            plugin_idx: self.config.index.clone(),
            nri_version: String::new(),
        };
        let register_and_configure = async {
            runtime
                .register_plugin(ttrpc::context::with_duration(timeout), &request)
                .await
                .map_err(SessionEnd::Register)?;
            match configured_rx.wait_for(Option::is_some).await {
                Ok(info) => Ok(info.clone().unwrap_or_default()),
                // The service (and its sender) lives as long as the server.
                Err(_) => Err(SessionEnd::RegistrationTimeout(timeout)),
            }
        };
        let info = tokio::select! {
            r = tokio::time::timeout(timeout, register_and_configure) => match r {
                Err(_) => return Err(SessionEnd::RegistrationTimeout(timeout)),
                Ok(Err(end)) => return Err(end),
                Ok(Ok(info)) => info,
            },
            end = mux_task.ended() => return Err(SessionEnd::ClosedBeforeConfigured(end)),
        };
        tracing::info!(runtime = %info.name, version = %info.version, "NRI plugin registered and configured");
        Ok(Established {
            info,
            mux_task,
            _server: server,
            _runtime: runtime,
        })
    }
}

/// A registered, configured connection to the runtime. Dropping it closes it.
pub struct Established {
    info: RuntimeInfo,
    mux_task: MuxTask,
    _server: Server,
    /// Kept too: dropping the client closes connection 2, and the multiplexer ends the
    /// trunk with it.
    _runtime: api::RuntimeClient,
}

impl Established {
    /// What Configure said about the runtime.
    pub fn runtime(&self) -> &RuntimeInfo {
        &self.info
    }

    /// Serves hooks until the runtime closes the connection.
    pub async fn ended(mut self) -> SessionEnd {
        SessionEnd::Closed(self.mux_task.ended().await)
    }
}
