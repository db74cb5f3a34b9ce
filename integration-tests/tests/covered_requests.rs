//! A targeted relist request is skipped as "covered" only if the global relist that
//! covers it really read its pod. Found while building the chaos suite: the dispatcher
//! skipped every request enqueued before the start of the last successful global
//! relist, including one for a pod that relist left alone (a sync held it) or failed
//! to read. If the sync then ended without success, or the read failure was brief, the
//! hint was lost and the exit it announced waited for the next periodic relist (up to
//! a whole `--relist-period`; these tests use an hour).
//!
//! Each step is ordered by a runtime wrapper that blocks or fails chosen status reads,
//! so the interleaving is exact, not a matter of timing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use integration_tests::wait::{expect_event, wait_until};
use plegd_actors::{EventKind, Pleg, PlegConfig, RelistSource, SyncOutcome};
use plegd_runtime::{ContainerStatus, RuntimeClient, RuntimeError};
use plegd_sim::{FakeRuntime, Intercept, Intercepted};
use plegd_telemetry::{Metrics, RequestResult};
use tokio::sync::Notify;

/// The fake runtime, with status reads that can be held back or failed once.
#[derive(Default)]
struct Scripted {
    inner: FakeRuntime,
    /// ContainerStatus of this container waits for the notify; `blocked` says it does.
    /// (Only exited containers are sure to be read: a running one's status is reused.)
    block: Mutex<Option<(String, Arc<Notify>)>>,
    blocked: AtomicBool,
    /// The next ContainerStatus of this container fails.
    fail_once: Mutex<Option<String>>,
}

impl Scripted {
    fn block_container(&self, id: &str) -> Arc<Notify> {
        let n = Arc::new(Notify::new());
        *self.block.lock().unwrap() = Some((id.to_string(), n.clone()));
        self.blocked.store(false, Ordering::SeqCst);
        n
    }
}

#[async_trait]
impl Intercept for Scripted {
    fn inner(&self) -> &FakeRuntime {
        &self.inner
    }
    async fn container_status(&self, id: &str) -> Result<ContainerStatus, RuntimeError> {
        let wait = {
            let mut block = self.block.lock().unwrap();
            match block.as_ref() {
                Some((b, _)) if b == id => block.take().map(|(_, n)| n),
                _ => None,
            }
        };
        if let Some(n) = wait {
            self.blocked.store(true, Ordering::SeqCst);
            n.notified().await;
        }
        let fail = {
            let mut f = self.fail_once.lock().unwrap();
            if f.as_deref() == Some(id) {
                f.take()
            } else {
                None
            }
        };
        if fail.is_some() {
            return Err(RuntimeError::Rpc {
                op: "ContainerStatus",
                code: tonic::Code::Unavailable,
                message: "scripted failure".into(),
            });
        }
        self.inner.container_status(id).await
    }
}

struct Node {
    rt: Arc<Intercepted<Scripted>>,
    pleg: Pleg,
    sub: plegd_actors::Subscription,
    /// (sandbox, container) of pods "x", "y", "z", each running.
    x: (String, String),
    y: (String, String),
    z: (String, String),
}

/// Three running pods, already seen by a plegd whose next periodic global relist is an
/// hour away and which has no event stream (every targeted relist is the test's).
async fn node() -> Node {
    let rt = Arc::new(Intercepted(Scripted::default()));
    let pleg = Pleg::start(
        rt.clone(),
        &PlegConfig {
            relist_period: Duration::from_secs(3600),
            hint_sources: vec![],
            ..PlegConfig::default()
        },
        Arc::new(Metrics::new()),
    );
    let sub = pleg.subscribe("t", 1024).await.unwrap();
    let mut pods = Vec::new();
    for uid in ["x", "y", "z"] {
        let sb = rt.inner.run_pod(uid, uid, "ns");
        let c = rt.inner.run_container(&sb, "app");
        pods.push((sb, c));
    }
    // The start-up global relist may have run before the pods existed: a targeted
    // relist of each (pods it does not know yet are found in the whole list).
    for uid in ["x", "y", "z"] {
        pleg.request_relist(uid, RelistSource::EventedPleg);
    }
    for (_, c) in &pods {
        expect_event(&sub, EventKind::ContainerStarted, c).await;
    }
    let mut pods = pods.into_iter();
    let (x, y, z) = (
        pods.next().unwrap(),
        pods.next().unwrap(),
        pods.next().unwrap(),
    );
    Node {
        rt,
        pleg,
        sub,
        x,
        y,
        z,
    }
}

/// Keeps the dispatcher busy with a targeted relist of "y" (its exited container's
/// status is held back) and queues, behind it, a due global relist and then `x`'s stop hint: the
/// global relist starts after the hint was enqueued, so it covers it by time.
async fn queue_hint_for_x_behind_a_global_relist(n: &Node) -> Arc<Notify> {
    let release_y = n.rt.block_container(&n.y.1);
    n.rt.inner.exit_container(&n.y.1, 0);
    assert!(n.pleg.request_relist("y", RelistSource::EventedPleg));
    let rt = n.rt.clone();
    wait_until("y's relist to be held back", || {
        rt.blocked.load(Ordering::SeqCst)
    })
    .await;
    n.rt.inner.exit_container(&n.x.1, 1);
    n.pleg.bring_global_relist_forward();
    assert!(n.pleg.request_relist("x", RelistSource::EventedPleg));
    release_y
}

#[actix_rt::test]
async fn a_hint_for_a_pod_held_during_the_covering_relist_is_not_lost() {
    let n = node().await;
    let skipped = || {
        n.pleg
            .metrics()
            .requests(RequestResult::Skipped, RelistSource::EventedPleg)
    };
    let skipped_before = skipped();
    let release_y = queue_hint_for_x_behind_a_global_relist(&n).await;
    // A sync takes "x" after its hint was queued: the global relist leaves it alone.
    let hold = n.pleg.gates().begin_sync("x").await.unwrap();
    // Let the global relist run until it reads "z" (which changed), then hold it there.
    let release_z = n.rt.block_container(&n.z.1);
    n.rt.inner.exit_container(&n.z.1, 0);
    release_y.notify_one();
    let rt = n.rt.clone();
    wait_until("the global relist to read z", || {
        rt.blocked.load(Ordering::SeqCst)
    })
    .await;
    // The sync fails while that relist is still running: no post_sync relist, and
    // the hint is what is left to publish x's exit.
    hold.end(SyncOutcome::Error);
    let pleg = n.pleg.clone();
    wait_until("x released", || !pleg.is_held("x")).await;
    release_z.notify_one();
    let died = expect_event(&n.sub, EventKind::ContainerDied, &n.x.1).await;
    assert_eq!(died.event.relist_source, RelistSource::EventedPleg);
    assert_eq!(skipped(), skipped_before, "x's hint was skipped");
}

#[actix_rt::test]
async fn a_hint_for_a_pod_the_covering_relist_failed_to_read_is_not_lost() {
    let n = node().await;
    let release_y = queue_hint_for_x_behind_a_global_relist(&n).await;
    // The global relist's read of x fails once (a brief runtime hiccup); the hint's
    // own relist, right after, reads it fine.
    *n.rt.fail_once.lock().unwrap() = Some(n.x.1.clone());
    release_y.notify_one();
    let died = expect_event(&n.sub, EventKind::ContainerDied, &n.x.1).await;
    assert_eq!(died.event.relist_source, RelistSource::EventedPleg);
    assert!(n.rt.fail_once.lock().unwrap().is_none(), "x was read twice");
}
