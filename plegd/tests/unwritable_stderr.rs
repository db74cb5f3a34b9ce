//! plegd's logs go to stderr; when stderr cannot be written (a log file on a full
//! disk: ENOSPC), plegd must go on without its logs, not die. Found by the chaos
//! suite's restart seeds while the machine's disk was full: every plegd start exited
//! 101 (a panic) or by SIGABRT (a panic while panicking) with an empty log.
//!
//! `/dev/full` answers every write with ENOSPC. The cause, seen with strace: the log
//! line fails, tracing-subscriber's fmt layer reports its own write error with
//! `eprint!` ("[tracing-subscriber] Unable to write an event to the Writer for this
//! Subscriber!"), and `eprint!` panics when stderr fails ("failed printing to stderr").

use std::fs::OpenOptions;
use std::process::Stdio;

use integration_tests::api::wait_served;
use integration_tests::process::{command, signal, wait_exit};
use plegd_sim::{spawn_in_thread, FakeRuntime};

#[test]
fn plegd_runs_on_when_its_stderr_fails_with_enospc() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "web", "ns");
    rt.run_container(&sb, "app");
    let server = spawn_in_thread(&dir.path().join("cri.sock"), rt).expect("the sim server");
    let full = OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .expect("/dev/full (Linux)");
    let socket = dir.path().join("api.sock");
    let mut child = command(env!("CARGO_BIN_EXE_plegd"))
        .args(["run", "--runtime-endpoint", &server.endpoint()])
        .arg("--api-socket")
        .arg(&socket)
        .args(["--metrics-addr", "off", "--events-json", "/dev/null"])
        .args(["--relist-period", "50ms"])
        // Info: plegd logs as it starts ("connected to CRI runtime").
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::from(full))
        .spawn()
        .expect("plegd starts");
    // A plegd that died of its failing stderr never serves.
    wait_served(&mut child, &socket);
    signal(&child, "TERM");
    let (status, _) = wait_exit(&mut child);
    assert!(status.success(), "plegd exited {status} after SIGTERM");
}
