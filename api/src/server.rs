//! The API server: tonic on the unix socket, on its own thread with its own runtime,
//! so that neither a flood of clients nor the encoding of a thousand streams takes
//! time from the actors' thread (the dispatcher's relist schedule). It only reads the
//! actors' handles.
//!
//! Stopping: every Watch and Sync stream ends with UNAVAILABLE ("plegd is shutting
//! down"; a held pod is released as cancelled), waits on GetPodStatus end the same
//! way, tonic closes the connections (HTTP/2 GOAWAY), and the socket file is removed.

use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use plegd_actors::Pleg;
use plegd_protocol::v1::plegd_server::PlegdServer;
use plegd_protocol::MAX_REQUEST_BYTES;
use tokio::sync::watch;
use tonic::transport::Server;

use crate::request_errors::RequestErrorsLayer;
use crate::service::PlegdService;
use crate::socket::BoundSocket;
use crate::watch::WatchContext;

/// The largest response plegd sends (ListPods of a very large node).
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;
/// Concurrent streams per client connection (a node agent may watch many ways).
pub const MAX_STREAMS_PER_CONNECTION: u32 = 2048;
/// Each watcher's queue of events, by default: a burst larger than this for a client
/// that does not read is told as `missed`.
pub const DEFAULT_WATCH_QUEUE: usize = 1024;

/// Client connections served at once, by default (a node has a few agents; each
/// connection carries any number of streams up to [`MAX_STREAMS_PER_CONNECTION`]).
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

#[derive(Clone, Debug)]
pub struct ApiConfig {
    /// This node's name, in every answer.
    pub node_name: String,
    /// Capacity of each watcher's subscriber queue.
    pub watch_queue: usize,
    /// Connections served at once; more wait until one closes.
    pub max_connections: usize,
}

/// A running API server; [`ApiServer::stop`] ends it.
pub struct ApiServer {
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
    socket: Option<BoundSocket>,
    path: PathBuf,
}

impl ApiServer {
    /// Serves `pleg` on `socket` from a new thread.
    pub fn start(pleg: Pleg, mut socket: BoundSocket, cfg: ApiConfig) -> std::io::Result<Self> {
        let listener = socket.take_listener().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the socket was already served",
            )
        })?;
        let (stop, stopped) = watch::channel(false);
        let path = socket.path().to_owned();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let max_connections = cfg.max_connections;
        let ctx = WatchContext {
            pleg,
            node_name: cfg.node_name,
            queue: cfg.watch_queue.max(1),
            shutdown: stopped.clone(),
        };
        let shown = path.clone();
        let thread = std::thread::Builder::new()
            .name("plegd-api".into())
            .spawn(move || {
                runtime.block_on(async move {
                    if let Err(e) = serve(ctx, listener, max_connections, stopped).await {
                        tracing::error!(socket = %shown.display(), error = %e, "the API server failed");
                    }
                });
            })?;
        Ok(ApiServer {
            stop,
            thread: Some(thread),
            socket: Some(socket),
            path,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Ends every stream and the server; waits up to `grace` for it. The socket file
    /// is removed either way. True if it ended in time.
    pub fn stop(mut self, grace: Duration) -> bool {
        let _ = self.stop.send(true);
        let deadline = Instant::now() + grace;
        let mut ended = false;
        if let Some(t) = self.thread.take() {
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(2));
            }
            ended = t.is_finished();
            if ended {
                let _ = t.join();
            }
        }
        drop(self.socket.take());
        ended
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

async fn serve(
    ctx: WatchContext,
    listener: std::os::unix::net::UnixListener,
    max_connections: usize,
    mut stopped: watch::Receiver<bool>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let listener = tokio::net::UnixListener::from_std(listener)?;
    let incoming = crate::incoming::bounded(listener, max_connections);
    let health = ctx.pleg.health().clone();
    let service = PlegdServer::new(PlegdService { ctx })
        .max_decoding_message_size(MAX_REQUEST_BYTES)
        .max_encoding_message_size(MAX_RESPONSE_BYTES);
    let router = Server::builder()
        .layer(RequestErrorsLayer)
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .add_service(service);
    // grpc.health.v1 and server reflection, for stock probes and tools.
    let router = crate::standard::add(router, health, stopped.clone())?;
    router
        .serve_with_incoming_shutdown(incoming, async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        })
        .await?;
    Ok(())
}
