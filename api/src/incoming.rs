//! The API socket's connections, so that no local client can keep another out: the
//! socket is group-readable, and every process of the group is trusted to read, not
//! to behave.
//!
//! - A connection is accepted at once, always, and must send the HTTP/2 client
//!   preface within [`Limits::handshake_deadline`], else it is closed.
//! - At most [`Limits::max_handshaking`] connections wait for their preface; one more
//!   closes the *oldest* of those of the process that holds the most of them (the
//!   peer's PID, from the socket's credentials: [`evictee`]). Closing the newest
//!   instead would let a flood that holds that many silent connections (or reconnects
//!   as fast as they are closed) refuse every new client; closing the oldest of all
//!   would let a flood that reconnects faster than a client's first write (a client
//!   descheduled between its connect and its preface, on a loaded node) push that
//!   client out. A flood from one process now closes only its own connections.
//! - At most [`Limits::max_served`] handshaken connections are served. One more
//!   takes the place of the newest served connection of the process that holds the
//!   most, if that process holds at least two more than the newcomer's ([`evicted`]):
//!   the evicted connection's reads end and the server closes it (its client
//!   reconnects, and a Watch resumes). Otherwise the newcomer is closed at once
//!   (never left hanging). So a process that connects until the places run out takes
//!   them from itself, not from the others.
//! - A served connection with no stream open for [`Limits::idle_timeout`] is closed
//!   (a client's channel reconnects on its next call).
//! - Out of file descriptors, a handshaking connection is closed to make room (the same
//!   one); with none, a spare descriptor kept for this is given up to accept and end
//!   the next connection, whose descriptor is the spare from then on (so neither the
//!   kernel's backlog nor the accept loop is stuck).
//!
//! Each closing is counted in `plegd_api_connections_closed_total{reason}`.

use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;
use futures::{Stream, StreamExt as _};
use plegd_telemetry::spare_fd::{out_of_fds, SpareFd};
use plegd_telemetry::{ApiConnectionClose, Metrics};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};
use tokio_stream::StreamMap;
use tonic::transport::server::{Connected, UdsConnectInfo};

/// What every HTTP/2 connection starts with (RFC 9113 §3.4).
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Connections accepted in a row, at most, before the handshakes are looked at again.
const ACCEPT_BATCH: usize = 64;

/// Pause after a failed accept that closing nothing could help.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

/// What a client may hold of the API socket. See [`Limits::default`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// From accept to the end of the client preface.
    pub handshake_deadline: Duration,
    /// Connections waiting for their preface at once.
    pub max_handshaking: usize,
    /// Handshaken connections served at once.
    pub max_served: usize,
    /// A served connection with no stream open this long is closed.
    pub idle_timeout: Duration,
}

impl Default for Limits {
    /// A local client sends its preface with its connect: 5 s is ample on a loaded
    /// node. 64 handshaking places are more than the node's agents connect at once.
    /// 256 served connections (each with any number of streams) and 2 minutes idle:
    /// a node's agents keep a connection each, and one that calls once a minute keeps
    /// it. Together at most 320 descriptors, well under systemd's default 1,024.
    fn default() -> Self {
        Limits {
            handshake_deadline: Duration::from_secs(5),
            max_handshaking: 64,
            max_served: 256,
            idle_timeout: Duration::from_secs(120),
        }
    }
}

/// The served connections of `listener` (for tonic's `serve_with_incoming`). The
/// accept loop runs on the caller's runtime until the stream is dropped.
pub fn limited(
    listener: UnixListener,
    limits: Limits,
    metrics: Arc<Metrics>,
) -> impl Stream<Item = io::Result<Served>> + Send + 'static {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(accept_loop(listener, limits, metrics, tx));
    tokio_stream::wrappers::UnboundedReceiverStream::new(rx).map(Ok)
}

/// How a handshake ended.
enum Handshake {
    Done(UnixStream),
    TimedOut,
    BadPreface,
    Gone,
}

type Handshaking = Pin<Box<dyn Stream<Item = Handshake> + Send>>;

