//! Large CRI responses through plegd's real client. Found with the chaos suite's
//! oversized-list fault: plegd's tonic client kept tonic's default 4 MiB limit on a
//! received message, where kubelet's CRI client accepts 16 MiB. A sandbox list carries
//! every pod's annotations (a `last-applied-configuration` is often tens of KiB), so a
//! full node's list can pass 4 MiB: then every global relist failed, for good, on a
//! node kubelet handles. Lists up to kubelet's limit must be read; larger ones fail
//! the relist (counted, retried), and plegd recovers once they shrink.

use integration_tests::sim::serve;
use plegd_runtime::{
    Container, CriRuntime, ListMemo, NodeLists, RuntimeClient, RuntimeError, Sandbox,
    DEFAULT_MAX_MESSAGE_SIZE,
};
use plegd_sim::FakeRuntime;

const MIB: usize = 1 << 20;

#[tokio::test]
async fn lists_up_to_kubelets_16_mib_are_read() {
    assert_eq!(DEFAULT_MAX_MESSAGE_SIZE, 16 * MIB, "kubelet's limit");
    let rt = FakeRuntime::new();
    let (_dir, _server, client) = serve(&rt).await;
    let sb = rt.run_pod("uid-1", "web-1", "ns");
    rt.run_container(&sb, "app");
    // Well past tonic's default 4 MiB, within kubelet's 16 MiB.
    rt.set_list_padding(12 * MIB);
    let sandboxes = client
        .list_sandboxes(None)
        .await
        .expect("a 12 MiB sandbox list");
    assert_eq!(sandboxes.len(), 1);
    let containers = client
        .list_containers(None)
        .await
        .expect("a 12 MiB container list");
    assert_eq!(containers.len(), 1);
}

#[tokio::test]
async fn a_list_over_the_limit_fails_and_the_next_one_is_read() {
    let rt = FakeRuntime::new();
    let (_dir, _server, client) = serve(&rt).await;
    rt.run_pod("uid-1", "web-1", "ns");
    rt.set_list_padding(DEFAULT_MAX_MESSAGE_SIZE + MIB);
    let err = client.list_sandboxes(None).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::OutOfRange, "{err}");
    // The log says which call hit which limit, and how to raise it.
    assert!(
        matches!(err, RuntimeError::TooLarge { op: "ListPodSandbox", limit, .. } if limit == DEFAULT_MAX_MESSAGE_SIZE),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("--runtime-max-message-size"),
        "{err}"
    );
    rt.set_list_padding(0);
    assert_eq!(client.list_sandboxes(None).await.unwrap().len(), 1);
}

#[tokio::test]
async fn the_limit_is_configurable() {
    let rt = FakeRuntime::new();
    let (_dir, server, _client) = serve(&rt).await;
    rt.run_pod("uid-1", "web-1", "ns");
    rt.set_list_padding(2 * MIB);
    let small = CriRuntime::new(&server.endpoint(), std::time::Duration::from_secs(10))
        .unwrap()
        .with_max_message_size(MIB);
    let err = small.list_sandboxes(None).await.unwrap_err();
    assert!(
        matches!(err, RuntimeError::TooLarge { limit: MIB, .. }),
        "{err:?}"
    );
    let large = CriRuntime::new(&server.endpoint(), std::time::Duration::from_secs(10))
        .unwrap()
        .with_max_message_size(4 * MIB);
    assert_eq!(large.list_sandboxes(None).await.unwrap().len(), 1);
}

/// The global relist's lists, handed over as bytes (`list_node`, read in place): the
/// same entries as the decoded list calls, and the same limit on a response.
#[tokio::test]
async fn the_node_lists_read_as_bytes_are_the_list_calls_entries_under_the_same_limit() {
    let rt = FakeRuntime::new();
    let (_dir, server, client) = serve(&rt).await;
    for i in 0..3 {
        let sb = rt.run_pod(&format!("uid-{i}"), &format!("web-{i}"), "ns");
        rt.run_container(&sb, "app");
        rt.run_container(&sb, "side");
    }
    rt.set_list_padding(2 * MIB);
    let lists = client.list_node().await.expect("the node's lists");
    assert!(matches!(lists, NodeLists::Wire { .. }), "{lists:?}");
    let (sandboxes, containers) = owned(&lists, None);
    assert_eq!(sandboxes.len(), 3);
    assert_eq!(containers.len(), 6);
    assert_eq!((sandboxes, containers), list_calls(&client).await);

    let small = CriRuntime::new(&server.endpoint(), std::time::Duration::from_secs(10))
        .unwrap()
        .with_max_message_size(MIB);
    let err = small.list_node().await.unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::TooLarge {
                op: "ListPodSandbox",
                limit: MIB,
                ..
            }
        ),
        "{err:?}"
    );
    let large = CriRuntime::new(&server.endpoint(), std::time::Duration::from_secs(10))
        .unwrap()
        .with_max_message_size(4 * MIB);
    let lists = large.list_node().await.expect("within the raised limit");
    assert_eq!(lists.view().expect("valid lists").sandboxes().len(), 3);
}

