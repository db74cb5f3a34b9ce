//! The subscriber API end to end with the real binary: `plegd demo` serving its
//! socket, and the `plegd watch`, `pods` and `status` clients as processes — the
//! same events with the same revisions as plegd's own output, the initial-events
//! bookmark, clear exit-1 errors, the socket's mode, a live socket never stolen.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Output, Stdio};
use std::sync::mpsc;

use integration_tests::process::{
    command, run_to_end, signal, wait_exit, wait_until, Reaped, TIMEOUT,
};
use serde_json::Value;

fn plegd() -> std::process::Command {
    command(env!("CARGO_BIN_EXE_plegd"))
}

/// `plegd demo` serving its API at `socket`, its events (JSON) in `events`.
fn demo(socket: &Path, events: &Path) -> Reaped {
    demo_with(socket, events, &[])
}

/// [`demo`] with more flags. The demo's temporary directory goes beside `events`, in
/// the test's own: a demo killed on purpose leaves it behind.
fn demo_with(socket: &Path, events: &Path, extra: &[&str]) -> Reaped {
    let child = plegd()
        .env("TMPDIR", events.parent().expect("events in a directory"))
        .args(["demo", "--metrics-addr", "off", "--node-name", "cli-node"])
        .args(extra)
        .args([
            "--relist-period",
            "100ms",
            "--churn-period",
            "40ms",
            "--pods",
            "6",
        ])
        .arg("--api-socket")
        .arg(socket)
        .arg("--events-json")
        .arg(events)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until("the API socket", || socket.exists());
    Reaped(child)
}

/// Runs a client to its end.
fn client(args: &[&str], socket: &Path) -> Output {
    run_to_end(plegd().args(args).arg("--api-socket").arg(socket)).0
}

/// A `plegd watch` process and its stdout lines, read on a thread.
struct Watch {
    child: Reaped,
    lines: mpsc::Receiver<String>,
}

impl Watch {
    fn start(socket: &Path, extra: &[&str]) -> Watch {
        let mut child = plegd()
            .arg("watch")
            .args(extra)
            .arg("--api-socket")
            .arg(socket)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out: ChildStdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let w = Watch {
            child: Reaped(child),
            lines,
        };
        if extra.contains(&"--json") {
            // The Hello comes first; the tests read what follows.
            let hello = w.next_json();
            assert_eq!(hello["type"], "Hello", "{hello}");
        }
        w
    }

    fn next_json(&self) -> Value {
        let line = self
            .lines
            .recv_timeout(TIMEOUT)
            .expect("a line from plegd watch");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    fn child(&mut self) -> &mut Child {
        &mut self.child.0
    }
}

/// The events of an `--events-json` file, by revision.
fn events_by_revision(path: &Path) -> BTreeMap<u64, Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .map(|v| (v["revision"].as_u64().unwrap(), v))
        .collect()
}

/// An event without what is the subscriber's own (`seq`, `missed`).
fn shared_fields(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("seq");
        o.remove("missed");
    }
    v
}

fn temp() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("api/plegd.sock");
    let events = dir.path().join("events.jsonl");
    (dir, socket, events)
}