/// The process at the other end of a connection: its PID from the socket's
/// credentials (`SO_PEERCRED`, as it was at connect), `None` when the kernel gave
/// none.
type Peer = Option<i32>;

/// A handshaking connection: its arrival (the smaller, the older) and its peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Place {
    arrival: u64,
    peer: Peer,
}

/// Which handshaking connection to close to make room: the oldest of the peer that
/// holds the most places (of peers holding as many, the one whose oldest is
/// oldest); `None` if there is none.
fn evictee(places: impl IntoIterator<Item = Place>) -> Option<Place> {
    // Per peer: places held, and its oldest.
    let mut peers: Vec<(Peer, usize, Place)> = Vec::new();
    for place in places {
        match peers.iter_mut().find(|(peer, _, _)| *peer == place.peer) {
            Some((_, held, oldest)) => {
                *held += 1;
                if place.arrival < oldest.arrival {
                    *oldest = place;
                }
            }
            None => peers.push((place.peer, 1, place)),
        }
    }
    peers
        .into_iter()
        .min_by_key(|&(_, held, oldest)| (std::cmp::Reverse(held), oldest.arrival))
        .map(|(_, _, oldest)| oldest)
}

/// Which served connection a newcomer from `newcomer` takes the place of, every place
/// being held (`held`: each one's arrival and peer): the newest of the peer that holds
/// the most (of peers holding as many, the one whose newest is newest), if it holds at
/// least two more than the newcomer's peer; else none, and the newcomer is refused.
/// (One more would only move the excess from one to the other.)
fn evicted(held: impl IntoIterator<Item = Place>, newcomer: Peer) -> Option<Place> {
    // Per peer: places held, and its newest.
    let mut peers: Vec<(Peer, usize, Place)> = Vec::new();
    for place in held {
        match peers.iter_mut().find(|(peer, _, _)| *peer == place.peer) {
            Some((_, n, newest)) => {
                *n += 1;
                if place.arrival > newest.arrival {
                    *newest = place;
                }
            }
            None => peers.push((place.peer, 1, place)),
        }
    }
    let own = peers
        .iter()
        .find(|(peer, _, _)| *peer == newcomer)
        .map_or(0, |&(_, n, _)| n);
    peers
        .into_iter()
        .max_by_key(|&(_, n, newest)| (n, newest.arrival))
        .filter(|&(peer, n, _)| peer != newcomer && n >= own + 2)
        .map(|(_, _, newest)| newest)
}

/// The served places: who holds them, and how to end each.
#[derive(Default)]
struct ServedPlaces {
    held: Vec<(Place, Arc<Eviction>)>,
    next: u64,
}

/// A served connection's hold on its place, given back when the connection ends.
struct PlaceHold {
    places: Arc<Mutex<ServedPlaces>>,
    arrival: u64,
}

impl Drop for PlaceHold {
    fn drop(&mut self) {
        let mut places = self.places.lock().unwrap_or_else(|e| e.into_inner());
        places.held.retain(|(p, _)| p.arrival != self.arrival);
    }
}

/// Asks a served connection to end: its next read ends the stream.
#[derive(Default)]
struct Eviction {
    asked: std::sync::atomic::AtomicBool,
    waker: AtomicWaker,
}

impl Eviction {
    fn ask(&self) {
        self.asked.store(true, Ordering::SeqCst);
        self.waker.wake();
    }
}

/// A served place for a connection from `peer`: a free one, or one taken from the
/// peer [`evicted`] picks (whose place is free from now on, its connection asked to
/// end); None if neither.
fn take_place(
    places: &Arc<Mutex<ServedPlaces>>,
    peer: Peer,
    max: usize,
    metrics: &Metrics,
) -> Option<(PlaceHold, Arc<Eviction>)> {
    let mut guard = places.lock().unwrap_or_else(|e| e.into_inner());
    if guard.held.len() >= max {
        let victim = evicted(guard.held.iter().map(|(p, _)| *p), peer)?;
        if let Some(i) = guard.held.iter().position(|(p, _)| *p == victim) {
            let (_, eviction) = guard.held.swap_remove(i);
            eviction.ask();
            metrics.count_api_connection_closed(ApiConnectionClose::ServedEvicted);
        }
    }
    let arrival = guard.next;
    guard.next += 1;
    let eviction = Arc::new(Eviction::default());
    guard.held.push((Place { arrival, peer }, eviction.clone()));
    let hold = PlaceHold {
        places: places.clone(),
        arrival,
    };
    Some((hold, eviction))
}

