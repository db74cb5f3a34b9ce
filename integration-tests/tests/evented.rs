//! The evented fast path through the real tonic CRI client against the simulated
//! CRI server (KEP-3386 test plan): stream faults and recovery, malformed, duplicate,
//! stale and reordered events, full queues, storms, SyncPod suspension, shutdown, and
//! no accumulation of streams, sockets or gate actors.

use plegd_telemetry::{RequestResult, StreamEventType};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use integration_tests::pleg::{post_allocation_settled, started_on_request};
use integration_tests::wait::*;
use plegd_actors::ReconnectPolicy;
use plegd_actors::WatcherState;
use plegd_actors::{Delivery, EventKind, RelistSource};
use plegd_actors::{Pleg, PlegConfig};
use plegd_actors::{SyncError, SyncOutcome};
use plegd_runtime::cri;
use plegd_runtime::CriRuntime;
use plegd_sim::{spawn_in_thread, FakeRuntime, Op, ThreadedSimServer};
use plegd_telemetry::Metrics;
use tempfile::TempDir;

struct Env {
    dir: TempDir,
    sim: FakeRuntime,
    server: Option<ThreadedSimServer>,
    pleg: Pleg,
}

impl Env {
    fn socket(&self) -> std::path::PathBuf {
        self.dir.path().join("cri.sock")
    }

    /// Crash the runtime (no grace), as SIGKILL would.
    fn kill_runtime(&mut self) {
        if let Some(s) = self.server.take() {
            s.kill();
        }
    }

    /// Start the runtime again on the same socket, with the same state.
    fn restart_runtime(&mut self) {
        self.server = Some(spawn_in_thread(&self.socket(), self.sim.clone()).unwrap());
    }

    async fn stream_state(&self) -> (&'static str, u64) {
        let s = self.watcher_state().await;
        (s.state, s.attempts)
    }

    async fn watcher_state(&self) -> WatcherState {
        self.pleg.watcher_state().await.expect("evented")
    }

    async fn wait_connected(&self) {
        let m = self.pleg.metrics().clone();
        wait_until("stream connected", || m.stream_connected.get() == 1).await;
        // The server side has its stream too (events sent now reach plegd).
        let sim = self.sim.clone();
        wait_until("server stream", || sim.event_streams() >= 1).await;
    }
}

fn fast_policy() -> ReconnectPolicy {
    ReconnectPolicy::new(
        Duration::from_millis(10),
        Duration::from_millis(200),
        Duration::from_secs(1),
    )
    .unwrap()
}

fn cfg(period: Duration) -> PlegConfig {
    PlegConfig {
        relist_period: period,
        reconnect: fast_policy(),
        gate_idle: Duration::from_millis(20),
        ..PlegConfig::default()
    }
}

fn env(sim: FakeRuntime, cfg: PlegConfig) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let server = spawn_in_thread(&dir.path().join("cri.sock"), sim.clone()).unwrap();
    let cri = CriRuntime::new(&server.endpoint(), Duration::from_secs(2)).unwrap();
    let pleg = Pleg::start(Arc::new(cri), &cfg, Arc::new(Metrics::new()));
    Env {
        dir,
        sim,
        server: Some(server),
        pleg,
    }
}

/// A pod with one running container, seen by plegd.
async fn running_pod(e: &Env, uid: &str, sub: &plegd_actors::Subscription) -> (String, String) {
    // After the first global relist, a long period leaves only targeted relists.
    let health = e.pleg.health().clone();
    wait_until("first global relist", || health.ready()).await;
    let sb = e.sim.run_pod(uid, uid, "ns");
    let c = e.sim.run_container(&sb, "app");
    // With a long period only the first global relist or a bring-forward sees it:
    // make sure it is seen by asking for a post-allocation relist (a targeted read).
    started_on_request(&e.pleg, sub, uid, &c).await;
    (sb, c)
}

/// Waits until at least `n` stream requests were queued after `queued_before` was read
/// and every queued one has been handled (no sync holds in these tests).
async fn wait_evented_relists(m: &Metrics, queued_before: u64, n: u64) {
    wait_until("stream-requested relists handled", || {
        let queued = m.requests(RequestResult::Queued, RelistSource::EventedPleg);
        let handled: u64 = [
            RequestResult::Done,
            RequestResult::Skipped,
            RequestResult::Coalesced,
            RequestResult::Merged,
        ]
        .into_iter()
        .map(|r| m.requests(r, RelistSource::EventedPleg))
        .sum();
        queued >= queued_before + n && handled == queued
    })
    .await;
}

