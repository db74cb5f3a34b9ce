//! plegd's NRI plugin against a real containerd 1.7 with NRI enabled
//! (`scripts/containerd-up.sh` with `PLEGD_CRI_NRI=1`, socket BASE/nri.sock) and 2.1
//! (NRI on by default, same socket): the
//! plugin alone registers, is configured and synchronized, and is told of a
//! container's death, its removal and its pod's stop and removal, each naming the
//! pod's UID; and plegd with NRI as its only hint source (no CRI event stream, the
//! global relist 30 s away) publishes each death with relist_source `nri`, printing
//! the exit → ContainerDied latency over 20 exits.
//!
//! Ignored for a plain `cargo test` (needs root); `scripts/test.sh` runs it. One at a
//! time with the other real-containerd tests (`Session`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use integration_tests::containerd::*;
use integration_tests::pleg::{policy, started_on_request};
use integration_tests::wait::*;
use plegd_actors::{EventKind, HintSourceName, HintSourceState, RelistSource};
use plegd_nri::{Change, NriHint, Plugin, PluginConfig, Status};
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(30);

async fn next_matching(
    hints: &mut mpsc::UnboundedReceiver<(Instant, NriHint)>,
    what: &str,
    pred: impl Fn(&NriHint) -> bool,
) -> (Instant, NriHint) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        match tokio::time::timeout_at(deadline, hints.recv()).await {
            Ok(Some((at, hint))) if pred(&hint) => return (at, hint),
            Ok(Some((_, other))) => eprintln!("[nri] (skipped) {other:?}"),
            Ok(None) => panic!("the hint channel closed while waiting for {what}"),
            Err(_) => panic!("no NRI hint for {what} within {WAIT:?}"),
        }
    }
}

