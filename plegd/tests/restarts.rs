//! Restarts on a state dir with the real binary (README "Restarts and upgrades"):
//! `plegd run` against the simulated runtime, stopped with SIGTERM or killed with
//! SIGKILL while the runtime changes, then started again on the same state. A Watch
//! that resumes from its last revision and instance gets every event it missed and the
//! downtime's transitions with no gap and no duplicate; the event writer goes on from
//! its cursor (at least once, each line by instance and revision). Bad state, a second
//! plegd on the same dir and a full disk (a small tmpfs) never take plegd down and
//! never hand out a revision twice.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use integration_tests::otlp::{LogsReceiver, Value as Otlp};
use integration_tests::process::{
    command, free_port, http_get, run_to_end, signal, wait_exit, wait_until, Reaped, TIMEOUT,
};
use plegd_api::v1;
use plegd_api::v1::watch_response::Kind;
use plegd_sim::{spawn_in_thread, FakeRuntime, ThreadedSimServer};
use serde_json::Value;
use tonic::Streaming;

/// A node: the simulated runtime (up across plegd's restarts), and where plegd keeps
/// its state, serves its API, writes its events and logs.
struct Node {
    dir: tempfile::TempDir,
    sim: FakeRuntime,
    server: ThreadedSimServer,
    state: PathBuf,
}

impl Node {
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let sim = FakeRuntime::new();
        let server = spawn_in_thread(&dir.path().join("cri.sock"), sim.clone()).unwrap();
        let state = dir.path().join("state");
        Node {
            dir,
            sim,
            server,
            state,
        }
    }

    fn api(&self) -> PathBuf {
        self.dir.path().join("api.sock")
    }

    fn events(&self) -> PathBuf {
        self.dir.path().join("events.json")
    }

    fn log(&self, n: usize) -> PathBuf {
        self.dir.path().join(format!("plegd-{n}.log"))
    }

    /// Starts plegd (the `n`th start) and waits for its API socket.
    fn start(&self, n: usize, extra: &[&str]) -> Reaped {
        let _ = std::fs::remove_file(self.api());
        let child = command(env!("CARGO_BIN_EXE_plegd"))
            .args(["run", "--runtime-endpoint", &self.server.endpoint()])
            .arg("--state-dir")
            .arg(&self.state)
            .arg("--api-socket")
            .arg(self.api())
            .arg("--events-json")
            .arg(self.events())
            .args(["--relist-period", "100ms", "--hint-sources", "none"])
            .env("PLEGD_METRICS_ADDR", "off")
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.log(n)).unwrap())
            .spawn()
            .unwrap();
        let mut child = Reaped(child);
        let mut exited = None;
        wait_until("the API socket", || {
            exited = child.0.try_wait().unwrap();
            exited.is_some() || self.api().exists()
        });
        if let Some(status) = exited {
            panic!("plegd exited at start ({status}): {}", self.log_text(n));
        }
        child
    }

    fn log_text(&self, n: usize) -> String {
        std::fs::read_to_string(self.log(n)).unwrap_or_default()
    }
}

fn stop(mut p: Reaped) {
    signal(&p.0, "TERM");
    let (status, _) = wait_exit(&mut p.0);
    assert!(status.success(), "plegd did not stop cleanly: {status}");
}

