//! Generic PLEG semantics against the fake runtime, relist by relist.

use std::sync::Arc;

use super::*;
use crate::event::{EventKind, EventKind::*, RelistSource};
use plegd_runtime::ContainerState;
use plegd_sim::{FakeRuntime, Op};

fn pleg(rt: &FakeRuntime) -> GenericPleg {
    GenericPleg::new(Arc::new(rt.clone()), 4)
}

async fn global(p: &mut GenericPleg) -> RelistOutput {
    p.relist(&RelistScope::Global, &|_| false).await.unwrap()
}

async fn targeted(p: &mut GenericPleg, uid: &str) -> RelistOutput {
    p.relist(
        &RelistScope::Pod {
            uid: uid.into(),
            source: RelistSource::EventedPleg,
        },
        &|_| false,
    )
    .await
    .unwrap()
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
    let reads = rt.calls(Op::SandboxStatus);
    let out = global(&mut p).await;
    assert!(out.events.is_empty() && out.cache.is_empty());
    assert_eq!(rt.calls(Op::SandboxStatus), reads);
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
    assert_eq!(out.cache, vec![CacheUpdate::Delete { uid: "u1".into() }]);
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
    assert_eq!(out.cache, vec![CacheUpdate::Delete { uid: "u1".into() }]);
}
