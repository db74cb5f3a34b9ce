//! The `plegd` binary end to end: exit codes and messages, configuration (flags,
//! environment, config file, `--print-config`), the JSON event output, the operator
//! endpoint, and graceful shutdown on SIGTERM/SIGINT.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use plegd_sim::{spawn_in_thread, FakeRuntime};

use integration_tests::process::{
    self, command, exit_and_stderr, free_port, http_get, signal, wait_exit, wait_until, Reaped,
    TIMEOUT,
};

/// The binary under test.
fn plegd() -> std::process::Command {
    command(env!("CARGO_BIN_EXE_plegd"))
}

fn run_to_end(args: &[&str]) -> Output {
    process::run_to_end(plegd().args(args)).0
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

/// `plegd run` with every setting given, so that `--print-config` shows every key.
const EVERY_SETTING: &[&str] = &[
    "run",
    "--runtime-endpoint",
    "unix:///x.sock",
    "--events-json",
    "-",
    "--otlp-endpoint",
    "http://127.0.0.1:4317",
    "--otlp-events",
    "--otlp-events-endpoint",
    "http://127.0.0.1:4318",
    "--hint-sources",
    "cri-events",
];

#[test]
fn help_explains_every_setting() {
    let (code, out, err) = print_config(EVERY_SETTING, &[]);
    assert_eq!(code, Some(0), "{err}");
    let keys: Vec<String> = toml::from_str::<toml::Table>(&out)
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert!(keys.len() >= 13, "{keys:?}");
    for command in ["run", "demo"] {
        let help = String::from_utf8_lossy(&run_to_end(&[command, "--help"]).stdout).into_owned();
        let flags = keys
            .iter()
            .filter(|k| !(command == "demo" && *k == "runtime-endpoint"))
            .map(|k| format!("--{k}"))
            .chain(["--config".into(), "--print-config".into()]);
        for flag in flags {
            // Each flag's line is followed by a line explaining it.
            let lines: Vec<&str> = help.lines().map(str::trim).collect();
            let at = lines
                .iter()
                .position(|l| l.split_whitespace().next() == Some(flag.as_str()))
                .unwrap_or_else(|| panic!("{command} --help lacks {flag}"));
            let explained = lines.get(at + 1).copied().unwrap_or_default();
            assert!(
                !explained.is_empty() && !explained.starts_with('-'),
                "{command} --help: {flag} unexplained"
            );
        }
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
        // Regression: an empty name from the file passed (the flag refused it).
        ("node-name = \"\"\n", "node-name", "must not be empty"),
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

/// Writes `text` as a config file in `dir`; returns its path.
fn config_file(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn an_unknown_key_in_the_config_file_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let f = config_file(
        &dir,
        "c.toml",
        "relist-period = \"2s\"\nrelist-perod = \"3s\"\n",
    );
    let run = [
        "run",
        "--runtime-endpoint",
        "unix:///x.sock",
        "--config",
        &f,
    ];
    let demo = ["demo", "--config", &f];
    for args in [&run[..], &demo[..]] {
        let command = args[0];
        let (code, out, err) = print_config(args, &[]);
        assert_eq!(code, Some(2), "{command}: {out}");
        assert!(
            err.contains("unknown key \"relist-perod\"") && err.contains("relist-period"),
            "{command}: {err}"
        );
    }
    // A flag of the command line is not a key of the file.
    let f = config_file(&dir, "d.toml", "print-config = true\n");
    let (code, _, err) = print_config(&["demo", "--config", &f], &[]);
    assert_eq!(code, Some(2));
    assert!(err.contains("unknown key \"print-config\""), "{err}");
}

#[test]
fn a_file_value_loses_to_env_and_to_flags_and_beats_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let f = config_file(
        &dir,
        "c.toml",
        "relist-period = \"5s\"\nmetrics-addr = \"off\"\nevented = false\n",
    );
    let effective = |args: &[&str], env: &[(&str, &str)]| -> toml::Table {
        let mut all = vec!["demo", "--config", &f];
        all.extend_from_slice(args);
        let (code, out, err) = print_config(&all, env);
        assert_eq!(code, Some(0), "{all:?} {env:?}: {err}");
        toml::from_str(&out).unwrap()
    };
    let file = effective(&[], &[]);
    assert_eq!(
        file["relist-period"].as_str(),
        Some("5s"),
        "file beats default"
    );
    assert_eq!(file["metrics-addr"].as_str(), Some("off"));
    assert_eq!(file["evented"].as_bool(), Some(false));
    assert_eq!(file["queue-capacity"].as_integer(), Some(1024), "default");

    let env = effective(
        &[],
        &[
            ("PLEGD_RELIST_PERIOD", "2s"),
            ("PLEGD_METRICS_ADDR", "127.0.0.1:1"),
            ("PLEGD_EVENTED", "true"),
        ],
    );
    assert_eq!(env["relist-period"].as_str(), Some("2s"), "env beats file");
    assert_eq!(env["metrics-addr"].as_str(), Some("127.0.0.1:1"));
    assert_eq!(env["evented"].as_bool(), Some(true));

    // Even a flag set to the default's value beats the file.
    let flags = effective(
        &[
            "--relist-period",
            "1s",
            "--metrics-addr",
            "127.0.0.1:9464",
            "--evented",
            "true",
        ],
        &[("PLEGD_RELIST_PERIOD", "2s")],
    );
    assert_eq!(
        flags["relist-period"].as_str(),
        Some("1s"),
        "flag beats env and file"
    );
    assert_eq!(flags["metrics-addr"].as_str(), Some("127.0.0.1:9464"));
    assert_eq!(flags["evented"].as_bool(), Some(true));
}

#[test]
fn a_bad_value_exits_2_naming_the_flag() {
    /// Flags, environment, and the flag the error must name.
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case<'_>] = &[
        (&["--queue-capacity", "0"], &[], "--queue-capacity"),
        (
            &["--status-concurrency", "257"],
            &[],
            "--status-concurrency",
        ),
        (
            &[],
            &[("PLEGD_STATUS_CONCURRENCY", "0")],
            "--status-concurrency",
        ),
        (
            &[],
            &[("PLEGD_HEALTH_THRESHOLD", "0s")],
            "--health-threshold",
        ),
        (&["--metrics-addr", "nowhere"], &[], "--metrics-addr"),
        (&["--otlp-endpoint", "grpc://x"], &[], "--otlp-endpoint"),
        (&["--evented", "yes"], &[], "--evented"),
        (&["--hint-sources", "inotify"], &[], "--hint-sources"),
        (
            &["--hint-sources", "cri-events,cri-events"],
            &[],
            "--hint-sources",
        ),
        (&[], &[("PLEGD_HINT_SOURCES", "")], "--hint-sources"),
        // The NRI socket: a relative path would depend on the working directory.
        (
            &["--nri-socket", "nri.sock"],
            &[],
            "--nri-socket nri.sock: must be an absolute path",
        ),
        (
            &["--evented=false", "--hint-sources", "cri-events"],
            &[],
            "--hint-sources: cri-events",
        ),
        (&["--pods", "0"], &[], "--pods"),
        (&["--churn-period=-1s"], &[], "--churn-period"),
        // Regression: absurd durations passed, then panicked (or killed the
        // dispatcher while /metrics kept answering).
        (
            &["--runtime-request-timeout", "20000y"],
            &[],
            "--runtime-request-timeout",
        ),
        (
            &["--relist-period", "300000000000y"],
            &[],
            "--relist-period",
        ),
        (&["--reconnect-cap", "1000y"], &[], "--reconnect-cap"),
        (&["--reconnect-base", "1000y"], &[], "--reconnect-base"),
        (
            &[],
            &[("PLEGD_RECONNECT_HEALTHY_RESET", "1000y")],
            "--reconnect-healthy-reset",
        ),
        (&["--health-threshold", "1000y"], &[], "--health-threshold"),
        (&["--duration", "1000y"], &[], "--duration"),
        // Values that are fine alone but not together.
        (
            &["--reconnect-base", "2s", "--reconnect-cap", "1s"],
            &[],
            "--reconnect-cap",
        ),
        // Regression: accepted, then /healthz failed on a healthy node.
        (
            &["--relist-period", "30s", "--health-threshold", "2s"],
            &[],
            "--health-threshold 2s: must be at least twice --relist-period (30s)",
        ),
        (
            &[],
            &[("PLEGD_RELIST_PERIOD", "2m")],
            "--health-threshold 3m",
        ),
        // Regression: accepted, and the global relists ran back to back.
        (
            &["--relist-period", "1ns"],
            &[],
            "--relist-period 1ns: must be at least 10ms",
        ),
        // Regression: a blank name passed from the environment.
        (&[], &[("PLEGD_NODE_NAME", " ")], "--node-name \" \""),
        (&["--node-name", "node-1 "], &[], "--node-name"),
        (&["--node-name", "node\n1"], &[], "--node-name"),
        // The same place spelled two ways.
        (
            &[
                "--api-socket",
                "/tmp/plegd-same.sock",
                "--api-control-socket",
                "/tmp/../tmp/plegd-same.sock",
            ],
            &[],
            "the same path as --api-socket",
        ),
        // Regression: passed, then the start failed on plegd's own socket lock.
        (
            &[
                "--api-socket",
                "/tmp/plegd-same.sock",
                "--api-control-socket",
                "/tmp/plegd-same.sock",
            ],
            &[],
            "the same path as --api-socket",
        ),
        // The demo brings its own runtime.
        (
            &["--runtime-endpoint", "unix:///x.sock"],
            &[],
            "--runtime-endpoint",
        ),
    ];
    for (args, env, flag) in cases {
        let mut all = vec!["demo"];
        all.extend_from_slice(args);
        let (code, out, err) = print_config(&all, env);
        assert_eq!(code, Some(2), "{args:?} {env:?}: {out}");
        assert!(err.contains(flag), "{args:?} {env:?}: {err}");
    }
    // plegd run: the endpoint, wherever it comes from.
    let (code, _, err) = print_config(&["run"], &[("PLEGD_RUNTIME_ENDPOINT", "/x.sock")]);
    assert_eq!(code, Some(2));
    assert!(
        err.contains("--runtime-endpoint") && err.contains("unix:///"),
        "{err}"
    );
}

#[test]
fn demo_ignores_the_runtime_endpoint_of_the_environment_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let f = config_file(
        &dir,
        "c.toml",
        "runtime-endpoint = \"unix:///from/file.sock\"\n",
    );
    let (code, out, err) = print_config(
        &["demo", "--config", &f],
        &[("PLEGD_RUNTIME_ENDPOINT", "unix:///from/env.sock")],
    );
    assert_eq!(code, Some(0), "{err}");
    assert!(!out.contains("runtime-endpoint"), "{out}");
    assert!(
        err.contains("runtime-endpoint") && err.contains("not used"),
        "{err}"
    );
}