fn kill(mut p: Reaped) {
    signal(&p.0, "KILL");
    let _ = wait_exit(&mut p.0);
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A Watch from `since` (of `instance`, when given): its Hello and stream.
async fn watch(
    api: &Path,
    since: Option<u64>,
    instance: &str,
) -> (v1::Hello, Streaming<v1::WatchResponse>) {
    let mut client = plegd_api::connect(api).await.unwrap();
    let mut stream = client
        .watch(v1::WatchRequest {
            since_revision: since,
            instance_id: instance.to_string(),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|s| panic!("watch since {since:?} refused: {s:?}"))
        .into_inner();
    match next(&mut stream).await {
        Some(Kind::Hello(h)) => (h, stream),
        other => panic!("not a Hello first: {other:?}"),
    }
}

async fn next(stream: &mut Streaming<v1::WatchResponse>) -> Option<Kind> {
    match tokio::time::timeout(TIMEOUT, stream.message()).await {
        Ok(Ok(Some(v1::WatchResponse { kind }))) => kind,
        Ok(Ok(None)) => None,
        Ok(Err(s)) => panic!("the stream failed: {s:?}"),
        Err(_) => panic!("no message within {TIMEOUT:?}"),
    }
}

/// Events until `pred` holds for one (gaps are failures: nothing here drops).
async fn events_until(
    stream: &mut Streaming<v1::WatchResponse>,
    what: &str,
    mut pred: impl FnMut(&v1::Event) -> bool,
) -> Vec<v1::Event> {
    let mut got = Vec::new();
    loop {
        match next(stream).await {
            Some(Kind::Event(e)) => {
                let hit = pred(&e);
                got.push(e);
                if hit {
                    return got;
                }
            }
            Some(Kind::Gap(g)) => panic!("a gap waiting for {what}: {g:?}"),
            Some(_) => {}
            None => panic!("the stream ended waiting for {what}; got {got:?}"),
        }
    }
}

fn is(e: &v1::Event, t: v1::EventType, id: &str) -> bool {
    e.r#type == t as i32 && e.container_id == id
}

fn exit_code(e: &v1::Event) -> Option<i32> {
    e.exit_code
}

/// The revisions of `events` follow `after` one by one.
fn assert_follow(after: u64, events: &[v1::Event]) {
    let got: Vec<u64> = events.iter().map(|e| e.revision).collect();
    let want: Vec<u64> = (after + 1..=after + events.len() as u64).collect();
    assert_eq!(got, want, "no gap, no duplicate");
}

#[test]
fn a_watch_resumes_across_a_clean_and_a_killed_restart_with_the_downtime_in_between() {
    use v1::EventType::{ContainerDied, ContainerRemoved, ContainerStarted};
    let node = Node::new();
    let sb1 = node.sim.run_pod("u1", "web", "ns");
    let c1 = node.sim.run_container(&sb1, "app");
    let sb2 = node.sim.run_pod("u2", "db", "ns");
    let c2 = node.sim.run_container(&sb2, "app");
    let rt = rt();
    let collector = LogsReceiver::default();
    let endpoint = collector.start();
    let otlp = ["--otlp-events", "--otlp-events-endpoint", &endpoint];

    let first = node.start(1, &otlp);
    let (hello, mut stream) = rt.block_on(watch(&node.api(), Some(0), ""));
    let instance = hello.instance_id.clone();
    let seen = rt.block_on(events_until(&mut stream, "both containers", |e| {
        is(e, ContainerStarted, &c1) || is(e, ContainerStarted, &c2)
    }));
    let mut seen = seen;
    if !seen.iter().any(|e| is(e, ContainerStarted, &c1))
        || !seen.iter().any(|e| is(e, ContainerStarted, &c2))
    {
        seen.extend(
            rt.block_on(events_until(&mut stream, "the other container", |e| {
                is(e, ContainerStarted, &c1) || is(e, ContainerStarted, &c2)
            })),
        );
    }
    assert_follow(0, &seen);
    let r1 = seen.last().unwrap().revision;
    drop(stream);
    stop(first);
    assert!(node.state.join("state").exists());

    // Down: a death, a pod gone, a pod new.
    node.sim.exit_container(&c1, 3);
    node.sim.remove_pod(&sb2);
    let sb3 = node.sim.run_pod("u3", "cache", "ns");
    let c3 = node.sim.run_container(&sb3, "app");

    let second = node.start(2, &otlp);
    let (hello, mut stream) = rt.block_on(watch(&node.api(), Some(r1), &instance));
    assert_eq!(
        hello.instance_id, instance,
        "the same instance after SIGTERM"
    );
    let downtime = rt.block_on(events_until(&mut stream, "u3's container", |e| {
        is(e, ContainerStarted, &c3)
    }));
    assert_follow(r1, &downtime);
    let died: Vec<_> = downtime
        .iter()
        .filter(|e| is(e, ContainerDied, &c1))
        .collect();
    assert_eq!(died.len(), 1, "{downtime:?}");
    assert_eq!(exit_code(died[0]), Some(3));
    for id in [&sb2, &c2] {
        assert!(
            downtime.iter().any(|e| is(e, ContainerRemoved, id)),
            "{id} removed: {downtime:?}"
        );
    }
    assert!(downtime.iter().any(|e| is(e, ContainerStarted, &sb3)));
    assert!(
        !downtime
            .iter()
            .any(|e| is(e, ContainerStarted, &c1) || is(e, ContainerStarted, &sb1)),
        "nothing published before is published again"
    );

    // A change seen live, then plegd killed at once; more changes while it is down.
    node.sim.exit_container(&c3, 5);
    let live = rt.block_on(events_until(&mut stream, "c3's death", |e| {
        is(e, ContainerDied, &c3)
    }));
    assert_follow(downtime.last().unwrap().revision, &live);
    let r2 = live.last().unwrap().revision;
    drop(stream);
    kill(second);
    node.sim.remove_pod(&sb1);
    let sb4 = node.sim.run_pod("u4", "queue", "ns");
    let c4 = node.sim.run_container(&sb4, "app");

    let third = node.start(3, &otlp);
    let (hello, mut stream) = rt.block_on(watch(&node.api(), Some(r2), &instance));
    assert_eq!(
        hello.instance_id, instance,
        "the same instance after SIGKILL"
    );
    let after_kill = rt.block_on(events_until(&mut stream, "u4's container", |e| {
        is(e, ContainerStarted, &c4)
    }));
    assert_follow(r2, &after_kill);
    for id in [&sb1, &c1] {
        assert!(
            after_kill.iter().any(|e| is(e, ContainerRemoved, id)),
            "{id} removed: {after_kill:?}"
        );
    }
    assert!(
        !after_kill.iter().any(|e| is(e, ContainerDied, &c3)),
        "c3's death told once"
    );
    // A client that was further behind replays the history across both restarts.
    let (_, mut from_start) = rt.block_on(watch(&node.api(), Some(0), &instance));
    let all = rt.block_on(events_until(&mut from_start, "u4's container", |e| {
        is(e, ContainerStarted, &c4)
    }));
    assert_follow(0, &all);
    let mut expected: Vec<v1::Event> = seen.clone();
    expected.extend(downtime.iter().cloned());
    expected.extend(live.iter().cloned());
    expected.extend(after_kill.iter().cloned());
    // (Each stream numbers its own deliveries.)
    let unnumbered = |events: Vec<v1::Event>| -> Vec<v1::Event> {
        events
            .into_iter()
            .map(|e| v1::Event { seq: 0, ..e })
            .collect()
    };
    assert_eq!(
        unnumbered(all.clone()),
        unnumbered(expected),
        "the history is what was published, once"
    );
    let last = all.last().unwrap().revision;
    drop((stream, from_start));
    stop(third);

    // The event writer: every revision at least once, one instance, a line written
    // twice (after the kill) the same both times.
    let text = std::fs::read_to_string(node.events()).unwrap();
    let mut lines: BTreeMap<u64, Value> = BTreeMap::new();
    for line in text.lines() {
        let mut v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["instance"], instance.as_str(), "{line}");
        let revision = v["revision"].as_u64().unwrap();
        // The per-output sequence number restarts with each process.
        v["seq"] = Value::Null;
        if let Some(before) = lines.insert(revision, v.clone()) {
            assert_eq!(before, v, "revision {revision} written twice differently");
        }
    }
    let revisions: Vec<u64> = lines.keys().copied().collect();
    assert_eq!(
        revisions,
        (1..=last).collect::<Vec<_>>(),
        "stdout: every revision at least once"
    );

    // OTLP the same: at least once, by (plegd.instance_id, plegd.revision).
    let mut records: BTreeMap<u64, String> = BTreeMap::new();
    for log in collector.logs() {
        assert_eq!(
            log.attr("plegd.instance_id"),
            Some(&Otlp::StringValue(instance.clone())),
            "{log:?}"
        );
        let Some(Otlp::IntValue(revision)) = log.attr("plegd.revision") else {
            panic!("no revision: {log:?}");
        };
        let body = format!("{:?}", log.record.body);
        if let Some(before) = records.insert(*revision as u64, body.clone()) {
            assert_eq!(
                before, body,
                "revision {revision} exported twice differently"
            );
        }
    }
    let exported: Vec<u64> = records.keys().copied().collect();
    assert_eq!(
        exported,
        (1..=last).collect::<Vec<_>>(),
        "OTLP: every revision at least once"
    );
}

#[test]
fn a_second_plegd_on_the_same_state_dir_exits_1_saying_so() {
    let node = Node::new();
    let first = node.start(1, &[]);
    let other_api = node.dir.path().join("other.sock");
    let (out, _) = run_to_end(
        command(env!("CARGO_BIN_EXE_plegd"))
            .args(["run", "--runtime-endpoint", &node.server.endpoint()])
            .arg("--state-dir")
            .arg(&node.state)
            .arg("--api-socket")
            .arg(&other_api)
            .args(["--metrics-addr", "off"]),
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another plegd"), "{err}");
    assert!(
        err.contains(&first.0.id().to_string()),
        "names the holder's pid: {err}"
    );
    assert!(err.contains(&node.state.display().to_string()), "{err}");
    stop(first);
}

/// plegd started and stopped once on `node`, then its state replaced by `damage`;
/// the next start is a new instance that says why, and serves.
fn starts_fresh_after(damage: impl FnOnce(&Path), why: &str) {
    let node = Node::new();
    let sb = node.sim.run_pod("u1", "web", "ns");
    node.sim.run_container(&sb, "app");
    let rt = rt();
    let first = node.start(1, &[]);
    let (hello, _) = rt.block_on(watch(&node.api(), None, ""));
    stop(first);
    damage(&node.state.join("state"));
    let second = node.start(2, &[]);
    let (fresh, mut stream) = rt.block_on(watch(&node.api(), Some(0), ""));
    assert_ne!(fresh.instance_id, hello.instance_id, "a new identity");
    // It serves: the node's pod, from revision 1.
    let got = rt.block_on(events_until(&mut stream, "the pod's sandbox", |e| {
        e.container_id == sb
    }));
    assert_eq!(got[0].revision, 1);
    let log = node.log_text(2);
    assert!(log.contains("set aside"), "{log}");
    assert!(log.contains(why), "the reason ({why}) is told: {log}");
    assert_eq!(log.matches("set aside").count(), 1, "told once: {log}");
    assert!(node.state.join("state.discarded").exists());
    // The old identity is refused, not mistaken for this one.
    let mut client = rt.block_on(plegd_api::connect(&node.api())).unwrap();
    let refused = rt.block_on(client.watch(v1::WatchRequest {
        since_revision: Some(1),
        instance_id: hello.instance_id.clone(),
        ..Default::default()
    }));
    assert_eq!(refused.unwrap_err().code(), tonic::Code::FailedPrecondition);
    stop(second);
}

#[test]
fn a_damaged_state_is_set_aside_and_plegd_starts_fresh() {
    starts_fresh_after(
        |path| {
            let mut bytes = std::fs::read(path).unwrap();
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0x55;
            std::fs::write(path, bytes).unwrap();
        },
        "damaged",
    );
}

#[test]
fn a_foreign_file_as_state_is_set_aside_and_plegd_starts_fresh() {
    starts_fresh_after(
        |path| std::fs::write(path, b"{\"not\": \"a plegd state\"}\n").unwrap(),
        "not a plegd state file",
    );
}

/// (A cut among the commits after the snapshot is what a killed process leaves: plegd
/// goes on from it; `restarts` above and `state_resume` cover that.)
#[test]
fn a_state_cut_inside_its_snapshot_is_set_aside_and_plegd_starts_fresh() {
    starts_fresh_after(
        |path| {
            let bytes = std::fs::read(path).unwrap();
            // The header's record, then 5 bytes of the snapshot's first.
            let header = 8 + u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
            std::fs::write(path, &bytes[..header + 5]).unwrap();
        },
        "incomplete",
    );
}

#[test]
fn an_unusable_state_dir_is_told_once_and_plegd_runs_without_one() {
    let node = Node::new();
    // A regular file where the dir should be.
    std::fs::write(&node.state, b"x").unwrap();
    let p = node.start(1, &[]);
    let rt = rt();
    let (hello, _) = rt.block_on(watch(&node.api(), None, ""));
    assert_eq!(hello.instance_id.len(), 32);
    let log = node.log_text(1);
    assert!(log.contains("runs without a state dir"), "{log}");
    stop(p);
}

fn mount_tmpfs(at: &Path, size: &str) -> Mount {
    std::fs::create_dir_all(at).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(at)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "this test mounts a small tmpfs (it runs as root in CI)");
    Mount(at.to_path_buf())
}

struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

fn metric(port: u16, name: &str) -> Option<f64> {
    let (_, body) = http_get(port, "/metrics")?;
    body.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn a_full_disk_keeps_plegd_serving_and_a_crash_then_costs_a_new_identity_never_a_reused_revision() {
    use v1::EventType::ContainerStarted;
    let node = Node::new();
    let _mount = mount_tmpfs(&node.state, "2m");
    let port = free_port();
    let metrics = ["--metrics-addr", &format!("127.0.0.1:{port}")];
    let rt = rt();
    let first = node.start(1, &metrics);
    let (hello, mut stream) = rt.block_on(watch(&node.api(), Some(0), ""));
    wait_until("persisting", || {
        metric(port, "plegd_state_persisting") == Some(1.0)
    });
    // Fill the disk, then change the node: the relists cannot be stored.
    let filler = node.state.join("filler");
    let _ = std::fs::write(&filler, vec![0u8; 4 << 20]);
    let mut last = 0;
    let mut containers = Vec::new();
    for i in 0..20 {
        let sb = node.sim.run_pod(&format!("u{i}"), &"n".repeat(200), "ns");
        let c = node.sim.run_container(&sb, "app");
        let got = rt.block_on(events_until(&mut stream, "a container", |e| {
            is(e, ContainerStarted, &c)
        }));
        assert_follow(last, &got);
        last = got.last().unwrap().revision;
        containers.push(c);
    }
    wait_until("the write failure is told", || {
        metric(port, "plegd_state_write_failures_total").unwrap_or(0.0) >= 1.0
    });
    assert_eq!(metric(port, "plegd_state_persisting"), Some(0.0));
    let (_, ready) = http_get(port, "/readyz").unwrap();
    assert!(ready.contains("state dir: FAILING"), "{ready}");
    assert!(node.log_text(1).contains("the state dir is failing"));
    // The history's file could not be written either: the history went back to
    // memory, whole, and a replay from the start still gets every revision.
    wait_until("the history back in memory", || {
        node.log_text(1).contains("the history is kept in memory")
    });
    let (_, mut replay) = rt.block_on(watch(&node.api(), Some(0), ""));
    let got = rt.block_on(events_until(&mut replay, "the replay's end", |e| {
        e.revision == last
    }));
    assert_follow(0, &got);
    drop(replay);
    // Killed while behind: the next start must not be the same instance (the state
    // on disk is older than what clients saw).
    drop(stream);
    kill(first);
    let second = node.start(2, &metrics);
    let (fresh, mut stream) = rt.block_on(watch(&node.api(), Some(0), ""));
    assert_ne!(
        fresh.instance_id, hello.instance_id,
        "a new identity after a crash while behind"
    );
    assert!(node.log_text(2).contains("behind"), "{}", node.log_text(2));
    rt.block_on(events_until(&mut stream, "the last container", |e| {
        is(e, ContainerStarted, containers.last().unwrap())
    }));
    // Room again: plegd writes its state anew and persists.
    std::fs::remove_file(&filler).unwrap();
    wait_until("persisting again", || {
        metric(port, "plegd_state_persisting") == Some(1.0)
    });
    drop(stream);
    stop(second);
    let third = node.start(3, &metrics);
    let (again, _) = rt.block_on(watch(&node.api(), None, ""));
    assert_eq!(
        again.instance_id, fresh.instance_id,
        "stored again: the same instance"
    );
    stop(third);
}

/// The event writer's cursor is what it flushed: killed while its reader stalled (the
/// pipe full, events still queued), the next start writes them from the stored
/// history. Together the two outputs hold every revision.
#[test]
fn the_event_writer_goes_on_from_its_cursor_after_a_kill_while_its_reader_stalled() {
    use std::io::Read as _;
    let node = Node::new();
    for i in 0..150 {
        let sb = node
            .sim
            .run_pod(&format!("u{i}"), &format!("pod-{i}"), "ns");
        node.sim.run_container(&sb, "app");
    }
    let port = free_port();
    let mut first = command(env!("CARGO_BIN_EXE_plegd"))
        .args(["run", "--runtime-endpoint", &node.server.endpoint()])
        .arg("--state-dir")
        .arg(&node.state)
        .args(["--events-json", "-", "--hint-sources", "none"])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Nobody reads: the pipe fills (64 KiB) long before the 300 events are written.
    let mut pipe = first.stdout.take().unwrap();
    wait_until("every event published (and so stored)", || {
        metric(port, "kubelet_pleg_events_total{relist_source=\"global\"}") == Some(300.0)
    });
    signal(&first, "KILL");
    let _ = wait_exit(&mut first);
    let mut piped = String::new();
    pipe.read_to_string(&mut piped).unwrap();
    let second = node.start(2, &[]);
    let rt = rt();
    let (hello, _) = rt.block_on(watch(&node.api(), None, ""));
    stop(second);
    let written = std::fs::read_to_string(node.events()).unwrap();
    let revision = |line: &str| -> u64 {
        let v: Value = serde_json::from_str(line).unwrap();
        v["revision"].as_u64().unwrap()
    };
    let before: std::collections::BTreeSet<u64> = piped
        .lines()
        .filter(|l| l.ends_with('}'))
        .map(revision)
        .collect();
    let after: std::collections::BTreeSet<u64> = written.lines().map(revision).collect();
    assert!(
        before.len() < 300,
        "the pipe stalled the writer: {}",
        before.len()
    );
    assert!(!after.is_empty(), "the restart wrote what the kill left");
    let all: Vec<u64> = before.union(&after).copied().collect();
    assert_eq!(
        all,
        (1..=300).collect::<Vec<_>>(),
        "every revision at least once"
    );
    assert!(written.lines().all(|l| l.contains(&hello.instance_id)));
}