async fn handshake(mut stream: UnixStream, deadline: Duration) -> Handshake {
    let mut got = [0u8; PREFACE.len()];
    match tokio::time::timeout(deadline, stream.read_exact(&mut got)).await {
        Err(_) => Handshake::TimedOut,
        Ok(Ok(_)) if &got == PREFACE => Handshake::Done(stream),
        Ok(Ok(_)) => Handshake::BadPreface,
        // Closed (or failed) by the client: nothing for plegd to close.
        Ok(Err(_)) => Handshake::Gone,
    }
}

async fn accept_loop(
    listener: UnixListener,
    limits: Limits,
    metrics: Arc<Metrics>,
    tx: mpsc::UnboundedSender<Served>,
) {
    let served = Arc::new(Mutex::new(ServedPlaces::default()));
    // Removing one drops (closes) it at once.
    let mut handshaking: StreamMap<Place, Handshaking> = StreamMap::new();
    let mut next_key = 0u64;
    let spare = SpareFd::open();
    let mut told = false;
    loop {
        tokio::select! {
            biased;
            () = tx.closed() => return,
            Some((key, outcome)) = handshaking.next(), if !handshaking.is_empty() => {
                // Ended: no longer handshaking (its stream would say so only when
                // next polled).
                handshaking.remove(&key);
                let stream = match outcome {
                    Handshake::Done(stream) => stream,
                    Handshake::TimedOut => {
                        metrics.count_api_connection_closed(ApiConnectionClose::HandshakeTimeout);
                        continue;
                    }
                    Handshake::BadPreface => {
                        metrics.count_api_connection_closed(ApiConnectionClose::BadPreface);
                        continue;
                    }
                    Handshake::Gone => continue,
                };
                let peer = stream.peer_cred().ok().and_then(|cred| cred.pid());
                let max = limits.max_served.max(1);
                let Some(place) = take_place(&served, peer, max, &metrics) else {
                    metrics.count_api_connection_closed(ApiConnectionClose::TooManyConnections);
                    continue;
                };
                let conn = Served::new(stream, place, limits.idle_timeout, metrics.clone());
                if tx.send(conn).is_err() {
                    return;
                }
            }
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    told = false;
                    admit(&mut handshaking, &mut next_key, stream, &limits, &metrics);
                    // Those already waiting too, a batch at a time: a flood is met at
                    // its own pace, and a client behind it is not left in the backlog.
                    for _ in 0..ACCEPT_BATCH {
                        match accept_now(&listener) {
                            Some(stream) => {
                                admit(&mut handshaking, &mut next_key, stream, &limits, &metrics)
                            }
                            None => break,
                        }
                    }
                }
                Err(e) if out_of_fds(&e) && make_room(&mut handshaking).is_some() => {
                    metrics.count_api_connection_closed(ApiConnectionClose::HandshakeEvicted);
                }
                Err(e) => {
                    if out_of_fds(&e) && spare.give_up() {
                        // Ended at once: its descriptor is the spare's again.
                        let took = accept_now(&listener).map(|stream| {
                            if let Ok(stream) = stream.into_std() {
                                spare.take_back(stream);
                            }
                        });
                        spare.restore();
                        if took.is_some() {
                            metrics.count_api_connection_closed(ApiConnectionClose::OutOfFds);
                            continue;
                        }
                    }
                    spare.restore();
                    if !told {
                        tracing::warn!(error = %e, "cannot accept an API connection; retrying");
                        told = true;
                    }
                    tokio::select! {
                        () = tx.closed() => return,
                        () = tokio::time::sleep(ACCEPT_RETRY) => {}
                    }
                }
            },
        }
    }
}

/// Closes the handshaking connection [`evictee`] picks, if any.
fn make_room(handshaking: &mut StreamMap<Place, Handshaking>) -> Option<Handshaking> {
    let place = evictee(handshaking.keys().copied())?;
    handshaking.remove(&place)
}

