//! Lifecycle events as OTLP log records: an in-process OTLP receiver gets
//! one record per published event with the semantic conventions' attributes; a
//! collector that refuses connections or stalls while 10,000 events are published
//! costs counted drops and nothing else — the relist schedule goes on, the other
//! subscribers (stdout's stand-in) get every event, and in the end
//! `exported + dropped == published`, exactly.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use integration_tests::otlp::{refusing_endpoint, LogsReceiver, ReceivedLog, StalledCollector};
use integration_tests::pleg::{global_relists, start_generic};
use integration_tests::traces::identity;
use integration_tests::wait::*;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use plegd_actors::{Delivery, EventKind, Pleg, PlegConfig, Subscription};
use plegd_otlp_events::{event_name, image_name_and_tag, EventLogConfig, EventLogExport};
use plegd_runtime::RuntimeClient;
use plegd_sim::FakeRuntime;
use plegd_telemetry::{Metrics, RelistSource};

fn text(v: &str) -> Value {
    Value::StringValue(v.to_string())
}

fn nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64
}

fn published(m: &Metrics) -> u64 {
    RelistSource::ALL.iter().map(|&s| m.events(s)).sum()
}

/// The record of `d`, once received.
fn record_of<'a>(logs: &'a [ReceivedLog], d: &Delivery) -> &'a ReceivedLog {
    let rev = Value::IntValue(d.event.revision as i64);
    logs.iter()
        .find(|l| l.attr("plegd.revision") == Some(&rev))
        .unwrap_or_else(|| panic!("no record of revision {}", d.event.revision))
}

/// Every attribute of `l` against the event it stands for.
fn check(l: &ReceivedLog, d: &Delivery, runtime: &str) {
    let e = &d.event;
    let r = &l.record;
    assert_eq!(r.event_name, event_name(e.kind));
    assert_eq!(
        r.time_unix_nano,
        nanos(e.time),
        "timestamp = the event's time"
    );
    assert!(
        r.observed_time_unix_nano >= r.time_unix_nano,
        "observed (published) after the status read"
    );
    let want = |k: &str| l.attr(k).cloned();
    assert_eq!(want("k8s.pod.uid"), Some(text(&e.pod.uid)));
    assert_eq!(want("k8s.pod.name"), Some(text(&e.pod.name)));
    assert_eq!(want("k8s.namespace.name"), Some(text(&e.pod.namespace)));
    assert_eq!(want("k8s.node.name"), Some(text("test-node")));
    assert_eq!(
        want("k8s.container.name"),
        (!e.container_name.is_empty()).then(|| text(&e.container_name))
    );
    assert_eq!(
        want("container.id"),
        (!e.container_id.is_empty()).then(|| text(&e.container_id))
    );
    assert_eq!(
        want("k8s.container.restart_count"),
        e.attempt.map(|a| Value::IntValue(i64::from(a)))
    );
    assert_eq!(
        want("container.image.name"),
        e.image.as_deref().map(|i| text(image_name_and_tag(i).0))
    );
    assert_eq!(want("container.runtime.name"), Some(text(runtime)));
    assert_eq!(
        want("process.exit.code"),
        e.exit.as_ref().map(|x| Value::IntValue(i64::from(x.code)))
    );
    assert_eq!(
        want("k8s.container.status.last_terminated_reason"),
        e.exit.as_ref().and_then(|x| x.reason.as_deref()).map(text)
    );
    assert_eq!(
        want("plegd.relist_source"),
        Some(text(e.relist_source.as_str()))
    );
    assert_eq!(
        want("plegd.revision"),
        Some(Value::IntValue(e.revision as i64))
    );
    assert_eq!(want("plegd.sandbox"), Some(Value::BoolValue(e.sandbox)));
    assert_eq!(l.scope, "plegd.events");
    for (k, v) in [
        ("service.name", "plegd"),
        ("service.version", "0.0.0-test"),
        ("host.name", "test-host"),
        ("k8s.node.name", "test-node"),
    ] {
        assert_eq!(l.resource.get(k), Some(&text(v)), "resource {k}");
    }
    assert!(l.resource.contains_key("service.instance.id"));
}

fn severity(l: &ReceivedLog) -> (i32, &str) {
    (l.record.severity_number, l.record.severity_text.as_str())
}

/// Closes the publisher and waits for the export to finish its drain.
async fn finish(pleg: &Pleg, export: EventLogExport) {
    pleg.stop();
    wait_until("the dispatcher stops", || pleg.stopped()).await;
    pleg.close_publisher().await;
    wait_until("the export ends", || export.is_finished()).await;
    export.join();
}

