//! The subscriber API of a whole plegd core (`Pleg`) over the fake runtime: list
//! (snapshot) + watch from its revision while changes race it, resuming, and pod
//! lookups (newer-than, tombstones). What the gRPC API serves rests on these.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use plegd_actors::{
    CacheSnapshot, CachedPod, Delivery, EventKind, Pleg, PlegConfig, PodLookup, RelistSource,
    SubscribeError, Subscription,
};
use plegd_runtime::{ContainerState, SandboxState};
use plegd_sim::{FakeRuntime, Op};
use plegd_telemetry::Metrics;
use rand::{Rng as _, SeedableRng as _};
use rand_chacha::ChaCha8Rng;

/// Generous: CI machines are slow and shared.
const TIMEOUT: Duration = Duration::from_secs(20);

fn start(rt: &FakeRuntime, cfg: PlegConfig) -> Pleg {
    let cfg = PlegConfig {
        // Only the targeted relists a test asks for, and the global ones.
        hint_sources: vec![],
        ..cfg
    };
    Pleg::start(Arc::new(rt.clone()), &cfg, Arc::new(Metrics::new()))
}

/// [`start`] with global relists every `period` and the rest default.
fn start_every(rt: &FakeRuntime, period: Duration) -> Pleg {
    start(
        rt,
        PlegConfig {
            relist_period: period,
            ..PlegConfig::default()
        },
    )
}

async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Waits until a global relist that started after now has completed: the cache then
/// reflects the runtime as it is now.
async fn settle(p: &Pleg) {
    let now = SystemTime::now();
    p.bring_global_relist_forward();
    wait_until("a global relist after the changes", || {
        p.cache().global_timestamp().is_some_and(|g| g > now)
    })
    .await;
}

/// Receives until the event with revision `through` (inclusive).
async fn receive_through(sub: &Subscription, through: u64) -> Vec<Delivery> {
    let mut got = Vec::new();
    while got
        .last()
        .is_none_or(|d: &Delivery| d.event.revision < through)
    {
        match tokio::time::timeout(TIMEOUT, sub.recv_async()).await {
            Ok(Some(d)) => got.push(d),
            Ok(None) => panic!("the publisher closed"),
            Err(_) => panic!("no event through revision {through}; got {}", got.len()),
        }
    }
    got
}

/// What events say of a container or sandbox: running or exited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Seen {
    Running,
    Exited,
}

/// The running/exited containers and sandboxes a cache snapshot shows (others:
/// created or unknown, which no published event reports).
fn model_of(pods: &[(String, CachedPod)]) -> BTreeMap<String, Seen> {
    let mut m = BTreeMap::new();
    for (_, pod) in pods {
        let Some(st) = &pod.status else { continue };
        for sb in &st.sandboxes {
            match sb.state {
                SandboxState::Ready => m.insert(sb.id.clone(), Seen::Running),
                SandboxState::NotReady => m.insert(sb.id.clone(), Seen::Exited),
                SandboxState::Unknown => None,
            };
        }
        for c in &st.containers {
            match c.state {
                ContainerState::Running => m.insert(c.id.clone(), Seen::Running),
                ContainerState::Exited => m.insert(c.id.clone(), Seen::Exited),
                _ => None,
            };
        }
    }
    m
}

/// Applies one event to the model, which it must change: the fake runtime answers
/// without yielding, so a relist's lists and status reads see the same runtime and the
/// cache is never ahead of the events. An event the snapshot already reflects (a
/// duplicate) would change nothing.
fn apply(model: &mut BTreeMap<String, Seen>, d: &Delivery) {
    let id = d.event.container_id.clone();
    let changed = match d.event.kind {
        EventKind::ContainerStarted => model.insert(id, Seen::Running) != Some(Seen::Running),
        EventKind::ContainerDied => model.insert(id, Seen::Exited) != Some(Seen::Exited),
        EventKind::ContainerRemoved => model.remove(&id).is_some(),
        EventKind::PodSync | EventKind::ContainerChanged => true,
    };
    assert!(
        changed,
        "revision {} ({} of {}) was already reflected",
        d.event.revision, d.event.kind, d.event.container_id
    );
}

/// What the snapshot says the events reported, over all its pods.
fn reported_of(pods: &[(String, CachedPod)]) -> BTreeMap<String, EventKind> {
    pods.iter()
        .flat_map(|(_, p)| p.reported.iter().map(|(id, k)| (id.to_string(), *k)))
        .collect()
}

