//! The soak engine: plegd as its own process against the simulated CRI
//! runtime with steady churn and periodic runtime restarts, sampled over time — RSS,
//! threads, open fds from `/proc`, counters from its `/metrics`, events from its
//! stdout. The `soak` binary runs it for an hour and plots it; `plegd/tests/soak.rs`
//! runs it for two minutes in CI and fails on growth ([`check_growth`]).
//!
//! It lives in the library so both run exactly the same code. Nothing here trusts
//! the child: every read of `/proc` or `/metrics` may fail (the child died, the
//! machine is slow) and becomes an error or a missing value, never a panic.
//!
//! plegd logs at `RUST_LOG=info` unless `PLEGD_SOAK_LOG` says otherwise (a debug
//! level floods the pipe over an hour).

use std::collections::VecDeque;
use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use plegd_sim::{spawn_churn, spawn_in_thread, ChurnConfig, FakeRuntime};
use plegd_testkit::metrics::Scrape;
use plegd_testkit::process;

/// What to run.
#[derive(Clone, Debug)]
pub struct SoakConfig {
    /// The `plegd` binary.
    pub plegd: PathBuf,
    pub duration: Duration,
    /// Pods the churn keeps.
    pub pods: usize,
    /// Time between churn steps.
    pub churn_period: Duration,
    /// Time between runtime restarts; `None`: no restarts.
    pub restart_every: Option<Duration>,
    /// How long the runtime stays down at each restart.
    pub restart_pause: Duration,
    /// Time between samples.
    pub sample_every: Duration,
    pub seed: u64,
    /// Where the samples go as CSV, written as they come (a cut-short run keeps them).
    pub csv: Option<PathBuf>,
    /// Extra arguments for `plegd run`.
    pub plegd_args: Vec<String>,
    /// Where plegd's logs (stderr) go as well; `None`: only the last lines are kept.
    pub plegd_log: Option<PathBuf>,
}

impl Default for SoakConfig {
    fn default() -> Self {
        SoakConfig {
            plegd: PathBuf::from("plegd"),
            duration: Duration::from_secs(3600),
            pods: 50,
            churn_period: Duration::from_millis(100),
            restart_every: Some(Duration::from_secs(180)),
            restart_pause: Duration::from_secs(2),
            sample_every: Duration::from_secs(5),
            seed: 1,
            csv: None,
            plegd_args: Vec::new(),
            plegd_log: None,
        }
    }
}

/// One sample. Counters are cumulative since plegd started; a metric that could not
/// be read is `None` (an empty CSV cell).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sample {
    pub time_s: f64,
    pub rss_kb: u64,
    pub threads: u64,
    pub fds: u64,
    /// Lifecycle events read from plegd's stdout.
    pub events: u64,
    /// `kubelet_pleg_events_total`, all sources.
    pub events_metric: Option<u64>,
    /// Global relists (`kubelet_pleg_relist_duration_seconds_count`).
    pub relists: Option<u64>,
    /// `plegd_relist_requests_total{result="queued"}`.
    pub relist_requests: Option<u64>,
    /// `kubelet_evented_pleg_connection_success_count`.
    pub stream_connects: Option<u64>,
    /// `kubelet_evented_pleg_connection_error_count`.
    pub stream_errors: Option<u64>,
    /// `plegd_evented_stream_connected`.
    pub stream_connected: Option<u64>,
    /// `plegd_relist_errors_total`, all phases.
    pub relist_errors: Option<u64>,
    /// Runtime restarts done.
    pub restarts: u64,
    /// Churn steps taken.
    pub churn_steps: u64,
    /// Lines plegd wrote to stderr (logs).
    pub log_lines: u64,
}

/// The CSV header, in [`Sample::csv_row`]'s order.
pub const CSV_HEADER: &str = "time_s,rss_kb,threads,fds,events,events_metric,relists,\
relist_requests,stream_connects,stream_errors,stream_connected,relist_errors,restarts,\
churn_steps,log_lines";

