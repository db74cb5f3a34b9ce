//! `plegd run` against real containerd 1.7 and 2.1: it detects the runtime
//! and its version at start, picks the hint sources the runtime supports (CRI events,
//! NRI and containerd's event service on containerd), says per runtime what it
//! does — the one-subscriber warning on 1.7 only — and shows each source's state on
//! `/readyz`: NRI, on the default socket this containerd does not listen on, is not
//! streaming (waiting while containerd has just been seen, unsupported after). Ignored for a plain `cargo test` (root, a real containerd);
//! `scripts/test.sh` runs it.

use std::process::Stdio;
use std::time::{Duration, Instant};

use integration_tests::containerd::{Flavor, Session};
use integration_tests::process::{command, free_port, http_get, signal, wait_exit, Reaped};

/// Starts plegd on `flavor`'s containerd, waits until `/readyz` shows both sources
/// streaming or connecting, stops it; returns its log and the last `/readyz` body.
async fn run_on(flavor: Flavor) -> (String, String) {
    let s = Session::begin(flavor).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stderr.log");
    let port = free_port();
    let child = command(env!("CARGO_BIN_EXE_plegd"))
        .args(["run", "--events-json", "/dev/null", "--metrics-addr"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--runtime-endpoint")
        .arg(s.containerd.endpoint())
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut child = Reaped(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let ready = http_get(port, "/readyz");
        if let Some((200, body)) = &ready {
            let up = |s: &str| {
                body.contains(&format!("{s}=streaming"))
                    || body.contains(&format!("{s}=connecting"))
            };
            if up("cri-events") && up("containerd-events") {
                break body.clone();
            }
        }
        assert!(Instant::now() < deadline, "plegd not ready: {ready:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    signal(&child.0, "TERM");
    let (status, _) = wait_exit(&mut child.0);
    assert!(status.success(), "{status:?}");
    (std::fs::read_to_string(&log).unwrap(), body)
}

const SPLIT_WARNING: &str = "splits CRI events";

/// NRI selected, but not connected: the test's containerd listens on its own socket,
/// not the default one plegd looks at.
fn nri_not_streaming(readyz: &str) -> bool {
    ["connecting", "waiting", "unsupported"]
        .iter()
        .any(|state| readyz.contains(&format!("nri={state}")))
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn on_containerd_1_7_both_sources_run_and_plegd_warns_about_cri_event_sharing() {
    let (log, readyz) = run_on(Flavor::V1_7).await;
    assert!(log.contains("runtime=containerd version=1.7"), "{log}");
    assert!(
        log.contains("hint_sources=cri-events,nri,containerd-events"),
        "{log}"
    );
    assert!(log.contains(SPLIT_WARNING), "{log}");
    assert!(nri_not_streaming(&readyz), "{readyz}");
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn on_containerd_2_1_both_sources_run_without_the_one_subscriber_warning() {
    let (log, readyz) = run_on(Flavor::V2_1).await;
    assert!(log.contains("runtime=containerd version=2.1"), "{log}");
    assert!(
        log.contains("hint_sources=cri-events,nri,containerd-events"),
        "{log}"
    );
    assert!(!log.contains(SPLIT_WARNING), "{log}");
    assert!(
        log.contains("containerd 2.x gives every CRI event subscriber"),
        "{log}"
    );
    assert!(nri_not_streaming(&readyz), "{readyz}");
}
