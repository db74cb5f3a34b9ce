//! plegd's own binary as a child process of the restart suite: `plegd run` on the
//! simulated CRI server with the seed's settings, a state dir, an API socket and
//! nothing else (no metrics port, no control socket, events to /dev/null), stopped
//! with SIGTERM or SIGKILL and started again on the same state. Each start logs to
//! its own file, so a failing seed can show what plegd said.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::schedule::RunConfig;

/// How long a clean stop may take: plegd's own shutdown bound is a few seconds.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

pub struct PlegdChild {
    binary: PathBuf,
    dir: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
    /// Starts so far (each logs to `plegd-<n>.log`).
    pub starts: u64,
}

impl PlegdChild {
    /// plegd with the seed's settings, its state and sockets in `dir`.
    pub fn new(binary: &Path, dir: &Path, endpoint: &str, cfg: &RunConfig) -> Self {
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        let mut args: Vec<String> = vec![
            "run".into(),
            "--runtime-endpoint".into(),
            endpoint.into(),
            "--state-dir".into(),
            dir.join("state").display().to_string(),
            "--api-socket".into(),
            Self::api_socket_in(dir).display().to_string(),
            "--api-control-socket".into(),
            "off".into(),
            "--metrics-addr".into(),
            "off".into(),
            "--events-json".into(),
            "/dev/null".into(),
            "--relist-period".into(),
            ms(cfg.relist_period),
            "--queue-capacity".into(),
            cfg.queue_capacity.to_string(),
            "--status-concurrency".into(),
            cfg.status_concurrency.to_string(),
            "--reconnect-base".into(),
            ms(cfg.reconnect_base),
            "--reconnect-cap".into(),
            ms(cfg.reconnect_cap),
            "--node-name".into(),
            "chaos".into(),
        ];
        if cfg.evented {
            args.extend(["--hint-sources".into(), "cri-events".into()]);
        } else {
            args.extend(["--evented".into(), "false".into()]);
        }
        PlegdChild {
            binary: binary.to_path_buf(),
            dir: dir.to_path_buf(),
            args,
            child: None,
            starts: 0,
        }
    }

    /// The API socket of a plegd whose files are in `dir`.
    pub fn api_socket_in(dir: &Path) -> PathBuf {
        dir.join("api.sock")
    }

    pub fn api_socket(&self) -> PathBuf {
        Self::api_socket_in(&self.dir)
    }

    fn log_path(&self, start: u64) -> PathBuf {
        self.dir.join(format!("plegd-{start}.log"))
    }

    /// Starts plegd (again).
    pub fn start(&mut self) -> Result<(), String> {
        self.starts += 1;
        let log = File::create(self.log_path(self.starts)).map_err(|e| format!("log: {e}"))?;
        let child = Command::new(&self.binary)
            .args(&self.args)
            // Warnings and errors only: the suite runs many plegd at once.
            .env("RUST_LOG", "warn")
            .env_remove("PLEGD_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| format!("start {}: {e}", self.binary.display()))?;
        self.child = Some(child);
        Ok(())
    }

    /// The exit status, if plegd has exited (the child is then forgotten).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok().flatten()?;
        self.child = None;
        Some(status)
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    /// Stops plegd: SIGKILL, or SIGTERM and its exit; the status it exited with.
    pub async fn stop(&mut self, kill: bool) -> Result<ExitStatus, String> {
        let Some(child) = self.child.as_mut() else {
            return Err("not running".into());
        };
        if kill {
            child.kill().map_err(|e| format!("SIGKILL: {e}"))?;
        } else {
            // std sends only SIGKILL; `kill` sends the rest (no unsafe code here).
            let sent = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status()
                .map_err(|e| format!("kill -TERM: {e}"))?;
            if !sent.success() {
                return Err(format!("kill -TERM: {sent}"));
            }
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if let Some(status) = self.exited() {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                if let Some(mut c) = self.child.take() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                return Err(format!("plegd did not exit within {STOP_TIMEOUT:?}"));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Every start's warnings and errors (at most `lines` of each), for a failing
    /// seed's report: how each start went on from the state dir, or why not.
    pub fn logs(&self, lines: usize) -> String {
        let mut out = String::new();
        for start in 1..=self.starts {
            let text = std::fs::read_to_string(self.log_path(start)).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            if all.is_empty() {
                continue;
            }
            out.push_str(&format!("\n    start {start}:"));
            for line in &all[all.len().saturating_sub(lines)..] {
                out.push_str("\n      ");
                out.push_str(line);
            }
        }
        out
    }

    /// The last `lines` lines plegd logged in its latest start.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.log_path(self.starts)).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n    ")
    }
}

impl Drop for PlegdChild {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
