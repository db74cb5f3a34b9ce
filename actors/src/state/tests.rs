//! The state dir under a running plegd over the fake runtime: new state files written
//! while relists go on never lose a stored relist, and a copy of the dir taken at any
//! moment (what a killed process leaves, mid-rewrite included) goes on from every
//! revision shown before it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use plegd_sim::FakeRuntime;
use plegd_telemetry::Metrics;

use super::{open, Opened};
use crate::event::LifecycleEvent;
use crate::wiring::{Pleg, PlegConfig};

const TTL: Duration = Duration::from_secs(300);

fn config() -> PlegConfig {
    PlegConfig {
        relist_period: Duration::from_millis(20),
        hint_sources: vec![],
        ..PlegConfig::default()
    }
}

fn opened(dir: &std::path::Path) -> Opened {
    open(dir, config().history_events, TTL).unwrap_or_else(|e| panic!("{e}"))
}

async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[actix_rt::test]
async fn new_state_files_written_under_churn_keep_every_relist_and_copies_go_on_from_them() {
    let dir = tempfile::tempdir().unwrap();
    let rt = FakeRuntime::new();
    let p = Pleg::start_with_state(
        Arc::new(rt.clone()),
        &config(),
        Arc::new(Metrics::new()),
        Some(opened(dir.path())),
    );
    let store = p.state().unwrap().clone();
    // Small files: a new one every few relists.
    store.rewrite_at(4096);
    let sub = p.subscribe("t", 1 << 16).await.unwrap();
    until("the first state file", || dir.path().join("state").exists()).await;
    let copies = tempfile::tempdir().unwrap();
    let mut taken = Vec::new();
    let mut pods = Vec::new();
    let mut removed = Vec::new();
    for round in 0..60i32 {
        let uid = format!("u{round}");
        let sb = rt.run_pod(&uid, "w", "ns");
        let c = rt.run_container(&sb, "app");
        pods.push((uid, sb, c));
        if round % 2 == 1 {
            rt.exit_container(&pods[pods.len() - 2].2, round);
        }
        if round % 4 == 3 {
            let (uid, sb, _) = pods.remove(0);
            rt.remove_pod(&sb);
            removed.push(uid);
        }
        let shown = p.latest_revision();
        let copy = copies.path().join(format!("c{round}"));
        std::fs::create_dir(&copy).unwrap();
        // A state file is always there: the new one is renamed over the old.
        std::fs::copy(dir.path().join("state"), copy.join("state")).unwrap();
        taken.push((copy, shown));
        tokio::time::sleep(Duration::from_millis(9)).await;
    }
    assert!(
        store.rewrites() >= 3,
        "new state files written: {}",
        store.rewrites()
    );
    // The last changes relisted before the stop (the records must hold the node).
    until("the node's last changes relisted", || {
        pods.iter().all(|(uid, ..)| p.cache().get(uid).is_some())
            && removed.iter().all(|uid| p.cache().get(uid).is_none())
    })
    .await;
    p.stop();
    until("stopped", || p.stopped()).await;
    let last = p.latest_revision();
    assert!(p.close_state().await);
    let published: HashMap<u64, LifecycleEvent> = sub
        .try_iter()
        .map(|d| (d.event.revision, (*d.event).clone()))
        .collect();
    assert_eq!(
        published.len() as u64,
        last,
        "every revision published once"
    );
    for (copy, shown) in taken {
        let loaded = opened(&copy)
            .loaded
            .unwrap_or_else(|| panic!("{} does not load", copy.display()));
        assert!(
            loaded.revision() >= shown,
            "{}: {} < {shown}",
            copy.display(),
            loaded.revision()
        );
        assert!(!loaded.clean());
        let mut last = 0;
        for ev in loaded.history() {
            assert_eq!(
                Some(&ev),
                published.get(&ev.revision),
                "revision {}",
                ev.revision
            );
            assert_eq!(ev.revision, last + 1, "the stored history has no gap");
            last = ev.revision;
        }
        assert_eq!(last, loaded.revision());
    }
    // And the dir itself, after the clean stop: everything, once.
    let loaded = opened(dir.path()).loaded.unwrap();
    assert!(loaded.clean());
    assert_eq!(loaded.revision(), last);
    let history: Vec<u64> = loaded.history().map(|e| e.revision).collect();
    assert_eq!(history, (1..=last).collect::<Vec<_>>());
    // The records agree with the node: the pods still there.
    assert_eq!(loaded.pods(), pods.len());
}

