//! A targeted relist's lists of a known pod, read at once: under faults (a list that
//! fails, a pod that goes away between the two lists, a filter that answers another
//! sandbox) it says what the lists said, and every change is published once.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use super::tests::{global, try_targeted as targeted};
use super::*;
use crate::event::{EventKind, EventKind::*, RelistSource};
use plegd_runtime::{Container, RuntimeClient, RuntimeError, Sandbox};
use plegd_sim::{FakeRuntime, Intercept, Intercepted, Op};

/// Far longer than any wait in these tests: a wait that reaches it is the failure.
const PATIENCE: Duration = Duration::from_secs(10);

/// (kind, id) pairs of one pod's events, sorted.
fn evs(out: &RelistOutput) -> Vec<(EventKind, String)> {
    sorted(
        out.events
            .iter()
            .map(|e| (e.kind, e.container_id.clone()))
            .collect(),
    )
}

fn sorted(mut v: Vec<(EventKind, String)>) -> Vec<(EventKind, String)> {
    v.sort_by(|a, b| (a.0.as_str(), &a.1).cmp(&(b.0.as_str(), &b.1)));
    v
}

/// Which list answers first, and what happens to the pod in between.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Script {
    /// Each list waits until the other is in flight too (`PATIENCE` at most), and
    /// counts whether it saw it.
    Rendezvous,
    /// ListContainers answers first; then the pod is removed; then ListPodSandbox.
    ContainersThenRemove,
    /// ListPodSandbox answers first; then the pod is removed; then ListContainers.
    SandboxesThenRemove,
    /// ListPodSandbox by one id answers every sandbox of that sandbox's pod.
    WideFilter,
}

/// A runtime in front of the fake one whose filtered lists follow a [`Script`].
#[derive(Clone)]
struct Lists {
    inner: FakeRuntime,
    script: Script,
    /// The first list has answered (or, in a rendezvous, is in flight).
    first: Arc<Notify>,
    /// Rendezvous: lists that found the other one in flight.
    met: Arc<Mutex<usize>>,
    in_flight: Arc<Mutex<HashSet<&'static str>>>,
}

impl Lists {
    fn new(inner: &FakeRuntime, script: Script) -> Lists {
        Lists {
            inner: inner.clone(),
            script,
            first: Arc::new(Notify::new()),
            met: Arc::default(),
            in_flight: Arc::default(),
        }
    }

    /// Waits until the other list is in flight as well.
    async fn rendezvous(&self, me: &'static str) {
        let seen = self.first.notified();
        tokio::pin!(seen);
        let other_there = {
            let mut f = self.in_flight.lock().unwrap();
            f.insert(me);
            f.len() == 2
        };
        if other_there {
            self.first.notify_one();
            *self.met.lock().unwrap() += 1;
        } else if tokio::time::timeout(PATIENCE, seen).await.is_ok() {
            *self.met.lock().unwrap() += 1;
        }
        self.in_flight.lock().unwrap().remove(me);
    }

    /// Waits until the other list has answered (`PATIENCE` at most: lists awaited one
    /// after the other never get there, and the test then fails on what they said).
    async fn wait_first(&self) {
        let _ = tokio::time::timeout(PATIENCE, self.first.notified()).await;
    }
}

#[async_trait::async_trait]
impl Intercept for Lists {
    fn inner(&self) -> &FakeRuntime {
        &self.inner
    }

    async fn list_sandboxes(&self, id: Option<&str>) -> Result<Vec<Sandbox>, RuntimeError> {
        let Some(id) = id else {
            return self.inner.list_sandboxes(None).await;
        };
        match self.script {
            Script::Rendezvous => self.rendezvous("sandboxes").await,
            Script::ContainersThenRemove => {
                self.wait_first().await;
                self.inner.remove_pod(id);
            }
            Script::SandboxesThenRemove => {
                let out = self.inner.list_sandboxes(Some(id)).await;
                self.inner.remove_pod(id);
                self.first.notify_one();
                return out;
            }
            Script::WideFilter => {
                let Some(uid) = self.inner.sandbox(id).map(|s| s.pod.uid) else {
                    return Ok(vec![]);
                };
                let all = self.inner.list_sandboxes(None).await?;
                return Ok(all.into_iter().filter(|s| s.pod.uid == uid).collect());
            }
        }
        self.inner.list_sandboxes(Some(id)).await
    }

