//! The event output: a subscriber on its own thread writing one line per event, as
//! JSON or in a readable form. It drains its queue before exiting, so every event
//! published before shutdown is written. A write that fails (a closed pipe, a full
//! disk) ends it at once and says so through `failed`: plegd then shuts down with an
//! error instead of relisting on with every later event lost.

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use plegd_actors::{Delivery, Subscription};

use crate::cursor::Cursor;
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    Text,
}

/// One line of `--events-json` (README "Output" documents every field). Details the
/// runtime did not report are left out, never invented.
#[derive(Serialize)]
struct JsonEvent<'a> {
    time: String,
    /// The plegd instance the revision is of.
    #[serde(skip_serializing_if = "Option::is_none")]
    instance: Option<&'a str>,
    revision: u64,
    pod_uid: &'a str,
    pod_name: &'a str,
    pod_namespace: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    container_id: &'a str,
    container_name: &'a str,
    sandbox: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    attempt: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    image: Option<&'a str>,
    /// Left out for a snapshot event (`plegd watch --initial-events`): no relist
    /// found it.
    #[serde(skip_serializing_if = "Option::is_none")]
    relist_source: Option<&'a str>,
    seq: u64,
    /// A synthetic event of the initial state (`plegd watch --initial-events`).
    #[serde(skip_serializing_if = "is_false")]
    snapshot: bool,
    /// Events this output missed (its queue was full) just before this one.
    #[serde(skip_serializing_if = "is_zero")]
    missed: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    started_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    finished_at: Option<String>,
}

fn rfc3339(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_nanos(t).to_string()
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

pub fn format_line(d: &Delivery, format: Format, instance: Option<&str>) -> String {
    format_event(d, format, false, instance)
}

/// One event's line; `snapshot` for a synthetic event of the initial state (what
/// `plegd watch --initial-events` prints first); `instance`: the plegd instance, in
/// JSON.
pub fn format_event(
    d: &Delivery,
    format: Format,
    snapshot: bool,
    instance: Option<&str>,
) -> String {
    let e = &d.event;
    let time = rfc3339(e.time);
    let exit = e.exit.as_ref();
    match format {
        Format::Json => serde_json::to_string(&JsonEvent {
            time,
            instance,
            revision: e.revision,
            pod_uid: &e.pod.uid,
            pod_name: &e.pod.name,
            pod_namespace: &e.pod.namespace,
            kind: e.kind.as_str(),
            container_id: &e.container_id,
            container_name: &e.container_name,
            sandbox: e.sandbox,
            attempt: e.attempt,
            image: e.image.as_deref(),
            relist_source: (!snapshot).then(|| e.relist_source.as_str()),
            seq: d.seq,
            snapshot,
            missed: d.missed,
            exit_code: exit.map(|x| x.code),
            reason: exit.and_then(|x| x.reason.as_deref()),
            message: exit.and_then(|x| x.message.as_deref()),
            started_at: exit.and_then(|x| x.started_at).map(rfc3339),
            finished_at: exit.and_then(|x| x.finished_at).map(rfc3339),
        })
        .unwrap_or_else(|err| format!("{{\"error\":\"cannot encode event: {err}\"}}")),
        Format::Text => {
            let missed = if d.missed > 0 {
                format!("  [missed {} events before this one]", d.missed)
            } else {
                String::new()
            };
            let id = if e.container_id.is_empty() {
                "-"
            } else {
                &e.container_id
            };
            let what = match (e.sandbox, e.container_name.as_str()) {
                (true, _) => "sandbox".to_string(),
                (false, "") => String::new(),
                (false, name) => format!("container {name}"),
            };
            let exit = exit
                .map(|x| match &x.reason {
                    Some(r) => format!("  exit {} ({r})", x.code),
                    None => format!("  exit {}", x.code),
                })
                .unwrap_or_default();
            let by = if snapshot {
                "snapshot".to_string()
            } else {
                format!("detected by {} relist", e.relist_source.as_str())
            };
            format!(
                "{time}  #{:<6} {:<16} {}/{}  {what} {id}{exit}  ({by}){missed}",
                e.revision,
                e.kind.as_str(),
                e.pod.namespace,
                e.pod.name,
            )
        }
    }
}

/// Where events are written.
pub enum Target {
    Stdout,
    /// A file, appended to; reopened (by path) when `reopen` is set, as log rotation
    /// expects after it moved the file away.
    File {
        path: PathBuf,
        reopen: Arc<AtomicBool>,
    },
}

impl Target {
    fn open(&self) -> std::io::Result<Box<dyn Write + Send>> {
        Ok(match self {
            Target::Stdout => Box::new(std::io::stdout()),
            Target::File { path, .. } => Box::new(open_append(path)?),
        })
    }

    fn reopen_asked(&self) -> bool {
        match self {
            Target::Stdout => false,
            Target::File { reopen, .. } => reopen.swap(false, Ordering::SeqCst),
        }
    }
}

/// Whether stdout is /dev/null, where event lines are lost: a redirect, or a stdout
/// that was closed when plegd started (Rust's runtime opens /dev/null in its place).
pub fn stdout_is_dev_null() -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Ok(fd) = std::io::stdout().as_fd().try_clone_to_owned() else {
        return false;
    };
    match (
        std::fs::File::from(fd).metadata(),
        std::fs::metadata("/dev/null"),
    ) {
        (Ok(out), Ok(null)) => out.file_type().is_char_device() && out.rdev() == null.rdev(),
        _ => false,
    }
}

