//! Generic PLEG semantics against the fake runtime, relist by relist.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::*;
use crate::event::{EventKind, EventKind::*, RelistSource};
use plegd_runtime::{ContainerState, ContainerStatus, RuntimeClient, RuntimeError, Sandbox};
use plegd_sim::{FakeRuntime, Intercept, Intercepted, Op};

fn pleg(rt: &FakeRuntime) -> GenericPleg {
    GenericPleg::new(Arc::new(rt.clone()), 4)
}

pub(super) async fn global(p: &mut GenericPleg) -> RelistOutput {
    p.relist(&RelistScope::Global, &|_| false).await.unwrap()
}

/// A targeted relist of `uid` as the CRI event stream asks for it.
pub(super) async fn try_targeted(
    p: &mut GenericPleg,
    uid: &str,
) -> Result<RelistOutput, RuntimeError> {
    p.relist(
        &RelistScope::Pod {
            uid: uid.into(),
            source: RelistSource::EventedPleg,
            prefetch: vec![],
        },
        &|_| false,
    )
    .await
}

async fn targeted(p: &mut GenericPleg, uid: &str) -> RelistOutput {
    try_targeted(p, uid).await.unwrap()
}

/// (pod uid, kind, id) triples, sorted for order-free comparison across pods.
fn evs(out: &RelistOutput) -> Vec<(String, EventKind, String)> {
    let mut v: Vec<_> = out
        .events
        .iter()
        .map(|e| (e.pod.uid.clone(), e.kind, e.container_id.clone()))
        .collect();
    v.sort_by(|a, b| (&a.0, a.1.as_str(), &a.2).cmp(&(&b.0, b.1.as_str(), &b.2)));
    v
}

fn ev(uid: &str, kind: EventKind, id: &str) -> (String, EventKind, String) {
    (uid.into(), kind, id.into())
}

#[tokio::test]
async fn first_relist_of_a_populated_node() {
    let rt = FakeRuntime::new();
    let sb1 = rt.run_pod("u1", "p1", "ns");
    let c1 = rt.run_container(&sb1, "app");
    let done = rt.run_container(&sb1, "init");
    rt.exit_container(&done, 0);
    let sb2 = rt.run_pod("u2", "p2", "ns");
    let created = rt.create_container(&sb2, "pending");
    let mut p = pleg(&rt);
    let out = global(&mut p).await;
    let mut want = vec![
        ev("u1", ContainerStarted, &sb1),
        ev("u1", ContainerStarted, &c1),
        // First seen already exited: ContainerDied only.
        ev("u1", ContainerDied, &done),
        ev("u2", ContainerStarted, &sb2),
        // created → unknown: ContainerChanged, which is never published.
    ];
    want.sort_by(|a, b| (&a.0, a.1.as_str(), &a.2).cmp(&(&b.0, b.1.as_str(), &b.2)));
    assert_eq!(evs(&out), want);
    assert!(out.events.iter().all(|e| e.container_id != created));
    assert!(out
        .events
        .iter()
        .all(|e| e.relist_source == RelistSource::Global));
    assert_eq!(out.cache.len(), 2);
    let e = out.events.iter().find(|e| e.pod.uid == "u1").unwrap();
    assert_eq!(
        (e.pod.name.as_str(), e.pod.namespace.as_str()),
        ("p1", "ns")
    );
    // Nothing changed: the next relist is silent and reads no status.
    let reads = rt.calls(Op::ContainerStatus);
    let out = global(&mut p).await;
    assert!(out.events.is_empty() && out.cache.is_empty());
    assert_eq!(rt.calls(Op::ContainerStatus), reads);
}

