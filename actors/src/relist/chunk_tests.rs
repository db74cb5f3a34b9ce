//! The dispatcher's global relist in chunks (for memory): each chunk's events
//! numbered before its cache apply, the global timestamp and the held pods with the
//! last chunk only, plegd ready only after it; the cache answers no snapshot of a
//! relist half applied; and the whole gives the same cache, events and revisions as
//! one relist applied at once. Also under faults: reads failing in a middle chunk, a
//! stop in the middle.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use actix::prelude::*;
use plegd_runtime::{ContainerStatus, RuntimeClient, RuntimeError};
use plegd_sim::{FakeRuntime, Intercept, Intercepted};
use plegd_telemetry::Metrics;

use super::dispatcher::{DispatcherConfig, DispatcherDeps, DispatcherHandle, RelistDispatcher};
use crate::cache::{ApplyRelist, CacheOwner, CacheSnapshot, Snapshot};
use crate::event::{EventKind, LifecycleEvent};
use crate::health::Health;
use crate::mock::{Recorded, Recorder, RecorderConfig};
use crate::pleg::{CacheUpdate, GenericPleg};
use crate::publisher::Publish;
use crate::revision::Revisions;
use crate::sync::HeldPods;
use crate::testing::wait_until;

// The Recorder hands the test copies (see relist/tests.rs for ApplyRelist's).
fn copy(a: &ApplyRelist) -> (Vec<CacheUpdate>, Option<SystemTime>, Vec<String>, u64, bool) {
    (
        a.updates.clone(),
        a.global_timestamp,
        a.held.clone(),
        a.revision,
        a.more,
    )
}

/// `pods` pods (uids p00, p01, …) of one running and one exited container.
fn node(pods: usize) -> FakeRuntime {
    let rt = FakeRuntime::new();
    for i in 0..pods {
        let uid = format!("p{i:02}");
        let sb = rt.run_pod(&uid, &uid, "ns");
        rt.run_container(&sb, "app");
        let done = rt.run_container(&sb, "init");
        rt.exit_container(&done, 0);
    }
    rt
}

struct Plegd {
    dispatcher: DispatcherHandle,
    health: Health,
    held: HeldPods,
}

fn start(
    rt: &FakeRuntime,
    chunk_pods: usize,
    cache: Recipient<ApplyRelist>,
    publisher: Recipient<Publish>,
    held: HeldPods,
) -> Plegd {
    start_on(Arc::new(rt.clone()), chunk_pods, cache, publisher, held)
}

fn start_on(
    runtime: Arc<dyn RuntimeClient>,
    chunk_pods: usize,
    cache: Recipient<ApplyRelist>,
    publisher: Recipient<Publish>,
    held: HeldPods,
) -> Plegd {
    let health = Health::new(Duration::from_secs(180));
    let dispatcher = RelistDispatcher::start(
        GenericPleg::new(runtime, 4).with_chunk_pods(chunk_pods),
        DispatcherConfig {
            // Only the first global relist runs.
            relist_period: Duration::from_secs(3600),
            queue_capacity: 64,
            admission: true,
        },
        DispatcherDeps {
            cache,
            publisher,
            metrics: Arc::new(Metrics::new()),
            health: health.clone(),
            held: held.clone(),
            revisions: Revisions::default(),
            state: None,
        },
    );
    Plegd {
        dispatcher,
        health,
        held,
    }
}

fn with_recorders(
    rt: &FakeRuntime,
    chunk_pods: usize,
    cache: RecorderConfig,
    held: HeldPods,
) -> (Plegd, Recorded<ApplyRelist>, Recorded<Publish>) {
    let (cache_addr, cache) = Recorder::<ApplyRelist>::start(cache);
    let (publisher, published) = Recorder::<Publish>::start(RecorderConfig::default());
    let p = start(
        rt,
        chunk_pods,
        cache_addr.recipient(),
        publisher.recipient(),
        held,
    );
    (p, cache, published)
}

/// Events without their time (two nodes read at different times).
fn timeless(events: &[LifecycleEvent]) -> Vec<LifecycleEvent> {
    events
        .iter()
        .map(|e| LifecycleEvent {
            time: SystemTime::UNIX_EPOCH,
            ..e.clone()
        })
        .collect()
}

