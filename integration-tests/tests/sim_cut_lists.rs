//! A runtime whose connection drops in the middle of a global relist's lists (a
//! killed or restarted runtime, a proxy that gives up), then serves the node again:
//! the relist that was cut fails and changes nothing, and the next one reads the node
//! exactly — nothing published for what did not change, a change made meanwhile
//! published once — wherever in the lists' bytes the cut fell. The lists are read as
//! they arrive and checked against what the last good read held (`list_sink`,
//! `list_memo`), so a read cut short must leave no trace in either.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use plegd_actors::{EventKind, GenericPleg, RelistOutput, RelistScope};
use plegd_runtime::CriRuntime;
use plegd_sim::{serve_unix, FakeRuntime, Kubelet, ListServing};
use rand::{Rng as _, SeedableRng as _};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{UnixListener, UnixStream};

use integration_tests::sim::REQUEST_TIMEOUT;

/// Forwards a unix socket to another; counts the bytes the server sends, and once
/// armed with `n`, closes the connection after forwarding `n` more of them.
struct CutProxy {
    path: PathBuf,
    sent: Arc<AtomicU64>,
    /// Bytes left before the cut; negative: not armed.
    left: Arc<AtomicI64>,
}

impl CutProxy {
    async fn start(path: PathBuf, upstream: PathBuf) -> CutProxy {
        let listener = UnixListener::bind(&path).expect("the proxy's socket");
        let sent = Arc::new(AtomicU64::new(0));
        let left = Arc::new(AtomicI64::new(-1));
        let (s, l) = (sent.clone(), left.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = UnixStream::connect(&upstream).await else {
                    continue;
                };
                tokio::spawn(forward(client, server, s.clone(), l.clone()));
            }
        });
        CutProxy { path, sent, left }
    }

    fn arm(&self, n: i64) {
        self.left.store(n, Ordering::SeqCst);
    }

    /// Whether the armed cut happened.
    fn cut(&self) -> bool {
        self.left.load(Ordering::SeqCst) < 0
    }
}

async fn forward(
    client: UnixStream,
    server: UnixStream,
    sent: Arc<AtomicU64>,
    left: Arc<AtomicI64>,
) {
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let up = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut client_rx, &mut server_tx).await;
    });
    let mut buf = vec![0u8; 4096];
    loop {
        let n = match server_rx.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let armed = left.load(Ordering::SeqCst);
        let pass = if armed >= 0 { n.min(armed as usize) } else { n };
        if client_tx.write_all(&buf[..pass]).await.is_err() {
            break;
        }
        sent.fetch_add(pass as u64, Ordering::SeqCst);
        if armed >= 0 {
            if pass < n || armed as usize == n {
                // The cut: both ways closed, as a dead runtime's socket.
                left.store(-1, Ordering::SeqCst);
                break;
            }
            left.store(armed - n as i64, Ordering::SeqCst);
        }
    }
    up.abort();
}

fn deaths(out: &RelistOutput) -> Vec<String> {
    let mut ids: Vec<String> = out
        .events
        .iter()
        .map(|e| {
            assert_eq!(e.kind, EventKind::ContainerDied, "{e:?}");
            e.container_id.clone()
        })
        .collect();
    ids.sort();
    ids
}

fn client(path: &Path) -> CriRuntime {
    CriRuntime::new(&format!("unix://{}", path.display()), REQUEST_TIMEOUT)
        .expect("a valid unix endpoint")
}

#[tokio::test]
async fn a_relist_cut_anywhere_in_its_lists_changes_nothing_and_the_next_reads_the_node() {
    cut_anywhere(ListServing::default()).await;
}

/// The same through CRI's streaming list calls, 50 entries a message: a cut between
/// two messages must fail the read too, not end the list there.
#[tokio::test]
async fn a_relist_cut_anywhere_in_its_streamed_lists_changes_nothing_and_the_next_reads_the_node() {
    cut_anywhere(ListServing {
        streaming: true,
        stream_batch: 50,
        ..ListServing::default()
    })
    .await;
}

async fn cut_anywhere(serving: ListServing) {
    let streamed = serving.streaming;
    let dir = tempfile::tempdir().unwrap();
    let rt = FakeRuntime::with_kubelet(Kubelet::default());
    rt.set_list_serving(serving);
    let sandboxes = plegd_sim::kubelet::run_deployment_pods(
        &rt,
        300,
        "default",
        |i| format!("6f1c2a3b-4d5e-4f60-8a7b-{i:012}"),
        &["app", "sidecar"],
    );
    let server = serve_unix(&dir.path().join("cri.sock"), rt.clone())
        .await
        .expect("the simulated CRI server starts");
    let proxy = CutProxy::start(dir.path().join("proxy.sock"), server.path().to_path_buf()).await;
    let client = Arc::new(client(&proxy.path));
    let mut pleg = GenericPleg::new(client.clone(), 8);
    let global = RelistScope::Global;
    pleg.relist(&global, &|_| false)
        .await
        .expect("the first relist");
    assert_eq!(client.list_streaming_in_use(), streamed);
    // A no-change relist: the bytes of the two lists (the memo's first use).
    let before = proxy.sent.load(Ordering::SeqCst);
    let out = pleg.relist(&global, &|_| false).await.expect("a relist");
    assert!(out.events.is_empty(), "{:?}", out.events);
    let lists = proxy.sent.load(Ordering::SeqCst) - before;
    assert!(lists > 200_000, "{lists} bytes: the lists span many frames");

    let containers: Vec<String> = {
        let mut ids: Vec<String> = sandboxes
            .iter()
            .flat_map(|sb| rt.containers_of(sb))
            .map(|c| c.id)
            .collect();
        ids.sort();
        ids
    };
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x5be0_cd19_137e_2179);
    // Near both ends, and anywhere between.
    let mut cuts: Vec<u64> = vec![1, 9, 100, lists / 2, lists - 100, lists - 1];
    cuts.extend((0..14).map(|_| rng.random_range(1..lists)));
    let mut exited = 0;
    for (round, cut) in cuts.into_iter().enumerate() {
        proxy.arm(cut as i64);
        let err = pleg.relist(&global, &|_| false).await;
        assert!(
            proxy.cut(),
            "round {round}: the cut at byte {cut} of {lists} happened"
        );
        assert!(
            err.is_err(),
            "round {round}: a relist cut at byte {cut} of {lists} failed"
        );
        // Every other round a container dies while the runtime is away.
        let mut expected = Vec::new();
        if round % 2 == 1 {
            let id = containers[exited * 7 % containers.len()].clone();
            exited += 1;
            rt.exit_container(&id, 3);
            expected.push(id);
        }
        let out = pleg
            .relist(&global, &|_| false)
            .await
            .unwrap_or_else(|e| panic!("round {round}: the relist after the cut: {e}"));
        assert_eq!(
            deaths(&out),
            expected,
            "round {round}, cut at byte {cut} of {lists}"
        );
        let out = pleg.relist(&global, &|_| false).await.expect("a relist");
        assert!(out.events.is_empty(), "round {round}: {:?}", out.events);
    }
    assert_eq!(client.list_streaming_in_use(), streamed);
}