#[tokio::test]
async fn start_exit_restart_remove_sequence() {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "p1", "ns");
    let mut p = pleg(&rt);
    assert_eq!(
        evs(&global(&mut p).await),
        vec![ev("u1", ContainerStarted, &sb)]
    );

    let c = rt.create_container(&sb, "app");
    assert!(
        global(&mut p).await.events.is_empty(),
        "created is not published"
    );
    rt.start_container(&c);
    assert_eq!(
        evs(&global(&mut p).await),
        vec![ev("u1", ContainerStarted, &c)]
    );
    rt.exit_container(&c, 1);
    assert_eq!(
        evs(&global(&mut p).await),
        vec![ev("u1", ContainerDied, &c)]
    );
    // kubelet-style restart: a new container with the next attempt, old one removed.
    let c2 = rt.run_container(&sb, "app");
    rt.remove_container(&c);
    assert_eq!(
        evs(&global(&mut p).await),
        vec![
            ev("u1", ContainerRemoved, &c),
            ev("u1", ContainerStarted, &c2)
        ]
    );
    // A running container that vanishes: Died then Removed.
    rt.remove_container(&c2);
    let out = global(&mut p).await;
    let kinds: Vec<_> = out.events.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, vec![ContainerDied, ContainerRemoved]);
    assert!(out.events.iter().all(|e| e.container_id == c2));
}

#[tokio::test]
async fn sandbox_state_changes_and_pod_removal() {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "p1", "ns");
    let c = rt.run_container(&sb, "app");
    let mut p = pleg(&rt);
    global(&mut p).await;
    rt.stop_pod(&sb);
    assert_eq!(
        evs(&global(&mut p).await),
        vec![ev("u1", ContainerDied, &c), ev("u1", ContainerDied, &sb)]
    );
    rt.remove_pod(&sb);
    let out = global(&mut p).await;
    assert_eq!(
        evs(&out),
        vec![
            ev("u1", ContainerRemoved, &c),
            ev("u1", ContainerRemoved, &sb)
        ]
    );
    assert!(
        matches!(&out.cache[..], [CacheUpdate::Delete { uid, .. }] if uid == "u1"),
        "{:?}",
        out.cache
    );
    assert_eq!(p.pod_count(), 0);
}

#[tokio::test]
async fn pod_without_infra_container() {
    // CRI-O with drop_infra_ctr: the sandbox exists, no pause container is listed.
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "p1", "ns");
    let mut p = pleg(&rt);
    let out = global(&mut p).await;
    assert_eq!(evs(&out), vec![ev("u1", ContainerStarted, &sb)]);
    match &out.cache[0] {
        CacheUpdate::Set { status: Ok(s), .. } => {
            assert_eq!(s.sandboxes.len(), 1);
            assert!(s.containers.is_empty());
        }
        other => panic!("unexpected {other:?}"),
    }
    let c = rt.run_container(&sb, "app");
    assert_eq!(
        evs(&global(&mut p).await),
        vec![ev("u1", ContainerStarted, &c)]
    );
    rt.stop_pod(&sb);
    assert_eq!(
        evs(&global(&mut p).await),
        vec![ev("u1", ContainerDied, &c), ev("u1", ContainerDied, &sb)]
    );
}

#[tokio::test]
async fn status_error_keeps_old_record_and_reinspects() {
    let rt = FakeRuntime::new();
    let sb1 = rt.run_pod("u1", "p1", "ns");
    let c1 = rt.run_container(&sb1, "app");
    let sb2 = rt.run_pod("u2", "p2", "ns");
    let mut p = pleg(&rt);
    global(&mut p).await;

    // u1 changes but its status cannot be read; u2 changes too and must not be blocked.
    rt.exit_container(&c1, 2);
    let c2 = rt.run_container(&sb2, "app");
    rt.fail_pod_status("u1", true);
    let out = global(&mut p).await;
    assert_eq!(evs(&out), vec![ev("u2", ContainerStarted, &c2)]);
    assert_eq!(out.status_errors, 1);
    assert!(out.cache.iter().any(|u| matches!(u,
        CacheUpdate::Set { uid, status: Err(_), .. } if uid == "u1")));
    assert!(p.needs_reinspection("u1"));
    assert_eq!(
        p.record("u1").unwrap().state_of(&c1),
        record::PlegState::Running,
        "old record kept"
    );

    // Still failing: still nothing for u1.
    assert!(global(&mut p).await.events.is_empty());

    // Recovered: the change is detected now.
    rt.fail_pod_status("u1", false);
    let out = global(&mut p).await;
    assert_eq!(evs(&out), vec![ev("u1", ContainerDied, &c1)]);
    assert!(!p.needs_reinspection("u1"));
}