/// 10 pods in chunks of 3: four applies in order, each with its chunk's last revision
/// (every event numbered before its chunk's apply, one after the other across
/// chunks), `more` on all but the last, the global timestamp and the held pod with the
/// last only; each chunk's events published after its apply; ready only once the last
/// chunk is applied.
#[actix_rt::test]
async fn a_first_relist_is_applied_chunk_by_chunk_and_ready_after_the_last() {
    let rt = node(10);
    let held = HeldPods::default();
    held.hold("p01");
    let (p, cache, published) = with_recorders(
        &rt,
        3,
        RecorderConfig {
            delay: Duration::from_millis(20),
            ..RecorderConfig::default()
        },
        held,
    );
    // Whenever plegd is ready, the last chunk has been applied. (Read ready first:
    // the recorder records before it acknowledges, the dispatcher is ready after.)
    wait_until("ready", || {
        let ready = p.health.ready();
        let applied = cache.all();
        assert!(
            !ready || applied.last().is_some_and(|a| !a.more),
            "ready with {} chunks applied",
            applied.len()
        );
        ready
    })
    .await;
    let applied: Vec<_> = cache.all().iter().map(copy).collect();
    assert_eq!(applied.len(), 4, "9 pods read (one held) in chunks of 3");
    let more: Vec<bool> = applied.iter().map(|a| a.4).collect();
    assert_eq!(more, [true, true, true, false]);
    assert!(applied[..3].iter().all(|a| a.1.is_none()));
    assert!(applied[3].1.is_some());
    assert_eq!(applied[3].2, ["p01"]);
    let uids: Vec<Vec<String>> = applied
        .iter()
        .map(|a| a.0.iter().map(|u| u.uid().to_string()).collect())
        .collect();
    assert_eq!(
        uids,
        [
            vec!["p00", "p02"],
            vec!["p03", "p04", "p05"],
            vec!["p06", "p07", "p08"],
            vec!["p09"]
        ]
    );
    wait_until("every chunk published", || published.len() == 4).await;
    let published = published.all();
    let mut next = 1;
    for (chunk, (publish, apply)) in published.iter().zip(&applied).enumerate() {
        // Three events a pod: its sandbox and app started, init died.
        assert_eq!(publish.0.len(), 3 * apply.0.len(), "chunk {chunk}");
        for e in &publish.0 {
            assert_eq!(e.revision, next, "chunk {chunk}");
            next += 1;
        }
        assert_eq!(apply.3, next - 1, "chunk {chunk}: the revision applied");
    }
    p.dispatcher.stop.stop();
    wait_until("stopped", || p.dispatcher.stop.stopped()).await;
}

/// The same node through a real CacheOwner, in chunks of 2 and at once: the same
/// cache and revision once ready, and the same events, numbered the same.
#[actix_rt::test]
async fn a_relist_in_chunks_leaves_the_cache_and_events_a_relist_at_once_leaves() {
    let rt = node(9);
    rt.exit_container(&rt.containers_of(&rt.sandboxes_of("p04")[0])[0].id, 3);
    let mut results: Vec<(CacheSnapshot, Vec<LifecycleEvent>)> = Vec::new();
    for chunk_pods in [2, usize::MAX] {
        let (owner, _) = CacheOwner::new(Duration::from_secs(60));
        let owner = owner.start();
        let (publisher, published) = Recorder::<Publish>::start(RecorderConfig::default());
        let held = HeldPods::default();
        held.hold("p06");
        let p = start(
            &rt,
            chunk_pods,
            owner.clone().recipient(),
            publisher.recipient(),
            held,
        );
        wait_until("ready", || p.health.ready()).await;
        let mut snapshot = owner.send(Snapshot).await.unwrap();
        for (_, pod) in &mut snapshot.pods {
            pod.modified = SystemTime::UNIX_EPOCH;
        }
        let events: Vec<_> = published.all().into_iter().flat_map(|p| p.0).collect();
        results.push((snapshot, timeless(&events)));
        assert!(p.held.contains("p06"));
        p.dispatcher.stop.stop();
        wait_until("stopped", || p.dispatcher.stop.stopped()).await;
    }
    let (chunked, at_once) = (&results[0], &results[1]);
    assert_eq!(at_once.0.pods.len(), 8, "p06 is held");
    assert_eq!(at_once.1.len(), 8 * 3);
    assert_eq!(chunked.0, at_once.0);
    assert_eq!(chunked.1, at_once.1);
    assert_eq!(chunked.0.revision, 24);
}