#[actix_rt::test]
async fn every_event_becomes_a_log_record_with_the_conventions() {
    let receiver = LogsReceiver::default();
    let endpoint = receiver.start();
    let rt = FakeRuntime::new();
    let cfg = PlegConfig {
        relist_period: Duration::from_millis(50),
        ..PlegConfig::default()
    };
    let pleg = Pleg::start(Arc::new(rt.clone()), &cfg, Arc::new(Metrics::new()));
    let m = pleg.metrics().clone();
    let runtime = rt.version().await.unwrap().runtime_name;
    let config = EventLogConfig::new(&endpoint, identity(), Some(runtime.clone()));
    let export = EventLogExport::start(
        pleg.subscribe("otlp-events", 1024).await.unwrap(),
        config,
        m.clone(),
    )
    .unwrap();
    let sub = pleg.subscribe("t", 1024).await.unwrap();

    let sb = rt.run_pod("u1", "web", "ns");
    let sandbox = expect_event(&sub, EventKind::ContainerStarted, &sb).await;
    let app = rt.run_container(&sb, "app");
    let started = expect_event(&sub, EventKind::ContainerStarted, &app).await;
    rt.exit_container(&app, 3);
    let died = expect_event(&sub, EventKind::ContainerDied, &app).await;
    let hog = rt.run_container(&sb, "hog");
    expect_event(&sub, EventKind::ContainerStarted, &hog).await;
    rt.oom_kill_container(&hog);
    let oom = expect_event(&sub, EventKind::ContainerDied, &hog).await;
    rt.remove_container(&app);
    let removed = expect_event(&sub, EventKind::ContainerRemoved, &app).await;
    rt.fail_pod_status("u1", true);
    // A targeted relist reads the pod whether or not it changed.
    pleg.request_relist("u1", RelistSource::PostSync);
    wait_until("the status error is cached", || {
        pleg.cache().get("u1").is_some_and(|e| e.error.is_some())
    })
    .await;
    rt.fail_pod_status("u1", false);
    let sync = recv_until(&sub, "PodSync", |d| d.event.kind == EventKind::PodSync)
        .await
        .pop()
        .unwrap();
    // Records leave in publication order: the last one in means all are.
    let last = Value::IntValue(sync.event.revision as i64);
    wait_until("the PodSync record", || {
        receiver
            .logs()
            .iter()
            .any(|l| l.attr("plegd.revision") == Some(&last))
    })
    .await;

    let logs = receiver.logs();
    for d in [&sandbox, &started, &died, &oom, &removed, &sync] {
        check(record_of(&logs, d), d, &runtime);
    }
    assert_eq!(severity(record_of(&logs, &started)), (9, "INFO"));
    assert_eq!(severity(record_of(&logs, &removed)), (9, "INFO"));
    assert_eq!(severity(record_of(&logs, &sync)), (9, "INFO"));
    let died_log = record_of(&logs, &died);
    assert_eq!(severity(died_log), (13, "WARN"), "non-zero exit");
    assert_eq!(
        died_log.attr("process.exit.code"),
        Some(&Value::IntValue(3))
    );
    let oom_log = record_of(&logs, &oom);
    assert_eq!(severity(oom_log), (17, "ERROR"), "OOMKilled");
    assert_eq!(
        oom_log.attr("k8s.container.status.last_terminated_reason"),
        Some(&text("OOMKilled"))
    );
    assert_eq!(
        record_of(&logs, &sandbox).attr("plegd.sandbox"),
        Some(&Value::BoolValue(true))
    );
    assert_eq!(record_of(&logs, &sync).attr("container.id"), None);
    assert_eq!(
        record_of(&logs, &started).attr("container.image.name"),
        Some(&text("plegd-sim/app"))
    );

    finish(&pleg, export).await;
    assert_eq!(m.otlp_events_dropped.get(), 0);
    assert_eq!(m.otlp_events_exported.get(), published(&m));
    assert_eq!(receiver.count() as u64, published(&m));
}

/// Pods × containers: each container starts and dies, each sandbox starts.
const PODS: usize = 100;
const CONTAINERS: usize = 50;
const EVENTS: u64 = (PODS + 2 * PODS * CONTAINERS) as u64;

