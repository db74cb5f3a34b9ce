//! A global relist in chunks gives exactly what one of all pods at once gives: the
//! same cache updates and events in the same order, the same records, the same pods
//! to reinspect — on random nodes, including what only a runtime gone wrong lists
//! (ids listed twice, under two pods; containers whose sandbox is not listed).

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::StreamExt;

use super::record::PodRecord;
use super::status_tests::Below;
use super::*;
use plegd_runtime::{
    Container, ContainerState, ContainerStatus, EventStream, ListMemo, NodeLists, PodRef,
    RuntimeClient, RuntimeError, RuntimeVersion, Sandbox, SandboxState,
};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// A runtime that lists what the test says, in the test's order, and answers status
/// calls from those lists (the last listed entry of an id).
#[derive(Default)]
struct Scripted {
    node: Mutex<Node>,
}

#[derive(Clone, Default)]
struct Node {
    sandboxes: Vec<Sandbox>,
    containers: Vec<Container>,
    /// Container ids whose ContainerStatus fails (Unavailable).
    failing: HashSet<String>,
    /// Container ids whose ContainerStatus answers NotFound (gone after the list).
    gone: HashSet<String>,
    /// Hand the lists over as CRI's bytes, else decoded.
    wire: bool,
    /// Hand them over read as they arrive, with the list memo (`CriRuntime`'s path).
    sunk: bool,
}

fn rpc(op: &'static str, code: tonic::Code) -> RuntimeError {
    RuntimeError::Rpc {
        op,
        code,
        message: "scripted".into(),
    }
}

#[async_trait]
impl RuntimeClient for Scripted {
    async fn version(&self) -> Result<RuntimeVersion, RuntimeError> {
        Ok(RuntimeVersion {
            runtime_name: "scripted".into(),
            runtime_version: "0".into(),
            runtime_api_version: "v1".into(),
        })
    }
    async fn list_sandboxes(&self, id: Option<&str>) -> Result<Vec<Sandbox>, RuntimeError> {
        let node = self.node.lock().unwrap();
        Ok(node
            .sandboxes
            .iter()
            .filter(|s| id.is_none_or(|id| s.id == id))
            .cloned()
            .collect())
    }
    async fn list_containers(&self, sb: Option<&str>) -> Result<Vec<Container>, RuntimeError> {
        let node = self.node.lock().unwrap();
        Ok(node
            .containers
            .iter()
            .filter(|c| sb.is_none_or(|sb| c.sandbox_id == sb))
            .cloned()
            .collect())
    }
    async fn list_node(&self) -> Result<NodeLists, RuntimeError> {
        let node = self.node.lock().unwrap();
        Ok(if node.wire {
            NodeLists::encoded(&node.sandboxes, &node.containers)
        } else {
            NodeLists::Decoded {
                sandboxes: node.sandboxes.clone(),
                containers: node.containers.clone(),
            }
        })
    }
    async fn list_node_memo(&self, memo: &mut ListMemo) -> Result<NodeLists, RuntimeError> {
        let lists = self.list_node().await?;
        match lists {
            NodeLists::Wire {
                sandboxes,
                containers,
            } if self.node.lock().unwrap().sunk => {
                NodeLists::sunk(&sandboxes, &containers, 64, memo)
            }
            lists => Ok(lists),
        }
    }
    async fn sandbox_status(&self, id: &str) -> Result<Sandbox, RuntimeError> {
        let node = self.node.lock().unwrap();
        node.sandboxes
            .iter()
            .rev()
            .find(|s| s.id == id)
            .cloned()
            .ok_or_else(|| rpc("PodSandboxStatus", tonic::Code::NotFound))
    }
    async fn container_status(&self, id: &str) -> Result<ContainerStatus, RuntimeError> {
        let node = self.node.lock().unwrap();
        if node.failing.contains(id) {
            return Err(rpc("ContainerStatus", tonic::Code::Unavailable));
        }
        if node.gone.contains(id) {
            return Err(rpc("ContainerStatus", tonic::Code::NotFound));
        }
        let c = node
            .containers
            .iter()
            .rev()
            .find(|c| c.id == id)
            .ok_or_else(|| rpc("ContainerStatus", tonic::Code::NotFound))?;
        let exited = c.state == ContainerState::Exited;
        Ok(ContainerStatus {
            id: c.id.clone(),
            sandbox_id: c.sandbox_id.clone(),
            name: c.name.clone(),
            attempt: c.attempt,
            state: c.state,
            created_at: c.created_at,
            started_at: c.created_at + 1,
            finished_at: if exited { c.created_at + 2 } else { 0 },
            exit_code: if exited { c.attempt as i32 } else { 0 },
            reason: if exited {
                "Error".into()
            } else {
                String::new()
            },
            message: String::new(),
            image: format!("img-{}", c.name),
        })
    }
    async fn container_events(&self) -> Result<EventStream, RuntimeError> {
        Ok(futures::stream::pending().boxed())
    }
}