#[tokio::test]
async fn reinspection_without_change_emits_pod_sync() {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "p1", "ns");
    let c = rt.run_container(&sb, "app");
    let mut p = pleg(&rt);
    global(&mut p).await;
    rt.exit_container(&c, 1);
    rt.fail_pod_status("u1", true);
    assert!(global(&mut p).await.events.is_empty());
    // The container is restarted in place before the next relist could see the exit:
    // states are back to what the old record says.
    rt.set_container_state(&c, ContainerState::Running);
    rt.fail_pod_status("u1", false);
    let out = global(&mut p).await;
    assert_eq!(evs(&out), vec![ev("u1", PodSync, "")]);
    assert!(!p.needs_reinspection("u1"));
    assert!(global(&mut p).await.events.is_empty());
}

#[tokio::test]
async fn list_failure_changes_nothing() {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "p1", "ns");
    let mut p = pleg(&rt);
    rt.fail(Op::ListContainers, tonic::Code::Unavailable, Some(1));
    assert!(p.relist(&RelistScope::Global, &|_| false).await.is_err());
    assert_eq!(p.pod_count(), 0);
    assert_eq!(
        evs(&global(&mut p).await),
        vec![ev("u1", ContainerStarted, &sb)]
    );
}

#[tokio::test]
async fn targeted_relist_reads_only_that_pod() {
    let rt = FakeRuntime::new();
    let sb1 = rt.run_pod("u1", "p1", "ns");
    let c1 = rt.run_container(&sb1, "app");
    let sb2 = rt.run_pod("u2", "p2", "ns");
    let c2 = rt.run_container(&sb2, "app");
    let mut p = pleg(&rt);
    global(&mut p).await;
    rt.exit_container(&c1, 1);
    rt.exit_container(&c2, 1);
    let out = targeted(&mut p, "u1").await;
    assert_eq!(evs(&out), vec![ev("u1", ContainerDied, &c1)]);
    assert!(out
        .events
        .iter()
        .all(|e| e.relist_source == RelistSource::EventedPleg));
    // A pod already seen stopped yields no second event, but its status is re-read.
    let out = targeted(&mut p, "u1").await;
    assert!(out.events.is_empty());
    assert_eq!(out.cache.len(), 1);
    // The global relist finds only the other pod's change.
    assert_eq!(
        evs(&global(&mut p).await),
        vec![ev("u2", ContainerDied, &c2)]
    );
    // A pod that is gone and unknown: no-op.
    let out = targeted(&mut p, "nope").await;
    assert!(out.events.is_empty() && out.cache.is_empty());
    // A known pod that is gone: Removed, cache delete.
    rt.remove_pod(&sb1);
    let out = targeted(&mut p, "u1").await;
    assert_eq!(
        evs(&out),
        vec![
            ev("u1", ContainerDied, &sb1),
            ev("u1", ContainerRemoved, &c1),
            ev("u1", ContainerRemoved, &sb1)
        ]
    );
    assert!(
        matches!(&out.cache[..], [CacheUpdate::Delete { uid, .. }] if uid == "u1"),
        "{:?}",
        out.cache
    );
}

/// A runtime in front of the fake one that lies the way real ones do: it hides a
/// sandbox from lists, answers NotFound for some containers' status, and records the
/// filter of every ListPodSandbox and how many status calls were in flight at once.
#[derive(Clone, Default)]
struct Spy {
    inner: FakeRuntime,
    hidden_sandboxes: Arc<Mutex<HashSet<String>>>,
    gone_containers: Arc<Mutex<HashSet<String>>>,
    sandbox_lists: Arc<Mutex<Vec<Option<String>>>>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
}