fn cell(v: Option<u64>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

impl Sample {
    /// One CSV line (no newline).
    pub fn csv_row(&self) -> String {
        format!(
            "{:.1},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            self.time_s,
            self.rss_kb,
            self.threads,
            self.fds,
            self.events,
            cell(self.events_metric),
            cell(self.relists),
            cell(self.relist_requests),
            cell(self.stream_connects),
            cell(self.stream_errors),
            cell(self.stream_connected),
            cell(self.relist_errors),
            self.restarts,
            self.churn_steps,
            self.log_lines,
        )
    }

    /// Parses a line written by [`csv_row`](Self::csv_row).
    pub fn from_csv_row(line: &str) -> Option<Sample> {
        let f: Vec<&str> = line.trim().split(',').collect();
        if f.len() != CSV_HEADER.split(',').count() {
            return None;
        }
        let opt = |s: &str| -> Option<Option<u64>> {
            if s.is_empty() {
                Some(None)
            } else {
                s.parse().ok().map(Some)
            }
        };
        Some(Sample {
            time_s: f[0].parse().ok()?,
            rss_kb: f[1].parse().ok()?,
            threads: f[2].parse().ok()?,
            fds: f[3].parse().ok()?,
            events: f[4].parse().ok()?,
            events_metric: opt(f[5])?,
            relists: opt(f[6])?,
            relist_requests: opt(f[7])?,
            stream_connects: opt(f[8])?,
            stream_errors: opt(f[9])?,
            stream_connected: opt(f[10])?,
            relist_errors: opt(f[11])?,
            restarts: f[12].parse().ok()?,
            churn_steps: f[13].parse().ok()?,
            log_lines: f[14].parse().ok()?,
        })
    }
}

/// Reads samples back from a CSV file written by a soak.
pub fn read_csv(path: &Path) -> Result<Vec<Sample>, SoakError> {
    let text = std::fs::read_to_string(path).map_err(|e| SoakError::io("read the CSV", e))?;
    let mut lines = text.lines();
    if lines.next().map(str::trim) != Some(CSV_HEADER) {
        return Err(SoakError::Csv(format!(
            "{}: not a soak CSV (header differs)",
            path.display()
        )));
    }
    lines
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            Sample::from_csv_row(l)
                .ok_or_else(|| SoakError::Csv(format!("{}: bad line {}", path.display(), i + 2)))
        })
        .collect()
}

/// How a soak ended.
#[derive(Debug)]
pub struct SoakReport {
    pub samples: Vec<Sample>,
    pub restarts: u64,
    /// Lines on stdout carrying `"missed"` (events dropped for the subscriber).
    pub missed_lines: u64,
    /// plegd's exit after SIGTERM at the end; `None`: it had to be killed.
    pub exit: Option<ExitStatus>,
    /// The last lines plegd logged.
    pub log_tail: Vec<String>,
}

#[derive(Debug)]
pub enum SoakError {
    Io {
        what: &'static str,
        source: std::io::Error,
    },
    Sim(plegd_sim::SimError),
    /// plegd exited during the soak.
    PlegdExited {
        status: ExitStatus,
        log_tail: Vec<String>,
        samples: Vec<Sample>,
    },
    /// plegd never served `/metrics`.
    NotReady {
        log_tail: Vec<String>,
    },
    Csv(String),
}

impl SoakError {
    fn io(what: &'static str, source: std::io::Error) -> Self {
        SoakError::Io { what, source }
    }
}

