//! Deaths read beside a global relist (`beside` module): handed over before its lists
//! answer, never undone by those lists, never twice, and forgotten with the relist.

use std::sync::{Arc, Mutex};

use tokio::sync::mpsc::unbounded_channel;

use super::early_tests::{died, one_pod, Stale};
use super::tests::global;
use super::*;
use crate::event::{EventKind, RelistSource};
use crate::testing::wait_until;
use plegd_runtime::ContainerState;
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
    result.unwrap();
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
    result.unwrap();
    assert_eq!(*early.lock().unwrap(), 0);
    assert_eq!(
        p.record("u1").map(|r| r.state_of(&c)),
        Some(super::record::PlegState::Running),
        "the record of a held pod is left alone"
    );
}
