//! The workload binary against plegd's simulated CRI runtime (a real CRI gRPC server
//! over `plegd_sim::FakeRuntime`): pods really come and go through its CRI calls,
//! SIGTERM removes them all and exits 0, and a missing runtime is a clear error.

use std::collections::HashSet;
use std::fs::File;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use plegd_runtime::{ContainerState, RuntimeClient, SandboxState};
use plegd_sim::{spawn_in_thread, FakeRuntime, ThreadedSimServer};
use tempfile::TempDir;

/// Generous: CI machines are slow, and a passing test never waits this long.
const PATIENCE: Duration = Duration::from_secs(30);

struct Sim {
    dir: TempDir,
    runtime: FakeRuntime,
    server: ThreadedSimServer,
}

fn sim() -> Sim {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let runtime = FakeRuntime::new();
    let server = spawn_in_thread(&dir.path().join("cri.sock"), runtime.clone())
        .expect("the simulated runtime starts");
    Sim {
        dir,
        runtime,
        server,
    }
}

/// The workload on `endpoint`, its stderr in `log` (a file: a pipe could fill up).
fn workload(endpoint: &str, log: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_plegd-workload"));
    cmd.args(["--runtime-endpoint", endpoint, "--request-timeout", "5s"])
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(log).expect("the log file"));
    for (key, _) in std::env::vars() {
        if key.starts_with("WORKLOAD_") {
            cmd.env_remove(key);
        }
    }
    cmd
}

fn wait_with_timeout(child: &mut Child, timeout: Duration) -> ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the workload did not exit within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn log_of(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// What has been seen of the runtime so far.
#[derive(Default)]
struct Seen {
    sandboxes: HashSet<String>,
    gone: HashSet<String>,
    not_ready: bool,
    exited: HashSet<i32>,
    restarted: bool,
}

impl Seen {
    async fn look(&mut self, rt: &FakeRuntime) {
        let now: HashSet<String> = match rt.list_sandboxes(None).await {
            Ok(list) => {
                self.not_ready |= list.iter().any(|s| s.state == SandboxState::NotReady);
                list.into_iter().map(|s| s.id).collect()
            }
            Err(_) => return,
        };
        self.gone
            .extend(self.sandboxes.difference(&now).cloned().collect::<Vec<_>>());
        self.sandboxes.extend(now);
        for c in rt.list_containers(None).await.unwrap_or_default() {
            self.restarted |= c.attempt >= 1 && c.state == ContainerState::Running;
            if c.state == ContainerState::Exited {
                if let Ok(s) = rt.container_status(&c.id).await {
                    self.exited.insert(s.exit_code);
                }
            }
        }
    }

    fn enough(&self) -> bool {
        self.sandboxes.len() > 3
            && !self.gone.is_empty()
            && self.not_ready
            && !self.exited.is_empty()
            && self.restarted
    }
}

#[tokio::test]
async fn pods_come_and_go_and_sigterm_removes_them() {
    let sim = sim();
    let log = sim.dir.path().join("workload.log");
    let mut child = workload(
        &sim.server.endpoint(),
        &log,
        &["--pods", "3", "--period", "10ms", "--seed", "7"],
    )
    .spawn()
    .expect("the workload starts");

    let mut seen = Seen::default();
    let deadline = Instant::now() + PATIENCE;
    while !seen.enough() {
        if let Some(status) = child.try_wait().expect("try_wait") {
            panic!("the workload exited early ({status}):\n{}", log_of(&log));
        }
        assert!(
            Instant::now() < deadline,
            "pods did not come and go: {} sandboxes, {} gone, not ready seen: {}, exit codes {:?}, restarted: {}\n{}",
            seen.sandboxes.len(),
            seen.gone.len(),
            seen.not_ready,
            seen.exited,
            seen.restarted,
            log_of(&log)
        );
        seen.look(&sim.runtime).await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // StopContainer exits 143 in the simulator; a stopped sandbox kills with 137.
    assert!(
        seen.exited.iter().all(|c| [137, 143].contains(c)),
        "{:?}",
        seen.exited
    );

    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(kill.success());
    let status = wait_with_timeout(&mut child, PATIENCE);
    let text = log_of(&log);
    assert!(status.success(), "{status}\n{text}");
    assert!(text.contains("SIGTERM"), "{text}");
    assert_eq!(sim.runtime.pod_count(), 0, "pods left behind\n{text}");
    sim.server.stop();
}

#[test]
fn steps_end_the_run_and_the_pods() {
    let sim = sim();
    let log = sim.dir.path().join("workload.log");
    let mut child = workload(
        &sim.server.endpoint(),
        &log,
        &["--pods", "2", "--period", "1ms", "--steps", "30"],
    )
    .spawn()
    .expect("the workload starts");
    let status = wait_with_timeout(&mut child, PATIENCE);
    let text = log_of(&log);
    assert!(status.success(), "{status}\n{text}");
    assert!(text.contains("stopped after 30 steps"), "{text}");
    // The simulator has no image service: the workload says so and carries on.
    assert!(text.contains("no CRI image service"), "{text}");
    assert_eq!(sim.runtime.pod_count(), 0);
    sim.server.stop();
}

#[test]
fn a_missing_runtime_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let log = dir.path().join("workload.log");
    let endpoint = format!("unix://{}", dir.path().join("none.sock").display());
    let mut child = workload(&endpoint, &log, &["--wait", "1s"])
        .spawn()
        .expect("the workload starts");
    let status = wait_with_timeout(&mut child, PATIENCE);
    let text = log_of(&log);
    assert_eq!(status.code(), Some(1), "{text}");
    assert!(
        text.contains("did not answer within 1s") && text.contains(&endpoint),
        "{text}"
    );
}

#[test]
fn bad_flags_exit_2_and_help_exits_0() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let log = dir.path().join("workload.log");
    let status = workload("tcp://127.0.0.1:1", &log, &["--pods", "0"])
        .status()
        .expect("the workload runs");
    assert_eq!(status.code(), Some(2), "{}", log_of(&log));
    let help = Command::new(env!("CARGO_BIN_EXE_plegd-workload"))
        .arg("--help")
        .output()
        .expect("the workload runs");
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--runtime-endpoint",
        "--pods",
        "--period",
        "--seed",
        "--steps",
    ] {
        assert!(text.contains(flag), "{flag} missing from --help:\n{text}");
    }
}