const LONG: Duration = Duration::from_secs(3600);

#[actix_rt::test]
async fn a_container_exit_is_published_by_the_evented_relist() {
    let e = env(FakeRuntime::new(), cfg(LONG));
    let sub = e.pleg.subscribe("t", 1024).await.unwrap();
    e.wait_connected().await;
    let (_, c) = running_pod(&e, "u1", &sub).await;
    // Events the evented relist published, as the subscriber saw them.
    let mut evented = 0;
    let by_stream = |got: &[Delivery]| {
        got.iter()
            .filter(|d| d.event.relist_source == RelistSource::EventedPleg)
            .count() as u64
    };
    for code in [0, 1, 137] {
        let sb = e.sim.sandboxes_of("u1").pop().unwrap();
        let c2 = if code == 0 {
            c.clone()
        } else {
            e.sim.run_container(&sb, &format!("c{code}"))
        };
        if code != 0 {
            // The last exit's relist may still be reading the pod: it or this request
            // publishes the start.
            evented += by_stream(&started_on_request(&e.pleg, &sub, "u1", &c2).await);
        }
        e.sim.exit_container(&c2, code);
        let got = recv_until(&sub, "the exit", |d| {
            d.event.kind == EventKind::ContainerDied && d.event.container_id == c2
        })
        .await;
        evented += by_stream(&got);
        let d = got.last().expect("recv_until returns the match last");
        assert_eq!(
            d.event.relist_source,
            RelistSource::EventedPleg,
            "exit code {code}"
        );
    }
    assert!(evented >= 3);
    assert_eq!(e.pleg.metrics().events(RelistSource::EventedPleg), evented);
    assert!(e.pleg.metrics().connection_latency.get_sample_count() > 0);
}

#[actix_rt::test]
async fn a_start_on_request_waits_for_the_request_the_stream_beat() {
    let e = env(FakeRuntime::new(), cfg(LONG));
    let sub = e.pleg.subscribe("t", 1024).await.unwrap();
    e.wait_connected().await;
    let (sb, c) = running_pod(&e, "u1", &sub).await;
    // An exit's relist publishes the death from its status read while its lists of
    // the pod are held: a container started now is in those lists.
    let lists = e.sim.calls(Op::ListContainers);
    e.sim.hold(Op::ListContainers);
    e.sim.exit_container(&c, 0);
    let d = expect_event(&sub, EventKind::ContainerDied, &c).await;
    assert_eq!(d.event.relist_source, RelistSource::EventedPleg);
    let sim = e.sim.clone();
    wait_until("the exit's lists in flight", || {
        sim.calls(Op::ListContainers) > lists
    })
    .await;
    let c2 = e.sim.run_container(&sb, "second");
    // The request made now reads the pod again once that read ends, slowly.
    e.sim
        .set_latency(Op::ListContainers, Duration::from_millis(300));
    let m = e.pleg.metrics().clone();
    let before = post_allocation_settled(&m);
    let release = async {
        e.sim.release(Op::ListContainers);
    };
    let (got, ()) = futures::join!(started_on_request(&e.pleg, &sub, "u1", &c2), release);
    assert_eq!(
        got.last().map(|d| d.event.relist_source),
        Some(RelistSource::EventedPleg),
        "the exit's relist published the start"
    );
    // Back only once the request was done: it cannot claim the next exit.
    assert!(post_allocation_settled(&m) > before);
    e.sim.set_latency(Op::ListContainers, Duration::ZERO);
    e.sim.exit_container(&c2, 3);
    let d = expect_event(&sub, EventKind::ContainerDied, &c2).await;
    assert_eq!(d.event.relist_source, RelistSource::EventedPleg);
}

