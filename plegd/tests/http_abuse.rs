//! Clients of the metrics port (bound to 0.0.0.0 in the DaemonSet, so
//! any pod is one) must not be able to keep plegd from stopping or starve it of file
//! descriptors. A half-sent request kept SIGTERM from ever completing (only SIGKILL
//! worked), and every half-open connection held a descriptor for ever.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Stdio;
use std::time::{Duration, Instant};

use plegd_sim::{spawn_in_thread, FakeRuntime, Op};

use integration_tests::process::{
    command, command_with_fd_limit, free_port, http_get, signal, wait_exit, wait_until, Reaped,
};

/// The binary under test.
fn plegd() -> std::process::Command {
    command(env!("CARGO_BIN_EXE_plegd"))
}

/// The binary under test with a soft open-files limit.
fn plegd_with_fd_limit(soft: usize) -> std::process::Command {
    command_with_fd_limit(env!("CARGO_BIN_EXE_plegd"), soft)
}

/// `--runtime-request-timeout` in these tests.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// README "Shutdown guarantees": one request timeout + 0.7 s for the relist in
/// progress, + 0.25 s for the output to drain.
const DOCUMENTED_BOUND: Duration = Duration::from_millis(1000 + 700 + 250);
/// Process start-up/exit and this test's polling on a shared, busy machine.
const SLACK: Duration = Duration::from_millis(1500);
/// The server's header read timeout (telemetry's `Limits::default()`), which also
/// bounds a kept-alive connection's idle time.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The server's connection bound (telemetry's `Limits::default()`).
const MAX_CONNECTIONS: usize = 64;

/// plegd run over a simulated runtime, with the metrics endpoint on a free port, run
/// through `sh` so that a soft descriptor limit can be set (`ulimit -Sn`).
fn start(sock: &std::path::Path, fd_limit: Option<usize>) -> (Reaped, u16) {
    let port = free_port();
    let endpoint = format!("unix://{}", sock.display());
    let metrics = format!("127.0.0.1:{port}");
    let timeout = format!("{}s", REQUEST_TIMEOUT.as_secs());
    let args = [
        "run",
        "--runtime-endpoint",
        &endpoint,
        "--metrics-addr",
        &metrics,
        "--relist-period",
        "100ms",
        "--runtime-request-timeout",
        &timeout,
    ];
    let mut command = match fd_limit {
        Some(n) => plegd_with_fd_limit(n),
        None => plegd(),
    };
    let child = Reaped(
        command
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until("plegd to be ready", || {
        http_get(port, "/readyz").map(|r| r.0) == Some(200)
    });
    (child, port)
}

/// A connection that sent a request line and nothing more (no blank line).
fn half_sent(port: u16) -> std::io::Result<TcpStream> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    s.write_all(b"GET /metrics HTTP/1.1\r\n")?;
    Ok(s)
}

fn open_fds(child: &Reaped) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", child.0.id()))
        .map(|d| d.count())
        .unwrap_or(0)
}

fn stop_within_bound(mut child: Reaped, what: &str) -> Duration {
    signal(&child.0, "TERM");
    let (status, took) = wait_exit(&mut child.0);
    println!("{what}: SIGTERM to exit {took:?}");
    assert!(status.success(), "{what}: {status:?}");
    assert!(
        took <= DOCUMENTED_BOUND + SLACK,
        "{what}: SIGTERM to exit took {took:?}"
    );
    took
}

#[test]
fn a_half_sent_request_does_not_hold_up_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("cri.sock");
    let _server = spawn_in_thread(&sock, FakeRuntime::new()).unwrap();
    let (child, port) = start(&sock, None);
    let mut conn = half_sent(port).unwrap();
    // Long before the header read timeout would close it: shutdown itself must not
    // wait for it.
    stop_within_bound(child, "half-sent request");
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut rest = Vec::new();
    // Closed, not left hanging: EOF, or a reset when plegd exited before it had read
    // the half-sent bytes (the kernel answers unread data at close with RST). Only a
    // read that times out means the connection outlived plegd.
    match conn.read_to_end(&mut rest) {
        Ok(_) => {}
        Err(e) => assert!(
            !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
            "the connection is closed, not left hanging: {e}"
        ),
    }
}

