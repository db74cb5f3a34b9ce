//! Races and edge cases found in review, each with the scenario that broke: a stream
//! error reported twice, a cancelled begin_sync, a sandbox without a UID, a pod that
//! vanishes after a failed first read, a sync that begins while its pod is being
//! read, a request queued just before a hold, waiting on a held pod, and the queue
//! gauge after stop.

use plegd_telemetry::{RelistPhase, RequestResult};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use futures::StreamExt;
use integration_tests::pleg::*;
use integration_tests::wait::*;
use plegd_actors::ReconnectPolicy;
use plegd_actors::SyncOutcome;
use plegd_actors::{EventKind, RelistSource};
use plegd_actors::{Pleg, PlegConfig};
use plegd_runtime::CriRuntime;
use plegd_runtime::{ContainerState, EventStream, RuntimeClient, RuntimeError};
use plegd_sim::spawn_in_thread;
use plegd_sim::{FakeRuntime, Intercept, Intercepted, Op};
use plegd_telemetry::Metrics;

/// The Generic PLEG with gates that go idle quickly (these tests hold pods).
fn start(rt: &FakeRuntime, period: Duration) -> Pleg {
    start_generic_with(
        rt,
        PlegConfig {
            relist_period: period,
            gate_idle: Duration::from_millis(50),
            ..PlegConfig::default()
        },
    )
}

/// A subscription, and pod "u1"'s running container "app", already seen by plegd.
async fn subscribed_pod(pleg: &Pleg, rt: &FakeRuntime) -> (plegd_actors::Subscription, String) {
    let sub = pleg.subscribe("t", 1024).await.unwrap();
    let (_, c) = running_pod(rt, "u1", &sub).await;
    (sub, c)
}

/// A runtime whose first event stream fails as a tonic stream does on a transport
/// error: the same error twice, then the end.
struct DoubleError {
    inner: FakeRuntime,
    calls: AtomicU32,
}

#[async_trait]
impl Intercept for DoubleError {
    fn inner(&self) -> &FakeRuntime {
        &self.inner
    }
    async fn container_events(&self) -> Result<EventStream, RuntimeError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            let err = || RuntimeError::Rpc {
                op: "GetContainerEvents",
                code: tonic::Code::Unknown,
                message: "h2 protocol error: connection reset".into(),
            };
            return Ok(futures::stream::iter(vec![Err(err()), Err(err())]).boxed());
        }
        self.inner.container_events().await
    }
}