#[actix_rt::test]
async fn the_stream_recovers_after_a_runtime_crash_and_the_relist_finds_what_it_missed() {
    let mut e = env(FakeRuntime::new(), cfg(LONG));
    let sub = e.pleg.subscribe("t", 1024).await.unwrap();
    e.wait_connected().await;
    let (_, c) = running_pod(&e, "u1", &sub).await;
    let errors = e.pleg.metrics().connection_errors.get();
    e.kill_runtime();
    let m = e.pleg.metrics().clone();
    wait_until("stream error seen", || m.connection_errors.get() > errors).await;
    assert_eq!(m.stream_connected.get(), 0);
    // The container exits while the runtime is down: no event can report it.
    e.sim.exit_container(&c, 255);
    e.restart_runtime();
    e.wait_connected().await;
    // The reconnect after an outage brought the global relist forward (the period is
    // an hour): it finds the death.
    let d = expect_event(&sub, EventKind::ContainerDied, &c).await;
    assert_eq!(d.event.relist_source, RelistSource::Global);
    assert!(e.pleg.health().check().is_ok());
    // And the fast path works again.
    let sb = e.sim.sandboxes_of("u1").pop().unwrap();
    let c2 = e.sim.run_container(&sb, "again");
    started_on_request(&e.pleg, &sub, "u1", &c2).await;
    e.sim.exit_container(&c2, 1);
    let d = expect_event(&sub, EventKind::ContainerDied, &c2).await;
    assert_eq!(d.event.relist_source, RelistSource::EventedPleg);
}

#[actix_rt::test]
async fn unimplemented_retries_at_the_cap_until_the_runtime_is_upgraded() {
    let sim = FakeRuntime::new();
    sim.fail(Op::Events, tonic::Code::Unimplemented, None);
    let e = env(sim, cfg(Duration::from_millis(50)));
    let sub = e.pleg.subscribe("t", 1024).await.unwrap();
    let m = e.pleg.metrics().clone();
    wait_until("three failed attempts", || m.connection_errors.get() >= 3).await;
    // Generic relisting works meanwhile and health is green: with no stream and no
    // targeted request, only the global relist can see this pod start and stop.
    let sb = e.sim.run_pod("u1", "u1", "ns");
    let c = e.sim.run_container(&sb, "app");
    let d = expect_event(&sub, EventKind::ContainerStarted, &c).await;
    assert_eq!(d.event.relist_source, RelistSource::Global);
    e.sim.exit_container(&c, 1);
    let d = expect_event(&sub, EventKind::ContainerDied, &c).await;
    assert_eq!(d.event.relist_source, RelistSource::Global);
    assert!(e.pleg.health().check().is_ok());
    let w = e.watcher_state().await;
    assert_eq!(w.state, "waiting");
    assert_eq!(w.live_futures, 1, "only the retry timer is alive");
    // The runtime is "upgraded": the stream opens without restarting plegd.
    e.sim.clear_failure(Op::Events);
    e.wait_connected().await;
    assert_eq!(e.stream_state().await.0, "streaming");
}

#[actix_rt::test]
async fn eof_clean_close_and_mid_stream_errors_reconnect() {
    let e = env(FakeRuntime::new(), cfg(LONG));
    let sub = e.pleg.subscribe("t", 1024).await.unwrap();
    e.wait_connected().await;
    let m = e.pleg.metrics().clone();
    for (i, fault) in ["close", "error", "close", "error"].iter().enumerate() {
        let errors = m.connection_errors.get();
        let opened = m.connection_successes.get();
        match *fault {
            "close" => assert!(e.sim.close_streams() >= 1),
            _ => assert!(e.sim.fail_streams(tonic::Code::Internal) >= 1),
        }
        wait_until("failure counted", || {
            m.connection_errors.get() == errors + 1
        })
        .await;
        wait_until("reopened", || m.connection_successes.get() == opened + 1).await;
        assert_eq!(m.reconnect_attempts.get(), i as u64 + 1);
    }
    e.wait_connected().await;
    let (_, c) = running_pod(&e, "u1", &sub).await;
    e.sim.exit_container(&c, 1);
    let d = expect_event(&sub, EventKind::ContainerDied, &c).await;
    assert_eq!(d.event.relist_source, RelistSource::EventedPleg);
}