#[test]
fn a_half_sent_request_is_closed_after_the_header_read_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("cri.sock");
    let _server = spawn_in_thread(&sock, FakeRuntime::new()).unwrap();
    let (child, port) = start(&sock, None);
    let mut conn = half_sent(port).unwrap();
    let sent = Instant::now();
    conn.set_read_timeout(Some(HEADER_READ_TIMEOUT * 3))
        .unwrap();
    let mut response = String::new();
    let closed = conn.read_to_string(&mut response);
    let took = sent.elapsed();
    println!("half-sent request closed after {took:?}: {response:?}");
    assert!(closed.is_ok(), "still open after {took:?}: {closed:?}");
    assert!(
        took <= HEADER_READ_TIMEOUT + SLACK,
        "closed only after {took:?}"
    );
    stop_within_bound(child, "after a header timeout");
}

/// Outcome of a GET on a fresh connection while the port is flooded: answered, or
/// refused cleanly (a 503 or a closed connection), and quickly either way.
fn fresh_healthz(port: u16) -> (Option<u16>, Duration) {
    let start = Instant::now();
    let got = http_get(port, "/healthz");
    (got.map(|r| r.0), start.elapsed())
}

#[test]
fn a_flood_of_half_open_connections_neither_starves_nor_stops_plegd() {
    // As many as this test process can hold, up to 2,000; plegd gets about half of
    // that as its soft descriptor limit (systemd's default soft limit is 1,024), so
    // an unbounded server would run out of descriptors.
    let ours = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|t| {
            let line = t.lines().find(|l| l.starts_with("Max open files"))?;
            line.split_whitespace().nth(3)?.parse::<usize>().ok()
        })
        .unwrap_or(1024);
    let flood = 2000.min(ours.saturating_sub(100));
    let plegd_limit = (flood / 2).max(MAX_CONNECTIONS * 4);
    assert!(
        flood > plegd_limit,
        "this process may open only {ours} files"
    );

    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("cri.sock");
    let sim = FakeRuntime::new();
    let sb = sim.run_pod("uid-1", "web", "prod");
    sim.run_container(&sb, "app");
    let server = spawn_in_thread(&sock, sim.clone()).unwrap();
    let (child, port) = start(&sock, Some(plegd_limit));
    let baseline = open_fds(&child);

    let mut held = Vec::new();
    // A connect can time out when the flood outpaces plegd's accept loop (the
    // kernel's accept queue overflows on a busy machine): a few are tolerated. An
    // endpoint that stopped accepting fails five in a row.
    let mut failed = 0;
    let flooding = Instant::now();
    let mut in_a_row = 0;
    while held.len() < flood && in_a_row < 5 {
        match half_sent(port) {
            Ok(s) => {
                held.push(s);
                in_a_row = 0;
            }
            Err(_) => {
                failed += 1;
                in_a_row += 1;
            }
        }
    }
    let fds = open_fds(&child);
    println!(
        "{} half-open connections in {:?} ({failed} failed); plegd fds {baseline} -> {fds} \
         (soft limit {plegd_limit})",
        held.len(),
        flooding.elapsed()
    );
    assert!(
        fds <= baseline + MAX_CONNECTIONS + 8,
        "plegd holds {fds} descriptors (baseline {baseline})"
    );
    assert!(
        held.len() > plegd_limit,
        "the flood ({}) outgrows plegd's descriptor limit",
        held.len()
    );

    // Relists go on.
    let lists = sim.calls(Op::ListSandboxes);
    wait_until("relists during the flood", || {
        sim.calls(Op::ListSandboxes) >= lists + 3
    });
    // A fresh probe is answered or refused, at once either way.
    let (code, took) = fresh_healthz(port);
    println!("fresh /healthz during the flood: {code:?} in {took:?}");
    assert!(matches!(code, None | Some(200) | Some(503)), "{code:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");

    // The runtime restarts: plegd needs a new descriptor for its CRI connection.
    server.stop();
    let server = spawn_in_thread(&sock, sim.clone()).unwrap();
    let lists = sim.calls(Op::ListSandboxes);
    wait_until("relists after a runtime restart during the flood", || {
        sim.calls(Op::ListSandboxes) >= lists + 3
    });
    // The flood is still held by its clients, but the server closed them after the
    // header read timeout: a fresh probe is answered again.
    wait_until("/healthz answering during a held flood", || {
        fresh_healthz(port).0 == Some(200)
    });
    assert!(open_fds(&child) <= baseline + MAX_CONNECTIONS + 8);

    // And a new flood does not hold up SIGTERM.
    drop(held);
    let held: Vec<_> = (0..MAX_CONNECTIONS * 2)
        .filter_map(|_| half_sent(port).ok())
        .collect();
    stop_within_bound(child, "flood of half-open connections");
    drop(held);
    drop(server);
}
