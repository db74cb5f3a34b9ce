//! The sync gates alone (KEP-3386 SyncPod suspension): the registry, its gates and the
//! held-pods set against a recording relist queue, so exactly what a hold and its
//! release ask of the dispatcher is visible — including when the queue is full.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use plegd_telemetry::{Metrics, RelistSource, RequestResult};

use super::gate::{SyncError, SyncOutcome};
use super::registry::{SyncGateRegistry, SyncGates};
use super::HeldPods;
use crate::mock::{recording_queue, Recorded, Recorder, RecorderConfig};
use crate::queue::BringForward;
use crate::queue::RequestRelist;
use crate::relist::router::RelistRouter;
use crate::testing::wait_until;

struct Gates {
    gates: SyncGates,
    held: HeldPods,
    router: RelistRouter,
    requests: Recorded<RequestRelist>,
    metrics: Arc<Metrics>,
}

fn gates(queue: RecorderConfig, idle: Duration) -> Gates {
    gates_holding(queue, idle, crate::sync::DEFAULT_MAX_SYNC_HOLD)
}

fn gates_holding(queue: RecorderConfig, idle: Duration, max_hold: Duration) -> Gates {
    let metrics = Arc::new(Metrics::new());
    let (soon_addr, _) = Recorder::<BringForward>::start(RecorderConfig::default());
    let (queue, requests) = recording_queue(queue, soon_addr.recipient(), metrics.clone());
    let held = HeldPods::default();
    let registry = SyncGateRegistry::new(queue.clone(), held.clone(), metrics.clone(), idle)
        .with_max_hold(max_hold)
        .start();
    Gates {
        gates: SyncGates::new(registry),
        router: RelistRouter::new(queue, held.clone(), metrics.clone()),
        held,
        requests,
        metrics,
    }
}

fn sources(r: &Recorded<RequestRelist>) -> Vec<(String, RelistSource)> {
    r.all().into_iter().map(|m| (m.uid, m.source)).collect()
}

#[actix_rt::test]
async fn a_successful_sync_queues_exactly_one_post_sync_relist() {
    let g = gates(RecorderConfig::default(), Duration::from_secs(60));
    let hold = g.gates.begin_sync("u1").await.unwrap();
    assert!(g.held.contains("u1"));
    hold.end(SyncOutcome::Success);
    wait_until("the release's relist", || g.requests.len() == 1).await;
    assert_eq!(
        sources(&g.requests),
        [("u1".into(), RelistSource::PostSync)]
    );
    assert!(!g.held.contains("u1"));
}

#[actix_rt::test]
async fn requests_during_a_hold_become_one_relist_even_if_the_sync_failed() {
    let g = gates(RecorderConfig::default(), Duration::from_secs(60));
    let hold = g.gates.begin_sync("u1").await.unwrap();
    for _ in 0..5 {
        assert!(g
            .router
            .request("u1", RelistSource::EventedPleg, None, None));
    }
    // Another pod's request is not held.
    assert!(g
        .router
        .request("u2", RelistSource::EventedPleg, None, None));
    wait_until("u2's request", || g.requests.len() == 1).await;
    assert_eq!(
        g.metrics
            .requests(RequestResult::Coalesced, RelistSource::EventedPleg),
        5
    );
    hold.end(SyncOutcome::Error);
    wait_until("the release's relist", || g.requests.len() == 2).await;
    assert_eq!(
        sources(&g.requests),
        [
            ("u2".into(), RelistSource::EventedPleg),
            ("u1".into(), RelistSource::PostSync)
        ]
    );
}

#[actix_rt::test]
async fn a_failed_or_cancelled_sync_with_nothing_pending_asks_for_nothing() {
    let g = gates(RecorderConfig::default(), Duration::from_secs(60));
    g.gates
        .begin_sync("u1")
        .await
        .unwrap()
        .end(SyncOutcome::Error);
    // Dropping a hold is a cancellation (the holder went away).
    drop(g.gates.begin_sync("u2").await.unwrap());
    wait_until("both released", || g.held.is_empty()).await;
    // A third hold proves both releases were handled (each gate handles its messages
    // in order, and u1 can be held again only after its release).
    let again = g.gates.begin_sync("u1").await.unwrap();
    again.end(SyncOutcome::Cancelled);
    wait_until("released again", || g.held.is_empty()).await;
    assert_eq!(g.requests.len(), 0);
}

#[actix_rt::test]
async fn a_held_pod_cannot_be_held_twice() {
    let g = gates(RecorderConfig::default(), Duration::from_secs(60));
    let hold = g.gates.begin_sync("u1").await.unwrap();
    assert_eq!(
        g.gates.begin_sync("u1").await.err(),
        Some(SyncError::AlreadyHeld)
    );
    hold.end(SyncOutcome::Success);
    wait_until("released", || g.requests.len() == 1).await;
}

#[actix_rt::test]
async fn idle_gates_stop_and_are_forgotten() {
    // Paused clock: the minute of idleness passes as soon as nothing else can run.
    tokio::time::pause();
    let g = gates(RecorderConfig::default(), Duration::from_secs(60));
    for i in 0..50 {
        g.gates
            .begin_sync(&format!("u{i}"))
            .await
            .unwrap()
            .end(SyncOutcome::Cancelled);
    }
    assert!(g.metrics.sync_gates.get() > 0);
    wait_until("every gate forgotten", || g.metrics.sync_gates.get() == 0).await;
    // A forgotten pod gets a new gate on its next hold.
    let hold = g.gates.begin_sync("u0").await.unwrap();
    assert_eq!(g.metrics.sync_gates.get(), 1);
    hold.end(SyncOutcome::Success);
    wait_until("released", || g.requests.len() == 1).await;
}

