//! The relist hint sources through the real tonic client against the simulated
//! runtime, which serves containerd's event service beside CRI on one socket:
//! containerd's task events alone bring a death (and an OOM kill) to plegd; garbage,
//! other namespaces, unknown IDs and duplicates ask for nothing more; the
//! subscription survives stream errors, EOF, Unimplemented and a runtime restart; the
//! same stop seen by two sources is one ContainerDied; with no source, the global
//! relist still publishes it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use integration_tests::pleg::started_on_request;
use integration_tests::wait::*;
use plegd_actors::{EventKind, HintSourceName, HintSourceState, Pleg, PlegConfig, RelistSource};
use plegd_actors::{ReconnectPolicy, Subscription};
use plegd_runtime::containerd_events::{self, CRI_NAMESPACE, TOPIC_EXIT};
use plegd_runtime::CriRuntime;
use plegd_runtime::RuntimeClient as _;
use plegd_sim::{spawn_in_thread, FakeRuntime, Intercept, Intercepted, Op, ThreadedSimServer};
use plegd_telemetry::{Metrics, RelistPhase, RequestResult};
use tempfile::TempDir;

struct Env {
    dir: TempDir,
    sim: FakeRuntime,
    server: Option<ThreadedSimServer>,
    pleg: Pleg,
    sub: Subscription,
}

/// Global relists so rare that only a hint (or the first relist) finds anything.
const RARE: Duration = Duration::from_secs(3600);

async fn env(sources: &[HintSourceName], period: Duration, sim: FakeRuntime) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let server = spawn_in_thread(&dir.path().join("cri.sock"), sim.clone()).unwrap();
    let cri = CriRuntime::new(&server.endpoint(), Duration::from_secs(2)).unwrap();
    let cfg = PlegConfig {
        relist_period: period,
        hint_sources: sources.to_vec(),
        reconnect: ReconnectPolicy::new(
            Duration::from_millis(10),
            Duration::from_millis(200),
            Duration::from_secs(1),
        )
        .unwrap(),
        ..PlegConfig::default()
    };
    let pleg = Pleg::start(Arc::new(cri), &cfg, Arc::new(Metrics::new()));
    let sub = pleg.subscribe("test", 4096).await.unwrap();
    let health = pleg.health().clone();
    wait_until("first global relist", || health.ready()).await;
    Env {
        dir,
        sim,
        server: Some(server),
        pleg,
        sub,
    }
}

impl Env {
    fn state(&self, s: HintSourceName) -> HintSourceState {
        self.pleg.metrics().hint_source_state(s)
    }

    async fn wait_state(&self, s: HintSourceName, want: HintSourceState) {
        let m = self.pleg.metrics().clone();
        wait_until(&format!("{s} {want}"), || m.hint_source_state(s) == want).await;
    }

    /// containerd-events streaming at both ends.
    async fn wait_subscribed(&self) {
        self.wait_state(HintSourceName::ContainerdEvents, HintSourceState::Streaming)
            .await;
        let sim = self.sim.clone();
        wait_until("server subscription", || sim.task_event_streams() >= 1).await;
    }

    /// A pod with one running container, in plegd's cache.
    async fn running_pod(&self, uid: &str) -> String {
        let sb = self.sim.run_pod(uid, uid, "ns");
        let c = self.sim.run_container(&sb, "app");
        started_on_request(&self.pleg, &self.sub, uid, &c).await;
        let (cache, c2) = (self.pleg.cache().clone(), c.clone());
        wait_until("cached", || cache.pod_of_container(&c2).is_some()).await;
        c
    }

    fn queued(&self, s: RelistSource) -> u64 {
        self.pleg.metrics().requests(RequestResult::Queued, s)
    }

    fn restart_runtime(&mut self) {
        if let Some(s) = self.server.take() {
            s.kill();
        }
        let socket = self.dir.path().join("cri.sock");
        self.server = Some(spawn_in_thread(&socket, self.sim.clone()).unwrap());
    }
}