impl Spy {
    fn new(inner: &FakeRuntime) -> Spy {
        Spy {
            inner: inner.clone(),
            ..Spy::default()
        }
    }

    fn hide_sandbox(&self, id: &str, hidden: bool) {
        let mut h = self.hidden_sandboxes.lock().unwrap();
        if hidden {
            h.insert(id.into());
        } else {
            h.remove(id);
        }
    }

    fn unfiltered_lists(&self) -> usize {
        self.sandbox_lists
            .lock()
            .unwrap()
            .iter()
            .filter(|f| f.is_none())
            .count()
    }

    async fn status_call<T>(&self, call: impl std::future::Future<Output = T>) -> T {
        let n = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(n, Ordering::SeqCst);
        let out = call.await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        out
    }
}

#[async_trait::async_trait]
impl Intercept for Spy {
    fn inner(&self) -> &FakeRuntime {
        &self.inner
    }
    async fn list_sandboxes(&self, id: Option<&str>) -> Result<Vec<Sandbox>, RuntimeError> {
        self.sandbox_lists
            .lock()
            .unwrap()
            .push(id.map(String::from));
        let hidden = self.hidden_sandboxes.lock().unwrap().clone();
        let mut all = self.inner.list_sandboxes(id).await?;
        all.retain(|s| !hidden.contains(&s.id));
        Ok(all)
    }
    async fn sandbox_status(&self, id: &str) -> Result<Sandbox, RuntimeError> {
        self.status_call(self.inner.sandbox_status(id)).await
    }
    async fn container_status(&self, id: &str) -> Result<ContainerStatus, RuntimeError> {
        if self.gone_containers.lock().unwrap().contains(id) {
            return Err(RuntimeError::Rpc {
                op: "ContainerStatus",
                code: tonic::Code::NotFound,
                message: format!("container {id} not found"),
            });
        }
        self.status_call(self.inner.container_status(id)).await
    }
}

fn spy_pleg(spy: &Spy, concurrency: usize) -> GenericPleg {
    GenericPleg::new(Arc::new(Intercepted(spy.clone())), concurrency)
}

/// A sandbox missing from one list made its still-running containers
/// publish ContainerDied + ContainerRemoved (then ContainerStarted on its return).
#[tokio::test]
async fn a_sandbox_missing_from_one_list_reports_only_the_sandbox() {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "web", "ns");
    let c = rt.run_container(&sb, "app");
    let spy = Spy::new(&rt);
    let mut p = spy_pleg(&spy, 4);
    global(&mut p).await;
    spy.hide_sandbox(&sb, true);
    for relist in 0..2 {
        let out = global(&mut p).await;
        let want = if relist == 0 {
            vec![
                ev("u1", ContainerDied, &sb),
                ev("u1", ContainerRemoved, &sb),
            ]
        } else {
            vec![]
        };
        assert_eq!(
            evs(&out),
            want,
            "relist {relist} while the sandbox is hidden"
        );
        let missing = targeted(&mut p, "u1").await;
        assert!(missing.events.is_empty(), "{:?}", evs(&missing));
    }
    spy.hide_sandbox(&sb, false);
    assert_eq!(
        evs(&global(&mut p).await),
        vec![ev("u1", ContainerStarted, &sb)]
    );
    assert!(p.record("u1").unwrap().containers.contains_key(&c));
}

/// One container answering NotFound to ContainerStatus failed the whole
/// pod's read, so a sibling's death was not published.
#[tokio::test]
async fn a_container_status_not_found_does_not_hide_its_siblings() {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "web", "ns");
    let gone = rt.run_container(&sb, "sidecar");
    let c = rt.run_container(&sb, "app");
    let spy = Spy::new(&rt);
    let mut p = spy_pleg(&spy, 4);
    global(&mut p).await;
    spy.gone_containers.lock().unwrap().insert(gone.clone());
    rt.exit_container(&c, 1);
    let out = global(&mut p).await;
    assert_eq!(evs(&out), vec![ev("u1", ContainerDied, &c)]);
    assert_eq!(out.status_errors, 0);
    let CacheUpdate::Set {
        status: Ok(status), ..
    } = &out.cache[0]
    else {
        panic!("a status, not an error: {:?}", out.cache);
    };
    assert!(status.containers.iter().all(|s| s.id != gone));
}