/// A snapshot asked while a relist is partly applied waits for its last chunk (asked
/// between two chunks, it is answered with both); between relists it is answered at
/// once.
#[actix_rt::test]
async fn the_cache_answers_no_snapshot_of_a_relist_half_applied() {
    let (owner, _) = CacheOwner::new(Duration::from_secs(60));
    let owner = owner.start();
    let set = |uid: &str| CacheUpdate::Set {
        uid: uid.into(),
        status: Ok(crate::pleg::PodStatus {
            pod: plegd_runtime::PodRef {
                uid: uid.into(),
                name: uid.into(),
                namespace: "ns".into(),
            },
            sandboxes: Vec::new(),
            containers: Vec::new(),
        }),
        read_at: SystemTime::now(),
        source: crate::RelistSource::Global,
    };
    let chunk = |uid: &str, revision: u64, more: bool| ApplyRelist {
        updates: vec![set(uid)],
        global_timestamp: (!more).then(SystemTime::now),
        held: Vec::new(),
        revision,
        events: vec![(uid.into(), "sb".into(), EventKind::ContainerStarted)],
        more,
    };
    owner.send(chunk("a", 1, true)).await.unwrap();
    // Queued behind the first chunk, before the last: actix hands messages over in
    // order, so only a snapshot that waits can see the last chunk.
    let early = owner.send(Snapshot);
    owner.send(chunk("b", 2, false)).await.unwrap();
    let early = early.await.unwrap();
    assert_eq!(early.revision, 2);
    let uids: Vec<_> = early.pods.iter().map(|(u, _)| u.as_str()).collect();
    assert_eq!(uids, ["a", "b"]);
    // Whole relists: answered in turn.
    let now = owner.send(Snapshot);
    owner.send(chunk("c", 3, false)).await.unwrap();
    assert_eq!(now.await.unwrap().revision, 2);
}

/// Status reads failing for the pods of a middle chunk: those pods get their errors
/// (and are not covered), the other chunks go on, the relist completes and plegd is
/// ready; a relist of one of them reads it again.
#[actix_rt::test]
async fn reads_failing_in_a_middle_chunk_cost_only_their_pods() {
    let rt = node(6);
    rt.fail_pod_status("p02", true);
    rt.fail_pod_status("p03", true);
    let (p, cache, published) =
        with_recorders(&rt, 2, RecorderConfig::default(), HeldPods::default());
    wait_until("ready", || p.health.ready()).await;
    let applied: Vec<_> = cache.all().iter().map(copy).collect();
    assert_eq!(applied.len(), 3);
    let errors: Vec<Vec<bool>> = applied
        .iter()
        .map(|a| {
            a.0.iter()
                .map(|u| matches!(u, CacheUpdate::Set { status: Err(_), .. }))
                .collect()
        })
        .collect();
    assert_eq!(
        errors,
        [vec![false, false], vec![true, true], vec![false, false]]
    );
    assert!(
        applied[2].1.is_some(),
        "the last chunk carries the timestamp"
    );
    // A chunk without events publishes nothing: the middle one.
    wait_until("published", || published.len() == 2).await;
    let uids: Vec<String> = published
        .all()
        .iter()
        .flat_map(|p| p.0.iter().map(|e| e.pod.uid.clone()))
        .collect();
    assert_eq!(uids.len(), 4 * 3);
    assert!(
        !uids.iter().any(|u| u == "p02" || u == "p03"),
        "no event for unread pods"
    );
    // A targeted relist of one of them reads it again once the runtime answers.
    rt.fail_pod_status("p02", false);
    assert!(p
        .dispatcher
        .queue
        .request("p02", crate::event::RelistSource::EventedPleg, None, None));
    wait_until("p02 read again", || {
        cache.all().iter().any(|a| {
            a.updates
                .iter()
                .any(|u| matches!(u, CacheUpdate::Set { uid, status: Ok(_), .. } if uid == "p02"))
        })
    })
    .await;
    p.dispatcher.stop.stop();
    wait_until("stopped", || p.dispatcher.stop.stopped()).await;
}

