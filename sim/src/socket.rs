//! Serving the simulated runtime on a unix socket, like containerd: in the caller's
//! tokio runtime ([`serve_unix`]) or on an OS thread with a runtime of its own
//! ([`spawn_in_thread`], for callers on actix's single-threaded runtime or with none).
//!
//! A server can be shut down and a new one started on the same path over the same
//! [`FakeRuntime`]: that is a runtime restart (state kept, connections and event
//! streams lost), which clients must survive.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::fake::FakeRuntime;
use tokio::net::UnixListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;

use crate::error::SimError;
use crate::events_server::{EventsServer, SimEvents};
use crate::list_streaming::CriService;
use crate::server::CriServer;

/// How long [`SimServer::shutdown`] waits for connections to drain (a unary call
/// delayed by scripted latency, say) before abandoning them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How long [`ThreadedSimServer::stop`] lets connections drain before closing them.
/// Short, because draining needs the client's cooperation (hyper's graceful HTTP/2
/// shutdown waits for the client to acknowledge a PING), and a client on the thread
/// that calls `stop()` cannot give it.
pub const THREAD_STOP_GRACE: Duration = Duration::from_millis(250);

/// sun_path holds 108 bytes including the terminating NUL.
const MAX_SOCKET_PATH: usize = 107;

/// A socket file's identity, so a server removes only the file it bound (not one a
/// later server bound on the same path).
type FileId = (u64, u64);

fn file_id(path: &Path) -> Option<FileId> {
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

/// Checks the path and removes a stale socket (one nobody listens on) left by a
/// previous run; refuses to touch anything else.
fn prepare_path(path: &Path) -> Result<(), SimError> {
    let bad = |reason: &str| SimError::BadPath {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    };
    let text = path.to_str().ok_or_else(|| bad("not UTF-8"))?;
    if !path.is_absolute() {
        return Err(bad("must be absolute (it becomes a unix:///path endpoint)"));
    }
    if text.len() > MAX_SOCKET_PATH {
        return Err(bad("unix socket paths are limited to 107 bytes"));
    }
    let dir = path
        .parent()
        .ok_or_else(|| bad("has no parent directory"))?;
    if !dir.is_dir() {
        return Err(SimError::MissingDirectory {
            path: path.to_path_buf(),
            dir: dir.to_path_buf(),
        });
    }
    match std::fs::symlink_metadata(path) {
        Err(_) => Ok(()),
        Ok(meta) if !meta.file_type().is_socket() => Err(SimError::NotASocket {
            path: path.to_path_buf(),
        }),
        Ok(_) => {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(SimError::InUse {
                    path: path.to_path_buf(),
                });
            }
            std::fs::remove_file(path).map_err(|source| SimError::StaleSocket {
                path: path.to_path_buf(),
                source,
            })
        }
    }
}

fn endpoint_of(path: &Path) -> String {
    // prepare_path checked that the path is absolute UTF-8: this is unix:///...
    format!("unix://{}", path.display())
}

/// A simulator serving CRI on a unix socket in the current tokio runtime.
///
/// [`shutdown`](Self::shutdown) stops it cleanly. Dropping it instead stops it
/// without waiting: event streams end with Unavailable, the accept loop is aborted,
/// open connections drain in the background and the socket file is removed.
pub struct SimServer {
    path: PathBuf,
    bound: Option<FileId>,
    stopping: watch::Sender<bool>,
    task: Option<JoinHandle<Result<(), tonic::transport::Error>>>,
}

/// Binds `path` and serves the CRI RuntimeService over `runtime` on a task of the
/// current tokio runtime (which must outlive the server to keep serving).
pub async fn serve_unix(path: &Path, runtime: FakeRuntime) -> Result<SimServer, SimError> {
    prepare_path(path)?;
    let listener = UnixListener::bind(path).map_err(|source| SimError::Bind {
        path: path.to_path_buf(),
        source,
    })?;
    let bound = file_id(path);
    let (stopping, stopping_rx) = watch::channel(false);
    let service = CriService::new(CriServer::with_shutdown(
        runtime.clone(),
        stopping_rx.clone(),
    ));
    let events = EventsServer::new(SimEvents::new(runtime, Some(stopping_rx.clone())));
    let mut signal = stopping_rx;
    let task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .add_service(events)
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                // Err: the handle is gone, which is a shutdown too.
                let _ = signal.wait_for(|s| *s).await;
            })
            .await
    });
    tracing::info!(socket = %path.display(), "plegd-sim serving CRI");
    Ok(SimServer {
        path: path.to_path_buf(),
        bound,
        stopping,
        task: Some(task),
    })
}

