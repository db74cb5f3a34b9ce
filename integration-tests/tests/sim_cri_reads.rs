//! The read RPCs plegd uses, through plegd's real CRI client: what is scripted in the
//! FakeRuntime comes back over gRPC, errors keep their codes.

use plegd_runtime::cri;
use plegd_runtime::{ContainerState, PodRef, RuntimeClient, RuntimeError, SandboxState};
use plegd_sim::{FakeRuntime, Op};

use integration_tests::sim::raw_client;
use integration_tests::sim::serve;
use integration_tests::wait::wait_until;

fn pod(uid: &str, name: &str, namespace: &str) -> PodRef {
    PodRef {
        uid: uid.into(),
        name: name.into(),
        namespace: namespace.into(),
    }
}

#[tokio::test]
async fn check_reports_the_simulator() {
    let rt = FakeRuntime::new();
    let (_dir, _server, client) = serve(&rt).await;
    let v = client.check().await.unwrap();
    assert_eq!(v.runtime_name, "plegd-sim");
    assert_eq!(v.runtime_api_version, "v1");
    assert_eq!(rt.calls(Op::Version), 1);
}

#[tokio::test]
async fn lists_and_statuses_round_trip() {
    let rt = FakeRuntime::new();
    let labels: std::collections::BTreeMap<String, String> = [
        ("app".to_string(), "web".to_string()),
        ("tier".to_string(), "front".to_string()),
    ]
    .into();
    let sb1 = rt.run_pod_with_labels("uid-1", "web-1", "ns-1", labels.clone());
    let app = rt.run_container(&sb1, "app");
    let sidecar = rt.run_container(&sb1, "sidecar");
    rt.exit_container(&sidecar, 3);
    let sb2 = rt.run_pod("uid-2", "web-2", "ns-2");
    rt.stop_pod(&sb2);
    let (_dir, _server, client) = serve(&rt).await;

    let mut sandboxes = client.list_sandboxes(None).await.unwrap();
    sandboxes.sort_by(|a, b| a.pod.uid.cmp(&b.pod.uid));
    assert_eq!(sandboxes.len(), 2);
    assert_eq!(sandboxes[0].id, sb1);
    assert_eq!(sandboxes[0].pod, pod("uid-1", "web-1", "ns-1"));
    assert_eq!(sandboxes[0].state, SandboxState::Ready);
    assert!(sandboxes[0].created_at > 0);
    assert_eq!(sandboxes[0].labels, labels);
    assert_eq!(sandboxes[1].id, sb2);
    assert!(sandboxes[1].labels.is_empty());
    assert_eq!(sandboxes[1].pod, pod("uid-2", "web-2", "ns-2"));
    assert_eq!(sandboxes[1].state, SandboxState::NotReady);

    let all = client.list_containers(None).await.unwrap();
    assert_eq!(all.len(), 2);
    let of_sb1 = client.list_containers(Some(&sb1)).await.unwrap();
    assert_eq!(of_sb1, all);
    assert!(client.list_containers(Some(&sb2)).await.unwrap().is_empty());
    let listed_app = all.iter().find(|c| c.id == app).unwrap();
    assert_eq!(listed_app.sandbox_id, sb1);
    assert_eq!(listed_app.name, "app");
    assert_eq!(listed_app.state, ContainerState::Running);
    let listed_sidecar = all.iter().find(|c| c.id == sidecar).unwrap();
    assert_eq!(listed_sidecar.sandbox_id, sb1);
    assert_eq!(listed_sidecar.state, ContainerState::Exited);

    let status = client.sandbox_status(&sb1).await.unwrap();
    assert_eq!(status.id, sb1);
    assert_eq!(status.pod, pod("uid-1", "web-1", "ns-1"));
    assert_eq!(status.state, SandboxState::Ready);
    assert_eq!(status.attempt, 0);
    assert_eq!(status.labels, labels);

    let status = client.container_status(&sidecar).await.unwrap();
    let scripted = rt.container(&sidecar).unwrap();
    assert_eq!(status.id, sidecar);
    assert_eq!(status.name, "sidecar");
    assert_eq!(status.state, ContainerState::Exited);
    assert_eq!(status.exit_code, 3);
    assert_eq!(status.reason, "Error");
    assert_eq!(status.started_at, scripted.started_at);
    assert_eq!(status.finished_at, scripted.finished_at);
    assert!(status.finished_at >= status.started_at && status.started_at > 0);
    // The wire has no sandbox ID: plegd's client leaves it for the caller to fill in.
    assert_eq!(status.sandbox_id, "");
    let status = client.container_status(&app).await.unwrap();
    assert_eq!(status.state, ContainerState::Running);
}

