//! Component tests of the Generic PLEG's actors (dispatcher, cache, publisher,
//! health) over the in-memory fake runtime.

use plegd_telemetry::{RelistPhase, RequestResult};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use integration_tests::pleg::*;
use integration_tests::wait::*;
use plegd_actors::{EventKind, RelistSource};
use plegd_actors::{Pleg, PlegConfig};
use plegd_sim::{FakeRuntime, Op};
use plegd_telemetry::Metrics;

#[actix_rt::test]
async fn events_are_published_after_the_cache_is_updated() {
    let rt = FakeRuntime::new();
    let p = start_generic(&rt, Duration::from_millis(20));
    let sub = p.subscribe("t", 1024).await.unwrap();
    let sb = rt.run_pod("u1", "web", "ns");
    let c = rt.run_container(&sb, "app");
    let d = expect_event(&sub, EventKind::ContainerStarted, &c).await;
    assert_eq!(d.event.relist_source, RelistSource::Global);
    assert_eq!(d.event.pod.name, "web");
    // The cache already holds the status that caused the event.
    let cached = p
        .cache()
        .get("u1")
        .expect("cached before the event was published");
    let status = cached.status.expect("status");
    assert!(status.containers.iter().any(|s| s.id == c));

    rt.exit_container(&c, 3);
    expect_event(&sub, EventKind::ContainerDied, &c).await;
    let st = p.cache().get("u1").unwrap().status.unwrap();
    let cs = st.containers.iter().find(|s| s.id == c).unwrap();
    assert_eq!(cs.exit_code, 3);

    rt.remove_pod(&sb);
    // Sandboxes come first within a pod: Died+Removed of the sandbox, then Removed of
    // the container.
    let last = expect_event(&sub, EventKind::ContainerRemoved, &c).await;
    assert!(
        p.cache().get("u1").is_none(),
        "a deleted pod leaves the cache"
    );
    // Started ×2, Died, then Died+Removed (sandbox) and Removed (container).
    assert_eq!(last.seq, 6);
    assert_eq!(p.metrics().events(RelistSource::Global), 6);
}

#[actix_rt::test]
async fn wait_newer_than_is_released_by_reads_and_by_global_relists() {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "web", "ns");
    let p = start_generic(&rt, Duration::from_millis(50));
    wait_until("first relist", || p.health().ready()).await;
    let t = SystemTime::now();
    // A pod that does not exist: released by the next global relist, with no entry.
    let cache = p.cache().clone();
    let absent = cache.wait_newer_than("nope", t, TIMEOUT).await;
    assert_eq!(absent, Ok(None));
    assert!(p.cache().global_timestamp().unwrap() > t);
    // An existing pod with no change keeps its old entry, released by the global time.
    let entry = p
        .cache()
        .wait_newer_than("u1", t, TIMEOUT)
        .await
        .unwrap()
        .unwrap();
    assert!(entry.modified < t);
    // A change: the entry read after t carries it.
    let t2 = SystemTime::now();
    let c = rt.run_container(&sb, "app");
    let fresh = loop {
        let e = p
            .cache()
            .wait_newer_than("u1", t2, TIMEOUT)
            .await
            .unwrap()
            .unwrap();
        if e.modified > t2 {
            break e;
        }
        tokio::task::yield_now().await;
    };
    assert!(fresh.status.unwrap().containers.iter().any(|s| s.id == c));
    // A timeout is reported as such.
    let far = SystemTime::now() + Duration::from_secs(3600);
    assert_eq!(
        p.cache()
            .wait_newer_than("u1", far, Duration::from_millis(30))
            .await,
        Err(())
    );
}

