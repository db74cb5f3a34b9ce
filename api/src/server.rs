//! The API server: tonic on the unix socket, on its own thread with its own runtime,
//! so that neither a flood of clients nor the encoding of a thousand streams takes
//! time from the actors' thread (the dispatcher's relist schedule). It only reads the
//! actors' handles.
//!
//! Two sockets, one thread: the read socket (Watch, ListPods, GetPodStatus,
//! ListClients) and, if given, the control socket, which serves those and Sync and
//! RequestRelist too. Each listener has its own tonic server (and connection bound)
//! over the same service state; the service knows which socket it answers on.
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
use plegd_telemetry::runtime_thread::{self, Workers};
use tokio::runtime::Runtime;
use tokio::sync::watch;
use tonic::transport::Server;

use crate::clients::Clients;
use crate::request_errors::RequestErrorsLayer;
use crate::service::{PlegdService, Socket};
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
    /// Connections served at once; one more is closed at once (`incoming.rs`).
    pub max_connections: usize,
}

/// Where the control socket is by default: beside the read socket, its name with
/// `-control` before the extension (`plegd.sock` → `plegd-control.sock`).
pub fn control_socket_beside(read: &Path) -> PathBuf {
    let stem = read.file_stem().unwrap_or_default().to_string_lossy();
    let name = match read.extension() {
        Some(ext) => format!("{stem}-control.{}", ext.to_string_lossy()),
        None => format!("{stem}-control"),
    };
    read.with_file_name(name)
}

/// A running API server; [`ApiServer::stop`] ends it.
pub struct ApiServer {
    stop: watch::Sender<bool>,
    thread: Option<JoinHandle<()>>,
    socket: Option<BoundSocket>,
    control: Option<BoundSocket>,
    path: PathBuf,
}

fn take_listener(socket: &mut BoundSocket) -> std::io::Result<std::os::unix::net::UnixListener> {
    socket.take_listener().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the socket was already served",
        )
    })
}

impl ApiServer {
    /// Serves `pleg` on the read socket `socket` alone (no Sync, no RequestRelist),
    /// from a new thread.
    pub fn start(pleg: Pleg, socket: BoundSocket, cfg: ApiConfig) -> std::io::Result<Self> {
        Self::start_with_control(pleg, socket, None, cfg)
    }

    /// Serves `pleg` on the read socket `socket` and the control socket `control`,
    /// from a new thread.
    pub fn start_with_control(
        pleg: Pleg,
        mut socket: BoundSocket,
        mut control: Option<BoundSocket>,
        cfg: ApiConfig,
    ) -> std::io::Result<Self> {
        let listener = take_listener(&mut socket)?;
        let control_listener = control.as_mut().map(take_listener).transpose()?;
        let (stop, stopped) = watch::channel(false);
        let path = socket.path().to_owned();
        let control_path = control.as_ref().map(|c| c.path().to_owned());
        let max_connections = cfg.max_connections;
        let ctx = WatchContext {
            pleg,
            node_name: cfg.node_name,
            queue: cfg.watch_queue.max(1),
            shutdown: stopped.clone(),
            clients: Clients::default(),
        };
        let shown = path.clone();
        let ((), thread) = runtime_thread::spawn("plegd-api", Workers::Own, move |_: &Runtime| {
            std::io::Result::Ok(((), move |runtime: Runtime| {
                runtime.block_on(async move {
                    let read = PlegdService {
                        ctx: ctx.clone(),
                        socket: Socket::Read {
                            control: control_path.clone(),
                        },
                    };
                    let read = serve(read, listener, max_connections, stopped.clone());
                    let control = async {
                        match control_listener {
                            Some(l) => {
                                let service = PlegdService {
                                    ctx,
                                    socket: Socket::Control,
                                };
                                serve(service, l, max_connections, stopped).await
                            }
                            None => Ok(()),
                        }
                    };
                    let (read, control) = tokio::join!(read, control);
                    if let Err(e) = read {
                        tracing::error!(socket = %shown.display(), error = %e, "the API server failed");
                    }
                    if let (Err(e), Some(p)) = (control, control_path) {
                        tracing::error!(socket = %p.display(), error = %e, "the API control server failed");
                    }
                });
            }))
        })?;
        Ok(ApiServer {
            stop,
            thread: Some(thread),
            socket: Some(socket),
            control,
            path,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The control socket's path, if served.
    pub fn control_path(&self) -> Option<&Path> {
        self.control.as_ref().map(|c| c.path())
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
        drop(self.control.take());
        ended
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
    }
}

/// Serves `service` on one socket until `stopped`.
async fn serve(
    service: PlegdService,
    listener: std::os::unix::net::UnixListener,
    max_connections: usize,
    mut stopped: watch::Receiver<bool>,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let listener = tokio::net::UnixListener::from_std(listener)?;
    let limits = crate::incoming::Limits {
        max_served: max_connections,
        ..crate::incoming::Limits::default()
    };
    let metrics = service.ctx.pleg.metrics().clone();
    let incoming = crate::incoming::limited(listener, limits, metrics);
    let health = service.ctx.pleg.health().clone();
    let service = PlegdServer::new(service)
        .max_decoding_message_size(MAX_REQUEST_BYTES)
        .max_encoding_message_size(MAX_RESPONSE_BYTES);
    let router = Server::builder()
        .layer(RequestErrorsLayer)
        .layer(crate::streams::StreamsLayer)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_control_socket_is_beside_the_read_socket() {
        let at = |p: &str| control_socket_beside(Path::new(p));
        assert_eq!(
            at("/run/plegd/plegd.sock"),
            Path::new("/run/plegd/plegd-control.sock")
        );
        assert_eq!(at("/tmp/x/api"), Path::new("/tmp/x/api-control"));
        assert_eq!(
            at(crate::DEFAULT_SOCKET),
            Path::new(crate::client::DEFAULT_CONTROL_SOCKET)
        );
    }
}