#[tokio::test]
async fn missing_objects_are_not_found() {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("uid-1", "web-1", "ns");
    let c = rt.run_container(&sb, "app");
    let (_dir, _server, client) = serve(&rt).await;
    assert!(client.container_status(&c).await.is_ok());
    rt.remove_container(&c);
    let err = client.container_status(&c).await.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert!(matches!(err, RuntimeError::Rpc { .. }), "{err:?}");
    rt.remove_pod(&sb);
    assert!(client.sandbox_status(&sb).await.unwrap_err().is_not_found());
}

#[tokio::test]
async fn injected_faults_keep_their_codes() {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("uid-1", "web-1", "ns");
    let (_dir, _server, client) = serve(&rt).await;

    rt.fail(Op::ListSandboxes, tonic::Code::Unavailable, Some(1));
    let err = client.list_sandboxes(None).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err}");
    assert_eq!(client.list_sandboxes(None).await.unwrap().len(), 1);

    rt.fail(Op::ListContainers, tonic::Code::ResourceExhausted, None);
    for _ in 0..2 {
        let err = client.list_containers(None).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    }
    rt.clear_failure(Op::ListContainers);
    assert!(client.list_containers(None).await.is_ok());

    rt.fail_pod_status("uid-1", true);
    let err = client.sandbox_status(&sb).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    rt.fail_pod_status("uid-1", false);
    assert!(client.sandbox_status(&sb).await.is_ok());
}

