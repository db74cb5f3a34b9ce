//! Who may change what others see: Sync and RequestRelist are served on the control
//! socket only (PERMISSION_DENIED on the read socket, which still serves the reads),
//! holds expire unless renewed, holds of unknown pods are bounded, RequestRelist
//! answers what became of the request, and ListClients shows the watchers and holds.

use std::os::unix::fs::MetadataExt as _;
use std::time::{Duration, SystemTime};

use integration_tests::api::*;
use integration_tests::wait::{wait_until, TIMEOUT};
use plegd_actors::PlegConfig;
use plegd_api::v1;
use plegd_sim::Op;
use plegd_telemetry::Refusal;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::Code;

type Client = v1::plegd_client::PlegdClient<Channel>;

fn begin(uid: &str) -> v1::SyncRequest {
    v1::SyncRequest {
        kind: Some(v1::sync_request::Kind::Begin(v1::SyncBegin {
            pod_uid: uid.into(),
        })),
    }
}

fn renew() -> v1::SyncRequest {
    v1::SyncRequest {
        kind: Some(v1::sync_request::Kind::Renew(v1::SyncRenew {})),
    }
}

/// Opens a Sync for `uid`: the request sender and the answers, or the refusal.
async fn try_hold(
    client: &mut Client,
    uid: &str,
) -> Result<
    (
        mpsc::Sender<v1::SyncRequest>,
        tonic::Streaming<v1::SyncResponse>,
    ),
    tonic::Status,
> {
    let (tx, rx) = mpsc::channel(4);
    tx.send(begin(uid)).await.unwrap();
    let answers = client.sync(ReceiverStream::new(rx)).await?.into_inner();
    Ok((tx, answers))
}

/// The next answer of a Sync stream, within the test timeout.
async fn answer(answers: &mut tonic::Streaming<v1::SyncResponse>) -> v1::sync_response::Kind {
    tokio::time::timeout(TIMEOUT, answers.message())
        .await
        .expect("an answer in time")
        .expect("no error")
        .expect("not the end")
        .kind
        .expect("a kind")
}

fn held(kind: v1::sync_response::Kind) -> v1::SyncHeld {
    match kind {
        v1::sync_response::Kind::Held(h) => h,
        other => panic!("not held: {other:?}"),
    }
}

fn relist(uid: &str) -> v1::RequestRelistRequest {
    v1::RequestRelistRequest {
        pod_uid: uid.into(),
        source: v1::RelistSource::PostAllocation.into(),
    }
}

#[actix_rt::test]
async fn control_calls_are_refused_on_the_read_socket_and_served_on_the_control_socket() {
    let served = Served::start(Duration::from_secs(3600), 64);
    wait_until("the first global relist", || served.pleg.health().ready()).await;
    // The sockets' modes: plegd's 0660 for reading, the control socket's own.
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().mode() & 0o777;
    assert_eq!(mode(&served.socket), 0o660);
    assert_eq!(mode(&served.control), CONTROL_MODE);

    let mut reader = served.client().await;
    let err = try_hold(&mut reader, "u1").await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    assert!(
        err.message()
            .contains(&served.control.display().to_string()),
        "names the control socket: {err:?}"
    );
    assert!(!served.pleg.is_held("u1"));
    let err = reader.request_relist(relist("u1")).await.unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");
    let metrics = served.pleg.metrics();
    assert_eq!(metrics.refused(Refusal::SyncOnReadSocket), 1);
    assert_eq!(metrics.refused(Refusal::RelistOnReadSocket), 1);
    // The reads stay on the read socket.
    reader.list_pods(v1::ListPodsRequest {}).await.unwrap();
    reader
        .list_clients(v1::ListClientsRequest {})
        .await
        .unwrap();

    // The control socket serves all: the reads, a hold, and relists, each answered
    // with what became of it.
    let mut control = served.control_client().await;
    control.list_pods(v1::ListPodsRequest {}).await.unwrap();
    let (tx, mut answers) = try_hold(&mut control, "u1").await.unwrap();
    held(answer(&mut answers).await);
    assert!(served.pleg.is_held("u1"));
    let r = control
        .request_relist(relist("u1"))
        .await
        .unwrap()
        .into_inner();
    assert!(r.queued);
    assert_eq!(
        r.outcome(),
        v1::RelistRequestOutcome::RelistRequestCoalesced
    );
    drop(tx);
    wait_until("the hold to end", || !served.pleg.is_held("u1")).await;
    let r = control
        .request_relist(relist("u2"))
        .await
        .unwrap()
        .into_inner();
    assert!(r.queued);
    assert_eq!(r.outcome(), v1::RelistRequestOutcome::RelistRequestQueued);
}

