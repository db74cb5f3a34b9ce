//! The subscriber API from a test's side: plegd's core over the fake runtime, served
//! by the real API server on a fresh read socket and control socket, and real tonic
//! clients for them.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use plegd_actors::{Pleg, PlegConfig};
use plegd_api::v1::plegd_client::PlegdClient;
use plegd_api::v1::{self, watch_response::Kind};
use plegd_api::{ApiConfig, ApiServer};
use plegd_sim::FakeRuntime;
use tempfile::TempDir;
use tonic::transport::Channel;
use tonic::Streaming;

use crate::pleg::start_generic_with;
use crate::wait::TIMEOUT;

/// The node name the test servers answer with.
pub const NODE: &str = "test-node";
/// The test servers' control socket mode (the read socket has plegd's 0660).
pub const CONTROL_MODE: u32 = 0o600;

/// A fake runtime, plegd's core over it, and the API server.
pub struct Served {
    pub rt: FakeRuntime,
    pub pleg: Pleg,
    /// The read socket (no Sync, no RequestRelist).
    pub socket: PathBuf,
    /// The control socket (every call), mode 0600.
    pub control: PathBuf,
    server: Option<ApiServer>,
    _dir: TempDir,
}

impl Served {
    /// Serves a new fake runtime, relisting every `period`, each watcher with a
    /// queue of `watch_queue`.
    pub fn start(period: Duration, watch_queue: usize) -> Served {
        Self::start_with(
            PlegConfig {
                relist_period: period,
                ..PlegConfig::default()
            },
            watch_queue,
        )
    }

    pub fn start_with(cfg: PlegConfig, watch_queue: usize) -> Served {
        Self::start_limited(cfg, watch_queue, plegd_api::DEFAULT_MAX_CONNECTIONS)
    }

    /// As [`Self::start_with`], serving at most `max_connections` at once.
    pub fn start_limited(cfg: PlegConfig, watch_queue: usize, max_connections: usize) -> Served {
        let rt = FakeRuntime::new();
        let pleg = start_generic_with(&rt, cfg);
        let dir = tempfile::tempdir().expect("a temporary directory");
        let socket = dir.path().join("plegd.sock");
        let bound = plegd_api::bind(&socket, None).expect("the API socket binds");
        let control = dir.path().join("plegd-control.sock");
        let control_bound = plegd_api::bind_with_mode(&control, None, CONTROL_MODE)
            .expect("the control socket binds");
        let server = ApiServer::start_with_control(
            pleg.clone(),
            bound,
            Some(control_bound),
            ApiConfig {
                node_name: NODE.into(),
                watch_queue,
                max_connections,
            },
        )
        .expect("the API server starts");
        Served {
            rt,
            pleg,
            socket,
            control,
            server: Some(server),
            _dir: dir,
        }
    }

    /// A new client connection to the read socket.
    pub async fn client(&self) -> PlegdClient<Channel> {
        plegd_api::connect(&self.socket)
            .await
            .expect("the API server answers")
    }

    /// A new client connection to the control socket.
    pub async fn control_client(&self) -> PlegdClient<Channel> {
        plegd_api::connect(&self.control)
            .await
            .expect("the API server answers on its control socket")
    }

    /// A client whose connection takes little before HTTP/2 flow control stops the
    /// server (a 16 KiB window instead of hyper's 2 MiB): a client that stops reading
    /// fills plegd's queue for it within a few hundred events.
    pub async fn client_with_small_window(&self) -> PlegdClient<Channel> {
        let socket = self.socket.clone();
        let channel = tonic::transport::Endpoint::from_static("http://plegd.local")
            .initial_stream_window_size(16 * 1024)
            .initial_connection_window_size(16 * 1024)
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let socket = socket.clone();
                async move {
                    tokio::net::UnixStream::connect(socket)
                        .await
                        .map(hyper_util::rt::TokioIo::new)
                }
            }))
            .await
            .expect("the API server answers");
        PlegdClient::new(channel)
    }

    /// A client of the control socket (a pod worker), and a way to cut its
    /// connection as a killed process would (the kernel closes the socket; no HTTP/2
    /// goodbye).
    pub async fn killable_client(&self) -> (PlegdClient<Channel>, Killer) {
        let socket = self.control.clone();
        let killer = Killer::default();
        let slot = killer.0.clone();
        let channel = tonic::transport::Endpoint::from_static("http://plegd.local")
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let (socket, slot) = (socket.clone(), slot.clone());
                async move {
                    let stream = std::os::unix::net::UnixStream::connect(socket)?;
                    *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(stream.try_clone()?);
                    stream.set_nonblocking(true)?;
                    tokio::net::UnixStream::from_std(stream).map(hyper_util::rt::TokioIo::new)
                }
            }))
            .await
            .expect("the API server answers");
        (PlegdClient::new(channel), killer)
    }

    /// Stops the server (streams end with UNAVAILABLE); true if it stopped in time.
    /// The wait runs off this thread, whose clients must go on answering meanwhile.
    pub async fn stop_server(&mut self) -> bool {
        let Some(server) = self.server.take() else {
            return false;
        };
        tokio::task::spawn_blocking(move || server.stop(Duration::from_secs(10)))
            .await
            .unwrap_or(false)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.stop(Duration::from_secs(2));
        }
        self.pleg.stop();
    }
}

