//! ListPods shows exactly its revision: every sandbox and container as the events up
//! to the list's revision left it, even when the cache's status read is ahead of them
//! (read after the list the events came from). A client that lists, then watches from
//! the list's revision, sees each transition once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use integration_tests::api::*;
use integration_tests::wait::{recv_until, wait_until};
use plegd_actors::{Delivery, EventKind, RelistSource};
use plegd_api::convert::unix_nanos;
use plegd_api::v1;
use plegd_runtime::ContainerState;
use plegd_sim::Op;

/// A long period: only the first global relist and the targeted ones a test asks for.
const NO_GLOBAL: Duration = Duration::from_secs(3600);

/// What the events up to a revision say of each sandbox and container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Said {
    Started,
    Died,
}

fn fold_through(events: &[Delivery], revision: u64) -> BTreeMap<String, Said> {
    let mut said = BTreeMap::new();
    for d in events.iter().filter(|d| d.event.revision <= revision) {
        let id = d.event.container_id.clone();
        match d.event.kind {
            EventKind::ContainerStarted => {
                said.insert(id, Said::Started);
            }
            EventKind::ContainerDied => {
                said.insert(id, Said::Died);
            }
            EventKind::ContainerRemoved => {
                said.remove(&id);
            }
            EventKind::PodSync | EventKind::ContainerChanged => {}
        }
    }
    said
}

/// Every disagreement between a list and the events up to its revision: a sandbox or
/// container shown running (ready) or exited (not ready) that the events do not say
/// so, one shown created that the events say started or died, and one the events
/// report that the list leaves out. Unknown may follow a start (an unknown state is
/// never published).
fn disagreements(list: &v1::ListPodsResponse, events: &[Delivery]) -> Vec<String> {
    let said = fold_through(events, list.revision);
    let mut wrong = Vec::new();
    let mut shown = std::collections::BTreeSet::new();
    let mut check = |id: &str, state: &str, ok: bool| {
        shown.insert(id.to_string());
        if !ok {
            wrong.push(format!(
                "{id} shown {state}, the events through {} say {:?}",
                list.revision,
                said.get(id)
            ));
        }
    };
    for pod in &list.pods {
        for sb in &pod.sandboxes {
            let said = said.get(&sb.sandbox_id).copied();
            let (state, ok) = match v1::SandboxState::try_from(sb.state) {
                Ok(v1::SandboxState::SandboxReady) => ("ready", said == Some(Said::Started)),
                Ok(v1::SandboxState::SandboxNotReady) => ("not ready", said == Some(Said::Died)),
                Ok(v1::SandboxState::SandboxUnknown) => ("unknown", said.is_none()),
                _ => ("unspecified", false),
            };
            check(&sb.sandbox_id, state, ok);
        }
        for c in &pod.containers {
            let said = said.get(&c.container_id).copied();
            let (state, ok) = match v1::ContainerState::try_from(c.state) {
                Ok(v1::ContainerState::ContainerRunning) => {
                    ("running", said == Some(Said::Started))
                }
                Ok(v1::ContainerState::ContainerExited) => ("exited", said == Some(Said::Died)),
                Ok(v1::ContainerState::ContainerCreated) => ("created", said.is_none()),
                Ok(v1::ContainerState::ContainerUnknown) => ("unknown", said != Some(Said::Died)),
                _ => ("unspecified", false),
            };
            let exit_shown = c.exit_code.is_some() || c.finished_at_unix_nano.is_some();
            let exit_ok = !exit_shown || said == Some(Said::Died);
            check(&c.container_id, state, ok && exit_ok);
        }
    }
    for (id, s) in &said {
        if !shown.contains(id) {
            wrong.push(format!(
                "{id}: the events through {} say {s:?}, the list leaves it out",
                list.revision
            ));
        }
    }
    wrong
}

fn state_of(list: &v1::ListPodsResponse, id: &str) -> Option<v1::ContainerState> {
    list.pods
        .iter()
        .flat_map(|p| &p.containers)
        .find(|c| c.container_id == id)
        .and_then(|c| v1::ContainerState::try_from(c.state).ok())
}