#[test]
fn print_config_output_read_back_as_a_config_file_gives_the_same_config() {
    let dir = tempfile::tempdir().unwrap();
    let cases: &[&[&str]] = &[
        EVERY_SETTING,
        &["demo"],
        &[
            "demo",
            "--relist-period",
            "1500ms",
            "--reconnect-cap",
            "2m",
            "--queue-capacity",
            "1",
            "--status-concurrency",
            "256",
            "--evented",
            "false",
            "--metrics-addr",
            "[::1]:9",
            "--events-json",
            "/tmp/plegd events.jsonl",
        ],
    ];
    for (i, args) in cases.iter().enumerate() {
        let (code, first, err) = print_config(args, &[]);
        assert_eq!(code, Some(0), "{args:?}: {err}");
        let f = config_file(&dir, &format!("c{i}.toml"), &first);
        let (code, again, err) = print_config(&[args[0], "--config", &f], &[]);
        assert_eq!(code, Some(0), "{args:?}: {err}");
        assert_eq!(again, first, "{args:?}");
    }
}

/// A demo with busy churn writing its events to `events_json`; stderr piped.
fn busy_demo(events_json: &str, stdout: Stdio) -> Child {
    plegd()
        .args(["demo", "--pods", "20", "--churn-period", "5ms"])
        .args(["--events-json", events_json, "--metrics-addr", "off"])
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for the child's exit; its status and everything it wrote to stderr.
/// Regression: with its output's reader gone (`plegd ... | head -1`), plegd went on
/// relisting forever, silently losing every later event.
#[test]
fn a_closed_output_pipe_stops_plegd_with_an_error() {
    let mut child = busy_demo("-", Stdio::piped());
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.starts_with('{'), "{first}");
    drop(stdout); // like `head -1` exiting
    let (status, stderr) = exit_and_stderr(&mut child);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.matches("writing events").count(),
        1,
        "the failure is said once: {stderr}"
    );
}

