//! Events written to a stdout that is /dev/null are lost: plegd says so at start
//! (nothing lost without being told), and only then.

use std::process::Stdio;

use integration_tests::api::wait_served;
use integration_tests::process::{command, exit_and_stderr, signal};
use plegd_sim::{spawn_in_thread, FakeRuntime};

const WARNING: &str = "events go to stdout, which is /dev/null";

/// plegd run with `events_json` (None: the default, stdout) and its stdout `stdout`,
/// until it serves its API, then stopped: its stderr.
fn stderr_of_a_run(events_json: Option<&str>, stdout: Stdio) -> String {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "web", "ns");
    rt.run_container(&sb, "app");
    let server = spawn_in_thread(&dir.path().join("cri.sock"), rt).expect("the sim server");
    let socket = dir.path().join("api.sock");
    let mut cmd = command(env!("CARGO_BIN_EXE_plegd"));
    cmd.args(["run", "--runtime-endpoint", &server.endpoint()])
        .arg("--api-socket")
        .arg(&socket)
        .args(["--metrics-addr", "off"]);
    if let Some(path) = events_json {
        cmd.args(["--events-json", path]);
    }
    let mut child = cmd
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("plegd starts");
    wait_served(&mut child, &socket);
    signal(&child, "TERM");
    let (status, stderr) = exit_and_stderr(&mut child);
    assert!(status.success(), "plegd exited {status}: {stderr}");
    stderr
}

#[test]
fn events_to_a_stdout_that_is_dev_null_are_told_lost() {
    let stderr = stderr_of_a_run(None, Stdio::null());
    assert!(stderr.contains(WARNING), "{stderr}");
    let stderr = stderr_of_a_run(Some("-"), Stdio::null());
    assert!(stderr.contains(WARNING), "{stderr}");
}

#[test]
fn events_to_a_pipe_or_to_dev_null_by_name_are_not() {
    let stderr = stderr_of_a_run(None, Stdio::piped());
    assert!(!stderr.contains(WARNING), "{stderr}");
    let stderr = stderr_of_a_run(Some("/dev/null"), Stdio::null());
    assert!(!stderr.contains(WARNING), "{stderr}");
}
