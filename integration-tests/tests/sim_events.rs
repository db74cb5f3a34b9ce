//! GetContainerEvents through plegd's client: containerd-shaped events, and streams
//! that end when the server goes.

use std::time::Duration;

use futures::StreamExt;
use plegd_runtime::cri;
use plegd_runtime::{EventStream, RuntimeClient};
use plegd_sim::FakeRuntime;

use integration_tests::sim::{raw_client, serve};
use integration_tests::wait::wait_until;
use integration_tests::wait::TIMEOUT;

async fn next_event(events: &mut EventStream) -> cri::ContainerEventResponse {
    tokio::time::timeout(TIMEOUT, events.next())
        .await
        .expect("no event in time")
        .expect("stream ended")
        .expect("stream failed")
}

async fn next_raw(
    events: &mut tonic::Streaming<cri::ContainerEventResponse>,
) -> cri::ContainerEventResponse {
    tokio::time::timeout(TIMEOUT, events.next())
        .await
        .expect("no event in time")
        .expect("stream ended")
        .expect("stream failed")
}

#[tokio::test]
async fn events_carry_the_pod_identity() {
    let rt = FakeRuntime::new();
    let (_dir, server, client) = serve(&rt).await;
    let mut events = client.container_events().await.unwrap();
    assert_eq!(rt.event_streams(), 1);
    // The same stream decoded whole, as the wire carries it.
    let mut raw = raw_client(server.path())
        .get_container_events(cri::GetEventsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rt.event_streams(), 2);

    let sb = rt.run_pod("uid-1", "web-1", "ns");
    let c = rt.run_container(&sb, "app");
    rt.exit_container(&c, 1);

    use cri::ContainerEventType::*;
    let expected = [
        (&sb, ContainerCreatedEvent),
        (&sb, ContainerStartedEvent),
        (&c, ContainerCreatedEvent),
        (&c, ContainerStartedEvent),
        (&c, ContainerStoppedEvent),
    ];
    for (id, kind) in expected {
        let ev = next_event(&mut events).await;
        let whole = next_raw(&mut raw).await;
        assert_eq!(
            (&whole.container_id, whole.container_event_type),
            (id, kind as i32)
        );
        assert_eq!(&ev.container_id, id);
        assert_eq!(ev.container_event_type, kind as i32);
        let status = ev.pod_sandbox_status.expect("pod_sandbox_status");
        assert_eq!(status.id, sb);
        let meta = status.metadata.expect("metadata");
        assert_eq!((meta.uid.as_str(), meta.name.as_str()), ("uid-1", "web-1"));
    }
    // The last event shows the container's exit on the wire, as containerd 2.x sends
    // it; plegd's client reads only what a hint uses (`event_read`), not the statuses.
    rt.remove_container(&c);
    let whole = next_raw(&mut raw).await;
    assert_eq!(whole.container_event_type, ContainerDeletedEvent as i32);
    assert_eq!(whole.containers_statuses.len(), 1);
    assert_eq!(whole.containers_statuses[0].exit_code, 1);
    let ev = next_event(&mut events).await;
    assert_eq!(ev.container_event_type, ContainerDeletedEvent as i32);
    assert_eq!(ev.container_id, c);
    assert!(ev.containers_statuses.is_empty());

    drop((events, raw));
    wait_until("the server to drop its subscription", || {
        rt.event_streams() == 0
    })
    .await;
}

#[tokio::test]
async fn shutdown_ends_open_streams() {
    let rt = FakeRuntime::new();
    let (_dir, server, client) = serve(&rt).await;
    let path = server.path().to_path_buf();
    let mut events = client.container_events().await.unwrap();

    let shutdown = tokio::spawn(server.shutdown());
    match tokio::time::timeout(TIMEOUT, events.next()).await {
        Err(_) => panic!("the stream outlived the server"),
        Ok(Some(Ok(ev))) => panic!("unexpected event {ev:?}"),
        Ok(Some(Err(e))) => assert_eq!(e.code(), tonic::Code::Unavailable, "{e}"),
        Ok(None) => {}
    }
    tokio::time::timeout(TIMEOUT, shutdown)
        .await
        .expect("shutdown hangs")
        .unwrap();
    assert!(!path.exists(), "the socket outlived the server");
    assert_eq!(rt.event_streams(), 0);
    assert!(client.list_sandboxes(None).await.is_err());
}

#[tokio::test]
async fn dropping_the_server_ends_open_streams() {
    let rt = FakeRuntime::new();
    let (_dir, server, client) = serve(&rt).await;
    let path = server.path().to_path_buf();
    let mut events = client.container_events().await.unwrap();
    drop(server);
    assert!(!path.exists(), "the socket outlived the server");
    let end = tokio::time::timeout(TIMEOUT, events.next())
        .await
        .expect("the stream outlived the server");
    assert!(!matches!(end, Some(Ok(_))), "{end:?}");
    wait_until("the server to drop its subscription", || {
        rt.event_streams() == 0
    })
    .await;
}

#[tokio::test]
async fn a_slow_unary_call_does_not_block_a_stream() {
    // Latency on one call must not stall events on the other channel.
    let rt = FakeRuntime::new();
    rt.set_latency(plegd_sim::Op::ListSandboxes, Duration::from_secs(2));
    let (_dir, _server, client) = serve(&rt).await;
    let mut events = client.container_events().await.unwrap();
    let slow = {
        let client = client.clone();
        tokio::spawn(async move { client.list_sandboxes(None).await })
    };
    wait_until("the slow call to reach the runtime", || {
        rt.calls(plegd_sim::Op::ListSandboxes) == 1
    })
    .await;
    rt.run_pod("uid-1", "web-1", "ns");
    let ev = next_event(&mut events).await;
    assert!(!slow.is_finished(), "the event waited for the slow call");
    assert_eq!(
        ev.pod_sandbox_status.unwrap().metadata.unwrap().uid,
        "uid-1"
    );
    slow.abort();
}
