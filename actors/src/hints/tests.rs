//! The real HintWatcher running the CRI event stream source alone, over the fake runtime's event stream and a recording
//! mock in place of the dispatcher: exactly which relist hints a stream of good and
//! bad events produces (KEP-3386: only a CONTAINER_STOPPED_EVENT asks for a relist),
//! that a full queue never makes it wait (containerd 2.x blocks its dispatcher on a
//! subscriber that stops reading), and when a reconnect brings the global relist
//! forward.

use std::cell::Cell;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures::future::LocalBoxFuture;
use futures::StreamExt as _;
use plegd_runtime::cri::{
    ContainerEventResponse, ContainerEventType, ContainerStatus, PodSandboxMetadata,
    PodSandboxStatus,
};
use plegd_sim::{FakeRuntime, Op};
use plegd_telemetry::{HintSourceName, HintSourceState, Metrics, RequestResult, StreamEventType};

use crate::cache::CacheOwner;
use crate::event::RelistSource;
use crate::hints::coverage::Coverage;
use crate::hints::cri_events::CriEvents;
use crate::hints::cri_stops::CriStops;
use crate::hints::rechecks::Rechecks;
use crate::hints::resolve::Resolver;
use crate::hints::watcher::{GetState, HintWatcher, WatcherDeps, WatcherState};
use crate::hints::{Hint, HintSource, ItemContext, ItemStream, SourceError};
use crate::mock::{recording_queue, Recorded, Recorder, RecorderConfig};
use crate::queue::BringForward;
use crate::queue::RequestRelist;
use crate::relist::router::RelistRouter;
use crate::stop::Stop;
use crate::stream::reconnect::ReconnectPolicy;
use crate::sync::HeldPods;
use crate::testing::wait_until;

fn policy(cap: Duration) -> ReconnectPolicy {
    ReconnectPolicy::new(Duration::from_millis(10), cap, Duration::from_secs(60)).unwrap()
}

/// A watcher whose relist requests and bring-forwards go to recorders.
struct Harness {
    sim: FakeRuntime,
    metrics: Arc<Metrics>,
    watcher: Addr<HintWatcher<CriEvents>>,
    requests: Recorded<RequestRelist>,
    soon: Recorded<BringForward>,
    soon_addr: Addr<Recorder<BringForward>>,
    /// Markers sent to the BringForward recorder by the test itself.
    markers: Cell<usize>,
}

impl Harness {
    fn start(sim: FakeRuntime, requests: RecorderConfig, policy: ReconnectPolicy) -> Harness {
        let metrics = Arc::new(Metrics::new());
        let (soon_addr, soon) = Recorder::<BringForward>::start(RecorderConfig::default());
        let (queue, requests) =
            recording_queue(requests, soon_addr.clone().recipient(), metrics.clone());
        let router = RelistRouter::new(queue.clone(), HeldPods::default(), metrics.clone());
        let source = CriEvents::new(
            Arc::new(sim.clone()),
            metrics.clone(),
            CriStops::default(),
            Coverage::default(),
        );
        let deps = WatcherDeps {
            router,
            cache: CacheOwner::new(std::time::Duration::from_secs(300)).1,
            metrics: metrics.clone(),
            policy,
            on_reconnect: Some(Box::new(move || queue.bring_forward())),
            cri_stops: CriStops::default(),
            rechecks: Rechecks::default(),
            resolver: Resolver::new(Arc::new(sim.clone()), metrics.clone()),
            coverage: Coverage::default(),
        };
        let watcher = HintWatcher::new(source, deps).start();
        Harness {
            sim,
            metrics,
            watcher,
            requests,
            soon,
            soon_addr,
            markers: Cell::new(0),
        }
    }

    async fn state(&self) -> WatcherState {
        self.watcher.send(GetState).await.expect("watcher running")
    }

    /// Waits until the `n`th stream is open at both ends.
    async fn wait_streaming(&self, n: u64) {
        let (m, sim) = (self.metrics.clone(), self.sim.clone());
        wait_until("stream open", || {
            m.connection_successes.get() == n
                && m.stream_connected.get() == 1
                && sim.event_streams() == 1
        })
        .await;
    }

