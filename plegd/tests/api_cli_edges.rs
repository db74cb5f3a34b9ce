//! The API socket's flags and the CLI clients at their edges, with the real binary:
//! any socket path that fits a socket address serves, and a longer one is refused by
//! name; `--print-config` refuses the socket group a start refuses, and a group id
//! chown cannot set; `plegd watch --json` starts with the Hello (whose instance id
//! `--instance-id` takes), and a closed stdout ends a client quietly with exit 0.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use integration_tests::process::{
    command, exit_and_stderr, run_to_end, wait_exit, wait_until, Reaped,
};
use serde_json::Value;

fn plegd() -> std::process::Command {
    command(env!("CARGO_BIN_EXE_plegd"))
}

fn demo(socket: &Path) -> Reaped {
    demo_with(socket, &[])
}

fn demo_with(socket: &Path, extra: &[&std::ffi::OsStr]) -> Reaped {
    let child = plegd()
        .args(["demo", "--metrics-addr", "off", "--node-name", "edge-node"])
        .args(["--relist-period", "100ms", "--churn-period", "40ms"])
        .arg("--api-socket")
        .arg(socket)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until("the API socket", || socket.exists());
    Reaped(child)
}

/// A path of exactly `len` bytes under `dir` (its directories are created).
fn path_of_len(dir: &Path, len: usize) -> PathBuf {
    let mut p = dir.to_path_buf();
    while p.as_os_str().len() + 1 + 40 + 1 + 10 < len {
        p.push("d".repeat(40));
    }
    std::fs::create_dir_all(&p).unwrap();
    let rest = len - p.as_os_str().len() - 1;
    p.push("s".repeat(rest));
    assert_eq!(p.as_os_str().len(), len);
    p
}

#[test]
fn a_socket_path_that_fits_serves_and_a_longer_one_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    for len in [104, 107] {
        let socket = path_of_len(&dir.path().join(len.to_string()), len);
        // The control socket beside it would not fit: it is given a path of its own.
        let control = dir.path().join(format!("c{len}.sock"));
        let _server = demo_with(
            &socket,
            &["--api-control-socket".as_ref(), control.as_ref()],
        );
        let out = run_to_end(plegd().args(["pods", "--api-socket"]).arg(&socket)).0;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{len} bytes: {err}");
        assert!(
            String::from_utf8_lossy(&out.stdout).starts_with("NAMESPACE"),
            "{len} bytes"
        );
    }
    let socket = path_of_len(&dir.path().join("108"), 108);
    for extra in [&[][..], &["--print-config"]] {
        let err = refused_demo(&socket, extra);
        assert!(
            err.contains("--api-socket")
                && err.contains("108 bytes")
                && err.contains("at most 107"),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    // An API socket that fits whose control socket beside it would not: refused at
    // start (and by --print-config), naming the control socket's flag.
    let socket = path_of_len(&dir.path().join("104b"), 104);
    for extra in [&[][..], &["--print-config"]] {
        let err = refused_demo(&socket, extra);
        assert!(
            err.contains("--api-control-socket") && err.contains("at most 107"),
            "{err}"
        );
    }
}

#[test]
fn print_config_refuses_the_socket_group_a_start_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("plegd.sock");
    let cases = [
        ("nosuchgroup-plegd", "no such group"),
        ("4294967295", "4294967294"),
        ("4294967296", "4294967294"),
    ];
    // The control socket's group is checked the same way, and named as its own.
    for flag in ["--api-socket-group", "--api-control-socket-group"] {
        for (group, says) in cases {
            for extra in [&["--print-config"][..], &[]] {
                let out = run_to_end(
                    plegd()
                        .args(["demo", "--metrics-addr", "off", "--api-socket"])
                        .arg(&socket)
                        .args([flag, group])
                        .args(extra),
                )
                .0;
                let err = String::from_utf8_lossy(&out.stderr);
                assert_eq!(
                    out.status.code(),
                    Some(2),
                    "{flag} {group} {extra:?}: {err}"
                );
                assert!(
                    err.contains(flag) && err.contains(says),
                    "{flag} {group}: {err}"
                );
                assert!(out.stdout.is_empty(), "nothing printed for {group}");
                assert!(!socket.exists());
            }
        }
    }
    // A group that exists is printed as given.
    let out = run_to_end(plegd().args(["demo", "--api-socket"]).arg(&socket).args([
        "--api-socket-group",
        "0",
        "--print-config",
    ]))
    .0;
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("api-socket-group = \"0\""));
}

