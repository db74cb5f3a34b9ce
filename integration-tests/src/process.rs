//! Testing plegd as a process (the binary's tests in plegd/tests): starting it,
//! signalling it, waiting for its exit or for a condition, running it to its end.
//! The binary's path comes from the caller (`env!("CARGO_BIN_EXE_plegd")` exists only
//! in the plegd package). The child stopped on drop, the one-shot HTTP GET and the
//! `/proc` reads are the test kit's (`plegd_testkit::process`), shared with the
//! benchmark.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub use plegd_testkit::process::{http_get, status_field, Reaped};

/// Generous: CI machines are slow and shared.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// The binary at `path`, logging at info, with the subscriber API and the state dir
/// off unless the test gives `--api-socket` or `--state-dir`: `plegd run`'s defaults
/// are the node's (/run/plegd/plegd.sock, /var/lib/plegd), which concurrent tests (or
/// a real plegd) would contend for.
pub fn command(path: &str) -> Command {
    let mut c = Command::new(path);
    c.env("RUST_LOG", "info")
        .env("PLEGD_API_SOCKET", "off")
        .env("PLEGD_STATE_DIR", "off");
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
        .env("PLEGD_API_SOCKET", "off")
        .env("PLEGD_STATE_DIR", "off");
    c
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

/// [`wait_exit`], and what the child wrote on its stderr (when it was piped).
pub fn exit_and_stderr(child: &mut Child) -> (std::process::ExitStatus, String) {
    let (status, _) = wait_exit(child);
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        std::io::Read::read_to_string(&mut e, &mut stderr).expect("stderr reads");
    }
    (status, stderr)
}

/// Polls `cond` until it holds; panics with `what` after [`TIMEOUT`].
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A port on 127.0.0.1 nobody listens on now.
pub fn free_port() -> u16 {
    plegd_testkit::process::free_port().expect("a free port")
}

/// Runs `cmd` to its end, stdout and stderr captured; panics if it still runs after
/// [`TIMEOUT`]. Returns what it wrote and how long it ran.
pub fn run_to_end(cmd: &mut Command) -> (Output, Duration) {
    let start = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {cmd:?}: {e}"));
    let deadline = start + TIMEOUT;
    while child.try_wait().expect("the child's status").is_none() {
        assert!(Instant::now() < deadline, "{cmd:?} did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
    let output = child.wait_with_output().expect("the child's output");
    (output, start.elapsed())
}
