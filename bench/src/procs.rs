//! The two processes a benchmark runs — the simulated runtime (`plegd-sim`) and plegd —
//! and what the harness reads from them: plegd's events (its JSON on stdout, stamped
//! on receipt), its Prometheus metrics, its CPU time and resident memory (`/proc`).

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};
use plegd_testkit::metrics::Scrape;
use plegd_testkit::process::{free_port, http_get, status_field, Reaped};

/// How long the harness waits for anything (a start, an event) before it gives up.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Which node `plegd-sim` builds.
#[derive(Clone, Copy, Debug)]
pub struct Node {
    pub pods: usize,
    pub containers: usize,
    /// The light node (short IDs, no labels or annotations) instead of the realistic
    /// one (plegd_sim::kubelet).
    pub light: bool,
    /// On the realistic node, every this-many-th sandbox (0: none) carries an
    /// annotation of `heavy_bytes`.
    pub heavy_every: usize,
    pub heavy_bytes: usize,
}

/// `plegd-sim` serving a node.
pub struct Sim {
    _child: Reaped,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Sim {
    pub fn start(bin: &Path, node: Node) -> Result<Sim> {
        let dir = tempfile::tempdir().context("a temporary directory for the socket")?;
        let socket = dir.path().join("cri.sock");
        let mut cmd = Command::new(bin);
        cmd.arg("--socket")
            .arg(&socket)
            .args(["--pods", &node.pods.to_string()])
            .args(["--containers", &node.containers.to_string()])
            .args(["--heavy-every", &node.heavy_every.to_string()])
            .args(["--heavy-bytes", &node.heavy_bytes.to_string()]);
        if node.light {
            cmd.arg("--light");
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdout = child.stdout.take().context("plegd-sim's stdout")?;
        let child = Reaped(child);
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .context("reading plegd-sim's ready line")?;
        if !line.starts_with("ready") {
            bail!("plegd-sim did not start (said {line:?})");
        }
        Ok(Sim {
            _child: child,
            socket,
            _dir: dir,
        })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// plegd's `--runtime-endpoint` for this runtime.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The run's temporary directory (plegd's API socket goes there too).
    pub fn dir(&self) -> &Path {
        self._dir.path()
    }
}

/// A ContainerDied as plegd published it, stamped when the harness read it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub at: Instant,
    /// Found by a relist the CRI event stream asked for (`relist_source` evented_pleg).
    pub evented: bool,
    /// The event's `relist_source` (global, evented_pleg, containerd_events, nri...).
    pub source: String,
    /// The event's `time`: when the status read that showed the death began, ns
    /// since the epoch (0 if the line had none, or it did not parse).
    pub read_ns: i64,
}

#[derive(Default)]
struct Published {
    died: HashMap<String, Vec<Seen>>,
}

/// Everything plegd published so far, by container.
#[derive(Default)]
pub struct Events {
    seen: Mutex<Published>,
    changed: Condvar,
    on_died: Mutex<Option<OnDied>>,
}

type OnDied = Box<dyn Fn(&str) + Send>;

impl Events {
    fn record(&self, line: &str) {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            return;
        };
        let at = Instant::now();
        let died = (v["type"] == "ContainerDied")
            .then(|| v["container_id"].as_str())
            .flatten();
        if let (Some(id), Some(hook)) = (died, &*self.hook()) {
            hook(id);
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(id) = died {
            let source = v["relist_source"].as_str().unwrap_or("").to_string();
            let read_ns = v["time"]
                .as_str()
                .and_then(|t| humantime::parse_rfc3339(t).ok())
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
            seen.died.entry(id.to_string()).or_default().push(Seen {
                at,
                evented: source == "evented_pleg",
                source,
                read_ns,
            });
        }
        self.changed.notify_all();
    }

    /// Calls `hook` with the container of each ContainerDied line from now on, on the
    /// thread reading plegd's stdout, once the line is stamped and before it is
    /// recorded (keep it short).
    pub fn on_died(&self, hook: impl Fn(&str) + Send + 'static) {
        *self.hook() = Some(Box::new(hook));
    }

    fn hook(&self) -> std::sync::MutexGuard<'_, Option<OnDied>> {
        self.on_died.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until every container of `ids` was reported dead (or `patience` passed);
    /// returns what was seen of each, in the order of `ids`.
    pub fn wait_died(&self, ids: &[String], patience: Duration) -> Vec<Vec<Seen>> {
        let deadline = Instant::now() + patience;
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            let all = ids.iter().all(|id| seen.died.contains_key(id));
            let now = Instant::now();
            if all || now >= deadline {
                return ids
                    .iter()
                    .map(|id| seen.died.get(id).cloned().unwrap_or_default())
                    .collect();
            }
            seen = self
                .changed
                .wait_timeout(seen, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }
}

/// plegd as its own process against a runtime (the simulated one, or containerd).
pub struct Plegd {
    child: Reaped,
    port: u16,
    api_socket: PathBuf,
    pub events: Arc<Events>,
    pub started: Instant,
}

impl Plegd {
    /// Starts plegd against `endpoint` (`unix://...`), its API socket in `dir`, and
    /// waits until `/readyz` says its first global relist is done.
    pub fn start(bin: &Path, endpoint: &str, dir: &Path, extra: &[&str]) -> Result<Plegd> {
        let api_socket = dir.join("plegd-api.sock");
        let port = free_port().context("a free port")?;
        let started = Instant::now();
        let mut child = Command::new(bin)
            .arg("run")
            .args(["--runtime-endpoint", endpoint])
            .args(["--events-json", "-"])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            // The subscriber API serves as in production, on a socket of this run's
            // own: never the default /run/plegd/plegd.sock, which another plegd may hold.
            .arg("--api-socket")
            .arg(&api_socket)
            // No state dir unless `extra` gives one (never the node's /var/lib/plegd);
            // `--state-dir=run` is this run's own (measured with a state dir: each plegd
            // on a fresh one, as each runs against a new simulated node).
            .env("PLEGD_STATE_DIR", "off")
            .args(extra.iter().map(|a| match *a {
                "--state-dir=run" => format!("--state-dir={}", dir.join("plegd-state").display()),
                a => a.to_string(),
            }))
            // Its log level: warn, or the environment's PLEGD_BENCH_LOG (a RUST_LOG
            // filter, e.g. `plegd_actors=debug` to follow each hint and relist).
            .env(
                "RUST_LOG",
                std::env::var("PLEGD_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdout = child.stdout.take().context("plegd's stdout")?;
        let events = Arc::new(Events::default());
        let sink = events.clone();
        std::thread::Builder::new()
            .name(crate::cpu_wait::READER.into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    sink.record(&line);
                }
            })
            .context("a thread reading plegd's events")?;
        let mut plegd = Plegd {
            child: Reaped(child),
            port,
            api_socket,
            events,
            started,
        };
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(st) = plegd.child.0.try_wait()? {
                bail!("plegd exited at start: {st}");
            }
            if plegd.get("/readyz").is_some_and(|(code, _)| code == 200) {
                return Ok(plegd);
            }
            if Instant::now() > deadline {
                bail!("plegd not ready after {PATIENCE:?}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The subscriber API's socket (plegd.v1).
    pub fn api_socket(&self) -> &Path {
        &self.api_socket
    }

    pub fn pid(&self) -> u32 {
        self.child.0.id()
    }

    fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.port, path)
    }

    /// One scrape of plegd's `/metrics`.
    pub fn metrics(&self) -> Result<Scrape> {
        match self.get("/metrics") {
            Some((200, response)) => {
                Scrape::from_response(&response).context("plegd's /metrics had no body")
            }
            other => Err(anyhow!(
                "plegd's /metrics answered {:?}",
                other.map(|o| o.0)
            )),
        }
    }

    /// User + system CPU time so far.
    pub fn cpu(&self) -> Result<Duration> {
        cpu_of(self.pid())
    }

    /// CPU time so far of plegd's threads named `name` (e.g. `plegd-api`).
    pub fn thread_cpu(&self, name: &str) -> Result<Duration> {
        threads_cpu(&format!("/proc/{}/task", self.pid()), Some(name))
    }

    /// Resident memory, KiB.
    pub fn rss_kib(&self) -> Result<u64> {
        rss_kib_of(self.pid())
    }

    /// Resident memory sampled every `every` over `window`, KiB: the least (between
    /// global relists) and the most (while a relist holds the runtime's lists: one
    /// sample taken at a random moment lands in either).
    pub fn rss_range_kib(&self, window: Duration, every: Duration) -> Result<(u64, u64)> {
        let end = Instant::now() + window;
        let first = self.rss_kib()?;
        let (mut least, mut most) = (first, first);
        while Instant::now() < end {
            std::thread::sleep(every);
            let kib = self.rss_kib()?;
            least = least.min(kib);
            most = most.max(kib);
        }
        Ok((least, most))
    }

    /// Its anonymous resident memory (heap, stacks: RSS without the pages of files it
    /// mapped, its own binary's code among them), KiB.
    pub fn anon_kib(&self) -> Result<u64> {
        status_kib(self.pid(), "RssAnon:")
    }
}

/// An instant as nanoseconds since the Unix epoch (to compare with times a runtime
/// reports, e.g. a container's `finished_at`): converted through one reading of both
/// clocks, taken at the first call.
pub fn epoch_ns(at: Instant) -> i64 {
    static ANCHOR: std::sync::OnceLock<(Instant, i64)> = std::sync::OnceLock::new();
    let (i0, ns0) = *ANCHOR.get_or_init(|| {
        let ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        (Instant::now(), ns)
    });
    if at >= i0 {
        ns0 + (at - i0).as_nanos() as i64
    } else {
        ns0 - (i0 - at).as_nanos() as i64
    }
}

/// CPU time of every thread of `pid`, from `/proc/PID/task/*/schedstat` (nanoseconds;
/// `/proc/PID/stat` counts in 10 ms ticks, too coarse for a relist of a few ms).
fn cpu_of(pid: u32) -> Result<Duration> {
    threads_cpu(&format!("/proc/{pid}/task"), None)
}

/// CPU time of the threads named `name` of this process (the bench's own watchers).
pub fn own_threads_cpu(name: &str) -> Result<Duration> {
    threads_cpu("/proc/self/task", Some(name))
}

/// CPU time of the threads under `tasks` (a `/proc/PID/task`), only those named
/// `name` (their `comm`) if given.
fn threads_cpu(tasks: &str, name: Option<&str>) -> Result<Duration> {
    let mut ns = 0u64;
    for task in std::fs::read_dir(tasks)? {
        let task = task?.path();
        if let Some(name) = name {
            let comm = std::fs::read_to_string(task.join("comm")).unwrap_or_default();
            if comm.trim_end() != name {
                continue;
            }
        }
        let path = task.join("schedstat");
        // A thread that ended between the listing and the read counts no more.
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        ns += text
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .with_context(|| format!("{}", path.display()))?;
    }
    Ok(Duration::from_nanos(ns))
}

fn rss_kib_of(pid: u32) -> Result<u64> {
    status_kib(pid, "VmRSS:")
}

/// A `/proc/PID/status` field in KiB (`field` with its colon).
fn status_kib(pid: u32, field: &str) -> Result<u64> {
    status_field(pid, field).with_context(|| format!("{field} in /proc/{pid}/status"))
}

#[cfg(test)]
mod tests {
    use super::Events;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    #[test]
    fn the_died_hook_hears_each_containerdied_line_before_it_is_seen() {
        let events = Arc::new(Events::default());
        let heard = Arc::new(Mutex::new(Vec::new()));
        let (h, e) = (heard.clone(), events.clone());
        events.on_died(move |id| {
            // Not recorded yet: a waiter cannot have returned before the hook ran.
            assert!(e.wait_died(&[id.to_string()], Duration::ZERO)[0].is_empty());
            h.lock().unwrap().push(id.to_string());
        });
        events.record(r#"{"type":"ContainerStarted","container_id":"a"}"#);
        events.record(r#"{"type":"ContainerDied","container_id":"b","relist_source":"nri"}"#);
        events.record("not json");
        assert_eq!(*heard.lock().unwrap(), ["b"]);
        let seen = events.wait_died(&["b".to_string()], Duration::ZERO);
        assert_eq!(seen[0][0].source, "nri");
    }
}