/// A stdout whose reader has gone: every write to it fails with EPIPE.
fn closed_stdout() -> Stdio {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    Stdio::from(writer)
}

#[test]
fn watch_json_starts_with_the_hello_and_a_closed_stdout_ends_each_client_with_0() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("plegd.sock");
    let _server = demo(&socket);

    // `plegd watch --json | head -1`: the Hello, then the reader goes.
    let mut watch = plegd()
        .args(["watch", "--json", "--api-socket"])
        .arg(&socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(watch.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    drop(out);
    let hello: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(hello["type"], "Hello", "{hello}");
    assert_eq!(hello["node_name"], "edge-node", "{hello}");
    let instance = hello["instance_id"].as_str().unwrap().to_string();
    assert_eq!(instance.len(), 32, "{hello}");
    let revision = hello["latest_revision"].as_u64().unwrap();
    assert!(hello["hint_sources"]
        .as_array()
        .is_some_and(|s| !s.is_empty()));
    // The demo's churn gives it the next line to write, which finds no reader.
    let (status, _) = wait_exit(&mut watch);
    let mut err = String::new();
    watch
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(err.is_empty(), "{err}");

    // What the Hello says is what --since and --instance-id take.
    let mut resumed = plegd()
        .args(["watch", "--json", "--since", &revision.to_string()])
        .args(["--instance-id", &instance, "--api-socket"])
        .arg(&socket)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(resumed.stdout.take().unwrap());
    for want in ["Hello", "event"] {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "ended before {want}");
        let v: Value = serde_json::from_str(&line).unwrap();
        if want == "Hello" {
            assert_eq!(v["type"], "Hello", "{v}");
        } else {
            assert!(v["revision"].as_u64().unwrap() > revision, "{v}");
        }
    }
    drop(out);
    let _ = wait_exit(&mut resumed);

    // Every client, its stdout closed from the start.
    let clients: [&[&str]; 4] = [&["watch"], &["pods"], &["pods", "--json"], &["status"]];
    for args in clients {
        let mut child = plegd()
            .args(args)
            .arg("--api-socket")
            .arg(&socket)
            .stdout(closed_stdout())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (status, err) = exit_and_stderr(&mut child);
        assert_eq!(status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("Broken pipe"), "{args:?}: {err}");
    }
}

/// A socket that accepts connections into its backlog and never answers: each client
/// ends with exit 1 at its deadline, in one line naming the socket.
#[test]
fn each_client_ends_at_its_deadline_when_nothing_answers() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("silent.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let cases: [(&[&str], Duration); 4] = [
        // The default deadline.
        (&["pods"], Duration::from_secs(10)),
        (&["status", "--timeout", "1s"], Duration::from_secs(1)),
        (
            &["status", "some-uid", "--timeout", "1s"],
            Duration::from_secs(1),
        ),
        (
            &["watch", "--json", "--timeout", "1500ms"],
            Duration::from_millis(1500),
        ),
    ];
    for (args, deadline) in cases {
        let start = Instant::now();
        let out = run_to_end(plegd().args(args).arg("--api-socket").arg(&socket)).0;
        let took = start.elapsed();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(took >= deadline, "{args:?}: {took:?}");
        assert!(
            took < deadline + Duration::from_secs(10),
            "{args:?}: {took:?}"
        );
        assert!(
            err.contains(&socket.display().to_string()) && err.contains("did not answer within"),
            "{args:?}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
    }
    let out = run_to_end(plegd().args(["pods", "--timeout", "0s"])).0;
    assert_eq!(out.status.code(), Some(2));
}

/// `plegd demo` on this API socket (with `extra`) refused as bad configuration (exit
/// 2): its stderr.
fn refused_demo(socket: &std::path::Path, extra: &[&str]) -> String {
    let out = run_to_end(
        plegd()
            .args(["demo", "--metrics-addr", "off", "--api-socket"])
            .arg(socket)
            .args(extra),
    )
    .0;
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{extra:?}: {err}");
    err
}
