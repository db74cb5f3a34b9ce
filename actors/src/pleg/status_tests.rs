//! Which status calls a relist makes: sandboxes from their list entries, running
//! containers' statuses reused from the last read; and that this changes nothing a
//! full read would have given.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::status::{LastRead, LastReads, EXIT_SETTLE};
use super::*;
use crate::event::{EventKind::*, LifecycleEvent, RelistSource};
use plegd_runtime::{ContainerState, ContainerStatus, RuntimeClient, RuntimeError, Sandbox};
use plegd_sim::{FakeRuntime, Op};
use rand::{Rng as _, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The cache as the CacheOwner keeps it (last good status, error of the last read,
/// when the last read began), applied by the test after each relist as the
/// dispatcher does.
#[derive(Default)]
pub(super) struct TestCache {
    pods: Mutex<HashMap<String, Entry>>,
    read_at: Mutex<HashMap<String, SystemTime>>,
}

/// The last good status, and the error of the last read if it failed.
type Entry = (Option<PodStatus>, Option<String>);

impl TestCache {
    pub(super) fn apply(&self, out: &RelistOutput) {
        let mut pods = self.pods.lock().unwrap();
        let mut read_at = self.read_at.lock().unwrap();
        for u in &out.cache {
            match u {
                CacheUpdate::Set {
                    uid,
                    status,
                    read_at: at,
                    ..
                } => {
                    read_at.insert(uid.clone(), *at);
                    let e = pods.entry(uid.clone()).or_default();
                    match status {
                        Ok(st) => *e = (Some(st.clone()), None),
                        Err(err) => e.1 = Some(err.clone()),
                    }
                }
                CacheUpdate::Delete { uid, .. } => {
                    pods.remove(uid);
                    read_at.remove(uid);
                }
                // As the CacheOwner: the container's status replaced, the pod's read
                // time kept.
                CacheUpdate::Container { uid, status, .. } => {
                    let st = pods.get_mut(uid).and_then(|e| e.0.as_mut());
                    if let Some(c) = st
                        .into_iter()
                        .flat_map(|st| st.containers.iter_mut())
                        .find(|c| c.id == status.id)
                    {
                        *c = status.clone();
                    }
                }
            }
        }
    }

    fn status(&self, uid: &str) -> Option<PodStatus> {
        self.pods.lock().unwrap().get(uid).and_then(|e| e.0.clone())
    }
}

impl LastReads for TestCache {
    fn last_read(&self, uid: &str) -> Option<LastRead> {
        let pods = self.pods.lock().unwrap();
        let (status, error) = pods.get(uid)?;
        if error.is_some() {
            return None;
        }
        Some(LastRead {
            status: status.clone()?,
            read_at: *self.read_at.lock().unwrap().get(uid)?,
        })
    }
}

/// A plegd's PLEG with its cache.
pub(super) struct Node {
    pub(super) pleg: GenericPleg,
    cache: Arc<TestCache>,
}

impl Node {
    /// Reusing statuses, or reading every one (the last reads then only name the
    /// containers gone before a read, as when reusing).
    fn new(rt: &FakeRuntime, reuse: bool) -> Node {
        let cache = Arc::new(TestCache::default());
        let mut pleg = GenericPleg::new(Arc::new(rt.clone()), 4).with_last_reads(cache.clone());
        if !reuse {
            pleg = pleg.reading_every_status();
        }
        Node { pleg, cache }
    }

    /// Reusing statuses, an exit's once `settle` after it.
    fn settling(rt: &FakeRuntime, settle: Duration) -> Node {
        Node::settling_behind(Arc::new(rt.clone()), settle)
    }

    /// As [`Node::settling`], reading `runtime`.
    pub(super) fn settling_behind(runtime: Arc<dyn RuntimeClient>, settle: Duration) -> Node {
        let cache = Arc::new(TestCache::default());
        let pleg = GenericPleg::new(runtime, 4)
            .with_last_reads(cache.clone())
            .with_exit_settle(settle);
        Node { pleg, cache }
    }

    async fn relist(&mut self, scope: &RelistScope) -> RelistOutput {
        let out = self.pleg.relist(scope, &|_| false).await.unwrap();
        self.cache.apply(&out);
        out
    }

    pub(super) async fn global(&mut self) -> RelistOutput {
        self.relist(&RelistScope::Global).await
    }

    pub(super) async fn targeted(&mut self, uid: &str) -> RelistOutput {
        self.relist(&RelistScope::Pod {
            uid: uid.into(),
            source: RelistSource::EventedPleg,
            prefetch: vec![],
        })
        .await
    }
}

/// (PodSandboxStatus, ContainerStatus) calls made by `f`.
async fn calls_of<F: std::future::Future<Output = RelistOutput>>(
    rt: &FakeRuntime,
    f: F,
) -> ((u64, u64), RelistOutput) {
    let before = (rt.calls(Op::SandboxStatus), rt.calls(Op::ContainerStatus));
    let out = f.await;
    let after = (rt.calls(Op::SandboxStatus), rt.calls(Op::ContainerStatus));
    ((after.0 - before.0, after.1 - before.1), out)
}

/// A pod of 20 running containers, seen by a node's first relist.
pub(super) async fn pod_of_20(rt: &FakeRuntime, n: &mut Node) -> (String, Vec<String>) {
    let sb = rt.run_pod("u1", "p1", "ns");
    let cs: Vec<String> = (0..20)
        .map(|i| rt.run_container(&sb, &format!("c{i}")))
        .collect();
    let ((sandbox_reads, container_reads), _) = calls_of(rt, n.global()).await;
    assert_eq!((sandbox_reads, container_reads), (0, 20), "first relist");
    (sb, cs)
}

#[tokio::test]
async fn one_exit_among_20_running_containers_reads_one_status() {
    let rt = FakeRuntime::new();
    let mut n = Node::new(&rt, true);
    let (sb, cs) = pod_of_20(&rt, &mut n).await;
    rt.oom_kill_container(&cs[7]);
    let (calls, out) = calls_of(&rt, n.targeted("u1")).await;
    assert_eq!(calls, (0, 1), "(PodSandboxStatus, ContainerStatus)");
    let died: Vec<&LifecycleEvent> = out.events.iter().collect();
    assert_eq!(died.len(), 1);
    assert_eq!(
        (died[0].kind, died[0].container_id.as_str()),
        (ContainerDied, cs[7].as_str())
    );
    let exit = died[0].exit.as_ref().unwrap();
    assert_eq!(
        (exit.code, exit.reason.as_deref()),
        (137, Some("OOMKilled"))
    );
    // The cache holds what full reads give: the runtime's own statuses, the sandbox
    // as PodSandboxStatus reports it.
    let st = n.cache.status("u1").unwrap();
    assert_eq!(st.sandboxes, vec![rt.sandbox(&sb).unwrap()]);
    let mut want: Vec<_> = cs.iter().map(|c| rt.container(c).unwrap()).collect();
    want.sort_by(|a, b| a.id.cmp(&b.id));
    assert_eq!(st.containers, want);
}

#[tokio::test]
async fn without_last_reads_every_container_is_read() {
    let rt = FakeRuntime::new();
    let mut n = Node::new(&rt, false);
    let (_, cs) = pod_of_20(&rt, &mut n).await;
    rt.exit_container(&cs[0], 1);
    let (calls, _) = calls_of(&rt, n.targeted("u1")).await;
    assert_eq!(calls, (0, 20));
    let (calls, _) = calls_of(&rt, n.global()).await;
    assert_eq!(calls, (0, 0), "nothing changed: nothing read");
}

/// A container gone before a relist read it: its ContainerDied and ContainerRemoved
/// name it, with its attempt and image, as the pod's last read showed them; its
/// death has no exit (no read saw one).
#[tokio::test]
async fn a_container_gone_before_it_was_read_is_named_from_the_last_read() {
    let rt = FakeRuntime::new();
    let mut n = Node::new(&rt, true);
    let sb = rt.run_pod("u1", "web", "ns");
    let (app, side) = (rt.run_container(&sb, "app"), rt.run_container(&sb, "side"));
    n.global().await;
    rt.remove_container(&app);
    rt.exit_container(&side, 2);
    let out = n.global().await;
    let of = |out: &RelistOutput, id: &str| -> Vec<LifecycleEvent> {
        out.events
            .iter()
            .filter(|e| e.container_id == id)
            .cloned()
            .collect()
    };
    let gone = of(&out, &app);
    let kinds: Vec<_> = gone.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [ContainerDied, ContainerRemoved], "{:?}", out.events);
    for e in &gone {
        assert_eq!(e.container_name, "app", "{e:?}");
        assert_eq!(e.attempt, Some(0), "{e:?}");
        assert_eq!(e.image.as_deref(), Some("plegd-sim/app:1"), "{e:?}");
        assert!(e.exit.is_none(), "no read saw how it ended: {e:?}");
        assert!(!e.sandbox);
    }
    let died = of(&out, &side);
    assert_eq!(died.len(), 1);
    assert_eq!(
        died[0].exit.as_ref().map(|x| x.code),
        Some(2),
        "this read's"
    );

    rt.remove_container(&side);
    let out = n.targeted("u1").await;
    let removed = of(&out, &side);
    assert_eq!(removed.len(), 1, "{:?}", out.events);
    assert_eq!(removed[0].kind, ContainerRemoved);
    assert_eq!(removed[0].container_name, "side");
    assert_eq!(removed[0].image.as_deref(), Some("plegd-sim/side:1"));
}

#[tokio::test]
async fn restarted_and_exited_containers_are_read_again() {
    let rt = FakeRuntime::new();
    let mut n = Node::new(&rt, true);
    let (sb, cs) = pod_of_20(&rt, &mut n).await;
    // c3 exits and is restarted (a new container, attempt 1); c5 exits.
    rt.exit_container(&cs[3], 1);
    let again = rt.run_container(&sb, "c3");
    rt.exit_container(&cs[5], 0);
    let (calls, out) = calls_of(&rt, n.targeted("u1")).await;
    assert_eq!(calls, (0, 3), "the two exited and the new one");
    assert!(out
        .events
        .iter()
        .any(|e| e.kind == ContainerStarted && e.container_id == again && e.attempt == Some(1)));
    // Exited containers are read at every relist of their pod until their status has
    // settled (EXIT_SETTLE after the exit): containerd may give the reason after the
    // exit.
    rt.oom_kill_container(&cs[9]);
    let (calls, _) = calls_of(&rt, n.targeted("u1")).await;
    assert_eq!(calls, (0, 3), "c3 and c5 still exited, c9 exited now");
    // A container listed Created is read too; once running, its status is reused.
    let created = rt.create_container(&sb, "late");
    let (calls, _) = calls_of(&rt, n.targeted("u1")).await;
    assert_eq!(calls, (0, 4));
    rt.start_container(&created);
    let (calls, _) = calls_of(&rt, n.targeted("u1")).await;
    assert_eq!(calls, (0, 4), "running now, but the cache says created");
    let (calls, _) = calls_of(&rt, n.targeted("u1")).await;
    assert_eq!(calls, (0, 3));
    let st = n.cache.status("u1").unwrap();
    assert_eq!(
        st.containers
            .iter()
            .find(|c| c.id == created)
            .unwrap()
            .state,
        ContainerState::Running
    );
}

/// An exit whose status has settled is not read again. Before, each exited
/// container (a completed init or job container) cost a ContainerStatus at every read
/// of its pod: every event in the pod, and a second round trip after the lists.
#[tokio::test]
async fn a_settled_exit_is_reused_and_an_unsettled_one_read() {
    // Settled at once: the read after the exit began after its finished_at.
    let rt = FakeRuntime::new();
    let mut n = Node::settling(&rt, Duration::ZERO);
    let (_, cs) = pod_of_20(&rt, &mut n).await;
    rt.exit_container(&cs[0], 3);
    let (calls, out) = calls_of(&rt, n.targeted("u1")).await;
    assert_eq!(calls, (0, 1), "the exit is read");
    assert_eq!(out.events.len(), 1);
    for _ in 0..3 {
        let (calls, _) = calls_of(&rt, n.targeted("u1")).await;
        assert_eq!(calls, (0, 0), "settled: reused");
    }
    // Another state in the list than in the settled read: read again.
    rt.set_container_state(&cs[0], ContainerState::Unknown);
    let (calls, _) = calls_of(&rt, n.targeted("u1")).await;
    assert_eq!(calls, (0, 1));
    let st = n.cache.status("u1").unwrap();
    let c0 = st.containers.iter().find(|c| c.id == cs[0]).unwrap();
    assert_eq!((c0.state, c0.exit_code), (ContainerState::Unknown, 3));

    // Not settled within the test: read at every relist of its pod.
    let rt = FakeRuntime::new();
    let mut n = Node::settling(&rt, Duration::from_secs(3600));
    let (_, cs) = pod_of_20(&rt, &mut n).await;
    rt.exit_container(&cs[0], 3);
    for _ in 0..3 {
        let (calls, _) = calls_of(&rt, n.targeted("u1")).await;
        assert_eq!(calls, (0, 1), "unsettled: read");
    }
}

/// A targeted relist calls ContainerStatus of the pod's unsettled
/// exits together with its lists (they would be read after them anyway): with the
/// stopped container's prefetch, the relist is one round trip however many earlier
/// exits the pod has.
#[tokio::test]
async fn a_targeted_relist_reads_unsettled_exits_with_the_lists() {
    let rt = FakeRuntime::new();
    let mut n = Node::settling(&rt, Duration::from_secs(3600));
    let (_, cs) = pod_of_20(&rt, &mut n).await;
    rt.exit_container(&cs[0], 1);
    rt.exit_container(&cs[1], 1);
    n.targeted("u1").await;
    rt.exit_container(&cs[2], 2);
    let before = rt.calls(Op::ContainerStatus);
    rt.hold(Op::ListContainers);
    let release = async {
        crate::testing::wait_until("three statuses asked while ListContainers waits", || {
            rt.calls(Op::ContainerStatus) == before + 3
        })
        .await;
        rt.release(Op::ListContainers);
    };
    let scope = RelistScope::Pod {
        uid: "u1".into(),
        source: RelistSource::EventedPleg,
        prefetch: vec![cs[2].clone()],
    };
    let ((calls, out), ()) = tokio::join!(calls_of(&rt, n.relist(&scope)), release);
    assert_eq!(calls, (0, 3), "each read once");
    assert_eq!(out.prefetch.used, 3);
    let died: Vec<_> = out
        .events
        .iter()
        .map(|e| (e.kind, &e.container_id))
        .collect();
    assert_eq!(died, vec![(ContainerDied, &cs[2])]);
    let exit = out.events[0].exit.as_ref().unwrap();
    assert_eq!(exit.code, 2);
}

#[tokio::test]
async fn after_a_failed_read_the_whole_pod_is_read() {
    let rt = FakeRuntime::new();
    let mut n = Node::new(&rt, true);
    let (_, cs) = pod_of_20(&rt, &mut n).await;
    rt.exit_container(&cs[0], 1);
    rt.fail_pod_status("u1", true);
    let out = n.targeted("u1").await;
    assert_eq!(out.status_errors, 1);
    assert!(n.pleg.needs_reinspection("u1"));
    rt.fail_pod_status("u1", false);
    let (calls, out) = calls_of(&rt, n.targeted("u1")).await;
    assert_eq!(calls, (0, 20), "the cache holds an error: nothing reused");
    assert_eq!(out.events.len(), 1);
    assert_eq!(out.events[0].kind, ContainerDied);
    assert!(!n.pleg.needs_reinspection("u1"));
    // Good again: the 19 running ones are reused.
    let (calls, _) = calls_of(&rt, n.targeted("u1")).await;
    assert_eq!(calls, (0, 1));
}

/// A pod whose sandbox answers no PodSandboxStatus is still read: its sandbox comes
/// from the list (before, the failed sandbox read failed the pod's read).
#[tokio::test]
async fn a_sandbox_is_never_read_with_pod_sandbox_status() {
    let rt = FakeRuntime::new();
    let mut n = Node::new(&rt, true);
    let sb = rt.run_pod_with_labels("u1", "p1", "ns", [("app".into(), "web".into())].into());
    rt.fail(Op::SandboxStatus, tonic::Code::Unavailable, None);
    let out = n.global().await;
    assert_eq!(out.status_errors, 0);
    assert_eq!(
        n.cache.status("u1").unwrap().sandboxes,
        vec![rt.sandbox(&sb).unwrap()]
    );
    rt.stop_pod(&sb);
    let out = n.targeted("u1").await;
    assert_eq!(out.status_errors, 0);
    assert_eq!(out.events.len(), 1);
    assert_eq!(out.events[0].kind, ContainerDied);
    assert_eq!(rt.calls(Op::SandboxStatus), 0);
}

/// A seeded generator's draw below `n` (0 when `n` is 0: an index into a list that
/// may be empty).
pub(super) trait Below {
    fn below(&mut self, n: usize) -> usize;
}

impl Below for ChaCha8Rng {
    fn below(&mut self, n: usize) -> usize {
        self.random_range(0..n.max(1))
    }
}

/// What a relist gave, without the read times (the two nodes read one after the other).
pub(super) fn comparable(out: &RelistOutput) -> (Vec<String>, Vec<String>) {
    let cache = out
        .cache
        .iter()
        .map(|u| match u {
            CacheUpdate::Set { uid, status, .. } => format!("set {uid} {status:?}"),
            CacheUpdate::Delete { uid, .. } => format!("delete {uid}"),
            CacheUpdate::Container { uid, status, .. } => format!("container {uid} {status:?}"),
        })
        .collect();
    let events = out
        .events
        .iter()
        .map(|e| {
            let mut e = e.clone();
            e.time = std::time::SystemTime::UNIX_EPOCH;
            format!("{e:?}")
        })
        .collect();
    (cache, events)
}

/// Random starts, exits, OOM kills, restarts, removals, pod stops and removals, each
/// step followed by the same relist (global, or targeted at a random pod) on a node
/// that reuses statuses and on one that reads everything: same cache updates, same
/// events, same cache, every step; and the reusing node made fewer calls.
#[tokio::test]
async fn reusing_statuses_gives_what_full_reads_give() {
    for seed in 1..=12u64 {
        let rt = FakeRuntime::new();
        // Odd seeds: exits settle at once, so their statuses are reused too.
        let settle = if seed % 2 == 1 {
            Duration::ZERO
        } else {
            EXIT_SETTLE
        };
        let mut reuse = Node::settling(&rt, settle);
        let mut full = Node::new(&rt, false);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut pods: Vec<(String, String)> = Vec::new();
        let (mut calls_reuse, mut calls_full) = (0, 0);
        for step in 0..150 {
            for _ in 0..1 + rng.below(3) {
                let containers: Vec<_> = pods
                    .iter()
                    .flat_map(|(_, sb)| rt.containers_of(sb))
                    .collect();
                let pick =
                    |rng: &mut ChaCha8Rng| containers.get(rng.below(containers.len())).cloned();
                match rng.below(10) {
                    0 => {
                        let uid = format!("u{step}");
                        let sb = rt.run_pod(&uid, &uid, "ns");
                        pods.push((uid, sb));
                    }
                    1 | 2 => {
                        if let Some((_, sb)) = pods.get(rng.below(pods.len())) {
                            let name = format!("c{}", rng.below(4));
                            if let Some(id) = rt.try_create_container(sb, &name) {
                                if rng.below(4) > 0 {
                                    rt.start_container(&id);
                                }
                            }
                        }
                    }
                    3 | 4 => {
                        if let Some(c) = pick(&mut rng) {
                            rt.exit_container(&c.id, rng.below(3) as i32);
                        }
                    }
                    5 => {
                        if let Some(c) = pick(&mut rng) {
                            rt.oom_kill_container(&c.id);
                        }
                    }
                    6 => {
                        // Restart: the old one exits, a new one of the same name runs.
                        if let Some(c) = pick(&mut rng) {
                            rt.exit_container(&c.id, 1);
                            if let Some(id) = rt.try_create_container(&c.sandbox_id, &c.name) {
                                rt.start_container(&id);
                            }
                        }
                    }
                    7 => {
                        if let Some(c) =
                            pick(&mut rng).filter(|c| c.state == ContainerState::Exited)
                        {
                            rt.remove_container(&c.id);
                        }
                    }
                    8 => {
                        if let Some((_, sb)) = pods.get(rng.below(pods.len())) {
                            rt.stop_pod(sb);
                        }
                    }
                    _ => {
                        if !pods.is_empty() && rng.below(3) == 0 {
                            let (_, sb) = pods.remove(rng.below(pods.len()));
                            rt.remove_pod(&sb);
                        }
                    }
                }
            }
            let scope = match pods.get(rng.below(pods.len() + 2)) {
                Some((uid, _)) => RelistScope::Pod {
                    uid: uid.clone(),
                    source: RelistSource::EventedPleg,
                    prefetch: vec![],
                },
                None => RelistScope::Global,
            };
            let (c1, a) = calls_of(&rt, reuse.relist(&scope)).await;
            let (c2, b) = calls_of(&rt, full.relist(&scope)).await;
            calls_reuse += c1.1;
            calls_full += c2.1;
            assert_eq!(
                comparable(&a),
                comparable(&b),
                "seed {seed} step {step} {scope:?}"
            );
            assert_eq!(
                *reuse.cache.pods.lock().unwrap(),
                *full.cache.pods.lock().unwrap(),
                "seed {seed} step {step}"
            );
        }
        assert!(
            calls_reuse < calls_full,
            "seed {seed}: {calls_reuse} vs {calls_full}"
        );
    }
}

/// The cache's own answer: nothing for a pod whose last read failed.
#[actix_rt::test]
async fn the_pod_cache_offers_no_status_after_a_failed_read() {
    use crate::cache::{ApplyRelist, CacheOwner};
    use actix::Actor;
    let (owner, cache) = CacheOwner::new(Duration::from_secs(60));
    let owner = owner.start();
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "p1", "ns");
    rt.run_container(&sb, "app");
    let job = rt.run_container(&sb, "job");
    let mut pleg =
        GenericPleg::new(Arc::new(rt.clone()), 4).with_last_reads(Arc::new(cache.clone()));
    let apply = |out: RelistOutput| {
        owner.send(ApplyRelist {
            updates: out.cache,
            global_timestamp: None,
            held: Vec::new(),
            revision: 0,
            events: Vec::new(),
            more: false,
        })
    };
    let out = pleg.relist(&RelistScope::Global, &|_| false).await.unwrap();
    apply(out).await.unwrap();
    let good = cache.last_read("u1").unwrap();
    assert_eq!(good.status.containers.len(), 2);
    // The job's exit makes the next read call ContainerStatus, which fails.
    rt.exit_container(&job, 0);
    rt.fail_pod_status("u1", true);
    let scope = RelistScope::Pod {
        uid: "u1".into(),
        source: RelistSource::EventedPleg,
        prefetch: vec![],
    };
    let out = pleg.relist(&scope, &|_| false).await.unwrap();
    assert_eq!(out.status_errors, 1);
    apply(out).await.unwrap();
    assert!(
        cache.get("u1").unwrap().status.is_some(),
        "the good status is kept"
    );
    assert_eq!(cache.last_read("u1"), None);
    rt.fail_pod_status("u1", false);
    let before = rt.calls(Op::ContainerStatus);
    let out = pleg.relist(&scope, &|_| false).await.unwrap();
    assert_eq!(
        rt.calls(Op::ContainerStatus),
        before + 2,
        "both read, none reused"
    );
    assert_eq!(out.events.len(), 1);
    apply(out).await.unwrap();
    assert!(cache.last_read("u1").is_some());
    let before = rt.calls(Op::ContainerStatus);
    pleg.relist(&scope, &|_| false).await.unwrap();
    assert_eq!(
        rt.calls(Op::ContainerStatus),
        before + 1,
        "app reused, the job read"
    );
}

