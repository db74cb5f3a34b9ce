//! Deaths read beside a global relist or a batch (`beside` module): handed over before
//! the lists answer, never undone by them, never twice, never older than the pod's
//! events, and forgotten with the unit.

use std::sync::{Arc, Mutex};

use tokio::sync::mpsc::unbounded_channel;

use super::early_tests::{died, one_pod, Stale};
use super::tests::global;
use super::*;
use crate::event::{EventKind, RelistSource};
use crate::testing::wait_until;
use plegd_runtime::{ContainerState, RuntimeClient as _};
use plegd_sim::{FakeRuntime, Intercepted, Op};

/// What a global relist handed over, in order: ("early" | "chunk", events as (kind,
/// id)), and the early outputs' cache updates.
type Steps = (
    Vec<(&'static str, Vec<(EventKind, String)>)>,
    Vec<CacheUpdate>,
);

/// A global relist of `p` with its node's ListContainers held until it has handed
/// something over beside it (checked to be early), `asks` sent to it once it runs.
async fn relist_hearing(p: &mut GenericPleg, rt: &FakeRuntime, asks: Vec<BesideAsk>) -> Steps {
    rt.hold(Op::ListContainers);
    let (tx, mut rx) = unbounded_channel();
    let steps = Mutex::new((Vec::new(), Vec::new()));
    let lists = rt.calls(Op::ListContainers);
    let run = p.relist_global_hearing(&|_| false, Some(&mut rx), |step| {
        let mut steps = steps.lock().unwrap();
        let (what, out) = match step {
            GlobalStep::Early(out) => {
                steps.1.extend(out.cache.iter().cloned());
                ("early", out)
            }
            GlobalStep::Chunk { out, .. } => ("chunk", out),
        };
        let events = out
            .events
            .iter()
            .map(|e| (e.kind, e.container_id.clone()))
            .collect();
        steps.0.push((what, events));
        std::future::ready(())
    });
    let meanwhile = async {
        wait_until("the relist's lists asked", || {
            rt.calls(Op::ListContainers) > lists
        })
        .await;
        for ask in asks {
            tx.send(ask).unwrap();
        }
        wait_until("something handed over", || {
            !steps.lock().unwrap().0.is_empty()
        })
        .await;
        assert_eq!(
            steps.lock().unwrap().0[0].0,
            "early",
            "before the lists answered"
        );
        rt.release(Op::ListContainers);
    };
    let (result, ()) = tokio::join!(run, meanwhile);
    result.unwrap();
    steps.into_inner().unwrap()
}

fn ask(c: &str) -> BesideAsk {
    BesideAsk {
        uid: "u1".into(),
        source: RelistSource::EventedPleg,
        containers: vec![c.to_string()],
    }
}

#[tokio::test]
async fn a_death_read_beside_a_global_relist_is_handed_over_before_its_lists_answer() {
    let rt = FakeRuntime::new();
    let (mut p, c) = one_pod(&rt, Arc::new(rt.clone())).await;
    rt.exit_container(&c, 3);
    let (steps, cache) = relist_hearing(&mut p, &rt, vec![ask(&c), ask(&c)]).await;
    assert_eq!(
        steps,
        vec![("early", died(&c)), ("chunk", vec![])],
        "one ContainerDied before the lists answered (asked twice), none from them"
    );
    assert!(cache.iter().any(|u| matches!(u,
        CacheUpdate::Container { uid, status, .. }
            if uid == "u1" && status.id == c && status.exit_code == 3)));
    assert_eq!(p.early_pending(), 0, "forgotten with the relist");
    assert!(global(&mut p).await.events.is_empty());
}

#[tokio::test]
async fn a_list_read_before_the_exit_does_not_undo_a_death_read_beside() {
    let rt = FakeRuntime::new();
    let stale = Stale::new(&rt, false);
    let (mut p, c) = one_pod(&rt, Arc::new(Intercepted(stale.clone()))).await;
    let sb = rt.sandboxes_of("u1").remove(0);
    stale.keep(&sb).await;
    rt.exit_container(&c, 1);
    let (steps, _) = relist_hearing(&mut p, &rt, vec![ask(&c)]).await;
    assert_eq!(
        steps,
        vec![("early", died(&c)), ("chunk", vec![])],
        "the list that still says running brings no ContainerStarted"
    );
    assert_eq!(
        p.record("u1").map(|r| r.state_of(&c)),
        Some(super::record::PlegState::Exited)
    );
    assert!(global(&mut p).await.events.is_empty());
}

#[tokio::test]
async fn a_container_still_running_or_unknown_gives_nothing_early() {
    let rt = FakeRuntime::new();
    let (mut p, c) = one_pod(&rt, Arc::new(rt.clone())).await;
    // Exited, but not in the pod's record: its own relist reports it.
    let sb = rt.sandboxes_of("u1").remove(0);
    let new = rt.run_container(&sb, "new");
    rt.exit_container(&new, 1);
    let (tx, mut rx) = unbounded_channel();
    tx.send(ask(&c)).unwrap();
    tx.send(ask(&new)).unwrap();
    tx.send(ask("no-such-container")).unwrap();
    drop(tx);
    let statuses = rt.calls(Op::ContainerStatus);
    let steps = Mutex::new(Vec::new());
    rt.hold(Op::ListContainers);
    let run = p.relist_global_hearing(&|_| false, Some(&mut rx), |step| {
        steps.lock().unwrap().push(match step {
            GlobalStep::Early(out) => ("early", out.events.len()),
            GlobalStep::Chunk { out, .. } => ("chunk", out.events.len()),
        });
        std::future::ready(())
    });
    let release = async {
        wait_until("the three read beside", || {
            rt.calls(Op::ContainerStatus) >= statuses + 3
        })
        .await;
        rt.release(Op::ListContainers);
    };
    let (result, ()) = tokio::join!(run, release);
    assert_eq!(
        result.unwrap(),
        BesideCounts {
            asked: 3,
            answered: 3
        },
        "all read"
    );
    let steps = steps.into_inner().unwrap();
    assert!(
        !steps.iter().any(|s| s.0 == "early"),
        "nothing early: {steps:?}"
    );
    assert_eq!(
        rt.container(&c).map(|s| s.state),
        Some(ContainerState::Running)
    );
}

#[tokio::test]
async fn a_held_pod_reports_nothing_beside() {
    let rt = FakeRuntime::new();
    let (mut p, c) = one_pod(&rt, Arc::new(rt.clone())).await;
    rt.exit_container(&c, 1);
    let (tx, mut rx) = unbounded_channel();
    tx.send(ask(&c)).unwrap();
    drop(tx);
    let statuses = rt.calls(Op::ContainerStatus);
    rt.hold(Op::ListContainers);
    let early = Mutex::new(0);
    let run = p.relist_global_hearing(&|uid| uid == "u1", Some(&mut rx), |step| {
        if let GlobalStep::Early(out) = step {
            *early.lock().unwrap() += out.events.len();
        }
        std::future::ready(())
    });
    let release = async {
        wait_until("the read beside", || {
            rt.calls(Op::ContainerStatus) > statuses
        })
        .await;
        rt.release(Op::ListContainers);
    };
    let (result, ()) = tokio::join!(run, release);
    assert_eq!(
        result.unwrap(),
        BesideCounts {
            asked: 1,
            answered: 1
        },
        "read"
    );
    assert_eq!(*early.lock().unwrap(), 0);
    assert_eq!(
        p.record("u1").map(|r| r.state_of(&c)),
        Some(super::record::PlegState::Running),
        "the record of a held pod is left alone"
    );
}

/// A batch reading a pod whose prefetch showed its container still running is asked
/// (a later hint) to read that container again: the death goes out before the pod's
/// lists answer, and the read, when they do, reports nothing more.
#[tokio::test]
async fn a_death_read_beside_a_batch_is_handed_over_before_the_pods_lists_answer() {
    let rt = FakeRuntime::new();
    let (mut p, c) = one_pod(&rt, Arc::new(rt.clone())).await;
    rt.hold(Op::ListContainers);
    let statuses = rt.calls(Op::ContainerStatus);
    let (tx, mut rx) = unbounded_channel();
    let steps = Mutex::new(Vec::new());
    let asked = vec![("u1".to_string(), RelistSource::Nri, vec![c.clone()])];
    let run = p.relist_pods_each(
        asked,
        None,
        None,
        &|_| false,
        EarlyDeaths::On(Some(&mut rx)),
        |s| {
            let (what, out) = match s {
                PodStep::Early(out) => ("early", out),
                PodStep::Read(_, out, _) => ("read", out),
            };
            let events: Vec<_> = out
                .events
                .iter()
                .map(|e| (e.kind, e.container_id.clone(), e.relist_source))
                .collect();
            steps.lock().unwrap().push((what, events));
            std::future::ready(())
        },
    );
    let meanwhile = async {
        wait_until("the prefetch read, the container running", || {
            rt.calls(Op::ContainerStatus) > statuses
        })
        .await;
        rt.exit_container(&c, 2);
        tx.send(ask(&c)).unwrap();
        wait_until("something handed over", || {
            !steps.lock().unwrap().is_empty()
        })
        .await;
        rt.release(Op::ListContainers);
    };
    tokio::join!(run, meanwhile);
    assert_eq!(
        steps.into_inner().unwrap(),
        vec![
            (
                "early",
                vec![(
                    EventKind::ContainerDied,
                    c.clone(),
                    RelistSource::EventedPleg
                )]
            ),
            ("read", vec![])
        ]
    );
    assert!(global(&mut p).await.events.is_empty());
}

/// The fake runtime, whose ContainerStatus of one container waits until the test
/// opens the gate.
#[derive(Clone)]
struct GateOne {
    inner: FakeRuntime,
    gated: Arc<Mutex<Option<String>>>,
    /// The gated call was asked.
    reached: Arc<std::sync::atomic::AtomicBool>,
    open: Arc<tokio::sync::Notify>,
}

#[async_trait::async_trait]
impl plegd_sim::Intercept for GateOne {
    fn inner(&self) -> &FakeRuntime {
        &self.inner
    }

    async fn container_status(
        &self,
        id: &str,
    ) -> Result<plegd_runtime::ContainerStatus, plegd_runtime::RuntimeError> {
        let gated = self.gated.lock().unwrap().as_deref() == Some(id);
        if gated {
            self.reached
                .store(true, std::sync::atomic::Ordering::SeqCst);
            self.open.notified().await;
        }
        self.inner.container_status(id).await
    }
}

/// A pod the global relist reads for another change read its container's status
/// before that container died; the death, read beside, goes out first. The pod's
/// status the relist then commits says the container exited, not what it read.
#[tokio::test]
async fn a_status_read_before_a_death_read_beside_does_not_bring_it_back_in_the_cache() {
    let rt = FakeRuntime::new();
    let gate = GateOne {
        inner: rt.clone(),
        gated: Arc::default(),
        reached: Arc::default(),
        open: Arc::default(),
    };
    let (mut p, c) = one_pod(&rt, Arc::new(Intercepted(gate.clone()))).await;
    let sb = rt.sandboxes_of("u1").remove(0);
    let d = rt.run_container(&sb, "side");
    *gate.gated.lock().unwrap() = Some(d.clone());
    let statuses = rt.calls(Op::ContainerStatus);
    let (tx, mut rx) = unbounded_channel();
    let steps = Mutex::new(Vec::new());
    let run = p.relist_global_hearing(&|_| false, Some(&mut rx), |step| {
        steps.lock().unwrap().push(step);
        std::future::ready(())
    });
    let meanwhile = async {
        // The pod's read has c's status (running) and waits for d's.
        wait_until("c read, d asked", || {
            rt.calls(Op::ContainerStatus) > statuses
                && gate.reached.load(std::sync::atomic::Ordering::SeqCst)
        })
        .await;
        rt.exit_container(&c, 5);
        tx.send(ask(&c)).unwrap();
        wait_until("the death read beside", || {
            !steps.lock().unwrap().is_empty()
        })
        .await;
        gate.open.notify_one();
    };
    let (result, ()) = tokio::join!(run, meanwhile);
    assert_eq!(
        result.unwrap(),
        BesideCounts {
            asked: 1,
            answered: 1
        }
    );
    let steps = steps.into_inner().unwrap();
    let [GlobalStep::Early(early), GlobalStep::Chunk { out, last: true }] = &steps[..] else {
        panic!("an early death, then the chunk: {steps:?}");
    };
    assert_eq!(early.events.len(), 1);
    let kinds: Vec<_> = out
        .events
        .iter()
        .map(|e| (e.kind, e.container_id.clone()))
        .collect();
    assert_eq!(kinds, vec![(EventKind::ContainerStarted, d.clone())]);
    assert!(
        out.events[0].time >= early.events[0].time,
        "a pod's events never go back in time (its read began before the death's)"
    );
    let set = out.cache.iter().find_map(|u| match u {
        CacheUpdate::Set { status: Ok(st), .. } => Some(st),
        _ => None,
    });
    let c_state = set
        .and_then(|st| st.containers.iter().find(|x| x.id == c))
        .map(|x| (x.state, x.exit_code));
    assert_eq!(c_state, Some((ContainerState::Exited, 5)));
}

/// Lists that fail after a death was read beside: the death stands, once; the
/// relist changes nothing else, and the pod's own relist then finds nothing new.
#[tokio::test]
async fn a_death_read_beside_a_global_relist_whose_lists_fail_is_reported_once() {
    let rt = FakeRuntime::new();
    let (mut p, c) = one_pod(&rt, Arc::new(rt.clone())).await;
    rt.exit_container(&c, 1);
    rt.hold(Op::ListContainers);
    let (tx, mut rx) = unbounded_channel();
    let early = Mutex::new(0);
    let lists = rt.calls(Op::ListContainers);
    let run = p.relist_global_hearing(&|_| false, Some(&mut rx), |step| {
        if let GlobalStep::Early(out) = step {
            *early.lock().unwrap() += out.events.len();
        }
        std::future::ready(())
    });
    let meanwhile = async {
        wait_until("lists asked", || rt.calls(Op::ListContainers) > lists).await;
        tx.send(ask(&c)).unwrap();
        wait_until("the death read beside", || *early.lock().unwrap() == 1).await;
        rt.fail(Op::ListContainers, tonic::Code::Unavailable, Some(1));
        rt.release(Op::ListContainers);
    };
    let (result, ()) = tokio::join!(run, meanwhile);
    assert!(result.is_err());
    assert_eq!(p.early_pending(), 0);
    let next = super::tests::try_targeted(&mut p, "u1").await.unwrap();
    assert!(next.events.is_empty(), "{:?}", next.events);
    assert!(global(&mut p).await.events.is_empty());
}

/// What a batch hands over, in order: ("early" | "read", output).
type BatchSteps = Mutex<Vec<(&'static str, RelistOutput)>>;

/// A batch of `asked` with early deaths, the containers `asks` names read beside it;
/// each step into `steps`.
async fn batch_hearing(
    p: &mut GenericPleg,
    asked: Vec<(String, RelistSource, Vec<String>)>,
    asks: &mut tokio::sync::mpsc::UnboundedReceiver<BesideAsk>,
    steps: &BatchSteps,
) {
    p.relist_pods_each(
        asked,
        None,
        None,
        &|_| false,
        EarlyDeaths::On(Some(asks)),
        |s| {
            let step = match s {
                PodStep::Early(out) => ("early", out),
                PodStep::Read(_, out, _) => ("read", out),
            };
            steps.lock().unwrap().push(step);
            std::future::ready(())
        },
    )
    .await;
}

/// As [`a_status_read_before_a_death_read_beside_does_not_bring_it_back_in_the_cache`],
/// beside a batch: a pod's targeted read (for another change) read the
/// container's status before it died; the death, read beside, goes out first, and the
/// pod's status the read then commits says the container exited, with its events no
/// older than the death.
#[tokio::test]
async fn a_status_a_pods_read_took_before_a_death_read_beside_it_gives_way_to_the_death() {
    let rt = FakeRuntime::new();
    let gate = GateOne {
        inner: rt.clone(),
        gated: Arc::default(),
        reached: Arc::default(),
        open: Arc::default(),
    };
    let (mut p, c) = one_pod(&rt, Arc::new(Intercepted(gate.clone()))).await;
    let sb = rt.sandboxes_of("u1").remove(0);
    let d = rt.run_container(&sb, "side");
    *gate.gated.lock().unwrap() = Some(d.clone());
    let statuses = rt.calls(Op::ContainerStatus);
    let (tx, mut rx) = unbounded_channel();
    let steps = Mutex::new(Vec::new());
    // A hint naming no container (a sandbox's): the pod's read lists, then reads both
    // statuses.
    let asked = vec![("u1".to_string(), RelistSource::Nri, vec![])];
    let run = batch_hearing(&mut p, asked, &mut rx, &steps);
    let meanwhile = async {
        wait_until("c read, d asked", || {
            rt.calls(Op::ContainerStatus) > statuses
                && gate.reached.load(std::sync::atomic::Ordering::SeqCst)
        })
        .await;
        rt.exit_container(&c, 6);
        tx.send(ask(&c)).unwrap();
        wait_until("the death read beside", || {
            !steps.lock().unwrap().is_empty()
        })
        .await;
        gate.open.notify_one();
    };
    tokio::join!(run, meanwhile);
    let steps = steps.into_inner().unwrap();
    let [("early", early), ("read", read)] = &steps[..] else {
        panic!("an early death, then the pod's read: {steps:?}");
    };
    let kinds = |out: &RelistOutput| -> Vec<_> {
        out.events
            .iter()
            .map(|e| (e.kind, e.container_id.clone()))
            .collect()
    };
    assert_eq!(kinds(early), vec![(EventKind::ContainerDied, c.clone())]);
    assert_eq!(kinds(read), vec![(EventKind::ContainerStarted, d.clone())]);
    assert!(
        read.events[0].time >= early.events[0].time,
        "a pod's events never go back in time (its read began before the death's)"
    );
    let c_state = read
        .cache
        .iter()
        .find_map(|u| match u {
            CacheUpdate::Set { status: Ok(st), .. } => Some(st),
            _ => None,
        })
        .and_then(|st| st.containers.iter().find(|x| x.id == c))
        .map(|x| (x.state, x.exit_code));
    assert_eq!(c_state, Some((ContainerState::Exited, 6)));
    assert!(global(&mut p).await.events.is_empty());
}

/// The fake runtime, whose first ContainerStatus of each container named here (after
/// it is named) waits until the test opens its gate.
#[derive(Clone, Default)]
struct FirstReadGates {
    inner: FakeRuntime,
    gates: Arc<Mutex<std::collections::HashMap<String, Arc<tokio::sync::Notify>>>>,
    reached: Arc<Mutex<Vec<String>>>,
}

impl FirstReadGates {
    fn gate(&self, id: &str) -> Arc<tokio::sync::Notify> {
        let open = Arc::new(tokio::sync::Notify::new());
        self.gates.lock().unwrap().insert(id.into(), open.clone());
        open
    }

    fn reached(&self, id: &str) -> bool {
        self.reached.lock().unwrap().iter().any(|r| r == id)
    }
}

#[async_trait::async_trait]
impl plegd_sim::Intercept for FirstReadGates {
    fn inner(&self) -> &FakeRuntime {
        &self.inner
    }

    async fn container_status(
        &self,
        id: &str,
    ) -> Result<plegd_runtime::ContainerStatus, plegd_runtime::RuntimeError> {
        let gate = self.gates.lock().unwrap().remove(id);
        if let Some(open) = gate {
            self.reached.lock().unwrap().push(id.into());
            open.notified().await;
        }
        self.inner.container_status(id).await
    }
}

/// The other way round: a death read beside a batch by a call that began before a
/// pod's read, answered after that read committed, is no older than the read's
/// events (the batch still runs: another pod's read waits).
#[tokio::test]
async fn a_death_read_beside_answered_after_its_pods_read_is_no_older_than_that_reads_events() {
    let rt = FakeRuntime::new();
    let gates = FirstReadGates {
        inner: rt.clone(),
        ..FirstReadGates::default()
    };
    let (mut p, c) = one_pod(&rt, Arc::new(Intercepted(gates.clone()))).await;
    let sb2 = rt.run_pod("u2", "db", "ns");
    rt.run_container(&sb2, "app");
    global(&mut p).await;
    let d = rt.run_container(&rt.sandboxes_of("u1").remove(0), "side");
    let e = rt.run_container(&sb2, "side");
    let open_c = gates.gate(&c);
    let open_e = gates.gate(&e);
    rt.hold(Op::ListContainers);
    let lists = rt.calls(Op::ListContainers);
    let (tx, mut rx) = unbounded_channel();
    let steps = Mutex::new(Vec::new());
    let asked = vec![
        ("u1".to_string(), RelistSource::Nri, vec![]),
        ("u2".to_string(), RelistSource::Nri, vec![]),
    ];
    let run = batch_hearing(&mut p, asked, &mut rx, &steps);
    let meanwhile = async {
        wait_until("both pods' lists asked", || {
            rt.calls(Op::ListContainers) >= lists + 2
        })
        .await;
        // Asked while c still runs: the call begins now and waits at its gate.
        tx.send(ask(&c)).unwrap();
        wait_until("c's read beside asked", || gates.reached(&c)).await;
        rt.release(Op::ListContainers);
        wait_until("u1's read committed, u2's waits for e", || {
            gates.reached(&e) && !steps.lock().unwrap().is_empty()
        })
        .await;
        rt.exit_container(&c, 3);
        open_c.notify_one();
        wait_until("the death read beside", || steps.lock().unwrap().len() == 2).await;
        open_e.notify_one();
    };
    tokio::join!(run, meanwhile);
    let steps = steps.into_inner().unwrap();
    let kinds = |out: &RelistOutput| -> Vec<_> {
        out.events
            .iter()
            .map(|e| (e.kind, e.container_id.clone()))
            .collect()
    };
    let [("read", read), ("early", early), ("read", _)] = &steps[..] else {
        panic!("u1's read, the death, then u2's read: {steps:?}");
    };
    assert_eq!(kinds(read), vec![(EventKind::ContainerStarted, d.clone())]);
    assert_eq!(kinds(early), vec![(EventKind::ContainerDied, c.clone())]);
    assert!(
        early.events[0].time >= read.events[0].time,
        "a pod's events never go back in time (the death's call began before the read)"
    );
}

/// The containers a burst's hints name are read side by side, not one pair after
/// another: on a busy containerd each read takes tens of milliseconds.
#[tokio::test]
async fn the_reads_beside_a_global_relist_run_side_by_side() {
    let rt = FakeRuntime::new();
    let (mut p, c) = one_pod(&rt, Arc::new(rt.clone())).await;
    let sb = rt.sandboxes_of("u1").remove(0);
    let mut named = vec![c];
    named.extend((0..7).map(|i| rt.run_container(&sb, &format!("side-{i}"))));
    global(&mut p).await;
    rt.hold(Op::ListContainers);
    rt.hold(Op::ContainerStatus);
    let (statuses, lists) = (rt.calls(Op::ContainerStatus), rt.calls(Op::ListContainers));
    let (tx, mut rx) = unbounded_channel();
    let run = p.relist_global_hearing(&|_| false, Some(&mut rx), |_| std::future::ready(()));
    let meanwhile = async {
        wait_until("the relist's lists asked", || {
            rt.calls(Op::ListContainers) > lists
        })
        .await;
        tx.send(BesideAsk {
            uid: "u1".into(),
            source: RelistSource::EventedPleg,
            containers: named.clone(),
        })
        .unwrap();
        wait_until("all eight reads in flight at once", || {
            rt.calls(Op::ContainerStatus) >= statuses + 8
        })
        .await;
        rt.release(Op::ContainerStatus);
        rt.release(Op::ListContainers);
    };
    let (result, ()) = tokio::join!(run, meanwhile);
    assert_eq!(result.unwrap().asked, 8);
}
