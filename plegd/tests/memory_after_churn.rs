//! Memory after a churn of short-lived pods: with the event
//! history and the tombstones bounded small, plegd's RSS comes back within 1 MiB of
//! where it was with the same live pods. What the churn freed stays with glibc
//! between long-lived blocks unless plegd gives it back (`--memory-trim-period`), and
//! the tables keyed by pod keep the room the churn grew them to unless shrunk (the
//! cache's, the Generic PLEG's records). Here, RssAnon settles at +0.7…+0.85 MiB;
//! with `--memory-trim-period off` it stays at +1.3…+1.7 MiB (figures in the issue).
//!
//! Fair to what plegd holds by design, bounded: the 1,000 live pods' events fill the
//! history (1,024) before "before" is read. The CRI event stream is off
//! (`--evented=false`): it remembers the stops it reported until 4,096 of them
//! (hints/cri_stops.rs, ≈ 0.6 MiB), a count that would move "after" by up to 0.3 MiB
//! from run to run; the global relist finds every pod anyway.

use std::process::Stdio;
use std::time::{Duration, Instant};

use integration_tests::process::{command, free_port, http_get, status_field, Reaped};
use plegd_sim::{spawn_in_thread, FakeRuntime};
use plegd_testkit::metrics::Scrape;

/// Live pods kept all along (as plegd-bench's churn row): plenty of long-lived blocks
/// for the churn's freed ones to lie between, and a full history from the start.
const LIVE: usize = 1000;
/// Short-lived pods, in batches that each live through one global relist with the
/// batch before.
const BATCH: usize = 250;
const BATCHES: usize = 20;
/// The goal's bound.
const SLACK_KIB: u64 = 1024;
/// Generous: a debug build on a loaded 2-core machine.
const SETTLE: Duration = Duration::from_secs(90);

/// plegd's anonymous resident memory (heap, stacks): RSS without the pages of the
/// binary it has read, which a debug build's churn adds to by running code paths (pod
/// removal, tombstones) the steady relists did not, once, and the kernel can drop.
fn rss_kib(pid: u32) -> u64 {
    status_field(pid, "RssAnon:").unwrap_or(0)
}

fn metric(port: u16, name: &str) -> u64 {
    http_get(port, "/metrics")
        .and_then(|(_, response)| Scrape::from_response(&response)?.count(name, &[]))
        .unwrap_or(0)
}

fn relists(port: u16) -> u64 {
    metric(port, "kubelet_pleg_relist_duration_seconds_count")
}

/// Waits for `n` more global relists (each begun after this call).
fn wait_relists(port: u16, n: u64) {
    let deadline = Instant::now() + SETTLE;
    let target = relists(port) + n + 1;
    while relists(port) < target {
        assert!(Instant::now() < deadline, "plegd stopped relisting");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn pod(sim: &FakeRuntime, uid: &str) -> String {
    let sandbox = sim.run_pod(uid, uid, "churn");
    sim.run_container(&sandbox, "app");
    sandbox
}

#[test]
fn rss_comes_back_within_a_mebibyte_after_a_churn_of_short_lived_pods() {
    let dir = tempfile::tempdir().unwrap();
    let sim = FakeRuntime::new();
    for i in 0..LIVE {
        pod(&sim, &format!("live-{i:05}"));
    }
    let server = spawn_in_thread(&dir.path().join("cri.sock"), sim.clone()).unwrap();
    let port = free_port();
    let child = command(env!("CARGO_BIN_EXE_plegd"))
        .args(["run", "--runtime-endpoint", &server.endpoint()])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        // A trim after each global relist, and every second at least.
        .args(["--relist-period", "200ms", "--memory-trim-period", "1s"])
        .args(["--history-events", "1024", "--tombstone-ttl", "1s"])
        .arg("--evented=false")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let plegd = Reaped(child);
    let pid = plegd.0.id();
    wait_relists(port, 5);
    assert_eq!(metric(port, "plegd_event_history_events"), 1024);
    // Where it is with the live pods: the lowest of a few seconds of samples.
    let before = (0..15)
        .map(|_| {
            wait_relists(port, 1);
            rss_kib(pid)
        })
        .min()
        .unwrap_or(0);
    assert!(before > 0, "no RSS read for plegd");

    let mut previous: Vec<String> = Vec::new();
    for b in 0..BATCHES {
        let batch: Vec<String> = (0..BATCH)
            .map(|i| pod(&sim, &format!("churn-{b:03}-{i:05}")))
            .collect();
        wait_relists(port, 1);
        for sandbox in previous.drain(..) {
            sim.stop_pod(&sandbox);
            sim.remove_pod(&sandbox);
        }
        previous = batch;
    }
    for sandbox in previous.drain(..) {
        sim.stop_pod(&sandbox);
        sim.remove_pod(&sandbox);
    }
    assert_eq!(sim.pod_count(), LIVE);
    let peak = rss_kib(pid);

    // The tombstones expire (1 s), then the memory goes back.
    let deadline = Instant::now() + SETTLE;
    let mut after = rss_kib(pid);
    while after > before + SLACK_KIB {
        assert!(
            Instant::now() < deadline,
            "RssAnon {after} KiB after {} short-lived pods, {before} KiB before (peak {peak} KiB)",
            BATCH * BATCHES
        );
        wait_relists(port, 1);
        after = rss_kib(pid);
    }
    eprintln!("RssAnon before {before} KiB, peak {peak} KiB, after {after} KiB");
}

/// plegd with `--memory-trim-period` (logging its trims) relisting every 100 ms: the
/// number of trims logged once `relists` more global relists ended.
fn trims_over_relists(period: &str, relists: u64) -> usize {
    let dir = tempfile::tempdir().unwrap();
    let sim = FakeRuntime::new();
    pod(&sim, "live-0");
    let server = spawn_in_thread(&dir.path().join("cri.sock"), sim.clone()).unwrap();
    let port = free_port();
    let log = dir.path().join("plegd.log");
    let child = command(env!("CARGO_BIN_EXE_plegd"))
        .args(["run", "--runtime-endpoint", &server.endpoint()])
        .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
        .args(["--relist-period", "100ms", "--memory-trim-period", period])
        .env("RUST_LOG", "plegd_telemetry::malloc=debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _plegd = Reaped(child);
    let trims = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .matches("malloc_trim")
            .count()
    };
    wait_relists(port, relists);
    // The last relist's trim runs on its own thread: wait for it, if it comes.
    let deadline = Instant::now() + Duration::from_secs(5);
    while trims() < relists as usize && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    trims()
}

/// What a global relist freed (the runtime's lists) goes back right after it, not
/// only every `--memory-trim-period`; `off` still trims never.
#[test]
fn memory_is_given_back_after_each_global_relist_unless_trimming_is_off() {
    let relists = 10;
    let trims = trims_over_relists("1h", relists);
    assert!(
        trims >= relists as usize,
        "{trims} trims over {relists} global relists with a trim period of an hour"
    );
    assert_eq!(
        trims_over_relists("off", relists),
        0,
        "--memory-trim-period off"
    );
}