    /// Every BringForward the watcher sent, once the recorder has handled them all.
    async fn relist_soon_count(&self) -> usize {
        // A marker answered after everything queued before it.
        self.soon_addr.send(BringForward).await.expect("recorder");
        self.markers.set(self.markers.get() + 1);
        self.soon.len() - self.markers.get()
    }

    fn uids(&self) -> Vec<String> {
        self.requests.all().into_iter().map(|r| r.uid).collect()
    }
}

/// An event in containerd's shape; `uid` None: no pod sandbox status.
fn event(kind: ContainerEventType, uid: Option<&str>) -> ContainerEventResponse {
    ContainerEventResponse {
        container_id: "ctr-1".into(),
        container_event_type: kind as i32,
        created_at: plegd_runtime::now_ns(),
        pod_sandbox_status: uid.map(|uid| PodSandboxStatus {
            id: "sb-1".into(),
            metadata: Some(PodSandboxMetadata {
                uid: uid.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        containers_statuses: vec![],
    }
}

fn stopped(uid: &str) -> ContainerEventResponse {
    event(ContainerEventType::ContainerStoppedEvent, Some(uid))
}

/// A container's stop asks the relist to prefetch that container's status; a sandbox's stop (its id is the pod sandbox's) or a stop without an id
/// asks for the relist alone.
#[actix_rt::test]
async fn a_containers_stop_asks_to_prefetch_its_status() {
    let h = Harness::start(
        FakeRuntime::new(),
        RecorderConfig::default(),
        policy(Duration::from_millis(200)),
    );
    h.wait_streaming(1).await;
    let container = stopped("u1");
    let mut sandbox = stopped("u2");
    sandbox.container_id = "sb-1".into();
    let mut no_id = stopped("u3");
    no_id.container_id = String::new();
    for ev in [container, sandbox, no_id] {
        assert_eq!(h.sim.inject_event(ev), 1);
    }
    let rec = h.requests.clone();
    wait_until("three requests", || rec.len() == 3).await;
    let asked: Vec<(String, Vec<String>)> = h
        .requests
        .all()
        .into_iter()
        .map(|r| (r.uid, r.prefetch))
        .collect();
    assert_eq!(
        asked,
        [
            ("u1".to_string(), vec!["ctr-1".to_string()]),
            ("u2".to_string(), vec![]),
            ("u3".to_string(), vec![]),
        ]
    );
}

#[actix_rt::test]
async fn only_a_stop_event_with_a_uid_requests_a_relist_one_per_event() {
    use ContainerEventType::*;
    let h = Harness::start(
        FakeRuntime::new(),
        RecorderConfig::default(),
        policy(Duration::from_millis(200)),
    );
    h.wait_streaming(1).await;
    let mut no_metadata = stopped("u-x");
    if let Some(s) = no_metadata.pod_sandbox_status.as_mut() {
        s.metadata = None;
    }
    // A stop with container statuses and a non-zero exit code: still just a hint.
    let mut with_statuses = stopped("u2");
    with_statuses.containers_statuses = vec![ContainerStatus {
        id: "ctr-1".into(),
        exit_code: 137,
        ..Default::default()
    }];
    let events = [
        event(ContainerCreatedEvent, Some("u1")),
        event(ContainerStartedEvent, Some("u1")),
        stopped("u1"),
        event(ContainerDeletedEvent, Some("u1")),
        // Invalid: no sandbox status, no metadata, an empty UID, a sandbox's DELETED.
        event(ContainerStoppedEvent, None),
        no_metadata,
        stopped(""),
        event(ContainerDeletedEvent, None),
        // Duplicates: one request each (the queue merges them: one per pod waits).
        stopped("u1"),
        stopped("u1"),
        with_statuses,
        // Requests are recorded in order: once this one is, all before it are.
        stopped("u-last"),
    ];
    for ev in events {
        assert_eq!(h.sim.inject_event(ev), 1);
    }
    let rec = h.requests.clone();
    wait_until("the last request", || {
        rec.all().iter().any(|r| r.uid == "u-last")
    })
    .await;
    let mut uids = h.uids();
    uids.dedup();
    assert_eq!(uids, ["u1", "u2", "u-last"]);
    assert!(h
        .requests
        .all()
        .iter()
        .all(|r| r.source == RelistSource::EventedPleg && r.cause.is_some()));
    let m = &h.metrics;
    let counted = |t| m.stream_events(t);
    assert_eq!(counted(StreamEventType::Invalid), 4);
    assert_eq!(counted(StreamEventType::Created), 1);
    assert_eq!(counted(StreamEventType::Started), 1);
    assert_eq!(counted(StreamEventType::Deleted), 1);
    assert_eq!(counted(StreamEventType::Stopped), 5);
    assert_eq!(
        m.requests(RequestResult::Queued, RelistSource::EventedPleg),
        5
    );
    assert_eq!(
        m.requests(RequestResult::Merged, RelistSource::EventedPleg),
        5 - h.uids().len() as u64,
        "the queue merged the duplicates it held at once"
    );
    assert_eq!(m.connection_latency.get_sample_count(), 8);
    // Bad events are not stream failures.
    assert_eq!(m.connection_errors.get(), 0);
    assert_eq!(h.state().await.state, "streaming");
    assert_eq!(
        h.relist_soon_count().await,
        0,
        "no reconnect, no bring-forward"
    );
}

#[actix_rt::test]
async fn a_burst_into_a_stalled_full_queue_is_drained_at_once_dropped_and_counted() {
    let h = Harness::start(
        FakeRuntime::new(),
        RecorderConfig {
            capacity: Some(1),
            stalled: true,
            ..RecorderConfig::default()
        },
        policy(Duration::from_millis(200)),
    );
    h.wait_streaming(1).await;
    const BURST: u64 = 500;
    for i in 0..BURST {
        h.sim.inject_event(stopped(&format!("u{i}")));
    }
    // The whole burst is read while the dispatcher stand-in handles nothing: the
    // watcher never waits on a full mailbox.
    let m = h.metrics.clone();
    wait_until("the burst read", || {
        m.stream_events(StreamEventType::Stopped) == BURST
    })
    .await;
    assert_eq!(h.requests.len(), 0, "still stalled");
    let queued = m.requests(RequestResult::Queued, RelistSource::EventedPleg);
    let dropped = m.requests(RequestResult::Dropped, RelistSource::EventedPleg);
    assert_eq!(queued + dropped, BURST);
    // actix's bound: capacity - 1 + one per sender, plus the message the stalled handler holds.
    assert!((1..=4).contains(&queued), "{queued} queued");
    let st = h.state().await;
    assert_eq!((st.state, st.attempts), ("streaming", 1));
    assert_eq!(m.connection_errors.get(), 0);
    // Once the dispatcher catches up, the accepted requests arrive in order (the
    // first, and whichever found room as the stalled handler took one) and the
    // stream still delivers.
    h.requests.release();
    let rec = h.requests.clone();
    wait_until("queued requests handled", || rec.len() as u64 == queued).await;
    let order: Vec<u64> = h
        .uids()
        .iter()
        .filter_map(|u| u.strip_prefix('u')?.parse().ok())
        .collect();
    assert_eq!(order.len() as u64, queued, "{:?}", h.uids());
    assert_eq!(order[0], 0);
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{order:?}");
    h.sim.inject_event(stopped("after"));
    wait_until("a request after the burst", || {
        rec.all().iter().any(|r| r.uid == "after")
    })
    .await;
    assert_eq!(
        m.requests(RequestResult::Dropped, RelistSource::EventedPleg),
        dropped
    );
}

#[actix_rt::test]
async fn each_reconnect_brings_the_global_relist_forward_at_attempt_and_at_open() {
    let h = Harness::start(
        FakeRuntime::new(),
        RecorderConfig::default(),
        policy(Duration::from_millis(200)),
    );
    h.wait_streaming(1).await;
    assert_eq!(
        h.relist_soon_count().await,
        0,
        "the first open is no reconnect"
    );
    // EOF: attempt 2 asks, and its open asks again.
    assert_eq!(h.sim.close_streams(), 1);
    h.wait_streaming(2).await;
    assert_eq!(h.relist_soon_count().await, 2);
    // A mid-stream error: the same.
    assert_eq!(h.sim.fail_streams(tonic::Code::Internal), 1);
    h.wait_streaming(3).await;
    assert_eq!(h.relist_soon_count().await, 4);
    let m = &h.metrics;
    assert_eq!(m.connection_errors.get(), 2);
    assert_eq!(m.reconnect_attempts.get(), 2);
    // And stop events still reach the queue.
    h.sim.inject_event(stopped("u1"));
    let rec = h.requests.clone();
    wait_until("a request", || rec.len() == 1).await;
}

#[actix_rt::test]
async fn unimplemented_waits_the_cap_and_every_attempt_brings_the_relist_forward() {
    let sim = FakeRuntime::new();
    sim.fail(Op::Events, tonic::Code::Unimplemented, Some(2));
    let cap = Duration::from_millis(100);
    let start = Instant::now();
    let h = Harness::start(sim, RecorderConfig::default(), policy(cap));
    let m = h.metrics.clone();
    let state = move || m.hint_source_state(HintSourceName::CriEvents);
    wait_until("unsupported", || state() == HintSourceState::Unsupported).await;
    h.wait_streaming(1).await;
    assert_eq!(state(), HintSourceState::Streaming);
    assert!(start.elapsed() >= cap * 2, "{:?}", start.elapsed());
    let st = h.state().await;
    assert_eq!(
        (st.state, st.attempts, st.last_delay),
        ("streaming", 3, Some(cap))
    );
    // Attempts 2 and 3, then the open after the failures.
    assert_eq!(h.relist_soon_count().await, 3);
    assert_eq!(h.metrics.connection_errors.get(), 2);
}

#[actix_rt::test]
async fn stop_while_a_quiet_attempt_is_pending_cancels_it() {
    // containerd answers only with its first event: the attempt stays pending.
    let sim = FakeRuntime::new();
    sim.set_quiet_until_first_event(true);
    let h = Harness::start(
        sim.clone(),
        RecorderConfig::default(),
        policy(Duration::from_millis(200)),
    );
    wait_until("attempt pending", || sim.event_streams() == 1).await;
    let st = h.state().await;
    assert_eq!((st.state, st.live_futures), ("connecting", 1));
    assert_eq!(h.metrics.stream_connected.get(), 0);
    let state = || h.metrics.hint_source_state(HintSourceName::CriEvents);
    assert_eq!(state(), HintSourceState::Connecting);
    h.watcher.try_send(Stop).expect("mailbox has room");
    let w = h.watcher.clone();
    wait_until("watcher stopped", || !w.connected()).await;
    wait_until("RPC cancelled", || sim.event_streams() == 0).await;
    assert_eq!(h.metrics.connection_errors.get(), 0);
    assert_eq!(state(), HintSourceState::Stopped);
}

/// A source that yields the hints a test sends it, one per item; only its first
/// attempt opens (a later one stays pending).
struct Scripted {
    hints: Option<futures::channel::mpsc::UnboundedReceiver<Hint>>,
}

impl HintSource for Scripted {
    type Item = Hint;

    fn name(&self) -> HintSourceName {
        HintSourceName::Nri
    }

    fn relist_source(&self) -> RelistSource {
        RelistSource::Nri
    }

    fn describe(&self) -> &'static str {
        "scripted hints"
    }

    fn open(
        &mut self,
        _attempt: u64,
    ) -> LocalBoxFuture<'static, Result<ItemStream<Hint>, SourceError>> {
        match self.hints.take() {
            Some(rx) => Box::pin(async move { Ok(rx.map(Ok).boxed_local()) }),
            None => Box::pin(futures::future::pending()),
        }
    }

    fn hint(&mut self, item: Hint, _: ItemContext) -> Vec<Hint> {
        vec![item]
    }
}

/// The hint sender, the watcher and the recorders of its requests and bring-forwards.
type ScriptedWatcher = (
    futures::channel::mpsc::UnboundedSender<Hint>,
    Addr<HintWatcher<Scripted>>,
    Recorded<RequestRelist>,
    Recorded<BringForward>,
);

/// A watcher of [`Scripted`] hints over `cache`, its requests and bring-forwards
/// recorded.
fn scripted_watcher(cache: crate::cache::PodCache, stops: CriStops) -> ScriptedWatcher {
    scripted_watcher_on(FakeRuntime::new(), cache, stops)
}

/// As [`scripted_watcher`], tracing unknown IDs through `runtime`.
fn scripted_watcher_on(
    runtime: FakeRuntime,
    cache: crate::cache::PodCache,
    stops: CriStops,
) -> ScriptedWatcher {
    let metrics = Arc::new(Metrics::new());
    let (soon_addr, soon) = Recorder::<BringForward>::start(RecorderConfig::default());
    let (queue, requests) = recording_queue(
        RecorderConfig::default(),
        soon_addr.recipient(),
        metrics.clone(),
    );
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let deps = WatcherDeps {
        router: RelistRouter::new(queue, HeldPods::default(), metrics.clone()),
        cache,
        resolver: Resolver::new(Arc::new(runtime), metrics.clone()),
        metrics,
        policy: policy(Duration::from_millis(200)),
        on_reconnect: None,
        cri_stops: stops,
        rechecks: Rechecks::default(),
        coverage: Coverage::default(),
    };
    let watcher = HintWatcher::new(Scripted { hints: Some(rx) }, deps).start();
    (tx, watcher, requests, soon)
}

/// One debug line per hint a source gives — the source, what it asked for,
/// what became of it — under a budget, so that a storm cannot flood the log; the next
/// line let through counts the lines suppressed.
#[actix_rt::test]
async fn each_hint_writes_a_debug_line_under_a_budget() {
    use crate::testing::capture::Captured;
    use plegd_telemetry::logging::EVENT_LINES_PER_SECOND as LINES_PER_WINDOW;
    let log = Captured::default();
    let _guard = log.install();
    let cache = CacheOwner::new(Duration::from_secs(300)).1;
    let (tx, _watcher, requests, soon) = scripted_watcher(cache, CriStops::default());
    let send = |hint: Hint| tx.unbounded_send(hint).expect("watcher reading");
    send(Hint::Pod {
        uid: "u1".into(),
        cause: None,
        container: None,
    });
    send(Hint::Container {
        id: "c-unknown".into(),
    });
    send(Hint::Global);
    send(Hint::After {
        delay: Duration::from_millis(5),
        hint: Box::new(Hint::Pod {
            uid: "u2".into(),
            cause: None,
            container: None,
        }),
    });
    let r = requests.clone();
    wait_until("both pods requested", || r.len() == 2).await;
    wait_until("the global relist asked for", || soon.len() == 1).await;
    let r = requests.clone();
    let traced = log.clone();
    wait_until("the unknown ID traced", || {
        !traced.matching(&["outcome=\"in no pod\""]).is_empty()
    })
    .await;
    assert_eq!(r.len(), 2, "an ID in no pod asks for nothing");
    // The trace's answer comes whenever the runtime answers: apart.
    let mut hints = log.matching(&[": hint source=nri"]);
    hints.retain(|l| !l.contains("outcome=\"in no pod\""));
    let expect = [
        &["hint=\"pod\"", "pod=\"u1\"", "outcome=\"requested\""][..],
        &[
            "hint=\"container\"",
            "id=\"c-unknown\"",
            "outcome=\"tracing its pod\"",
        ],
        &[
            "hint=\"global\"",
            "outcome=\"global relist brought forward\"",
        ],
        &["hint=\"pod\"", "after_ms=5", "outcome=\"scheduled\""],
        &["hint=\"pod\"", "pod=\"u2\"", "outcome=\"requested\""],
    ];
    assert_eq!(hints.len(), expect.len(), "{hints:#?}");
    for (line, parts) in hints.iter().zip(expect) {
        for part in parts {
            assert!(line.contains(part), "{part} in {line}");
        }
    }

    // A storm of hints: at most the budget of lines per window.
    const STORM: usize = 500;
    for i in 0..STORM {
        send(Hint::Pod {
            uid: format!("s{i}"),
            cause: None,
            container: None,
        });
    }
    wait_until("the storm requested", || r.len() == 2 + STORM).await;
    let lines = log.matching(&[": hint source=nri"]).len();
    assert!(lines <= LINES_PER_WINDOW as usize, "{lines} lines");
    // Once the window has passed, the next line says how many were suppressed.
    wait_until("a line counting the suppressed ones", || {
        if log
            .matching(&[": hint source=nri", "pod=\"late\"", "suppressed="])
            .iter()
            .any(|l| !l.contains("suppressed=0"))
        {
            return true;
        }
        send(Hint::Pod {
            uid: "late".into(),
            cause: None,
            container: None,
        });
        false
    })
    .await;
}

/// A recheck of container `id`'s exit, its pod mapped through the cache.
fn recheck(id: &str) -> Hint {
    Hint::Recheck {
        id: id.into(),
        pod: None,
        awaited: crate::hints::Awaited::Exited,
    }
}

/// A cache holding pod `u1` with container `c1` running.
fn cache_with_c1() -> (CacheOwner, crate::cache::PodCache) {
    let (mut owner, cache) = CacheOwner::new(Duration::from_secs(300));
    super::nri::tests::write(
        &mut owner,
        plegd_runtime::ContainerState::Running,
        plegd_runtime::SandboxState::Ready,
    );
    (owner, cache)
}

/// Regression: a recheck of a stop the CRI event stream has reported asked
/// for one more relist of the pod (until the cache had the container exited), beside
/// the stream's own: now it asks for nothing — the stream's relist reads the pod after
/// the runtime recorded the stop.
#[actix_rt::test]
async fn a_recheck_of_a_stop_the_cri_stream_reported_asks_for_nothing() {
    let (_owner, cache) = cache_with_c1();
    let stops = CriStops::default();
    let (tx, _watcher, requests, _) = scripted_watcher(cache, stops.clone());
    let send = |hint: Hint| tx.unbounded_send(hint).expect("watcher reading");
    // Reported: the recheck asks for nothing (the pod that follows marks the end).
    stops.reported("c1", Instant::now());
    send(recheck("c1"));
    send(Hint::Pod {
        uid: "u2".into(),
        cause: None,
        container: None,
    });
    let r = requests.clone();
    wait_until("the marker's request", || r.len() >= 1).await;
    let uids: Vec<String> = requests.all().into_iter().map(|q| q.uid).collect();
    assert_eq!(uids, ["u2"]);
}

/// Memory after a churn: a watcher's record of the pods it asked for
/// forgot them only once it held 4,096, so after a churn of short-lived pods it kept
/// thousands for good; now a request no longer pending is forgotten within a second
/// or so.
#[actix_rt::test]
async fn requests_no_longer_pending_are_forgotten() {
    use plegd_runtime::{ContainerState::Running, SandboxState::Ready};
    let (mut owner, cache) = CacheOwner::new(Duration::from_secs(300));
    super::nri::tests::write_pod(&mut owner, ("u1", "s1", "c1"), Running, Ready);
    super::nri::tests::write_pod(&mut owner, ("u2", "s2", "c2"), Running, Ready);
    let (tx, watcher, requests, _) = scripted_watcher(cache, CriStops::default());
    let send = |hint: Hint| tx.unbounded_send(hint).expect("watcher reading");
    send(Hint::Container { id: "c1".into() });
    let r = requests.clone();
    wait_until("u1's request", || r.len() == 1).await;
    let tracked = || async { watcher.send(GetState).await.unwrap().tracked };
    assert_eq!(tracked().await, 1);
    send(Hint::Container { id: "c2".into() });
    let r = requests.clone();
    wait_until("u2's request", || r.len() == 2).await;
    // u2's requests go on; u1's, never read, stops counting as pending after a second
    // and is forgotten at a later request.
    let deadline = Instant::now() + Duration::from_secs(30);
    while tracked().await != 1 {
        assert!(
            Instant::now() < deadline,
            "u1's request never forgotten: {} tracked",
            tracked().await
        );
        send(Hint::Container { id: "c2".into() });
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A hint by container ID (containerd's event service, NRI without
/// a pod UID), and a recheck, ask to prefetch that container's status with its pod's
/// lists (they asked for the relist alone); a hint by a sandbox's ID asks for the
/// relist alone.
#[actix_rt::test]
async fn a_hint_by_container_id_asks_to_prefetch_it_and_one_by_sandbox_id_does_not() {
    use plegd_runtime::{ContainerState::Running, SandboxState::Ready};
    let (mut owner, cache) = CacheOwner::new(Duration::from_secs(300));
    super::nri::tests::write_pod(&mut owner, ("u1", "s1", "c1"), Running, Ready);
    super::nri::tests::write_pod(&mut owner, ("u2", "s2", "c2"), Running, Ready);
    super::nri::tests::write_pod(&mut owner, ("u3", "s3", "c3"), Running, Ready);
    let (tx, _watcher, requests, _) = scripted_watcher(cache, CriStops::default());
    let send = |hint: Hint| tx.unbounded_send(hint).expect("watcher reading");
    send(Hint::Container { id: "c1".into() });
    send(Hint::Container { id: "s2".into() });
    send(recheck("c3"));
    let r = requests.clone();
    wait_until("three requests", || r.len() == 3).await;
    let asked: Vec<(String, Vec<String>)> = requests
        .all()
        .into_iter()
        .map(|q| (q.uid, q.prefetch))
        .collect();
    assert_eq!(
        asked,
        [
            ("u1".to_string(), vec!["c1".to_string()]),
            ("u2".to_string(), vec![]),
            ("u3".to_string(), vec!["c3".to_string()]),
        ]
    );
}

/// Memory after a churn: the record of the stops the CRI stream reported
/// forgot old ones only when a new stop came, so after a churn it held up to 4,096
/// (≈ 0.6 MB) until the next stop; the watchers now tidy it every second, stops or
/// not.
#[actix_rt::test]
async fn old_stops_are_forgotten_without_a_new_one() {
    let stops = CriStops::default();
    let long_ago = Instant::now()
        .checked_sub(Duration::from_secs(11))
        .expect("the clock is past 11 s");
    for i in 0..4096 {
        stops.reported(&format!("c{i}"), long_ago);
    }
    let (count, room) = stops.remembered();
    assert_eq!(count, 4096);
    assert!(room >= 4096, "{room}");
    let cache = CacheOwner::new(Duration::from_secs(300)).1;
    let (_tx, _watcher, _, _) = scripted_watcher(cache, stops.clone());
    wait_until("the old stops forgotten", || {
        let (count, room) = stops.remembered();
        count == 0 && room < 1024
    })
    .await;
}

/// A container born since the last global relist (containerd's task events name only
/// its ID): traced to its pod by ListContainers filtered by the ID, then
/// ListPodSandbox filtered by its sandbox (the cache knows neither), never a whole-node
/// list; its pod is relisted with the container prefetched. A sandbox's own ID is
/// traced too; an ID in no pod asks for nothing, and is asked about once.
#[actix_rt::test]
async fn an_id_the_cache_does_not_know_is_traced_to_its_pod_by_filtered_calls() {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u-new", "web", "ns");
    let c = rt.run_container(&sb, "app");
    let cache = CacheOwner::new(Duration::from_secs(300)).1;
    let (tx, _watcher, requests, _) = scripted_watcher_on(rt.clone(), cache, CriStops::default());
    let send = |hint: Hint| tx.unbounded_send(hint).expect("watcher reading");
    send(Hint::Container { id: c.clone() });
    let r = requests.clone();
    wait_until("the new pod requested", || r.len() == 1).await;
    let q = &requests.all()[0];
    assert_eq!(
        (q.uid.as_str(), q.prefetch.clone()),
        ("u-new", vec![c.clone()])
    );
    // A sandbox's own ID: its pod, nothing to prefetch (after the pending request).
    let sb2 = rt.run_pod("u-other", "db", "ns");
    send(Hint::Container { id: sb2.clone() });
    let r = requests.clone();
    wait_until("the sandbox's pod requested", || r.len() == 2).await;
    let q = &requests.all()[1];
    assert_eq!((q.uid.as_str(), q.prefetch.len()), ("u-other", 0));
    // An ID in no pod: nothing, and the runtime is asked once for it however many
    // hints name it.
    let before = rt.calls(Op::FindContainer);
    for _ in 0..3 {
        send(recheck("nowhere"));
    }
    let r = rt.clone();
    wait_until("the unknown ID asked about", || {
        r.calls(Op::FindContainer) > before
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(rt.calls(Op::FindContainer), before + 1);
    assert_eq!(requests.len(), 2);
    assert_eq!(
        rt.calls(Op::ListContainers),
        0,
        "a whole-node or sandbox list"
    );
    // Only filtered sandbox lists: one per traced container's unknown sandbox, one per
    // ID tried as a sandbox's.
    assert_eq!(rt.calls(Op::ListSandboxes), 3);
}
