//! No local client keeps another out of the subscriber API, with the real binary: a
//! flood of silent connections (a thousand held, and reconnected as fast as plegd
//! closes them) leaves a new client served within the handshake deadline and `plegd
//! pods` answering; a client slow to send its preface keeps its place against another
//! process's flood; with plegd out of file descriptors, `/healthz` still answers.

use std::io::Write as _;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use integration_tests::process::{
    self, command, command_with_fd_limit, free_port, http_get, wait_until, Reaped, TIMEOUT,
};
use plegd_testkit::metrics::Scrape;

/// Each test here exhausts something on purpose (the CPU with a flood that connects
/// as fast as it can, plegd's descriptors): run side by side on two cores, one
/// test's flood starves the other's clients, which then measure the machine and not
/// plegd. They take turns.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn take_turn() -> MutexGuard<'static, ()> {
    // A test that failed holding the turn poisons it; the next may still run.
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// plegd's handshake deadline (README, "Subscriber API").
const HANDSHAKE_DEADLINE: Duration = Duration::from_secs(5);

fn plegd_bin() -> &'static str {
    env!("CARGO_BIN_EXE_plegd")
}

/// `plegd demo` with its API at `socket` and its endpoint on `port`; its log goes to
/// [`log_of`]`(socket)`.
fn demo(mut cmd: std::process::Command, socket: &Path, port: u16) -> Reaped {
    let log = std::fs::File::create(log_of(socket)).unwrap();
    let child = cmd
        .args([
            "demo",
            "--node-name",
            "flood-node",
            "--relist-period",
            "200ms",
        ])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .arg("--api-socket")
        .arg(socket)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    wait_until("the API socket", || socket.exists());
    wait_until("the endpoint", || http_get(port, "/healthz").is_some());
    Reaped(child)
}

/// Where [`demo`] writes the log of the plegd serving `socket`.
fn log_of(socket: &Path) -> PathBuf {
    socket.with_extension("log")
}

/// This process's soft limit on open files, raised to `at_least` if lower (with
/// util-linux's prlimit, as the hard limit allows).
fn ensure_fd_limit(at_least: u64) {
    let soft = || -> u64 {
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
        let line = limits
            .lines()
            .find(|l| l.starts_with("Max open files"))
            .unwrap();
        line.split_whitespace().nth(3).unwrap().parse().unwrap()
    };
    if soft() < at_least {
        let ok = std::process::Command::new("prlimit")
            .args(["--pid", &std::process::id().to_string()])
            .arg(format!("--nofile={at_least}:"))
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok && soft() >= at_least,
            "cannot raise the open files limit to {at_least}"
        );
    }
}