/// The fold of events: the last Started/Died of each ID not removed since.
fn fold<'a>(events: impl Iterator<Item = &'a Delivery>) -> BTreeMap<String, EventKind> {
    let mut m = BTreeMap::new();
    for d in events {
        match d.event.kind {
            EventKind::ContainerStarted | EventKind::ContainerDied => {
                m.insert(d.event.container_id.clone(), d.event.kind);
            }
            EventKind::ContainerRemoved => {
                m.remove(&d.event.container_id);
            }
            EventKind::PodSync | EventKind::ContainerChanged => {}
        }
    }
    m
}

/// Pods come, their containers exit, restart and go, pods go; each change asks for a
/// targeted relist of its pod, so targeted and global relists interleave with the
/// snapshots.
async fn churn(rt: &FakeRuntime, p: &Pleg, steps: usize) {
    // Seeded: the churn is reproducible.
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let mut pods: Vec<(String, String)> = Vec::new(); // (uid, sandbox)
    let mut next = 0;
    for _ in 0..steps {
        let choice = if pods.len() < 3 {
            0
        } else {
            rng.random_range(0..6)
        };
        let uid = match choice {
            5 => {
                // A read fails once: nothing of that relist (or pod) is applied or
                // published; the pod is read again later.
                let op = [Op::ListSandboxes, Op::ContainerStatus, Op::SandboxStatus]
                    [rng.random_range(0..3)];
                rt.fail(op, tonic::Code::Unavailable, Some(1));
                pods[rng.random_range(0..pods.len())].0.clone()
            }
            0 => {
                next += 1;
                let uid = format!("pod-{next}");
                let sb = rt.run_pod(&uid, &format!("web-{next}"), "ns");
                rt.run_container(&sb, "app");
                pods.push((uid.clone(), sb));
                uid
            }
            1..=3 => {
                let (uid, sb) = pods[rng.random_range(0..pods.len())].clone();
                let containers = rt.containers_of(&sb);
                match choice {
                    1 => {
                        if let Some(c) = containers
                            .iter()
                            .find(|c| c.state == ContainerState::Running)
                        {
                            rt.exit_container(&c.id, 1);
                        }
                    }
                    2 => {
                        rt.run_container(&sb, "app");
                    }
                    _ => {
                        if let Some(c) = containers
                            .iter()
                            .find(|c| c.state == ContainerState::Exited)
                        {
                            rt.remove_container(&c.id);
                        }
                    }
                }
                uid
            }
            _ => {
                let (uid, sb) = pods.swap_remove(rng.random_range(0..pods.len()));
                rt.stop_pod(&sb);
                rt.remove_pod(&sb);
                uid
            }
        };
        p.request_relist(&uid, RelistSource::PostSync);
        for _ in 0..rng.random_range(0..8) {
            tokio::task::yield_now().await;
        }
    }
    for op in [Op::ListSandboxes, Op::ContainerStatus, Op::SandboxStatus] {
        rt.clear_failure(op);
    }
}

#[actix_rt::test]
async fn a_snapshot_then_the_events_after_its_revision_rebuild_the_cache_under_racing_changes() {
    let rt = FakeRuntime::new();
    let p = start_every(&rt, Duration::from_millis(5));
    let watchers = async {
        let mut out: Vec<(CacheSnapshot, Subscription)> = Vec::new();
        for i in 0..60 {
            let snap = p.snapshot().await.unwrap();
            let sub = p
                .subscribe_after(&format!("w{i}"), 100_000, Some(snap.revision))
                .await
                .unwrap();
            out.push((snap, sub));
            for _ in 0..i % 5 {
                tokio::task::yield_now().await;
            }
        }
        out
    };
    let ((), watchers) = futures::join!(churn(&rt, &p, 400), watchers);
    // Twice: a pod whose read failed last is read again by the next one.
    settle(&p).await;
    settle(&p).await;
    let last = p.snapshot().await.unwrap();
    assert!(last.revision > 100, "too little churn: {}", last.revision);
    assert_eq!(last.revision, p.latest_revision());
    let want = model_of(&last.pods);
    // Every event, from the history: what each snapshot reports is exactly the fold
    // of the events up to its revision.
    let all = receive_through(
        &p.subscribe_after("all", 10, Some(0)).await.unwrap(),
        last.revision,
    )
    .await;
    let mut raced = 0;
    for (snap, sub) in &watchers {
        if snap.revision > 0 && snap.revision < last.revision {
            raced += 1;
        }
        let got = if snap.revision < last.revision {
            receive_through(sub, last.revision).await
        } else {
            Vec::new()
        };
        // Exactly the revisions after the snapshot's, each once, none missed.
        let revisions: Vec<u64> = got.iter().map(|d| d.event.revision).collect();
        assert_eq!(
            revisions,
            (snap.revision + 1..=last.revision).collect::<Vec<_>>()
        );
        assert!(got.iter().all(|d| d.missed == 0));
        let mut model = model_of(&snap.pods);
        for d in &got {
            apply(&mut model, d);
        }
        assert_eq!(model, want, "snapshot at {} + events", snap.revision);
        let upto = all.iter().take_while(|d| d.event.revision <= snap.revision);
        assert_eq!(
            reported_of(&snap.pods),
            fold(upto),
            "what the snapshot at {} reports",
            snap.revision
        );
    }
    assert!(raced > 10, "too few snapshots raced the churn: {raced}");
    assert_eq!(reported_of(&last.pods), fold(all.iter()));
    p.stop();
}