impl SimServer {
    /// The CRI endpoint, `unix:///path`.
    pub fn endpoint(&self) -> String {
        endpoint_of(&self.path)
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Stops accepting, ends open event streams with Unavailable, waits up to
    /// [`SHUTDOWN_GRACE`] for connections to close, and removes the socket file.
    pub async fn shutdown(self) {
        self.shutdown_within(SHUTDOWN_GRACE).await
    }

    /// [`shutdown`](Self::shutdown) with another grace period. Connections still open
    /// after it are abandoned: their tasks end when their clients go or the tokio
    /// runtime does.
    pub async fn shutdown_within(mut self, grace: Duration) {
        self.stopping.send_replace(true);
        if let Some(mut task) = self.task.take() {
            match tokio::time::timeout(grace, &mut task).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => tracing::warn!(error = %e, "plegd-sim server failed"),
                Ok(Err(e)) => tracing::warn!(error = %e, "plegd-sim server task failed"),
                Err(_) => {
                    tracing::debug!(?grace, "plegd-sim connections did not drain");
                    task.abort();
                }
            }
        }
        self.remove_socket();
        tracing::info!(socket = %self.path.display(), "plegd-sim stopped");
    }

    fn remove_socket(&mut self) {
        if let Some(id) = self.bound.take() {
            if file_id(&self.path) == Some(id) {
                if let Err(e) = std::fs::remove_file(&self.path) {
                    tracing::warn!(socket = %self.path.display(), error = %e, "cannot remove socket");
                }
            }
        }
    }
}

impl Drop for SimServer {
    fn drop(&mut self) {
        self.stopping.send_replace(true);
        if let Some(task) = self.task.take() {
            task.abort();
        }
        self.remove_socket();
    }
}

/// A simulator serving on its own OS thread and 2-worker tokio runtime.
///
/// [`stop`](Self::stop) or dropping it shuts the server down (draining connections
/// for up to [`THREAD_STOP_GRACE`]), drops the thread's runtime — which closes any
/// connection still open — and joins the thread. [`kill`](Self::kill) does the same
/// with no grace, as when a runtime crashes.
pub struct ThreadedSimServer {
    path: PathBuf,
    stop: Option<oneshot::Sender<Duration>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Starts a thread that serves `runtime` on `path`; returns once the socket is bound
/// (or binding failed). Needs no tokio runtime in the caller.
pub fn spawn_in_thread(path: &Path, runtime: FakeRuntime) -> Result<ThreadedSimServer, SimError> {
    let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel::<Result<(), SimError>>(1);
    let (stop_tx, stop_rx) = oneshot::channel::<Duration>();
    let socket = path.to_path_buf();
    let thread = std::thread::Builder::new()
        .name("plegd-sim".into())
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("plegd-sim-worker")
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(source) => {
                    let _ = ready_tx.send(Err(SimError::Runtime { source }));
                    return;
                }
            };
            rt.block_on(async move {
                match serve_unix(&socket, runtime).await {
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                    Ok(server) => {
                        let _ = ready_tx.send(Ok(()));
                        // Err: the handle was dropped, which also means stop.
                        let grace = stop_rx.await.unwrap_or(THREAD_STOP_GRACE);
                        server.shutdown_within(grace).await;
                    }
                }
            });
            // Drops the connection tasks that outlived the grace period, closing
            // their sockets.
            rt.shutdown_timeout(Duration::from_secs(1));
        })
        .map_err(|source| SimError::Thread { source })?;
    let ready = ready_rx.recv();
    let handle = ThreadedSimServer {
        path: path.to_path_buf(),
        stop: Some(stop_tx),
        thread: Some(thread),
    };
    match ready {
        Ok(Ok(())) => Ok(handle),
        Ok(Err(e)) => Err(e),
        // The thread died (panicked) before reporting.
        Err(_) => Err(SimError::ThreadExited),
    }
}

impl ThreadedSimServer {
    /// The CRI endpoint, `unix:///path`.
    pub fn endpoint(&self) -> String {
        endpoint_of(&self.path)
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Shuts the server down and joins its thread.
    pub fn stop(mut self) {
        self.stop_and_join(THREAD_STOP_GRACE);
    }

    /// Shuts the server down with no grace: open calls and streams fail with a
    /// transport error or Unavailable, like a crashed runtime's.
    pub fn kill(mut self) {
        self.stop_and_join(Duration::ZERO);
    }

    fn stop_and_join(&mut self, grace: Duration) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(grace);
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::warn!(socket = %self.path.display(), "plegd-sim thread panicked");
            }
        }
    }
}

impl Drop for ThreadedSimServer {
    fn drop(&mut self) {
        self.stop_and_join(THREAD_STOP_GRACE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_checked_before_binding() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope").join("cri.sock");
        assert!(matches!(
            prepare_path(&missing),
            Err(SimError::MissingDirectory { .. })
        ));
        assert!(matches!(
            prepare_path(Path::new("relative.sock")),
            Err(SimError::BadPath { .. })
        ));
        let long = dir.path().join("x".repeat(120));
        assert!(matches!(prepare_path(&long), Err(SimError::BadPath { .. })));
        let file = dir.path().join("file");
        std::fs::write(&file, b"not a socket").unwrap();
        assert!(matches!(
            prepare_path(&file),
            Err(SimError::NotASocket { .. })
        ));
        assert!(file.exists());
    }

    #[test]
    fn stale_socket_is_replaced_but_live_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cri.sock");
        let live = std::os::unix::net::UnixListener::bind(&path).unwrap();
        assert!(matches!(prepare_path(&path), Err(SimError::InUse { .. })));
        drop(live);
        // The file stays behind when a listener goes: stale.
        assert!(path.exists());
        prepare_path(&path).unwrap();
        assert!(!path.exists());
    }
}