/// Publishes `EVENTS` (> 10,000) events while the export sends to `endpoint`, whose
/// requests time out after `timeout`; checks that nothing but the export noticed.
/// Returns the metrics after the export's end.
async fn flood(
    endpoint: &str,
    timeout: Duration,
    stalled: Option<&StalledCollector>,
) -> Arc<Metrics> {
    let rt = FakeRuntime::new();
    let pleg = start_generic(&rt, Duration::from_millis(20));
    let m = pleg.metrics().clone();
    let config = EventLogConfig {
        timeout,
        ..EventLogConfig::new(endpoint, identity(), None)
    };
    let (queue, batch) = (config.queue as u64, config.batch as u64);
    let export = EventLogExport::start(
        pleg.subscribe("otlp-events", 16_384).await.unwrap(),
        config,
        m.clone(),
    )
    .unwrap();
    // Stands for stdout: as large a queue as serve.rs gives the output.
    let output = pleg.subscribe("output", 65_536).await.unwrap();

    let mut containers = Vec::new();
    for p in 0..PODS {
        let sb = rt.run_pod(&format!("u{p}"), &format!("p{p}"), "ns");
        for c in 0..CONTAINERS {
            containers.push(rt.run_container(&sb, &format!("c{c}")));
        }
    }
    let mut got = Vec::new();
    collect(&output, &mut got, PODS as u64 * (CONTAINERS as u64 + 1)).await;
    for c in &containers {
        rt.exit_container(c, 1);
    }
    collect(&output, &mut got, EVENTS).await;

    // The other subscriber got every event, in order, none missed.
    for (i, d) in got.iter().enumerate() {
        assert_eq!(d.missed, 0, "the output missed events");
        assert_eq!(d.seq, i as u64 + 1);
        assert_eq!(d.event.revision, i as u64 + 1);
    }
    // Drops are counted as they happen, not at the end.
    if let Some(s) = stalled {
        wait_until("a connection to the stalled collector", || {
            s.accepted() >= 1
        })
        .await;
        wait_until("drops counted while stalled", || {
            m.otlp_events_dropped.get() >= EVENTS - queue - batch
        })
        .await;
        assert_eq!(m.otlp_events_exported.get(), 0);
    } else {
        wait_until("every refused record counted", || {
            m.otlp_events_dropped.get() == EVENTS
        })
        .await;
    }
    // The relist schedule goes on while the export is stuck.
    let before = global_relists(&pleg);
    wait_until("global relists go on", || {
        global_relists(&pleg) >= before + 20
    })
    .await;
    assert_eq!(m.relist_errors(plegd_telemetry::RelistPhase::List), 0);

    finish(&pleg, export).await;
    assert_eq!(published(&m), EVENTS);
    assert_eq!(
        m.otlp_events_exported.get() + m.otlp_events_dropped.get(),
        published(&m),
        "every published event is exported or counted as dropped"
    );
    m
}

async fn collect(sub: &Subscription, got: &mut Vec<Delivery>, n: u64) {
    wait_until(&format!("{n} events on the output"), || {
        got.extend(drain(sub));
        got.len() as u64 >= n
    })
    .await;
}

#[actix_rt::test]
async fn a_refusing_collector_costs_counted_drops_only() {
    let m = flood(&refusing_endpoint(), Duration::from_secs(3), None).await;
    assert_eq!(m.otlp_events_exported.get(), 0);
    assert_eq!(m.otlp_events_dropped.get(), EVENTS);
}

#[actix_rt::test]
async fn a_stalled_collector_costs_counted_drops_only() {
    let stalled = StalledCollector::start();
    // Longer than the test: the first request is still waiting at shutdown.
    let m = flood(stalled.endpoint(), Duration::from_secs(300), Some(&stalled)).await;
    assert_eq!(m.otlp_events_exported.get(), 0);
    assert_eq!(m.otlp_events_dropped.get(), EVENTS);
}

#[actix_rt::test]
async fn a_collector_that_refuses_then_recovers_gets_the_later_events() {
    let receiver = LogsReceiver::default();
    let endpoint = receiver.start();
    receiver.refuse_next(2);
    let rt = FakeRuntime::new();
    let pleg = start_generic(&rt, Duration::from_millis(20));
    let m = pleg.metrics().clone();
    let export = EventLogExport::start(
        pleg.subscribe("otlp-events", 1024).await.unwrap(),
        EventLogConfig::new(&endpoint, identity(), None),
        m.clone(),
    )
    .unwrap();
    let sub = pleg.subscribe("t", 1024).await.unwrap();
    // One event at a time until the collector has refused twice.
    let mut i = 0;
    while receiver.refused() == 0 || receiver.requests() == 0 {
        let sb = rt.run_pod(&format!("u{i}"), "p", "ns");
        expect_event(&sub, EventKind::ContainerStarted, &sb).await;
        let settled = published(&m);
        wait_until("the record is exported or dropped", || {
            m.otlp_events_exported.get() + m.otlp_events_dropped.get() == settled
        })
        .await;
        i += 1;
    }
    assert_eq!(m.otlp_events_dropped.get() as usize, receiver.refused());
    assert_eq!(m.otlp_events_exported.get() as usize, receiver.count());
    finish(&pleg, export).await;
    assert_eq!(
        m.otlp_events_exported.get() + m.otlp_events_dropped.get(),
        published(&m)
    );
}