#[actix_rt::test]
async fn resuming_replays_exactly_what_followed_and_refuses_what_it_cannot_give() {
    let rt = FakeRuntime::new();
    let p = start(
        &rt,
        PlegConfig {
            relist_period: Duration::from_secs(3600),
            history_events: 8,
            ..PlegConfig::default()
        },
    );
    assert_eq!(p.instance_id().len(), 32);
    assert_eq!(p.latest_revision(), 0);
    let all = p.subscribe("all", 1000).await.unwrap();
    // Ten pods, each sandbox + container started: 20 events.
    for i in 0..10 {
        let uid = format!("pod-{i}");
        let sb = rt.run_pod(&uid, "web", "ns");
        rt.run_container(&sb, "app");
        p.request_relist(&uid, RelistSource::PostSync);
    }
    let seen = receive_through(&all, 20).await;
    assert_eq!(p.latest_revision(), 20);
    // The history keeps the last 8: 13..=20.
    let from_12 = p.subscribe_after("r", 2, Some(12)).await.unwrap();
    let replayed: Vec<Delivery> = from_12.try_iter().collect();
    assert_eq!(
        replayed.len(),
        8,
        "the replay is not bound by the queue of 2"
    );
    // The same events (the history keeps them packed: a replay unpacks each as it is
    // received, so it is equal to the live one, not the same allocation).
    for (r, s) in replayed.iter().zip(&seen[12..]) {
        assert_eq!(r.event, s.event, "the same event");
    }
    assert!(matches!(
        p.subscribe_after("r", 2, Some(11)).await,
        Err(SubscribeError::TooOld {
            after: 11,
            oldest_available: 13
        })
    ));
    assert!(matches!(
        p.subscribe_after("r", 2, Some(21)).await,
        Err(SubscribeError::Future {
            after: 21,
            latest: 20
        })
    ));
    // A slow subscriber overflows and is told so; the others keep every event.
    let slow = p.subscribe_after("slow", 2, Some(20)).await.unwrap();
    let fast = p.subscribe_after("fast", 1000, Some(20)).await.unwrap();
    let sb = rt.sandboxes_of("pod-0")[0].clone();
    for _ in 0..5 {
        rt.run_container(&sb, "app");
    }
    p.request_relist("pod-0", RelistSource::PostSync);
    let got = receive_through(&fast, 25).await;
    assert!(got.iter().all(|d| d.missed == 0));
    let slow_got: Vec<Delivery> = slow.try_iter().collect();
    assert_eq!(slow_got.len(), 2);
    rt.run_container(&sb, "app");
    p.request_relist("pod-0", RelistSource::PostSync);
    let next = receive_through(&slow, 26).await;
    assert_eq!((next[0].missed, next[0].seq), (3, 6));
    p.close_publisher().await;
    assert!(matches!(
        p.subscribe_after("late", 2, Some(26)).await,
        Err(SubscribeError::Closed)
    ));
    p.stop();
}

/// A pod with a running container, read into the cache by a targeted relist.
async fn known_pod(rt: &FakeRuntime, p: &Pleg, uid: &str) -> String {
    let sb = rt.run_pod(uid, "web", "ns");
    rt.run_container(&sb, "app");
    p.request_relist(uid, RelistSource::PostSync);
    wait_until("the pod in the cache", || p.cache().get(uid).is_some()).await;
    sb
}