/// A commit is written in place, except while a job of the writer thread is pending:
/// one made right after a new state file was asked for goes into that file, after its
/// snapshot, not into the old file the rename replaces. (Asked for again and again:
/// the thread is sometimes still waking up when the commit comes, sometimes not.)
#[test]
fn a_commit_made_while_a_new_file_is_written_goes_into_it() {
    use futures::executor::block_on;
    let dir = tempfile::tempdir().unwrap();
    let store = opened(dir.path()).store;
    let commit = super::CommitRef {
        revision: 9,
        global: None,
        more: false,
        held: &[],
        updates: &[],
        events: &[],
        records: &[],
    };
    assert!(block_on(store.rewrite(b"first".to_vec())));
    assert!(block_on(store.commit(&commit, &mut Vec::new())));
    let one = std::fs::read(dir.path().join("state")).unwrap().len() - b"first".len();
    assert!(one > 0, "a commit in place is in the file");
    for round in 0..200u32 {
        let snapshot = round.to_le_bytes().repeat(1024);
        let rewrite = store.rewrite(snapshot.clone());
        let committed = block_on(store.commit(&commit, &mut Vec::new()));
        assert!(block_on(rewrite));
        assert!(committed);
        let file = std::fs::read(dir.path().join("state")).unwrap();
        assert!(file.starts_with(&snapshot));
        assert_eq!(
            file.len(),
            snapshot.len() + one,
            "round {round}: the commit is in the new file"
        );
        assert_eq!(store.size(), file.len() as u64);
    }
}

/// A process killed after a death read beside a global relist was published, before
/// that relist ends, goes on from the state it left: the death is stored with the
/// container's record, so the relists after the restart publish it no second time,
/// and the pod's events still never go back in time.
#[actix_rt::test]
async fn a_death_read_beside_a_global_relist_is_not_published_again_after_a_kill() {
    use plegd_sim::Op;

    use plegd_telemetry::RequestResult;

    use crate::event::{EventKind, RelistSource};

    let config = PlegConfig {
        relist_period: Duration::from_secs(3600),
        ..config()
    };
    let dir = tempfile::tempdir().unwrap();
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "web", "ns");
    let c = rt.run_container(&sb, "app");
    let open_in =
        |d: &std::path::Path| open(d, config.history_events, TTL).unwrap_or_else(|e| panic!("{e}"));
    let p = Pleg::start_with_state(
        Arc::new(rt.clone()),
        &config,
        Arc::new(Metrics::new()),
        Some(open_in(dir.path())),
    );
    let sub = p.subscribe("t", 1 << 10).await.unwrap();
    until("the first global relist", || p.cache().get("u1").is_some()).await;
    rt.hold(Op::ListContainers);
    let lists = rt.calls(Op::ListContainers);
    p.bring_global_relist_forward();
    until("the next global relist lists", || {
        rt.calls(Op::ListContainers) > lists
    })
    .await;
    rt.exit_container(&c, 7);
    assert!(p.request_relist_of("u1", RelistSource::EventedPleg, &c));
    let mut seen = Vec::new();
    until("the death read beside it", || {
        seen.extend(sub.try_iter().map(|d| (*d.event).clone()));
        seen.iter().any(|e| e.kind == EventKind::ContainerDied)
    })
    .await;
    assert_eq!(
        rt.calls(Op::ListContainers),
        lists + 1,
        "the relist still waits"
    );
    // What a kill now leaves.
    let copy = tempfile::tempdir().unwrap();
    std::fs::copy(dir.path().join("state"), copy.path().join("state")).unwrap();
    let shown = p.latest_revision();
    rt.release(Op::ListContainers);
    p.stop();
    until("stopped", || p.stopped()).await;

    let again = Pleg::start_with_state(
        Arc::new(rt.clone()),
        &config,
        Arc::new(Metrics::new()),
        Some(open_in(copy.path())),
    );
    let resumed = again.subscribe_after("t", 1 << 10, Some(0)).await.unwrap();
    assert!(again.latest_revision() >= shown, "nothing shown is lost");
    let global = || again.metrics().relist_duration.get_sample_count();
    until("the restart's first global relist", || global() >= 1).await;
    // And a targeted relist of the pod after it, as the hint would bring.
    let done = || {
        again
            .metrics()
            .requests(RequestResult::Done, RelistSource::EventedPleg)
    };
    assert!(again.request_relist("u1", RelistSource::EventedPleg));
    until("the pod read again", || done() == 1).await;
    again.stop();
    until("stopped again", || again.stopped()).await;
    let events: Vec<_> = resumed.try_iter().map(|d| (*d.event).clone()).collect();
    let revisions: Vec<u64> = events.iter().map(|e| e.revision).collect();
    assert_eq!(
        revisions,
        (1..=again.latest_revision()).collect::<Vec<_>>(),
        "every revision once"
    );
    let deaths = events
        .iter()
        .filter(|e| e.kind == EventKind::ContainerDied && e.container_id == c)
        .count();
    assert_eq!(deaths, 1, "{events:#?}");
    let times: Vec<_> = events
        .iter()
        .filter(|e| e.pod.uid == "u1")
        .map(|e| e.time)
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{events:#?}");
}