/// containerd's NRI socket; fails clearly when this containerd runs without NRI.
fn nri_socket(s: &Session) -> std::path::PathBuf {
    let socket = s.containerd.nri_socket();
    assert!(
        socket.exists(),
        "{} is missing: this containerd runs without NRI. Stop it \
         (scripts/containerd-down.sh {}) so the test starts it with PLEGD_CRI_NRI=1",
        socket.display(),
        s.containerd.base.display()
    );
    socket
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn nri_plugin_registers_and_hears_a_container_die_on_containerd_1_7() {
    plugin_hears_a_container_die(Flavor::V1_7).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn nri_plugin_registers_and_hears_a_container_die_on_containerd_2_1() {
    plugin_hears_a_container_die(Flavor::V2_1).await;
}

async fn plugin_hears_a_container_die(flavor: Flavor) {
    let s = Session::begin(flavor).await;
    let socket = nri_socket(&s);
    let (tx, mut hints) = mpsc::unbounded_channel();
    let plugin = Arc::new(Plugin::new(PluginConfig::new(&socket), move |h| {
        let _ = tx.send((Instant::now(), h));
    }));
    let mut status = plugin.status();
    let task = tokio::spawn({
        let plugin = Arc::clone(&plugin);
        async move { plugin.run(|_, _| Duration::from_millis(200)).await }
    });
    let connected =
        tokio::time::timeout(WAIT, status.wait_for(|s| matches!(s, Status::Connected(_))))
            .await
            .expect("plegd registers with containerd's NRI and is configured")
            .map(|s| s.clone())
            .expect("status");
    eprintln!("[nri] containerd {}: {connected:?}", flavor.as_str());
    next_matching(&mut hints, "the first Synchronize", |h| {
        matches!(h, NriHint::Synchronized { .. })
    })
    .await;

    let pod = s.cri.run_pod("nri").await;
    let id = s.cri.run_container(&pod, "app", &wait_script(3)).await;
    s.cri.trigger_exit(&id).await;
    let (at, hint) = next_matching(&mut hints, "the container's stop", |h| {
        matches!(h, NriHint::Container { change: Change::Stopped, container_id, .. } if *container_id == id)
    })
    .await;
    // containerd 1.7 calls the hook before its CRI status says EXITED (why plegd's
    // NRI source reads a hook's pod again later): shown, not asserted (a race).
    let first = s.cri.container_status(&id).await;
    let st = s.cri.wait_exited(&id).await;
    eprintln!(
        "[nri] ContainerStatus right after the hook: state {} (1 running, 2 exited); \
         EXITED {:?} after the hook",
        first.state,
        at.elapsed()
    );
    assert_eq!(st.exit_code, 3);
    assert_eq!(hint.pod_uid(), Some(pod.uid.as_str()), "{hint:?}");
    let exited_at = std::time::SystemTime::UNIX_EPOCH + Duration::from_nanos(st.finished_at as u64);
    let hint_wall = std::time::SystemTime::now() - at.elapsed();
    eprintln!(
        "[nri] exit -> StopContainer hint: {:?}",
        hint_wall.duration_since(exited_at).unwrap_or_default()
    );

    s.cri.remove_container(&id).await;
    next_matching(&mut hints, "the container's removal", |h| {
        matches!(h, NriHint::Container { change: Change::Removed, container_id, .. } if *container_id == id)
    })
    .await;
    s.cri.remove_pod(&pod.id).await;
    for change in [Change::Stopped, Change::Removed] {
        let (_, hint) = next_matching(&mut hints, "the sandbox's stop and removal", |h| {
            matches!(h, NriHint::Sandbox { change: c, pod: p } if *c == change && p.sandbox_id == pod.id)
        })
        .await;
        assert_eq!(hint.pod_uid(), Some(pod.uid.as_str()), "{hint:?}");
    }
    task.abort();
}

/// Exits measured by the latency test (the issue asks for p50/p99 over at least 20).
const EXITS: usize = 20;

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn a_death_reaches_plegd_through_nri_alone_on_containerd_1_7() {
    death_through_nri_alone(Flavor::V1_7).await;
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn a_death_reaches_plegd_through_nri_alone_on_containerd_2_1() {
    death_through_nri_alone(Flavor::V2_1).await;
}

async fn death_through_nri_alone(flavor: Flavor) {
    let s = Session::begin(flavor).await;
    // Checked first: its message says how to start containerd with NRI.
    nri_socket(&s);
    let sources = [HintSourceName::Nri];
    let period = Duration::from_secs(30);
    let (pleg, sub) = start_pleg(&s, &sources, period, policy(100, 2_000)).await;
    let metrics = pleg.metrics().clone();
    wait_until("the nri source streaming", || {
        metrics.hint_source_state(HintSourceName::Nri) == HintSourceState::Streaming
    })
    .await;
    let pod = s.cri.run_pod("nri-plegd").await;
    let mut latencies_ms = Vec::with_capacity(EXITS);
    for i in 0..EXITS {
        let c = s
            .cri
            .run_container(&pod, &format!("c{i}"), &wait_script(3))
            .await;
        started_on_request(&pleg, &sub, &pod.uid, &c).await;
        s.cri.trigger_exit(&c).await;
        let d = match tokio::time::timeout(WAIT, expect_event(&sub, EventKind::ContainerDied, &c))
            .await
        {
            Ok(d) => d,
            Err(_) => panic!(
                "exit {i}: no ContainerDied; {:?}",
                s.cri.container_status(&c).await
            ),
        };
        let received = plegd_runtime::now_ns();
        assert_eq!(d.event.relist_source, RelistSource::Nri, "{d:?}");
        assert_eq!(d.event.pod.uid, pod.uid);
        assert_eq!(d.event.exit.as_ref().map(|e| e.code), Some(3), "{d:?}");
        let st = s.cri.container_status(&c).await;
        latencies_ms.push((received - st.finished_at) as f64 / 1e6);
        s.cri.remove_container(&c).await;
    }
    latencies_ms.sort_by(f64::total_cmp);
    let pct = |q: f64| latencies_ms[((latencies_ms.len() - 1) as f64 * q).round() as usize];
    eprintln!(
        "[nri] containerd {}, NRI alone: exit (finished_at) -> ContainerDied, {EXITS} exits: \
         min {:.1} ms, p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        flavor.as_str(),
        latencies_ms[0],
        pct(0.5),
        pct(0.99),
        latencies_ms[latencies_ms.len() - 1]
    );
    assert!(pleg.health().check().is_ok());
    pleg.stop();
    s.cri.remove_all_pods().await;
}
