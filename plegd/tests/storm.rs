//! The KEP's priority rule through the real binary: `plegd run` against the simulated
//! runtime while several threads inject CRI stop events as fast as they can (for the
//! node's pods and for pods that do not exist) and every container exits. Global
//! relists go on (README "Relist scheduling": a due global relist waits for one round
//! of targeted reads at most), health answers, the event stream reconnects after a
//! runtime restart, the memory trim and a quiet watcher's bookmarks keep their
//! periods, and each exit is written to stdout and exported over OTLP
//! exactly once.
//! Prints the global relist's interval and what became of the requests.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use integration_tests::otlp::LogsReceiver;
use integration_tests::process::{
    command, free_port, http_get, signal, wait_exit, wait_until, Reaped, TIMEOUT,
};
use plegd_runtime::cri;
use plegd_sim::{spawn_in_thread, FakeRuntime};
use plegd_testkit::metrics::Scrape;

const PODS: usize = 20;
const THREADS: usize = 3;

fn metric(port: u16, name: &str, labels: &str) -> u64 {
    scrape(port).count(name, &[labels]).unwrap_or(0)
}

/// One scrape of /metrics (empty if it did not answer).
fn scrape(port: u16) -> Scrape {
    http_get(port, "/metrics")
        .and_then(|(_, response)| Scrape::from_response(&response))
        .unwrap_or_default()
}

