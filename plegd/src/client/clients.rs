//! `plegd status --clients [--json]`: who is connected to a plegd (ListClients): each
//! open Watch stream (its filter, queue depth and capacity, events dropped for it,
//! the revision it reached, when it opened) and each active sync hold (the pod, since
//! when, until when unless renewed, whether plegd knows the pod).

use std::path::Path;

use plegd_api::v1;
use serde::Serialize;

use super::{call_failed, connect, print_line, rfc3339};
use crate::exit::ExitError;

#[derive(Serialize)]
struct JsonClients<'a> {
    watchers: Vec<JsonWatcher<'a>>,
    holds: Vec<JsonHold<'a>>,
}

#[derive(Serialize)]
struct JsonWatcher<'a> {
    filter: &'a str,
    queue_depth: u64,
    queue_capacity: u64,
    dropped: u64,
    revision: u64,
    opened_at: String,
}

#[derive(Serialize)]
struct JsonHold<'a> {
    pod_uid: &'a str,
    held_since: String,
    expires_at: String,
    pod_known: bool,
}

pub async fn run(socket: &Path, json: bool) -> Result<(), ExitError> {
    let mut client = connect(socket).await?;
    let answer = client
        .list_clients(v1::ListClientsRequest {})
        .await
        .map_err(|s| call_failed(socket, &s))?
        .into_inner();
    if json {
        let line = serde_json::to_string(&as_json(&answer))
            .map_err(ExitError::runtime("encoding the clients"))?;
        return print_line(&line);
    }
    for line in text(&answer) {
        print_line(&line)?;
    }
    Ok(())
}

fn as_json(a: &v1::ListClientsResponse) -> JsonClients<'_> {
    JsonClients {
        watchers: a
            .watchers
            .iter()
            .map(|w| JsonWatcher {
                filter: &w.filter,
                queue_depth: w.queue_depth,
                queue_capacity: w.queue_capacity,
                dropped: w.dropped,
                revision: w.revision,
                opened_at: rfc3339(w.opened_at_unix_nano),
            })
            .collect(),
        holds: a
            .holds
            .iter()
            .map(|h| JsonHold {
                pod_uid: &h.pod_uid,
                held_since: rfc3339(h.held_since_unix_nano),
                expires_at: rfc3339(h.expires_at_unix_nano),
                pod_known: h.pod_known,
            })
            .collect(),
    }
}

fn text(a: &v1::ListClientsResponse) -> Vec<String> {
    let mut lines = vec![format!("watchers: {}", a.watchers.len())];
    for w in &a.watchers {
        let filter = if w.filter.is_empty() {
            "(every event)"
        } else {
            &w.filter
        };
        lines.push(format!(
            "  opened {}  revision {}  queue {}/{}  dropped {}  filter {filter}",
            rfc3339(w.opened_at_unix_nano),
            w.revision,
            w.queue_depth,
            w.queue_capacity,
            w.dropped,
        ));
    }
    lines.push(format!("holds: {}", a.holds.len()));
    for h in &a.holds {
        lines.push(format!(
            "  pod {}  held since {}  expires {}{}",
            h.pod_uid,
            rfc3339(h.held_since_unix_nano),
            rfc3339(h.expires_at_unix_nano),
            if h.pod_known {
                ""
            } else {
                "  (pod not known to plegd)"
            },
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchers_and_holds_each_get_a_line() {
        let a = v1::ListClientsResponse {
            watchers: vec![v1::WatcherInfo {
                filter: "namespaces=kube-system".into(),
                queue_depth: 3,
                queue_capacity: 1024,
                dropped: 5,
                revision: 42,
                opened_at_unix_nano: 0,
            }],
            holds: vec![v1::HoldInfo {
                pod_uid: "u1".into(),
                held_since_unix_nano: 0,
                expires_at_unix_nano: 300_000_000_000,
                pod_known: false,
            }],
        };
        let lines = text(&a);
        assert_eq!(lines[0], "watchers: 1");
        assert!(
            lines[1]
                .contains("revision 42  queue 3/1024  dropped 5  filter namespaces=kube-system"),
            "{}",
            lines[1]
        );
        assert_eq!(lines[2], "holds: 1");
        assert!(
            lines[3].contains("pod u1")
                && lines[3].contains("1970-01-01T00:05:00")
                && lines[3].contains("not known"),
            "{}",
            lines[3]
        );
        let json = serde_json::to_value(as_json(&a)).unwrap();
        assert_eq!(json["watchers"][0]["dropped"], 5);
        assert_eq!(json["holds"][0]["pod_known"], false);
    }
}