#[actix_rt::test]
async fn containerd_events_alone_bring_a_death_and_an_oom_kill() {
    let e = env(
        &[HintSourceName::ContainerdEvents],
        RARE,
        FakeRuntime::new(),
    )
    .await;
    e.wait_subscribed().await;
    assert_eq!(e.state(HintSourceName::CriEvents), HintSourceState::Off);
    // The client asked for the task topics of the CRI namespace only.
    assert_eq!(e.sim.task_filters(), containerd_events::subscribe_filters());
    let c = e.running_pod("u1").await;
    e.sim.exit_container(&c, 3);
    let d = expect_event(&e.sub, EventKind::ContainerDied, &c).await;
    assert_eq!(d.event.relist_source, RelistSource::ContainerdEvents);
    assert_eq!(d.event.exit.as_ref().map(|x| x.code), Some(3));
    // An OOM kill: its /tasks/oom asks too, and the read reports OOMKilled.
    let c2 = e.running_pod("u2").await;
    e.sim.oom_kill_container(&c2);
    let d = expect_event(&e.sub, EventKind::ContainerDied, &c2).await;
    assert_eq!(d.event.relist_source, RelistSource::ContainerdEvents);
    let reason = d.event.exit.as_ref().and_then(|x| x.reason.clone());
    assert_eq!(reason.as_deref(), Some("OOMKilled"));
    e.pleg.stop();
    e.wait_state(HintSourceName::ContainerdEvents, HintSourceState::Stopped)
        .await;
}

#[actix_rt::test]
async fn garbage_unknown_ids_and_duplicates_ask_for_nothing_more() {
    let e = env(
        &[HintSourceName::ContainerdEvents],
        RARE,
        FakeRuntime::new(),
    )
    .await;
    e.wait_subscribed().await;
    let c = e.running_pod("u1").await;
    let mut no_payload = containerd_events::envelope(CRI_NAMESPACE, TOPIC_EXIT, &c);
    no_payload.event = None;
    let mut garbage = containerd_events::envelope(CRI_NAMESPACE, TOPIC_EXIT, &c);
    if let Some(any) = garbage.event.as_mut() {
        any.value = vec![0xff; 9];
    }
    for env in [
        no_payload,
        garbage,
        containerd_events::envelope(CRI_NAMESPACE, TOPIC_EXIT, ""),
        // Another namespace (not CRI's), another topic, an ID plegd never saw.
        containerd_events::envelope("moby", TOPIC_EXIT, &c),
        containerd_events::envelope(CRI_NAMESPACE, "/tasks/start", &c),
        containerd_events::envelope(CRI_NAMESPACE, TOPIC_EXIT, "no-such-container"),
    ] {
        assert_eq!(e.sim.inject_task_event(env), 1);
    }
    // Bad items are no stream failures: the subscription stays, and the next death
    // still comes through it.
    assert_eq!(
        e.state(HintSourceName::ContainerdEvents),
        HintSourceState::Streaming
    );
    assert_eq!(e.sim.calls(Op::TaskEvents), 1);
    // The same exit three times (containerd's exit, delete and a replay): one death.
    e.sim.exit_container(&c, 0);
    for _ in 0..2 {
        e.sim
            .inject_task_event(containerd_events::envelope(CRI_NAMESPACE, TOPIC_EXIT, &c));
    }
    let d = expect_event(&e.sub, EventKind::ContainerDied, &c).await;
    assert_eq!(d.event.relist_source, RelistSource::ContainerdEvents);
    // A duplicate that comes while the first still waits for the dispatcher merges
    // into it (counted merged, not done): handled all the same.
    wait_until("every duplicate handled", || {
        let m = e.pleg.metrics();
        let settled = m.requests(RequestResult::Done, RelistSource::ContainerdEvents)
            + m.requests(RequestResult::Skipped, RelistSource::ContainerdEvents)
            + m.requests(RequestResult::Merged, RelistSource::ContainerdEvents);
        settled == e.queued(RelistSource::ContainerdEvents)
    })
    .await;
    let died = drain(&e.sub)
        .iter()
        .filter(|d| d.event.kind == EventKind::ContainerDied)
        .count();
    assert_eq!(died, 0, "one ContainerDied only");
    assert_eq!(e.sim.calls(Op::TaskEvents), 1, "never resubscribed");
}