/// Waits (up to 10 s) until the cache's entry of `uid` satisfies `ok`.
async fn cached(pleg: &crate::Pleg, uid: &str, ok: impl Fn(&PodStatus) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !pleg
        .cache()
        .get(uid)
        .and_then(|p| p.status)
        .is_some_and(|s| ok(&s))
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "cache never showed it"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// As plegd wires it: the PLEG reuses what the CacheOwner holds.
#[actix_rt::test]
async fn plegd_reuses_the_caches_statuses() {
    let rt = FakeRuntime::new();
    let pleg = crate::Pleg::start(
        Arc::new(rt.clone()),
        &crate::PlegConfig {
            relist_period: Duration::from_secs(3600),
            hint_sources: vec![],
            ..crate::PlegConfig::default()
        },
        Arc::new(plegd_telemetry::Metrics::new()),
    );
    let sb = rt.run_pod("u1", "p1", "ns");
    let cs: Vec<String> = (0..20)
        .map(|i| rt.run_container(&sb, &format!("c{i}")))
        .collect();
    // The start-up global relist may have run before the pod existed.
    pleg.request_relist("u1", RelistSource::EventedPleg);
    cached(&pleg, "u1", |s| s.containers.len() == 20).await;
    let before = (rt.calls(Op::SandboxStatus), rt.calls(Op::ContainerStatus));
    rt.exit_container(&cs[4], 3);
    pleg.request_relist("u1", RelistSource::EventedPleg);
    cached(&pleg, "u1", |s| {
        s.containers
            .iter()
            .any(|c| c.id == cs[4] && c.state == ContainerState::Exited)
    })
    .await;
    let after = (rt.calls(Op::SandboxStatus), rt.calls(Op::ContainerStatus));
    assert_eq!((after.0 - before.0, after.1 - before.1), (0, 1));
    pleg.stop();
}

/// The fake runtime, its global relist's lists read as the CRI client reads them:
/// encoded, then given to the list memo's readers in 100-byte frames, so that a
/// sandbox whose entry the memo vouches for is listed without its labels.
#[derive(Clone)]
struct SunkLists(FakeRuntime);

#[async_trait::async_trait]
impl RuntimeClient for SunkLists {
    async fn version(&self) -> Result<plegd_runtime::RuntimeVersion, RuntimeError> {
        self.0.version().await
    }
    async fn list_sandboxes(&self, id: Option<&str>) -> Result<Vec<Sandbox>, RuntimeError> {
        self.0.list_sandboxes(id).await
    }
    async fn list_containers(
        &self,
        sandbox_id: Option<&str>,
    ) -> Result<Vec<plegd_runtime::Container>, RuntimeError> {
        self.0.list_containers(sandbox_id).await
    }
    async fn list_node_memo(
        &self,
        memo: &mut plegd_runtime::ListMemo,
    ) -> Result<plegd_runtime::NodeLists, RuntimeError> {
        let lists = plegd_runtime::NodeLists::encoded(
            &self.0.list_sandboxes(None).await?,
            &self.0.list_containers(None).await?,
        );
        let plegd_runtime::NodeLists::Wire {
            sandboxes,
            containers,
        } = lists
        else {
            unreachable!("encoded lists are bytes");
        };
        plegd_runtime::NodeLists::sunk(&sandboxes, &containers, 100, memo)
    }
    async fn sandbox_status(&self, id: &str) -> Result<Sandbox, RuntimeError> {
        self.0.sandbox_status(id).await
    }
    async fn container_status(&self, id: &str) -> Result<ContainerStatus, RuntimeError> {
        self.0.container_status(id).await
    }
    async fn container_events(&self) -> Result<plegd_runtime::EventStream, RuntimeError> {
        self.0.container_events().await
    }
}

/// A pod with labels, and a second container that exits: on lists read with the memo,
/// the second global relist lists the pod's sandbox without its labels (its entry
/// was checked in the first). The pod's status still carries them: from the last
/// read when there is one (no PodSandboxStatus), else from PodSandboxStatus.
#[tokio::test]
async fn a_sandbox_listed_without_its_labels_is_read_with_them() {
    for with_cache in [true, false] {
        let rt = FakeRuntime::new();
        let labels: std::collections::BTreeMap<String, String> =
            [("app".to_string(), "web".to_string())].into();
        let sb = rt.run_pod_with_labels("u1", "p1", "ns", labels.clone());
        rt.run_container(&sb, "app");
        let side = rt.run_container(&sb, "side");
        let cache = Arc::new(TestCache::default());
        let mut pleg = GenericPleg::new(Arc::new(SunkLists(rt.clone())), 4);
        if with_cache {
            pleg = pleg.with_last_reads(cache.clone());
        }
        let mut node = Node { pleg, cache };
        let (calls, _) = calls_of(&rt, node.global()).await;
        assert_eq!(calls.0, 0, "every sandbox listed with its labels");
        assert_eq!(
            node.cache.status("u1").expect("read").sandboxes[0].labels,
            labels
        );
        rt.exit_container(&side, 1);
        let (calls, out) = calls_of(&rt, node.global()).await;
        assert!(
            out.events.iter().any(|e| e.container_id == side),
            "{:?}",
            out.events
        );
        let status = node.cache.status("u1").expect("read");
        assert_eq!(status.sandboxes[0].labels, labels, "cache: {with_cache}");
        assert_eq!(
            calls.0,
            u64::from(!with_cache),
            "PodSandboxStatus only without a last read (cache: {with_cache})"
        );
    }
}

/// A pod's sandbox re-created (the same labels and annotations, a new ID): on lists
/// read with the memo, the new sandbox is listed with its labels, so the relist reads
/// no PodSandboxStatus, and one gone before a status read could reach it does not
/// fail the pod's read.
#[tokio::test]
async fn a_recreated_sandbox_is_listed_with_its_labels() {
    let rt = FakeRuntime::new();
    let labels: std::collections::BTreeMap<String, String> =
        [("app".to_string(), "web".to_string())].into();
    let old = rt.run_pod_with_labels("u1", "p1", "ns", labels.clone());
    rt.run_container(&old, "app");
    let cache = Arc::new(TestCache::default());
    let pleg = GenericPleg::new(Arc::new(SunkLists(rt.clone())), 4).with_last_reads(cache.clone());
    let mut node = Node { pleg, cache };
    node.global().await;
    rt.stop_pod(&old);
    let new = rt.run_pod_with_labels("u1", "p1", "ns", labels.clone());
    let (calls, out) = calls_of(&rt, node.global()).await;
    assert!(
        out.events.iter().any(|e| e.container_id == new),
        "{:?}",
        out.events
    );
    assert_eq!(calls.0, 0, "no PodSandboxStatus");
    let status = node.cache.status("u1").expect("read");
    let read = status
        .sandboxes
        .iter()
        .find(|s| s.id == new)
        .expect("listed");
    assert_eq!(read.labels, labels);
}