/// An open Watch stream whose Hello has been read.
pub struct Watching {
    pub stream: Streaming<v1::WatchResponse>,
    pub hello: v1::Hello,
}

/// Opens a Watch and reads its Hello.
pub async fn watch(client: &mut PlegdClient<Channel>, req: v1::WatchRequest) -> Watching {
    let mut stream = client
        .watch(req)
        .await
        .expect("the watch is accepted")
        .into_inner();
    match next(&mut stream).await {
        Kind::Hello(hello) => Watching { stream, hello },
        other => panic!("the first message is not Hello: {other:?}"),
    }
}

/// The next message, within the test timeout.
pub async fn next(stream: &mut Streaming<v1::WatchResponse>) -> Kind {
    match tokio::time::timeout(TIMEOUT, stream.message()).await {
        Ok(Ok(Some(v1::WatchResponse { kind: Some(k) }))) => k,
        Ok(Ok(Some(_))) => panic!("a message with no kind"),
        Ok(Ok(None)) => panic!("the stream ended"),
        Ok(Err(s)) => panic!("the stream failed: {s:?}"),
        Err(_) => panic!("no message within {TIMEOUT:?}"),
    }
}

/// Reads events until `pred` holds for one; returns all read (bookmarks skipped).
pub async fn events_until(
    stream: &mut Streaming<v1::WatchResponse>,
    what: &str,
    mut pred: impl FnMut(&v1::Event) -> bool,
) -> Vec<v1::Event> {
    let deadline = Instant::now() + TIMEOUT;
    let mut got = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let msg = tokio::time::timeout(left, stream.message()).await;
        match msg {
            Ok(Ok(Some(v1::WatchResponse {
                kind: Some(Kind::Event(e)),
            }))) => {
                let hit = pred(&e);
                got.push(e);
                if hit {
                    return got;
                }
            }
            Ok(Ok(Some(_))) => {}
            Ok(Ok(None)) => panic!("the stream ended waiting for {what}; got {got:?}"),
            Ok(Err(s)) => panic!("the stream failed waiting for {what}: {s:?}"),
            Err(_) => panic!("timed out waiting for {what}; got {} events", got.len()),
        }
    }
}

/// The event type of `e`.
pub fn kind_of(e: &v1::Event) -> v1::EventType {
    v1::EventType::try_from(e.r#type).unwrap_or(v1::EventType::Unspecified)
}

/// Cuts a [`Served::killable_client`]'s connection.
#[derive(Clone, Default)]
pub struct Killer(std::sync::Arc<std::sync::Mutex<Option<std::os::unix::net::UnixStream>>>);

impl Killer {
    pub fn kill(&self) {
        if let Some(s) = self.0.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Whether plegd at `socket` answers a Watch with its Hello (it serves its API).
pub async fn says_hello(socket: &std::path::Path) -> bool {
    let Ok(mut client) = plegd_api::connect(socket).await else {
        return false;
    };
    let Ok(stream) = client.watch(v1::WatchRequest::default()).await else {
        return false;
    };
    matches!(
        stream.into_inner().message().await,
        Ok(Some(v1::WatchResponse {
            kind: Some(Kind::Hello(_))
        }))
    )
}

/// Waits until the plegd `child` serves its API at `socket`; panics if it exits
/// first, or after [`TIMEOUT`].
pub fn wait_served(child: &mut std::process::Child, socket: &std::path::Path) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let deadline = Instant::now() + TIMEOUT;
    while !runtime.block_on(says_hello(socket)) {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("plegd exited ({status}) before serving its API");
        }
        assert!(Instant::now() < deadline, "plegd did not serve its API");
        std::thread::sleep(Duration::from_millis(5));
    }
}