/// Regression: containerd publishes a task's exit before CRI records the
/// container as exited, so the relist the event asks for at once finds it running;
/// the source's rechecks find the death (without them: only the next global relist).
#[actix_rt::test]
async fn a_task_exit_published_before_the_runtime_records_it_is_found_by_a_recheck() {
    let sim = FakeRuntime::new();
    sim.set_task_events(false);
    let e = env(&[HintSourceName::ContainerdEvents], RARE, sim).await;
    e.wait_subscribed().await;
    let c = e.running_pod("u1").await;
    let m = e.pleg.metrics().clone();
    let done = move || m.requests(RequestResult::Done, RelistSource::ContainerdEvents);
    e.sim
        .inject_task_event(containerd_events::envelope(CRI_NAMESPACE, TOPIC_EXIT, &c));
    // The read the event asked for at once ran while the container still ran.
    wait_until("the first relist", || done() >= 1).await;
    assert!(drain(&e.sub).is_empty());
    // Now the runtime records the exit (no event of any kind).
    e.sim.exit_container(&c, 9);
    let d = expect_event(&e.sub, EventKind::ContainerDied, &c).await;
    assert_eq!(d.event.relist_source, RelistSource::ContainerdEvents);
    assert_eq!(d.event.exit.as_ref().map(|x| x.code), Some(9));
}

/// Regression: a relist that failed at its lists never advanced the cache's
/// read time, so every later request for the pod counted as still pending and was
/// dropped: the death waited for the global relist. A request is pending for at most
/// a second.
#[actix_rt::test]
async fn a_relist_that_failed_at_its_lists_does_not_silence_the_pod() {
    let sim = FakeRuntime::new();
    sim.set_task_events(false);
    let e = env(&[HintSourceName::ContainerdEvents], RARE, sim).await;
    e.wait_subscribed().await;
    let c = e.running_pod("u1").await;
    e.sim
        .fail(Op::ListContainers, tonic::Code::Unavailable, Some(1));
    e.sim
        .inject_task_event(containerd_events::envelope(CRI_NAMESPACE, TOPIC_EXIT, &c));
    let m = e.pleg.metrics().clone();
    wait_until("the failed relist", || {
        m.relist_errors(RelistPhase::List) >= 1
    })
    .await;
    e.sim.exit_container(&c, 5);
    let d = expect_event(&e.sub, EventKind::ContainerDied, &c).await;
    assert_eq!(d.event.relist_source, RelistSource::ContainerdEvents);
}

/// The container list of the next relist says this container still runs (its status
/// read says exited): a read in the middle of the runtime's update.
struct StaleList {
    inner: FakeRuntime,
    stale: std::sync::Mutex<Option<String>>,
}

#[async_trait::async_trait]
impl Intercept for StaleList {
    fn inner(&self) -> &FakeRuntime {
        &self.inner
    }
    async fn list_containers(
        &self,
        sb: Option<&str>,
    ) -> Result<Vec<plegd_runtime::Container>, plegd_runtime::RuntimeError> {
        let mut list = self.inner.list_containers(sb).await?;
        let stale = self.stale.lock().unwrap().take();
        for c in &mut list {
            if Some(&c.id) == stale.as_ref() {
                c.state = plegd_runtime::ContainerState::Running;
            }
        }
        Ok(list)
    }
}

/// Regression (seen on real containerd 2.1): the relist a task event asks
/// for read the container's status as exited but its list entry as running, so it
/// published nothing; rechecks stopped because the cache had it exited. One more relist
/// after the cache first has it exited publishes the death.
#[actix_rt::test]
async fn a_read_that_sees_the_exit_in_the_status_but_not_in_the_list_is_read_again() {
    let sim = FakeRuntime::new();
    let rt = Arc::new(Intercepted(StaleList {
        inner: sim.clone(),
        stale: std::sync::Mutex::new(None),
    }));
    let cfg = PlegConfig {
        relist_period: RARE,
        hint_sources: vec![HintSourceName::ContainerdEvents],
        ..PlegConfig::default()
    };
    let pleg = Pleg::start(rt.clone(), &cfg, Arc::new(Metrics::new()));
    let sub = pleg.subscribe("test", 64).await.unwrap();
    let m = pleg.metrics().clone();
    wait_until("subscribed", || {
        m.hint_source_state(HintSourceName::ContainerdEvents) == HintSourceState::Streaming
            || sim.task_event_streams() == 1
    })
    .await;
    let sb = sim.run_pod("u1", "u1", "ns");
    let c = sim.run_container(&sb, "app");
    started_on_request(&pleg, &sub, "u1", &c).await;
    *rt.stale.lock().unwrap() = Some(c.clone());
    sim.exit_container(&c, 4);
    let d = expect_event(&sub, EventKind::ContainerDied, &c).await;
    assert_eq!(d.event.relist_source, RelistSource::ContainerdEvents);
    assert!(
        rt.stale.lock().unwrap().is_none(),
        "the stale list was read"
    );
}

