//! SIGTERM at random points under load — mid-relist (slow
//! runtime calls), mid-backoff (the event stream failing), mid-storm (pods starting
//! and exiting quickly), with a slow reader of the events, during `plegd demo`'s
//! start-up, with half-sent HTTP requests open — always exits 0 within the README's
//! "Shutdown guarantees" bound, leaving nothing behind (the runtime's event streams
//! closed, the demo's temporary directory removed).
//!
//! The random points come from a seeded RNG: a failure names its scenario and seed,
//! and `PLEGD_SHUTDOWN_SEED=<seed> cargo test -p plegd --test shutdown_under_load
//! <scenario>` replays the same choices (timing on a busy machine still varies).
//! `PLEGD_SHUTDOWN_SEEDS=<n>` runs seeds 1..=n instead of the default few.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use plegd_sim::{spawn_churn, spawn_in_thread, ChurnConfig, FakeRuntime, Op};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use integration_tests::process::{
    command, free_port, http_get, signal, wait_exit, wait_until, Reaped,
};

/// The binary under test.
fn plegd() -> std::process::Command {
    command(env!("CARGO_BIN_EXE_plegd"))
}

/// `--runtime-request-timeout` in these tests (short, to keep the file quick).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// README "Shutdown guarantees": one request timeout + 0.7 s for the relist in
/// progress, + 0.25 s for the output to drain.
const DOCUMENTED_BOUND: Duration = Duration::from_millis(1000 + 700 + 250);
/// Process exit and this test's polling on a shared, busy machine.
const SLACK: Duration = Duration::from_millis(1500);
/// The seeds CI runs: enough to land in different places, few enough for ~30 s.
const SEEDS: [u64; 5] = [1, 2, 3, 4, 5];

fn seeds() -> Vec<u64> {
    let var = |name| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    if let Some(seed) = var("PLEGD_SHUTDOWN_SEED") {
        vec![seed]
    } else if let Some(n) = var("PLEGD_SHUTDOWN_SEEDS") {
        (1..=n).collect()
    } else {
        SEEDS.to_vec()
    }
}

/// Runs `scenario` once per seed; a failure says which seed and how to replay it.
fn for_each_seed(name: &str, scenario: impl Fn(&mut StdRng) -> Duration) {
    for seed in seeds() {
        let mut rng = StdRng::seed_from_u64(seed);
        match std::panic::catch_unwind(AssertUnwindSafe(|| scenario(&mut rng))) {
            Ok(took) => println!("{name} seed {seed}: SIGTERM to exit {took:?}"),
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)");
                panic!(
                    "{name} failed with seed {seed}: {why}\nreplay: PLEGD_SHUTDOWN_SEED={seed} \
                     cargo test -p plegd --test shutdown_under_load {name}"
                );
            }
        }
    }
}

fn ms(rng: &mut StdRng, range: std::ops::RangeInclusive<u64>) -> Duration {
    Duration::from_millis(rng.random_range(range))
}

/// A running plegd whose stdout is read on a thread, at full speed or slowly.
struct Running {
    child: Reaped,
    port: u16,
    exited: Arc<AtomicBool>,
    reader: JoinHandle<Vec<u8>>,
}

