//! A node larger than one list message, through plegd's real client and the simulated
//! runtime's gRPC server. A runtime refuses to send a response over its own send limit
//! (containerd's default: 16 MiB, 10,000 to 20,000 pods with kubelet's metadata): the
//! error must say which call hit whose limit. CRI's streaming list calls
//! (StreamPodSandboxes, StreamContainers) carry a node of any size: plegd uses them
//! when the runtime offers them and falls back to the unary lists, for good, when it
//! answers UNIMPLEMENTED. Here the node is small and the sim's send limit smaller, so
//! the same paths run in milliseconds.

use integration_tests::sim::{serve, REQUEST_TIMEOUT};
use plegd_runtime::{cri, CriRuntime, ListMemo, NodeLists, RuntimeClient, RuntimeError};
use plegd_sim::kubelet::{self, Kubelet};
use plegd_sim::{FakeRuntime, ListServing, ListStreamCalls};
use prost::Message;

const PODS: usize = 120;

/// A node of [`PODS`] kubelet-dressed pods of 2 containers each; the encoded sizes of
/// its ListPodSandbox and ListContainers responses.
async fn kubelet_node() -> (FakeRuntime, usize, usize) {
    let rt = FakeRuntime::with_kubelet(Kubelet {
        heavy_every: 0,
        heavy_bytes: 0,
    });
    kubelet::run_deployment_pods(&rt, PODS, "ns", |i| format!("uid-{i}"), &["app", "sidecar"]);
    let sandboxes = rt.list_sandboxes(None).await.expect("the fake's sandboxes");
    let containers = rt
        .list_containers(None)
        .await
        .expect("the fake's containers");
    let sandboxes_len = cri::ListPodSandboxResponse {
        items: rt.sandboxes_to_wire(&sandboxes),
    }
    .encoded_len();
    let containers_len = cri::ListContainersResponse {
        containers: rt.containers_to_wire(&containers),
    }
    .encoded_len();
    assert!(
        sandboxes_len < containers_len,
        "{sandboxes_len} {containers_len}"
    );
    (rt, sandboxes_len, containers_len)
}

/// A send limit between the two lists' sizes: ListContainers is over it, ListPodSandbox
/// is not.
fn between(sandboxes_len: usize, containers_len: usize) -> usize {
    (sandboxes_len + containers_len) / 2
}

/// The entries of `lists`, owned and sorted by ID: a sandbox listed without its labels
/// (the memo vouched for it) with the labels `truth` has for it, and the IDs of those.
fn entries_labeled(
    lists: &NodeLists,
    truth: &[plegd_runtime::Sandbox],
) -> (
    (Vec<plegd_runtime::Sandbox>, Vec<plegd_runtime::Container>),
    Vec<String>,
) {
    let view = lists.view().expect("valid lists");
    let mut unlabeled = Vec::new();
    let mut sandboxes: Vec<_> = view
        .sandboxes()
        .iter()
        .map(|s| {
            let (mut sandbox, labeled) = s.to_sandbox().expect("labels");
            if !labeled {
                assert!(sandbox.labels.is_empty(), "{sandbox:?}");
                unlabeled.push(sandbox.id.clone());
                if let Some(t) = truth.iter().find(|t| t.id == sandbox.id) {
                    sandbox.labels = t.labels.clone();
                }
            }
            sandbox
        })
        .collect();
    let mut containers: Vec<_> = view.containers().iter().map(|c| c.to_container()).collect();
    sandboxes.sort_by(|a, b| a.id.cmp(&b.id));
    containers.sort_by(|a, b| a.id.cmp(&b.id));
    unlabeled.sort();
    ((sandboxes, containers), unlabeled)
}

/// The entries of `lists` (every sandbox with its labels), owned and sorted by ID.
fn entries(lists: &NodeLists) -> (Vec<plegd_runtime::Sandbox>, Vec<plegd_runtime::Container>) {
    let (entries, unlabeled) = entries_labeled(lists, &[]);
    assert_eq!(unlabeled, Vec::<String>::new(), "every label read");
    entries
}

