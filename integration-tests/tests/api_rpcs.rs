//! The subscriber API's other RPCs, through a real tonic client on a real unix
//! socket, against plegd's actors over the fake runtime: ListPods, GetPodStatus
//! (newer-than released by a targeted relist, a global relist, or the deadline;
//! tombstones), Sync (success, a client killed mid-hold), RequestRelist, and bad
//! requests (malformed, oversized, inconsistent).

use std::time::{Duration, Instant, SystemTime};

use integration_tests::api::*;
use integration_tests::wait::{expect_event, recv_until, wait_until, TIMEOUT};
use plegd_actors::{EventKind, PlegConfig, RelistSource};
use plegd_api::convert::{from_unix_nanos, unix_nanos};
use plegd_api::v1;
use plegd_telemetry::RequestResult;
use prost::bytes::{Buf as _, BufMut as _};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::Code;

/// A long period: only the first global relist and the targeted ones a test asks for.
const NO_GLOBAL: Duration = Duration::from_secs(3600);

/// Waits for the first global relist: with [`NO_GLOBAL`], later changes are read
/// only by the targeted relists a test asks for.
async fn after_first_relist(served: &Served) {
    wait_until("the first global relist", || served.pleg.health().ready()).await;
}

fn running(served: &Served, uid: &str) -> (String, String) {
    let sb = served.rt.run_pod(uid, "web", "ns");
    let c = served.rt.run_container(&sb, "app");
    (sb, c)
}