/// A new connection's handshake, in place of another if every place is taken.
fn admit(
    handshaking: &mut StreamMap<Place, Handshaking>,
    next_key: &mut u64,
    stream: UnixStream,
    limits: &Limits,
    metrics: &Metrics,
) {
    if handshaking.len() >= limits.max_handshaking.max(1) && make_room(handshaking).is_some() {
        metrics.count_api_connection_closed(ApiConnectionClose::HandshakeEvicted);
    }
    let place = Place {
        arrival: *next_key,
        peer: stream.peer_cred().ok().and_then(|cred| cred.pid()),
    };
    let deadline = limits.handshake_deadline;
    handshaking.insert(
        place,
        Box::pin(futures::stream::once(handshake(stream, deadline))),
    );
    *next_key += 1;
}

/// One accept that does not wait: the connection already waiting, if any (an error
/// is left for the next accept to see).
fn accept_now(listener: &UnixListener) -> Option<UnixStream> {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match listener.poll_accept(&mut cx) {
        Poll::Ready(Ok((stream, _))) => Some(stream),
        _ => None,
    }
}

/// Whether a served connection has a stream open, and since when it has none.
#[derive(Debug)]
pub struct Activity {
    open: AtomicUsize,
    idle_since: Mutex<Instant>,
}

impl Activity {
    fn new() -> Self {
        Activity {
            open: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
        }
    }

    /// A stream opened; it is open until the guard is dropped.
    pub fn begin(self: &Arc<Self>) -> StreamGuard {
        self.open.fetch_add(1, Ordering::SeqCst);
        StreamGuard(self.clone())
    }