/// Random changes to the node. `ids`: how many distinct sandbox / container ids to
/// draw from (few: ids are listed twice, and containers name sandboxes not listed).
/// `orphans`: new containers are sometimes put in a sandbox that is not listed, IDs
/// are drawn again (listed twice), a sandbox goes before its containers; else a
/// runtime's ways: IDs are new, a sandbox goes with its containers.
fn mutate(
    node: &mut Node,
    rng: &mut ChaCha8Rng,
    (pods, ids, orphans): (usize, usize, bool),
    step: usize,
) {
    let sandbox_state = |r: usize| [SandboxState::Ready, SandboxState::NotReady][r % 2];
    let container_state = |r: usize| {
        [
            ContainerState::Created,
            ContainerState::Running,
            ContainerState::Running,
            ContainerState::Exited,
            ContainerState::Unknown,
        ][r % 5]
    };
    for k in 0..1 + rng.below(6) {
        let new_id = |rng: &mut ChaCha8Rng, kind: &str, of: usize| match orphans {
            true => format!("{kind}-{}", rng.below(of)),
            false => format!("{kind}-{step}-{k}"),
        };
        match rng.below(10) {
            0 | 1 => {
                let uid = format!("pod-{:02}", rng.below(pods));
                let mut labels = BTreeMap::new();
                labels.insert("app".to_string(), format!("a{}", rng.below(3)));
                node.sandboxes.push(Sandbox {
                    id: new_id(rng, "sb", ids),
                    pod: PodRef {
                        // A pod's sandboxes named apart (a runtime gone wrong).
                        name: format!("name-{uid}-{}", rng.below(1 + usize::from(orphans))),
                        uid,
                        namespace: "ns".into(),
                    },
                    attempt: rng.below(3) as u32,
                    state: sandbox_state(rng.below(2)),
                    created_at: step as i64,
                    labels,
                });
            }
            2 => {
                if !node.sandboxes.is_empty() {
                    let i = rng.below(node.sandboxes.len());
                    let gone = node.sandboxes.remove(i);
                    if !orphans {
                        node.containers.retain(|c| c.sandbox_id != gone.id);
                    }
                }
            }
            3 => {
                let n = node.sandboxes.len();
                if let Some(s) = node.sandboxes.get_mut(rng.below(n)) {
                    s.state = sandbox_state(rng.below(2));
                }
            }
            4..=6 => {
                // Mostly in a listed sandbox; sometimes in one that is not.
                let listed = node.sandboxes.len() + usize::from(orphans);
                let sandbox_id = match node.sandboxes.get(rng.below(listed)) {
                    Some(s) => s.id.clone(),
                    None if orphans => format!("sb-{}", rng.below(ids)),
                    None => continue,
                };
                node.containers.push(Container {
                    id: new_id(rng, "c", ids * 3),
                    sandbox_id,
                    name: format!("app-{}", rng.below(3)),
                    attempt: rng.below(3) as u32,
                    state: container_state(rng.below(5)),
                    created_at: step as i64,
                });
            }
            7 => {
                if !node.containers.is_empty() {
                    let i = rng.below(node.containers.len());
                    node.containers.remove(i);
                }
            }
            8 => {
                let n = node.containers.len();
                if let Some(c) = node.containers.get_mut(rng.below(n)) {
                    c.state = container_state(rng.below(5));
                }
            }
            _ => {
                let n = node.containers.len();
                if let Some(c) = node.containers.get(rng.below(n)) {
                    let id = c.id.clone();
                    match rng.below(4) {
                        0 => drop(node.failing.insert(id)),
                        1 => drop(node.gone.insert(id)),
                        _ => {
                            node.failing.clear();
                            node.gone.clear();
                        }
                    }
                }
            }
        }
    }
}

