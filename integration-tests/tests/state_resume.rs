//! The state dir over the fake runtime, in one process: plegd stopped and started
//! again on the same state goes on as the same instance, with the revisions, history
//! and cache it had, and publishes what happened while it was down. (Copies of the
//! state taken at any moment, what a killed process leaves: `actors/src/state/tests.rs`.)

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use integration_tests::wait::*;
use plegd_actors::state::{self, Opened};
use plegd_actors::{EventKind, LifecycleEvent, Pleg, PlegConfig};
use plegd_sim::FakeRuntime;
use plegd_telemetry::Metrics;

const TTL: Duration = Duration::from_secs(300);

fn config() -> PlegConfig {
    PlegConfig {
        relist_period: Duration::from_millis(30),
        hint_sources: vec![],
        ..PlegConfig::default()
    }
}

fn open(dir: &Path) -> Opened {
    match state::open(dir, config().history_events, TTL) {
        Ok(o) => o,
        Err(e) => panic!("open {}: {e}", dir.display()),
    }
}

fn start(rt: &FakeRuntime, opened: Opened) -> Pleg {
    Pleg::start_with_state(
        Arc::new(rt.clone()),
        &config(),
        Arc::new(Metrics::new()),
        Some(opened),
    )
}

/// A clean stop: the dispatcher's last relist stored, then the stop record.
async fn stop(p: &Pleg) {
    p.stop();
    wait_until("the dispatcher stopped", || p.stopped()).await;
    assert!(p.close_state().await, "the clean stop was recorded");
    p.close_publisher().await;
}

fn key(e: &LifecycleEvent) -> (EventKind, String, Option<i32>) {
    (
        e.kind,
        e.container_id.clone(),
        e.exit.as_ref().map(|x| x.code),
    )
}

#[actix_rt::test]
async fn a_clean_restart_goes_on_as_the_same_instance_and_publishes_the_downtime() {
    let dir = tempfile::tempdir().unwrap();
    let rt = FakeRuntime::new();
    let sb1 = rt.run_pod("u1", "web", "ns");
    let c1 = rt.run_container(&sb1, "app");
    let sb2 = rt.run_pod("u2", "db", "ns");
    let c2 = rt.run_container(&sb2, "app");

    let first = start(&rt, open(dir.path()));
    let sub = first.subscribe("t", 1024).await.unwrap();
    let seen = recv_until(&sub, "both containers started", |_| {
        first.cache().get("u2").is_some() && first.cache().get("u1").is_some()
    })
    .await;
    // Everything of the first relist, by revision.
    wait_until("the first relist", || first.health().ready()).await;
    let snapshot = first.snapshot().await.unwrap();
    let before = snapshot.revision;
    assert!(before >= 4, "sandboxes and containers started: {before}");
    let instance = first.instance_id().to_string();
    let mut seen: Vec<LifecycleEvent> = seen.into_iter().map(|d| (*d.event).clone()).collect();
    seen.extend(drain(&sub).into_iter().map(|d| (*d.event).clone()));
    stop(&first).await;

    // While plegd is down: one container dies, one pod goes, one comes.
    rt.exit_container(&c1, 3);
    rt.remove_pod(&sb2);
    let sb3 = rt.run_pod("u3", "cache", "ns");
    let c3 = rt.run_container(&sb3, "app");

    let opened = open(dir.path());
    let loaded = opened.loaded.as_ref().expect("went on from the state");
    assert!(loaded.clean());
    assert_eq!(loaded.instance_id(), instance);
    assert_eq!(loaded.revision(), before);
    assert_eq!(opened.discarded, None);
    let second = start(&rt, opened);
    assert_eq!(second.instance_id(), instance);
    // Before any relist: the cache as it was, at the revision it reflected.
    // (A subscriber resuming from the first revision replays the stored history.)
    let resumed = second.subscribe_after("r", 1024, Some(0)).await.unwrap();
    let got = recv_until(&resumed, "the downtime's transitions", |d| {
        d.event.kind == EventKind::ContainerStarted && d.event.container_id == c3
    })
    .await;
    let revisions: Vec<u64> = got.iter().map(|d| d.event.revision).collect();
    let want: Vec<u64> = (1..=revisions.len() as u64).collect();
    assert_eq!(revisions, want, "no gap, no duplicate across the restart");
    // The history replayed is what the first instance published.
    let replayed: Vec<LifecycleEvent> = got
        .iter()
        .take(before as usize)
        .map(|d| (*d.event).clone())
        .collect();
    assert_eq!(replayed, seen[..before as usize]);
    // Then the downtime, as one relist after a gap reports it.
    let after: Vec<_> = got[before as usize..]
        .iter()
        .map(|d| key(&d.event))
        .collect();
    assert!(
        after.contains(&(EventKind::ContainerDied, c1.clone(), Some(3))),
        "{after:?}"
    );
    assert!(
        after.contains(&(EventKind::ContainerDied, c2.clone(), Some(137)))
            || after.contains(&(EventKind::ContainerRemoved, c2.clone(), None)),
        "{after:?}"
    );
    assert!(
        after.contains(&(EventKind::ContainerRemoved, c2.clone(), None)),
        "{after:?}"
    );
    assert!(
        after.contains(&(EventKind::ContainerRemoved, sb2.clone(), None)),
        "{after:?}"
    );
    assert!(
        after.contains(&(EventKind::ContainerStarted, sb3.clone(), None)),
        "{after:?}"
    );
    assert!(
        after.contains(&(EventKind::ContainerStarted, c3.clone(), None)),
        "{after:?}"
    );
    assert!(
        !after
            .iter()
            .any(|(k, id, _)| *k == EventKind::ContainerStarted && (*id == c1 || *id == sb1)),
        "nothing the first instance published is published again: {after:?}"
    );
    // The removed pod is a tombstone, as if plegd had never stopped.
    wait_until("u2 gone", || second.cache().get("u2").is_none()).await;
    assert!(matches!(
        second.cache().lookup("u2"),
        plegd_actors::PodLookup::Removed { .. }
    ));
    stop(&second).await;
}

#[actix_rt::test]
async fn a_second_plegd_on_the_same_state_dir_is_refused_with_the_first_ones_pid() {
    let dir = tempfile::tempdir().unwrap();
    let _first = open(dir.path());
    match state::open(dir.path(), 16, TTL) {
        Err(e @ state::OpenError::Locked { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(&std::process::id().to_string()), "{msg}");
            assert!(msg.contains("another plegd"), "{msg}");
        }
        Err(e) => panic!("not refused as locked: {e}"),
        Ok(_) => panic!("a second open of a locked state dir succeeded"),
    }
}