#[actix_rt::test]
async fn newer_than_is_released_by_a_targeted_relist_that_reads_the_pod_or_finds_it_gone() {
    let rt = FakeRuntime::new();
    let p = start_every(&rt, Duration::from_secs(3600));
    let sb = known_pod(&rt, &p, "a").await;
    let t = SystemTime::now();
    let (got, ()) = futures::join!(p.pod_status("a", Some(t), TIMEOUT), async {
        tokio::task::yield_now().await;
        p.request_relist("a", RelistSource::PostSync);
    });
    match got {
        PodLookup::Present(pod) => assert!(pod.modified > t),
        other => panic!("{other:?}"),
    }
    // Gone: the targeted relist that finds it so releases the waiter, with its last
    // status and when it was found gone.
    rt.stop_pod(&sb);
    rt.remove_pod(&sb);
    let t = SystemTime::now();
    let (got, ()) = futures::join!(p.pod_status("a", Some(t), TIMEOUT), async {
        tokio::task::yield_now().await;
        p.request_relist("a", RelistSource::PostSync);
    });
    match got {
        PodLookup::Removed { last, removed_at } => {
            assert!(removed_at > t);
            assert_eq!(last.status.map(|s| s.pod.name), Some("web".to_string()));
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        p.pod_status("a", None, TIMEOUT).await,
        PodLookup::Removed { .. }
    ));
    p.stop();
}

#[actix_rt::test]
async fn newer_than_is_released_by_a_global_relist_even_for_a_pod_never_seen() {
    let rt = FakeRuntime::new();
    let p = start_every(&rt, Duration::from_millis(100));
    known_pod(&rt, &p, "a").await;
    let t = SystemTime::now();
    let (a, nobody) = futures::join!(
        p.pod_status("a", Some(t), TIMEOUT),
        p.pod_status("nobody", Some(t), TIMEOUT)
    );
    assert!(p.cache().global_timestamp().is_some_and(|g| g > t));
    assert!(matches!(a, PodLookup::Present(_)), "{a:?}");
    assert_eq!(nobody, PodLookup::Unknown);
    p.stop();
}

#[actix_rt::test]
async fn newer_than_gives_up_at_the_timeout_with_what_the_cache_has() {
    let rt = FakeRuntime::new();
    let p = start_every(&rt, Duration::from_secs(3600));
    known_pod(&rt, &p, "a").await;
    let t = SystemTime::now();
    let short = Duration::from_millis(50);
    let (a, nobody) = futures::join!(
        p.pod_status("a", Some(t), short),
        p.pod_status("nobody", Some(t), short)
    );
    match a {
        PodLookup::TimedOut(Some(pod)) => assert!(pod.modified < t),
        other => panic!("{other:?}"),
    }
    assert_eq!(nobody, PodLookup::TimedOut(None));
    // Without newer_than: what the cache has, at once.
    assert!(matches!(
        p.pod_status("a", None, short).await,
        PodLookup::Present(_)
    ));
    assert_eq!(
        p.pod_status("nobody", None, short).await,
        PodLookup::Unknown
    );
    p.stop();
}

#[actix_rt::test]
async fn a_removed_pod_is_forgotten_after_its_ttl_and_present_again_if_it_comes_back() {
    let rt = FakeRuntime::new();
    let p = start(
        &rt,
        PlegConfig {
            relist_period: Duration::from_millis(20),
            tombstone_ttl: Duration::from_millis(200),
            ..PlegConfig::default()
        },
    );
    for uid in ["a", "b"] {
        let sb = known_pod(&rt, &p, uid).await;
        rt.stop_pod(&sb);
        rt.remove_pod(&sb);
    }
    wait_until("both removed", || {
        ["a", "b"]
            .iter()
            .all(|u| matches!(p.cache().lookup(u), PodLookup::Removed { .. }))
    })
    .await;
    // "b" comes back (same UID, a new sandbox): present again.
    known_pod(&rt, &p, "b").await;
    assert!(matches!(p.cache().lookup("b"), PodLookup::Present(_)));
    wait_until("the tombstone expired and pruned", || {
        p.cache().lookup("a") == PodLookup::Unknown && p.cache().tombstones() == 0
    })
    .await;
    assert!(matches!(p.cache().lookup("b"), PodLookup::Present(_)));
    p.stop();
}

#[actix_rt::test]
async fn the_pods_labels_reach_the_cache_from_its_sandbox() {
    let rt = FakeRuntime::new();
    let p = start_every(&rt, Duration::from_secs(3600));
    let labels: BTreeMap<String, String> = [("app".to_string(), "web".to_string())].into();
    let sb = rt.run_pod_with_labels("a", "web", "ns", labels.clone());
    p.request_relist("a", RelistSource::PostSync);
    wait_until("the pod in the cache", || p.cache().get("a").is_some()).await;
    let snap = p.snapshot().await.unwrap();
    let sandboxes = snap.pods[0].1.status.as_ref().map(|s| s.sandboxes.clone());
    assert_eq!(
        sandboxes.map(|s| s.into_iter().map(|s| (s.id, s.labels)).collect::<Vec<_>>()),
        Some(vec![(sb, labels)])
    );
    p.stop();
}
