//! A status poller in a process of its own. The harness runs itself with
//! `--status-poller-child ENDPOINT`; the child checks every CONTAINER_STOPPED_EVENT
//! with the container's ContainerStatus until it says EXITED, as the harness's own
//! poller does, and tells each event's arrival and each EXITED answer on its stdout.
//! The harness stamps those lines as they arrive, as it stamps plegd's events: the
//! two pollers are then as far apart as two processes are, as plegd and the poller.
//!
//! The child's stdin takes `quiet 1` (read nothing) and `quiet 0`, each told back on
//! its stdout once taken; the end of its stdin ends it.

use std::io::{BufReader, Write as _};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};

use crate::real_cri::{Check, RawExits, RawSeen, RealCri};

/// How the child's lines begin: an event's arrival, an EXITED answer (or, quiet, the
/// arrival again), its stream's end, a `quiet` command taken.
pub(crate) const ARRIVED: &str = "arrived";
pub(crate) const RECORDED: &str = "recorded";
pub(crate) const ENDED: &str = "ended";
const QUIET: &str = "quiet";
/// How long the harness waits for the child to take a `quiet` command.
const PATIENCE: Duration = Duration::from_secs(10);

/// Writes one line on stdout, at once; a harness gone ends the child.
pub(crate) fn tell(kind: &str, what: &str) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{kind} {what}")
        .and_then(|()| out.flush())
        .is_err()
    {
        std::process::exit(1);
    }
}

/// The child: polls `endpoint`'s stopped containers until its stdin ends.
pub fn run_child(endpoint: &str) -> Result<()> {
    let rt = crate::one_worker_runtime("the poller's async runtime", None)?;
    let _entered = rt.enter();
    let logs = tempfile::tempdir()?;
    let cri = RealCri::new(endpoint, logs.path())?;
    let quiet = Arc::new(AtomicBool::new(false));
    let raw = cri.checked_stopped_events(&rt, Check::Status, quiet.clone());
    raw.echo();
    for line in std::io::stdin().lines() {
        let line = line.context("the harness's commands")?;
        let quieted = match line.as_str() {
            "quiet 1" => true,
            "quiet 0" => false,
            other => bail!("not a command of the harness: {other:?}"),
        };
        quiet.store(quieted, Ordering::SeqCst);
        tell(QUIET, if quieted { "1" } else { "0" });
    }
    Ok(())
}

/// The harness's end of a child.
pub struct Child {
    process: std::process::Child,
    stdin: Mutex<ChildStdin>,
    /// The `quiet` commands the child took, in order.
    taken: Mutex<mpsc::Receiver<bool>>,
}

impl Child {
    /// Sends `quiet` and waits until the child has taken it.
    pub fn set_quiet(&self, quiet: bool) -> Result<()> {
        let mut stdin = self.stdin.lock().unwrap_or_else(|e| e.into_inner());
        writeln!(stdin, "{QUIET} {}", u8::from(quiet))
            .and_then(|()| stdin.flush())
            .context("writing to the status poller's process")?;
        let taken = self.taken.lock().unwrap_or_else(|e| e.into_inner());
        match taken.recv_timeout(PATIENCE) {
            Ok(q) if q == quiet => Ok(()),
            Ok(q) => bail!("the status poller's process took quiet {q}, not {quiet}"),
            Err(_) => {
                bail!("the status poller's process did not take quiet {quiet} in {PATIENCE:?}")
            }
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// Starts a child on `endpoint` (this executable again); what it tells is stamped
/// as it arrives.
pub fn spawn(endpoint: &str) -> Result<RawExits> {
    let exe = std::env::current_exe().context("the harness's own path")?;
    let mut process = Command::new(&exe)
        .args(["--status-poller-child", endpoint])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {} --status-poller-child", exe.display()))?;
    let (Some(stdin), Some(stdout)) = (process.stdin.take(), process.stdout.take()) else {
        let _ = process.kill();
        let _ = process.wait();
        return Err(anyhow!(
            "the status poller's process has no stdin or stdout"
        ));
    };
    let seen = Arc::new(RawSeen::default());
    let (sink, (tx, rx)) = (seen.clone(), mpsc::channel());
    std::thread::Builder::new()
        .name("poller-process".into())
        .spawn(move || {
            let why = read(BufReader::new(stdout), &sink, &tx);
            sink.end(why);
        })
        .context("the status poller's reader thread")?;
    Ok(RawExits::in_process(
        seen,
        Child {
            process,
            stdin: Mutex::new(stdin),
            taken: Mutex::new(rx),
        },
    ))
}

/// Reads the child's lines into `sink` (and its taken commands into `taken`) until
/// it ends; returns why.
fn read(out: impl std::io::BufRead, sink: &RawSeen, taken: &mpsc::Sender<bool>) -> String {
    for line in out.lines() {
        let at = Instant::now();
        let Ok(line) = line else {
            return "the status poller's process: its stdout failed".into();
        };
        let (kind, what) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        match kind {
            ARRIVED => sink.arrive(what.to_string(), at),
            RECORDED => sink.record(what.to_string(), at),
            QUIET => {
                let _ = taken.send(what == "1");
            }
            ENDED => return format!("the status poller's process: {what}"),
            _ => return format!("the status poller's process said {line:?}"),
        }
    }
    "the status poller's process ended".into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_childs_lines_are_read_into_the_sink_until_its_end() {
        let sink = RawSeen::default();
        let (tx, rx) = mpsc::channel();
        let lines = "arrived c1\nquiet 1\nrecorded c1\nended Unavailable: gone\narrived c2\n";
        let why = read(lines.as_bytes(), &sink, &tx);
        assert_eq!(why, "the status poller's process: Unavailable: gone");
        assert_eq!(rx.try_recv(), Ok(true));
        assert!(sink.arrived("c1").is_some() && sink.recorded("c1").is_some());
        assert!(sink.arrived("c2").is_none(), "read after the end");
    }

    #[test]
    fn a_line_the_harness_does_not_know_ends_the_reading() {
        let sink = RawSeen::default();
        let (tx, _rx) = mpsc::channel();
        let why = read("arrived c1\nbogus\nrecorded c1\n".as_bytes(), &sink, &tx);
        assert_eq!(why, "the status poller's process said \"bogus\"");
        assert!(sink.recorded("c1").is_none());
        let why = read("".as_bytes(), &sink, &tx);
        assert_eq!(why, "the status poller's process ended");
    }
}
