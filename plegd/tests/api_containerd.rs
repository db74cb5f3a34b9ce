//! The subscriber API end to end against a real containerd 1.7: `plegd run` with the API
//! on, two `plegd watch --json` clients, a container killed with SIGKILL — all three
//! outputs show the same death (exit 137) with the same revision, within milliseconds
//! of the runtime's stop event, from plegd's one CRI event stream.
//!
//! Needs root and containerd (`scripts/containerd-up.sh`), like
//! integration-tests/tests/containerd.rs; ignored for a plain `cargo test`.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{ChildStdout, Stdio};
use std::sync::mpsc;
use std::time::SystemTime;

use integration_tests::containerd::{Death, Flavor, Session, SLEEP_SCRIPT};
use integration_tests::process::{
    command, free_port, http_get, signal, wait_exit, wait_until, Reaped, TIMEOUT,
};
use plegd_testkit::metrics::Scrape;
use serde_json::Value;

/// Lines of a child's stdout, each with when it was read.
fn lines_of(out: ChildStdout) -> mpsc::Receiver<(SystemTime, String)> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send((SystemTime::now(), line)).is_err() {
                break;
            }
        }
    });
    rx
}

/// Reads JSON lines until one satisfies `pred`.
fn until(
    rx: &mpsc::Receiver<(SystemTime, String)>,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> (SystemTime, Value) {
    loop {
        let (at, line) = rx
            .recv_timeout(TIMEOUT)
            .unwrap_or_else(|_| panic!("no line for {what}"));
        if let Ok(v) = serde_json::from_str::<Value>(&line) {
            if pred(&v) {
                return (at, v);
            }
        }
    }
}

/// Events plegd's CRI stream received (its metric), 0 if unreadable.
fn stream_events(port: u16) -> u64 {
    let Some((200, response)) = http_get(port, "/metrics") else {
        return 0;
    };
    Scrape::from_response(&response)
        .and_then(|m| m.count("plegd_evented_stream_events_total", &[]))
        .unwrap_or(0)
}

fn watch(socket: &Path, uid: &str) -> (Reaped, mpsc::Receiver<(SystemTime, String)>) {
    let mut child = command(env!("CARGO_BIN_EXE_plegd"))
        .args([
            "watch",
            "--json",
            "--initial-events",
            "--pod",
            uid,
            "--api-socket",
        ])
        .arg(socket)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let rx = lines_of(child.stdout.take().unwrap());
    // Subscribed once the initial events are in.
    until(&rx, "the initial-events bookmark", |v| {
        v["type"] == "Bookmark"
    });
    (Reaped(child), rx)
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn two_watchers_and_plegd_run_show_the_same_death_with_the_same_revision() {
    let s = Session::begin(Flavor::V1_7).await;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("plegd.sock");
    let port = free_port();
    let mut run = command(env!("CARGO_BIN_EXE_plegd"))
        .args(["run", "--runtime-endpoint", &s.containerd.endpoint()])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        // No periodic relist during the test, and one hint source: the death comes by
        // the CRI event stream (containerd's event service would race it for the hint).
        .args(["--relist-period", "30s", "--hint-sources", "cri-events"])
        .arg("--api-socket")
        .arg(&socket)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let own = lines_of(run.stdout.take().unwrap());
    let mut run = Reaped(run);
    wait_until("plegd ready", || {
        http_get(port, "/readyz").is_some_and(|(code, _)| code == 200)
    });
    let pod = s.cri.run_pod("api-death").await;
    s.cri.make_sole_receiver(&pod, || stream_events(port)).await;
    let c = s.cri.run_container(&pod, "victim", SLEEP_SCRIPT).await;
    let (mut w1, rx1) = watch(&socket, &pod.uid);
    let (mut w2, rx2) = watch(&socket, &pod.uid);

    s.cri.end_container(&c, Death::Kill).await;
    let is_death = |v: &Value| v["type"] == "ContainerDied" && v["container_id"] == c.as_str();
    let seen = [
        until(&own, "plegd run's ContainerDied", is_death),
        until(&rx1, "watcher 1's ContainerDied", is_death),
        until(&rx2, "watcher 2's ContainerDied", is_death),
    ];
    // containerd's finished_at, as its status (read by plegd) says.
    let finished = seen[0].1["finished_at"]
        .as_str()
        .and_then(|t| humantime::parse_rfc3339(t).ok())
        .expect("a death carries finished_at");
    let strip = |v: &Value| {
        let mut v = v.clone();
        let o = v.as_object_mut().unwrap();
        o.remove("seq");
        o.remove("missed");
        v
    };
    for (name, (at, v)) in ["plegd run", "watcher 1", "watcher 2"].iter().zip(&seen) {
        assert_eq!(v["revision"], seen[0].1["revision"], "{name}: {v}");
        assert_eq!(strip(v), strip(&seen[0].1), "{name}");
        assert_eq!(v["exit_code"], 137, "{name}: {v}");
        assert_eq!(v["relist_source"], "evented_pleg", "{name}: {v}");
        let after = at.duration_since(finished).unwrap_or_default();
        eprintln!(
            "{name}: ContainerDied revision {} printed {:.1} ms after containerd's finished_at",
            v["revision"],
            after.as_secs_f64() * 1e3
        );
    }
    for w in [&mut w1, &mut w2] {
        signal(&w.0, "TERM");
        assert_eq!(wait_exit(&mut w.0).0.code(), Some(0));
    }
    signal(&run.0, "TERM");
    assert_eq!(wait_exit(&mut run.0).0.code(), Some(0));
    s.cri.remove_all_pods().await;
}