/// End to end through the diff: an unknown sandbox state is not a death.
#[tokio::test]
async fn an_unknown_sandbox_state_publishes_nothing() {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "web", "ns");
    let mut p = pleg(&rt);
    global(&mut p).await;
    rt.set_sandbox_state(&sb, plegd_runtime::SandboxState::Unknown);
    assert!(global(&mut p).await.events.is_empty());
}

/// A targeted relist listed every sandbox on the node.
#[tokio::test]
async fn a_targeted_relist_of_a_known_pod_lists_only_its_sandboxes() {
    let rt = FakeRuntime::new();
    for i in 0..20 {
        let sb = rt.run_pod(&format!("u{i}"), "web", "ns");
        rt.run_container(&sb, "app");
    }
    let spy = Spy::new(&rt);
    let mut p = spy_pleg(&spy, 4);
    global(&mut p).await;
    let before = spy.unfiltered_lists();
    let c = rt.containers_of(&rt.sandboxes_of("u3")[0])[0].id.clone();
    rt.exit_container(&c, 1);
    let out = targeted(&mut p, "u3").await;
    assert_eq!(evs(&out), vec![ev("u3", ContainerDied, &c)]);
    assert_eq!(spy.unfiltered_lists(), before, "no node-wide list");
    // A pod never seen can only be found in the whole list.
    let sb = rt.run_pod("new", "web", "ns");
    let out = targeted(&mut p, "new").await;
    assert_eq!(evs(&out), vec![ev("new", ContainerStarted, &sb)]);
    assert_eq!(spy.unfiltered_lists(), before + 1);
}

/// A pod's status reads were unbounded (all its containers at once).
#[tokio::test]
async fn status_reads_in_flight_are_bounded_per_relist() {
    let rt = FakeRuntime::new();
    for i in 0..4 {
        let sb = rt.run_pod(&format!("u{i}"), "web", "ns");
        for j in 0..10 {
            rt.run_container(&sb, &format!("c{j}"));
        }
    }
    rt.set_latency(Op::ContainerStatus, std::time::Duration::from_millis(5));
    let spy = Spy::new(&rt);
    let mut p = spy_pleg(&spy, 3);
    assert_eq!(global(&mut p).await.pods_inspected, 4);
    let max = spy.max_in_flight.load(Ordering::SeqCst);
    assert!((1..=3).contains(&max), "{max} status calls in flight");
}

/// An event's time was taken after the status reads, not when the
/// relist read the pod.
#[tokio::test]
async fn an_events_time_is_when_the_relist_read_the_pod() {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "web", "ns");
    rt.run_container(&sb, "app");
    rt.set_latency(Op::ContainerStatus, std::time::Duration::from_millis(300));
    let mut p = pleg(&rt);
    let before = std::time::SystemTime::now();
    let out = global(&mut p).await;
    let after = std::time::SystemTime::now();
    assert!(after.duration_since(before).unwrap() >= std::time::Duration::from_millis(300));
    for e in &out.events {
        let lag = e.time.duration_since(before).unwrap_or_default();
        assert!(
            lag < std::time::Duration::from_millis(300),
            "{lag:?} after the start"
        );
    }
    let CacheUpdate::Set { read_at, .. } = &out.cache[0] else {
        panic!("{:?}", out.cache)
    };
    assert!(out.events.iter().all(|e| e.time == *read_at));
}

