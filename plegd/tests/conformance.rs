//! The conformance suites (conformance/): plegd.v1 called by two gRPC stacks plegd's
//! code did not write, grpcio (Python, gRPC C-core) and @grpc/grpc-js (Node), each
//! with its default unix-socket target and no authority override, against the real
//! binary (`plegd demo`; for the resume across restarts, `plegd run` on a simulated
//! runtime). Each suite runs as a child process; a failure shows its
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

/// A stock client's `resume_client` (`conformance/python/resume_client.py`,
/// `conformance/node/resume_client.js`) against the API at `socket`: a Watch from
/// `since` (resuming `instance`, if any) until `until_type` of container `until_id`;
/// what it printed, one JSON value a line (`{"hello": …}`, `{"event": …}`, `{"gap": …}`).
#[derive(Clone, Copy)]
enum Client {
    Grpcio,
    GrpcJs,
}

impl Client {
    fn watch(
        self,
        socket: &Path,
        since: u64,
        instance: &str,
        until_type: &str,
        until_id: &str,
    ) -> Vec<serde_json::Value> {
        let mut cmd = match self {
            Client::Grpcio => {
                let mut c = Command::new(tools().join("conformance/venv/bin/python"));
                c.arg("resume_client.py")
                    .current_dir(repo().join("conformance/python"));
                c
            }
            Client::GrpcJs => {
                let mut c = Command::new("node");
                c.arg("resume_client.js")
                    .current_dir(repo().join("conformance/node"));
                c
            }
        };
        let out = cmd
            .args([&since.to_string(), instance, until_type, until_id])
            .env("PLEGD_SOCKET", socket)
            .env("PLEGD_PROTO_DIR", repo().join("protocol/proto"))
            .stdin(Stdio::null())
            .output()
            .expect("the client runs (scripts/conformance-tools.sh installs it)");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "resume_client failed ({}):\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
            .collect()
    }
}

/// The events of a client's output, without what differs per stream (`seq`, `missed`).
fn events_of(lines: &[serde_json::Value]) -> Vec<serde_json::Value> {
    assert!(
        lines.iter().all(|l| l.get("gap").is_none()),
        "no gap: {lines:?}"
    );
    lines
        .iter()
        .filter_map(|l| l.get("event").cloned())
        .map(|mut e| {
            if let Some(o) = e.as_object_mut() {
                o.remove("seq");
                o.remove("missed");
            }
            e
        })
        .collect()
}

fn revision(e: &serde_json::Value) -> u64 {
    // proto3 JSON: uint64 as a string.
    e["revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("a revision: {e}"))
}

/// A client plegd's code did not write resumes its Watch across SIGKILLed restarts
/// of plegd on one state dir (README "Restarts and upgrades"): the Hello names the
/// same instance, the revisions go on with no gap and no duplicate, a death while
/// plegd was down arrives with its exit code, and a Watch from revision 0 at the end
/// gets exactly what the resumed streams got.
fn resumes_a_watch_across_killed_restarts(client: Client) {
    use plegd_sim::{spawn_in_thread, FakeRuntime};
    use serde_json::Value;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let sim = FakeRuntime::new();
    let server = spawn_in_thread(&dir.path().join("cri.sock"), sim.clone()).expect("the sim");
    let socket = dir.path().join("api.sock");
    let start = || {
        let _ = std::fs::remove_file(&socket);
        let child = command(env!("CARGO_BIN_EXE_plegd"))
            .args(["run", "--runtime-endpoint", &server.endpoint()])
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--api-socket")
            .arg(&socket)
            .args(["--relist-period", "100ms", "--hint-sources", "none"])
            .args(["--metrics-addr", "off"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("plegd starts");
        wait_until("the API socket", || socket.exists());
        Reaped(child)
    };
    let kill = |mut p: Reaped| {
        let _ = p.0.kill();
        let _ = p.0.wait();
    };
    let sb = sim.run_pod("u1", "web", "ns");
    let c1 = sim.run_container(&sb, "app");

    let plegd = start();
    let first = client.watch(&socket, 0, "", "CONTAINER_STARTED", &c1);
    let instance = first[0]["hello"]["instance_id"]
        .as_str()
        .expect("a Hello first")
        .to_string();
    let mut seen = events_of(&first);
    kill(plegd);

    // While plegd is down: c1 dies (exit code 3), c2 starts.
    sim.exit_container(&c1, 3);
    let c2 = sim.run_container(&sb, "next");
    let plegd = start();
    let last = seen.last().map(revision).unwrap_or(0);
    let second = client.watch(&socket, last, &instance, "CONTAINER_STARTED", &c2);
    assert_eq!(second[0]["hello"]["instance_id"], instance.as_str());
    let resumed = events_of(&second);
    let died: Vec<&Value> = resumed
        .iter()
        .filter(|e| e["type"] == "CONTAINER_DIED" && e["container_id"] == c1.as_str())
        .collect();
    assert_eq!(died.len(), 1, "{resumed:?}");
    assert_eq!(died[0]["exit_code"], 3);
    seen.extend(resumed);
    kill(plegd);

    sim.remove_container(&c1);
    let plegd = start();
    let last = seen.last().map(revision).unwrap_or(0);
    let third = client.watch(&socket, last, &instance, "CONTAINER_REMOVED", &c1);
    assert_eq!(third[0]["hello"]["instance_id"], instance.as_str());
    seen.extend(events_of(&third));
    let revisions: Vec<u64> = seen.iter().map(revision).collect();
    assert_eq!(
        revisions,
        (1..=revisions.len() as u64).collect::<Vec<_>>(),
        "every revision once, across the restarts"
    );
    // From revision 0: the whole history, as the resumed streams got it.
    let all = client.watch(&socket, 0, &instance, "CONTAINER_REMOVED", &c1);
    assert_eq!(events_of(&all), seen);
    kill(plegd);
}

#[test]
#[ignore = "needs the conformance clients (grpcio venv, grpc-js node_modules): scripts/test.sh installs them"]
fn grpcio_resumes_a_watch_across_killed_restarts() {
    resumes_a_watch_across_killed_restarts(Client::Grpcio);
}

#[test]
#[ignore = "needs the conformance clients (grpcio venv, grpc-js node_modules): scripts/test.sh installs them"]
fn grpc_js_resumes_a_watch_across_killed_restarts() {
    resumes_a_watch_across_killed_restarts(Client::GrpcJs);
}