/// A stop asked while a chunked relist is in its first chunks: the relist finishes —
/// every chunk applied and published, plegd ready — before the dispatcher stops.
#[actix_rt::test]
async fn a_stop_in_the_middle_of_a_chunked_relist_lets_it_finish() {
    let rt = node(8);
    let (p, cache, published) = with_recorders(
        &rt,
        2,
        RecorderConfig {
            delay: Duration::from_millis(30),
            ..RecorderConfig::default()
        },
        HeldPods::default(),
    );
    wait_until("the first chunk applied", || cache.len() == 1).await;
    p.dispatcher.stop.stop();
    wait_until("stopped", || p.dispatcher.stop.stopped()).await;
    let applied: Vec<_> = cache.all().iter().map(copy).collect();
    let more: Vec<bool> = applied.iter().map(|a| a.4).collect();
    assert_eq!(more, [true, true, true, false]);
    assert_eq!(published.len(), 4);
    assert!(p.health.ready());
}

/// The fake runtime, whose ContainerStatus of the second of `gated` asked waits
/// until the test opens the gate: a global relist stopped between two chunks.
#[derive(Clone)]
struct Gate {
    inner: FakeRuntime,
    gated: Arc<std::sync::Mutex<(Vec<String>, usize)>>,
    open: Arc<tokio::sync::Notify>,
}

#[async_trait::async_trait]
impl Intercept for Gate {
    fn inner(&self) -> &FakeRuntime {
        &self.inner
    }

    async fn container_status(&self, id: &str) -> Result<ContainerStatus, RuntimeError> {
        let second = {
            let mut g = self.gated.lock().unwrap();
            let asked = g.0.iter().any(|c| c == id);
            if asked {
                g.1 += 1;
            }
            asked && g.1 == 2
        };
        if second {
            self.open.notified().await;
        }
        self.inner.container_status(id).await
    }
}

/// A death read beside a global relist between two of its chunks is applied with
/// `more` (the cache still answers no snapshot of the relist half applied), before
/// the next chunk; the last chunk then ends the relist.
#[actix_rt::test]
async fn a_death_read_beside_between_two_chunks_keeps_the_relist_open() {
    let rt = FakeRuntime::new();
    let mut apps = Vec::new();
    for uid in ["a", "b", "c"] {
        let sb = rt.run_pod(uid, uid, "ns");
        apps.push((sb.clone(), rt.run_container(&sb, "app")));
    }
    let gate = Gate {
        inner: rt.clone(),
        gated: Arc::default(),
        open: Arc::default(),
    };
    let (cache_addr, cache) = Recorder::<ApplyRelist>::start(RecorderConfig::default());
    let (publisher, published) = Recorder::<Publish>::start(RecorderConfig::default());
    let p = start_on(
        Arc::new(Intercepted(gate.clone())),
        1,
        cache_addr.recipient(),
        publisher.recipient(),
        HeldPods::default(),
    );
    wait_until("first global relist", || p.health.ready()).await;
    // Pods a and b change: a chunk each, the second stopped at its status read.
    let new: Vec<String> = apps[..2]
        .iter()
        .map(|(sb, _)| rt.run_container(sb, "side"))
        .collect();
    gate.gated.lock().unwrap().0 = new;
    let applied = cache.len();
    p.dispatcher.queue.bring_forward();
    wait_until("the first chunk applied, the second waiting", || {
        gate.gated.lock().unwrap().1 == 2 && cache.len() == applied + 1
    })
    .await;
    assert!(cache.all()[applied].more, "a chunk, not the last");
    let dead = &apps[2].1;
    rt.exit_container(dead, 9);
    assert!(p.dispatcher.queue.request(
        "c",
        crate::event::RelistSource::EventedPleg,
        None,
        Some(dead)
    ));
    wait_until("the death applied", || cache.len() == applied + 2).await;
    let early = copy(&cache.all()[applied + 1]);
    assert!(
        early.0.iter().any(|u| matches!(u,
            CacheUpdate::Container { status, .. } if &status.id == dead)),
        "{early:?}"
    );
    assert!(
        early.4,
        "applied with more: the relist is still half applied"
    );
    assert!(early.1.is_none(), "no global timestamp");
    wait_until("published", || {
        published
            .all()
            .iter()
            .flat_map(|p| p.0.iter())
            .any(|e| e.kind == EventKind::ContainerDied && &e.container_id == dead)
    })
    .await;
    gate.open.notify_one();
    wait_until("the last chunk", || {
        cache
            .all()
            .iter()
            .skip(applied + 2)
            .any(|a| !a.more && a.global_timestamp.is_some())
    })
    .await;
}