/// What a relist gave, without the read times (the plegs read one after the other);
/// the held pods as a set (a chunk reports its own).
fn comparable(out: &RelistOutput) -> (Vec<String>, Vec<String>, Vec<String>, usize, usize) {
    let (cache, events) = super::status_tests::comparable(out);
    let mut held = out.held.clone();
    held.sort();
    (cache, events, held, out.status_errors, out.pods_inspected)
}

/// Every pod's record and whether it awaits reinspection.
fn state(p: &GenericPleg, pods: usize) -> Vec<(Option<PodRecord>, bool)> {
    (0..pods)
        .map(|i| {
            let uid = format!("pod-{i:02}");
            (p.record(&uid).cloned(), p.needs_reinspection(&uid))
        })
        .collect()
}

/// Random nodes, global relist after global relist (some pods held by a sync, some
/// reads failing): plegs reading 1, 2, 3 and all pods per chunk agree with one that
/// rebuilds every pod at once with its records (plegd's relist before chunks and the
/// change check), every relist, on the output, the records and the pods to reinspect.
/// Few ids (ids listed twice, containers of unlisted sandboxes: the first relist is
/// chunked, later ones group everything with the records) and many (later relists
/// rebuild only what changed, in chunks too); decoded lists, CRI's bytes, and the
/// bytes read as they arrive with the list memo (lists the memo finds unchanged take
/// the last relist's fingerprint).
#[tokio::test]
async fn global_relists_in_chunks_give_what_one_relist_at_once_gives() {
    let (mut relists, mut matches, mut reused) = (0, 0, 0);
    for seed in 1..=24u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let (pods, ids) = if seed % 2 == 0 { (12, 6) } else { (16, 400) };
        // Half the nodes of many ids put no new container in an unlisted sandbox: their
        // lists then often hold just what the records do.
        let orphans = seed % 4 != 1;
        let runtime = Arc::new(Scripted::default());
        {
            let mut node = runtime.node.lock().unwrap();
            node.wire = seed % 3 != 1;
            node.sunk = seed % 3 == 2;
        }
        // The reference: every pod rebuilt at once, every relist (as before chunks).
        let mut plegs = vec![GenericPleg::new(runtime.clone(), 3).rebuilding_all_at_once()];
        plegs.extend(
            [usize::MAX, 1, 2, 3]
                .into_iter()
                .map(|n| GenericPleg::new(runtime.clone(), 3).with_chunk_pods(n)),
        );
        let mut seen = 0;
        for step in 0..40 {
            {
                let mut node = runtime.node.lock().unwrap();
                // A populated node at the first relist; a third of the later relists
                // list the same again, only which reads fail changing (the records'
                // fingerprint then decides, with pods to reinspect and held).
                if step > 0 && rng.below(3) == 0 {
                    let failing = node.containers.get(rng.below(node.containers.len()));
                    match failing.map(|c| c.id.clone()) {
                        Some(id) if rng.below(2) == 0 => drop(node.failing.insert(id)),
                        _ => node.failing.clear(),
                    }
                } else {
                    for _ in 0..if step == 0 { 6 } else { 1 } {
                        mutate(&mut node, &mut rng, (pods, ids, orphans), step);
                    }
                }
            }
            let held: HashSet<String> = (0..rng.below(3))
                .map(|_| format!("pod-{:02}", rng.below(pods)))
                .collect();
            let held = |uid: &str| held.contains(uid);
            let mut outs = Vec::new();
            for p in &mut plegs {
                outs.push(p.relist(&RelistScope::Global, &held).await.unwrap());
            }
            relists += 1;
            matches += plegs[1].fingerprint_matches() - seen;
            seen = plegs[1].fingerprint_matches();
            let want = comparable(&outs[0]);
            let want_state = state(&plegs[0], pods);
            for (i, (out, p)) in outs.iter().zip(&plegs).enumerate().skip(1) {
                assert_eq!(comparable(out), want, "seed {seed} step {step} pleg {i}");
                assert_eq!(
                    state(p, pods),
                    want_state,
                    "seed {seed} step {step} pleg {i}"
                );
                assert_eq!(p.pod_count(), plegs[0].pod_count());
            }
        }
        reused += plegs.iter().map(|p| p.lists_prints_reused()).sum::<usize>();
    }
    assert_eq!(relists, 24 * 40);
    // Lists listed again unchanged often took the last relist's fingerprint.
    assert!(
        reused >= 400,
        "{reused} relists took the last lists' fingerprint"
    );
    // The fingerprint decided many of them.
    assert!(
        matches >= 40,
        "{matches} relists matched the records' fingerprint"
    );
}