#[tokio::test]
async fn list_filters_are_honoured() {
    let rt = FakeRuntime::new();
    let sb1 = rt.run_pod_with_labels(
        "uid-1",
        "web-1",
        "ns",
        [("app".to_string(), "web".to_string())].into(),
    );
    let sb2 = rt.run_pod("uid-2", "web-2", "ns");
    rt.stop_pod(&sb2);
    let c1 = rt.run_container(&sb1, "app");
    let c2 = rt.create_container(&sb1, "init");
    let (_dir, server, _client) = serve(&rt).await;
    let mut raw = raw_client(server.path());

    let sandboxes = |filter: cri::PodSandboxFilter| {
        let mut raw = raw.clone();
        async move {
            let req = cri::ListPodSandboxRequest {
                filter: Some(filter),
            };
            let items = raw.list_pod_sandbox(req).await.unwrap().into_inner().items;
            items.into_iter().map(|s| s.id).collect::<Vec<_>>()
        }
    };
    assert_eq!(
        sandboxes(cri::PodSandboxFilter {
            id: sb2.clone(),
            ..Default::default()
        })
        .await,
        vec![sb2.clone()]
    );
    assert_eq!(
        sandboxes(cri::PodSandboxFilter {
            state: Some(cri::PodSandboxStateValue {
                state: cri::PodSandboxState::SandboxReady as i32
            }),
            ..Default::default()
        })
        .await,
        vec![sb1.clone()]
    );
    // Every pair of the selector must be among the sandbox's labels.
    assert_eq!(
        sandboxes(cri::PodSandboxFilter {
            label_selector: [("app".to_string(), "web".to_string())].into(),
            ..Default::default()
        })
        .await,
        vec![sb1.clone()]
    );
    assert!(sandboxes(cri::PodSandboxFilter {
        label_selector: [
            ("app".to_string(), "web".to_string()),
            ("tier".to_string(), "db".to_string())
        ]
        .into(),
        ..Default::default()
    })
    .await
    .is_empty());

    let containers = |filter: cri::ContainerFilter| {
        let mut raw = raw.clone();
        async move {
            let req = cri::ListContainersRequest {
                filter: Some(filter),
            };
            let items = raw.list_containers(req).await.unwrap().into_inner();
            items
                .containers
                .into_iter()
                .map(|c| c.id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        containers(cri::ContainerFilter {
            id: c2.clone(),
            ..Default::default()
        })
        .await,
        vec![c2.clone()]
    );
    assert_eq!(
        containers(cri::ContainerFilter {
            state: Some(cri::ContainerStateValue {
                state: cri::ContainerState::ContainerRunning as i32
            }),
            pod_sandbox_id: sb1.clone(),
            ..Default::default()
        })
        .await,
        vec![c1.clone()]
    );
    assert!(containers(cri::ContainerFilter {
        pod_sandbox_id: sb2.clone(),
        ..Default::default()
    })
    .await
    .is_empty());

    // Status: ready; the rest of the API is refused clearly.
    let status = raw
        .status(cri::StatusRequest::default())
        .await
        .unwrap()
        .into_inner();
    let conditions = status.status.unwrap().conditions;
    for kind in ["RuntimeReady", "NetworkReady"] {
        assert!(conditions.iter().any(|c| c.r#type == kind && c.status));
    }
    let err = raw
        .exec_sync(cri::ExecSyncRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented);
    assert!(err.message().contains("ExecSync is not simulated"), "{err}");

    // PodSandboxStatus leaves containers_statuses empty, like containerd 1.7.
    let resp = raw
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: sb1.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(resp.containers_statuses.is_empty());
    assert_eq!(resp.status.unwrap().metadata.unwrap().uid, "uid-1");
}

/// Regression: the global relist's ListPodSandbox and ListContainers were awaited
/// one after the other (two round trips, while targeted requests wait). Either one
/// failing still fails the node's lists.
#[tokio::test]
async fn the_node_lists_are_in_flight_together() {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("uid-1", "web-1", "ns");
    rt.run_container(&sb, "app");
    let (_dir, _server, client) = serve(&rt).await;
    let client = std::sync::Arc::new(client);
    // ListPodSandbox answers only after the client's timeout: one after the other,
    // ListContainers would never be called.
    rt.set_latency(Op::ListSandboxes, std::time::Duration::from_secs(60));
    let lists = tokio::spawn({
        let client = client.clone();
        async move { client.list_node().await.map(|_| ()) }
    });
    wait_until("ListContainers while ListPodSandbox is in flight", || {
        rt.calls(Op::ListContainers) == 1
    })
    .await;
    assert_eq!(rt.calls(Op::ListSandboxes), 1);
    let timed_out = lists.await.expect("the lists' task");
    // Past the request timeout, told as one whichever side enforced it (tonic's own
    // deadline reads "Cancelled: Timeout expired").
    assert!(
        matches!(
            timed_out,
            Err(RuntimeError::Timeout {
                op: "ListPodSandbox",
                ..
            })
        ),
        "{timed_out:?}"
    );
    rt.set_latency(Op::ListSandboxes, std::time::Duration::ZERO);

    rt.fail(Op::ListContainers, tonic::Code::Unavailable, Some(1));
    let err = client.list_node().await.err();
    assert!(
        err.as_ref()
            .is_some_and(|e| e.code() == tonic::Code::Unavailable),
        "{err:?}"
    );
    let lists = client.list_node().await.unwrap();
    let view = lists.view().unwrap();
    assert_eq!((view.sandboxes().len(), view.containers().len()), (1, 1));
}

/// Regression: the targeted relist a stop event asks for read the stopped
/// container's status only after the pod's lists (a second round trip); it now reads
/// it together with them, once, and the death it publishes carries the exit.
#[tokio::test]
async fn a_stopped_containers_status_is_read_together_with_its_pods_lists() {
    use plegd_actors::{EventKind, GenericPleg, RelistScope, RelistSource};

    let rt = FakeRuntime::new();
    let sb = rt.run_pod("uid-1", "web-1", "ns");
    let c = rt.run_container(&sb, "app");
    let (_dir, _server, client) = serve(&rt).await;
    let mut pleg = GenericPleg::new(std::sync::Arc::new(client), 4);
    pleg.relist(&RelistScope::Global, &|_| false).await.unwrap();
    rt.oom_kill_container(&c);
    let statuses = rt.calls(Op::ContainerStatus);
    let lists = rt.calls(Op::ListContainers);
    // ListContainers answers only once the prefetch has been called: one after the
    // other, it would time out and the status would never be read.
    rt.hold(Op::ListContainers);
    let scope = RelistScope::Pod {
        uid: "uid-1".into(),
        source: RelistSource::EventedPleg,
        prefetch: vec![c.clone()],
    };
    let release = async {
        wait_until("ContainerStatus while ListContainers is in flight", || {
            rt.calls(Op::ContainerStatus) == statuses + 1
                && rt.calls(Op::ListContainers) == lists + 1
        })
        .await;
        rt.release(Op::ListContainers);
    };
    let (out, ()) = tokio::join!(pleg.relist(&scope, &|_| false), release);
    let out = out.unwrap();
    let died: Vec<_> = out
        .events
        .iter()
        .filter(|e| e.kind == EventKind::ContainerDied)
        .collect();
    assert_eq!(died.len(), 1, "{:?}", out.events);
    assert_eq!(died[0].container_id, c);
    let exit = died[0].exit.as_ref().expect("the death's exit");
    assert_eq!(
        (exit.code, exit.reason.as_deref()),
        (137, Some("OOMKilled"))
    );
    assert_eq!(
        rt.calls(Op::ContainerStatus),
        statuses + 1,
        "the prefetched status stood in for the read"
    );
    assert_eq!(out.prefetch.used, 1);
}
