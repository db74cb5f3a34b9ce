//! Deaths a batch reports from a prefetch before the pod's lists answer (`early`
//! module): handed over at once, never twice, never for a held pod, kept when the
//! lists fail, and not undone by a list read before the exit.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::tests::global;
use super::*;
use crate::event::{EventKind, LifecycleEvent, RelistSource};
use crate::testing::wait_until;
use plegd_runtime::{Container, ContainerState, RuntimeClient, RuntimeError};
use plegd_sim::{FakeRuntime, Intercept, Intercepted, Op};

/// What a batch handed over, in order: ("early" | "read", events as (kind, id), the
/// pods handed back held, the lists' error).
type Step = (&'static str, Vec<(EventKind, String)>, Vec<String>, bool);

fn step<T>(s: PodStep<T>) -> Step {
    let events = |out: &RelistOutput| {
        out.events
            .iter()
            .map(|e| (e.kind, e.container_id.clone()))
            .collect()
    };
    match s {
        PodStep::Early(out) => ("early", events(&out), out.held, false),
        PodStep::Read(_, out, error) => ("read", events(&out), out.held, error.is_some()),
    }
}

/// Pod `u1` with one running container `c`, its first relist done, behind `runtime`.
pub(super) async fn one_pod(
    rt: &FakeRuntime,
    runtime: Arc<dyn RuntimeClient>,
) -> (GenericPleg, String) {
    let sb = rt.run_pod("u1", "web", "ns");
    let c = rt.run_container(&sb, "app");
    let mut p = GenericPleg::new(runtime, 4);
    global(&mut p).await;
    (p, c)
}

/// A targeted relist of `u1` as a CRI event about `c` asks for it.
fn ask(c: &str) -> (String, RelistSource, Vec<String>) {
    (
        "u1".to_string(),
        RelistSource::EventedPleg,
        vec![c.to_string()],
    )
}

/// A batch of one targeted relist of `u1` that names `c`, with early deaths; `held`
/// as the dispatcher's; `meanwhile` runs beside it. What it handed over.
async fn batch(
    p: &mut GenericPleg,
    c: &str,
    held: &dyn Fn(&str) -> bool,
    meanwhile: impl std::future::Future<Output = ()>,
) -> Vec<Step> {
    let steps = Mutex::new(Vec::new());
    let run = p.relist_pods_each(vec![ask(c)], None, None, held, EarlyDeaths::On(None), |s| {
        steps.lock().unwrap().push(step(s));
        std::future::ready(())
    });
    tokio::join!(run, meanwhile);
    steps.into_inner().unwrap()
}

/// As [`batch`], with the pod's container lists held until the batch has handed
/// something over (checked to be an early output, the read not ended), then let go.
/// What it handed over, and the early outputs' events and cache updates.
async fn early_before_the_lists(
    p: &mut GenericPleg,
    rt: &FakeRuntime,
    c: &str,
) -> (Vec<Step>, Vec<LifecycleEvent>, Vec<CacheUpdate>) {
    rt.hold(Op::ListContainers);
    let steps = Mutex::new(Vec::new());
    let early = Mutex::new((Vec::new(), Vec::new()));
    let run = p.relist_pods_each(
        vec![ask(c)],
        None,
        None,
        &|_| false,
        EarlyDeaths::On(None),
        |s| {
            if let PodStep::Early(out) = &s {
                let mut early = early.lock().unwrap();
                early.0.extend(out.events.iter().cloned());
                early.1.extend(out.cache.iter().cloned());
            }
            steps.lock().unwrap().push(step(s));
            std::future::ready(())
        },
    );
    let release = async {
        wait_until("something handed over", || {
            !steps.lock().unwrap().is_empty()
        })
        .await;
        assert_eq!(
            steps.lock().unwrap()[0].0,
            "early",
            "before the pod's read ended"
        );
        rt.release(Op::ListContainers);
    };
    tokio::join!(run, release);
    let (events, cache) = early.into_inner().unwrap();
    (steps.into_inner().unwrap(), events, cache)
}

pub(super) fn died(c: &str) -> Vec<(EventKind, String)> {
    vec![(EventKind::ContainerDied, c.to_string())]
}

#[tokio::test]
async fn a_death_in_a_prefetch_is_handed_over_before_the_lists_answer() {
    let rt = FakeRuntime::new();
    let (mut p, c) = one_pod(&rt, Arc::new(rt.clone())).await;
    rt.exit_container(&c, 3);
    let (steps, seen, cache) = early_before_the_lists(&mut p, &rt, &c).await;
    let patched = cache.iter().any(|u| {
        matches!(u, CacheUpdate::Container { uid, status, .. }
            if uid == "u1" && status.id == c && status.state == ContainerState::Exited)
    });
    assert!(
        patched,
        "the cache gets the container's status with its death"
    );
    assert_eq!(
        steps,
        vec![
            ("early", died(&c), vec![], false),
            ("read", vec![], vec![], false)
        ],
        "one ContainerDied, before the lists answered; none after"
    );
    let exit = seen[0]
        .exit
        .as_ref()
        .expect("the exit from the status read");
    assert_eq!(exit.code, 3);
    assert_eq!(seen[0].container_name, "app");
    assert_eq!(seen[0].relist_source, RelistSource::EventedPleg);
    assert!(
        global(&mut p).await.events.is_empty(),
        "the next global relist finds the death already reported"
    );
}

#[tokio::test]
async fn a_pod_a_sync_takes_during_its_read_reports_no_death_early() {
    let rt = FakeRuntime::new();
    let (mut p, c) = one_pod(&rt, Arc::new(rt.clone())).await;
    rt.exit_container(&c, 1);
    rt.hold(Op::ListContainers);
    // Not held when the read is due; held from the next question on (a sync that
    // took the pod while it was read).
    let asked = AtomicUsize::new(0);
    let held = |_: &str| asked.fetch_add(1, Ordering::SeqCst) > 0;
    let release = async {
        wait_until("the early deaths asked whether the pod is held", || {
            asked.load(Ordering::SeqCst) >= 2
        })
        .await;
        rt.release(Op::ListContainers);
    };
    let steps = batch(&mut p, &c, &held, release).await;
    assert_eq!(steps, vec![("read", vec![], vec!["u1".to_string()], false)]);
    let kinds: Vec<_> = global(&mut p)
        .await
        .events
        .iter()
        .map(|e| (e.kind, e.container_id.clone()))
        .collect();
    assert_eq!(kinds, died(&c), "the death is found once the pod is free");
}

#[tokio::test]
async fn a_pod_whose_lists_fail_after_an_early_death_reports_it_once() {
    let rt = FakeRuntime::new();
    let (mut p, c) = one_pod(&rt, Arc::new(rt.clone())).await;
    rt.exit_container(&c, 1);
    rt.fail(Op::ListContainers, tonic::Code::Unavailable, Some(1));
    let steps = batch(&mut p, &c, &|_| false, async {}).await;
    let mut kinds: Vec<_> = steps.iter().map(|s| (s.0, s.1.clone(), s.3)).collect();
    kinds.sort_by_key(|k| k.0);
    assert_eq!(
        kinds,
        vec![("early", died(&c), false), ("read", vec![], true)],
        "the death verified by its status read is reported although the lists failed"
    );
    assert_eq!(p.early_pending(), 0, "nothing is left for a later commit");
    let next = global(&mut p).await;
    assert!(
        !next
            .events
            .iter()
            .any(|e| e.kind == EventKind::ContainerDied),
        "and not again: {:?}",
        next.events
    );
}

/// The fake runtime answers at once: the pod's lists and its prefetch end in the
/// same poll, so the read is committed before its early message is handled.
#[tokio::test]
async fn a_read_that_ends_with_its_prefetch_reports_the_death_once() {
    let rt = FakeRuntime::new();
    let (mut p, c) = one_pod(&rt, Arc::new(rt.clone())).await;
    rt.exit_container(&c, 1);
    let steps = batch(&mut p, &c, &|_| false, async {}).await;
    assert_eq!(steps, vec![("read", died(&c), vec![], false)]);
}

#[tokio::test]
async fn a_pod_awaiting_reinspection_reports_no_death_early() {
    let rt = FakeRuntime::new();
    let (mut p, c) = one_pod(&rt, Arc::new(rt.clone())).await;
    // A change whose status read fails: the pod keeps its record and awaits
    // reinspection.
    let sb = rt.sandboxes_of("u1").remove(0);
    rt.run_container(&sb, "side");
    rt.fail_pod_status("u1", true);
    assert_eq!(global(&mut p).await.status_errors, 1);
    assert!(p.needs_reinspection("u1"));
    rt.fail_pod_status("u1", false);
    rt.exit_container(&c, 1);
    rt.hold(Op::ListContainers);
    let statuses = rt.calls(Op::ContainerStatus);
    let release = async {
        wait_until("the prefetch answered", || {
            rt.calls(Op::ContainerStatus) > statuses
        })
        .await;
        rt.release(Op::ListContainers);
    };
    let steps = batch(&mut p, &c, &|_| false, release).await;
    assert_eq!(steps.len(), 1, "nothing early: {steps:?}");
    assert_eq!(steps[0].0, "read");
    assert!(steps[0].1.contains(&(EventKind::ContainerDied, c.clone())));
}

/// The fake runtime, whose ListContainers answers a list taken earlier (set by
/// [`Stale::keep`]): a list served before the container's exit, its status read after.
/// Once, or with `sticky` every time (a runtime gone wrong: e.g. the ID listed again,
/// running, under another sandbox, while ContainerStatus says exited).
#[derive(Clone)]
pub(super) struct Stale {
    inner: FakeRuntime,
    kept: Arc<Mutex<Option<Vec<Container>>>>,
    sticky: bool,
}

impl Stale {
    pub(super) fn new(rt: &FakeRuntime, sticky: bool) -> Stale {
        Stale {
            inner: rt.clone(),
            kept: Arc::default(),
            sticky,
        }
    }

    pub(super) async fn keep(&self, sandbox: &str) {
        let list = self.inner.list_containers(Some(sandbox)).await.unwrap();
        *self.kept.lock().unwrap() = Some(list);
    }
}

#[async_trait::async_trait]
impl Intercept for Stale {
    fn inner(&self) -> &FakeRuntime {
        &self.inner
    }

    async fn list_containers(&self, sb: Option<&str>) -> Result<Vec<Container>, RuntimeError> {
        let now = self.inner.list_containers(sb).await?;
        let mut kept = self.kept.lock().unwrap();
        let list = if self.sticky {
            kept.clone()
        } else {
            kept.take()
        };
        Ok(list.unwrap_or(now))
    }
}

#[tokio::test]
async fn a_list_read_before_the_exit_does_not_undo_an_early_death() {
    let rt = FakeRuntime::new();
    let stale = Stale::new(&rt, false);
    let (mut p, c) = one_pod(&rt, Arc::new(Intercepted(stale.clone()))).await;
    let sb = rt.sandboxes_of("u1").remove(0);
    stale.keep(&sb).await;
    rt.exit_container(&c, 1);
    let (steps, _, _) = early_before_the_lists(&mut p, &rt, &c).await;
    assert_eq!(
        steps,
        vec![
            ("early", died(&c), vec![], false),
            ("read", vec![], vec![], false)
        ],
        "the list that still says running brings no ContainerStarted"
    );
    assert_eq!(
        p.record("u1").map(|r| r.state_of(&c)),
        Some(super::record::PlegState::Exited)
    );
    assert!(
        global(&mut p).await.events.is_empty(),
        "the next global relist finds nothing new"
    );
}

/// The pod's list calls so far.
fn list_calls(rt: &FakeRuntime) -> u64 {
    rt.calls(Op::ListSandboxes) + rt.calls(Op::ListContainers)
}

#[tokio::test]
async fn a_status_that_may_report_a_death_is_read_before_the_lists() {
    let rt = FakeRuntime::new();
    let (mut p, c) = one_pod(&rt, Arc::new(rt.clone())).await;
    rt.exit_container(&c, 0);
    let (lists, statuses) = (list_calls(&rt), rt.calls(Op::ContainerStatus));
    rt.hold(Op::ContainerStatus);
    let steps = batch(&mut p, &c, &|_| false, async {
        wait_until("the prefetch in flight", || {
            rt.calls(Op::ContainerStatus) > statuses
        })
        .await;
        assert_eq!(list_calls(&rt), lists, "no list before the status answers");
        rt.release(Op::ContainerStatus);
    })
    .await;
    assert!(list_calls(&rt) > lists, "the lists once it has");
    // The lists answer in the poll the status does: the read is committed first.
    let events: Vec<_> = steps.into_iter().flat_map(|s| s.1).collect();
    assert_eq!(events, died(&c), "one ContainerDied");
}

#[tokio::test]
async fn a_status_that_cannot_report_a_death_goes_with_the_lists() {
    let rt = FakeRuntime::new();
    let (mut p, c) = one_pod(&rt, Arc::new(rt.clone())).await;
    rt.exit_container(&c, 0);
    global(&mut p).await;
    // The record has the exit: a status read of the container can report no death.
    let lists = list_calls(&rt);
    rt.hold(Op::ContainerStatus);
    let steps = batch(&mut p, &c, &|_| false, async {
        wait_until("the lists while the status is held", || {
            list_calls(&rt) > lists
        })
        .await;
        rt.release(Op::ContainerStatus);
    })
    .await;
    assert_eq!(steps, vec![("read", vec![], vec![], false)]);
}

#[tokio::test]
async fn with_pods_waiting_for_a_place_a_read_sends_its_status_with_the_lists() {
    let rt = FakeRuntime::new();
    let c1 = rt.run_container(&rt.run_pod("u1", "web", "ns"), "app");
    let c2 = rt.run_container(&rt.run_pod("u2", "db", "ns"), "app");
    // One read at a time: u2 waits while u1 is read.
    let mut p = GenericPleg::new(Arc::new(rt.clone()), 1);
    global(&mut p).await;
    rt.exit_container(&c1, 0);
    rt.exit_container(&c2, 0);
    let lists = list_calls(&rt);
    rt.hold(Op::ContainerStatus);
    let asks = vec![
        (
            "u1".to_string(),
            RelistSource::EventedPleg,
            vec![c1.clone()],
        ),
        (
            "u2".to_string(),
            RelistSource::EventedPleg,
            vec![c2.clone()],
        ),
    ];
    let events = Mutex::new(Vec::new());
    let run = p.relist_pods_each(asks, None, None, &|_| false, EarlyDeaths::On(None), |s| {
        events.lock().unwrap().extend(step(s).1);
        std::future::ready(())
    });
    tokio::join!(run, async {
        wait_until("u1's lists while its status is held", || {
            list_calls(&rt) > lists
        })
        .await;
        rt.release(Op::ContainerStatus);
    });
    let mut ids: Vec<String> = events
        .into_inner()
        .unwrap()
        .into_iter()
        .map(|(kind, id)| {
            assert_eq!(kind, EventKind::ContainerDied);
            id
        })
        .collect();
    ids.sort();
    let mut want = vec![c1, c2];
    want.sort();
    assert_eq!(ids, want, "one ContainerDied each");
}

#[tokio::test]
async fn a_status_that_says_running_waits_for_the_lists() {
    let rt = FakeRuntime::new();
    let (mut p, c) = one_pod(&rt, Arc::new(rt.clone())).await;
    let steps = batch(&mut p, &c, &|_| false, async {}).await;
    assert_eq!(steps, vec![("read", vec![], vec![], false)]);
}

/// The pod's lists were taken before the exit and answer in the same poll as the
/// prefetch that shows it: the read is committed first, then the death is published
/// early. The cache (plegd's, the status reads' `LastReads`) must not keep the
/// container's running status after that death.
#[actix_rt::test]
async fn a_list_taken_before_the_exit_leaves_no_running_status_in_the_cache() {
    use crate::cache::{ApplyRelist, CacheOwner};
    use actix::Actor;
    let (owner, cache) = CacheOwner::new(std::time::Duration::from_secs(60));
    let owner = owner.start();
    let rt = FakeRuntime::new();
    let stale = Stale::new(&rt, false);
    let sb = rt.run_pod("u1", "web", "ns");
    let c = rt.run_container(&sb, "app");
    let mut p = GenericPleg::new(Arc::new(Intercepted(stale.clone())), 4)
        .with_last_reads(Arc::new(cache.clone()));
    let apply = |out: RelistOutput| {
        let events = out
            .events
            .iter()
            .map(|e| (e.pod.uid.clone(), e.container_id.clone(), e.kind))
            .collect();
        owner.send(ApplyRelist {
            updates: out.cache,
            global_timestamp: None,
            held: Vec::new(),
            revision: 0,
            events,
            more: false,
        })
    };
    apply(global(&mut p).await).await.unwrap();
    stale.keep(&sb).await;
    rt.exit_container(&c, 1);
    let published = Mutex::new(Vec::new());
    p.relist_pods_each(
        vec![ask(&c)],
        None,
        None,
        &|_| false,
        EarlyDeaths::On(None),
        |s| {
            let out = match s {
                PodStep::Early(out) | PodStep::Read(_, out, _) => out,
            };
            published
                .lock()
                .unwrap()
                .extend(out.events.iter().map(|e| e.kind));
            let applied = apply(out);
            async move { applied.await.unwrap() }
        },
    )
    .await;
    assert_eq!(published.into_inner().unwrap(), [EventKind::ContainerDied]);
    let state_in_cache = || {
        let st = cache.get("u1").and_then(|pod| pod.status).unwrap();
        st.containers.into_iter().find(|x| x.id == c).unwrap().state
    };
    assert_eq!(state_in_cache(), ContainerState::Exited);
    let next = global(&mut p).await;
    assert!(next.events.is_empty(), "{:?}", next.events);
    apply(next).await.unwrap();
    assert_eq!(state_in_cache(), ContainerState::Exited);
}

/// Found by a randomized comparison of concurrencies: a batch asked to read the same
/// pod twice read it twice at once, both reads planned from the record as it was
/// before either, so the second commit reported again the death the first had
/// already put in the record (with early deaths: whichever came first).
#[tokio::test]
async fn a_pod_asked_twice_in_one_batch_reports_its_death_once() {
    let rt = FakeRuntime::new();
    let (mut p, c) = one_pod(&rt, Arc::new(rt.clone())).await;
    rt.exit_container(&c, 1);
    let steps = Mutex::new(Vec::new());
    p.relist_pods_each(
        vec![ask(&c), ask(&c)],
        None,
        None,
        &|_| false,
        EarlyDeaths::On(None),
        |s| {
            steps.lock().unwrap().push(step(s));
            std::future::ready(())
        },
    )
    .await;
    let deaths: Vec<_> = steps
        .into_inner()
        .unwrap()
        .into_iter()
        .flat_map(|s| s.1)
        .filter(|(k, _)| *k == EventKind::ContainerDied)
        .collect();
    assert_eq!(deaths, died(&c), "one ContainerDied, not one per read");
    assert_eq!(
        p.record("u1").map(|r| r.state_of(&c)),
        Some(super::record::PlegState::Exited)
    );
}

/// Found by a randomized comparison of concurrencies: whether a pod read again in the
/// same batch brought its dead container back to life depended on whether its first
/// read's early death was handled before that read's commit (which then forgot it)
/// or after (kept until the batch's end).
#[tokio::test]
async fn a_pod_read_again_in_the_batch_does_not_undo_its_early_death() {
    let rt = FakeRuntime::new();
    let stuck = Stale::new(&rt, true);
    let (mut p, c) = one_pod(&rt, Arc::new(Intercepted(stuck.clone()))).await;
    let sb = rt.sandboxes_of("u1").remove(0);
    stuck.keep(&sb).await;
    rt.exit_container(&c, 1);
    // The first read's lists wait: its death goes early, before its commit.
    rt.hold(Op::ListContainers);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let tx = Mutex::new(Some(tx));
    let steps = Mutex::new(Vec::new());
    let reads = AtomicUsize::new(0);
    let run = p.relist_pods_each(
        vec![ask(&c)],
        Some(&mut rx),
        None,
        &|_| false,
        EarlyDeaths::On(None),
        |s| {
            if let PodStep::Read(..) = &s {
                // Asked again once its read is handed over (a CRI event came meanwhile).
                let mut tx = tx.lock().unwrap();
                match reads.fetch_add(1, Ordering::SeqCst) {
                    0 => {
                        let again = ("u1".to_string(), RelistSource::EventedPleg, Vec::new());
                        tx.as_ref().unwrap().send(again).unwrap()
                    }
                    _ => drop(tx.take()),
                }
            }
            steps.lock().unwrap().push(step(s));
            std::future::ready(())
        },
    );
    let release = async {
        wait_until("the early death", || !steps.lock().unwrap().is_empty()).await;
        assert_eq!(steps.lock().unwrap()[0].0, "early");
        rt.release(Op::ListContainers);
    };
    tokio::join!(run, release);
    let events: Vec<_> = steps
        .into_inner()
        .unwrap()
        .into_iter()
        .flat_map(|s| s.1)
        .collect();
    assert_eq!(events, died(&c), "no ContainerStarted from the second read");
    assert_eq!(
        p.record("u1").map(|r| r.state_of(&c)),
        Some(super::record::PlegState::Exited)
    );
}

/// Holds the ContainerStatus calls of the containers in `slow` until `gate` closes.
#[derive(Clone)]
struct SlowStatus {
    inner: FakeRuntime,
    slow: Arc<Mutex<Vec<String>>>,
    gate: Arc<tokio::sync::Semaphore>,
}

#[async_trait::async_trait]
impl Intercept for SlowStatus {
    fn inner(&self) -> &FakeRuntime {
        &self.inner
    }

    async fn container_status(
        &self,
        id: &str,
    ) -> Result<plegd_runtime::ContainerStatus, RuntimeError> {
        let slow = self.slow.lock().unwrap().iter().any(|s| s == id);
        if slow {
            // Closed: let go.
            let _ = self.gate.acquire().await;
        }
        self.inner.container_status(id).await
    }
}

/// The pod's earlier exits, not settled yet, are read again with the read a new
/// death's hint asks for: the death is handed over without waiting for them, whether
/// that read sends the status first or (`other_pod` waiting for a place) all at once.
async fn a_death_before_the_unsettled_exits(other_pod: bool) {
    use super::status_tests::{pod_of_20, Node};
    let rt = FakeRuntime::new();
    let slow = SlowStatus {
        inner: rt.clone(),
        slow: Arc::default(),
        gate: Arc::new(tokio::sync::Semaphore::new(0)),
    };
    let settle = std::time::Duration::from_secs(3600);
    let mut n = Node::settling_behind(Arc::new(Intercepted(slow.clone())), settle);
    let (_, cs) = pod_of_20(&rt, &mut n).await;
    let mut asks = vec![(
        "u1".to_string(),
        RelistSource::EventedPleg,
        vec![cs[2].clone()],
    )];
    if other_pod {
        rt.run_container(&rt.run_pod("u2", "db", "ns"), "app");
        n.global().await;
        asks.push(("u2".to_string(), RelistSource::EventedPleg, vec![]));
    }
    rt.exit_container(&cs[0], 1);
    rt.exit_container(&cs[1], 1);
    assert_eq!(n.targeted("u1").await.events.len(), 2, "two deaths");
    slow.slow
        .lock()
        .unwrap()
        .extend([cs[0].clone(), cs[1].clone()]);
    rt.exit_container(&cs[2], 2);
    let before = rt.calls(Op::ContainerStatus);
    let steps = Mutex::new(Vec::new());
    let run = n
        .pleg
        .relist_pods_each(asks, None, None, &|_| false, EarlyDeaths::On(None), |s| {
            steps.lock().unwrap().push(step(s));
            std::future::ready(())
        });
    let release = async {
        wait_until("the death handed over", || {
            steps.lock().unwrap().iter().any(|s| s.0 == "early")
        })
        .await;
        slow.gate.close();
    };
    tokio::join!(run, release);
    let steps = steps.into_inner().unwrap();
    let early: Vec<_> = steps.iter().filter(|s| s.0 == "early").collect();
    assert_eq!(early, vec![&("early", died(&cs[2]), vec![], false)]);
    let read: Vec<_> = steps.iter().filter(|s| s.0 == "read").collect();
    let reads = if other_pod { 2 } else { 1 };
    assert_eq!(
        read,
        vec![&("read", vec![], vec![], false); reads],
        "no death twice"
    );
    assert_eq!(
        rt.calls(Op::ContainerStatus) - before,
        3,
        "the new exit and the two earlier ones, each read once"
    );
}

#[tokio::test]
async fn a_death_read_first_is_handed_over_before_the_pods_unsettled_exits_answer() {
    a_death_before_the_unsettled_exits(false).await;
}

#[tokio::test]
async fn a_death_read_with_the_lists_is_handed_over_before_the_pods_unsettled_exits_answer() {
    a_death_before_the_unsettled_exits(true).await;
}
