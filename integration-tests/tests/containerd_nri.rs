//! plegd's NRI plugin against a real containerd 1.7 with NRI enabled
//! (`scripts/containerd-up.sh` with `PLEGD_CRI_NRI=1`, socket BASE/nri.sock): it
//! registers, is configured and synchronized, and is told of a container's death, its
//! removal and its pod's stop and removal, each naming the pod's UID.
//!
//! Ignored for a plain `cargo test` (needs root); `scripts/test.sh` runs it. One at a
//! time with the other real-containerd tests (`Session`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use integration_tests::containerd::*;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn nri_plugin_registers_and_hears_a_container_die_on_containerd_1_7() {
    let s = Session::begin(Flavor::V1_7).await;
    let socket = s.containerd.nri_socket();
    assert!(
        socket.exists(),
        "{} is missing: this containerd runs without NRI. Stop it \
         (scripts/containerd-down.sh {}) so the test starts it with PLEGD_CRI_NRI=1",
        socket.display(),
        s.containerd.base.display()
    );
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
    eprintln!("[nri] {connected:?}");
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
    let st = s.cri.wait_exited(&id).await;
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
