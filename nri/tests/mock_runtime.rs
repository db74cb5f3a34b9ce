//! The plugin against the mock NRI runtime (a ttRPC server speaking the multiplexed
//! protocol): registration, configuration, paged synchronization, each hook, the
//! runtime's timeout, disconnects and reconnects.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use plegd_nri::mock_runtime::{
    container, pod, MockError, MockRuntime, PluginConn, DEFAULT_REQUEST_TIMEOUT,
};
use plegd_nri::{
    api, event_mask, Change, NriHint, Plugin, PluginConfig, PodRef, SessionEnd, Status, EVENTS,
};
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(10);
const RETRY: Duration = Duration::from_millis(20);

struct Setup {
    _dir: tempfile::TempDir,
    runtime: MockRuntime,
    plugin: Arc<Plugin>,
    hints: mpsc::UnboundedReceiver<NriHint>,
    process: PluginProcess,
}

/// The plugin on its own thread and tokio runtime, as if in its own process: a sink
/// that blocks (the slow plugin) cannot hold up the mock runtime's timers.
struct PluginProcess {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PluginProcess {
    fn start(plugin: Arc<Plugin>) -> Self {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                tokio::select! {
                    () = plugin.run(|_, _| RETRY) => {}
                    _ = stopped => {}
                }
            });
        });
        PluginProcess {
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Stops the plugin (its connection closes) and waits for its thread.
    fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for PluginProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

fn setup_with(
    request_timeout: Duration,
    config: impl FnOnce(PluginConfig) -> PluginConfig,
    slow_sink: Option<Duration>,
) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nri.sock");
    let runtime = MockRuntime::bind(&path, request_timeout).unwrap();
    let (tx, hints) = mpsc::unbounded_channel();
    let sink = move |hint: NriHint| {
        if let Some(d) = slow_sink {
            std::thread::sleep(d);
        }
        let _ = tx.send(hint);
    };
    let plugin = Arc::new(Plugin::new(config(PluginConfig::new(&path)), sink));
    let process = PluginProcess::start(Arc::clone(&plugin));
    Setup {
        _dir: dir,
        runtime,
        plugin,
        hints,
        process,
    }
}

fn setup() -> Setup {
    setup_with(DEFAULT_REQUEST_TIMEOUT, |c| c, None)
}

async fn accept(runtime: &MockRuntime) -> PluginConn {
    tokio::time::timeout(WAIT, runtime.accept())
        .await
        .expect("the plugin connects")
        .expect("it registers")
}

async fn next_hint(hints: &mut mpsc::UnboundedReceiver<NriHint>) -> NriHint {
    tokio::time::timeout(WAIT, hints.recv())
        .await
        .expect("a hint")
        .expect("the channel is open")
}

async fn wait_connected(plugin: &Plugin) {
    let mut status = plugin.status();
    tokio::time::timeout(WAIT, status.wait_for(|s| matches!(s, Status::Connected(_))))
        .await
        .expect("the plugin reports it is connected")
        .unwrap();
}

fn pod_ref(uid: &str, sandbox: &str) -> PodRef {
    PodRef {
        uid: uid.into(),
        name: format!("{uid}-name"),
        namespace: "ns".into(),
        sandbox_id: sandbox.into(),
    }
}