/// Opens (creating) a file for appending events.
pub fn open_append(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// Writes every delivery of `sub` to `target` until the publisher goes away, or until
/// a write fails: then `failed` is told (and the error is the thread's result).
/// The writer's thread; `instance` goes on each JSON line; `cursor`, when there is
/// a state dir, is saved as lines are written (see `cursor`).
pub fn spawn_writer(
    sub: Subscription,
    target: Target,
    format: Format,
    instance: String,
    cursor: Option<Cursor>,
    failed: tokio::sync::oneshot::Sender<()>,
) -> std::io::Result<JoinHandle<std::io::Result<()>>> {
    let out = target.open()?;
    std::thread::Builder::new()
        .name("event-output".into())
        .spawn(move || {
            let lines = Lines {
                target: &target,
                format,
                instance: &instance,
            };
            let result = write_all(&sub, out, &lines, cursor);
            if result.is_err() {
                let _ = failed.send(());
            }
            result
        })
}

/// Where and how the writer writes.
struct Lines<'a> {
    target: &'a Target,
    format: Format,
    instance: &'a str,
}

fn write_all(
    sub: &Subscription,
    out: Box<dyn Write + Send>,
    lines: &Lines<'_>,
    mut cursor: Option<Cursor>,
) -> std::io::Result<()> {
    let mut out_buf = BufWriter::new(out);
    let mut written = 0;
    while let Ok(d) = sub.recv() {
        if lines.target.reopen_asked() {
            out_buf.flush()?;
            out_buf = BufWriter::new(lines.target.open()?);
        }
        writeln!(
            out_buf,
            "{}",
            format_line(&d, lines.format, Some(lines.instance))
        )?;
        written = d.event.revision;
        // Flush when the queue is momentarily empty, so lines appear promptly, and
        // before each save of the cursor, which only ever says what was flushed.
        let save = cursor.as_ref().is_some_and(Cursor::due);
        if sub.is_empty() || save {
            out_buf.flush()?;
            if let Some(c) = &mut cursor {
                c.save(written, false);
            }
        }
    }
    out_buf.flush()?;
    if let Some(c) = &mut cursor {
        c.save(written, true);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use plegd_actors::{EventKind, Exit, LifecycleEvent, RelistSource};
    use plegd_runtime::PodRef;
    use std::sync::Arc;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn json_line_has_the_documented_fields() {
        let d = Delivery {
            seq: 7,
            missed: 2,
            event: Arc::new(LifecycleEvent {
                revision: 42,
                time: UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789),
                pod: PodRef {
                    uid: "u1".into(),
                    name: "web".into(),
                    namespace: "ns".into(),
                },
                kind: EventKind::ContainerDied,
                container_id: "c1".into(),
                relist_source: RelistSource::EventedPleg,
                container_name: "app".into(),
                sandbox: false,
                attempt: Some(2),
                image: Some("busybox:1".into()),
                exit: Some(Exit {
                    code: 137,
                    reason: Some("OOMKilled".into()),
                    message: None,
                    started_at: Some(UNIX_EPOCH + Duration::from_secs(1_699_999_990)),
                    finished_at: Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000)),
                }),
            }),
        };
        let v: serde_json::Value =
            serde_json::from_str(&format_line(&d, Format::Json, Some("i"))).unwrap();
        assert_eq!(v["time"], "2023-11-14T22:13:20.123456789Z");
        assert_eq!(v["pod_uid"], "u1");
        assert_eq!(v["pod_name"], "web");
        assert_eq!(v["pod_namespace"], "ns");
        assert_eq!(v["type"], "ContainerDied");
        assert_eq!(v["container_id"], "c1");
        assert_eq!(v["relist_source"], "evented_pleg");
        assert_eq!(v["seq"], 7);
        assert_eq!(v["missed"], 2);
        assert_eq!(v["revision"], 42);
        assert_eq!(v["container_name"], "app");
        assert_eq!(v["sandbox"], false);
        assert_eq!(v["attempt"], 2);
        assert_eq!(v["image"], "busybox:1");
        assert_eq!(v["exit_code"], 137);
        assert_eq!(v["reason"], "OOMKilled");
        assert!(v.get("message").is_none(), "not reported, not invented");
        assert_eq!(v["started_at"], "2023-11-14T22:13:10.000000000Z");
        assert_eq!(v["finished_at"], "2023-11-14T22:13:20.000000000Z");
        let text = format_line(&d, Format::Text, Some("i"));
        assert!(
            text.contains("ContainerDied") && text.contains("ns/web") && text.contains("missed 2")
        );
    }
}
