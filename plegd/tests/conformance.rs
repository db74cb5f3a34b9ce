//! The conformance suites (conformance/): plegd.v1 called by two gRPC stacks plegd's
//! code did not write, grpcio (Python, gRPC C-core) and @grpc/grpc-js (Node), each
//! with its default unix-socket target and no authority override, against the real
//! binary (`plegd demo`). Each suite runs as a child process; a failure shows its
//! whole output.
//!
//! The clients are installed by scripts/conformance-tools.sh (scripts/test.sh runs
//! it): a venv under $PLEGD_TOOLS and conformance/node/node_modules.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use integration_tests::process::{command, wait_until, Reaped};

const NODE_NAME: &str = "conformance-node";
/// Small, so the suites can see a revision fall out of the history (`too-old`).
const HISTORY_EVENTS: &str = "200";
/// A whole suite, on a slow shared machine.
const SUITE_TIMEOUT: Duration = Duration::from_secs(600);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("plegd/ is in the repository")
        .to_owned()
}

fn tools() -> PathBuf {
    std::env::var_os("PLEGD_TOOLS").map_or_else(|| "/var/lib/plegd-tools".into(), PathBuf::from)
}

/// `plegd demo` serving its API on `socket` and its control calls on `control`.
fn demo(socket: &Path, control: &Path) -> Reaped {
    let child = command(env!("CARGO_BIN_EXE_plegd"))
        .args(["demo", "--metrics-addr", "off", "--node-name", NODE_NAME])
        .args(["--relist-period", "100ms", "--churn-period", "40ms"])
        .args(["--pods", "6", "--history-events", HISTORY_EVENTS])
        .arg("--api-socket")
        .arg(socket)
        .arg("--api-control-socket")
        .arg(control)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("plegd starts");
    wait_until("the API sockets", || socket.exists() && control.exists());
    Reaped(child)
}

/// Reads `pipe` to its end on a thread.
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut out = String::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_string(&mut out);
        }
        out
    })
}

/// Runs `cmd` to its end (killed after [`SUITE_TIMEOUT`]) with the suite's
/// environment; panics with its output unless it succeeds.
fn run_suite(name: &str, mut cmd: Command, socket: &Path, control: &Path) {
    cmd.env("PLEGD_SOCKET", socket)
        .env("PLEGD_CONTROL_SOCKET", control)
        .env("PLEGD_PROTO_DIR", repo().join("protocol/proto"))
        .env("PLEGD_NODE_NAME", NODE_NAME)
        .env("PLEGD_HISTORY_EVENTS", HISTORY_EVENTS)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| {
        panic!("{name}: cannot start {cmd:?}: {e} (scripts/conformance-tools.sh installs it)")
    });
    // Both pipes are drained on threads so a chatty suite never blocks on a full pipe.
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + SUITE_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().expect("the suite's status") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = stdout.join().unwrap_or_default();
    let err = stderr.join().unwrap_or_default();
    match status {
        Some(s) if s.success() => eprintln!("{name} passed:\n{out}"),
        Some(s) => panic!("{name} failed ({s}):\n{out}\n{err}"),
        None => panic!("{name} did not end within {SUITE_TIMEOUT:?}:\n{out}\n{err}"),
    }
}

#[test]
#[ignore = "needs the conformance clients (grpcio venv, grpc-js node_modules): scripts/test.sh installs them"]
fn grpcio_python_suite_passes() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let socket = dir.path().join("api.sock");
    let control = dir.path().join("control.sock");
    let _plegd = demo(&socket, &control);
    let mut cmd = Command::new(tools().join("conformance/venv/bin/python"));
    cmd.args(["-m", "pytest", "-v", "-p", "no:cacheprovider"])
        .current_dir(repo().join("conformance/python"));
    run_suite("grpcio (conformance/python)", cmd, &socket, &control);
}

#[test]
#[ignore = "needs the conformance clients (grpcio venv, grpc-js node_modules): scripts/test.sh installs them"]
fn grpc_js_node_suite_passes() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let socket = dir.path().join("api.sock");
    let control = dir.path().join("control.sock");
    let _plegd = demo(&socket, &control);
    let mut cmd = Command::new("node");
    cmd.args(["--test", "--test-concurrency=1", "conformance.test.js"])
        .current_dir(repo().join("conformance/node"));
    run_suite("grpc-js (conformance/node)", cmd, &socket, &control);
}
