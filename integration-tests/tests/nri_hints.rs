//! The NRI hint source through the whole of plegd's core: a mock NRI runtime
//! (`plegd_nri::mock_runtime`, the multiplexed ttRPC protocol) calls plegd's plugin
//! while the simulated CRI runtime holds the truth. With the global relist far away
//! (30 s), every event seen here was found by the relist a hint asked for: a stop or
//! removal hook relists its pod (relist_source `nri`), a Synchronize brings the global
//! relist forward, and plegd re-registers when the runtime drops it.

use std::sync::Arc;
use std::time::Duration;

use integration_tests::pleg::{global_relists, policy};
use integration_tests::wait::*;
use plegd_actors::{
    EventKind, HintSourceName, HintSourceState, Pleg, PlegConfig, RelistSource, Subscription,
};
use plegd_nri::mock_runtime::{container, pod, MockRuntime, PluginConn, DEFAULT_REQUEST_TIMEOUT};
use plegd_sim::FakeRuntime;
use plegd_telemetry::{Metrics, RequestResult};

const LONG_PERIOD: Duration = Duration::from_secs(30);

fn start(rt: &FakeRuntime, nri_socket: &std::path::Path) -> Pleg {
    let cfg = PlegConfig {
        relist_period: LONG_PERIOD,
        hint_sources: vec![HintSourceName::Nri],
        nri_socket: nri_socket.to_owned(),
        reconnect: policy(20, 200),
        ..PlegConfig::default()
    };
    Pleg::start(Arc::new(rt.clone()), &cfg, Arc::new(Metrics::new()))
}

async fn accept(runtime: &MockRuntime) -> PluginConn {
    let conn = tokio::time::timeout(TIMEOUT, runtime.accept())
        .await
        .expect("plegd's plugin connects")
        .expect("and registers");
    assert_eq!(conn.registration.name, "plegd");
    conn.configure().await.expect("Configure answered");
    conn
}

async fn wait_state(pleg: &Pleg, state: HintSourceState) {
    let m = pleg.metrics().clone();
    wait_until(&format!("the nri source {state}"), || {
        m.hint_source_state(HintSourceName::Nri) == state
    })
    .await;
}

/// One pod (`uid-1`, sandbox `sb`, container `app` = `c`) in the simulated runtime,
/// plegd with only the NRI source, its plugin registered and configured with the
/// mock runtime and streaming, and a subscriber that has seen `c` start.
struct Node {
    _dir: tempfile::TempDir,
    runtime: MockRuntime,
    rt: FakeRuntime,
    sb: String,
    c: String,
    pleg: Pleg,
    sub: Subscription,
    conn: PluginConn,
}

async fn streaming_node() -> Node {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let runtime = MockRuntime::bind(&socket, DEFAULT_REQUEST_TIMEOUT).unwrap();
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("uid-1", "web", "ns");
    let c = rt.run_container(&sb, "app");
    let pleg = start(&rt, &socket);
    let sub = pleg.subscribe("test", 1000).await.expect("subscribe");
    expect_event(&sub, EventKind::ContainerStarted, &c).await;
    let conn = accept(&runtime).await;
    wait_state(&pleg, HintSourceState::Streaming).await;
    Node {
        _dir: dir,
        runtime,
        rt,
        sb,
        c,
        pleg,
        sub,
        conn,
    }
}