#[test]
fn two_watchers_and_plegds_own_output_show_the_same_events_with_the_same_revisions() {
    let (_dir, socket, events) = temp();
    let mut server = demo(&socket, &events);
    let meta = std::fs::metadata(&socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.mode() & 0o777, 0o660, "the socket is 0660");
    let mut watchers = [
        Watch::start(&socket, &["--json"]),
        Watch::start(&socket, &["--json"]),
    ];
    let mut seen: Vec<Vec<Value>> = vec![Vec::new(), Vec::new()];
    for (w, seen) in watchers.iter().zip(&mut seen) {
        while seen.len() < 15 {
            seen.push(w.next_json());
        }
    }
    // plegd's own output has written them by now (or will within moments).
    let last = seen
        .iter()
        .flatten()
        .map(|v| v["revision"].as_u64().unwrap())
        .max()
        .unwrap();
    wait_until("plegd's output to catch up", || {
        events_by_revision(&events)
            .keys()
            .next_back()
            .is_some_and(|r| *r >= last)
    });
    let own = events_by_revision(&events);
    for seen in &seen {
        // Exactly the fields of `plegd run`'s output, and the same values.
        for v in seen {
            let r = v["revision"].as_u64().unwrap();
            assert_eq!(shared_fields(v), shared_fields(&own[&r]), "revision {r}");
            assert!(v["seq"].as_u64().is_some());
        }
        // In order, with no gap (each saw every event from its start).
        let revs: Vec<u64> = seen
            .iter()
            .map(|v| v["revision"].as_u64().unwrap())
            .collect();
        assert!(revs.windows(2).all(|w| w[1] == w[0] + 1), "{revs:?}");
    }
    // SIGTERM and SIGINT end a watcher with exit 0.
    for (w, sig) in watchers.iter_mut().zip(["TERM", "INT"]) {
        signal(w.child(), sig);
        let (status, _) = wait_exit(w.child());
        assert_eq!(status.code(), Some(0), "after SIG{sig}");
    }
    // plegd's own SIGTERM ends a watch cleanly: the client says why, in one line.
    let mut last = plegd()
        .args(["watch", "--json", "--initial-events", "--api-socket"])
        .arg(&socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(last.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("\"Bookmark\"") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the watcher ended early"
        );
    }
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    signal(&server.0, "TERM");
    let (status, _) = wait_exit(&mut server.0);
    assert_eq!(status.code(), Some(0));
    assert!(!socket.exists(), "the socket is removed at exit");
    let (status, _) = wait_exit(&mut last);
    assert_eq!(status.code(), Some(1));
    let mut err = String::new();
    std::io::Read::read_to_string(last.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(err.contains("plegd is shutting down"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

#[test]
fn initial_events_then_the_bookmark_then_live_events() {
    let (_dir, socket, events) = temp();
    let _server = demo(&socket, &events);
    wait_until("the demo's first pods in the cache", || {
        !client(&["pods", "--json"], &socket).stdout.is_empty()
    });
    let w = Watch::start(&socket, &["--json", "--initial-events"]);
    let mut snapshot = 0;
    let bookmark = loop {
        let v = w.next_json();
        if v["type"] == "Bookmark" {
            break v;
        }
        assert_eq!(v["snapshot"], true, "{v}");
        assert!(v.get("relist_source").is_none(), "{v}");
        snapshot += 1;
    };
    assert!(snapshot > 0, "the demo's pods were listed first");
    let revision = bookmark["revision"].as_u64().unwrap();
    assert_eq!(
        bookmark,
        serde_json::json!({"type": "Bookmark", "revision": revision, "initial_events_end": true})
    );
    let live = w.next_json();
    assert!(live["revision"].as_u64().unwrap() > revision);
    assert!(live.get("snapshot").is_none());
}

/// `plegd status` shows every hint source with its state, as the
/// `plegd_hint_source_state` gauge has them: the selected CRI stream streaming, the
/// others off.
#[test]
fn status_shows_the_hint_sources_and_their_states() {
    let (_dir, socket, events) = temp();
    let _server = demo_with(
        &socket,
        &events,
        &[
            "--hint-sources",
            "cri-events",
            "--nri-socket",
            "/nonexistent/nri.sock",
        ],
    );
    let mut uid = String::new();
    wait_until("a pod of the demo", || {
        let out = client(&["pods", "--json"], &socket);
        let first = String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["pod_uid"]
                    .as_str()
                    .unwrap()
                    .to_string()
            });
        uid = first.unwrap_or_default();
        !uid.is_empty()
    });
    let expected = serde_json::json!([
        {"name": "cri-events", "state": "streaming"},
        {"name": "nri", "state": "off"},
        {"name": "containerd-events", "state": "off"},
    ]);
    let mut last = Value::Null;
    wait_until("cri-events streaming in plegd status --json", || {
        let out = client(&["status", &uid, "--json"], &socket);
        // The demo's churn may remove the pod; a missing pod is asked again.
        if out.status.code() != Some(0) {
            return false;
        }
        let status: Value = serde_json::from_slice(&out.stdout).unwrap();
        last = names_and_states(&status["hint_sources"]);
        last == expected
    });
    assert_eq!(last, expected);
    let mut text = String::new();
    wait_until("plegd status (text) with the hint sources", || {
        let out = client(&["status", &uid], &socket);
        text = String::from_utf8_lossy(&out.stdout).into_owned();
        out.status.code() == Some(0)
    });
    assert!(
        text.lines()
            .any(|l| l == "hint sources: cri-events=streaming nri=off containerd-events=off"),
        "{text}"
    );

    // Without a UID: plegd itself.
    let out = client(&["status", "--json"], &socket);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["node_name"], "cli-node");
    assert_eq!(status["instance_id"].as_str().map(str::len), Some(32));
    assert!(status["latest_revision"].as_u64().unwrap() > 0);
    assert_eq!(names_and_states(&status["hint_sources"]), expected);
    // The CRI stream of the simulated runtime reports every stop it should.
    assert_eq!(status["hint_sources"][0]["stops_missed"], 0, "{status}");
    assert_eq!(status["health"]["healthy"], true, "{status}");
    assert_eq!(status["health"]["runtime"], "answering", "{status}");
    assert!(
        status["health"]["last_global_relist"].is_string(),
        "{status}"
    );
    let out = client(&["status"], &socket);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("node:         cli-node"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("health:       healthy (last global relist ")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("runtime:      answering (for ")),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l == "hint sources: cri-events=streaming nri=off containerd-events=off"),
        "{text}"
    );
    // --newer-than is about a pod: refused without a UID (bad flags: exit 2).
    let out = client(&["status", "--newer-than", "2020-01-01T00:00:00Z"], &socket);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// Each hint source's name and state (its stop counts vary with the demo's churn).
