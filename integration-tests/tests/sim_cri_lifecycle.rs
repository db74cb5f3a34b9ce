//! The lifecycle RPCs: a CRI client drives the simulator as kubelet drives containerd.

use plegd_runtime::cri;
use plegd_runtime::{ContainerState, RuntimeClient};
use plegd_sim::{FakeRuntime, STOP_EXIT_CODE};

use integration_tests::sim::raw_client;
use integration_tests::sim::serve;

fn pod_config(uid: &str) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: "web-1".into(),
            uid: uid.into(),
            namespace: "ns".into(),
            attempt: 0,
        }),
        labels: [("app".to_string(), "web".to_string())].into(),
        ..Default::default()
    }
}

fn create_request(sandbox: &str, name: &str, uid: Option<&str>) -> cri::CreateContainerRequest {
    cri::CreateContainerRequest {
        pod_sandbox_id: sandbox.into(),
        config: Some(cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            ..Default::default()
        }),
        sandbox_config: uid.map(pod_config),
    }
}

#[tokio::test]
async fn a_cri_client_drives_the_simulator() {
    let rt = FakeRuntime::new();
    let (_dir, server, client) = serve(&rt).await;
    let mut raw = raw_client(server.path());

    let sb = raw
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(pod_config("uid-1")),
            runtime_handler: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    assert_eq!(rt.sandboxes_of("uid-1"), vec![sb.clone()]);
    // The pod's labels, as kubelet passes them, are the sandbox's.
    assert_eq!(
        rt.sandbox(&sb).map(|s| s.labels),
        Some([("app".to_string(), "web".to_string())].into())
    );

    let c = raw
        .create_container(create_request(&sb, "app", Some("uid-1")))
        .await
        .unwrap()
        .into_inner()
        .container_id;
    assert_eq!(rt.container(&c).unwrap().state, ContainerState::Created);
    raw.start_container(cri::StartContainerRequest {
        container_id: c.clone(),
    })
    .await
    .unwrap();
    assert_eq!(rt.container(&c).unwrap().state, ContainerState::Running);
    // Only a created container starts.
    let err = raw
        .start_container(cri::StartContainerRequest {
            container_id: c.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);

    // StopContainer is idempotent.
    for _ in 0..2 {
        raw.stop_container(cri::StopContainerRequest {
            container_id: c.clone(),
            timeout: 10,
        })
        .await
        .unwrap();
    }
    let status = client.container_status(&c).await.unwrap();
    assert_eq!(status.state, ContainerState::Exited);
    assert_eq!(status.exit_code, STOP_EXIT_CODE);

    // Without sandbox_config the existence check falls to the runtime itself.
    let c2 = raw
        .create_container(create_request(&sb, "app", None))
        .await
        .unwrap()
        .into_inner()
        .container_id;
    assert_eq!(rt.container(&c2).unwrap().attempt, 1);
    raw.start_container(cri::StartContainerRequest {
        container_id: c2.clone(),
    })
    .await
    .unwrap();

    // RemoveContainer is idempotent and kills a running container first.
    for _ in 0..2 {
        raw.remove_container(cri::RemoveContainerRequest {
            container_id: c2.clone(),
        })
        .await
        .unwrap();
    }
    assert!(rt.container(&c2).is_none());

    for _ in 0..2 {
        raw.stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: sb.clone(),
        })
        .await
        .unwrap();
    }
    assert_eq!(
        client.sandbox_status(&sb).await.unwrap().state,
        plegd_runtime::SandboxState::NotReady
    );
    for _ in 0..2 {
        raw.remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: sb.clone(),
        })
        .await
        .unwrap();
    }
    assert_eq!(rt.pod_count(), 0);
    assert!(rt.container(&c).is_none());
}

#[tokio::test]
async fn bad_lifecycle_requests_are_refused() {
    let rt = FakeRuntime::new();
    let (_dir, server, client) = serve(&rt).await;
    let mut raw = raw_client(server.path());

    let err = raw
        .run_pod_sandbox(cri::RunPodSandboxRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    for uid in [Some("uid-x"), None] {
        let err = raw
            .create_container(create_request("no-such-sandbox", "app", uid))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::NotFound, "{err}");
    }
    let err = raw
        .start_container(cri::StartContainerRequest {
            container_id: "no-such-container".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    let err = raw
        .stop_container(cri::StopContainerRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    // The server survived all of that.
    assert_eq!(client.check().await.unwrap().runtime_name, "plegd-sim");
}