#[actix_rt::test]
async fn a_stream_error_reported_twice_reconnects_once() {
    let rt = FakeRuntime::new();
    let client = Arc::new(Intercepted(DoubleError {
        inner: rt.clone(),
        calls: AtomicU32::new(0),
    }));
    let cfg = PlegConfig {
        relist_period: Duration::from_secs(3600),
        reconnect: ReconnectPolicy::new(
            Duration::from_millis(10),
            Duration::from_millis(200),
            Duration::from_secs(1),
        )
        .unwrap(),
        ..PlegConfig::default()
    };
    let pleg = Pleg::start(client.clone(), &cfg, Arc::new(Metrics::new()));
    let m = pleg.metrics().clone();
    // Reconnected: the second attempt's stream is open (the watcher counts an attempt
    // as up 250 ms after it began without an error, so wait for the stream itself).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let st = loop {
        let st = pleg.watcher_state().await.unwrap();
        if st.state == "streaming" && rt.event_streams() == 1 {
            break st;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not reconnected: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    // Both errors arrive in the same poll: a second failure would be counted by now.
    assert_eq!(m.connection_errors.get(), 1);
    assert_eq!(m.stream_connected.get(), 1);
    assert_eq!(client.calls.load(Ordering::SeqCst), 2);
    assert_eq!(rt.event_streams(), 1, "one event stream, not two");
    assert_eq!(st.attempts, 2);
}

#[actix_rt::test]
async fn a_cancelled_begin_sync_does_not_leave_the_pod_held() {
    let rt = FakeRuntime::new();
    let pleg = start(&rt, Duration::from_millis(50));
    let gates = pleg.gates().clone();
    let mut fut = Box::pin(async move { gates.begin_sync("u1").await });
    // Poll until the gate has taken the hold, then the caller goes away (a timeout,
    // a disconnected API client) before it sees the reply.
    let deadline = std::time::Instant::now() + TIMEOUT;
    while !pleg.is_held("u1") {
        assert!(matches!(futures::poll!(fut.as_mut()), Poll::Pending));
        assert!(std::time::Instant::now() < deadline, "never held");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    drop(fut);
    wait_until("the hold is released", || !pleg.is_held("u1")).await;
    let hold = pleg
        .gates()
        .begin_sync("u1")
        .await
        .expect("the pod can be held again");
    hold.end(SyncOutcome::Success);
}

#[actix_rt::test]
async fn a_sandbox_without_a_uid_does_not_stop_relisting() {
    let dir = tempfile::tempdir().unwrap();
    let sim = FakeRuntime::new();
    let server = spawn_in_thread(&dir.path().join("cri.sock"), sim.clone()).unwrap();
    let cri = CriRuntime::new(&server.endpoint(), Duration::from_secs(2)).unwrap();
    let cfg = PlegConfig {
        relist_period: Duration::from_millis(50),
        hint_sources: vec![],
        ..PlegConfig::default()
    };
    let pleg = Pleg::start(Arc::new(cri), &cfg, Arc::new(Metrics::new()));
    let (sub, c) = subscribed_pod(&pleg, &sim).await;
    // Someone runs a sandbox whose metadata has no UID (crictl runp, minimal config).
    let odd = sim.run_pod("", "adhoc", "default");
    sim.run_container(&odd, "x");
    sim.exit_container(&c, 1);
    expect_event(&sub, EventKind::ContainerDied, &c).await;
    assert_eq!(pleg.metrics().relist_errors(RelistPhase::List), 0);
    assert!(pleg.cache().get("").is_none());
}

#[actix_rt::test]
async fn a_new_pod_whose_first_read_failed_and_that_went_away_leaves_the_cache() {
    let rt = FakeRuntime::new();
    let pleg = start(&rt, Duration::from_millis(30));
    wait_until("ready", || pleg.health().ready()).await;
    // Its container's status read fails (a sandbox comes from the list: never read).
    rt.fail_pod_status("gone", true);
    let sb = rt.run_pod("gone", "gone", "ns");
    rt.run_container(&sb, "app");
    let cache = pleg.cache().clone();
    wait_until("error cached", || {
        cache.get("gone").is_some_and(|e| e.error.is_some())
    })
    .await;
    rt.fail_pod_status("gone", false);
    rt.remove_pod(&sb);
    wait_until("the entry is deleted", || cache.get("gone").is_none()).await;
}

#[actix_rt::test]
async fn a_sync_that_begins_while_its_pod_is_read_hides_what_was_read() {
    let rt = FakeRuntime::new();
    let pleg = start(&rt, Duration::from_millis(100));
    let (sub, c) = subscribed_pod(&pleg, &rt).await;
    rt.set_latency(Op::ContainerStatus, Duration::from_millis(200));
    let reads = rt.calls(Op::ContainerStatus);
    let relists = global_relists(&pleg);
    rt.exit_container(&c, 1);
    wait_until("status read started", || {
        rt.calls(Op::ContainerStatus) > reads
    })
    .await;
    // The pod's sync starts now, while the relist is reading it.
    let hold = pleg.gates().begin_sync("u1").await.unwrap();
    wait_until("that relist finished", || global_relists(&pleg) > relists).await;
    assert!(drain(&sub).is_empty(), "a held pod's state was published");
    rt.set_latency(Op::ContainerStatus, Duration::ZERO);
    hold.end(SyncOutcome::Success);
    // Published after the release (by the post-sync relist or a due global one).
    let d = expect_event(&sub, EventKind::ContainerDied, &c).await;
    assert_ne!(d.event.relist_source, RelistSource::EventedPleg);
}

#[actix_rt::test]
async fn a_request_queued_just_before_a_hold_becomes_its_pending_relist() {
    let rt = FakeRuntime::new();
    let pleg = start(&rt, Duration::from_millis(100));
    let (sub, c) = subscribed_pod(&pleg, &rt).await;
    rt.set_latency(Op::ListSandboxes, Duration::from_millis(200));
    let calls = rt.calls(Op::ListSandboxes);
    wait_until("a global relist in progress", || {
        rt.calls(Op::ListSandboxes) > calls
    })
    .await;
    rt.exit_container(&c, 1);
    pleg.request_relist("u1", RelistSource::PostAllocation); // queued: not held yet
    let hold = pleg.gates().begin_sync("u1").await.unwrap(); // then the sync takes the pod
    let m = pleg.metrics().clone();
    wait_until("request handled", || {
        m.requests(RequestResult::Coalesced, RelistSource::PostAllocation) == 1
    })
    .await;
    assert_eq!(
        m.requests(RequestResult::Skipped, RelistSource::PostAllocation),
        0
    );
    rt.set_latency(Op::ListSandboxes, Duration::ZERO);
    hold.end(SyncOutcome::Error);
    // The pending request is honoured after an error too (whichever relist, post-sync
    // or a due global one, then notices the exit first).
    expect_event(&sub, EventKind::ContainerDied, &c).await;
    wait_until("the post-sync request handled", || {
        m.requests(RequestResult::Done, RelistSource::PostSync)
            + m.requests(RequestResult::Skipped, RelistSource::PostSync)
            == 1
    })
    .await;
    assert_eq!(m.requests(RequestResult::Queued, RelistSource::PostSync), 1);
}

#[actix_rt::test]
async fn waiting_on_a_held_pod_waits_for_a_relist_that_read_it() {
    let rt = FakeRuntime::new();
    let pleg = start(&rt, Duration::from_millis(30));
    let (_sub, c) = subscribed_pod(&pleg, &rt).await;
    let hold = pleg.gates().begin_sync("u1").await.unwrap();
    rt.exit_container(&c, 1);
    let t = SystemTime::now();
    let n = global_relists(&pleg);
    wait_until("global relists that skip the held pod", || {
        global_relists(&pleg) >= n + 3
    })
    .await;
    assert!(pleg.cache().global_timestamp().unwrap() > t);
    assert_eq!(
        pleg.cache()
            .wait_newer_than("u1", t, Duration::from_millis(1))
            .await,
        Err(()),
        "released by relists that never read the pod"
    );
    // Other pods are released by the same relists as before.
    assert_eq!(
        pleg.cache().wait_newer_than("other", t, TIMEOUT).await,
        Ok(None)
    );
    hold.end(SyncOutcome::Error);
    let entry = pleg
        .cache()
        .wait_newer_than("u1", t, TIMEOUT)
        .await
        .unwrap()
        .unwrap();
    let st = entry.status.unwrap();
    assert_eq!(st.containers[0].state, ContainerState::Exited);
}

#[actix_rt::test]
async fn the_queue_depth_gauge_is_zero_after_stop() {
    let rt = FakeRuntime::new();
    rt.run_pod("x0", "p", "ns");
    rt.set_latency(Op::ListSandboxes, Duration::from_millis(50));
    let pleg = start(&rt, Duration::from_millis(10));
    wait_until("ready", || pleg.health().ready()).await;
    for i in 0..50 {
        pleg.request_relist(&format!("x{i}"), RelistSource::EventedPleg);
    }
    assert!(pleg.metrics().queue_depth.get() > 0);
    pleg.stop();
    wait_until("stopped", || pleg.stopped()).await;
    assert_eq!(pleg.metrics().queue_depth.get(), 0);
}