    /// When the connection became idle; None while a stream is open.
    fn idle_since(&self) -> Option<Instant> {
        if self.open.load(Ordering::SeqCst) > 0 {
            return None;
        }
        Some(*self.idle_since.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// One open stream of a connection.
#[derive(Debug)]
pub struct StreamGuard(Arc<Activity>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        *self.0.idle_since.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What tonic puts in each request's extensions: the socket's peer, and the
/// connection's [`Activity`] (for [`crate::streams::StreamsLayer`], which puts the
/// [`UdsConnectInfo`] there too).
#[derive(Clone, Debug)]
pub struct ConnInfo {
    pub uds: UdsConnectInfo,
    pub activity: Arc<Activity>,
}

/// A handshaken connection, holding its served place; its preface (already read) is
/// read again by the server. Reads end (EOF) once it is idle for the idle timeout.
pub struct Served {
    stream: UnixStream,
    /// Bytes of [`PREFACE`] the server has read again.
    replayed: usize,
    activity: Arc<Activity>,
    idle_timeout: Duration,
    idle_check: Pin<Box<Sleep>>,
    reaped: bool,
    metrics: Arc<Metrics>,
    eviction: Arc<Eviction>,
    _place: PlaceHold,
}

impl Served {
    fn new(
        stream: UnixStream,
        (place, eviction): (PlaceHold, Arc<Eviction>),
        idle_timeout: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        Served {
            stream,
            replayed: 0,
            activity: Arc::new(Activity::new()),
            idle_timeout,
            idle_check: Box::pin(tokio::time::sleep(idle_timeout)),
            reaped: false,
            metrics,
            eviction,
            _place: place,
        }
    }

    /// True once the connection has had no stream open for the idle timeout; else
    /// the check is armed for when it could be.
    fn idle_expired(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            if self.idle_check.as_mut().poll(cx).is_pending() {
                return false;
            }
            let now = Instant::now();
            let next = match self.activity.idle_since() {
                Some(since) if now >= since + self.idle_timeout => return true,
                Some(since) => since + self.idle_timeout,
                None => now + self.idle_timeout,
            };
            self.idle_check.as_mut().reset(next);
        }
    }
}

impl Connected for Served {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        ConnInfo {
            uds: self.stream.connect_info(),
            activity: self.activity.clone(),
        }
    }
}

impl AsyncRead for Served {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.reaped {
            return Poll::Ready(Ok(()));
        }
        // Its place was given to another process's connection (counted there).
        self.eviction.waker.register(cx.waker());
        if self.eviction.asked.load(Ordering::SeqCst) {
            self.reaped = true;
            return Poll::Ready(Ok(()));
        }
        if self.replayed < PREFACE.len() {
            let rest = &PREFACE[self.replayed..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            self.replayed += n;
            return Poll::Ready(Ok(()));
        }
        // Whatever the client sent is read first: a request that came just before the
        // timeout opens a stream instead of being cut off.
        if let Poll::Ready(r) = Pin::new(&mut self.stream).poll_read(cx, buf) {
            return Poll::Ready(r);
        }
        if self.idle_expired(cx) {
            self.reaped = true;
            self.metrics
                .count_api_connection_closed(ApiConnectionClose::Idle);
            // The end of the stream: the server closes the connection.
            return Poll::Ready(Ok(()));
        }
        Poll::Pending
    }
}

impl AsyncWrite for Served {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{ErrorKind, Read as _, Write as _};
    use std::os::unix::net::UnixStream as StdStream;
    use std::sync::atomic::AtomicBool;
    use std::sync::mpsc as std_mpsc;
    use std::time::Instant as StdInstant;

    /// Generous: CI machines are slow and shared.
    const TIMEOUT: Duration = Duration::from_secs(20);

    fn short() -> Limits {
        Limits {
            handshake_deadline: Duration::from_millis(300),
            max_handshaking: 4,
            max_served: 2,
            idle_timeout: Duration::from_secs(30),
        }
    }

    /// `limited` on a socket, served from a thread of its own (as plegd serves it).
    /// Each served connection is read to its end; what it gave the server (preface
    /// included) comes on `served`. While `hold` is set, each new connection holds
    /// a stream open until `hold` is cleared.
    struct Running {
        _dir: tempfile::TempDir,
        path: std::path::PathBuf,
        metrics: Arc<Metrics>,
        served: std_mpsc::Receiver<Vec<u8>>,
        hold: Arc<AtomicBool>,
        /// Connections handed to the server so far.
        yielded: Arc<AtomicUsize>,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
    }

    impl Running {
        fn start(limits: Limits) -> Running {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("api.sock");
            let std_listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
            std_listener.set_nonblocking(true).unwrap();
            let metrics = Arc::new(Metrics::new());
            let hold = Arc::new(AtomicBool::new(false));
            let (tx, served) = std_mpsc::channel();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let yielded = Arc::new(AtomicUsize::new(0));
            let (m, h, y) = (metrics.clone(), hold.clone(), yielded.clone());
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let listener = UnixListener::from_std(std_listener).unwrap();
                    let mut incoming = Box::pin(limited(listener, limits, m));
                    let serving = async {
                        while let Some(Ok(mut conn)) = incoming.next().await {
                            y.fetch_add(1, Ordering::SeqCst);
                            let tx = tx.clone();
                            let info = conn.connect_info();
                            let guard = h.load(Ordering::SeqCst).then(|| info.activity.begin());
                            let h = h.clone();
                            tokio::spawn(async move {
                                let mut got = Vec::new();
                                let mut buf = [0u8; 64];
                                let mut guard = guard;
                                loop {
                                    if guard.is_some() && !h.load(Ordering::SeqCst) {
                                        guard = None;
                                    }
                                    let read = tokio::time::timeout(
                                        Duration::from_millis(20),
                                        conn.read(&mut buf),
                                    );
                                    match read.await {
                                        Err(_) => continue,
                                        Ok(Ok(0)) | Ok(Err(_)) => break,
                                        Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
                                    }
                                }
                                // Its place is free before the test hears of it.
                                drop(conn);
                                let _ = tx.send(got);
                            });
                        }
                    };
                    tokio::select! {
                        () = serving => {}
                        _ = stopped => {}
                    }
                });
            });
            Running {
                _dir: dir,
                path,
                metrics,
                served,
                hold,
                yielded,
                stop: Some(stop),
            }
        }

        fn connect(&self) -> StdStream {
            let s = StdStream::connect(&self.path).unwrap();
            s.set_read_timeout(Some(TIMEOUT)).unwrap();
            s
        }

        /// Waits until `n` connections have been handed to the server.
        fn wait_yielded(&self, n: usize) {
            let deadline = StdInstant::now() + TIMEOUT;
            while self.yielded.load(Ordering::SeqCst) < n {
                assert!(StdInstant::now() < deadline, "{n} not served");
                std::thread::sleep(Duration::from_millis(5));
            }
        }

        /// Waits until `n` connections were counted closed for `reason` (counted just
        /// after they are closed), and not more.
        fn assert_closed(&self, reason: ApiConnectionClose, n: u64) {
            let deadline = StdInstant::now() + TIMEOUT;
            while self.metrics.api_connections_closed(reason) < n {
                assert!(StdInstant::now() < deadline, "{reason}: not {n}");
                std::thread::sleep(Duration::from_millis(5));
            }
            assert_eq!(self.metrics.api_connections_closed(reason), n, "{reason}");
        }
    }

    impl Drop for Running {
        fn drop(&mut self) {
            if let Some(stop) = self.stop.take() {
                let _ = stop.send(());
            }
        }
    }

    /// Waits until the server closes `s`; how long that took.
    fn closed_after(s: &mut StdStream) -> Duration {
        let start = StdInstant::now();
        let mut buf = [0u8; 64];
        loop {
            match s.read(&mut buf) {
                Ok(0) => return start.elapsed(),
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return start.elapsed(),
                Err(e) => panic!("still open after {:?}: {e}", start.elapsed()),
            }
        }
    }

    #[test]
    fn silent_connections_end_at_the_deadline_and_the_oldest_make_room_for_new_ones() {
        let server = Running::start(short());
        let mut silent: Vec<StdStream> = (0..10).map(|_| server.connect()).collect();
        // The six oldest were closed to make room, at once.
        for s in &mut silent[..6] {
            assert!(closed_after(s) < Duration::from_secs(2));
        }
        // The four newest, at the deadline.
        for s in &mut silent[6..] {
            assert!(closed_after(s) < short().handshake_deadline + Duration::from_secs(2));
        }
        server.assert_closed(ApiConnectionClose::HandshakeEvicted, 6);
        server.assert_closed(ApiConnectionClose::HandshakeTimeout, 4);
        // A client that sends its preface is served, though four silent ones hold
        // every handshake place.
        let _held: Vec<StdStream> = (0..4).map(|_| server.connect()).collect();
        let mut client = server.connect();
        client.write_all(PREFACE).unwrap();
        client.write_all(b"more").unwrap();
        client.shutdown(std::net::Shutdown::Write).unwrap();
        let got = server.served.recv_timeout(TIMEOUT).unwrap();
        assert_eq!(
            got,
            [&PREFACE[..], b"more"].concat(),
            "the preface is read again"
        );
    }

    fn place(arrival: u64, peer: i32) -> Place {
        Place {
            arrival,
            peer: Some(peer),
        }
    }

    #[test]
    fn the_oldest_place_of_the_peer_holding_most_makes_room() {
        assert_eq!(evictee([]), None);
        // One peer: its oldest, whatever the order.
        assert_eq!(
            evictee([place(7, 1), place(3, 1), place(9, 1)]),
            Some(place(3, 1))
        );
        // A client's one place, older than all of a flood's: the flood's oldest.
        let mut places = vec![place(0, 42)];
        places.extend((1..64).map(|a| place(a, 7)));
        assert_eq!(evictee(places), Some(place(1, 7)));
        // Peers holding as many: the one whose oldest is oldest.
        assert_eq!(
            evictee([place(5, 1), place(2, 2), place(6, 1), place(8, 2)]),
            Some(place(2, 2))
        );
        // Peers the kernel named no PID for are one peer.
        let unknown = |arrival| Place {
            arrival,
            peer: None,
        };
        assert_eq!(
            evictee([place(0, 1), unknown(4), unknown(3)]),
            Some(unknown(3))
        );
    }

    #[test]
    fn a_served_place_is_taken_from_a_peer_holding_two_more_than_the_newcomers() {
        assert_eq!(evicted([], Some(1)), None);
        // A flood of 256 from one process: a newcomer from another takes its newest.
        let flood: Vec<_> = (0..256).map(|a| place(a, 7)).collect();
        assert_eq!(evicted(flood.clone(), Some(42)), Some(place(255, 7)));
        // The flood's own newcomer takes nothing: it would only take from itself.
        assert_eq!(evicted(flood.clone(), Some(7)), None);
        // Evened out to within one: refused (a move would only swap the excess).
        let even = [place(0, 1), place(1, 2), place(2, 1)];
        assert_eq!(evicted(even, Some(2)), None);
        assert_eq!(
            evicted([place(0, 1), place(1, 1), place(2, 2)], Some(2)),
            None
        );
        assert_eq!(
            evicted(
                [place(0, 1), place(1, 1), place(2, 1), place(3, 2)],
                Some(2)
            ),
            Some(place(2, 1))
        );
        // Peers holding as many: the one whose newest is newest.
        assert_eq!(
            evicted(
                [place(5, 1), place(2, 2), place(6, 1), place(8, 2)],
                Some(3)
            ),
            Some(place(8, 2))
        );
        // Peers the kernel named no PID for are one peer.
        let unknown = |arrival| Place {
            arrival,
            peer: None,
        };
        assert_eq!(evicted([unknown(4), unknown(3)], Some(1)), Some(unknown(4)));
        assert_eq!(evicted([unknown(4), unknown(3)], None), None);
    }

    #[test]
    fn other_first_bytes_are_closed_at_once() {
        let server = Running::start(short());
        let mut s = server.connect();
        s.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        assert!(closed_after(&mut s) < Duration::from_secs(2));
        server.assert_closed(ApiConnectionClose::BadPreface, 1);
        assert!(server.served.try_recv().is_err());
    }

    #[test]
    fn a_handshaken_connection_beyond_the_served_places_is_closed_at_once() {
        let server = Running::start(short());
        server.hold.store(true, Ordering::SeqCst);
        let served: Vec<StdStream> = (0..2)
            .map(|i| {
                let mut s = server.connect();
                s.write_all(PREFACE).unwrap();
                server.wait_yielded(i + 1);
                s
            })
            .collect();
        let mut third = server.connect();
        third.write_all(PREFACE).unwrap();
        assert!(closed_after(&mut third) < Duration::from_secs(2));
        server.assert_closed(ApiConnectionClose::TooManyConnections, 1);
        // A place freed is a place a new client gets.
        drop(served);
        for _ in 0..2 {
            server.served.recv_timeout(TIMEOUT).unwrap();
        }
        let mut fourth = server.connect();
        fourth.write_all(PREFACE).unwrap();
        fourth.shutdown(std::net::Shutdown::Write).unwrap();
        assert_eq!(server.served.recv_timeout(TIMEOUT).unwrap(), PREFACE);
    }

    #[test]
    fn a_served_connection_is_closed_once_idle_for_the_timeout_and_never_with_a_stream_open() {
        let idle = Duration::from_millis(300);
        let server = Running::start(Limits {
            idle_timeout: idle,
            ..short()
        });
        // No stream: closed after the idle timeout.
        let mut s = server.connect();
        s.write_all(PREFACE).unwrap();
        let took = closed_after(&mut s);
        assert!(took >= idle - Duration::from_millis(50), "{took:?}");
        assert!(took < idle + Duration::from_secs(2), "{took:?}");
        server.assert_closed(ApiConnectionClose::Idle, 1);
        // A stream open for five timeouts: kept; closed one timeout after it ends.
        server.hold.store(true, Ordering::SeqCst);
        let mut s = server.connect();
        s.write_all(PREFACE).unwrap();
        s.set_read_timeout(Some(idle * 5)).unwrap();
        let mut buf = [0u8; 8];
        let err = s.read(&mut buf).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::WouldBlock, "still open");
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        server.hold.store(false, Ordering::SeqCst);
        let took = closed_after(&mut s);
        assert!(took >= idle - Duration::from_millis(50), "{took:?}");
        server.assert_closed(ApiConnectionClose::Idle, 2);
    }
}