impl Running {
    /// `per_line`: how long the reader dawdles after each line (while plegd runs).
    fn start(mut command: Command, per_line: Duration) -> Running {
        let port = free_port();
        let mut child = Reaped(
            command
                .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let exited = Arc::new(AtomicBool::new(false));
        let stdout = child.0.stdout.take().unwrap();
        let reader = {
            let exited = exited.clone();
            std::thread::spawn(move || {
                let mut out = BufReader::new(stdout);
                let mut all = Vec::new();
                while matches!(out.read_until(b'\n', &mut all), Ok(n) if n > 0) {
                    if !per_line.is_zero() && !exited.load(Ordering::SeqCst) {
                        std::thread::sleep(per_line);
                    }
                }
                all
            })
        };
        Running {
            child,
            port,
            exited,
            reader,
        }
    }

    fn wait_ready(&self) {
        wait_until("plegd to be ready", || {
            http_get(self.port, "/readyz").map(|r| r.0) == Some(200)
        });
    }

    /// Opens a few half-sent HTTP requests (maybe none), sends SIGTERM, checks the
    /// exit; returns the time from signal to exit and what plegd wrote.
    fn sigterm(mut self, rng: &mut StdRng, torn_tail_ok: bool) -> (Duration, String) {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let half_sent = rng.random_range(0..=3);
        let _held: Vec<TcpStream> = (0..half_sent)
            .filter_map(|_| {
                let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
                s.write_all(b"GET /metrics HTTP/1.1\r\n").ok()?;
                Some(s)
            })
            .collect();
        signal(&self.child.0, "TERM");
        let (status, took) = wait_exit(&mut self.child.0);
        self.exited.store(true, Ordering::SeqCst);
        println!("  {half_sent} half-sent HTTP requests open");
        let out = String::from_utf8_lossy(&self.reader.join().unwrap()).into_owned();
        assert!(status.success(), "{status:?}");
        assert!(
            took <= DOCUMENTED_BOUND + SLACK,
            "SIGTERM to exit took {took:?}"
        );
        // Every line written is whole JSON; only an output abandoned because its
        // reader was too slow may end in the middle of one.
        let mut lines: Vec<&str> = out.split_inclusive('\n').collect();
        if torn_tail_ok && !out.ends_with('\n') {
            lines.pop();
        }
        for line in lines {
            assert!(line.ends_with('\n'), "a torn line at the end: {line:?}");
            let parsed = serde_json::from_str::<serde_json::Value>(line);
            assert!(parsed.is_ok(), "{line:?}");
        }
        (took, out)
    }
}

/// `plegd run` over `socket`, with the short request timeout.
fn run_command(socket: &Path, extra: &[&str]) -> Command {
    let mut c = plegd();
    c.args(["run", "--runtime-endpoint"])
        .arg(format!("unix://{}", socket.display()))
        .arg("--runtime-request-timeout")
        .arg(format!("{}s", REQUEST_TIMEOUT.as_secs()))
        .args(extra);
    c
}

/// Nothing left behind on the runtime's side: its event streams end.
fn streams_closed(sim: &FakeRuntime) {
    wait_until("the runtime's event streams to close", || {
        sim.event_streams() == 0
    });
}

/// A node of `pods` pods with one or two containers each.
fn node(rng: &mut StdRng, pods: usize) -> FakeRuntime {
    let sim = FakeRuntime::new();
    for i in 0..pods {
        let sb = sim.run_pod(&format!("uid-{i}"), &format!("pod-{i}"), "load");
        for c in 0..rng.random_range(1..=2) {
            sim.run_container(&sb, &format!("c{c}"));
        }
    }
    sim
}

#[test]
fn sigterm_mid_relist() {
    for_each_seed("sigterm_mid_relist", |rng| {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("cri.sock");
        let pods = rng.random_range(10..=60);
        let sim = node(rng, pods);
        let _server = spawn_in_thread(&sock, sim.clone()).unwrap();
        let plegd = Running::start(
            run_command(&sock, &["--relist-period", "100ms"]),
            Duration::ZERO,
        );
        plegd.wait_ready();
        // One kind of call becomes slow, some beyond the request timeout: the relist
        // in progress then ends, times out, or is abandoned at the shutdown deadline.
        // (No PodSandboxStatus: a relist takes sandboxes from the list.)
        let ops = [Op::ListSandboxes, Op::ListContainers, Op::ContainerStatus];
        let op = ops[rng.random_range(0..ops.len())];
        let latency = ms(rng, 50..=1500);
        let calls = sim.calls(op);
        sim.set_latency(op, latency);
        // Status reads are made only for pods that changed: a pod changes.
        let sb = sim.run_pod("uid-new", "pod-new", "load");
        sim.run_container(&sb, "c0");
        wait_until("a slow call to start", || sim.calls(op) > calls);
        std::thread::sleep(ms(rng, 0..=latency.as_millis() as u64));
        println!("  {op:?} takes {latency:?}");
        let (took, _) = plegd.sigterm(rng, false);
        streams_closed(&sim);
        took
    });
}

#[test]
fn sigterm_mid_backoff() {
    for_each_seed("sigterm_mid_backoff", |rng| {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("cri.sock");
        let sim = node(rng, 5);
        sim.fail(Op::Events, tonic::Code::Unavailable, None);
        let _server = spawn_in_thread(&sock, sim.clone()).unwrap();
        let base = format!("{}ms", rng.random_range(50..=1000));
        let plegd = Running::start(
            run_command(
                &sock,
                &["--relist-period", "100ms", "--reconnect-base", &base],
            ),
            Duration::ZERO,
        );
        plegd.wait_ready();
        // The first retry is immediate; from the second on, plegd is backing off.
        let attempts = rng.random_range(2..=3);
        wait_until("the event stream to be retried", || {
            sim.calls(Op::Events) >= attempts
        });
        std::thread::sleep(ms(rng, 0..=800));
        let (took, _) = plegd.sigterm(rng, false);
        streams_closed(&sim);
        took
    });
}

/// Pods starting, exiting and going away every millisecond or so; the events are read
/// at full speed, or slowly (a subscriber that cannot keep up).
fn storm(rng: &mut StdRng, slow_reader: bool) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("cri.sock");
    let sim = FakeRuntime::new();
    let churn = spawn_churn(
        sim.clone(),
        ChurnConfig {
            pods: rng.random_range(20..=100),
            period: ms(rng, 1..=3),
            seed: rng.random(),
        },
    )
    .unwrap();
    let _server = spawn_in_thread(&sock, sim.clone()).unwrap();
    let per_line = if slow_reader {
        ms(rng, 5..=30)
    } else {
        Duration::ZERO
    };
    let plegd = Running::start(run_command(&sock, &["--relist-period", "50ms"]), per_line);
    plegd.wait_ready();
    std::thread::sleep(ms(rng, 0..=1000));
    let (took, out) = plegd.sigterm(rng, slow_reader);
    churn.stop();
    streams_closed(&sim);
    assert!(!out.is_empty(), "no event written");
    took
}

#[test]
fn sigterm_mid_storm() {
    for_each_seed("sigterm_mid_storm", |rng| storm(rng, false));
}

#[test]
fn sigterm_with_a_slow_events_reader() {
    for_each_seed("sigterm_with_a_slow_events_reader", |rng| storm(rng, true));
}

#[test]
fn sigterm_during_the_demo_leaves_nothing_behind() {
    for_each_seed("sigterm_during_the_demo_leaves_nothing_behind", |rng| {
        let tmp = tempfile::tempdir().unwrap();
        let mut command = plegd();
        command
            .args(["demo", "--events-json", "-", "--churn-period", "2ms"])
            .args(["--pods", &rng.random_range(5..=300).to_string()])
            .arg("--runtime-request-timeout")
            .arg(format!("{}s", REQUEST_TIMEOUT.as_secs()))
            .env("TMPDIR", tmp.path());
        let plegd = Running::start(command, Duration::ZERO);
        // Anywhere from start-up (simulated runtime being built) to full churn.
        let started = Instant::now();
        std::thread::sleep(ms(rng, 0..=1200));
        println!("  SIGTERM {:?} after start", started.elapsed());
        let (took, _) = plegd.sigterm(rng, false);
        let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
        assert!(left.is_empty(), "left behind: {left:?}");
        took
    });
}