#[actix_rt::test]
async fn a_release_into_a_full_queue_is_dropped_and_counted_and_the_pod_is_released() {
    // The dispatcher is busy: its queue holds two pods, and one is there already.
    let g = gates(
        RecorderConfig {
            capacity: Some(2),
            stalled: true,
            ..RecorderConfig::default()
        },
        Duration::from_secs(60),
    );
    assert!(g
        .router
        .request("filler", RelistSource::EventedPleg, None, None));
    // The first release takes the last place; the next is merged into it.
    for _ in 0..2 {
        let hold = g.gates.begin_sync("u1").await.unwrap();
        hold.end(SyncOutcome::Success);
        wait_until("released", || !g.held.contains("u1")).await;
    }
    let count = |r| g.metrics.requests(r, RelistSource::PostSync);
    assert_eq!(count(RequestResult::Queued), 2);
    assert_eq!(count(RequestResult::Merged), 1);
    // The queue is full: another pod's release is dropped, and the pod released
    // all the same.
    let hold = g.gates.begin_sync("u2").await.unwrap();
    hold.end(SyncOutcome::Success);
    // Never left held, whatever the queue did.
    wait_until("released", || !g.held.contains("u2")).await;
    assert_eq!(count(RequestResult::Dropped), 1);
    g.requests.release();
    wait_until("the queue drained", || g.requests.len() == 2).await;
    assert_eq!(
        sources(&g.requests),
        [
            ("filler".to_string(), RelistSource::EventedPleg),
            ("u1".to_string(), RelistSource::PostSync)
        ]
    );
}

#[actix_rt::test]
async fn a_hold_not_renewed_expires_as_cancelled_and_is_counted() {
    // Paused clock: the minute passes as soon as nothing else can run.
    tokio::time::pause();
    let g = gates_holding(
        RecorderConfig::default(),
        Duration::from_secs(60),
        Duration::from_secs(60),
    );
    // A relist asked for during the hold is still owed after the expiry.
    let mut hold = g.gates.begin_sync("u1").await.unwrap();
    let began = tokio::time::Instant::now();
    assert!(hold.expires_at() > std::time::SystemTime::now());
    assert!(g
        .router
        .request("u1", RelistSource::EventedPleg, None, None));
    hold.expired().await;
    assert!(began.elapsed() >= Duration::from_secs(60));
    assert!(!g.held.contains("u1"));
    assert_eq!(g.metrics.sync_holds_expired.get(), 1);
    wait_until("the owed relist", || g.requests.len() == 1).await;
    assert_eq!(
        sources(&g.requests),
        [("u1".into(), RelistSource::PostSync)]
    );
    // The hold is over: a renew is refused, and its end changes nothing.
    assert_eq!(hold.renew().await.err(), Some(SyncError::Ended));
    hold.end(SyncOutcome::Success);
    // The pod can be held again at once.
    let again = g.gates.begin_sync("u1").await.unwrap();
    again.end(SyncOutcome::Cancelled);
    wait_until("released", || !g.held.contains("u1")).await;
    assert_eq!(g.requests.len(), 1);
    assert_eq!(g.metrics.sync_holds_expired.get(), 1);
}

#[actix_rt::test]
async fn a_renewed_hold_lasts_its_maximum_from_the_renew() {
    tokio::time::pause();
    let g = gates_holding(
        RecorderConfig::default(),
        Duration::from_secs(60),
        Duration::from_secs(60),
    );
    let mut hold = g.gates.begin_sync("u1").await.unwrap();
    let first = hold.expires_at();
    tokio::time::advance(Duration::from_secs(40)).await;
    let renewed = tokio::time::Instant::now();
    let at = hold.renew().await.unwrap();
    assert!(at > first && hold.expires_at() == at);
    // Past the first expiry, still held.
    tokio::time::advance(Duration::from_secs(40)).await;
    assert!(g.held.contains("u1"));
    assert_eq!(g.metrics.sync_holds_expired.get(), 0);
    hold.expired().await;
    assert!(renewed.elapsed() >= Duration::from_secs(60));
    assert_eq!(g.metrics.sync_holds_expired.get(), 1);
    assert!(!g.held.contains("u1"));
}

#[actix_rt::test]
async fn holds_of_pods_plegd_does_not_know_are_bounded() {
    let mut g = gates(RecorderConfig::default(), Duration::from_secs(60));
    g.gates = g
        .gates
        .with_known(Arc::new(|uid: &str| uid.starts_with("known")), 2);
    let a = g.gates.begin_sync("new-a").await.unwrap();
    assert!(!a.pod_known());
    let b = g.gates.begin_sync("new-b").await.unwrap();
    assert_eq!(
        g.gates.begin_sync("new-c").await.err(),
        Some(SyncError::TooManyUnknown(2))
    );
    // Refused holds take no place.
    assert!(g.gates.begin_sync("new-a").await.is_err());
    assert_eq!(g.gates.unknown_holds(), 2);
    // Known pods are not bounded by it.
    let k = g.gates.begin_sync("known-1").await.unwrap();
    assert!(k.pod_known());
    // A released place is free again.
    a.end(SyncOutcome::Cancelled);
    wait_until("the place given back", || g.gates.unknown_holds() == 1).await;
    let c = g.gates.begin_sync("new-c").await.unwrap();
    assert!(!g.held.contains("new-a") && g.held.contains("new-c"));
    for h in [b, c, k] {
        h.end(SyncOutcome::Cancelled);
    }
    wait_until("every place given back", || g.gates.unknown_holds() == 0).await;
}