/// Events carry what consumers need, from the relist's status read.
#[tokio::test]
async fn events_carry_names_attempts_images_and_how_containers_ended() {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "web", "ns");
    let app = rt.run_container(&sb, "app");
    let mut p = pleg(&rt);
    let out = global(&mut p).await;
    let by_id = |out: &RelistOutput, id: &str| {
        out.events
            .iter()
            .find(|e| e.container_id == id)
            .cloned()
            .unwrap_or_else(|| panic!("no event for {id}: {:?}", evs(out)))
    };
    let s = by_id(&out, &sb);
    assert!(s.sandbox && s.container_name.is_empty());
    assert_eq!(
        (s.attempt, s.image.as_deref(), s.exit.as_ref()),
        (Some(0), None, None)
    );
    let a = by_id(&out, &app);
    assert!(!a.sandbox);
    assert_eq!(a.container_name, "app");
    assert_eq!(a.attempt, Some(0));
    assert_eq!(a.image.as_deref(), Some("plegd-sim/app:1"));
    assert!(a.exit.is_none(), "a start has no exit");

    rt.oom_kill_container(&app);
    let died = by_id(&global(&mut p).await, &app);
    assert_eq!(died.kind, ContainerDied);
    let exit = died.exit.expect("a death says how");
    assert_eq!(exit.code, 137);
    assert_eq!(exit.reason.as_deref(), Some("OOMKilled"));
    assert_eq!(exit.message.as_deref(), Some("memory limit exceeded"));
    let (started, finished) = (exit.started_at.unwrap(), exit.finished_at.unwrap());
    assert!(started <= finished);

    // A restart is the next attempt; a plain exit reports Error without a message.
    let again = rt.run_container(&sb, "app");
    rt.exit_container(&again, 3);
    let out = global(&mut p).await;
    let d = by_id(&out, &again);
    assert_eq!(d.attempt, Some(1));
    let exit = d.exit.unwrap();
    assert_eq!(
        (exit.code, exit.reason.as_deref(), exit.message),
        (3, Some("Error"), None)
    );

    // Gone before it was read: its death says nothing it cannot know.
    let doomed = rt.run_container(&sb, "doomed");
    global(&mut p).await;
    rt.remove_container(&doomed);
    let out = global(&mut p).await;
    let died = out
        .events
        .iter()
        .find(|e| e.container_id == doomed && e.kind == ContainerDied)
        .unwrap();
    assert!(died.exit.is_none() && died.attempt.is_none() && died.image.is_none());
}

/// Memory after a churn: short-lived pods at 1,000 live ones double the
/// records' table once (a hash table that removes and inserts at over half its
/// capacity resizes), and it kept that room for good.
#[tokio::test]
async fn the_records_give_back_the_room_a_churn_doubled() {
    let rt = FakeRuntime::new();
    for i in 0..1000 {
        let sb = rt.run_pod(&format!("live-{i}"), "p", "ns");
        rt.run_container(&sb, "app");
    }
    let mut p = GenericPleg::new(Arc::new(rt.clone()), 8);
    global(&mut p).await;
    let before = p.records_capacity();
    let mut previous: Vec<String> = Vec::new();
    for b in 0..20 {
        let batch: Vec<String> = (0..250)
            .map(|i| rt.run_pod(&format!("churn-{b}-{i}"), "p", "ns"))
            .collect();
        global(&mut p).await;
        for sb in previous.drain(..) {
            rt.remove_pod(&sb);
        }
        previous = batch;
    }
    for sb in previous.drain(..) {
        rt.remove_pod(&sb);
    }
    global(&mut p).await;
    assert_eq!(p.pod_count(), 1000);
    assert!(
        p.records_capacity() <= before,
        "room for {} pods after the churn, {before} before",
        p.records_capacity()
    );
}

/// ContainerStatus answers Unknown for the containers in `unknown` (the runtime lost
/// track of them for a moment), whatever the lists say.
#[derive(Clone)]
struct Flicker {
    inner: FakeRuntime,
    unknown: Arc<Mutex<HashSet<String>>>,
}