/// A new pod's container dies; containerd's event service brings it.
async fn death_through_containerd_events(e: &Env, uid: &str) {
    let c = e.running_pod(uid).await;
    e.sim.exit_container(&c, 1);
    let d = expect_event(&e.sub, EventKind::ContainerDied, &c).await;
    assert_eq!(d.event.relist_source, RelistSource::ContainerdEvents);
}

#[actix_rt::test]
async fn the_subscription_survives_errors_eof_unimplemented_and_a_runtime_restart() {
    let sim = FakeRuntime::new();
    // A runtime without the service at first (say, upgraded later): unsupported.
    sim.fail(Op::TaskEvents, tonic::Code::Unimplemented, Some(2));
    let mut e = env(&[HintSourceName::ContainerdEvents], RARE, sim).await;
    e.wait_state(
        HintSourceName::ContainerdEvents,
        HintSourceState::Unsupported,
    )
    .await;
    e.wait_subscribed().await;
    death_through_containerd_events(&e, "u1").await;
    // A stream error mid-stream, then EOF: each reconnects.
    assert_eq!(e.sim.fail_task_streams(tonic::Code::Internal), 1);
    let sim = e.sim.clone();
    wait_until("resubscribed", || sim.calls(Op::TaskEvents) >= 4).await;
    e.wait_subscribed().await;
    death_through_containerd_events(&e, "u2").await;
    assert_eq!(e.sim.close_task_streams(), 1);
    wait_until("resubscribed", || sim.calls(Op::TaskEvents) >= 5).await;
    e.wait_subscribed().await;
    death_through_containerd_events(&e, "u3").await;
    // The runtime crashes and comes back on the same socket.
    e.restart_runtime();
    wait_until("resubscribed", || sim.calls(Op::TaskEvents) >= 6).await;
    e.wait_subscribed().await;
    death_through_containerd_events(&e, "u4").await;
    // The CRI event stream was never opened.
    assert_eq!(e.sim.calls(Op::Events), 0);
}

