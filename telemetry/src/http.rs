//! The operator endpoint: Prometheus text on `/metrics`, liveness on `/healthz`
//! (200 while the Generic PLEG is healthy, else 503 with the reason) and readiness on
//! `/readyz` (200 once the first global relist has succeeded; its body also lists the
//! relist hint sources' states). Both bodies also say the last global relist's error
//! while it is the last outcome (say, a list too large for one message).
//!
//! Its clients are not trusted: in the DaemonSet it listens on 0.0.0.0, so any pod on
//! the node can connect. [`Limits`] bounds what a client can hold: the time to send a
//! request's headers (which is also how long a kept-alive connection may stay idle), a
//! connection's age, the number of connections (beyond it a connection is answered 503
//! and closed at once, so a flood cannot take plegd's file descriptors), and how long
//! shutdown waits for connections before dropping them (so no client can hold up
//! SIGTERM). axum's own `serve` has none of these, hence the accept loop here. Out of
//! file descriptors, a spare one kept for it serves the next connection, so that
//! `/healthz` and `/readyz` still answer (one at a time) while plegd has none left.

use std::future::Future;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::logging::RateLimiter;
use crate::spare_fd::{out_of_fds, SpareFd};
use crate::Metrics;

/// What the endpoint asks the service: liveness (Err = reason) and readiness.
pub trait HealthSource: Send + Sync + 'static {
    fn live(&self) -> Result<(), String>;
    fn ready(&self) -> bool;
    /// Lines `/readyz` adds after the hint sources (facts that never affect it).
    fn details(&self) -> Vec<String> {
        Vec::new()
    }
    /// The last global relist's error, while it is the last outcome (None: it
    /// succeeded, or none has ended).
    fn relist_error(&self) -> Option<String> {
        None
    }
}

/// The body's line for the last global relist's error, if it failed.
fn relist_error_line(health: &dyn HealthSource) -> String {
    health
        .relist_error()
        .map(|e| format!("last global relist failed: {e}\n"))
        .unwrap_or_default()
}

/// What one client may hold of the endpoint. See [`Limits::default`] for the values
/// plegd uses and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// From the start of a request (or of a kept-alive connection's wait for the
    /// next one) to the end of its headers; then the connection is closed.
    pub header_read_timeout: Duration,
    /// A connection this old is closed once its current request is answered.
    pub max_connection_age: Duration,
    /// Connections served at once; more are answered 503 and closed.
    pub max_connections: usize,
    /// How long shutdown (and a connection past its age) waits for a response in
    /// progress before the connection is dropped.
    pub shutdown_grace: Duration,
}

impl Default for Limits {
    /// Scrapers and probes send a few hundred bytes at once and read a response of a
    /// few kilobytes in milliseconds, from a handful of connections: 5 s for headers,
    /// 30 s of age and 64 connections leave them ample room, while a node's worth of
    /// misbehaving clients holds at most 64 descriptors (plegd needs a few dozen more
    /// of any limit, 1,024 included). 0.5 s of grace finishes any real response and
    /// keeps the endpoint within the shutdown bound the README promises.
    fn default() -> Self {
        Limits {
            header_read_timeout: Duration::from_secs(5),
            max_connection_age: Duration::from_secs(30),
            max_connections: 64,
            shutdown_grace: Duration::from_millis(500),
        }
    }
}

/// The request buffer of a connection: plenty for a probe's or a scraper's headers,
/// and bounds what a client can make plegd hold (hyper's default is ~400 KiB).
const MAX_BUF: usize = 64 * 1024;
/// What a connection beyond the bound gets before it is closed.
const REFUSED: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\n\
    Content-Type: text/plain\r\nContent-Length: 21\r\n\r\ntoo many connections\n";
/// Pause after a failed accept (say, out of descriptors), which would otherwise fail
/// again at once, in a busy loop.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);
/// One log line per interval for refused connections and failed accepts.
const LOG_INTERVAL: Duration = Duration::from_secs(30);

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    health: Arc<dyn HealthSource>,
}

async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        s.metrics.encode(),
    )
}

async fn healthz(State(s): State<AppState>) -> impl IntoResponse {
    match s.health.live() {
        Ok(()) => (StatusCode::OK, "ok\n".to_string()),
        Err(why) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{why}\n{}", relist_error_line(s.health.as_ref())),
        ),
    }
}