fn stop_event(uid: &str) -> cri::ContainerEventResponse {
    cri::ContainerEventResponse {
        container_id: format!("c-{uid}"),
        container_event_type: cri::ContainerEventType::ContainerStoppedEvent as i32,
        created_at: plegd_runtime::now_ns(),
        pod_sandbox_status: Some(cri::PodSandboxStatus {
            id: format!("sb-{uid}"),
            metadata: Some(cri::PodSandboxMetadata {
                uid: uid.into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        containers_statuses: vec![],
    }
}

#[test]
fn a_storm_of_stop_events_leaves_the_global_relist_on_its_period() {
    let dir = tempfile::tempdir().unwrap();
    let sim = FakeRuntime::new();
    let containers: Vec<String> = (0..PODS)
        .map(|i| {
            let sb = sim.run_pod(&format!("u{i}"), "p", "ns");
            sim.run_container(&sb, "app")
        })
        .collect();
    let socket = dir.path().join("cri.sock");
    let server = spawn_in_thread(&socket, sim.clone()).unwrap();
    let port = free_port();
    let collector = LogsReceiver::default();
    let otlp = collector.start();
    let api = dir.path().join("api.sock");
    let log = dir.path().join("plegd.log");
    let mut child = command(env!("CARGO_BIN_EXE_plegd"))
        .args(["run", "--runtime-endpoint", &server.endpoint()])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .args(["--relist-period", "100ms", "--hint-sources", "cri-events"])
        .args(["--otlp-events", "--otlp-events-endpoint", &otlp])
        .args(["--memory-trim-period", "200ms", "--api-socket"])
        .arg(&api)
        .env("RUST_LOG", "plegd_telemetry::malloc=debug")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    // Every ContainerDied line, counted by container.
    let died: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let stdout = child.stdout.take().unwrap();
    let reader = {
        let died = died.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue;
                };
                if v["type"] == "ContainerDied" {
                    let id = v["container_id"].as_str().unwrap_or_default().to_string();
                    *died.lock().unwrap().entry(id).or_default() += 1;
                }
            }
        })
    };
    let plegd = Reaped(child);
    let relists = || metric(port, "kubelet_pleg_relist_duration_seconds_count", "");
    wait_until("plegd relists", || relists() >= 2);
    wait_until("the event stream is open", || sim.event_streams() >= 1);
    let bookmarks = idle_bookmarks(&api);
    let trims = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches("malloc_trim")
            .count()
    };

    let storming = Arc::new(AtomicBool::new(true));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (sim, storming) = (sim.clone(), storming.clone());
            std::thread::spawn(move || {
                let mut sent = 0usize;
                while storming.load(Ordering::Relaxed) {
                    let n = sent * THREADS + t;
                    let uid = match n % 3 {
                        0 => format!("u{}", n % PODS),
                        _ => format!("storm-{}", n % 1000),
                    };
                    sim.inject_event(stop_event(&uid));
                    sent += 1;
                }
                sent
            })
        })
        .collect();
    wait_until("the storm reaches plegd", || {
        metric(port, "plegd_relist_requests_total", "result=\"queued\"") > 10_000
    });
    let (before, sum_before) = (
        relists(),
        metric(port, "kubelet_pleg_relist_interval_seconds_count", ""),
    );
    // The other periodic duties go on too: the memory trim, a quiet watcher's
    // bookmarks (each second), health; and the event stream is reconnected on its
    // backoff after the runtime restarts mid-storm. (A restart, not the simulator's
    // injected stream failure: a reader that lags its broadcast buffer can miss that.)
    let (trimmed, bookmarked) = (trims(), bookmarks.load(Ordering::SeqCst));
    wait_until("memory trims and bookmarks go on through the storm", || {
        trims() >= trimmed + 3 && bookmarks.load(Ordering::SeqCst) >= bookmarked + 2
    });
    assert_eq!(http_get(port, "/healthz").map(|(code, _)| code), Some(200));
    assert_eq!(http_get(port, "/readyz").map(|(code, _)| code), Some(200));
    let attempts = metric(port, "plegd_evented_reconnect_attempts_total", "");
    server.kill();
    let _server = spawn_in_thread(&socket, sim.clone()).unwrap();
    // The watcher reads the old stream's buffered storm (paced behind the global
    // relists) before it reaches the stream's end: on a loaded machine that alone
    // takes tens of seconds, hence the longer wait.
    let deadline = std::time::Instant::now() + 4 * TIMEOUT;
    while !(metric(port, "plegd_evented_reconnect_attempts_total", "") > attempts
        && metric(port, "plegd_evented_stream_connected", "") == 1
        && sim.event_streams() >= 1)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for the stream reconnected through the storm"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    for c in &containers {
        sim.exit_container(c, 1);
    }
    wait_until("global relists go on through the storm", || {
        relists() >= before + 30
    });
    wait_until("every exit written", || died.lock().unwrap().len() == PODS);
    // The OTLP export runs on its own thread and queue: the storm does not hold it.
    wait_until("every exit exported over OTLP during the storm", || {
        collector
            .logs()
            .iter()
            .filter(|l| l.record.event_name == "plegd.container.died")
            .count()
            == PODS
    });
    let intervals = metric(port, "kubelet_pleg_relist_interval_seconds_count", "") - sum_before;
    let scraped = scrape(port);
    storming.store(false, Ordering::Relaxed);
    let sent: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let result = |r: &str| {
        scraped
            .count("plegd_relist_requests_total", &[&format!("result=\"{r}\"")])
            .unwrap_or(0)
    };
    println!(
        "storm: {sent} stop events injected; requests queued {}, merged {}, dropped {}, \
         done {}, skipped {}; {intervals} global relist intervals observed",
        result("queued"),
        result("merged"),
        result("dropped"),
        result("done"),
        result("skipped"),
    );
    let mut plegd = plegd;
    signal(&plegd.0, "TERM");
    let (status, _) = wait_exit(&mut plegd.0);
    assert!(status.success(), "{status:?}");
    let _ = reader.join();
    // Shutdown drains the export: every record is there, none twice.
    let exported = collector
        .logs()
        .iter()
        .filter(|l| l.record.event_name == "plegd.container.died")
        .count();
    assert_eq!(exported, PODS, "one exported ContainerDied per exit");
    let died = died.lock().unwrap();
    for c in &containers {
        assert_eq!(died.get(c), Some(&1), "{c}: one ContainerDied");
    }
}

/// Counts the idle bookmarks a watcher of a pod that never exists receives (one per
/// second), on a thread of its own.
fn idle_bookmarks(api: &std::path::Path) -> Arc<AtomicUsize> {
    use plegd_api::v1::watch_response::Kind;
    let count = Arc::new(AtomicUsize::new(0));
    let (api, counted) = (api.to_path_buf(), count.clone());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut client = plegd_api::connect(&api).await.unwrap();
            let req = plegd_api::v1::WatchRequest {
                pod_uids: vec!["nobody".into()],
                bookmark_interval_seconds: 1,
                ..Default::default()
            };
            let mut stream = client.watch(req).await.unwrap().into_inner();
            while let Ok(Some(resp)) = stream.message().await {
                if let Some(Kind::Bookmark(b)) = resp.kind {
                    if !b.initial_events_end {
                        counted.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
        });
    });
    count
}