impl fmt::Display for SoakError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SoakError::Io { what, source } => write!(f, "cannot {what}: {source}"),
            SoakError::Sim(e) => write!(f, "simulated runtime: {e}"),
            SoakError::PlegdExited {
                status,
                log_tail,
                samples,
            } => write!(
                f,
                "plegd exited ({status}) after {} samples; its last log lines:\n{}",
                samples.len(),
                log_tail.join("\n")
            ),
            SoakError::NotReady { log_tail } => write!(
                f,
                "plegd did not serve /metrics; its last log lines:\n{}",
                log_tail.join("\n")
            ),
            SoakError::Csv(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for SoakError {}

/// Log lines kept for error reports.
const LOG_TAIL: usize = 40;

/// How long plegd gets to serve `/metrics` after starting (a debug build on a loaded
/// machine).
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long plegd gets to exit after SIGTERM before it is killed: its documented
/// shutdown bound (one request timeout + 0.7 s + 0.25 s) with room for a slow machine.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// plegd's child process, killed if the soak ends early (a panic in a test).
struct Plegd {
    child: Child,
    events: Arc<AtomicU64>,
    missed: Arc<AtomicU64>,
    log_lines: Arc<AtomicU64>,
    log_tail: Arc<Mutex<VecDeque<String>>>,
    readers: Vec<JoinHandle<()>>,
    metrics: SocketAddr,
}

impl Plegd {
    fn start(cfg: &SoakConfig, endpoint: &str) -> Result<Plegd, SoakError> {
        let metrics = free_port()?;
        let mut child = Command::new(&cfg.plegd)
            .arg("run")
            .arg("--runtime-endpoint")
            .arg(endpoint)
            .arg("--metrics-addr")
            .arg(metrics.to_string())
            // Not the node's default socket, which a real plegd may hold; the soak
            // measures the core.
            .env("PLEGD_API_SOCKET", "off")
            // Nor the node's state dir (a flag in `plegd_args` overrides it).
            .env("PLEGD_STATE_DIR", "off")
            .args(&cfg.plegd_args)
            .env(
                "RUST_LOG",
                std::env::var("PLEGD_SOAK_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| SoakError::io("start plegd", e))?;
        let events = Arc::new(AtomicU64::new(0));
        let missed = Arc::new(AtomicU64::new(0));
        let log_lines = Arc::new(AtomicU64::new(0));
        let log_tail = Arc::new(Mutex::new(VecDeque::new()));
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            let (events, missed) = (Arc::clone(&events), Arc::clone(&missed));
            // A reader thread: plegd blocks (and would count as hung) if its stdout
            // fills.
            readers.push(spawn_reader("soak-stdout", out, move |line| {
                events.fetch_add(1, Ordering::Relaxed);
                if line.contains("\"missed\"") {
                    missed.fetch_add(1, Ordering::Relaxed);
                }
            })?);
        }
        if let Some(err) = child.stderr.take() {
            let (lines, tail) = (Arc::clone(&log_lines), Arc::clone(&log_tail));
            let mut log = match &cfg.plegd_log {
                Some(path) => {
                    Some(File::create(path).map_err(|e| SoakError::io("create the plegd log", e))?)
                }
                None => None,
            };
            readers.push(spawn_reader("soak-stderr", err, move |line| {
                lines.fetch_add(1, Ordering::Relaxed);
                if let Some(f) = log.as_mut() {
                    // A full disk loses log lines, not the soak.
                    let _ = f.write_all(line.as_bytes());
                }
                let mut tail = tail.lock().unwrap_or_else(PoisonError::into_inner);
                if tail.len() == LOG_TAIL {
                    tail.pop_front();
                }
                tail.push_back(line.to_string());
            })?);
        }
        Ok(Plegd {
            child,
            events,
            missed,
            log_lines,
            log_tail,
            readers,
            metrics,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log_tail(&self) -> Vec<String> {
        self.log_tail
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect()
    }

    /// `Some(status)` once plegd has exited.
    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGTERM (through kill(1): this workspace forbids `unsafe`), then SIGKILL after
    /// [`STOP_TIMEOUT`]. `None` when it had to be killed.
    fn stop(mut self) -> (Option<ExitStatus>, Vec<String>) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status();
        let deadline = Instant::now() + STOP_TIMEOUT;
        let mut status = None;
        while Instant::now() < deadline {
            if let Some(s) = self.exited() {
                status = Some(s);
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        if status.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // The pipes are closed now: the readers end.
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        (status, self.log_tail())
    }
}

impl Drop for Plegd {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn spawn_reader<R, F>(name: &str, from: R, mut each: F) -> Result<JoinHandle<()>, SoakError>
where
    R: Read + Send + 'static,
    F: FnMut(&str) + Send + 'static,
{
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let mut reader = BufReader::new(from);
            let mut line = String::new();
            // Ends at EOF (plegd exited) or on a read error.
            while matches!(reader.read_line(&mut line), Ok(n) if n > 0) {
                each(&line);
                line.clear();
            }
        })
        .map_err(|e| SoakError::io("start a reader thread", e))
}

/// A port nobody listens on now (the kernel picks it; a race with another program
/// taking it meanwhile is possible but makes plegd fail at start, which is reported).
fn free_port() -> Result<SocketAddr, SoakError> {
    let port = process::free_port().map_err(|e| SoakError::io("pick a free port", e))?;
    Ok(SocketAddr::from(([127, 0, 0, 1], port)))
}

/// `VmRSS` (kB) and `Threads` of a process.
fn proc_status(pid: u32) -> Option<(u64, u64)> {
    Some((
        process::status_field(pid, "VmRSS:")?,
        process::status_field(pid, "Threads:")?,
    ))
}

/// Open file descriptors of a process.
fn proc_fds(pid: u32) -> Option<u64> {
    let dir = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?;
    Some(dir.count() as u64)
}

/// One scrape of `/metrics` on `addr` (a local port); `None` unless it answers 200.
fn scrape(addr: SocketAddr) -> Option<Scrape> {
    match process::http_get(addr.port(), "/metrics")? {
        (200, response) => Scrape::from_response(&response),
        _ => None,
    }
}

/// Runs a soak; `on_sample` sees each sample as it is taken (for progress output).
pub fn run(cfg: &SoakConfig, mut on_sample: impl FnMut(&Sample)) -> Result<SoakReport, SoakError> {
    let dir = tempfile::tempdir().map_err(|e| SoakError::io("make a temporary directory", e))?;
    let socket = dir.path().join("cri.sock");
    let runtime = FakeRuntime::new();
    let mut server = Some(spawn_in_thread(&socket, runtime.clone()).map_err(SoakError::Sim)?);
    let churn = spawn_churn(
        runtime.clone(),
        ChurnConfig {
            pods: cfg.pods,
            period: cfg.churn_period,
            seed: cfg.seed,
        },
    )
    .map_err(SoakError::Sim)?;
    let endpoint = format!("unix://{}", socket.display());
    let mut plegd = Plegd::start(cfg, &endpoint)?;
    wait_ready(&mut plegd)?;

    let mut csv = match &cfg.csv {
        Some(path) => {
            let file = File::create(path).map_err(|e| SoakError::io("create the CSV", e))?;
            let mut w = BufWriter::new(file);
            writeln!(w, "{CSV_HEADER}").map_err(|e| SoakError::io("write the CSV", e))?;
            Some(w)
        }
        None => None,
    };

    let start = Instant::now();
    let mut samples = Vec::new();
    let mut restarts = 0u64;
    let mut next_sample = start;
    let mut next_restart = cfg.restart_every.map(|every| start + every);
    let end = start + cfg.duration;
    loop {
        let now = Instant::now();
        if now >= next_sample {
            if let Some(status) = plegd.exited() {
                return Err(SoakError::PlegdExited {
                    status,
                    log_tail: plegd.log_tail(),
                    samples,
                });
            }
            let sample = take_sample(&plegd, start, restarts, churn.stats().steps);
            if let Some(w) = csv.as_mut() {
                writeln!(w, "{}", sample.csv_row())
                    .and_then(|()| w.flush())
                    .map_err(|e| SoakError::io("write the CSV", e))?;
            }
            on_sample(&sample);
            samples.push(sample);
            // Catch up without bursts if a sample took long.
            while next_sample <= Instant::now() {
                next_sample += cfg.sample_every;
            }
            if now >= end {
                break;
            }
        }
        if let Some(at) = next_restart {
            if now >= at {
                // A runtime restart: the socket goes away for a pause, then a new server
                // comes up on it over the same state (churn went on meanwhile).
                if let Some(s) = server.take() {
                    s.stop();
                }
                std::thread::sleep(cfg.restart_pause);
                server = Some(spawn_in_thread(&socket, runtime.clone()).map_err(SoakError::Sim)?);
                restarts += 1;
                next_restart = cfg.restart_every.map(|every| Instant::now() + every);
                continue;
            }
        }
        let wake = next_restart.map_or(next_sample, |r| r.min(next_sample));
        std::thread::sleep(
            wake.saturating_duration_since(Instant::now())
                .min(Duration::from_millis(200)),
        );
    }

    let missed_lines = plegd.missed.load(Ordering::Relaxed);
    let (exit, log_tail) = plegd.stop();
    churn.stop();
    if let Some(s) = server.take() {
        s.stop();
    }
    Ok(SoakReport {
        samples,
        restarts,
        missed_lines,
        exit,
        log_tail,
    })
}

fn wait_ready(plegd: &mut Plegd) -> Result<(), SoakError> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Some(status) = plegd.exited() {
            return Err(SoakError::PlegdExited {
                status,
                log_tail: plegd.log_tail(),
                samples: Vec::new(),
            });
        }
        if scrape(plegd.metrics).is_some_and(|m| {
            m.count("kubelet_pleg_relist_duration_seconds_count", &[])
                .is_some_and(|n| n > 0)
        }) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(SoakError::NotReady {
                log_tail: plegd.log_tail(),
            });
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn take_sample(plegd: &Plegd, start: Instant, restarts: u64, churn_steps: u64) -> Sample {
    let pid = plegd.pid();
    let (rss_kb, threads) = proc_status(pid).unwrap_or_default();
    let metrics = scrape(plegd.metrics).unwrap_or_default();
    let m = |name: &str, label: &str| metrics.count(name, &[label]);
    Sample {
        time_s: start.elapsed().as_secs_f64(),
        rss_kb,
        threads,
        fds: proc_fds(pid).unwrap_or_default(),
        events: plegd.events.load(Ordering::Relaxed),
        events_metric: m("kubelet_pleg_events_total", ""),
        relists: m("kubelet_pleg_relist_duration_seconds_count", ""),
        relist_requests: m("plegd_relist_requests_total", "result=\"queued\""),
        stream_connects: m("kubelet_evented_pleg_connection_success_count", ""),
        stream_errors: m("kubelet_evented_pleg_connection_error_count", ""),
        stream_connected: m("plegd_evented_stream_connected", ""),
        relist_errors: m("plegd_relist_errors_total", ""),
        restarts,
        churn_steps,
        log_lines: plegd.log_lines.load(Ordering::Relaxed),
    }
}

/// Bounds for [`check_growth`].
#[derive(Clone, Debug)]
pub struct GrowthLimits {
    /// Samples this early (seconds) are start-up, not compared.
    pub warmup_s: f64,
    /// Allowed rise of the median RSS from the first third to the last.
    pub rss_slack_kb: u64,
    /// Allowed rise of the highest thread count, first third to last.
    pub thread_slack: u64,
    /// Allowed rise of the highest fd count, first third to last.
    pub fd_slack: u64,
}

impl Default for GrowthLimits {
    fn default() -> Self {
        GrowthLimits {
            warmup_s: 20.0,
            rss_slack_kb: 4 * 1024,
            thread_slack: 2,
            fd_slack: 4,
        }
    }
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// Compares the first and last thirds of the samples after the warm-up: RSS (median,
/// and whether the whole last third sits above the whole first third, a steady
/// climb), threads and fds (maxima, which include the moments around restarts), and
/// that plegd kept working (relists and events advanced in the last third).
/// Returns every finding, empty when all is well.
pub fn check_growth(samples: &[Sample], limits: &GrowthLimits) -> Vec<String> {
    let mut problems = Vec::new();
    let after: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.time_s >= limits.warmup_s)
        .collect();
    if after.len() < 6 {
        problems.push(format!(
            "only {} samples after the {} s warm-up: too few to judge",
            after.len(),
            limits.warmup_s
        ));
        return problems;
    }
    let third = after.len() / 3;
    let (first, last) = (&after[..third], &after[after.len() - third..]);
    let col =
        |part: &[&Sample], f: fn(&Sample) -> u64| part.iter().map(|s| f(s)).collect::<Vec<_>>();

    let rss_first = median(col(first, |s| s.rss_kb));
    let rss_last = median(col(last, |s| s.rss_kb));
    if rss_last > rss_first + limits.rss_slack_kb {
        problems.push(format!(
            "RSS grew: median {rss_first} kB in the first third, {rss_last} kB in the last (slack {} kB)",
            limits.rss_slack_kb
        ));
    }
    let first_max = col(first, |s| s.rss_kb).into_iter().max().unwrap_or(0);
    let last_min = col(last, |s| s.rss_kb).into_iter().min().unwrap_or(0);
    // A climb: every late sample above every early one, by more than noise.
    if last_min > first_max + limits.rss_slack_kb / 2 {
        problems.push(format!(
            "RSS climbs steadily: last third's minimum {last_min} kB > first third's maximum {first_max} kB + {} kB",
            limits.rss_slack_kb / 2
        ));
    }
    let threads: fn(&Sample) -> u64 = |s| s.threads;
    for (what, f, slack) in [
        ("threads", threads, limits.thread_slack),
        ("fds", |s: &Sample| s.fds, limits.fd_slack),
    ] {
        let a = col(first, f).into_iter().max().unwrap_or(0);
        let b = col(last, f).into_iter().max().unwrap_or(0);
        if b > a + slack {
            problems.push(format!(
                "{what} grew: at most {a} in the first third, up to {b} in the last (slack {slack})"
            ));
        }
    }
    if after.iter().any(|s| s.rss_kb == 0 || s.threads == 0) {
        problems.push("some samples could not read /proc/<pid>/status".into());
    }
    // Still working: relists and events advanced during the last third.
    let (l0, l1) = (last[0], last[last.len() - 1]);
    if l1.relists.unwrap_or(0) <= l0.relists.unwrap_or(0) {
        problems.push(format!(
            "no global relist during the last third ({:?} → {:?}): plegd hung?",
            l0.relists, l1.relists
        ));
    }
    if l1.events <= l0.events {
        problems.push(format!(
            "no event on stdout during the last third ({} → {}) although churn went on",
            l0.events, l1.events
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(t: f64, rss_kb: u64) -> Sample {
        Sample {
            time_s: t,
            rss_kb,
            threads: 5,
            fds: 12,
            events: t as u64 * 10,
            relists: Some(t as u64),
            ..Sample::default()
        }
    }

    #[test]
    fn csv_rows_round_trip() {
        let s = Sample {
            time_s: 12.5,
            rss_kb: 9000,
            threads: 7,
            fds: 14,
            events: 300,
            events_metric: Some(301),
            relists: None,
            restarts: 2,
            ..Sample::default()
        };
        assert_eq!(Sample::from_csv_row(&s.csv_row()), Some(s));
        assert_eq!(Sample::from_csv_row("1,2,3"), None);
    }

    #[test]
    fn flat_noisy_rss_passes_and_a_climb_fails() {
        let limits = GrowthLimits::default();
        let flat: Vec<Sample> = (0..60)
            .map(|i| sample(f64::from(i) * 2.0, 10_000 + (i % 5) as u64 * 300))
            .collect();
        assert_eq!(check_growth(&flat, &limits), Vec::<String>::new());
        let climb: Vec<Sample> = (0..60)
            .map(|i| sample(f64::from(i) * 2.0, 10_000 + i as u64 * 200))
            .collect();
        let problems = check_growth(&climb, &limits);
        assert!(problems.iter().any(|p| p.contains("RSS")), "{problems:?}");
    }

    #[test]
    fn leaking_fds_and_a_hang_are_found() {
        let limits = GrowthLimits::default();
        let mut leak: Vec<Sample> = (0..60)
            .map(|i| sample(f64::from(i) * 2.0, 10_000))
            .collect();
        for (i, s) in leak.iter_mut().enumerate() {
            s.fds = 12 + i as u64 / 4;
            if i > 40 {
                s.relists = Some(41);
                s.events = 410;
            }
        }
        let problems = check_growth(&leak, &limits);
        assert!(
            problems.iter().any(|p| p.starts_with("fds grew")),
            "{problems:?}"
        );
        assert!(problems.iter().any(|p| p.contains("hung")), "{problems:?}");
        assert!(
            problems.iter().any(|p| p.contains("no event")),
            "{problems:?}"
        );
    }
}