#[actix_rt::test]
async fn beyond_the_api_budget_a_relist_request_is_answered_dropped() {
    let served = Served::start_with(
        PlegConfig {
            relist_period: Duration::from_secs(3600),
            api_relist_budget: 1,
            ..PlegConfig::default()
        },
        64,
    );
    wait_until("the first global relist", || served.pleg.health().ready()).await;
    // The first request's read of an unknown pod (the whole sandbox list) waits: its
    // pod keeps the budget's one place meanwhile.
    served.rt.hold(Op::ListSandboxes);
    let mut control = served.control_client().await;
    let first = control
        .request_relist(relist("nobody-1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        first.outcome(),
        v1::RelistRequestOutcome::RelistRequestQueued
    );
    let second = control
        .request_relist(relist("nobody-2"))
        .await
        .unwrap()
        .into_inner();
    assert!(!second.queued);
    assert_eq!(
        second.outcome(),
        v1::RelistRequestOutcome::RelistRequestDropped
    );
    assert_eq!(served.pleg.metrics().refused(Refusal::RelistBudget), 1);
    // The runtime's hints have their own room.
    assert!(served
        .pleg
        .request_relist("nobody-3", plegd_actors::RelistSource::EventedPleg));
    served.rt.release(Op::ListSandboxes);
    wait_until("the place given back", || {
        served.pleg.metrics().requests(
            plegd_telemetry::RequestResult::Done,
            plegd_telemetry::RelistSource::PostAllocation,
        ) == 1
    })
    .await;
    let third = control
        .request_relist(relist("nobody-2"))
        .await
        .unwrap()
        .into_inner();
    assert!(third.queued, "{third:?}");
}

#[actix_rt::test]
async fn a_hold_is_renewed_by_its_holder_and_expires_without_a_renew() {
    let served = Served::start_with(
        PlegConfig {
            relist_period: Duration::from_secs(3600),
            max_sync_hold: Duration::from_millis(1500),
            ..PlegConfig::default()
        },
        64,
    );
    wait_until("the first global relist", || served.pleg.health().ready()).await;
    served.rt.run_pod("u1", "web", "ns");
    let mut control = served.control_client().await;
    let (tx, mut answers) = try_hold(&mut control, "u1").await.unwrap();
    let first = held(answer(&mut answers).await);
    let now = plegd_api::convert::unix_nanos(SystemTime::now());
    assert!(first.expires_at_unix_nano > now, "{first:?}");
    tx.send(renew()).await.unwrap();
    let renewed = held(answer(&mut answers).await);
    assert!(
        renewed.expires_at_unix_nano > first.expires_at_unix_nano,
        "{first:?} then {renewed:?}"
    );
    assert_eq!(renewed.instance_id, served.pleg.instance_id());
    let listed = control
        .list_clients(v1::ListClientsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.holds.len(), 1);
    assert_eq!(
        listed.holds[0].expires_at_unix_nano,
        renewed.expires_at_unix_nano
    );
    // No more renews: plegd ends the hold, says so, and ends the stream.
    match answer(&mut answers).await {
        v1::sync_response::Kind::Released(r) => {
            assert_eq!(r.reason(), v1::SyncEndReason::Expired)
        }
        other => panic!("not released: {other:?}"),
    }
    assert!(tokio::time::timeout(TIMEOUT, answers.message())
        .await
        .unwrap()
        .unwrap()
        .is_none());
    assert!(!served.pleg.is_held("u1"));
    assert_eq!(served.pleg.metrics().sync_holds_expired.get(), 1);
    list_until(&mut control, "the hold unlisted", |l| l.holds.is_empty()).await;
    drop(tx);
}

/// Asks ListClients until `pred` holds for the answer (within the test timeout).
async fn list_until(
    client: &mut Client,
    what: &str,
    pred: impl Fn(&v1::ListClientsResponse) -> bool,
) {
    let deadline = std::time::Instant::now() + TIMEOUT;
    loop {
        let listed = client
            .list_clients(v1::ListClientsRequest {})
            .await
            .unwrap()
            .into_inner();
        if pred(&listed) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}: {listed:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[actix_rt::test]
async fn holds_of_pods_plegd_does_not_know_are_bounded() {
    let served = Served::start_with(
        PlegConfig {
            relist_period: Duration::from_secs(3600),
            max_unknown_holds: 2,
            ..PlegConfig::default()
        },
        64,
    );
    served.rt.run_pod("known", "web", "ns");
    wait_until("the first global relist", || served.pleg.health().ready()).await;
    let mut control = served.control_client().await;
    let mut streams = Vec::new();
    for uid in ["nobody-1", "nobody-2"] {
        let (tx, mut answers) = try_hold(&mut control, uid).await.unwrap();
        held(answer(&mut answers).await);
        streams.push((tx, answers));
    }
    let err = try_hold(&mut control, "nobody-3").await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(!served.pleg.is_held("nobody-3"));
    assert_eq!(served.pleg.metrics().refused(Refusal::UnknownPodHolds), 1);
    // A pod plegd knows is not bounded by it.
    let (_known_tx, mut known) = try_hold(&mut control, "known").await.unwrap();
    held(answer(&mut known).await);
    let listed = control
        .list_clients(v1::ListClientsRequest {})
        .await
        .unwrap()
        .into_inner();
    let known: Vec<(&str, bool)> = listed
        .holds
        .iter()
        .map(|h| (h.pod_uid.as_str(), h.pod_known))
        .collect();
    assert_eq!(
        known,
        [("known", true), ("nobody-1", false), ("nobody-2", false)]
    );
    // One unknown hold ends: its place is free again.
    streams.remove(0);
    wait_until("the hold to end", || !served.pleg.is_held("nobody-1")).await;
    let (_tx, mut answers) = try_hold(&mut control, "nobody-3").await.unwrap();
    held(answer(&mut answers).await);
}

#[actix_rt::test]
async fn list_clients_shows_the_watchers_and_the_holds() {
    let served = Served::start(Duration::from_millis(50), 64);
    wait_until("the first global relist", || served.pleg.health().ready()).await;
    served.rt.run_pod("u1", "web", "ns");
    let mut reader = served.client().await;
    let watching = watch(
        &mut reader,
        v1::WatchRequest {
            namespaces: vec!["kube-system".into()],
            types: vec![v1::EventType::ContainerDied.into()],
            ..Default::default()
        },
    )
    .await;
    let mut control = served.control_client().await;
    let (_tx, mut answers) = try_hold(&mut control, "u1").await.unwrap();
    let h = held(answer(&mut answers).await);
    let listed = reader
        .list_clients(v1::ListClientsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.watchers.len(), 1, "{listed:?}");
    let w = &listed.watchers[0];
    assert_eq!(w.filter, "namespaces=kube-system types=CONTAINER_DIED");
    assert_eq!(w.queue_capacity, 64);
    assert!(w.opened_at_unix_nano > 0 && w.queue_depth <= 64);
    assert_eq!(listed.holds.len(), 1);
    let hold = &listed.holds[0];
    assert_eq!(hold.pod_uid, "u1");
    assert_eq!(hold.expires_at_unix_nano, h.expires_at_unix_nano);
    assert!(hold.held_since_unix_nano <= hold.expires_at_unix_nano);
    drop(watching);
    list_until(&mut reader, "the watcher unlisted", |l| {
        l.watchers.is_empty()
    })
    .await;
}
