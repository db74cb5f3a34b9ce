//! The two processes a benchmark runs — the simulated runtime (`plegd-sim`) and plegd —
//! and what the harness reads from them: plegd's events (its JSON on stdout, stamped
//! on receipt), its Prometheus metrics, its CPU time and resident memory (`/proc`).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};

/// How long the harness waits for anything (a start, an event) before it gives up.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// A child process killed and reaped on drop.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// `plegd-sim` serving a node of `pods` pods.
pub struct Sim {
    _child: Reaped,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Sim {
    pub fn start(bin: &Path, pods: usize, containers: usize) -> Result<Sim> {
        let dir = tempfile::tempdir().context("a temporary directory for the socket")?;
        let socket = dir.path().join("cri.sock");
        let mut child = Command::new(bin)
            .arg("--socket")
            .arg(&socket)
            .args(["--pods", &pods.to_string()])
            .args(["--containers", &containers.to_string()])
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
}

/// A ContainerDied as plegd published it, stamped when the harness read it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub at: Instant,
    pub evented: bool,
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
}

impl Events {
    fn record(&self, line: &str) {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            return;
        };
        let at = Instant::now();
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if v["type"] == "ContainerDied" {
            if let Some(id) = v["container_id"].as_str() {
                seen.died.entry(id.to_string()).or_default().push(Seen {
                    at,
                    evented: v["relist_source"] == "evented_pleg",
                });
            }
        }
        self.changed.notify_all();
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

/// plegd as its own process against the simulated runtime.
pub struct Plegd {
    child: Reaped,
    port: u16,
    pub events: Arc<Events>,
    pub started: Instant,
}

impl Plegd {
    pub fn start(bin: &Path, sim: &Sim, extra: &[&str]) -> Result<Plegd> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("a free port")?
            .port();
        let started = Instant::now();
        let mut child = Command::new(bin)
            .arg("run")
            .arg("--runtime-endpoint")
            .arg(format!("unix://{}", sim.socket().display()))
            .args(["--events-json", "-"])
            .args(["--metrics-addr", &format!("127.0.0.1:{port}")])
            // The subscriber API serves as in production, on a socket of this run's
            // own: never the default /run/plegd/plegd.sock, which another plegd may hold.
            .arg("--api-socket")
            .arg(sim.socket().with_file_name("plegd-api.sock"))
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdout = child.stdout.take().context("plegd's stdout")?;
        let events = Arc::new(Events::default());
        let sink = events.clone();
        std::thread::Builder::new()
            .name("plegd-events".into())
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

    pub fn pid(&self) -> u32 {
        self.child.0.id()
    }

    fn get(&self, path: &str) -> Option<(u16, String)> {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
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

    pub fn metrics(&self) -> Result<Metrics> {
        match self.get("/metrics") {
            Some((200, text)) => Ok(Metrics(text)),
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

    /// Resident memory, KiB.
    pub fn rss_kib(&self) -> Result<u64> {
        rss_kib_of(self.pid())
    }
}

/// One scrape of plegd's `/metrics`.
pub struct Metrics(String);

impl Metrics {
    /// The sum of the samples of `name` whose labels contain every one of `labels`
    /// (`key="value"` strings).
    pub fn sum(&self, name: &str, labels: &[&str]) -> f64 {
        self.0
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                let (metric, rest) = match series.split_once('{') {
                    Some((m, r)) => (m, r),
                    None => (series, ""),
                };
                (metric == name && labels.iter().all(|lb| rest.contains(lb)))
                    .then(|| value.parse::<f64>().ok())
                    .flatten()
            })
            .sum()
    }
}

/// CPU time of every thread of `pid`, from `/proc/PID/task/*/schedstat` (nanoseconds;
/// `/proc/PID/stat` counts in 10 ms ticks, too coarse for a relist of a few ms).
fn cpu_of(pid: u32) -> Result<Duration> {
    let mut ns = 0u64;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let path = task?.path().join("schedstat");
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
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("VmRSS in /proc/PID/status")
}