fn names_and_states(sources: &Value) -> Value {
    let list = sources.as_array().cloned().unwrap_or_default();
    Value::Array(
        list.iter()
            .map(|s| serde_json::json!({"name": s["name"], "state": s["state"]}))
            .collect(),
    )
}

#[test]
fn pods_and_status_show_the_cache_and_the_node() {
    let (_dir, socket, events) = temp();
    let _server = demo(&socket, &events);
    let mut pods = Vec::new();
    wait_until("the demo's pods", || {
        let out = client(&["pods", "--json"], &socket);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        pods = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .collect();
        pods.iter()
            .any(|p| !p["containers"].as_array().unwrap().is_empty())
    });
    let pod = pods
        .iter()
        .find(|p| !p["containers"].as_array().unwrap().is_empty())
        .unwrap();
    let keys: Vec<&String> = pod.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["containers", "pod_name", "pod_namespace", "pod_uid"]);
    let c = &pod["containers"][0];
    assert!(c["container_id"].is_string() && c["container_name"].is_string());
    assert!(["running", "exited", "created", "unknown"].contains(&c["state"].as_str().unwrap()));
    let uid = pod["pod_uid"].as_str().unwrap();

    let table = client(&["pods"], &socket);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.starts_with("NAMESPACE"), "{table}");
    assert!(table.contains(uid), "{table}");

    let out = client(&["status", uid, "--json"], &socket);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let status: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["node_name"], "cli-node");
    assert_eq!(status["pod_uid"], uid);
    let out = client(
        &["status", uid, "--newer-than", "2020-01-01T00:00:00Z"],
        &socket,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("node:       cli-node") && text.contains(uid),
        "{text}"
    );

    let out = client(&["status", "no-such-pod"], &socket);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no-such-pod is not known") && err.lines().count() == 1,
        "{err}"
    );
}

#[test]
fn clients_exit_1_with_one_clear_line() {
    let (_dir, socket, events) = temp();
    // Nothing at the socket: the path is named.
    for args in [&["watch"][..], &["pods"], &["status", "u1"]] {
        let out = client(args, &socket);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("no plegd answers at") && err.contains(&socket.display().to_string()),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    let _server = demo(&socket, &events);
    // A revision this plegd never issued.
    let out = client(&["watch", "--since", "999999999"], &socket);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refused") && err.contains("never issued"),
        "{err}"
    );
    // A revision of another plegd instance.
    let out = client(
        &["watch", "--since", "1", "--instance-id", &"0".repeat(32)],
        &socket,
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("refused") && err.contains("not this plegd's"),
        "{err}"
    );
    // A bad selector is refused by plegd with the reason.
    let out = client(&["watch", "--selector", "app in (a)"], &socket);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("label selector"));
}