/// The chunks come in UID order, each pod in one of them, the last flagged so; a
/// node with no pod still gets one (empty) last chunk.
#[tokio::test]
async fn each_pod_is_in_one_chunk_and_the_last_chunk_is_flagged() {
    let runtime = Arc::new(Scripted::default());
    let mut p = GenericPleg::new(runtime.clone(), 3).with_chunk_pods(4);
    let mut chunks = Vec::new();
    p.relist_global(&|_| false, |out, last| {
        chunks.push((out.cache.len(), last));
        std::future::ready(())
    })
    .await
    .unwrap();
    assert_eq!(chunks, [(0, true)]);

    {
        let mut node = runtime.node.lock().unwrap();
        for i in (0..10).rev() {
            node.sandboxes.push(ready_sandbox(i));
        }
    }
    let mut p = GenericPleg::new(runtime, 3).with_chunk_pods(4);
    let mut chunks = Vec::new();
    p.relist_global(&|_| false, |out, last| {
        let uids: Vec<String> = out.cache.iter().map(|u| u.uid().to_string()).collect();
        chunks.push((uids, last));
        std::future::ready(())
    })
    .await
    .unwrap();
    let uids = |r: std::ops::Range<usize>| r.map(|i| format!("pod-{i:02}")).collect::<Vec<_>>();
    assert_eq!(
        chunks,
        [
            (uids(0..4), false),
            (uids(4..8), false),
            (uids(8..10), true)
        ]
    );
}

/// Each chunk is handed over before the next one's statuses are read.
/// Sandbox `sb-{i}` of pod `pod-{i:02}`, ready.
fn ready_sandbox(i: usize) -> Sandbox {
    Sandbox {
        id: format!("sb-{i}"),
        pod: PodRef {
            uid: format!("pod-{i:02}"),
            name: format!("n{i}"),
            namespace: "ns".into(),
        },
        attempt: 0,
        state: SandboxState::Ready,
        created_at: 1,
        labels: BTreeMap::new(),
    }
}

#[tokio::test]
async fn a_chunk_is_handed_over_before_the_next_is_read() {
    let runtime = Arc::new(Scripted::default());
    {
        let mut node = runtime.node.lock().unwrap();
        for i in 0..6 {
            node.sandboxes.push(ready_sandbox(i));
            node.containers.push(Container {
                id: format!("c-{i}"),
                sandbox_id: format!("sb-{i}"),
                name: "app".into(),
                attempt: 0,
                state: ContainerState::Running,
                created_at: 1,
            });
        }
    }
    // Between two chunks the test makes every later read fail: only pods of later
    // chunks see it.
    let mut p = GenericPleg::new(runtime.clone(), 3).with_chunk_pods(2);
    let mut errors = Vec::new();
    p.relist_global(&|_| false, |out, _| {
        errors.push(out.status_errors);
        let mut node = runtime.node.lock().unwrap();
        node.failing = (0..6).map(|i| format!("c-{i}")).collect();
        std::future::ready(())
    })
    .await
    .unwrap();
    assert_eq!(errors, [0, 2, 2]);
    assert!(p.needs_reinspection("pod-02") && !p.needs_reinspection("pod-01"));
}