/// Regression: `--events-json /dev/full` ran silently until SIGTERM.
#[test]
fn a_full_output_file_stops_plegd_with_an_error() {
    let mut child = busy_demo("/dev/full", Stdio::null());
    let (status, stderr) = exit_and_stderr(&mut child);
    assert_eq!(status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("writing events"), "{stderr}");
}

/// Regression: `--config /dev/zero` read until memory ran out; a FIFO hung forever.
#[test]
fn a_config_file_that_is_not_a_small_regular_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let big = dir.path().join("big.toml");
    std::fs::write(&big, format!("# {}\n", "x".repeat(2 * 1024 * 1024))).unwrap();
    for (path, reason) in [
        ("/dev/zero", "not a regular file"),
        (fifo.to_str().unwrap(), "not a regular file"),
        (big.to_str().unwrap(), "larger than"),
    ] {
        let out = run_to_end(&["demo", "--config", path, "--print-config"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{path}: {err}");
        assert!(
            err.contains("--config") && err.contains(reason),
            "{path}: {err}"
        );
    }
}

/// Regression: SIGHUP killed plegd at once (exit 129). It now reopens the events
/// file, as log rotation expects, and plegd goes on.
#[test]
fn sighup_reopens_the_events_file_and_plegd_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.json");
    let rotated = dir.path().join("events.json.1");
    let mut child = plegd()
        .args(["demo", "--pods", "5", "--churn-period", "20ms"])
        .args(["--metrics-addr", "off", "--events-json"])
        .arg(&events)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = |p: &std::path::Path| {
        std::fs::read_to_string(p)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    let deadline = Instant::now() + TIMEOUT;
    while lines(&events) == 0 {
        assert!(Instant::now() < deadline, "no event written");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::rename(&events, &rotated).unwrap();
    signal(&child, "HUP");
    while lines(&events) == 0 {
        assert!(
            Instant::now() < deadline,
            "the events file was not reopened"
        );
        assert!(child.try_wait().unwrap().is_none(), "SIGHUP stopped plegd");
        std::thread::sleep(Duration::from_millis(10));
    }
    signal(&child, "TERM");
    let (status, _) = wait_exit(&mut child);
    assert_eq!(status.code(), Some(0));
    assert!(lines(&rotated) > 0);
}

/// The value of `field` in the process `pid`'s status (`SigBlk`, `SigCgt` read as
/// hex masks, any other as a number), if it still runs.
fn status_field(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let value = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    match field {
        "SigBlk" | "SigCgt" => u64::from_str_radix(value.trim(), 16).ok(),
        _ => value.trim().parse().ok(),
    }
}

/// Regression: a SIGTERM in plegd's first milliseconds (its settings read, logging
/// and the trim thread set up, before the handlers were in) killed it (status 143,
/// no clean stop): 24 of 40 sent as its second thread (the trim thread) appeared. A
/// SIGTERM sent 0 to 1.05 ms after that thread appears stops it cleanly, in every
/// round; in some, before the handler is in (seen in its status).
#[test]
fn a_sigterm_at_any_moment_of_start_up_stops_plegd_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let spawn = || {
        plegd()
            .args(["demo", "--pods", "10", "--metrics-addr", "off"])
            .args(["--memory-trim-period", "10s"])
            .env("TMPDIR", tmp.path())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    sigterms_at_start_up(spawn, |pid| status_field(pid, "Threads").unwrap_or(0) >= 2);
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Regression: `plegd watch` let the held signals through before its handlers were in,
/// so a SIGTERM in that gap killed it (by the signal, not exit 0). Sent 0 to 1.05 ms
/// after its signals are held, every SIGTERM ends it with exit 0. Its plegd never
/// answers (a listener that accepts nothing), so the watch waits for it throughout.
#[test]
fn a_sigterm_at_any_moment_of_watch_start_up_ends_it_with_exit_0() {
    let tmp = tempfile::tempdir().unwrap();
    let socket = tmp.path().join("silent.sock");
    let _silent = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let spawn = || {
        plegd()
            .arg("watch")
            .arg("--api-socket")
            .arg(&socket)
            .args(["--timeout", "1h"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    sigterms_at_start_up(spawn, |pid| {
        status_field(pid, "SigBlk").unwrap_or(0) & SIGTERM_BIT != 0
    });
}

/// SIGTERM's bit in the masks of a process's status.
const SIGTERM_BIT: u64 = 1 << (nix::sys::signal::Signal::SIGTERM as i32 - 1);

/// 40 rounds: `spawn` a plegd, wait (without a pause) until `started(pid)` or its
/// SIGTERM handler is in, send SIGTERM 0 to 1.05 ms later, and assert it ends with
/// exit 0, not by the signal. Asserts that some SIGTERMs came before the handler (the
/// moment attacked).
fn sigterms_at_start_up(spawn: impl Fn() -> std::process::Child, started: impl Fn(u32) -> bool) {
    use nix::sys::signal::{kill, Signal};
    use std::os::unix::process::ExitStatusExt as _;
    let handled = |pid| status_field(pid, "SigCgt").unwrap_or(0) & SIGTERM_BIT != 0;
    let mut before_handler = 0;
    for round in 0..40u64 {
        let mut child = spawn();
        let start = Instant::now();
        while !started(child.id()) && !handled(child.id()) {
            if start.elapsed() > TIMEOUT || child.try_wait().unwrap().is_some() {
                let _ = child.kill();
                panic!("round {round}: never started: {:?}", child.wait());
            }
        }
        // The moment of start-up attacked, not a wait.
        std::thread::sleep(Duration::from_micros(round % 8 * 150));
        before_handler += usize::from(!handled(child.id()));
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        kill(pid, Signal::SIGTERM).unwrap();
        let (status, err) = exit_and_stderr(&mut child);
        assert_eq!(status.signal(), None, "round {round}: killed: {err}");
        assert_eq!(status.code(), Some(0), "round {round}: {err}");
    }
    println!("{before_handler} of 40 SIGTERMs sent before the handler was in");
    assert!(before_handler > 0, "no SIGTERM came before the handler");
}

/// Regression: a signal during the demo's start-up left its socket directory behind.
#[test]
fn a_signal_during_demo_start_up_still_cleans_up() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = plegd()
        .args(["demo", "--pods", "2000", "--metrics-addr", "off"])
        .env("TMPDIR", tmp.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + TIMEOUT;
    while std::fs::read_dir(tmp.path()).unwrap().count() == 0 {
        assert!(
            Instant::now() < deadline,
            "the demo never made its directory"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    signal(&child, "TERM");
    let (status, _) = wait_exit(&mut child);
    assert_eq!(status.code(), Some(0));
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Regression: a test's `Reaped` demo, dropped, was killed with SIGKILL and left its
/// `plegd-demo-*` directory in the temporary directory (hundreds in /tmp). The drop
/// now sends SIGTERM first, and the demo removes it.
#[test]
fn a_dropped_reaped_demo_leaves_no_directory_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("api.sock");
    let demo_dirs = || {
        std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().starts_with("plegd-demo-"))
            .count()
    };
    let child = plegd()
        .args(["demo", "--pods", "2", "--metrics-addr", "off"])
        .arg("--api-socket")
        .arg(&socket)
        .env("TMPDIR", tmp.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let child = Reaped(child);
    wait_until("the demo's API socket", || socket.exists());
    assert_eq!(demo_dirs(), 1, "the demo makes its directory in TMPDIR");
    drop(child);
    assert_eq!(demo_dirs(), 0, "the dropped demo left its directory behind");
}

/// Regression: a SIGTERM while the runtime had not answered the start-up check went
/// unheard until the check's request timeout ended, and plegd then exited 1.
#[test]
fn a_signal_during_the_runtime_check_stops_plegd_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let sim = FakeRuntime::new();
    sim.hold(plegd_sim::Op::Version);
    let server = spawn_in_thread(&dir.path().join("cri.sock"), sim.clone()).unwrap();
    for sig in ["TERM", "INT"] {
        let calls = sim.calls(plegd_sim::Op::Version);
        let mut child = plegd()
            .args(["run", "--runtime-endpoint", &server.endpoint()])
            .args(["--metrics-addr", "off", "--api-socket", "off"])
            .args(["--state-dir", "off", "--runtime-request-timeout", "10m"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        process::wait_until("the start-up check asked", || {
            sim.calls(plegd_sim::Op::Version) > calls
        });
        signal(&child, "HUP"); // not a stop: plegd goes on waiting
        signal(&child, sig);
        let (status, err) = exit_and_stderr(&mut child);
        assert_eq!(status.code(), Some(0), "SIG{sig}: {err}");
        assert!(
            err.contains("stopped while waiting for the runtime"),
            "{err}"
        );
    }
}

/// Regression: a `--metrics-addr` port in use exited 2, the code of bad
/// configuration, which a supervisor need not retry; an address this host does not
/// have is still 2.
#[test]
fn a_busy_metrics_port_exits_1_and_a_foreign_address_2() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap().to_string();
    for (addr, code, says) in [
        (busy.as_str(), 1, "the port is in use"),
        ("192.0.2.1:9090", 2, "--metrics-addr 192.0.2.1:9090"),
    ] {
        let out = run_to_end(&[
            "demo",
            "--pods",
            "1",
            "--metrics-addr",
            addr,
            "--api-socket",
            "off",
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{addr}: {err}");
        assert!(err.contains(says), "{addr}: {err}");
    }
}

/// Regression: a relist in progress whose status read was slow (1.2 s, within the 2 s
/// request timeout) was dropped at shutdown, its events never written.
#[test]
fn shutdown_waits_for_a_relist_within_one_request_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let sim = FakeRuntime::new();
    let server = spawn_in_thread(&dir.path().join("cri.sock"), sim.clone()).unwrap();
    let mut child = plegd()
        .args(["run", "--runtime-endpoint", &server.endpoint()])
        .args(["--metrics-addr", "off", "--relist-period", "50ms"])
        .args(["--evented", "false", "--runtime-request-timeout", "2s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + TIMEOUT;
    while sim.calls(plegd_sim::Op::ListSandboxes) < 2 {
        assert!(Instant::now() < deadline, "plegd never relisted");
        std::thread::sleep(Duration::from_millis(5));
    }
    // A sandbox comes from the list: the container's status read is the slow call.
    sim.set_latency(plegd_sim::Op::ContainerStatus, Duration::from_millis(1200));
    let reads = sim.calls(plegd_sim::Op::ContainerStatus);
    let sb = sim.run_pod("uid-1", "web", "prod");
    let c = sim.run_container(&sb, "app");
    while sim.calls(plegd_sim::Op::ContainerStatus) == reads {
        assert!(Instant::now() < deadline, "the pod was never read");
        std::thread::sleep(Duration::from_millis(2));
    }
    signal(&child, "TERM");
    let (status, _) = wait_exit(&mut child);
    assert!(status.success(), "{status:?}");
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(
        out.contains(&format!("\"container_id\":\"{c}\"")),
        "the slow relist's event was lost: {out:?}"
    );
}

/// Regression: an output cursor that could not be read, or saved (here a directory in
/// its place), was passed over silently, and a failed save was tried again on every
/// event written.
#[test]
fn an_output_cursor_that_cannot_be_read_or_saved_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let run = || {
        run_to_end(&[
            "demo",
            "--duration",
            "1500ms",
            "--churn-period",
            "20ms",
            "--metrics-addr",
            "off",
            "--api-socket",
            "off",
            "--events-json",
            "/dev/null",
            "--state-dir",
            state.to_str().unwrap(),
        ])
    };
    let first = run();
    assert_eq!(first.status.code(), Some(0));
    std::fs::remove_file(state.join("output.cursor")).unwrap();
    std::fs::create_dir(state.join("output.cursor")).unwrap();
    let out = run();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("the output's cursor cannot be read"),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("cannot save the output's cursor").count(),
        1,
        "{stderr}"
    );
}

/// Regression: stderr carried ANSI colour codes even into a pipe or a file.
#[test]
fn logs_have_no_colour_off_a_terminal_and_json_lines_on_request() {
    let text = run_to_end(&["demo", "--duration", "300ms", "--metrics-addr", "off"]);
    let stderr = String::from_utf8_lossy(&text.stderr);
    assert_eq!(text.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("simulated CRI runtime is up"), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "colour codes in a pipe: {stderr:?}"
    );

    let json = run_to_end(&[
        "demo",
        "--duration",
        "300ms",
        "--metrics-addr",
        "off",
        "--log-format",
        "json",
    ]);
    let stderr = String::from_utf8_lossy(&json.stderr);
    assert_eq!(json.status.code(), Some(0), "{stderr}");
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    assert!(!lines.is_empty());
    for l in &lines {
        for key in ["timestamp", "level", "target", "message"] {
            assert!(l.get(key).is_some(), "{key} missing: {l}");
        }
    }
    assert!(lines
        .iter()
        .any(|l| l["message"] == "simulated CRI runtime is up" && l["pods"] == 8));
}