#[async_trait::async_trait]
impl Intercept for Flicker {
    fn inner(&self) -> &FakeRuntime {
        &self.inner
    }
    async fn container_status(&self, id: &str) -> Result<ContainerStatus, RuntimeError> {
        let mut st = self.inner.container_status(id).await?;
        if self.unknown.lock().unwrap().contains(id) {
            st.state = ContainerState::Unknown;
        }
        Ok(st)
    }
}

/// Pod u1 with container `c` running, behind a [`Flicker`] that says `c` is unknown.
fn flickering_pod() -> (FakeRuntime, Flicker, String) {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "web", "ns");
    let c = rt.run_container(&sb, "app");
    let flicker = Flicker {
        inner: rt.clone(),
        unknown: Arc::default(),
    };
    flicker.unknown.lock().unwrap().insert(c.clone());
    (rt, flicker, c)
}

/// The state the last cache update of `uid` in `out` gives container `id`.
fn cached_state(out: &RelistOutput, uid: &str, id: &str) -> Option<ContainerState> {
    out.cache.iter().rev().find_map(|u| match u {
        CacheUpdate::Set {
            uid: u,
            status: Ok(s),
            ..
        } if u == uid => s.containers.iter().find(|c| c.id == id).map(|c| c.state),
        _ => None,
    })
}

/// The list says running, the status read just after it says unknown, and by the
/// next list the container runs again (its start's hint lost): the lists agree with
/// the record all along, yet the cache held the unknown read until the pod changed.
#[tokio::test]
async fn a_read_that_disagrees_with_the_lists_is_read_again_without_pod_sync() {
    let (_rt, flicker, c) = flickering_pod();
    let mut p = GenericPleg::new(Arc::new(Intercepted(flicker.clone())), 4);
    let first = global(&mut p).await;
    assert_eq!(
        cached_state(&first, "u1", &c),
        Some(ContainerState::Unknown)
    );
    assert!(p.needs_reread("u1"));

    // Still unknown to ContainerStatus: read again by every global relist, quietly.
    let again = global(&mut p).await;
    assert_eq!(again.pods_inspected, 1);
    assert!(again.events.is_empty(), "{:?}", again.events);
    assert_eq!(
        cached_state(&again, "u1", &c),
        Some(ContainerState::Unknown)
    );

    flicker.unknown.lock().unwrap().clear();
    let back = global(&mut p).await;
    assert!(back.events.is_empty(), "{:?}", back.events);
    assert_eq!(cached_state(&back, "u1", &c), Some(ContainerState::Running));
    assert!(!p.needs_reread("u1"));
    let settled = global(&mut p).await;
    assert_eq!(
        settled.pods_inspected, 0,
        "an agreeing read is not repeated"
    );
}

/// The same after a restart on a state dir: the restored pleg finds the disagreeing
/// read in the last reads (the restored cache) and reads the pod again.
#[tokio::test]
async fn a_restored_pleg_reads_again_a_pod_whose_last_read_disagreed() {
    struct Reads(HashMap<String, LastRead>);
    impl LastReads for Reads {
        fn last_read(&self, uid: &str) -> Option<LastRead> {
            self.0.get(uid).cloned()
        }
    }
    let (rt, flicker, c) = flickering_pod();
    let mut p = GenericPleg::new(Arc::new(Intercepted(flicker.clone())), 4);
    let first = global(&mut p).await;
    let Some(CacheUpdate::Set {
        status: Ok(status),
        read_at,
        ..
    }) = first.cache.into_iter().next()
    else {
        panic!("the first relist reads u1");
    };
    let reads = Reads(HashMap::from([(
        "u1".to_string(),
        LastRead { status, read_at },
    )]));
    flicker.unknown.lock().unwrap().clear();
    let mut restored = GenericPleg::new(Arc::new(rt.clone()), 4)
        .with_last_reads(Arc::new(reads))
        .restored(p.records().clone(), HashSet::new());
    assert!(restored.needs_reread("u1"));
    let next = global(&mut restored).await;
    assert!(next.events.is_empty(), "{:?}", next.events);
    assert_eq!(cached_state(&next, "u1", &c), Some(ContainerState::Running));
}
