//! The event output: a subscriber on its own thread writing one line per event, as
//! JSON or in a readable form. It drains its queue before exiting, so every event
//! published before shutdown is written.

use std::io::{BufWriter, Write};
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

/// Writes every delivery of `sub` to `out` until the publisher goes away.
pub fn spawn_writer(
    sub: Subscription,
    mut out: Box<dyn Write + Send>,
    format: Format,
) -> std::io::Result<JoinHandle<std::io::Result<()>>> {
    std::thread::Builder::new()
        .name("event-output".into())
        .spawn(move || {
            let mut out_buf = BufWriter::new(&mut out);
            while let Ok(d) = sub.recv() {
                writeln!(out_buf, "{}", format_line(&d, format))?;
                // Flush when the queue is momentarily empty, so lines appear promptly.
                if sub.is_empty() {
                    out_buf.flush()?;
                }
            }
            out_buf.flush()
        })
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