#[actix_rt::test]
async fn status_errors_are_cached_and_the_pod_reinspected() {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "web", "ns");
    let c = rt.run_container(&sb, "app");
    let p = start_generic(&rt, Duration::from_millis(20));
    let sub = p.subscribe("t", 1024).await.unwrap();
    expect_event(&sub, EventKind::ContainerStarted, &c).await;
    rt.fail_pod_status("u1", true);
    rt.exit_container(&c, 1);
    wait_until("error cached", || {
        p.cache().get("u1").is_some_and(|e| e.error.is_some())
    })
    .await;
    let e = p.cache().get("u1").unwrap();
    assert!(e.status.is_some(), "the last good status is kept");
    assert!(
        drain(&sub).is_empty(),
        "nothing published for a pod that cannot be read"
    );
    rt.fail_pod_status("u1", false);
    expect_event(&sub, EventKind::ContainerDied, &c).await;
    assert!(p.cache().get("u1").unwrap().error.is_none());
    assert!(p.metrics().relist_errors(RelistPhase::Status) >= 1);
}

#[actix_rt::test]
async fn a_full_subscriber_queue_drops_counts_and_tells_the_subscriber() {
    let rt = FakeRuntime::new();
    let p = start_generic(&rt, Duration::from_millis(10));
    let slow = p.subscribe("slow", 2).await.unwrap();
    let fast = p.subscribe("fast", 100_000).await.unwrap();
    let mut sandboxes = Vec::new();
    for i in 0..20 {
        sandboxes.push(rt.run_pod(&format!("u{i}"), &format!("p{i}"), "ns"));
    }
    let mut seen = std::collections::HashSet::new();
    recv_until(&fast, "all 20 sandboxes started", |d| {
        seen.insert(d.event.container_id.clone());
        sandboxes.iter().all(|sb| seen.contains(sb))
    })
    .await;
    // The dispatcher was never blocked by the slow subscriber: relists keep coming.
    let before = global_relists(&p);
    wait_until("more global relists", || global_relists(&p) >= before + 3).await;
    assert_eq!(p.metrics().discard_events.get(), 18);
    let got = drain(&slow);
    assert_eq!(got.iter().map(|d| d.seq).collect::<Vec<_>>(), vec![1, 2]);
    assert!(got.iter().all(|d| d.missed == 0));
    // The next delivery says how many were missed, and the sequence shows the gap.
    let sb = rt.run_pod("late", "late", "ns");
    let d = expect_event(&slow, EventKind::ContainerStarted, &sb).await;
    assert_eq!(d.missed, 18);
    assert_eq!(d.seq, 21);
    // A dropped subscriber is forgotten.
    drop(slow);
    let sb2 = rt.run_pod("later", "later", "ns");
    expect_event(&fast, EventKind::ContainerStarted, &sb2).await;
    assert_eq!(p.metrics().subscribers.get(), 1);
}

#[actix_rt::test]
async fn a_dropped_subscription_is_forgotten_on_a_quiet_node() {
    let rt = FakeRuntime::new();
    // Nothing to publish: no pods and no periodic relist during the test.
    let p = start_generic(&rt, Duration::from_secs(3600));
    let a = p.subscribe("a", 8).await.unwrap();
    let b = p.subscribe("b", 8).await.unwrap();
    let m = p.metrics().clone();
    wait_until("two subscribers", || m.subscribers.get() == 2).await;
    drop(a);
    wait_until("one subscriber", || m.subscribers.get() == 1).await;
    // Dropped by a consumer on its own thread.
    std::thread::spawn(move || drop(b)).join().unwrap();
    wait_until("no subscribers", || m.subscribers.get() == 0).await;
    // Publishing still works for a new subscriber.
    let c = p.subscribe("c", 8).await.unwrap();
    let sb = rt.run_pod("u1", "web", "ns");
    p.request_relist("u1", RelistSource::PostAllocation);
    expect_event(&c, EventKind::ContainerStarted, &sb).await;
    assert_eq!(m.subscribers.get(), 1);
}

