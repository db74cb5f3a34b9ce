//! `plegd demo --otlp-events` against an in-process OTLP receiver: every event written to stdout arrives as one log record with its event
//! name, revision and node; and the flags are refused when they cannot work.

use std::process::{Output, Stdio};

use std::time::Instant;

use integration_tests::otlp::{LogsReceiver, StalledCollector, Value};
use integration_tests::process::command;

fn plegd(args: &[&str]) -> Output {
    command(env!("CARGO_BIN_EXE_plegd"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("plegd runs")
}

/// `plegd demo --otlp-events` of 4 pods for 2 s, events as JSON on stdout, exporting
/// to `endpoint`, with `extra` flags and a churn period of `churn`. Checks that plegd
/// exited 0 and printed at least 8 events; returns them and stderr.
fn demo(endpoint: &str, extra: &[&str], churn: &str) -> (Vec<serde_json::Value>, String) {
    let mut args = vec!["demo", "--otlp-events", "--otlp-events-endpoint", endpoint];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[
        "--pods",
        "4",
        "--churn-period",
        churn,
        "--duration",
        "2s",
        "--events-json",
        "-",
        "--metrics-addr",
        "off",
    ]);
    let out = plegd(&args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{}\n{stderr}", out.status);
    let events: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert!(
        events.len() >= 8,
        "the demo published {} events",
        events.len()
    );
    (events, stderr)
}

#[test]
fn demo_exports_every_event_it_prints_as_a_log_record() {
    let receiver = LogsReceiver::default();
    let endpoint = receiver.start();
    let (events, stderr) = demo(&endpoint, &["--node-name", "node-7"], "50ms");
    // Shutdown drains the export before plegd exits: everything is there already.
    let logs = receiver.logs();
    assert_eq!(logs.len(), events.len(), "one record per event\n{stderr}");
    for e in &events {
        let revision = e["revision"].as_i64().expect("revision");
        let log = logs
            .iter()
            .find(|l| l.attr("plegd.revision") == Some(&Value::IntValue(revision)))
            .unwrap_or_else(|| panic!("no record of revision {revision}"));
        let name = match e["type"].as_str() {
            Some("ContainerStarted") => "plegd.container.started",
            Some("ContainerDied") => "plegd.container.died",
            Some("ContainerRemoved") => "plegd.container.removed",
            Some("PodSync") => "plegd.pod.sync",
            other => panic!("unexpected type {other:?}"),
        };
        assert_eq!(log.record.event_name, name);
        let text = |k: &str| match log.attr(k) {
            Some(Value::StringValue(s)) => s.clone(),
            other => panic!("{k}: {other:?}"),
        };
        assert_eq!(text("k8s.node.name"), "node-7");
        assert_eq!(text("k8s.pod.uid"), e["pod_uid"].as_str().unwrap());
        assert_eq!(text("container.runtime.name"), "plegd-sim");
        assert_eq!(
            log.resource.get("k8s.node.name"),
            Some(&Value::StringValue("node-7".into()))
        );
    }
}

#[test]
fn a_stalled_collector_changes_neither_stdout_nor_the_exit() {
    let stalled = StalledCollector::start();
    let started = Instant::now();
    let (events, stderr) = demo(stalled.endpoint(), &[], "20ms");
    let took = started.elapsed();
    // Every event on stdout, none missed, in order.
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["revision"].as_u64(), Some(i as u64 + 1));
        assert!(e.get("missed").is_none(), "stdout missed events: {e}");
    }
    assert!(stalled.accepted() >= 1, "plegd connected to the collector");
    // The queued records were given up at shutdown (the export's drain) and told.
    eprintln!("plegd demo with a stalled collector ran {took:?} (2 s of demo)");
    assert!(
        stderr.contains("lifecycle events not exported over OTLP"),
        "the drops are told:\n{stderr}"
    );
}

#[test]
fn otlp_events_flags_that_cannot_work_exit_2_named() {
    let out = plegd(&["demo", "--otlp-events", "--duration", "1s"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--otlp-events: no collector"), "{err}");

    let out = plegd(&[
        "demo",
        "--otlp-events-endpoint",
        "http://127.0.0.1:4317",
        "--duration",
        "1s",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--otlp-events is off"), "{err}");

    // Defaults to the traces' endpoint.
    let out = plegd(&[
        "demo",
        "--otlp-events",
        "--otlp-endpoint",
        "http://127.0.0.1:4317",
        "--print-config",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("otlp-events = true"));
}
