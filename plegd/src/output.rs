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
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Json,
    Text,
}

#[derive(Serialize)]
struct JsonEvent<'a> {
    time: String,
    pod_uid: &'a str,
    pod_name: &'a str,
    pod_namespace: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    container_id: &'a str,
    relist_source: &'a str,
    seq: u64,
    /// Events this output missed (its queue was full) just before this one.
    #[serde(skip_serializing_if = "is_zero")]
    missed: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

pub fn format_line(d: &Delivery, format: Format) -> String {
    let e = &d.event;
    let time = humantime::format_rfc3339_nanos(e.time).to_string();
    match format {
        Format::Json => serde_json::to_string(&JsonEvent {
            time,
            pod_uid: &e.pod.uid,
            pod_name: &e.pod.name,
            pod_namespace: &e.pod.namespace,
            kind: e.kind.as_str(),
            container_id: &e.container_id,
            relist_source: e.relist_source.as_str(),
            seq: d.seq,
            missed: d.missed,
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
            format!(
                "{time}  {:<16} {}/{}  {id}  (detected by {} relist){missed}",
                e.kind.as_str(),
                e.pod.namespace,
                e.pod.name,
                e.relist_source.as_str()
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

/// Opens (creating) a file for appending events.
pub fn open_append(path: &Path) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
}

/// Writes every delivery of `sub` to `target` until the publisher goes away, or until
/// a write fails: then `failed` is told (and the error is the thread's result).
pub fn spawn_writer(
    sub: Subscription,
    target: Target,
    format: Format,
    failed: tokio::sync::oneshot::Sender<()>,
) -> std::io::Result<JoinHandle<std::io::Result<()>>> {
    let out = target.open()?;
    std::thread::Builder::new()
        .name("event-output".into())
        .spawn(move || {
            let result = write_all(&sub, out, &target, format);
            if result.is_err() {
                let _ = failed.send(());
            }
            result
        })
}

fn write_all(
    sub: &Subscription,
    out: Box<dyn Write + Send>,
    target: &Target,
    format: Format,
) -> std::io::Result<()> {
    let mut out_buf = BufWriter::new(out);
    while let Ok(d) = sub.recv() {
        if target.reopen_asked() {
            out_buf.flush()?;
            out_buf = BufWriter::new(target.open()?);
        }
        writeln!(out_buf, "{}", format_line(&d, format))?;
        // Flush when the queue is momentarily empty, so lines appear promptly.
        if sub.is_empty() {
            out_buf.flush()?;
        }
    }
    out_buf.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use plegd_actors::{EventKind, LifecycleEvent, RelistSource};
    use plegd_runtime::PodRef;
    use std::sync::Arc;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn json_line_has_the_documented_fields() {
        let d = Delivery {
            seq: 7,
            missed: 2,
            event: Arc::new(LifecycleEvent {
                time: UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789),
                pod: PodRef {
                    uid: "u1".into(),
                    name: "web".into(),
                    namespace: "ns".into(),
                },
                kind: EventKind::ContainerDied,
                container_id: "c1".into(),
                relist_source: RelistSource::EventedPleg,
            }),
        };
        let v: serde_json::Value = serde_json::from_str(&format_line(&d, Format::Json)).unwrap();
        assert_eq!(v["time"], "2023-11-14T22:13:20.123456789Z");
        assert_eq!(v["pod_uid"], "u1");
        assert_eq!(v["pod_name"], "web");
        assert_eq!(v["pod_namespace"], "ns");
        assert_eq!(v["type"], "ContainerDied");
        assert_eq!(v["container_id"], "c1");
        assert_eq!(v["relist_source"], "evented_pleg");
        assert_eq!(v["seq"], 7);
        assert_eq!(v["missed"], 2);
        let text = format_line(&d, Format::Text);
        assert!(
            text.contains("ContainerDied") && text.contains("ns/web") && text.contains("missed 2")
        );
    }
}
