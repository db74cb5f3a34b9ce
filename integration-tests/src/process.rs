//! Testing plegd as a process (the binary's tests in plegd/tests): starting it,
//! signalling it, waiting for its exit or for a condition, a free port, a one-shot
//! HTTP GET. The binary's path comes from the caller (`env!("CARGO_BIN_EXE_plegd")`
//! exists only in the plegd package).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Generous: CI machines are slow and shared.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// The binary at `path`, logging at info, with the subscriber API off unless the
/// test gives `--api-socket`: `plegd run`'s default socket is the node's
/// (/run/plegd/plegd.sock), which concurrent tests (or a real plegd) would contend for.
pub fn command(path: &str) -> Command {
    let mut c = Command::new(path);
    c.env("RUST_LOG", "info").env("PLEGD_API_SOCKET", "off");
    c
}

/// The binary under test with a soft limit on its open files (as systemd's default
/// 1,024 would be), set by `sh`, which then execs plegd: the child's pid is plegd's.
pub fn command_with_fd_limit(path: &str, soft: usize) -> Command {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg(format!("ulimit -Sn {soft} && exec \"$0\" \"$@\""))
        .arg(path)
        .env("RUST_LOG", "info")
        .env("PLEGD_API_SOCKET", "off");
    c
}

/// A running child that is killed and reaped when dropped, so that a failed assertion
/// leaves no plegd behind.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Sends `sig` (a name `kill` knows: TERM, INT, HUP, ...) to the child.
pub fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
}

/// Waits for exit; returns the status and how long it took.
pub fn wait_exit(child: &mut Child) -> (std::process::ExitStatus, Duration) {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return (st, start.elapsed());
        }
        if start.elapsed() >= TIMEOUT {
            // Not left running behind a failed test.
            let _ = child.kill();
            let _ = child.wait();
            panic!("plegd did not stop within {TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Polls `cond` until it holds; panics with `what` after [`TIMEOUT`].
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One GET on a fresh connection: the status code and the whole response, or None
/// if the connection failed, was refused or closed without a response.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    // A server that stopped accepting would leave a plain connect hanging for minutes.
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    let code = body.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body))
}