/// The same stops seen through the CRI stream and containerd's event
/// service give one ContainerDied each. Prints the figures. (containerd's task exits
/// come first, as in containerd; the CRI stream has reported no stop yet, so the early
/// source reads at once — `cri_stops.rs` — and both sources ask.)
#[actix_rt::test]
async fn the_same_stop_through_two_sources_is_one_container_died() {
    let sources = [HintSourceName::CriEvents, HintSourceName::ContainerdEvents];
    let sim = FakeRuntime::new();
    sim.set_task_events(false);
    let e = env(&sources, RARE, sim).await;
    e.wait_subscribed().await;
    const EXITS: usize = 20;
    let mut containers = vec![];
    for i in 0..EXITS {
        containers.push(e.running_pod(&format!("u{i}")).await);
    }
    let started = Instant::now();
    for c in &containers {
        e.sim
            .inject_task_event(containerd_events::envelope(CRI_NAMESPACE, TOPIC_EXIT, c));
    }
    let m = e.pleg.metrics().clone();
    wait_until("containerd's events asked", || {
        m.requests(RequestResult::Queued, RelistSource::ContainerdEvents) >= EXITS as u64
    })
    .await;
    for c in &containers {
        e.sim.exit_container(c, 1);
    }
    let mut died: HashMap<String, usize> = HashMap::new();
    let mut by_source: HashMap<RelistSource, usize> = HashMap::new();
    recv_until(&e.sub, "every death", |d| {
        if d.event.kind == EventKind::ContainerDied {
            *died.entry(d.event.container_id.clone()).or_default() += 1;
            *by_source.entry(d.event.relist_source).or_default() += 1;
        }
        died.len() == EXITS
    })
    .await;
    let took = started.elapsed();
    // Every request of both sources settled: no later relist may publish again.
    wait_until("every request settled", || {
        [RelistSource::EventedPleg, RelistSource::ContainerdEvents]
            .iter()
            .all(|&s| {
                m.requests(RequestResult::Done, s)
                    + m.requests(RequestResult::Skipped, s)
                    + m.requests(RequestResult::Merged, s)
                    == m.requests(RequestResult::Queued, s)
            })
    })
    .await;
    for d in drain(&e.sub) {
        if d.event.kind == EventKind::ContainerDied {
            *died.entry(d.event.container_id.clone()).or_default() += 1;
        }
    }
    let duplicates: usize = died.values().map(|n| n - 1).sum();
    let q = |s| m.requests(RequestResult::Queued, s);
    println!(
        "two sources, {EXITS} stops: {} ContainerDied, {duplicates} duplicates, first by \
         {by_source:?}; requests: cri-events {} + containerd-events {}; all published in {took:?}",
        died.len(),
        q(RelistSource::EventedPleg),
        q(RelistSource::ContainerdEvents)
    );
    assert_eq!(duplicates, 0);
    assert!(q(RelistSource::EventedPleg) >= EXITS as u64);
    assert!(q(RelistSource::ContainerdEvents) >= EXITS as u64);
}

/// Once the CRI stream has reported the stops containerd's event service
/// announced, that source waits for the stream's report before it reads a pod (a grace
/// learnt from the stream's lags) — but a stop the stream misses (containerd 1.7 gives
/// each CRI event to one subscriber only) is still found by its rechecks, not left to
/// the global relist.
#[actix_rt::test]
async fn a_stop_the_cri_stream_misses_is_still_found_by_containerd_events() {
    let sources = [HintSourceName::CriEvents, HintSourceName::ContainerdEvents];
    let sim = FakeRuntime::new();
    sim.set_task_events(false);
    let e = env(&sources, RARE, sim).await;
    e.wait_subscribed().await;
    let m = e.pleg.metrics().clone();
    let queued = |s| m.requests(RequestResult::Queued, s);
    // Stops announced by containerd's events, then reported by the CRI stream: the
    // stream's lags are learnt.
    for i in 0..4 {
        let c = e.running_pod(&format!("learn{i}")).await;
        let before = queued(RelistSource::ContainerdEvents);
        e.sim
            .inject_task_event(containerd_events::envelope(CRI_NAMESPACE, TOPIC_EXIT, &c));
        wait_until("the task exit's read", || {
            queued(RelistSource::ContainerdEvents) > before
        })
        .await;
        e.sim.exit_container(&c, 1);
        expect_event(&e.sub, EventKind::ContainerDied, &c).await;
    }
    e.wait_state(HintSourceName::CriEvents, HintSourceState::Streaming)
        .await;
    // A stop the CRI stream never reports (the runtime records it without an event).
    let c = e.running_pod("missed").await;
    e.sim
        .inject_task_event(containerd_events::envelope(CRI_NAMESPACE, TOPIC_EXIT, &c));
    e.sim
        .set_container_state(&c, plegd_runtime::ContainerState::Exited);
    let d = expect_event(&e.sub, EventKind::ContainerDied, &c).await;
    assert_eq!(d.event.relist_source, RelistSource::ContainerdEvents);
}

#[actix_rt::test]
async fn with_no_source_the_global_relist_still_publishes_a_death() {
    let e = env(&[], Duration::from_millis(200), FakeRuntime::new()).await;
    for s in HintSourceName::ALL {
        assert_eq!(e.state(*s), HintSourceState::Off);
    }
    let c = e.running_pod("u1").await;
    e.sim.exit_container(&c, 2);
    let d = expect_event(&e.sub, EventKind::ContainerDied, &c).await;
    assert_eq!(d.event.relist_source, RelistSource::Global);
    assert_eq!(e.sim.calls(Op::Events) + e.sim.calls(Op::TaskEvents), 0);
}
