//! The `plegd` binary end to end: exit codes and messages, the JSON event output,
//! the operator endpoint, and graceful shutdown on SIGTERM/SIGINT.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use plegd_sim::{spawn_in_thread, FakeRuntime};

const TIMEOUT: Duration = Duration::from_secs(30);

fn plegd() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_plegd"));
    c.env("RUST_LOG", "info");
    c
}

fn run_to_end(args: &[&str]) -> Output {
    let mut child = plegd()
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + TIMEOUT;
    while child.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "plegd {args:?} did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

fn signal(child: &Child, sig: &str) {
    let ok = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
}

/// Waits for exit; returns the status and how long it took.
fn wait_exit(child: &mut Child) -> (std::process::ExitStatus, Duration) {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return (st, start.elapsed());
        }
        assert!(start.elapsed() < TIMEOUT, "plegd did not stop");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    let code = body.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body))
}

#[test]
fn bad_flags_exit_2_with_the_flag_named() {
    let out = run_to_end(&[
        "run",
        "--runtime-endpoint",
        "unix:///x.sock",
        "--relist-period",
        "0s",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--relist-period"), "{err}");

    let out = run_to_end(&["run", "--runtime-endpoint", "tcp://127.0.0.1:1"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--runtime-endpoint") && err.contains("unix:///"),
        "{err}"
    );

    let out = run_to_end(&["run"]);
    assert_eq!(out.status.code(), Some(2), "missing endpoint");

    let out = run_to_end(&[
        "demo",
        "--reconnect-base",
        "2s",
        "--reconnect-cap",
        "1s",
        "--metrics-addr",
        "off",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--reconnect-cap"));
}

#[test]
fn an_unreachable_runtime_exits_1_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let missing = format!("unix://{}/nope.sock", dir.path().display());
    let out = run_to_end(&[
        "run",
        "--runtime-endpoint",
        &missing,
        "--metrics-addr",
        "off",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("nope.sock") && err.contains("No such file"),
        "{err}"
    );

    let file = dir.path().join("plain-file");
    std::fs::write(&file, "x").unwrap();
    let out = run_to_end(&[
        "run",
        "--runtime-endpoint",
        &format!("unix://{}", file.display()),
        "--metrics-addr",
        "off",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a unix socket"));

    // A socket that is not a gRPC server at all.
    let sock = dir.path().join("not-grpc.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            drop(s);
        }
    });
    let out = run_to_end(&[
        "run",
        "--runtime-endpoint",
        &format!("unix://{}", sock.display()),
        "--metrics-addr",
        "off",
        "--runtime-request-timeout",
        "1s",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("start-up check"));
}

#[test]
fn run_prints_json_events_and_stops_on_sigterm_without_losing_any() {
    let dir = tempfile::tempdir().unwrap();
    let sim = FakeRuntime::new();
    let sb = sim.run_pod("uid-1", "web", "prod");
    let c = sim.run_container(&sb, "app");
    let server = spawn_in_thread(&dir.path().join("cri.sock"), sim.clone()).unwrap();
    let mut child = plegd()
        .args([
            "run",
            "--runtime-endpoint",
            &server.endpoint(),
            "--metrics-addr",
            "off",
            "--relist-period",
            "100ms",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = || -> serde_json::Value {
        let line = lines.next().expect("a line").expect("utf-8");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"))
    };
    let first = next();
    assert_eq!(first["type"], "ContainerStarted");
    assert_eq!(first["pod_uid"], "uid-1");
    assert_eq!(first["pod_name"], "web");
    assert_eq!(first["pod_namespace"], "prod");
    assert_eq!(first["relist_source"], "global");
    assert_eq!(first["container_id"], sb.as_str());
    let t = first["time"].as_str().unwrap();
    assert!(
        t.ends_with('Z') && t.len() == "2026-01-01T00:00:00.000000000Z".len(),
        "{t}"
    );
    assert_eq!(next()["container_id"], c.as_str());
    sim.exit_container(&c, 1);
    let died = next();
    assert_eq!(died["type"], "ContainerDied");
    assert_eq!(died["relist_source"], "evented_pleg");
    // Many events at once, then SIGTERM right away: every one is written.
    for i in 0..50 {
        sim.run_container(&sb, &format!("extra-{i}"));
    }
    let mut started = 0;
    while started < 50 {
        if next()["type"] == "ContainerStarted" {
            started += 1;
        }
    }
    signal(&child, "TERM");
    let (status, took) = wait_exit(&mut child);
    assert!(status.success(), "{status:?}");
    println!("SIGTERM to exit: {took:?}");
    assert!(lines.next().is_none(), "output closed after shutdown");
}

#[test]
fn demo_serves_events_metrics_and_health_and_stops_on_sigint() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let port = free_port();
    let mut child = plegd()
        .args([
            "demo",
            "--pods",
            "5",
            "--churn-period",
            "20ms",
            "--relist-period",
            "200ms",
            "--events-json",
            events.to_str().unwrap(),
            "--metrics-addr",
            &format!("127.0.0.1:{port}"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + TIMEOUT;
    let mut kinds = std::collections::HashSet::new();
    let mut sources = std::collections::HashSet::new();
    while !(kinds.contains("ContainerDied") && sources.contains("evented_pleg")) {
        assert!(
            Instant::now() < deadline,
            "demo produced {kinds:?} {sources:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
        let text = std::fs::read_to_string(&events).unwrap_or_default();
        for line in text.lines() {
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
                kinds.insert(v["type"].as_str().unwrap_or_default().to_string());
                sources.insert(v["relist_source"].as_str().unwrap_or_default().to_string());
            }
        }
    }
    assert!(kinds.contains("ContainerStarted"));
    let (code, body) = http_get(port, "/metrics").expect("metrics endpoint");
    assert_eq!(code, 200);
    assert!(body.contains("kubelet_pleg_relist_duration_seconds_count"));
    assert!(body.contains("kubelet_pleg_events_total{relist_source=\"evented_pleg\"}"));
    assert_eq!(http_get(port, "/healthz").map(|r| r.0), Some(200));
    assert_eq!(http_get(port, "/readyz").map(|r| r.0), Some(200));
    signal(&child, "INT");
    let (status, took) = wait_exit(&mut child);
    assert!(status.success(), "{status:?}");
    println!("SIGINT to exit: {took:?}");
}

#[test]
fn help_explains_itself() {
    let out = run_to_end(&["run", "--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--runtime-endpoint",
        "--relist-period",
        "--events-json",
        "--evented",
        "--metrics-addr",
        "Exit status",
    ] {
        assert!(help.contains(flag), "{flag} missing from help");
    }
}

fn print_config(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let mut cmd = plegd();
    cmd.args(args).arg("--print-config");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn config_precedence_is_flags_then_env_then_file_then_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plegd.toml");
    std::fs::write(
        &file,
        "runtime-endpoint = \"unix:///from/file.sock\"\nrelist-period = \"5s\"\nqueue-capacity = 7\nhealth-threshold = \"10m\"\nevented = false\n",
    )
    .unwrap();
    let f = file.to_str().unwrap();
    let (code, out, err) = print_config(
        &["run", "--config", f, "--queue-capacity", "9"],
        &[("PLEGD_RELIST_PERIOD", "3s"), ("PLEGD_QUEUE_CAPACITY", "8")],
    );
    assert_eq!(code, Some(0), "{err}");
    let cfg: toml::Table = toml::from_str(&out).unwrap();
    assert_eq!(cfg["queue-capacity"].as_integer(), Some(9), "flag wins");
    assert_eq!(cfg["relist-period"].as_str(), Some("3s"), "env beats file");
    assert_eq!(
        cfg["health-threshold"].as_str(),
        Some("10m"),
        "file beats default"
    );
    assert_eq!(cfg["evented"].as_bool(), Some(false));
    assert_eq!(
        cfg["runtime-endpoint"].as_str(),
        Some("unix:///from/file.sock")
    );
    assert_eq!(
        cfg["runtime-request-timeout"].as_str(),
        Some("2s"),
        "default"
    );
    // The config file itself can come from the environment.
    let (code, out, _) = print_config(&["run"], &[("PLEGD_CONFIG", f)]);
    assert_eq!(code, Some(0));
    assert!(out.contains("relist-period = \"5s\""));
}

#[test]
fn bad_config_fails_at_start_naming_the_key_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[(&str, &str, &str)] = &[
        ("relist-period = \"-1s\"\n", "relist-period", "negative"),
        ("relist-period = \"soon\"\n", "relist-period", "500ms"),
        ("bogus = 1\n", "bogus", "unknown key"),
        ("queue-capacity = 0\n", "queue-capacity", "between"),
        ("evented = \"yes\"\n", "evented", "true or false"),
        ("metrics-addr = \"nowhere\"\n", "metrics-addr", "HOST:PORT"),
        ("otlp-endpoint = \"grpc://x\"\n", "otlp-endpoint", "http://"),
        (
            "runtime-endpoint = \"tcp://1.2.3.4:5\"\n",
            "runtime-endpoint",
            "scheme",
        ),
        ("this is not toml", "not valid TOML", ""),
    ];
    for (i, (text, key, reason)) in cases.iter().enumerate() {
        let file = dir.path().join(format!("c{i}.toml"));
        std::fs::write(&file, text).unwrap();
        let (code, _, err) = print_config(
            &[
                "run",
                "--runtime-endpoint",
                "unix:///x.sock",
                "--config",
                file.to_str().unwrap(),
            ],
            &[],
        );
        let (code, err) = if *key == "runtime-endpoint" {
            let (c, _, e) = print_config(&["run", "--config", file.to_str().unwrap()], &[]);
            (c, e)
        } else {
            (code, err)
        };
        assert_eq!(code, Some(2), "{text}: {err}");
        assert!(err.contains(key) && err.contains(reason), "{text}: {err}");
    }
    let (code, _, err) = print_config(&["run", "--config", "/nonexistent/plegd.toml"], &[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("cannot read"), "{err}");
    let (code, _, err) = print_config(&["demo", "--relist-period=-5s"], &[]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("--relist-period") && err.contains("negative"),
        "{err}"
    );
    let (code, _, err) = print_config(&["demo"], &[("PLEGD_QUEUE_CAPACITY", "lots")]);
    assert_eq!(code, Some(2), "{err}");
}