#[test]
fn a_second_plegd_never_steals_a_live_socket_and_a_stale_one_is_replaced() {
    let (dir, socket, events) = temp();
    let mut first = demo(&socket, &events);
    let out = plegd()
        .args([
            "demo",
            "--metrics-addr",
            "off",
            "--duration",
            "30s",
            "--api-socket",
        ])
        .arg(&socket)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another plegd serves this socket"), "{err}");
    assert!(
        client(&["pods"], &socket).status.success(),
        "the first still serves"
    );
    // A crash leaves the socket file: the next plegd replaces it.
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    assert!(socket.exists(), "a killed plegd leaves its socket");
    let _second = demo(&socket, &dir.path().join("second.jsonl"));
    wait_until("the new plegd to serve", || {
        client(&["pods"], &socket).status.success()
    });
}

#[test]
fn the_control_socket_has_its_own_mode_and_group_and_status_clients_lists_watchers_and_holds() {
    let (dir, socket, events) = temp();
    let gid = std::fs::metadata(dir.path()).unwrap().gid().to_string();
    let _server = demo_with(
        &socket,
        &events,
        &[
            "--api-control-socket-mode",
            "0600",
            "--api-control-socket-group",
            &gid,
        ],
    );
    // Beside the API socket by default, with its own mode and group.
    let control = socket.with_file_name("plegd-control.sock");
    wait_until("the control socket", || control.exists());
    let meta = std::fs::metadata(&control).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.mode() & 0o777, 0o600, "the control socket's own mode");
    assert_eq!(meta.gid().to_string(), gid);
    assert_eq!(
        std::fs::metadata(&socket).unwrap().mode() & 0o777,
        0o660,
        "the read socket keeps 0660"
    );

    // A watcher (a `plegd watch` process) and a hold (a pod worker on the control
    // socket; refused on the read socket).
    let mut watcher = Watch::start(&socket, &["--namespace", "kube-system", "--json"]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let hold = |path: PathBuf| {
        runtime.block_on(async move {
            let mut client = plegd_api::connect(&path).await.unwrap();
            let (tx, rx) = tokio::sync::mpsc::channel(2);
            tx.send(plegd_api::v1::SyncRequest {
                kind: Some(plegd_api::v1::sync_request::Kind::Begin(
                    plegd_api::v1::SyncBegin {
                        pod_uid: "worker-pod".into(),
                    },
                )),
            })
            .await
            .unwrap();
            let answers = client
                .sync(tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(
                    rx,
                ))
                .await
                .map(|r| r.into_inner());
            (tx, answers)
        })
    };
    let (_, refused) = hold(socket.clone());
    assert_eq!(
        refused.err().map(|s| s.code()),
        Some(tonic::Code::PermissionDenied)
    );
    let (_tx, answers) = hold(control.clone());
    let mut answers = answers.unwrap();
    let first = runtime.block_on(answers.message()).unwrap().unwrap();
    assert!(matches!(
        first.kind,
        Some(plegd_api::v1::sync_response::Kind::Held(_))
    ));

    let out = client(&["status", "--clients", "--json"], &socket);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let watchers = listed["watchers"].as_array().unwrap();
    assert!(
        watchers
            .iter()
            .any(|w| w["filter"] == "namespaces=kube-system"
                && w["queue_capacity"].as_u64() > Some(0)),
        "{listed}"
    );
    let holds = listed["holds"].as_array().unwrap();
    assert_eq!(holds.len(), 1, "{listed}");
    assert_eq!(holds[0]["pod_uid"], "worker-pod");
    assert_eq!(holds[0]["pod_known"], false);
    assert!(holds[0]["expires_at"].as_str().unwrap().ends_with('Z'));

    let out = client(&["status", "--clients"], &socket);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("filter namespaces=kube-system"), "{text}");
    assert!(
        text.contains("holds: 1") && text.contains("pod worker-pod"),
        "{text}"
    );
    signal(watcher.child(), "TERM");
}