#[actix_rt::test]
async fn a_flapping_runtime_does_not_cause_a_tight_loop() {
    let e = env(FakeRuntime::new(), cfg(LONG));
    e.wait_connected().await;
    let m = e.pleg.metrics().clone();
    let start_attempts = m.reconnect_attempts.get();
    // For one second, every stream that opens is closed at once.
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    while std::time::Instant::now() < deadline {
        e.sim.close_streams();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let attempts = m.reconnect_attempts.get() - start_attempts;
    // Immediate, then 10, 20, 40, 80, 160, 200, 200... ms: about 10 in a second; a
    // tight loop would make hundreds.
    assert!(attempts >= 3, "{attempts} attempts: not retrying");
    assert!(attempts <= 20, "{attempts} attempts in 1 s: a tight loop");
}

fn stopped_event(
    uid: Option<&str>,
    with_status: bool,
    with_meta: bool,
) -> cri::ContainerEventResponse {
    cri::ContainerEventResponse {
        container_id: "c-x".into(),
        container_event_type: cri::ContainerEventType::ContainerStoppedEvent as i32,
        created_at: plegd_runtime::now_ns(),
        pod_sandbox_status: with_status.then(|| cri::PodSandboxStatus {
            id: "sb-x".into(),
            metadata: with_meta.then(|| cri::PodSandboxMetadata {
                uid: uid.unwrap_or_default().into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        containers_statuses: vec![],
    }
}

#[actix_rt::test]
async fn events_without_sandbox_status_metadata_or_uid_are_ignored() {
    let e = env(FakeRuntime::new(), cfg(LONG));
    e.wait_connected().await;
    let m = e.pleg.metrics().clone();
    e.sim.inject_event(stopped_event(None, false, false));
    e.sim.inject_event(stopped_event(None, true, false));
    e.sim.inject_event(stopped_event(Some(""), true, true));
    // A valid one after them proves they were all read.
    e.sim
        .inject_event(stopped_event(Some("u-valid"), true, true));
    wait_until("valid one requested", || {
        m.requests(RequestResult::Queued, RelistSource::EventedPleg) == 1
    })
    .await;
    assert_eq!(m.stream_events(StreamEventType::Invalid), 3);
    assert_eq!(m.stream_events(StreamEventType::Stopped), 1);
}

#[actix_rt::test]
async fn duplicate_delayed_stale_and_reordered_events_change_nothing() {
    let e = env(FakeRuntime::new(), cfg(LONG));
    let sub = e.pleg.subscribe("t", 1024).await.unwrap();
    e.wait_connected().await;
    let (sb, c) = running_pod(&e, "u1", &sub).await;
    let started = e
        .sim
        .event_about(&c, cri::ContainerEventType::ContainerStartedEvent);
    let m = e.pleg.metrics().clone();
    let queued = m.requests(RequestResult::Queued, RelistSource::EventedPleg);
    e.sim.exit_container(&c, 2);
    expect_event(&sub, EventKind::ContainerDied, &c).await;
    let stopped = e
        .sim
        .event_about(&c, cri::ContainerEventType::ContainerStoppedEvent);
    // Duplicates of the stop, a stale STARTED (delayed from before the exit), and
    // a reordered pair (STOPPED, then an older STARTED): six more stop requests.
    for _ in 0..5 {
        e.sim.inject_event(stopped.clone());
    }
    e.sim.inject_event(started.clone());
    e.sim.inject_event(stopped.clone());
    e.sim.inject_event(started);
    wait_evented_relists(&m, queued, 1 + 6).await;
    assert!(drain(&sub).is_empty(), "no extra lifecycle events");
    // The cache holds what the runtime says (exited), never an event payload.
    let st = e.pleg.cache().get("u1").unwrap().status.unwrap();
    let cs = st.containers.iter().find(|s| s.id == c).unwrap();
    assert_eq!(cs.state, plegd_runtime::ContainerState::Exited);
    assert_eq!(cs.exit_code, 2);
    // A stop event for a pod that is gone: a no-op, and no event.
    let queued = m.requests(RequestResult::Queued, RelistSource::EventedPleg);
    e.sim.remove_pod(&sb); // stops the sandbox first: one stop event
    e.pleg.request_relist("u1", RelistSource::PostAllocation);
    expect_event(&sub, EventKind::ContainerRemoved, &c).await;
    wait_evented_relists(&m, queued, 1).await;
    let queued = m.requests(RequestResult::Queued, RelistSource::EventedPleg);
    e.sim.inject_event(stopped);
    wait_evented_relists(&m, queued, 1).await;
    assert!(drain(&sub).is_empty());
    assert!(e.pleg.cache().get("u1").is_none());
}

#[actix_rt::test]
async fn a_full_queue_drops_stream_requests_and_the_global_relist_converges() {
    let mut c = cfg(Duration::from_millis(300));
    c.queue_capacity = 2;
    let e = env(FakeRuntime::new(), c);
    let sub = e.pleg.subscribe("t", 100_000).await.unwrap();
    e.wait_connected().await;
    let mut containers = Vec::new();
    for i in 0..50 {
        let sb = e.sim.run_pod(&format!("u{i}"), "p", "ns");
        containers.push(e.sim.run_container(&sb, "app"));
    }
    let m = e.pleg.metrics().clone();
    let n = containers.len();
    let mut seen = std::collections::HashSet::new();
    recv_until(&sub, "all started", |d| {
        if d.event.kind == EventKind::ContainerStarted {
            seen.insert(d.event.container_id.clone());
        }
        containers.iter().all(|c| seen.contains(c))
    })
    .await;
    e.sim
        .set_latency(Op::ListSandboxes, Duration::from_millis(20));
    for c in &containers {
        e.sim.exit_container(c, 1);
    }
    let mut died = std::collections::HashMap::new();
    recv_until(&sub, "all died", |d| {
        if d.event.kind == EventKind::ContainerDied {
            *died.entry(d.event.container_id.clone()).or_insert(0) += 1;
        }
        died.len() == n
    })
    .await;
    let dropped = m.requests(RequestResult::Dropped, RelistSource::EventedPleg);
    assert!(dropped > 0, "the queue never filled");
    // A dropped request's pod can only be found by a global relist.
    assert!(m.events(RelistSource::Global) >= 1);
    let before = m.relist_duration.get_sample_count();
    wait_until("two more global relists", || {
        m.relist_duration.get_sample_count() >= before + 2
    })
    .await;
    for d in drain(&sub) {
        if d.event.kind == EventKind::ContainerDied {
            *died.entry(d.event.container_id.clone()).or_insert(0) += 1;
        }
    }
    assert!(
        died.values().all(|n| *n == 1),
        "each death exactly once: {died:?}"
    );
}

#[actix_rt::test]
async fn a_termination_storm_keeps_the_global_relist_on_schedule() {
    let mut c = cfg(Duration::from_millis(100));
    c.queue_capacity = 100_000;
    let e = env(FakeRuntime::new(), c);
    let sub = e.pleg.subscribe("t", 100_000).await.unwrap();
    e.wait_connected().await;
    let (_, other) = running_pod(&e, "other", &sub).await;
    e.sim
        .set_latency(Op::ListContainers, Duration::from_millis(1));
    let m = e.pleg.metrics().clone();
    // Thousands of stop events for pods of all kinds keep arriving.
    let storming = Arc::new(AtomicBool::new(true));
    let (flag, sim) = (storming.clone(), e.sim.clone());
    let storm = std::thread::spawn(move || {
        let mut i = 0u64;
        while flag.load(Ordering::Relaxed) {
            for _ in 0..100 {
                i += 1;
                sim.inject_event(stopped_event(
                    Some(&format!("storm-{}", i % 500)),
                    true,
                    true,
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        i
    });
    wait_until("storm under way", || {
        m.requests(RequestResult::Queued, RelistSource::EventedPleg) > 2_000
    })
    .await;
    let before = m.relist_duration.get_sample_count();
    // Stream events say nothing of "other": only a global relist can see this exit.
    e.sim.fail_streams(tonic::Code::Unavailable); // reconnect: its events are lost
    e.sim.exit_container(&other, 1);
    let d = expect_event(&sub, EventKind::ContainerDied, &other).await;
    assert_eq!(d.event.relist_source, RelistSource::Global);
    wait_until("global relists continue", || {
        m.relist_duration.get_sample_count() >= before + 5
    })
    .await;
    storming.store(false, Ordering::Relaxed);
    let sent = storm.join().unwrap();
    assert!(sent >= 2_000, "{sent}");
}

#[actix_rt::test]
async fn sync_suspension_coalesces_and_releases_exactly_once() {
    // A long period: every relist below is one the test asked for, so each event's
    // source is certain.
    let e = env(FakeRuntime::new(), cfg(LONG));
    let sub = e.pleg.subscribe("t", 1024).await.unwrap();
    e.wait_connected().await;
    let (sb, c) = running_pod(&e, "u1", &sub).await;
    let m = e.pleg.metrics().clone();

    // Success path: requests during the hold coalesce; the exit is not published
    // while held, even by a global relist; release queues exactly one relist.
    let hold = e.pleg.gates().begin_sync("u1").await.unwrap();
    assert_eq!(
        e.pleg.gates().begin_sync("u1").await.err(),
        Some(SyncError::AlreadyHeld)
    );
    e.sim.exit_container(&c, 1); // a stop event → coalesced
    e.pleg.request_relist("u1", RelistSource::PostAllocation);
    wait_until("coalesced", || {
        m.requests(RequestResult::Coalesced, RelistSource::EventedPleg) == 1
            && m.requests(RequestResult::Coalesced, RelistSource::PostAllocation) == 1
    })
    .await;
    let before = m.relist_duration.get_sample_count();
    e.pleg.bring_global_relist_forward();
    wait_until("a global relist while held", || {
        m.relist_duration.get_sample_count() > before
    })
    .await;
    assert!(drain(&sub).is_empty(), "nothing published for a held pod");
    hold.end(SyncOutcome::Success);
    let d = expect_event(&sub, EventKind::ContainerDied, &c).await;
    assert_eq!(d.event.relist_source, RelistSource::PostSync);
    assert_eq!(m.requests(RequestResult::Queued, RelistSource::PostSync), 1);

    // Error path with a pending request: one relist.
    let c2 = e.sim.run_container(&sb, "b");
    let hold = e.pleg.gates().begin_sync("u1").await.unwrap();
    e.pleg.request_relist("u1", RelistSource::EventedPleg);
    hold.end(SyncOutcome::Error);
    let d = expect_event(&sub, EventKind::ContainerStarted, &c2).await;
    assert_eq!(d.event.relist_source, RelistSource::PostSync);
    assert_eq!(m.requests(RequestResult::Queued, RelistSource::PostSync), 2);

    // Error path with nothing pending: no relist.
    let hold = e.pleg.gates().begin_sync("u1").await.unwrap();
    hold.end(SyncOutcome::Error);
    // Cancellation (the holder goes away) with a pending request: one relist.
    let hold = e.pleg.gates().begin_sync("u1").await.unwrap();
    e.pleg.request_relist("u1", RelistSource::EventedPleg);
    drop(hold);
    wait_until("post-cancel relist", || {
        m.requests(RequestResult::Done, RelistSource::PostSync) == 3
    })
    .await;
    assert_eq!(m.requests(RequestResult::Queued, RelistSource::PostSync), 3);
    assert!(e.pleg.held_pods() == 0);
}

#[actix_rt::test]
async fn concurrent_requests_from_every_source_converge_without_deadlock() {
    // Every pod may still be unknown to plegd (not listed yet) at its first hold.
    let cfg = PlegConfig {
        max_unknown_holds: 20,
        ..cfg(Duration::from_millis(20))
    };
    let e = env(FakeRuntime::new(), cfg);
    let sub = e.pleg.subscribe("t", 100_000).await.unwrap();
    e.wait_connected().await;
    let mut pods = Vec::new();
    for i in 0..20 {
        let uid = format!("u{i}");
        let sb = e.sim.run_pod(&uid, &uid, "ns");
        pods.push((uid, e.sim.run_container(&sb, "app")));
    }
    let mut tasks = Vec::new();
    for (uid, c) in pods.clone() {
        let (pleg, sim) = (e.pleg.clone(), e.sim.clone());
        tasks.push(actix_rt::spawn(async move {
            for round in 0..5 {
                let hold = pleg.gates().begin_sync(&uid).await.unwrap();
                pleg.request_relist(&uid, RelistSource::PostAllocation);
                if round == 2 {
                    sim.exit_container(&c, 1);
                }
                tokio::task::yield_now().await;
                hold.end(if round % 2 == 0 {
                    SyncOutcome::Success
                } else {
                    SyncOutcome::Cancelled
                });
                pleg.request_relist(&uid, RelistSource::EventedPleg);
                tokio::task::yield_now().await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Every container started and died exactly once, whoever noticed.
    let mut died = std::collections::HashMap::new();
    recv_until(&sub, "every death", |d| {
        if d.event.kind == EventKind::ContainerDied {
            *died.entry(d.event.container_id.clone()).or_insert(0) += 1;
        }
        pods.iter().all(|(_, c)| died.contains_key(c))
    })
    .await;
    let before = e.pleg.metrics().relist_duration.get_sample_count();
    let m = e.pleg.metrics().clone();
    wait_until("quiet relists", || {
        m.relist_duration.get_sample_count() >= before + 3
    })
    .await;
    for d in drain(&sub) {
        if d.event.kind == EventKind::ContainerDied {
            *died.entry(d.event.container_id.clone()).or_insert(0) += 1;
        }
    }
    assert!(died.values().all(|n| *n == 1), "{died:?}");
    assert!(e.pleg.held_pods() == 0);
}

#[actix_rt::test]
async fn shutdown_mid_backoff_and_mid_relist() {
    let sim = FakeRuntime::new();
    sim.fail(Op::Events, tonic::Code::Unimplemented, None);
    sim.run_pod("u1", "p", "ns");
    let mut c = cfg(Duration::from_millis(10));
    c.reconnect = ReconnectPolicy::new(
        Duration::from_millis(10),
        Duration::from_secs(60),
        Duration::from_secs(60),
    )
    .unwrap();
    let e = env(sim, c);
    let m = e.pleg.metrics().clone();
    wait_until("waiting 60 s to retry", || m.connection_errors.get() >= 1).await;
    e.sim
        .set_latency(Op::ListContainers, Duration::from_millis(300));
    let calls = e.sim.calls(Op::ListContainers);
    wait_until("a relist in progress", || {
        e.sim.calls(Op::ListContainers) > calls
    })
    .await;
    e.pleg.stop();
    wait_until("watcher stopped", || !e.pleg.watcher_running()).await;
    wait_until("dispatcher stopped", || e.pleg.stopped()).await;
    assert_eq!(m.stream_connected.get(), 0);
    assert_eq!(e.sim.event_streams(), 0);
}

#[actix_rt::test]
async fn shutdown_cancels_an_open_stream() {
    let e = env(FakeRuntime::new(), cfg(LONG));
    e.wait_connected().await;
    e.pleg.stop();
    let sim = e.sim.clone();
    wait_until("server stream closed", || sim.event_streams() == 0).await;
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

#[actix_rt::test]
async fn no_accumulation_over_a_thousand_reconnects() {
    let mut c = cfg(LONG);
    c.reconnect = ReconnectPolicy::new(
        Duration::from_micros(100),
        Duration::from_micros(200),
        Duration::from_secs(3600),
    )
    .unwrap();
    let e = env(FakeRuntime::new(), c);
    e.wait_connected().await;
    let fds = open_fds();
    // Tasks on the client's runtime (tonic's connection and buffer workers, hyper's
    // streams); the server runs on its own thread and runtime.
    let tasks = || {
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks()
    };
    let tasks_before = tasks();
    let m = e.pleg.metrics().clone();
    while m.reconnect_attempts.get() < 1_000 {
        if m.stream_connected.get() == 1 {
            e.sim.close_streams();
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    e.wait_connected().await;
    let sim = e.sim.clone();
    wait_until("one server stream", || sim.event_streams() == 1).await;
    assert!(open_fds() <= fds + 2, "fds {fds} -> {}", open_fds());
    wait_until("no leftover tasks", || tasks() <= tasks_before + 2).await;
    // The watcher's own futures (actix runs them inside its context, not as tokio
    // tasks): each cancelled attempt, stream and timer was dropped.
    let live = e.watcher_state().await.live_futures;
    assert_eq!(live, 1, "only the open stream is alive");
    println!(
        "client runtime tasks: {tasks_before} before, {} after 1,000 reconnects; watcher futures alive: {live}",
        tasks()
    );
    // Still fully working.
    let sub = e.pleg.subscribe("t", 64).await.unwrap();
    let (_, c) = running_pod(&e, "u1", &sub).await;
    e.sim.exit_container(&c, 1);
    let d = expect_event(&sub, EventKind::ContainerDied, &c).await;
    assert_eq!(d.event.relist_source, RelistSource::EventedPleg);
}

#[actix_rt::test]
async fn no_accumulation_of_gates_over_ten_thousand_short_lived_pods() {
    let e = env(FakeRuntime::new(), cfg(Duration::from_millis(50)));
    let m = e.pleg.metrics().clone();
    for i in 0..10_000 {
        let uid = format!("short-{i}");
        let hold = e.pleg.gates().begin_sync(&uid).await.unwrap();
        e.pleg.request_relist(&uid, RelistSource::EventedPleg);
        hold.end(if i % 3 == 0 {
            SyncOutcome::Error
        } else {
            SyncOutcome::Success
        });
    }
    wait_until("every gate stopped", || m.sync_gates.get() == 0).await;
    assert!(e.pleg.held_pods() == 0);
    assert_eq!(
        m.requests(RequestResult::Coalesced, RelistSource::EventedPleg),
        10_000
    );
}