/// What the runtime holds, as `entries` gives it.
async fn truth(rt: &FakeRuntime) -> (Vec<plegd_runtime::Sandbox>, Vec<plegd_runtime::Container>) {
    let mut sandboxes = rt.list_sandboxes(None).await.expect("sandboxes");
    let mut containers = rt.list_containers(None).await.expect("containers");
    sandboxes.sort_by(|a, b| a.id.cmp(&b.id));
    containers.sort_by(|a, b| a.id.cmp(&b.id));
    (sandboxes, containers)
}

/// `err` says a streamed message was over the runtime's send limit `limit`.
fn over_the_runtimes_stream_limit(err: &RuntimeError, limit: usize) {
    assert!(
        matches!(
            err,
            RuntimeError::RuntimeTooLarge { op: "StreamPodSandboxes" | "StreamContainers", limit: Some(l), .. }
                if *l == limit
        ),
        "{err:?}"
    );
}

/// `err` says a streamed message was over plegd's receive limit `limit`.
fn over_plegds_stream_limit(err: &RuntimeError, limit: usize) {
    assert!(
        matches!(
            err,
            RuntimeError::TooLarge { op: "StreamPodSandboxes" | "StreamContainers", limit: l, .. }
                if *l == limit
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_list_over_the_runtimes_send_limit_names_the_call_and_the_runtimes_limit() {
    let (rt, sandboxes_len, containers_len) = kubelet_node().await;
    let limit = between(sandboxes_len, containers_len);
    rt.set_list_serving(ListServing {
        send_limit: Some(limit),
        ..ListServing::default()
    });
    let (_dir, _server, client) = serve(&rt).await;

    // The global relist's lists: the runtime has no streams, and its ListContainers
    // is over its limit.
    let err = client
        .list_node()
        .await
        .expect_err("over the runtime's limit");
    match &err {
        RuntimeError::RuntimeTooLarge {
            op,
            size,
            limit: theirs,
            ..
        } => {
            assert_eq!(*op, "ListContainers");
            assert_eq!(*size, Some(containers_len));
            assert_eq!(*theirs, Some(limit));
        }
        other => panic!("not the runtime's limit: {other:?}"),
    }
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    let text = err.to_string();
    for part in [
        "ListContainers",
        "runtime's own send limit",
        &limit.to_string(),
        &containers_len.to_string(),
        "does not offer the streaming list calls",
    ] {
        assert!(text.contains(part), "{part:?} not in {text}");
    }
    assert!(!text.contains("--runtime-max-message-size"), "{text}");
    let calls = rt.list_stream_calls();
    assert!(calls.asked_once(), "{calls:?}");

    // The decoded list call says the same of itself; the sandboxes are read.
    let err = client
        .list_containers(None)
        .await
        .expect_err("over the limit");
    assert!(
        matches!(
            err,
            RuntimeError::RuntimeTooLarge {
                op: "ListContainers",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        client.list_sandboxes(None).await.expect("under it").len(),
        PODS
    );
}

#[tokio::test]
async fn a_list_over_plegds_receive_limit_names_the_flag() {
    let (rt, sandboxes_len, containers_len) = kubelet_node().await;
    let limit = between(sandboxes_len, containers_len);
    let (_dir, server, _client) = serve(&rt).await;
    let client = CriRuntime::new(&server.endpoint(), REQUEST_TIMEOUT)
        .expect("a unix endpoint")
        .with_max_message_size(limit);
    let err = client.list_node().await.expect_err("over plegd's limit");
    assert!(
        matches!(
            err,
            RuntimeError::TooLarge { op: "ListContainers", limit: l, size: Some(s), .. }
                if l == limit && s == containers_len
        ),
        "{err:?}"
    );
    assert_eq!(err.code(), tonic::Code::OutOfRange);
    let text = err.to_string();
    assert!(text.contains("plegd's receive limit"), "{text}");
    assert!(text.contains("--runtime-max-message-size"), "{text}");
}

#[tokio::test]
async fn a_node_over_the_send_limit_is_read_through_the_streams() {
    let (rt, sandboxes_len, containers_len) = kubelet_node().await;
    // Over the limit as one message; 25 entries a message are well under it.
    let limit = between(sandboxes_len, containers_len);
    rt.set_list_serving(ListServing {
        send_limit: Some(limit),
        streaming: true,
        stream_batch: 25,
    });
    let (_dir, _server, client) = serve(&rt).await;
    assert!(matches!(
        client.list_containers(None).await,
        Err(RuntimeError::RuntimeTooLarge { .. })
    ));
    let lists = client.list_node().await.expect("read through the streams");
    assert!(client.list_streaming_in_use());
    assert_eq!(
        rt.list_stream_calls(),
        ListStreamCalls {
            sandboxes: 1,
            containers: 1
        }
    );
    assert_eq!(entries(&lists), truth(&rt).await);
    assert_eq!(entries(&lists).1.len(), 2 * PODS);

    // Later relists stay on them, and see what changed.
    let sb = rt.run_pod("uid-new", "new", "ns");
    rt.run_container(&sb, "app");
    let lists = client.list_node().await.expect("read through the streams");
    assert_eq!(
        rt.list_stream_calls(),
        ListStreamCalls {
            sandboxes: 2,
            containers: 2
        }
    );
    assert_eq!(entries(&lists), truth(&rt).await);
    assert_eq!(entries(&lists).0.len(), PODS + 1);

    // The global relist's read: StreamContainers's messages read as they arrive, each
    // with the list memo, as the unary ListContainers is.
    let mut memo = ListMemo::default();
    for round in 0..3 {
        if round == 2 {
            let sb = rt.run_pod("uid-newer", "newer", "ns");
            rt.run_container(&sb, "app");
        }
        let lists = client
            .list_node_memo(&mut memo)
            .await
            .expect("read through the streams");
        assert!(matches!(lists, NodeLists::Sunk { .. }), "round {round}");
        let read = {
            let view = lists.view_memo(&mut memo).expect("valid lists");
            (view.sandboxes().len(), view.containers().len())
        };
        let truth = truth(&rt).await;
        let (read_entries, unlabeled) = entries_labeled(&lists, &truth.0);
        assert_eq!(read_entries, truth, "round {round}");
        // Labels are kept for the sandboxes the memo did not vouch for: every one in
        // the first read, none in the second, the new pod's in the third.
        let want: Vec<String> = match round {
            0 => vec![],
            1 => truth.0.iter().map(|s| s.id.clone()).collect(),
            _ => truth
                .0
                .iter()
                .filter(|s| s.pod.uid != "uid-newer")
                .map(|s| s.id.clone())
                .collect(),
        };
        assert_eq!(unlabeled, want, "round {round}");
        assert_eq!(read, (PODS + 1 + round / 2, 2 * PODS + 1 + round / 2));
        // kubelet's labels name each pod: one fingerprint an entry.
        assert_eq!(memo.len(), read, "round {round}");
    }
    assert_eq!(
        rt.list_stream_calls(),
        ListStreamCalls {
            sandboxes: 5,
            containers: 5
        }
    );
}

#[tokio::test]
async fn a_runtime_without_the_streams_is_read_with_the_unary_lists_and_not_asked_again() {
    let (rt, _, _) = kubelet_node().await;
    let (_dir, _server, client) = serve(&rt).await;
    let lists = client.list_node().await.expect("the unary lists");
    assert!(!client.list_streaming_in_use());
    assert_eq!(entries(&lists), truth(&rt).await);
    let calls = rt.list_stream_calls();
    assert!(calls.asked_once(), "{calls:?}");
    // Remembered: the streams are not asked again, even once the runtime has them
    // (as kubelet, until plegd restarts).
    rt.set_list_serving(ListServing {
        streaming: true,
        ..ListServing::default()
    });
    for _ in 0..3 {
        let lists = client.list_node().await.expect("the unary lists");
        assert_eq!(entries(&lists), truth(&rt).await);
    }
    let calls = rt.list_stream_calls();
    assert!(calls.asked_once(), "{calls:?}");
    assert!(!client.list_streaming_in_use());
}

#[tokio::test]
async fn streaming_turned_off_is_never_asked_and_named_when_a_list_is_too_large() {
    let (rt, sandboxes_len, containers_len) = kubelet_node().await;
    rt.set_list_serving(ListServing {
        send_limit: Some(between(sandboxes_len, containers_len)),
        streaming: true,
        stream_batch: 25,
    });
    let (_dir, server, _client) = serve(&rt).await;
    let client = CriRuntime::new(&server.endpoint(), REQUEST_TIMEOUT)
        .expect("a unix endpoint")
        .with_list_streaming(false);
    let err = client
        .list_node()
        .await
        .expect_err("over the runtime's limit");
    assert!(
        err.to_string().contains("--runtime-list-streaming=false"),
        "{err}"
    );
    assert_eq!(rt.list_stream_calls(), ListStreamCalls::default());
}

#[tokio::test]
async fn a_streamed_message_over_a_limit_fails_the_relist_and_names_the_stream() {
    let (rt, _, _) = kubelet_node().await;
    // The padded first entry makes the first message of each stream 64 KiB larger; the
    // others, of 5 entries, are far under 32 KiB.
    rt.set_list_padding(64 << 10);
    rt.set_list_serving(ListServing {
        send_limit: Some(32 << 10),
        streaming: true,
        stream_batch: 5,
    });
    let (_dir, server, client) = serve(&rt).await;
    let err = client
        .list_node()
        .await
        .expect_err("over the runtime's limit");
    over_the_runtimes_stream_limit(&err, 32 << 10);
    // plegd's own limit applies to each message too.
    rt.set_list_serving(ListServing {
        send_limit: None,
        streaming: true,
        stream_batch: 5,
    });
    let small = CriRuntime::new(&server.endpoint(), REQUEST_TIMEOUT)
        .expect("a unix endpoint")
        .with_max_message_size(32 << 10);
    let err = small.list_node().await.expect_err("over plegd's limit");
    over_plegds_stream_limit(&err, 32 << 10);
    // Without the padding, both read the node.
    rt.set_list_padding(0);
    let lists = small
        .list_node()
        .await
        .expect("every message under the limit");
    assert_eq!(entries(&lists), truth(&rt).await);

    // The global relist's read, its containers' messages read as they arrive: the same
    // errors, and a failed read leaves the memo as the last good one left it.
    let mut memo = ListMemo::default();
    let lists = small
        .list_node_memo(&mut memo)
        .await
        .expect("every message under the limit");
    assert_eq!(entries(&lists), truth(&rt).await);
    lists.view_memo(&mut memo).expect("valid lists");
    let good = memo.len();
    assert_eq!(good, (PODS, 2 * PODS));
    rt.set_list_padding(64 << 10);
    let err = small
        .list_node_memo(&mut memo)
        .await
        .expect_err("over plegd's limit");
    over_plegds_stream_limit(&err, 32 << 10);
    assert_eq!(memo.len(), good);
    let big = CriRuntime::new(&server.endpoint(), REQUEST_TIMEOUT).expect("a unix endpoint");
    rt.set_list_serving(ListServing {
        send_limit: Some(32 << 10),
        streaming: true,
        stream_batch: 5,
    });
    let err = big
        .list_node_memo(&mut memo)
        .await
        .expect_err("over the runtime's limit");
    over_the_runtimes_stream_limit(&err, 32 << 10);
    assert_eq!(memo.len(), good);
}
