//! Runtime restarts (a server shut down and a new one started on the same path over
//! the same runtime), the threaded server, and endpoints that are not a CRI server.

use std::time::{Duration, Instant};

use futures::StreamExt;
use plegd_runtime::CriRuntime;
use plegd_runtime::{RuntimeClient, RuntimeError};
use plegd_sim::{serve_unix, spawn_in_thread, FakeRuntime, SimError};

use integration_tests::sim::serve;
use integration_tests::sim::socket_in;
use integration_tests::sim::REQUEST_TIMEOUT;
use integration_tests::wait::TIMEOUT;

#[tokio::test]
async fn restart_keeps_state_and_the_client_recovers() {
    let rt = FakeRuntime::new();
    let (dir, server, client) = serve(&rt).await;
    let path = socket_in(&dir);
    let sb = rt.run_pod("uid-1", "web-1", "ns");
    assert_eq!(client.list_sandboxes(None).await.unwrap().len(), 1);
    let mut old_events = client.container_events().await.unwrap();

    server.shutdown().await;
    assert!(!path.exists());
    let err = client.list_sandboxes(None).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable, "{err}");
    // The runtime keeps changing while its server is down.
    let c = rt.run_container(&sb, "app");

    let _server = serve_unix(&path, rt.clone()).await.unwrap();
    // The same client reconnects lazily; its first call may still see the old
    // connection's failure.
    let deadline = Instant::now() + TIMEOUT;
    let sandboxes = loop {
        match client.list_sandboxes(None).await {
            Ok(s) => break s,
            Err(e) => assert!(Instant::now() < deadline, "no recovery: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(sandboxes.len(), 1);
    assert_eq!(sandboxes[0].id, sb);
    let containers = client.list_containers(Some(&sb)).await.unwrap();
    assert_eq!(containers.len(), 1);
    assert_eq!(containers[0].id, c);

    // The old stream is over; a new one works.
    let end = tokio::time::timeout(TIMEOUT, old_events.next())
        .await
        .unwrap();
    assert!(!matches!(end, Some(Ok(_))), "{end:?}");
    let mut events = client.container_events().await.unwrap();
    rt.exit_container(&c, 0);
    let ev = tokio::time::timeout(TIMEOUT, events.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(ev.container_id, c);
}

#[tokio::test]
async fn a_second_server_on_a_live_socket_is_refused() {
    let rt = FakeRuntime::new();
    let (dir, _server, client) = serve(&rt).await;
    let err = serve_unix(&socket_in(&dir), rt.clone()).await.err();
    assert!(matches!(err, Some(SimError::InUse { .. })), "{err:?}");
    // The refused server did not remove the live one's socket.
    assert!(client.check().await.is_ok());
    let missing = dir.path().join("no-such-dir").join("cri.sock");
    let err = serve_unix(&missing, rt).await.err();
    assert!(
        matches!(err, Some(SimError::MissingDirectory { .. })),
        "{err:?}"
    );
}

#[test]
fn threaded_server_serves_without_a_caller_runtime() {
    let rt = FakeRuntime::new();
    rt.run_pod("uid-1", "web-1", "ns");
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let client_rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();

    let server = spawn_in_thread(&path, rt.clone()).unwrap();
    let endpoint = server.endpoint();
    assert_eq!(endpoint, format!("unix://{}", path.display()));
    let client = client_rt.block_on(async { CriRuntime::new(&endpoint, REQUEST_TIMEOUT).unwrap() });
    let v = client_rt.block_on(client.check()).unwrap();
    assert_eq!(v.runtime_name, "plegd-sim");
    let started = Instant::now();
    server.stop();
    assert!(started.elapsed() < Duration::from_secs(2), "stop is slow");
    assert!(!path.exists());

    // Restart on the same path; the same client recovers.
    let server = spawn_in_thread(&path, rt.clone()).unwrap();
    let deadline = Instant::now() + TIMEOUT;
    let sandboxes = loop {
        match client_rt.block_on(client.list_sandboxes(None)) {
            Ok(s) => break s,
            Err(e) => assert!(Instant::now() < deadline, "no recovery: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(sandboxes.len(), 1);
    // A crash: the open stream fails, the socket goes.
    let mut events = client_rt.block_on(client.container_events()).unwrap();
    let started = Instant::now();
    server.kill();
    assert!(started.elapsed() < Duration::from_secs(2), "kill is slow");
    assert!(!path.exists());
    let end = client_rt
        .block_on(async { tokio::time::timeout(TIMEOUT, events.next()).await })
        .expect("the stream outlived the server");
    assert!(!matches!(end, Some(Ok(_))), "{end:?}");

    // Dropping the handle stops the server too, even with a client that is not
    // being polled meanwhile (it cannot help drain its connection).
    let server = spawn_in_thread(&path, rt.clone()).unwrap();
    let deadline = Instant::now() + TIMEOUT;
    while let Err(e) = client_rt.block_on(client.version()) {
        assert!(Instant::now() < deadline, "no recovery: {e}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let started = Instant::now();
    drop(server);
    assert!(started.elapsed() < Duration::from_secs(2), "stop is slow");
    assert!(!path.exists());

    let err = spawn_in_thread(&dir.path().join("missing").join("cri.sock"), rt).err();
    assert!(
        matches!(err, Some(SimError::MissingDirectory { .. })),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_missing_socket_is_unreachable() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("unix://{}", socket_in(&dir).display());
    let client = CriRuntime::new(&endpoint, REQUEST_TIMEOUT).unwrap();
    let err = client.check().await.unwrap_err();
    assert!(matches!(err, RuntimeError::Unreachable { .. }), "{err:?}");
}

#[tokio::test]
async fn a_socket_that_is_not_grpc_fails_fast() {
    let dir = tempfile::tempdir().unwrap();
    let path = socket_in(&dir);
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let acceptor = tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            drop(conn);
        }
    });
    let client = CriRuntime::new(&format!("unix://{}", path.display()), REQUEST_TIMEOUT).unwrap();
    let started = Instant::now();
    let result = tokio::time::timeout(TIMEOUT, client.check())
        .await
        .expect("check() hangs on a non-gRPC socket");
    let err = result.unwrap_err();
    assert!(matches!(err, RuntimeError::Unreachable { .. }), "{err:?}");
    // Bounded by the request timeout, with slack for a slow machine.
    assert!(started.elapsed() < REQUEST_TIMEOUT + Duration::from_secs(1));
    acceptor.abort();
}