/// A container of `sandbox`, running.
fn running(id: &str, sandbox: &str) -> Container {
    Container {
        id: id.into(),
        sandbox_id: sandbox.into(),
        name: "app".into(),
        attempt: 0,
        state: ContainerState::Running,
        created_at: 1,
    }
}

/// Sandbox `id` of pod `uid`, ready.
fn sandbox_of(id: &str, uid: &str) -> Sandbox {
    Sandbox {
        pod: PodRef {
            uid: uid.into(),
            name: format!("n-{uid}"),
            namespace: "ns".into(),
        },
        id: id.into(),
        ..ready_sandbox(0)
    }
}

/// One relist's lists, the pods held and the containers whose status read fails.
type Step<'a> = (Vec<Sandbox>, Vec<Container>, &'a [&'a str], &'a [&'a str]);

/// Steps through a pleg and the reference that rebuilds every pod every relist: the
/// same output, records and pods to reinspect at each step.
async fn agrees_with_rebuilding_everything(steps: &[Step<'_>]) {
    let runtime = Arc::new(Scripted::default());
    let mut plegs = [
        GenericPleg::new(runtime.clone(), 3).rebuilding_all_at_once(),
        GenericPleg::new(runtime.clone(), 3),
    ];
    for (step, (sandboxes, containers, held, failing)) in steps.iter().enumerate() {
        {
            let mut node = runtime.node.lock().unwrap();
            node.sandboxes = sandboxes.clone();
            node.containers = containers.clone();
            node.failing = failing.iter().map(|s| s.to_string()).collect();
        }
        let held = |uid: &str| held.contains(&uid);
        let mut outs = Vec::new();
        for p in &mut plegs {
            outs.push(comparable(
                &p.relist(&RelistScope::Global, &held).await.unwrap(),
            ));
        }
        assert_eq!(outs[1], outs[0], "step {step}");
        let uids = ["pod-x", "pod-y"];
        let state = |p: &GenericPleg| uids.map(|u| (p.record(u).cloned(), p.needs_reinspection(u)));
        assert_eq!(state(&plegs[1]), state(&plegs[0]), "step {step}");
    }
}

/// Found by review: lists that hold what the records hold, a container of theirs in
/// a sandbox no longer listed, and its pod to be reinspected (its last read failed):
/// the pod was rebuilt from its listed entries alone, losing that container.
#[tokio::test]
async fn a_pod_to_reinspect_keeps_a_container_whose_sandbox_is_not_listed() {
    let s = || vec![sandbox_of("sb-s", "pod-x")];
    let c = || vec![running("c-1", "sb-s")];
    let two = || vec![running("c-1", "sb-s"), running("c-2", "sb-s")];
    agrees_with_rebuilding_everything(&[
        (s(), c(), &[], &[]),
        // The sandbox goes from the list; its container stays in the pod's record.
        (vec![], c(), &[], &[]),
        // A new container, whose status read fails: the pod is to be reinspected.
        (vec![], two(), &[], &["c-2"]),
        // The lists hold what the record does again.
        (vec![], c(), &[], &[]),
        (vec![], c(), &[], &[]),
    ])
    .await;
}

/// Found by review: a sandbox listed under two pods, then its container in the one
/// record and the sandbox in the other (the other held meanwhile): lists with the
/// same entries put the container elsewhere, which is a change.
#[tokio::test]
async fn a_container_in_another_pods_record_than_its_sandbox_is_a_change() {
    let c = || vec![running("c-1", "sb-s")];
    agrees_with_rebuilding_everything(&[
        (
            vec![sandbox_of("sb-s", "pod-y"), sandbox_of("sb-s", "pod-x")],
            c(),
            &[],
            &[],
        ),
        (vec![], c(), &["pod-y"], &[]),
        (vec![sandbox_of("sb-s", "pod-y")], c(), &[], &[]),
    ])
    .await;
}
