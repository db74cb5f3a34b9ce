//! What an operator sees: /metrics scraped during a mock-runtime run with a stream
//! outage and a termination storm, read as KEP-3386's troubleshooting table says;
//! every label of every series checked; health through the outage; and a flapping
//! runtime that cannot flood the log.

use plegd_telemetry::RelistPhase;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use integration_tests::wait::*;
use plegd_actors::Health;
use plegd_actors::ReconnectPolicy;
use plegd_actors::{EventKind, RelistSource};
use plegd_actors::{Pleg, PlegConfig};
use plegd_runtime::cri;
use plegd_runtime::CriRuntime;
use plegd_sim::{spawn_in_thread, FakeRuntime, Op};
use plegd_telemetry::http::{HealthSource, MetricsServer};
use plegd_telemetry::Metrics;
use plegd_testkit::metrics::Scrape;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct H(Health);
impl HealthSource for H {
    fn live(&self) -> Result<(), String> {
        self.0.check()
    }
    fn ready(&self) -> bool {
        self.0.ready()
    }
}

async fn get(port: u16, path: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).await.unwrap();
    let code = body.split_whitespace().nth(1).unwrap().parse().unwrap();
    (code, body)
}

async fn scrape(port: u16) -> BTreeMap<String, f64> {
    let (code, body) = get(port, "/metrics").await;
    assert_eq!(code, 200);
    // series (name{labels}) → value.
    Scrape::from_response(&body).unwrap_or_default().series()
}

fn val(m: &BTreeMap<String, f64>, series: &str) -> f64 {
    *m.get(series)
        .unwrap_or_else(|| panic!("no series {series}"))
}

/// Every label name and value comes from a small fixed set: never a pod UID,
/// container ID, error text or endpoint.
fn check_labels(m: &BTreeMap<String, f64>, forbidden: &[&str]) {
    let allowed_values = [
        "global",
        "evented_pleg",
        "post_sync",
        "post_allocation",
        "nri",
        "containerd_events",
        // Hint sources and their states.
        "cri-events",
        "containerd-events",
        "off",
        "detected",
        "connecting",
        "streaming",
        "waiting",
        "unsupported",
        "queued",
        "coalesced",
        "merged",
        "dropped",
        "skipped",
        "done",
        "list",
        "status",
        // What became of a prefetched container status.
        "used",
        "read_again",
        "failed",
        "unused",
        "created",
        "started",
        "stopped",
        "deleted",
        "unknown",
        "invalid",
        // API refusals (method, reason) and connections plegd closed (reason).
        "Sync",
        "RequestRelist",
        "read_socket",
        "unknown_pod_holds",
        "budget",
        "handshake_timeout",
        "bad_preface",
        "handshake_evicted",
        "too_many_connections",
        "served_evicted",
        "idle",
        "out_of_fds",
        // Hint IDs traced to their pods; stops a source reported or missed.
        "found",
        "no_pod",
        "limited",
        "reported",
        "missed",
    ];
    for series in m.keys() {
        let Some((_, labels)) = series.split_once('{') else {
            continue;
        };
        for pair in labels.trim_end_matches('}').split(',') {
            let (k, v) = pair.split_once('=').unwrap();
            let v = v.trim_matches('"');
            match k {
                "le" => assert!(v == "+Inf" || v.parse::<f64>().is_ok(), "{series}"),
                "relist_source" | "result" | "phase" | "type" | "source" | "state" | "method"
                | "reason" => {
                    assert!(allowed_values.contains(&v), "label value {v:?} in {series}")
                }
                other => panic!("unexpected label {other} in {series}"),
            }
            for f in forbidden {
                assert!(!v.contains(f), "{f} leaked into {series}");
            }
        }
    }
}