#[actix_rt::test]
async fn nri_hooks_relist_their_pod_and_a_synchronize_relists_everything() {
    let Node {
        _dir,
        runtime,
        rt,
        sb,
        c,
        pleg,
        sub,
        conn,
    } = streaming_node().await;

    // Synchronize (in pages): one global relist, brought forward.
    let before = global_relists(&pleg);
    let nri_pod = pod("uid-1", "web", "ns", &sb);
    let c2 = rt.run_container(&sb, "sidecar");
    let ctrs = [container(&c, &sb, "app"), container(&c2, &sb, "sidecar")];
    assert_eq!(
        conn.synchronize(std::slice::from_ref(&nri_pod), &ctrs, 1)
            .await
            .unwrap(),
        2
    );
    let started = expect_event(&sub, EventKind::ContainerStarted, &c2).await;
    assert_eq!(started.event.relist_source, RelistSource::Global);
    assert!(global_relists(&pleg) > before);

    // A container's stop hook: its pod is relisted at once.
    rt.exit_container(&c, 3);
    conn.stop_container(&nri_pod, &container(&c, &sb, "app"))
        .await
        .unwrap();
    let died = expect_event(&sub, EventKind::ContainerDied, &c).await;
    assert_eq!(died.event.relist_source, RelistSource::Nri);
    assert_eq!(died.event.pod.uid, "uid-1");
    assert_eq!(died.event.exit.as_ref().map(|e| e.code), Some(3));

    // The same stop again, both ways (a runtime retrying, or the old and the new
    // RPC): nothing new to publish.
    conn.stop_container(&nri_pod, &container(&c, &sb, "app"))
        .await
        .unwrap();
    conn.state_change(
        plegd_nri::api::Event::StopContainer,
        &nri_pod,
        Some(&container(&c, &sb, "app")),
    )
    .await
    .unwrap();

    // A hook that names no pod UID (the old StateChange path, here without one) is
    // mapped to the pod through the cache.
    rt.exit_container(&c2, 0);
    let anonymous = pod("", "", "", &sb);
    conn.state_change(
        plegd_nri::api::Event::StopContainer,
        &anonymous,
        Some(&container(&c2, &sb, "sidecar")),
    )
    .await
    .unwrap();
    let got = recv_until(&sub, "c2's death", |d| {
        d.event.kind == EventKind::ContainerDied && d.event.container_id == c2
    })
    .await;
    assert_eq!(
        got.len(),
        1,
        "the duplicate stops published nothing: {got:?}"
    );
    assert_eq!(got[0].event.relist_source, RelistSource::Nri);

    // The sandbox's stop and removal.
    rt.stop_pod(&sb);
    conn.stop_pod_sandbox(&nri_pod).await.unwrap();
    let died = expect_event(&sub, EventKind::ContainerDied, &sb).await;
    assert_eq!(died.event.relist_source, RelistSource::Nri);
    rt.remove_pod(&sb);
    conn.remove_pod_sandbox(&nri_pod).await.unwrap();
    let removed = expect_event(&sub, EventKind::ContainerRemoved, &sb).await;
    assert_eq!(removed.event.relist_source, RelistSource::Nri);

    // A hook about a pod plegd never saw asks for nothing and breaks nothing.
    conn.stop_container(
        &pod("uid-unknown", "x", "ns", "sb-x"),
        &container("c-x", "sb-x", "app"),
    )
    .await
    .unwrap();

    // The runtime drops the plugin (a restart): plegd registers again and its hooks
    // work as before. (The reconnect and the Synchronize after it ask for a global
    // relist too; the one Synchronize above already used this period's.)
    conn.disconnect();
    let conn = accept(&runtime).await;
    let sb2 = rt.run_pod("uid-2", "db", "ns");
    let c3 = rt.run_container(&sb2, "db");
    conn.synchronize(&[pod("uid-2", "db", "ns", &sb2)], &[], 8)
        .await
        .unwrap();
    rt.exit_container(&c3, 137);
    conn.stop_container(&pod("uid-2", "db", "ns", &sb2), &container(&c3, &sb2, "db"))
        .await
        .unwrap();
    let died = expect_event(&sub, EventKind::ContainerDied, &c3).await;
    assert_eq!(died.event.relist_source, RelistSource::Nri);
    pleg.stop();
}