    async fn list_containers(&self, sb: Option<&str>) -> Result<Vec<Container>, RuntimeError> {
        if sb.is_none() {
            return self.inner.list_containers(None).await;
        }
        match self.script {
            Script::Rendezvous => self.rendezvous("containers").await,
            Script::ContainersThenRemove => {
                let out = self.inner.list_containers(sb).await;
                self.first.notify_one();
                return out;
            }
            Script::SandboxesThenRemove => self.wait_first().await,
            Script::WideFilter => {}
        }
        self.inner.list_containers(sb).await
    }
}

fn pleg_over(lists: &Lists) -> GenericPleg {
    GenericPleg::new(Arc::new(Intercepted(lists.clone())), 4)
}

/// A known pod's ListPodSandbox and ListContainers were awaited one
/// after the other, two round trips before the status read.
#[tokio::test]
async fn a_known_pods_sandbox_and_container_lists_are_in_flight_together() {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "web", "ns");
    let c = rt.run_container(&sb, "app");
    let lists = Lists::new(&rt, Script::Rendezvous);
    let mut p = pleg_over(&lists);
    global(&mut p).await;
    rt.exit_container(&c, 1);
    let out = targeted(&mut p, "u1").await.unwrap();
    assert_eq!(evs(&out), vec![(ContainerDied, c)]);
    assert_eq!(
        *lists.met.lock().unwrap(),
        2,
        "each list saw the other in flight"
    );
}

/// Either list failing fails the pod's relist: nothing cached, nothing published,
/// the record kept; the next relist publishes the change once.
#[tokio::test]
async fn either_list_failing_changes_nothing() {
    for op in [Op::ListSandboxes, Op::ListContainers] {
        let rt = FakeRuntime::new();
        let sb = rt.run_pod("u1", "web", "ns");
        let c = rt.run_container(&sb, "app");
        let mut p = GenericPleg::new(Arc::new(rt.clone()), 4);
        global(&mut p).await;
        let before = p.record("u1").cloned();
        rt.exit_container(&c, 1);
        rt.fail(op, tonic::Code::Unavailable, Some(1));
        let err = targeted(&mut p, "u1").await.err();
        assert!(
            err.as_ref()
                .is_some_and(|e| e.code() == tonic::Code::Unavailable),
            "{op:?}: {err:?}"
        );
        assert_eq!(p.record("u1").cloned(), before, "{op:?}: record kept");
        assert!(!p.needs_reinspection("u1"), "{op:?}");
        let out = targeted(&mut p, "u1").await.unwrap();
        assert_eq!(evs(&out), vec![(ContainerDied, c.clone())], "{op:?}");
        assert!(targeted(&mut p, "u1").await.unwrap().events.is_empty());
    }
}

/// Both lists failing at once: one error, nothing changed.
#[tokio::test]
async fn both_lists_failing_at_once_change_nothing() {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "web", "ns");
    let c = rt.run_container(&sb, "app");
    let mut p = GenericPleg::new(Arc::new(rt.clone()), 4);
    global(&mut p).await;
    rt.exit_container(&c, 1);
    rt.fail(Op::ListSandboxes, tonic::Code::Unavailable, Some(1));
    rt.fail(Op::ListContainers, tonic::Code::DeadlineExceeded, Some(1));
    let err = targeted(&mut p, "u1").await.err().map(|e| e.code());
    assert!(
        matches!(
            err,
            Some(tonic::Code::Unavailable | tonic::Code::DeadlineExceeded)
        ),
        "{err:?}"
    );
    assert!(!p.needs_reinspection("u1"));
    // The other call may have been dropped unanswered: its fault is still armed.
    rt.clear_failure(Op::ListSandboxes);
    rt.clear_failure(Op::ListContainers);
    assert_eq!(
        evs(&targeted(&mut p, "u1").await.unwrap()),
        vec![(ContainerDied, c)]
    );
}