#[actix_rt::test]
async fn counters_move_as_the_troubleshooting_table_says() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("cri.sock");
    let sim = FakeRuntime::new();
    let mut server = Some(spawn_in_thread(&sock, sim.clone()).unwrap());
    let endpoint = format!("unix://{}", sock.display());
    let cri_rt = CriRuntime::new(&endpoint, Duration::from_secs(2)).unwrap();
    let cfg = PlegConfig {
        relist_period: Duration::from_millis(100),
        queue_capacity: 4,
        reconnect: ReconnectPolicy::new(
            Duration::from_millis(20),
            Duration::from_millis(200),
            Duration::from_secs(5),
        )
        .unwrap(),
        ..PlegConfig::default()
    };
    let pleg = Pleg::start(Arc::new(cri_rt), &cfg, Arc::new(Metrics::new()));
    let http = MetricsServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        pleg.metrics().clone(),
        Arc::new(H(pleg.health().clone())),
    )
    .await
    .unwrap();
    let port = http.local_addr().unwrap().port();
    actix_rt::spawn(http.serve(std::future::pending()));
    let sub = pleg.subscribe("t", 100_000).await.unwrap();

    let mut ids = vec![endpoint.clone()];
    let mut containers = Vec::new();
    for i in 0..30 {
        let uid = format!("pod-uid-{i}");
        let sb = sim.run_pod(&uid, "p", "ns");
        let c = sim.run_container(&sb, "app");
        ids.extend([uid, sb, c.clone()]);
        containers.push(c);
    }
    let last = containers.last().unwrap().clone();
    expect_event(&sub, EventKind::ContainerStarted, &last).await;
    let m = pleg.metrics().clone();
    wait_until("stream open", || m.stream_connected.get() == 1).await;
    let healthy = scrape(port).await;
    assert_eq!(val(&healthy, "plegd_evented_stream_connected"), 1.0);
    assert_eq!(get(port, "/healthz").await.0, 200);
    assert_eq!(get(port, "/readyz").await.0, 200);

    // Outage: the runtime goes away. "Disconnected or flapping stream — detection:
    // connection state, reconnect attempts, and connection-error metrics."
    server.take().unwrap().kill();
    wait_until("errors counted", || {
        m.connection_errors.get() >= 2 && m.relist_errors(RelistPhase::List) > 0
    })
    .await;
    let down = scrape(port).await;
    assert_eq!(val(&down, "plegd_evented_stream_connected"), 0.0);
    assert!(
        val(&down, "kubelet_evented_pleg_connection_error_count")
            > val(&healthy, "kubelet_evented_pleg_connection_error_count")
    );
    assert!(
        val(&down, "plegd_evented_reconnect_attempts_total")
            > val(&healthy, "plegd_evented_reconnect_attempts_total")
    );
    assert!(val(&down, "plegd_relist_errors_total{phase=\"list\"}") > 0.0);
    // A stream outage is not a health failure.
    assert_eq!(get(port, "/healthz").await.0, 200);

    server = Some(spawn_in_thread(&sock, sim.clone()).unwrap());
    wait_until("reconnected", || m.stream_connected.get() == 1).await;
    let seen = m.relist_duration.get_sample_count();
    wait_until("relists again", || {
        m.relist_duration.get_sample_count() > seen + 1
    })
    .await;
    let up = scrape(port).await;
    assert!(
        val(&up, "kubelet_pleg_last_seen_seconds") > val(&down, "kubelet_pleg_last_seen_seconds")
    );
    assert!(
        val(&up, "kubelet_evented_pleg_connection_success_count")
            > val(&down, "kubelet_evented_pleg_connection_success_count")
    );

    // Termination storm with a tiny queue and slow reads. "Full relist queue —
    // detection: dropped-request metrics increase"; global relists still converge.
    sim.set_latency(Op::ListSandboxes, Duration::from_millis(10));
    for c in &containers {
        sim.exit_container(c, 137);
    }
    for c in &containers {
        // Duplicates as well: a storm of stop events.
        for _ in 0..20 {
            sim.inject_event(sim.event_about(c, cri::ContainerEventType::ContainerStoppedEvent));
        }
    }
    let mut died = std::collections::HashSet::new();
    recv_until(&sub, "every death", |d| {
        if d.event.kind == EventKind::ContainerDied {
            died.insert(d.event.container_id.clone());
        }
        containers.iter().all(|c| died.contains(c))
    })
    .await;
    // Global relists go on (the storm may be over before one is due).
    let relists_before = val(&up, "kubelet_pleg_relist_duration_seconds_count") as u64;
    wait_until("a global relist after the storm", || {
        pleg.metrics().relist_duration.get_sample_count() > relists_before
    })
    .await;
    // Every injected stop is read by the watcher (the deaths may all have been found
    // before the stream was drained).
    let stopped = "plegd_evented_stream_events_total{type=\"stopped\"}";
    let deadline = std::time::Instant::now() + TIMEOUT;
    let storm = loop {
        let storm = scrape(port).await;
        if val(&storm, stopped) >= 600.0 || std::time::Instant::now() > deadline {
            break storm;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        val(
            &storm,
            "plegd_relist_requests_total{relist_source=\"evented_pleg\",result=\"dropped\"}"
        ) > 0.0
    );
    assert!(
        val(
            &storm,
            "plegd_relist_requests_total{relist_source=\"evented_pleg\",result=\"queued\"}"
        ) > 0.0
    );
    assert!(
        val(
            &storm,
            "plegd_evented_stream_events_total{type=\"stopped\"}"
        ) >= 600.0
    );
    let global = val(
        &storm,
        "kubelet_pleg_events_total{relist_source=\"global\"}",
    );
    let evented = val(
        &storm,
        "kubelet_pleg_events_total{relist_source=\"evented_pleg\"}",
    );
    assert!(evented > 0.0, "the fast path caught some exits");
    // Each death is found by a targeted relist or, if every request for its pod was
    // dropped, by a global relist. (Since the dispatcher drains its queue while a
    // relist runs, one of a pod's 20 requests usually gets through: the
    // global relists may find none.)
    let global_before = val(&up, "kubelet_pleg_events_total{relist_source=\"global\"}");
    assert!(
        evented + (global - global_before) >= containers.len() as f64,
        "every death found by one path or the other"
    );
    assert!(
        val(&storm, "kubelet_pleg_relist_duration_seconds_count")
            > val(&up, "kubelet_pleg_relist_duration_seconds_count")
    );
    assert!(
        val(
            &storm,
            "kubelet_evented_pleg_connection_latency_seconds_count"
        ) > 0.0
    );
    assert_eq!(val(&storm, "plegd_subscribers"), 1.0);
    check_labels(&storm, &ids.iter().map(String::as_str).collect::<Vec<_>>());
    pleg.stop();
    drop(server);
}