/// Readiness, then the relist hint sources' states (which never affect it: polling
/// alone is correct).
async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    let mut sources = format!("hint sources: {}\n", s.metrics.hint_source_summary());
    for line in s.health.details() {
        sources.push_str(&line);
        sources.push('\n');
    }
    let failed = relist_error_line(s.health.as_ref());
    if s.health.ready() {
        (StatusCode::OK, format!("ready\n{failed}{sources}"))
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("waiting for the first global relist\n{failed}{sources}"),
        )
    }
}

/// A bound endpoint; `serve` runs it until `shutdown` resolves.
pub struct MetricsServer {
    listener: TcpListener,
    router: Router,
    limits: Limits,
}

impl MetricsServer {
    /// Binds now, so a bad or busy address fails at start with a clear error.
    pub async fn bind(
        addr: SocketAddr,
        metrics: Arc<Metrics>,
        health: Arc<dyn HealthSource>,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let router = Router::new()
            .route("/metrics", get(self::metrics))
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .with_state(AppState { metrics, health });
        Ok(MetricsServer {
            listener,
            router,
            limits: Limits::default(),
        })
    }

    /// Other limits than the defaults (tests use short ones).
    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` resolves; then stops accepting, lets the responses in
    /// progress finish for at most [`Limits::shutdown_grace`] and drops every
    /// connection left. Returns within that grace of `shutdown`, whatever the clients
    /// do. Never fails once bound: a failed accept (out of descriptors, say) is logged
    /// and retried.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let MetricsServer {
            listener,
            router,
            limits,
        } = self;
        let permits = Arc::new(Semaphore::new(limits.max_connections));
        let (closing, closing_rx) = watch::channel(false);
        let mut connections = JoinSet::new();
        let mut refused_log = RateLimiter::new(LOG_INTERVAL);
        let mut accept_log = RateLimiter::new(LOG_INTERVAL);
        let spare = SpareFd::open();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                // Reaps finished connections, so the set stays as small as they are.
                Some(_) = connections.join_next(), if !connections.is_empty() => {}
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => match permits.clone().try_acquire_owned() {
                        Ok(permit) => {
                            connections.spawn(connection(
                                stream,
                                permit,
                                router.clone(),
                                limits,
                                closing_rx.clone(),
                            ));
                        }
                        Err(_) => {
                            drop(refuse(stream));
                            if let Some(more) = refused_log.allow(Instant::now()) {
                                tracing::warn!(
                                    limit = limits.max_connections,
                                    refused_before = more,
                                    "metrics endpoint: too many connections; refusing new ones"
                                );
                            }
                        }
                    },
                    Err(error) => {
                        // Out of descriptors: the spare's is given to the connection
                        // waiting, so a probe is still answered, and taken back when
                        // that connection ends.
                        if out_of_fds(&error) && spare.give_up() {
                            if let Some(stream) = accept_now(&listener) {
                                match permits.clone().try_acquire_owned() {
                                    Ok(permit) => {
                                        connections.spawn(connection(
                                            OnSpare::new(stream, spare.clone()),
                                            permit,
                                            router.clone(),
                                            limits,
                                            closing_rx.clone(),
                                        ));
                                    }
                                    Err(_) => {
                                        if let Some(stream) = refuse(stream) {
                                            spare.take_back(stream);
                                        }
                                    }
                                }
                                continue;
                            }
                        }
                        spare.restore();
                        if let Some(more) = accept_log.allow(Instant::now()) {
                            tracing::warn!(%error, failed_before = more, "metrics endpoint: accept failed");
                        }
                        tokio::select! {
                            () = &mut shutdown => break,
                            () = tokio::time::sleep(ACCEPT_RETRY) => {}
                        }
                    }
                },
            }
        }
        // New connections are refused by the kernel from here on.
        drop(listener);
        let _ = closing.send(true);
        let drained = tokio::time::timeout(limits.shutdown_grace, async {
            while connections.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::info!(
                left = connections.len(),
                "metrics endpoint: dropping connections still open after the grace"
            );
        }
        // The tasks left are aborted, which closes their sockets.
        connections.abort_all();
        Ok(())
    }
}

/// Serves one connection within the limits; `_permit` is its place under
/// [`Limits::max_connections`], given back when the connection ends.
async fn connection(
    stream: impl AsyncRead + AsyncWrite + Unpin + Send + 'static,
    _permit: OwnedSemaphorePermit,
    router: Router,
    limits: Limits,
    mut closing: watch::Receiver<bool>,
) {
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(MAX_BUF);
    let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(router));
    tokio::pin!(conn);
    tokio::select! {
        // Errors are the client's (a timeout, a bad request, a reset): nothing to do.
        _ = conn.as_mut() => return,
        _ = closing.wait_for(|closing| *closing) => {}
        () = tokio::time::sleep(limits.max_connection_age) => {}
    }
    // Closes at once if idle, else after the response in progress, if that comes
    // within the grace.
    conn.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(limits.shutdown_grace, conn).await;
}

/// A connection accepted on the spare's descriptor. Dropped (the connection ended or
/// its task was aborted), it gives that descriptor back to the spare.
struct OnSpare {
    /// Always there until dropped.
    stream: Option<TcpStream>,
    spare: SpareFd,
}

impl OnSpare {
    fn new(stream: TcpStream, spare: SpareFd) -> Self {
        OnSpare {
            stream: Some(stream),
            spare,
        }
    }

    fn stream(&mut self) -> io::Result<Pin<&mut TcpStream>> {
        self.stream
            .as_mut()
            .map(Pin::new)
            .ok_or_else(|| io::ErrorKind::NotConnected.into())
    }
}

impl Drop for OnSpare {
    fn drop(&mut self) {
        if let Some(Ok(stream)) = self.stream.take().map(TcpStream::into_std) {
            self.spare.take_back(stream);
        }
    }
}

impl AsyncRead for OnSpare {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.stream()?.poll_read(cx, buf)
    }
}

impl AsyncWrite for OnSpare {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.stream()?.poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream()?.poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.stream()?.poll_shutdown(cx)
    }
}

/// One accept that does not wait: the connection already waiting, if any.
fn accept_now(listener: &TcpListener) -> Option<TcpStream> {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match listener.poll_accept(&mut cx) {
        Poll::Ready(Ok((stream, _))) => Some(stream),
        _ => None,
    }
}

/// Answers a connection beyond the bound with 503 and closes it, without waiting on
/// the client: both calls are non-blocking, and a fresh socket's send buffer is empty.
/// Returns the socket, for the caller to close or keep.
fn refuse(stream: TcpStream) -> Option<std::net::TcpStream> {
    let mut stream = stream.into_std().ok()?;
    // Whatever the request has sent so far is read first, so closing sends a FIN the
    // client can read the answer before, not a reset that may discard it.
    let mut sink = [0u8; 1024];
    let _ = stream.read(&mut sink);
    let _ = stream.write(REFUSED);
    let _ = stream.shutdown(std::net::Shutdown::Write);
    Some(stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{ErrorKind, Read, Write};
    use std::net::TcpStream;
    use std::thread::JoinHandle;

    struct Healthy;

    impl HealthSource for Healthy {
        fn live(&self) -> Result<(), String> {
            Ok(())
        }
        fn ready(&self) -> bool {
            true
        }
    }

    /// Generous: CI machines are slow and shared.
    const TIMEOUT: Duration = Duration::from_secs(20);

    /// Short limits, so that the tests see each one act in well under a second.
    fn short() -> Limits {
        Limits {
            header_read_timeout: Duration::from_millis(300),
            max_connection_age: Duration::from_secs(10),
            max_connections: 4,
            shutdown_grace: Duration::from_millis(200),
        }
    }

    /// An endpoint served on a thread of its own (as plegd serves it: one
    /// current-thread runtime), so that the tests can be plain blocking clients.
    struct Running {
        addr: SocketAddr,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        /// Returns when `serve` returned.
        thread: Option<JoinHandle<Instant>>,
    }

    impl Running {
        fn start(limits: Option<Limits>) -> Running {
            Running::start_with(limits, Arc::new(Healthy))
        }

        fn start_with(limits: Option<Limits>, health: Arc<dyn HealthSource>) -> Running {
            let (addr_tx, addr_rx) = std::sync::mpsc::channel();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let thread = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let any_port = SocketAddr::from(([127, 0, 0, 1], 0));
                    let mut server =
                        MetricsServer::bind(any_port, Arc::new(Metrics::new()), health)
                            .await
                            .unwrap();
                    if let Some(limits) = limits {
                        server = server.with_limits(limits);
                    }
                    addr_tx.send(server.local_addr().unwrap()).unwrap();
                    server
                        .serve(async {
                            let _ = stopped.await;
                        })
                        .await
                        .unwrap();
                    Instant::now()
                })
            });
            Running {
                addr: addr_rx.recv().unwrap(),
                stop: Some(stop),
                thread: Some(thread),
            }
        }

        /// Stops the endpoint; returns how long `serve` took to return.
        fn stop(mut self) -> Duration {
            let asked = Instant::now();
            let _ = self.stop.take().unwrap().send(());
            let thread = self.thread.take().unwrap();
            while !thread.is_finished() {
                assert!(asked.elapsed() < TIMEOUT, "serve did not return");
                std::thread::sleep(Duration::from_millis(5));
            }
            thread.join().unwrap().saturating_duration_since(asked)
        }

        fn connect(&self) -> TcpStream {
            let s = TcpStream::connect(self.addr).unwrap();
            s.set_read_timeout(Some(TIMEOUT)).unwrap();
            s
        }

        /// A connection that sent a request line and nothing more.
        fn half_sent(&self) -> TcpStream {
            let mut s = self.connect();
            s.write_all(b"GET /metrics HTTP/1.1\r\n").unwrap();
            s
        }

        /// `GET path` on a fresh connection: the whole response.
        fn get(&self, path: &str) -> String {
            let mut s = self.connect();
            write!(
                s,
                "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            )
            .unwrap();
            read_all(&mut s).0
        }
    }

    impl Drop for Running {
        fn drop(&mut self) {
            if let Some(stop) = self.stop.take() {
                let _ = stop.send(());
            }
        }
    }

    /// Reads until the server closes; returns what came and how long it took.
    fn read_all(s: &mut TcpStream) -> (String, Duration) {
        let start = Instant::now();
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                // A close with unread data is a reset: closed all the same.
                Err(e) if e.kind() == ErrorKind::ConnectionReset => break,
                Err(e) => panic!("still open after {:?}: {e}", start.elapsed()),
            }
        }
        (String::from_utf8_lossy(&got).into_owned(), start.elapsed())
    }

    /// Regression: a half-sent request kept the endpoint, and so plegd, from ever
    /// stopping. With the default limits, so it is the shutdown grace that acts (the
    /// header timeout is 5 s).
    #[test]
    fn shutdown_returns_within_the_grace_with_a_half_sent_request_open() {
        let server = Running::start(None);
        let mut held = server.half_sent();
        // The connection is being served (its request line was read) before the stop.
        std::thread::sleep(Duration::from_millis(100));
        let took = server.stop();
        assert!(
            took < Duration::from_secs(2),
            "serve returned after {took:?}"
        );
        let (_, closed_after) = read_all(&mut held);
        assert!(closed_after < Duration::from_secs(2));
    }

    #[test]
    fn the_routes_answer() {
        let server = Running::start(Some(short()));
        assert!(server.get("/healthz").starts_with("HTTP/1.1 200"));
        let ready = server.get("/readyz");
        assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
        assert!(
            ready.contains("hint sources: cri-events=off nri=off containerd-events=off"),
            "{ready}"
        );
        let metrics = server.get("/metrics");
        assert!(metrics.starts_with("HTTP/1.1 200"), "{metrics}");
        assert!(metrics.contains("kubelet_pleg_relist_duration_seconds"));
        assert!(server.stop() < Duration::from_secs(1));
    }

    /// A runtime that cannot be read: both probes say the last global relist's error.
    #[test]
    fn the_probes_say_why_the_last_global_relist_failed() {
        struct CannotList;
        impl HealthSource for CannotList {
            fn live(&self) -> Result<(), String> {
                Err("pleg was last seen active 181.0s ago; threshold is 180.0s".into())
            }
            fn ready(&self) -> bool {
                false
            }
            fn relist_error(&self) -> Option<String> {
                Some("ListContainers: the runtime refused to send its response".into())
            }
        }
        let server = Running::start_with(Some(short()), Arc::new(CannotList));
        let failed = "last global relist failed: ListContainers: the runtime refused";
        let health = server.get("/healthz");
        assert!(health.starts_with("HTTP/1.1 503"), "{health}");
        assert!(
            health.contains("threshold is 180.0s") && health.contains(failed),
            "{health}"
        );
        let ready = server.get("/readyz");
        assert!(ready.starts_with("HTTP/1.1 503"), "{ready}");
        assert!(
            ready.contains("waiting for the first global relist"),
            "{ready}"
        );
        assert!(ready.contains(failed), "{ready}");
        assert!(ready.contains("hint sources: "), "{ready}");
        // A healthy endpoint's bodies carry no such line.
        let fine = Running::start(Some(short()));
        assert!(!fine.get("/readyz").contains("failed"));
        assert!(!fine.get("/healthz").contains("failed"));
    }

    #[test]
    fn a_half_sent_request_is_closed_after_the_header_read_timeout() {
        let server = Running::start(Some(short()));
        let (response, took) = read_all(&mut server.half_sent());
        println!("closed after {took:?}: {response:?}");
        assert!(took >= short().header_read_timeout - Duration::from_millis(50));
        assert!(took < short().header_read_timeout + Duration::from_secs(2));
    }

    #[test]
    fn an_idle_kept_alive_connection_is_closed_after_the_header_read_timeout() {
        let server = Running::start(Some(short()));
        let mut s = server.connect();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        // The response, then nothing: the connection stays open, idle, until the
        // header read timeout of the next request closes it.
        let (response, took) = read_all(&mut s);
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        assert!(took >= short().header_read_timeout - Duration::from_millis(50));
        assert!(took < short().header_read_timeout + Duration::from_secs(2));
    }

    #[test]
    fn a_connection_served_on_the_spare_leaves_its_descriptor_as_the_spare() {
        use std::os::fd::AsRawFd;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let mut client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
                .await
                .unwrap();
            let (stream, _) = listener.accept().await.unwrap();
            let number = stream.as_raw_fd();
            let spare = SpareFd::open();
            assert!(spare.give_up());
            let mut conn = OnSpare::new(stream, spare.clone());
            conn.write_all(b"ok\n").await.unwrap();
            drop(conn);
            // Never closed, so never free for another accept or open to take.
            assert_eq!(spare.number(), Some(number));
            let mut answer = String::new();
            client.read_to_string(&mut answer).await.unwrap();
            assert_eq!(answer, "ok\n", "the client reads the answer, then the end");
        });
    }

    #[test]
    fn connections_beyond_the_bound_are_refused_at_once() {
        let server = Running::start(Some(Limits {
            header_read_timeout: Duration::from_secs(30),
            ..short()
        }));
        let mut held: Vec<TcpStream> = (0..short().max_connections)
            .map(|_| server.half_sent())
            .collect();
        // The held connections took every place when accepted (in order): the next
        // one is answered 503 and closed, at once.
        let (response, took) = read_all(&mut server.half_sent());
        assert!(
            response.starts_with("HTTP/1.1 503") && response.contains("too many connections"),
            "{response:?}"
        );
        assert!(took < Duration::from_secs(2), "{took:?}");
        // A place freed is a place a new client gets.
        drop(held.pop());
        let deadline = Instant::now() + TIMEOUT;
        while !server.get("/healthz").starts_with("HTTP/1.1 200") {
            assert!(Instant::now() < deadline, "the freed place was not reused");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Shutdown closes the held connections at once, whatever their timeouts.
        assert!(server.stop() < Duration::from_secs(1));
        for mut s in held {
            assert!(read_all(&mut s).1 < Duration::from_secs(2));
        }
    }

    #[test]
    fn a_connection_past_its_age_is_closed_after_its_response() {
        let age = Duration::from_millis(500);
        let server = Running::start(Some(Limits {
            max_connection_age: age,
            ..short()
        }));
        let mut s = server.connect();
        let opened = Instant::now();
        // Requests one after another on the same connection, each well within the
        // header timeout: only the age limit can end it.
        let mut answered = 0;
        let mut buf = [0u8; 4096];
        loop {
            assert!(
                opened.elapsed() < TIMEOUT,
                "the connection was never closed"
            );
            if s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                .is_err()
            {
                break;
            }
            let n = match s.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::ConnectionReset => 0,
                Err(e) => panic!("{e}"),
            };
            if n == 0 {
                break;
            }
            assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
            answered += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
        let lived = opened.elapsed();
        println!("closed after {lived:?} and {answered} responses");
        assert!(answered >= 2, "{answered}");
        assert!(
            lived >= age && lived < age + Duration::from_secs(2),
            "{lived:?}"
        );
    }
}