/// A container that starts between a relist's list (which saw it created: no event)
/// and its status read (which sees it running): the list shows it created until the
/// relist that publishes its start; that start has a revision after the list's.
#[actix_rt::test]
async fn a_start_read_after_the_relists_list_is_not_shown_before_its_event() {
    let served = Served::start(NO_GLOBAL, 1024);
    let reference = served.pleg.subscribe("reference", 4096).await.unwrap();
    wait_until("the first global relist", || served.pleg.health().ready()).await;
    let rt = served.rt.clone();
    let sb = rt.run_pod("u1", "web", "ns");
    let app = rt.run_container(&sb, "app");
    served.pleg.request_relist("u1", RelistSource::PostSync);
    let mut events = recv_until(&reference, "app started", |d| d.event.container_id == app).await;

    let side = rt.create_container(&sb, "side");
    rt.hold(Op::ContainerStatus);
    let calls = rt.calls(Op::ContainerStatus);
    let asked = SystemTime::now();
    served.pleg.request_relist("u1", RelistSource::PostSync);
    wait_until("the status read of the created container", || {
        rt.calls(Op::ContainerStatus) > calls
    })
    .await;
    rt.start_container(&side);
    rt.release(Op::ContainerStatus);

    let mut client = served.client().await;
    client
        .get_pod_status(v1::GetPodStatusRequest {
            pod_uid: "u1".into(),
            newer_than_unix_nano: Some(unix_nanos(asked)),
        })
        .await
        .expect("the targeted relist reads the pod");
    let list = client
        .list_pods(v1::ListPodsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        rt.container(&side).map(|c| c.state),
        Some(ContainerState::Running)
    );
    assert_eq!(
        state_of(&list, &side),
        Some(v1::ContainerState::ContainerCreated),
        "the list at revision {} shows a start no event up to it told",
        list.revision
    );
    // The next relist publishes the start, after the list's revision.
    served.pleg.request_relist("u1", RelistSource::PostSync);
    let got = recv_until(&reference, "side started", |d| {
        d.event.container_id == side && d.event.kind == EventKind::ContainerStarted
    })
    .await;
    let started = got.last().unwrap();
    assert!(started.event.revision > list.revision);
    events.extend(got);
    assert_eq!(disagreements(&list, &events), Vec::<String>::new());
}

/// Lists taken all along a churn whose status reads lag their lists: each agrees
/// with the events up to its revision, for every sandbox and container.
#[actix_rt::test]
async fn every_list_under_churn_agrees_with_the_events_up_to_its_revision() {
    let served = Served::start(Duration::from_millis(5), 1024);
    let reference = served.pleg.subscribe("reference", 1 << 20).await.unwrap();
    let rt = served.rt.clone();
    // Status reads answer 1 ms after their call, so the runtime changes between a
    // relist's lists and its reads.
    rt.set_latency(Op::ContainerStatus, Duration::from_millis(1));
    let mut sandboxes = Vec::new();
    for i in 0..8 {
        let sb = rt.run_pod(&format!("u{i}"), &format!("p{i}"), "ns");
        rt.run_container(&sb, "app");
        sandboxes.push(sb);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (rt, stop, sandboxes) = (rt.clone(), stop.clone(), sandboxes.clone());
        std::thread::spawn(move || {
            let mut n = 0usize;
            while !stop.load(Ordering::SeqCst) {
                let sb = &sandboxes[n % sandboxes.len()];
                for c in rt.containers_of(sb) {
                    match c.state {
                        ContainerState::Running => rt.exit_container(&c.id, 1),
                        ContainerState::Exited if n.is_multiple_of(3) => rt.remove_container(&c.id),
                        _ => {}
                    }
                }
                let c = rt.create_container(sb, &format!("app{n}"));
                // Started a moment after it was created: some lists see it created.
                std::thread::sleep(Duration::from_micros(300));
                rt.start_container(&c);
                n += 1;
                std::thread::sleep(Duration::from_micros(700));
            }
            n
        })
    };
    let mut client = served.client().await;
    let mut lists = Vec::new();
    while lists.len() < 120 {
        let list = client
            .list_pods(v1::ListPodsRequest {})
            .await
            .unwrap()
            .into_inner();
        if lists
            .last()
            .is_none_or(|l: &v1::ListPodsResponse| l.revision < list.revision)
        {
            lists.push(list);
        }
        tokio::task::yield_now().await;
    }
    stop.store(true, Ordering::SeqCst);
    let changes = churn.join().unwrap();
    assert!(changes > 0);
    let marker = rt.run_container(&sandboxes[0], "marker");
    let events = recv_until(&reference, "the marker", |d| d.event.container_id == marker).await;
    let wrong: Vec<String> = lists
        .iter()
        .flat_map(|l| disagreements(l, &events))
        .collect();
    assert!(
        wrong.is_empty(),
        "{} disagreements in {} lists, e.g. {:?}",
        wrong.len(),
        lists.len(),
        &wrong[..wrong.len().min(10)]
    );
}