#[actix_rt::test]
async fn list_pods_answers_the_cache_with_its_revision_node_and_instance() {
    let served = Served::start(Duration::from_millis(20), 64);
    let sub = served.pleg.subscribe("t", 1024).await.unwrap();
    let (_, c1) = running(&served, "u1");
    let sb2 = served.rt.run_pod_with_labels(
        "u2",
        "web",
        "ns",
        [("app".to_string(), "db".to_string())].into(),
    );
    let c2 = served.rt.run_container(&sb2, "app");
    served.rt.exit_container(&c2, 7);
    let mut seen = (false, false);
    let got = recv_until(&sub, "c1 started and c2 died", |d| {
        seen.0 |= d.event.kind == EventKind::ContainerStarted && d.event.container_id == c1;
        seen.1 |= d.event.kind == EventKind::ContainerDied && d.event.container_id == c2;
        seen == (true, true)
    })
    .await;
    let last = got.last().unwrap();
    let mut client = served.client().await;
    let list = client
        .list_pods(v1::ListPodsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(list.revision >= last.event.revision);
    assert_eq!(list.instance_id, served.pleg.instance_id());
    assert_eq!(list.node_name, NODE);
    let mut pods: Vec<_> = list.pods.iter().map(|p| p.pod_uid.as_str()).collect();
    pods.sort();
    assert_eq!(pods, ["u1", "u2"]);
    let u2 = list.pods.iter().find(|p| p.pod_uid == "u2").unwrap();
    assert_eq!(u2.sandboxes[0].sandbox_id, sb2);
    assert_eq!(u2.labels.get("app").map(String::as_str), Some("db"));
    let c = &u2.containers[0];
    assert_eq!(
        (c.container_id.as_str(), c.exit_code),
        (c2.as_str(), Some(7))
    );
    assert_eq!(c.state, i32::from(v1::ContainerState::ContainerExited));
}

async fn status(
    served: &Served,
    uid: &str,
    newer_than: Option<SystemTime>,
    timeout: Duration,
) -> Result<v1::GetPodStatusResponse, tonic::Status> {
    let mut client = served.client().await;
    let mut req = tonic::Request::new(v1::GetPodStatusRequest {
        pod_uid: uid.into(),
        newer_than_unix_nano: newer_than.map(unix_nanos),
    });
    req.set_timeout(timeout);
    client.get_pod_status(req).await.map(|r| r.into_inner())
}

#[actix_rt::test]
async fn newer_than_is_released_by_a_targeted_relist_asked_over_the_api() {
    let served = Served::start(NO_GLOBAL, 64);
    after_first_relist(&served).await;
    running(&served, "u1");
    let mut client = served.control_client().await;
    // The first read of the pod: a targeted relist (no global one for an hour).
    let asked = client
        .request_relist(v1::RequestRelistRequest {
            pod_uid: "u1".into(),
            source: v1::RelistSource::PostAllocation.into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(asked.queued);
    let first = status(&served, "u1", Some(SystemTime::UNIX_EPOCH), TIMEOUT)
        .await
        .unwrap();
    let t = SystemTime::now();
    let waiting = {
        let socket = served.socket.clone();
        tokio::spawn(async move {
            let mut client = plegd_api::connect(&socket).await.unwrap();
            let mut req = tonic::Request::new(v1::GetPodStatusRequest {
                pod_uid: "u1".into(),
                newer_than_unix_nano: Some(unix_nanos(t)),
            });
            req.set_timeout(TIMEOUT);
            let started = Instant::now();
            (client.get_pod_status(req).await, started.elapsed())
        })
    };
    // No global relist for an hour: only this targeted one can release the call.
    client
        .request_relist(v1::RequestRelistRequest {
            pod_uid: "u1".into(),
            source: v1::RelistSource::PostSync.into(),
        })
        .await
        .unwrap();
    let (answer, took) = waiting.await.unwrap();
    let pod = answer.unwrap().into_inner().pod.unwrap();
    assert!(from_unix_nanos(pod.read_at_unix_nano) > t, "a read after t");
    assert!(pod.read_at_unix_nano > first.pod.unwrap().read_at_unix_nano);
    assert!(took < NO_GLOBAL);
}

#[actix_rt::test]
async fn newer_than_is_released_by_a_global_relist_or_ends_at_the_deadline() {
    let served = Served::start(Duration::from_millis(100), 64);
    running(&served, "u1");
    let t = SystemTime::now();
    let answer = status(&served, "u1", Some(t), TIMEOUT).await.unwrap();
    // Released by a relist that began after t (the pod's read may be older: a
    // global relist that found it unchanged covers it).
    assert!(from_unix_nanos(answer.covered_at_unix_nano) > t);
    // An unknown pod: the next global relist says it does not exist.
    let unknown = status(&served, "nope", Some(SystemTime::now()), TIMEOUT)
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
    // No read can be newer than an hour from now: the deadline answers.
    let later = SystemTime::now() + Duration::from_secs(3600);
    let started = Instant::now();
    let timed_out = status(&served, "u1", Some(later), Duration::from_millis(300))
        .await
        .unwrap_err();
    assert_eq!(timed_out.code(), Code::DeadlineExceeded, "{timed_out:?}");
    assert!(
        timed_out.message().contains("no read of pod u1 newer"),
        "{timed_out:?}"
    );
    assert!(started.elapsed() < TIMEOUT);
}

#[actix_rt::test]
async fn a_removed_pod_is_answered_with_its_last_status_until_its_tombstone_expires() {
    let served = Served::start_with(
        PlegConfig {
            relist_period: Duration::from_millis(20),
            tombstone_ttl: Duration::from_millis(500),
            ..PlegConfig::default()
        },
        64,
    );
    let sub = served.pleg.subscribe("t", 1024).await.unwrap();
    let (sb, c) = running(&served, "u1");
    expect_event(&sub, EventKind::ContainerStarted, &c).await;
    served.rt.exit_container(&c, 2);
    expect_event(&sub, EventKind::ContainerDied, &c).await;
    served.rt.remove_pod(&sb);
    expect_event(&sub, EventKind::ContainerRemoved, &c).await;
    let gone = status(&served, "u1", None, TIMEOUT).await.unwrap();
    assert!(gone.removed_at_unix_nano.is_some());
    let pod = gone.pod.unwrap();
    assert_eq!(pod.containers[0].exit_code, Some(2));
    assert_eq!(gone.node_name, NODE);
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match status(&served, "u1", None, TIMEOUT).await {
            Err(s) if s.code() == Code::NotFound => break,
            Ok(_) => assert!(Instant::now() < deadline, "the tombstone never expired"),
            Err(s) => panic!("{s:?}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Opens a Sync for `uid` and waits for `held`; returns the request sender and the
/// answers.
async fn hold(
    client: &mut v1::plegd_client::PlegdClient<tonic::transport::Channel>,
    uid: &str,
) -> (
    mpsc::Sender<v1::SyncRequest>,
    tonic::Streaming<v1::SyncResponse>,
) {
    let (tx, rx) = mpsc::channel(4);
    tx.send(v1::SyncRequest {
        kind: Some(v1::sync_request::Kind::Begin(v1::SyncBegin {
            pod_uid: uid.into(),
        })),
    })
    .await
    .unwrap();
    let mut answers = client
        .sync(ReceiverStream::new(rx))
        .await
        .expect("the sync is accepted")
        .into_inner();
    let first = tokio::time::timeout(TIMEOUT, answers.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        matches!(first.kind, Some(v1::sync_response::Kind::Held(_))),
        "{first:?}"
    );
    (tx, answers)
}

#[actix_rt::test]
async fn a_sync_holds_the_pod_and_success_queues_one_post_sync_relist() {
    let served = Served::start(NO_GLOBAL, 64);
    after_first_relist(&served).await;
    let sub = served.pleg.subscribe("t", 1024).await.unwrap();
    let (_, c) = running(&served, "u1");
    let mut client = served.control_client().await;
    let (tx, mut answers) = hold(&mut client, "u1").await;
    assert!(served.pleg.is_held("u1"));
    // A second holder is refused.
    let (tx2, rx2) = mpsc::channel(1);
    tx2.send(v1::SyncRequest {
        kind: Some(v1::sync_request::Kind::Begin(v1::SyncBegin {
            pod_uid: "u1".into(),
        })),
    })
    .await
    .unwrap();
    let err = client.sync(ReceiverStream::new(rx2)).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    tx.send(v1::SyncRequest {
        kind: Some(v1::sync_request::Kind::End(v1::SyncEnd {
            outcome: v1::SyncOutcome::SyncSuccess.into(),
        })),
    })
    .await
    .unwrap();
    let released = answers.message().await.unwrap().unwrap();
    assert!(matches!(
        released.kind,
        Some(v1::sync_response::Kind::Released(_))
    ));
    assert!(
        answers.message().await.unwrap().is_none(),
        "the stream ends"
    );
    let d = expect_event(&sub, EventKind::ContainerStarted, &c).await;
    assert_eq!(d.event.relist_source, RelistSource::PostSync);
    assert!(!served.pleg.is_held("u1"));
}

#[actix_rt::test]
async fn a_sync_client_killed_mid_hold_releases_the_pod_with_one_relist() {
    let served = Served::start(NO_GLOBAL, 64);
    after_first_relist(&served).await;
    let sub = served.pleg.subscribe("t", 1024).await.unwrap();
    let (_, c) = running(&served, "u1");
    let mut other = served.control_client().await;
    other
        .request_relist(v1::RequestRelistRequest {
            pod_uid: "u1".into(),
            source: v1::RelistSource::PostAllocation.into(),
        })
        .await
        .unwrap();
    expect_event(&sub, EventKind::ContainerStarted, &c).await;
    let (mut worker, killer) = served.killable_client().await;
    let (_tx, _answers) = hold(&mut worker, "u1").await;
    assert!(served.pleg.is_held("u1"));
    // While held: the container dies, and relists are asked for twice; they wait.
    served.rt.exit_container(&c, 137);
    for _ in 0..2 {
        let r = other
            .request_relist(v1::RequestRelistRequest {
                pod_uid: "u1".into(),
                source: v1::RelistSource::PostSync.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(r.queued);
    }
    let metrics = served.pleg.metrics().clone();
    assert_eq!(
        metrics.requests(RequestResult::Coalesced, RelistSource::PostSync),
        2
    );
    assert!(sub.try_recv().is_err(), "nothing published while held");
    killer.kill();
    wait_until("the hold to end", || !served.pleg.is_held("u1")).await;
    let d = expect_event(&sub, EventKind::ContainerDied, &c).await;
    assert_eq!(d.event.relist_source, RelistSource::PostSync);
    assert_eq!(d.event.exit.as_ref().map(|x| x.code), Some(137));
    // Exactly one relist queued by the release.
    assert_eq!(
        metrics.requests(RequestResult::Queued, RelistSource::PostSync),
        1
    );
    wait_until("the relist done", || {
        metrics.requests(RequestResult::Done, RelistSource::PostSync) == 1
    })
    .await;
    // And nothing more comes of it: a later targeted relist of another pod runs and
    // the count stays.
    let (_, c2) = running(&served, "u2");
    other
        .request_relist(v1::RequestRelistRequest {
            pod_uid: "u2".into(),
            source: v1::RelistSource::PostAllocation.into(),
        })
        .await
        .unwrap();
    expect_event(&sub, EventKind::ContainerStarted, &c2).await;
    assert_eq!(
        metrics.requests(RequestResult::Done, RelistSource::PostSync),
        1
    );
}

/// Raw bytes as a request, whatever the method: for malformed and oversized ones.
#[derive(Clone, Copy, Default)]
struct Raw;

impl tonic::codec::Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl tonic::codec::Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        dst: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), Self::Error> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl tonic::codec::Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        src: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, Self::Error> {
        let mut out = Vec::new();
        while src.has_remaining() {
            let chunk = src.chunk();
            out.extend_from_slice(chunk);
            let n = chunk.len();
            src.advance(n);
        }
        Ok(Some(out))
    }
}

async fn raw_call(served: &Served, method: &'static str, body: Vec<u8>) -> tonic::Status {
    let channel = tonic::transport::Endpoint::from_static("http://plegd.local")
        .connect_with_connector(tower::service_fn({
            let socket = served.socket.clone();
            move |_: tonic::transport::Uri| {
                let socket = socket.clone();
                async move {
                    tokio::net::UnixStream::connect(socket)
                        .await
                        .map(hyper_util::rt::TokioIo::new)
                }
            }
        }))
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = PathAndQuery::from_static(method);
    if method.ends_with("/Watch") {
        match grpc
            .server_streaming(tonic::Request::new(body), path, Raw)
            .await
        {
            Ok(mut s) => s.get_mut().message().await.expect_err("refused"),
            Err(s) => s,
        }
    } else {
        grpc.unary(tonic::Request::new(body), path, Raw)
            .await
            .unwrap_err()
    }
}

#[actix_rt::test]
async fn malformed_oversized_and_inconsistent_requests_are_invalid_arguments() {
    let served = Served::start(Duration::from_millis(50), 64);
    // Bytes that are no protobuf (a truncated varint), and messages over 64 KiB.
    let garbage = vec![0x0a, 0xff, 0xff, 0xff];
    let mut oversized = vec![0x0a, 0x80, 0xa2, 0x04]; // field 1, 70,000 bytes long
    oversized.extend(std::iter::repeat_n(b'x', 70_000));
    for method in [
        "/plegd.v1.Plegd/ListPods",
        "/plegd.v1.Plegd/GetPodStatus",
        "/plegd.v1.Plegd/RequestRelist",
        "/plegd.v1.Plegd/Watch",
    ] {
        for body in [&garbage, &oversized] {
            let status = raw_call(&served, method, body.clone()).await;
            assert_eq!(status.code(), Code::InvalidArgument, "{method}: {status:?}");
        }
    }
    let mut client = served.control_client().await;
    for (req, says) in [
        (
            v1::WatchRequest {
                label_selector: "app in (web)".into(),
                ..Default::default()
            },
            "label selector",
        ),
        (
            v1::WatchRequest {
                send_initial_events: true,
                since_revision: Some(1),
                ..Default::default()
            },
            "exclude each other",
        ),
        (
            v1::WatchRequest {
                types: vec![9],
                ..Default::default()
            },
            "unknown event type",
        ),
        (
            v1::WatchRequest {
                bookmark_interval_seconds: 100_000,
                ..Default::default()
            },
            "bookmark_interval_seconds",
        ),
    ] {
        let status = client.watch(req).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().contains(says), "{status:?}");
    }
    let status = client
        .request_relist(v1::RequestRelistRequest {
            pod_uid: "u1".into(),
            source: v1::RelistSource::Global.into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let status = client
        .get_pod_status(v1::GetPodStatusRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    // Sync: a first message that is not begin; an oversized one mid-hold (which
    // ends the hold as cancelled).
    let (tx, rx) = mpsc::channel(2);
    tx.send(v1::SyncRequest {
        kind: Some(v1::sync_request::Kind::End(v1::SyncEnd { outcome: 1 })),
    })
    .await
    .unwrap();
    let status = client.sync(ReceiverStream::new(rx)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    running(&served, "u1");
    let (tx, mut answers) = hold(&mut client, "u1").await;
    tx.send(v1::SyncRequest {
        kind: Some(v1::sync_request::Kind::Begin(v1::SyncBegin {
            pod_uid: "x".repeat(70_000),
        })),
    })
    .await
    .unwrap();
    let status = answers.message().await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    wait_until("the hold to end", || !served.pleg.is_held("u1")).await;
    // The server is fine after all that.
    client.list_pods(v1::ListPodsRequest {}).await.unwrap();
}

#[actix_rt::test]
async fn connections_beyond_the_limit_wait_until_one_closes() {
    let served = Served::start_limited(
        PlegConfig {
            relist_period: Duration::from_millis(50),
            ..PlegConfig::default()
        },
        64,
        2,
    );
    let mut first = served.client().await;
    let mut second = served.client().await;
    first.list_pods(v1::ListPodsRequest {}).await.unwrap();
    second.list_pods(v1::ListPodsRequest {}).await.unwrap();
    // The third connects but is not served while two are open: its handshake waits,
    // or, once done, the connection is closed at once (api/src/incoming.rs) — which of
    // the two a client sees depends on how fast the server gets to it.
    let mut third = served.client().await;
    let mut req = tonic::Request::new(v1::ListPodsRequest {});
    req.set_timeout(Duration::from_millis(500));
    let waiting = third.list_pods(req).await.unwrap_err();
    assert!(
        matches!(
            waiting.code(),
            Code::Cancelled | Code::Unknown | Code::Unavailable
        ),
        "{waiting:?}"
    );
    drop(first);
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let mut req = tonic::Request::new(v1::ListPodsRequest {});
        req.set_timeout(Duration::from_millis(500));
        match third.list_pods(req).await {
            Ok(_) => break,
            Err(s) => assert!(Instant::now() < deadline, "never served: {s:?}"),
        }
    }
    second.list_pods(v1::ListPodsRequest {}).await.unwrap();
}