fn the_pod(uid: &str, sandbox: &str) -> api::PodSandbox {
    pod(uid, &format!("{uid}-name"), "ns", sandbox)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_configures_synchronizes_in_pages_and_hints_every_hook() {
    let mut s = setup();
    let conn = accept(&s.runtime).await;
    assert_eq!(conn.registration.name, "plegd");
    assert_eq!(conn.registration.index, "00");

    let mask = conn.configure().await.unwrap();
    assert_eq!(mask, event_mask(&EVENTS));
    wait_connected(&s.plugin).await;

    let pods: Vec<_> = (0..5)
        .map(|i| the_pod(&format!("u{i}"), &format!("s{i}")))
        .collect();
    let ctrs: Vec<_> = (0..7)
        .map(|i| container(&format!("c{i}"), "s0", "app"))
        .collect();
    assert_eq!(conn.synchronize(&pods, &ctrs, 2).await.unwrap(), 4);
    // One hint for the whole synchronization, after its last page.
    assert_eq!(
        next_hint(&mut s.hints).await,
        NriHint::Synchronized {
            pods: 5,
            containers: 7
        }
    );
    assert_eq!(s.plugin.counters().sync_pages.load(Ordering::Relaxed), 4);

    // A single-page synchronization (a second runtime restart) counts once too.
    assert_eq!(conn.synchronize(&pods[..1], &[], 10).await.unwrap(), 1);
    assert_eq!(
        next_hint(&mut s.hints).await,
        NriHint::Synchronized {
            pods: 1,
            containers: 0
        }
    );

    let p = the_pod("uid-a", "sb-a");
    let c = container("ctr-a", "sb-a", "app");
    let ctr_hint = |change| NriHint::Container {
        change,
        pod: Some(pod_ref("uid-a", "sb-a")),
        container_id: "ctr-a".into(),
    };
    let sandbox_hint = |change| NriHint::Sandbox {
        change,
        pod: pod_ref("uid-a", "sb-a"),
    };

    // The dedicated RPCs (NRI v0.12 runtimes).
    conn.stop_container(&p, &c).await.unwrap();
    assert_eq!(next_hint(&mut s.hints).await, ctr_hint(Change::Stopped));
    conn.remove_container(&p, &c).await.unwrap();
    assert_eq!(next_hint(&mut s.hints).await, ctr_hint(Change::Removed));
    conn.stop_pod_sandbox(&p).await.unwrap();
    assert_eq!(next_hint(&mut s.hints).await, sandbox_hint(Change::Stopped));
    conn.remove_pod_sandbox(&p).await.unwrap();
    assert_eq!(next_hint(&mut s.hints).await, sandbox_hint(Change::Removed));

    // StateChange (containerd 1.7 and 2.1).
    conn.state_change(api::Event::StopContainer, &p, Some(&c))
        .await
        .unwrap();
    assert_eq!(next_hint(&mut s.hints).await, ctr_hint(Change::Stopped));
    conn.state_change(api::Event::RemoveContainer, &p, Some(&c))
        .await
        .unwrap();
    assert_eq!(next_hint(&mut s.hints).await, ctr_hint(Change::Removed));
    conn.state_change(api::Event::StopPodSandbox, &p, None)
        .await
        .unwrap();
    assert_eq!(next_hint(&mut s.hints).await, sandbox_hint(Change::Stopped));
    conn.state_change(api::Event::RemovePodSandbox, &p, None)
        .await
        .unwrap();
    assert_eq!(next_hint(&mut s.hints).await, sandbox_hint(Change::Removed));

    // An event plegd did not subscribe to is answered and asks for nothing; the next
    // hint is the stop sent after it.
    conn.state_change(api::Event::PostStartContainer, &p, Some(&c))
        .await
        .unwrap();
    conn.stop_container(&p, &c).await.unwrap();
    assert_eq!(next_hint(&mut s.hints).await, ctr_hint(Change::Stopped));
    // A hook without a container id asks for nothing either.
    conn.stop_container(&p, &container("", "sb-a", "app"))
        .await
        .unwrap();
    conn.stop_pod_sandbox(&p).await.unwrap();
    assert_eq!(next_hint(&mut s.hints).await, sandbox_hint(Change::Stopped));
    assert!(s.hints.try_recv().is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_after_the_runtime_closes_the_connection() {
    let mut s = setup();
    for round in 0..3 {
        let conn = accept(&s.runtime).await;
        conn.configure().await.unwrap();
        conn.synchronize(&[the_pod("u", "s")], &[], 8)
            .await
            .unwrap();
        assert!(
            matches!(
                next_hint(&mut s.hints).await,
                NriHint::Synchronized { pods: 1, .. }
            ),
            "round {round}"
        );
        conn.stop_container(
            &the_pod("u", "s"),
            &container(&format!("c{round}"), "s", "app"),
        )
        .await
        .unwrap();
        assert!(
            matches!(next_hint(&mut s.hints).await, NriHint::Container { container_id, .. } if container_id == format!("c{round}"))
        );
        // The runtime goes away (a restart): the plugin dials again.
        conn.disconnect();
        let mut status = s.plugin.status();
        tokio::time::timeout(
            WAIT,
            status.wait_for(|st| matches!(st, Status::Disconnected { .. } | Status::Connecting)),
        )
        .await
        .unwrap()
        .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_plugin_is_disconnected_by_the_runtime_and_reconnects() {
    // A sink that blocks longer than the runtime's timeout stands for a slow plugin:
    // the mock runtime disconnects it, as containerd does.
    let mut s = setup_with(
        Duration::from_millis(200),
        |c| c,
        Some(Duration::from_millis(600)),
    );
    let conn = accept(&s.runtime).await;
    conn.configure().await.unwrap();
    let err = conn
        .stop_container(&the_pod("u", "s"), &container("c", "s", "app"))
        .await
        .unwrap_err();
    assert!(matches!(err, MockError::Timeout(_)), "{err}");
    // The hint was still delivered (late) ...
    assert!(matches!(
        next_hint(&mut s.hints).await,
        NriHint::Container { .. }
    ));
    // ... and the plugin, disconnected, registers again.
    let conn = accept(&s.runtime).await;
    assert_eq!(conn.registration.name, "plegd");
    conn.configure().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_are_answered_at_once_even_when_plegds_queue_is_full() {
    // plegd's sink is a bounded queue that drops when full. Fill it, never drain it,
    // and send many hooks: every one must be answered well within the runtime's
    // timeout, so the runtime never disconnects plegd.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nri.sock");
    let runtime = MockRuntime::bind(&path, DEFAULT_REQUEST_TIMEOUT).unwrap();
    let (tx, _rx) = mpsc::channel::<NriHint>(1);
    let plugin = Arc::new(Plugin::new(PluginConfig::new(&path), move |hint| {
        let _ = tx.try_send(hint);
    }));
    let task = tokio::spawn({
        let plugin = Arc::clone(&plugin);
        async move { plugin.run(|_, _| RETRY).await }
    });
    let conn = accept(&runtime).await;
    conn.configure().await.unwrap();
    let p = the_pod("u", "s");
    let mut took = Vec::new();
    for i in 0..2000 {
        let c = container(&format!("c{i}"), "s", "app");
        let t = match i % 2 {
            0 => conn.stop_container(&p, &c).await,
            _ => {
                conn.state_change(api::Event::StopContainer, &p, Some(&c))
                    .await
            }
        };
        took.push(t.expect("answered within the runtime's timeout"));
    }
    took.sort();
    let pct = |q: f64| took[((took.len() - 1) as f64 * q) as usize];
    println!(
        "NRI hook answer time over {} hooks (queue full): p50 {:?}, p99 {:?}, max {:?}",
        took.len(),
        pct(0.5),
        pct(0.99),
        took[took.len() - 1]
    );
    assert_eq!(plugin.counters().hooks.load(Ordering::Relaxed), 2000);
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_that_never_configures_the_plugin_is_left_and_dialed_again() {
    let s = setup_with(
        DEFAULT_REQUEST_TIMEOUT,
        |c| {
            c.with_registration_timeout(Duration::from_millis(300))
                .unwrap()
        },
        None,
    );
    let first = accept(&s.runtime).await;
    // No Configure: the plugin gives up on this connection ...
    let end = tokio::time::timeout(WAIT, first.closed()).await.unwrap();
    assert!(matches!(end, plegd_nri::mux::MuxEnd::PeerClosed), "{end:?}");
    // ... and registers again.
    let second = accept(&s.runtime).await;
    second.configure().await.unwrap();
    wait_connected(&s.plugin).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_socket_is_retried_until_the_runtime_appears() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nri.sock");
    let (tx, mut hints) = mpsc::unbounded_channel();
    let plugin = Arc::new(Plugin::new(PluginConfig::new(&path), move |h| {
        let _ = tx.send(h);
    }));
    let (ends_tx, mut ends) = mpsc::unbounded_channel();
    let task = tokio::spawn({
        let plugin = Arc::clone(&plugin);
        async move {
            plugin
                .run(move |end, _| {
                    let _ = ends_tx.send(matches!(end, SessionEnd::Connect(_)));
                    RETRY
                })
                .await
        }
    });
    // At least two failed dials before the runtime exists.
    for _ in 0..2 {
        assert!(tokio::time::timeout(WAIT, ends.recv())
            .await
            .unwrap()
            .unwrap());
    }
    let runtime = MockRuntime::bind(&path, DEFAULT_REQUEST_TIMEOUT).unwrap();
    let conn = accept(&runtime).await;
    conn.configure().await.unwrap();
    conn.stop_pod_sandbox(&the_pod("u", "s")).await.unwrap();
    assert!(matches!(
        next_hint(&mut hints).await,
        NriHint::Sandbox { .. }
    ));
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_plugin_closes_its_connection() {
    let mut s = setup();
    let conn = accept(&s.runtime).await;
    conn.configure().await.unwrap();
    tokio::task::block_in_place(|| s.process.stop());
    let end = tokio::time::timeout(WAIT, conn.closed()).await.unwrap();
    assert!(matches!(end, plegd_nri::mux::MuxEnd::PeerClosed), "{end:?}");
}