#[actix_rt::test]
async fn health_follows_the_global_relist_not_the_stream() {
    // This test used to run without a stream, so the stream could not
    // affect anything. Now the stream fails the whole time (KEP-3386: losing the fast
    // path is not a health failure) and only the global relist moves health.
    let rt = FakeRuntime::new();
    rt.run_pod("u1", "web", "ns");
    rt.fail(Op::Events, tonic::Code::Unavailable, None);
    let p = Pleg::start(
        Arc::new(rt.clone()),
        &PlegConfig {
            relist_period: Duration::from_millis(10),
            health_threshold: Duration::from_millis(300),
            hint_sources: vec![plegd_actors::HintSourceName::CriEvents],
            reconnect: policy(5, 20),
            ..PlegConfig::default()
        },
        Arc::new(Metrics::new()),
    );
    wait_until("ready", || p.health().ready()).await;
    // Longer than the health threshold of a failing stream: still healthy.
    let failing_since = std::time::Instant::now();
    wait_until("the stream failing for longer than the threshold", || {
        p.metrics().connection_errors.get() >= 3
            && failing_since.elapsed() > Duration::from_millis(400)
    })
    .await;
    assert!(p.health().check().is_ok());
    assert_eq!(p.metrics().stream_connected.get(), 0);
    rt.fail(Op::ListSandboxes, tonic::Code::Unavailable, None);
    wait_until("unhealthy", || p.health().check().is_err()).await;
    assert!(p.metrics().relist_errors(RelistPhase::List) > 0);
    rt.clear_failure(Op::ListSandboxes);
    wait_until("healthy again", || p.health().check().is_ok()).await;
    assert_eq!(
        p.metrics().stream_connected.get(),
        0,
        "the stream still fails"
    );
    p.stop();
}

#[actix_rt::test]
async fn targeted_relist_is_fast_and_tagged_with_its_source() {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "web", "ns");
    let c = rt.run_container(&sb, "app");
    // A relist period far longer than the test: only the targeted relist can see the exit.
    let p = start_generic(&rt, Duration::from_secs(3600));
    let sub = p.subscribe("t", 1024).await.unwrap();
    expect_event(&sub, EventKind::ContainerStarted, &c).await;
    rt.exit_container(&c, 137);
    assert!(p.request_relist("u1", RelistSource::EventedPleg));
    let d = expect_event(&sub, EventKind::ContainerDied, &c).await;
    assert_eq!(d.event.relist_source, RelistSource::EventedPleg);
    assert_eq!(p.metrics().events(RelistSource::EventedPleg), 1);
    // A duplicate request: a fresh read, no second event.
    assert!(p.request_relist("u1", RelistSource::EventedPleg));
    wait_until("request done", || {
        p.metrics()
            .requests(RequestResult::Done, RelistSource::EventedPleg)
            == 2
    })
    .await;
    assert!(drain(&sub).is_empty());
    assert_eq!(p.metrics().queue_depth.get(), 0);
}

#[actix_rt::test]
async fn requests_covered_by_a_completed_global_relist_are_skipped() {
    let rt = FakeRuntime::new();
    rt.run_pod("u1", "web", "ns");
    // Every relist takes ≥ 100 ms, twice the period: requests queue up behind the
    // first global relist, and a second one is due when it ends.
    rt.set_latency(Op::ListContainers, Duration::from_millis(100));
    let p = start_generic(&rt, Duration::from_millis(50));
    wait_until("first relist started", || rt.calls(Op::ListContainers) >= 1).await;
    for _ in 0..5 {
        assert!(p.request_relist("u1", RelistSource::EventedPleg));
    }
    // They arrived after the first relist began (it may have missed their cause), so
    // the first is preceded by the due global relist, which covers all five: the
    // ones waiting together are merged into one (one per pod), which is skipped.
    let handled = |r| p.metrics().requests(r, RelistSource::EventedPleg);
    wait_until("requests handled", || {
        handled(RequestResult::Skipped) + handled(RequestResult::Merged) == 5
    })
    .await;
    assert!(handled(RequestResult::Skipped) >= 1);
    assert_eq!(
        p.metrics()
            .requests(RequestResult::Done, RelistSource::EventedPleg),
        0
    );
}

