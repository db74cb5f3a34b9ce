//! GetPodStatus says which relist covered its answer (`covered_by`) and when that
//! relist began (`covered_at_unix_nano`): with `newer_than`, always after it — a
//! targeted relist that read the pod, or a global relist that found it unchanged
//! (kubelet's semantics: then the pod's `read_at` may be older than `newer_than`).

use std::time::{Duration, SystemTime};

use integration_tests::api::*;
use integration_tests::wait::{expect_event, wait_until, TIMEOUT};
use plegd_actors::EventKind;
use plegd_api::convert::{from_unix_nanos, unix_nanos};
use plegd_api::v1;

/// A long period: only the first global relist and the targeted ones a test asks for.
const NO_GLOBAL: Duration = Duration::from_secs(3600);

async fn status(
    served: &Served,
    uid: &str,
    newer_than: SystemTime,
) -> Result<v1::GetPodStatusResponse, tonic::Status> {
    let mut client = served.client().await;
    let mut req = tonic::Request::new(v1::GetPodStatusRequest {
        pod_uid: uid.into(),
        newer_than_unix_nano: Some(unix_nanos(newer_than)),
    });
    req.set_timeout(TIMEOUT);
    client.get_pod_status(req).await.map(|r| r.into_inner())
}

fn covered_by(answer: &v1::GetPodStatusResponse) -> v1::RelistSource {
    v1::RelistSource::try_from(answer.covered_by).unwrap_or(v1::RelistSource::Unspecified)
}

/// Nothing changes: every answer is released by a global relist that did not read the
/// pod again, and says so; covered_at is after newer_than, read_at is not. A removed
/// pod: the read that found it gone, then the global relists after it.
#[actix_rt::test]
async fn a_global_relist_that_found_the_pod_unchanged_covers_it_and_says_so() {
    let served = Served::start(Duration::from_millis(30), 64);
    let sub = served.pleg.subscribe("t", 1024).await.unwrap();
    let sb = served.rt.run_pod("u1", "web", "ns");
    let c = served.rt.run_container(&sb, "app");
    expect_event(&sub, EventKind::ContainerStarted, &c).await;
    for _ in 0..10 {
        let t = SystemTime::now();
        let answer = status(&served, "u1", t).await.unwrap();
        let read_at = answer.pod.as_ref().unwrap().read_at_unix_nano;
        assert!(
            from_unix_nanos(answer.covered_at_unix_nano) > t,
            "covered at {} for newer than {}",
            answer.covered_at_unix_nano,
            unix_nanos(t)
        );
        assert!(from_unix_nanos(read_at) < t, "the pod was not read again");
        assert_eq!(covered_by(&answer), v1::RelistSource::Global);
    }
    served.rt.remove_pod(&sb);
    expect_event(&sub, EventKind::ContainerRemoved, &c).await;
    let t = SystemTime::now();
    let gone = status(&served, "u1", t).await.unwrap();
    assert!(gone.removed_at_unix_nano.is_some());
    assert!(from_unix_nanos(gone.covered_at_unix_nano) > t);
    assert_eq!(covered_by(&gone), v1::RelistSource::Global);
}

/// No global relist for an hour: the targeted relist that read the pod covers the
/// answer, at that read's start.
#[actix_rt::test]
async fn a_targeted_relist_that_read_the_pod_covers_it_at_its_read() {
    let served = Served::start(NO_GLOBAL, 64);
    wait_until("the first global relist", || served.pleg.health().ready()).await;
    let sb = served.rt.run_pod("u1", "web", "ns");
    served.rt.run_container(&sb, "app");
    let mut client = served.control_client().await;
    for source in [
        v1::RelistSource::PostAllocation,
        v1::RelistSource::PostSync,
        v1::RelistSource::PostSync,
    ] {
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
                client.get_pod_status(req).await
            })
        };
        client
            .request_relist(v1::RequestRelistRequest {
                pod_uid: "u1".into(),
                source: source.into(),
            })
            .await
            .unwrap();
        let answer = waiting.await.unwrap().unwrap().into_inner();
        let read_at = answer.pod.as_ref().unwrap().read_at_unix_nano;
        assert!(from_unix_nanos(answer.covered_at_unix_nano) > t);
        assert_eq!(answer.covered_at_unix_nano, read_at);
        assert_eq!(covered_by(&answer), source);
    }
    // Without newer_than: the last cover all the same.
    let mut req = tonic::Request::new(v1::GetPodStatusRequest {
        pod_uid: "u1".into(),
        newer_than_unix_nano: None,
    });
    req.set_timeout(TIMEOUT);
    let answer = client.get_pod_status(req).await.unwrap().into_inner();
    assert_eq!(covered_by(&answer), v1::RelistSource::PostSync);
}