#[actix_rt::test]
async fn without_an_nri_socket_the_source_is_unsupported_until_the_runtime_enables_it() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("uid-1", "web", "ns");
    let c = rt.run_container(&sb, "app");
    let pleg = start(&rt, &socket);
    let sub = pleg.subscribe("test", 1000).await.expect("subscribe");
    // Polling works without it.
    expect_event(&sub, EventKind::ContainerStarted, &c).await;
    wait_state(&pleg, HintSourceState::Unsupported).await;
    // The runtime enables NRI: plegd is retried every backoff cap and registers; the
    // attempt after a failure brings a global relist forward.
    let before = global_relists(&pleg);
    let runtime = MockRuntime::bind(&socket, DEFAULT_REQUEST_TIMEOUT).unwrap();
    let conn = accept(&runtime).await;
    wait_state(&pleg, HintSourceState::Streaming).await;
    wait_until("the reconnect's global relist", || {
        global_relists(&pleg) > before
    })
    .await;
    rt.exit_container(&c, 1);
    conn.stop_container(&pod("uid-1", "web", "ns", &sb), &container(&c, &sb, "app"))
        .await
        .unwrap();
    let died = expect_event(&sub, EventKind::ContainerDied, &c).await;
    assert_eq!(died.event.relist_source, RelistSource::Nri);
    // Stopping plegd closes its NRI connection.
    pleg.stop();
    let end = tokio::time::timeout(TIMEOUT, conn.closed())
        .await
        .expect("plegd hangs up");
    assert!(matches!(end, plegd_nri::mux::MuxEnd::PeerClosed), "{end:?}");
}

/// A missing NRI socket while the runtime fails CRI (down, or restarting: containerd
/// opens its NRI socket as it starts) is an ordinary failure, retried on the backoff
/// and shown `waiting`; only once the runtime has answered CRI for a while is it a
/// runtime without NRI, `unsupported`. (Regression: it was `unsupported` at once, and
/// after a containerd restart NRI was back only after the whole reconnect cap.)
#[actix_rt::test]
async fn a_missing_nri_socket_while_the_runtime_fails_is_waiting_not_unsupported() {
    use plegd_sim::Op;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let rt = FakeRuntime::new();
    rt.fail(Op::ListSandboxes, tonic::Code::Unavailable, None);
    let cfg = PlegConfig {
        relist_period: Duration::from_millis(100),
        hint_sources: vec![HintSourceName::Nri],
        nri_socket: socket.clone(),
        reconnect: policy(20, 200),
        ..PlegConfig::default()
    };
    let pleg = Pleg::start(Arc::new(rt.clone()), &cfg, Arc::new(Metrics::new()));
    let m = pleg.metrics().clone();
    wait_state(&pleg, HintSourceState::Waiting).await;
    // Many attempts (the backoff is capped at 200 ms), none unsupported.
    let until = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < until {
        let state = m.hint_source_state(HintSourceName::Nri);
        assert_ne!(state, HintSourceState::Unsupported);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The runtime answers again, and still has no NRI socket after the grace.
    rt.clear_failure(Op::ListSandboxes);
    wait_state(&pleg, HintSourceState::Unsupported).await;
    pleg.stop();
}

/// containerd 1.7 calls StopContainer before its CRI status says EXITED (the status
/// flips after `runc delete`). A hook whose immediate relist still reads the container
/// running must still be published through NRI, by a follow-up read — not 30 s later
/// by the global relist. (Regression: the first real-containerd run published
/// nothing.)
#[actix_rt::test]
async fn a_stop_hook_that_comes_before_the_status_flips_is_still_published_through_nri() {
    let Node {
        _dir,
        runtime: _runtime,
        rt,
        sb,
        c,
        pleg,
        sub,
        conn,
    } = streaming_node().await;

    // The hook first; the runtime's status says exited only after plegd's immediate
    // read of the pod.
    conn.stop_container(&pod("uid-1", "web", "ns", &sb), &container(&c, &sb, "app"))
        .await
        .unwrap();
    let m = pleg.metrics().clone();
    wait_until("the hook's immediate relist", || {
        m.requests(RequestResult::Done, RelistSource::Nri) >= 1
    })
    .await;
    rt.exit_container(&c, 2);
    let died = expect_event(&sub, EventKind::ContainerDied, &c).await;
    assert_eq!(died.event.relist_source, RelistSource::Nri);
    assert_eq!(died.event.exit.as_ref().map(|e| e.code), Some(2));
    pleg.stop();
}