/// Silent connections to `socket`: `held` of them opened first and kept open (by
/// the client) for as long as the flood lasts; then, until dropped, new ones opened
/// one after another as fast as they connect, each kept until `ring` more have been.
struct Flood {
    _held: Vec<UnixStream>,
    stop: Arc<AtomicBool>,
    connects: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Flood {
    fn start(socket: &Path, held: usize, ring: usize) -> Flood {
        let held: Vec<UnixStream> = (0..held)
            .map(|i| UnixStream::connect(socket).unwrap_or_else(|e| panic!("connection {i}: {e}")))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let connects = Arc::new(AtomicU64::new(held.len() as u64));
        let (s, c, socket) = (stop.clone(), connects.clone(), socket.to_path_buf());
        let thread = std::thread::spawn(move || {
            let mut conns = std::collections::VecDeque::new();
            while !s.load(Ordering::SeqCst) {
                if let Ok(conn) = UnixStream::connect(&socket) {
                    conns.push_back(conn);
                    if conns.len() > ring {
                        conns.pop_front();
                    }
                    c.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        Flood {
            _held: held,
            stop,
            connects,
            thread: Some(thread),
        }
    }

    /// Waits until the flood has made `n` more connections.
    fn wait_for_more(&self, n: u64) {
        let from = self.connects.load(Ordering::SeqCst);
        wait_until("the flood's connections", || {
            self.connects.load(Ordering::SeqCst) >= from + n
        });
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A new tonic client's ListPods, from its connect: the pods and how long it took.
fn list_pods(socket: &Path) -> (Result<usize, String>, Duration) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let start = Instant::now();
    let socket = socket.to_path_buf();
    let answer = rt.block_on(async move {
        let call = async {
            let mut client = plegd_api::connect(&socket)
                .await
                .map_err(|e| e.to_string())?;
            client
                .list_pods(plegd_api::v1::ListPodsRequest {})
                .await
                .map(|r| r.into_inner().pods.len())
                .map_err(|s| s.to_string())
        };
        tokio::time::timeout(TIMEOUT, call)
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {TIMEOUT:?}")))
    });
    (answer, start.elapsed())
}

fn run_to_end(args: &[&str], socket: &Path) -> (Output, Duration) {
    process::run_to_end(
        command(plegd_bin())
            .args(args)
            .arg("--api-socket")
            .arg(socket),
    )
}

/// `name{reason="reason"}` on /metrics.
fn closed(port: u16, reason: &str) -> u64 {
    let (_, response) = http_get(port, "/metrics").expect("/metrics answers");
    let name = "plegd_api_connections_closed_total";
    let label = format!("reason=\"{reason}\"");
    Scrape::from_response(&response)
        .and_then(|m| m.count(name, &[&label]))
        .unwrap_or_else(|| panic!("no {name}{{{label}}} in /metrics"))
}

fn temp_socket() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("plegd.sock");
    (dir, socket)
}

#[test]
fn a_thousand_silent_connections_keep_no_client_out() {
    let _turn = take_turn();
    ensure_fd_limit(4096);
    let (_dir, socket) = temp_socket();
    let port = free_port();
    let _plegd = demo(command(plegd_bin()), &socket, port);
    wait_until(
        "the demo's pods",
        || matches!(list_pods(&socket).0, Ok(n) if n > 0),
    );

    let flood = Flood::start(&socket, 1000, 100);
    flood.wait_for_more(1000);
    for round in 0..3 {
        // The client is another process: plegd makes room by closing the flooding
        // process's own connections, and this test's process is that one.
        let (out, took) = run_to_end(&["pods"], &socket);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "round {round}: {err}");
        let listing = String::from_utf8_lossy(&out.stdout);
        assert!(listing.starts_with("NAMESPACE"), "round {round}: {listing}");
        assert!(
            listing.lines().count() > 1,
            "round {round}: no pod: {listing}"
        );
        assert!(took < HANDSHAKE_DEADLINE, "round {round}: {took:?}");
        flood.wait_for_more(200);
    }
    // The flood's connections were closed to make room, and counted.
    // Of the thousand held, all but the 64 newest at most were closed at once.
    let evicted = closed(port, "handshake_evicted");
    println!(
        "{} flood connections, {evicted} closed to make room",
        flood.connects.load(Ordering::SeqCst)
    );
    assert!(evicted >= 1000 - 64, "{evicted}");
    drop(flood);
    // Silent connections left alone end at the deadline.
    let timed_out = closed(port, "handshake_timeout");
    let held: Vec<UnixStream> = (0..10)
        .map(|_| UnixStream::connect(&socket).unwrap())
        .collect();
    let since = Instant::now();
    wait_until("the silent connections to time out", || {
        closed(port, "handshake_timeout") >= timed_out + 10
    });
    assert!(since.elapsed() >= HANDSHAKE_DEADLINE - Duration::from_millis(100));
    drop(held);
}

/// Silent connections to `socket` from another process (python3's standard library:
/// a flood is any program), opened one after another as fast as they connect, each
/// kept until 100 more have been; until killed.
fn flood_from_another_process(socket: &Path) -> Reaped {
    const FLOOD: &str = r#"
import collections, socket, sys
ring = collections.deque()
while True:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(sys.argv[1])
    except OSError:
        s.close()
        continue
    ring.append(s)
    if len(ring) > 100:
        ring.popleft().close()
"#;
    let child = std::process::Command::new("python3")
        .args(["-c", FLOOD])
        .arg(socket)
        .stdout(Stdio::null())
        .spawn()
        .expect("python3 runs (scripts/conformance-tools.sh needs it too)");
    Reaped(child)
}

/// Regression: one process that opened 256 connections (each handshaken, as a
/// client with a Watch on each holds them) kept every other client out until its
/// connections ended. Now a newcomer from another process takes the place of the
/// flood's newest.
#[test]
fn a_process_holding_every_served_place_gives_one_up_to_another_client() {
    const HOLD: &str = r#"
import socket, sys, time
hello = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
held = []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    s.sendall(hello)
    held.append(s)
time.sleep(3600)
"#;
    let _turn = take_turn();
    let (_dir, socket) = temp_socket();
    let port = free_port();
    let _plegd = demo(command(plegd_bin()), &socket, port);
    let refused = || closed(port, "too_many_connections") + closed(port, "handshake_evicted");
    let before = refused();
    let _hold = Reaped(
        std::process::Command::new("python3")
            .args(["-c", HOLD])
            .arg(&socket)
            .arg("300")
            .stdout(Stdio::null())
            .spawn()
            .expect("python3 runs (scripts/conformance-tools.sh needs it too)"),
    );
    // 256 served; the holder's 44 more were closed (it takes nothing from itself;
    // some, 64 waiting for their handshake at once, made room for its next).
    wait_until("every served place taken", || refused() >= before + 44);
    let evicted = closed(port, "served_evicted");
    let (answer, took) = list_pods(&socket);
    assert!(answer.is_ok(), "{answer:?} after {took:?}");
    assert_eq!(closed(port, "served_evicted"), evicted + 1);
}

/// A client that connects and then, descheduled or slow, sends nothing for a while
/// keeps its handshake place against a flood from another process that reconnects
/// far faster: the flood's own connections make room for the flood.
#[test]
fn a_client_slow_to_send_its_preface_keeps_its_place_against_another_process_flood() {
    let _turn = take_turn();
    let (_dir, socket) = temp_socket();
    let port = free_port();
    let _plegd = demo(command(plegd_bin()), &socket, port);
    let mut client = UnixStream::connect(&socket).unwrap();
    let evicted = closed(port, "handshake_evicted");
    let _flood = flood_from_another_process(&socket);
    // Far more than the 64 handshake places have been taken from the flood since the
    // client connected (each closing was one of the flood's made room).
    wait_until("the flood to take 2,000 places", || {
        closed(port, "handshake_evicted") >= evicted + 2000
    });
    client.write_all(PREFACE).unwrap();
    // Served: plegd's first frame is its SETTINGS (RFC 9113 §3.4), not the end of the
    // connection.
    client.set_read_timeout(Some(TIMEOUT)).unwrap();
    let mut head = [0u8; 9];
    std::io::Read::read_exact(&mut client, &mut head)
        .unwrap_or_else(|e| panic!("the client's connection was closed: {e}"));
    assert_eq!(head[3], 0x4, "a SETTINGS frame: {head:?}");
}

/// plegd's descriptors are counted, and its soft limit set a few above them: the
/// silent connections alone take all that is left.
#[test]
fn healthz_answers_while_plegd_is_out_of_file_descriptors() {
    let _turn = take_turn();
    let (_dir, socket) = temp_socket();
    let port = free_port();
    // What plegd demo opens of itself, with a margin: a first run counts them.
    let base = steady_fds(port);
    // Fewer than the 64 handshake places: the flood alone runs plegd out.
    let limit = base + 16;
    let port = free_port();
    let plegd = demo(command_with_fd_limit(plegd_bin(), limit), &socket, port);
    let flood = Flood::start(&socket, 200, 50);
    flood.wait_for_more(200);
    wait_until("plegd to run out of descriptors", || {
        fds_of(plegd.0.id()) + 2 >= limit
    });
    for round in 0..10 {
        let start = Instant::now();
        let answer = http_get(port, "/healthz");
        let took = start.elapsed();
        let (code, body) = answer.unwrap_or_else(|| {
            panic!(
                "round {round}: no answer after {took:?}; plegd's log:\n{}",
                std::fs::read_to_string(log_of(&socket)).unwrap_or_default()
            )
        });
        assert_eq!(code, 200, "round {round}: {body}");
        flood.wait_for_more(20);
    }
    assert!(http_get(port, "/readyz").is_some_and(|(code, _)| code == 200));
    // The API's accept loop made room by closing the oldest silent connections.
    assert!(closed(port, "handshake_evicted") >= 1);
    drop(flood);
    // And a client is served once the flood ends.
    let (answer, _) = list_pods(&socket);
    answer.unwrap();
}

/// Out of descriptors with nothing plegd may close: connections that sent their
/// preface are served (and stay, idle, for minutes). The endpoint serves a probe with
/// its spare descriptor, and the API's accept loop closes what waits in its backlog
/// with its own.
#[test]
fn healthz_answers_while_served_connections_take_every_descriptor() {
    let _turn = take_turn();
    let (_dir, socket) = temp_socket();
    let port = free_port();
    let base = steady_fds(port);
    let limit = base + 16;
    let port = free_port();
    let plegd = demo(command_with_fd_limit(plegd_bin(), limit), &socket, port);
    let mut held: Vec<UnixStream> = Vec::new();
    for _ in 0..40 {
        let mut s = UnixStream::connect(&socket).unwrap();
        s.write_all(PREFACE).unwrap();
        held.push(s);
    }
    wait_until("plegd to run out of descriptors", || {
        fds_of(plegd.0.id()) + 2 >= limit
    });
    for round in 0..5 {
        let start = Instant::now();
        let answer = http_get(port, "/healthz");
        let took = start.elapsed();
        let (code, body) = answer.unwrap_or_else(|| {
            panic!(
                "round {round}: no answer after {took:?}; plegd's log:\n{}",
                std::fs::read_to_string(log_of(&socket)).unwrap_or_default()
            )
        });
        assert_eq!(code, 200, "round {round}: {body}");
    }
    // Those left in the backlog were accepted and closed, not left hanging.
    wait_until("the backlog to be closed", || {
        closed(port, "out_of_fds") >= 1
    });
    drop(held);
}

/// The descriptors `plegd demo` holds once it serves (its runtime connected, its
/// relists and API answering); `port` is free for it.
fn steady_fds(port: u16) -> usize {
    let (_dir, socket) = temp_socket();
    let plegd = demo(command(plegd_bin()), &socket, port);
    wait_until(
        "the demo's pods",
        || matches!(list_pods(&socket).0, Ok(n) if n > 0),
    );
    fds_of(plegd.0.id())
}

/// What an HTTP/2 client sends first.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The descriptors process `pid` has open.
fn fds_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}