/// Collects everything logged on this thread.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[actix_rt::test]
async fn a_flapping_runtime_cannot_flood_the_log() {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let sim = FakeRuntime::new();
    let cfg = PlegConfig {
        relist_period: Duration::from_secs(3600),
        reconnect: ReconnectPolicy::new(
            Duration::from_millis(1),
            Duration::from_millis(5),
            Duration::from_secs(60),
        )
        .unwrap(),
        ..PlegConfig::default()
    };
    let pleg = Pleg::start(Arc::new(sim.clone()), &cfg, Arc::new(Metrics::new()));
    let m = pleg.metrics().clone();
    // Flap: every stream fails as soon as it opens, and every open attempt fails too
    // half of the time; plus garbage events.
    while m.reconnect_attempts.get() < 200 {
        sim.fail_streams(tonic::Code::Unavailable);
        sim.inject_event(cri::ContainerEventResponse::default());
        if m.reconnect_attempts.get().is_multiple_of(2) {
            sim.fail(Op::Events, tonic::Code::Unknown, Some(1));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    pleg.request_relist("nobody", RelistSource::EventedPleg);
    pleg.stop();
    let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    let unavailable = text.matches("CRI event stream unavailable").count();
    let invalid = text.matches("ignoring a CRI event").count();
    assert!(unavailable >= 1, "the first failure is logged:\n{text}");
    assert!(
        unavailable <= 2,
        "{unavailable} stream error lines for 200 failures:\n{text}"
    );
    assert!(invalid <= 2, "{invalid} invalid-event lines");
    assert!(
        text.lines().count() < 40,
        "{} log lines:\n{text}",
        text.lines().count()
    );
}