/// What the decoded list calls return, sorted by ID.
async fn list_calls(client: &CriRuntime) -> (Vec<Sandbox>, Vec<Container>) {
    let mut sandboxes = client.list_sandboxes(None).await.unwrap();
    let mut containers = client.list_containers(None).await.unwrap();
    sandboxes.sort_by(|a, b| a.id.cmp(&b.id));
    containers.sort_by(|a, b| a.id.cmp(&b.id));
    (sandboxes, containers)
}

/// The view's entries, owned and sorted by ID.
fn owned(lists: &NodeLists, memo: Option<&mut ListMemo>) -> (Vec<Sandbox>, Vec<Container>) {
    let view = match memo {
        Some(memo) => lists.view_memo(memo),
        None => lists.view(),
    }
    .expect("valid lists");
    // The sandboxes here have no labels: one listed without them (its entry vouched
    // for by the memo) is the whole sandbox.
    let mut sandboxes = view
        .sandboxes()
        .iter()
        .map(|s| s.to_sandbox().map(|(s, _)| s))
        .collect::<Result<Vec<_>, _>>()
        .expect("owned sandboxes");
    assert!(sandboxes.iter().all(|s| s.labels.is_empty()));
    let mut containers: Vec<_> = view.containers().iter().map(|c| c.to_container()).collect();
    sandboxes.sort_by(|a, b| a.id.cmp(&b.id));
    containers.sort_by(|a, b| a.id.cmp(&b.id));
    (sandboxes, containers)
}

/// The global relist's lists with its memo (`list_node_memo`): ListContainers read as
/// it arrives over HTTP/2 — a 2 MiB entry over many frames among the others — gives
/// the list calls' entries, with a fresh memo and with the memo of that read; a
/// ListContainers over plegd's limit is refused as before, naming the call, and
/// leaves the memo as it was.
#[tokio::test]
async fn the_containers_read_as_they_arrive_are_the_list_calls_entries_under_the_same_limit() {
    let rt = FakeRuntime::new();
    let (_dir, server, client) = serve(&rt).await;
    for i in 0..40 {
        let sb = rt.run_pod(&format!("uid-{i}"), &format!("web-{i}"), "ns");
        for c in 0..25 {
            rt.run_container(&sb, &format!("container-with-a-long-name-{c}"));
        }
    }
    rt.set_list_padding(2 * MIB);
    let want = list_calls(&client).await;
    assert_eq!(want.1.len(), 1000);
    let mut memo = ListMemo::default();
    for round in 0..2 {
        let lists = client
            .list_node_memo(&mut memo)
            .await
            .expect("the node's lists");
        assert!(matches!(lists, NodeLists::Sunk { .. }), "{lists:?}");
        assert_eq!(owned(&lists, Some(&mut memo)), want, "round {round}");
        assert!(memo.len().1 > 0, "the read's entries remembered");
    }

    // A limit the sandboxes' response is under and the containers' over.
    rt.set_list_padding(0);
    let NodeLists::Wire {
        sandboxes,
        containers,
    } = client.list_node().await.expect("the node's lists")
    else {
        panic!("bytes from a CRI client");
    };
    assert!(sandboxes.len() < containers.len());
    let limit = (sandboxes.len() + containers.len()) / 2;
    let small = CriRuntime::new(&server.endpoint(), std::time::Duration::from_secs(10))
        .unwrap()
        .with_max_message_size(limit);
    let before = memo.len();
    let err = small.list_node_memo(&mut memo).await.unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::TooLarge {
                op: "ListContainers",
                limit: l,
                ..
            } if l == limit
        ),
        "{err:?}"
    );
    assert_eq!(
        memo.len(),
        before,
        "a failed read leaves the memo as it was"
    );
}