/// The pod is removed between the two lists, in either order: the relist says what
/// the lists said (the sandbox missing from its list keeps its containers attached),
/// and over it and the next one the pod's end is published exactly once.
#[tokio::test]
async fn a_pod_removed_between_the_two_lists_ends_once() {
    for script in [Script::ContainersThenRemove, Script::SandboxesThenRemove] {
        let rt = FakeRuntime::new();
        let sb = rt.run_pod("u1", "web", "ns");
        let c = rt.run_container(&sb, "app");
        let lists = Lists::new(&rt, script);
        let mut p = pleg_over(&lists);
        global(&mut p).await;
        let first = targeted(&mut p, "u1").await.unwrap();
        let first_evs = evs(&first);
        match script {
            // The sandbox is gone from its list, its container still listed (running):
            // only the sandbox ended; the container stays attached.
            Script::ContainersThenRemove => {
                assert_eq!(
                    first_evs,
                    sorted(vec![
                        (ContainerDied, sb.clone()),
                        (ContainerRemoved, sb.clone())
                    ])
                );
                assert!(p.record("u1").unwrap().containers.contains_key(&c));
            }
            // The sandbox listed, its container gone.
            _ => assert_eq!(
                first_evs,
                sorted(vec![
                    (ContainerDied, c.clone()),
                    (ContainerRemoved, c.clone())
                ])
            ),
        }
        let second = targeted(&mut p, "u1").await.unwrap();
        let mut all = first_evs;
        all.extend(evs(&second));
        let want = vec![
            (ContainerDied, c.clone()),
            (ContainerDied, sb.clone()),
            (ContainerRemoved, c.clone()),
            (ContainerRemoved, sb.clone()),
        ];
        assert_eq!(sorted(all), sorted(want), "each end once, over two relists");
        assert!(
            matches!(&second.cache[..], [CacheUpdate::Delete { uid, .. }] if uid == "u1"),
            "{:?}",
            second.cache
        );
        assert!(p.record("u1").is_none());
        assert!(targeted(&mut p, "u1").await.unwrap().events.is_empty());
    }
}

/// A sandbox the filter answers beside the one asked for (another sandbox of the
/// pod): its containers are listed too, as before the lists were read at once.
#[tokio::test]
async fn a_sandbox_answered_beside_the_one_asked_for_brings_its_containers() {
    let rt = FakeRuntime::new();
    let sb1 = rt.run_pod("u1", "web", "ns");
    rt.run_container(&sb1, "app");
    let lists = Lists::new(&rt, Script::WideFilter);
    let mut p = pleg_over(&lists);
    global(&mut p).await;
    let sb2 = rt.run_pod("u1", "web", "ns");
    let c2 = rt.run_container(&sb2, "app");
    let out = targeted(&mut p, "u1").await.unwrap();
    assert_eq!(
        evs(&out),
        sorted(vec![
            (ContainerStarted, c2.clone()),
            (ContainerStarted, sb2)
        ])
    );
    assert!(p.record("u1").unwrap().containers.contains_key(&c2));
}

/// The fake runtime, counting the whole-node sandbox lists in flight at once (each
/// takes a little while, as a real one of many sandboxes does).
#[derive(Clone)]
struct WholeNodeLists {
    inner: FakeRuntime,
    now: Arc<Mutex<(usize, usize)>>,
}

#[async_trait::async_trait]
impl Intercept for WholeNodeLists {
    fn inner(&self) -> &FakeRuntime {
        &self.inner
    }

    async fn list_sandboxes(&self, id: Option<&str>) -> Result<Vec<Sandbox>, RuntimeError> {
        if id.is_some() {
            return self.inner.list_sandboxes(id).await;
        }
        {
            let mut n = self.now.lock().unwrap();
            n.0 += 1;
            n.1 = n.1.max(n.0);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        let out = self.inner.list_sandboxes(None).await;
        self.now.lock().unwrap().0 -= 1;
        out
    }
}

/// Memory after a churn: a batch of pods plegd has not seen reads the
/// whole node's sandbox list for each, and read them all at once (`concurrency`):
/// the heap's peak grew with the node times the batch. At most
/// [`pod_read::WHOLE_NODE_LISTS`] are in flight now, and every pod is still found.
#[tokio::test]
async fn a_batch_of_new_pods_holds_few_whole_node_lists_at_once() {
    use super::pod_read::WHOLE_NODE_LISTS;
    const PODS: usize = 12;
    let rt = FakeRuntime::new();
    let spy = WholeNodeLists {
        inner: rt.clone(),
        now: Arc::default(),
    };
    let mut p = GenericPleg::new(Arc::new(Intercepted(spy.clone())), 8);
    let pods: Vec<(String, RelistSource, Vec<String>)> = (0..PODS)
        .map(|i| {
            let uid = format!("u{i}");
            let sb = rt.run_pod(&uid, "p", "ns");
            rt.run_container(&sb, "app");
            (uid, RelistSource::EventedPleg, Vec::new())
        })
        .collect();
    let (out, failed) = p.relist_pods(&pods, &|_| false).await;
    assert!(failed.is_empty(), "{failed:?}");
    let found: HashSet<&str> = out.events.iter().map(|e| e.pod.uid.as_str()).collect();
    assert_eq!(found.len(), PODS, "every new pod found");
    let most = spy.now.lock().unwrap().1;
    assert!(
        (1..=WHOLE_NODE_LISTS).contains(&most),
        "{most} whole-node lists at once"
    );
}