#[actix_rt::test]
async fn a_full_queue_drops_requests_and_the_global_relist_still_converges() {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "web", "ns");
    let c = rt.run_container(&sb, "app");
    let p = start_generic_with(
        &rt,
        PlegConfig {
            relist_period: Duration::from_millis(200),
            queue_capacity: 4,
            ..PlegConfig::default()
        },
    );
    let sub = p.subscribe("t", 1024).await.unwrap();
    expect_event(&sub, EventKind::ContainerStarted, &c).await;
    // Slow targeted relists; the queue (4 pods) fills while one runs. The burst
    // does not yield: the dispatcher takes nothing meanwhile.
    rt.set_latency(Op::ListContainers, Duration::from_millis(50));
    let mut accepted = 0;
    for i in 0..100 {
        if p.request_relist(&format!("x{i}"), RelistSource::EventedPleg) {
            accepted += 1;
        }
    }
    let dropped = p
        .metrics()
        .requests(RequestResult::Dropped, RelistSource::EventedPleg);
    assert_eq!(accepted + dropped, 100);
    assert_eq!(accepted, 4);
    rt.exit_container(&c, 1);
    expect_event(&sub, EventKind::ContainerDied, &c).await;
}

#[actix_rt::test]
async fn a_storm_of_targeted_requests_does_not_starve_the_global_relist() {
    let rt = FakeRuntime::new();
    rt.run_pod("storm", "storm", "ns");
    let other_sb = rt.run_pod("other", "other", "ns");
    let other = rt.run_container(&other_sb, "app");
    let p = start_generic_with(
        &rt,
        PlegConfig {
            relist_period: Duration::from_millis(50),
            queue_capacity: 100_000,
            ..PlegConfig::default()
        },
    );
    let sub = p.subscribe("t", 100_000).await.unwrap();
    expect_event(&sub, EventKind::ContainerStarted, &other).await;
    // Each targeted relist costs ≥ 1 ms and requests keep coming faster than that.
    rt.set_latency(Op::ListContainers, Duration::from_millis(1));
    let storming = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let queue = p.clone();
    let flag = storming.clone();
    let storm = actix_rt::spawn(async move {
        while flag.load(std::sync::atomic::Ordering::Relaxed) {
            for _ in 0..20 {
                queue.request_relist("storm", RelistSource::EventedPleg);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    wait_until("storm under way", || {
        p.metrics()
            .requests(RequestResult::Done, RelistSource::EventedPleg)
            >= 50
    })
    .await;
    // Only a global relist reads pod "other": its exit is found during the storm,
    // and global relists keep coming.
    let before = global_relists(&p);
    rt.exit_container(&other, 1);
    let d = expect_event(&sub, EventKind::ContainerDied, &other).await;
    assert_eq!(d.event.relist_source, RelistSource::Global);
    wait_until("five more global relists", || {
        global_relists(&p) >= before + 5
    })
    .await;
    storming.store(false, std::sync::atomic::Ordering::Relaxed);
    storm.await.unwrap();
    assert!(
        p.metrics()
            .requests(RequestResult::Queued, RelistSource::EventedPleg)
            > 100
    );
}

#[actix_rt::test]
async fn stop_in_the_middle_of_a_relist() {
    let rt = FakeRuntime::new();
    rt.run_pod("u1", "web", "ns");
    rt.set_latency(Op::ListContainers, Duration::from_millis(200));
    let p = start_generic(&rt, Duration::from_millis(10));
    let sub = p.subscribe("t", 16).await.unwrap();
    wait_until("relist in progress", || rt.calls(Op::ListContainers) >= 1).await;
    p.stop();
    wait_until("dispatcher stopped", || p.stopped()).await;
    // The relist in progress completed and published before stopping.
    let got = drain(&sub);
    assert_eq!(got.len(), 1);
    let calls = rt.calls(Op::ListContainers);
    assert!(!p.request_relist("u1", RelistSource::EventedPleg));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(rt.calls(Op::ListContainers), calls, "no relist after stop");
}

#[actix_rt::test]
async fn bringing_forward_is_honoured_once_per_period_and_failures_do_not_count() {
    // The mailbox is FIFO: once one request is done, every BringForward before it was
    // handled.
    async fn fence(p: &Pleg) {
        assert!(p.request_relist("u1", RelistSource::EventedPleg));
        wait_until("fence", || {
            p.metrics()
                .requests(RequestResult::Done, RelistSource::EventedPleg)
                == 1
        })
        .await;
    }
    let rt = FakeRuntime::new();
    rt.run_pod("u1", "web", "ns");
    let p = start_generic(&rt, Duration::from_secs(3600));
    wait_until("first relist", || p.health().ready()).await;
    let n = global_relists(&p);
    p.bring_global_relist_forward();
    wait_until("brought forward", || global_relists(&p) == n + 1).await;
    for _ in 0..20 {
        p.bring_global_relist_forward();
    }
    fence(&p).await;
    assert_eq!(global_relists(&p), n + 1, "at most once per period");

    // A fresh plegd whose forced relists fail keeps honouring them.
    let rt = FakeRuntime::new();
    let p = start_generic(&rt, Duration::from_secs(3600));
    wait_until("first relist", || p.health().ready()).await;
    rt.fail(Op::ListSandboxes, tonic::Code::Unavailable, None);
    for i in 1..=3 {
        let n = global_relists(&p);
        p.bring_global_relist_forward();
        wait_until("failed forced relist", || global_relists(&p) == n + 1).await;
        assert_eq!(p.metrics().relist_errors(RelistPhase::List), i);
    }
    rt.clear_failure(Op::ListSandboxes);
    let n = global_relists(&p);
    p.bring_global_relist_forward();
    wait_until("a working forced relist", || global_relists(&p) == n + 1).await;
    p.bring_global_relist_forward();
    fence(&p).await;
    assert_eq!(global_relists(&p), n + 1);
}

#[actix_rt::test]
async fn a_quiet_healthy_stream_resets_the_backoff_like_containerds() {
    use plegd_actors::ReconnectPolicy;
    // containerd answers GetContainerEvents only with its first event: on a quiet
    // node the stream stays "connecting" while perfectly healthy.
    let rt = FakeRuntime::new();
    rt.set_quiet_until_first_event(true);
    rt.fail(Op::Events, tonic::Code::Unavailable, Some(4));
    let cfg = PlegConfig {
        relist_period: Duration::from_secs(3600),
        reconnect: ReconnectPolicy::new(
            Duration::from_millis(20),
            Duration::from_secs(10),
            Duration::from_millis(300),
        )
        .unwrap(),
        ..PlegConfig::default()
    };
    let p = Pleg::start(Arc::new(rt.clone()), &cfg, Arc::new(Metrics::new()));
    // Four quick failures: the backoff has grown.
    wait_until("four failures then a pending attempt", || {
        p.metrics().connection_errors.get() == 4 && rt.event_streams() == 1
    })
    .await;
    let grown = p.watcher_state().await.unwrap();
    assert!(
        grown.last_delay.unwrap() >= Duration::from_millis(50),
        "{grown:?}"
    );
    // No first event yet, and no error: subscribed (the runtime has the request).
    wait_until("subscribed", || p.metrics().stream_connected.get() == 1).await;
    assert_eq!(p.watcher_state().await.unwrap().state, "subscribed");
    // Quiet and healthy for longer than the healthy-reset time, then a failure.
    let quiet_since = std::time::Instant::now();
    wait_until("quiet for the reset time", || {
        quiet_since.elapsed() > Duration::from_millis(400)
    })
    .await;
    rt.fail_streams(tonic::Code::Unavailable);
    wait_until("failure seen", || p.metrics().connection_errors.get() == 5).await;
    let reset = p.watcher_state().await.unwrap();
    assert_eq!(reset.last_delay, Some(Duration::ZERO), "{reset:?}");
    // And a first event opens the stream for real.
    wait_until("reconnecting", || rt.event_streams() == 1).await;
    rt.run_pod("u1", "web", "ns");
    let mut state = String::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while state != "streaming" {
        state = p.watcher_state().await.unwrap().state.to_string();
        assert!(std::time::Instant::now() < deadline, "{state}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(p.metrics().stream_connected.get(), 1);
    p.stop();
}
