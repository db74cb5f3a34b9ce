//! `plegd watch`: a running plegd's lifecycle events, one line each. With `--json`,
//! each event has exactly the fields of `plegd run`'s output (the same serialisation,
//! `output.rs`); the first line is the Hello (`{"type":"Hello","instance_id":..,
//! "node_name":..,"latest_revision":N,"hint_sources":[..]}`, what `--since` and
//! `--instance-id` take) and the initial-events bookmark is
//! `{"type":"Bookmark","revision":N,"initial_events_end":true}`. A `missed` count is shown on the next event and
//! watching goes on. SIGINT/SIGTERM end it with exit 0.

use std::sync::Arc;

use clap::{Args, ValueEnum};
use plegd_actors::Delivery;
use plegd_api::v1;
use serde::Serialize;
use tokio::signal::unix::{signal, SignalKind};

use super::{call_failed, connect, print_line, within, SocketArg};
use crate::exit::ExitError;
use crate::output::{format_event, Format};

#[derive(Args, Debug)]
pub struct WatchArgs {
    /// Only this pod (by UID); repeat for more.
    #[arg(long = "pod", value_name = "UID")]
    pub pods: Vec<String>,
    /// Only pods in this namespace; repeat for more.
    #[arg(long = "namespace", value_name = "NS")]
    pub namespaces: Vec<String>,
    /// Only this event type; repeat for more.
    #[arg(long = "type", value_name = "TYPE", value_enum, ignore_case = true)]
    pub types: Vec<EventTypeArg>,
    /// Only pods whose labels match, e.g. app=web,tier!=db.
    #[arg(long, value_name = "SELECTOR")]
    pub selector: Option<String>,
    /// First the current state: one event per running or exited container and sandbox
    /// (marked snapshot), then a bookmark, then live events.
    #[arg(long, conflicts_with = "since")]
    pub initial_events: bool,
    /// Replay every event after this revision first (plegd refuses one older than its
    /// history, or one it never issued: exit 1).
    #[arg(long, value_name = "REVISION")]
    pub since: Option<u64>,
    /// The plegd instance --since comes from (the instance_id of the Hello: the
    /// first line of `plegd watch --json`, or the id `plegd watch` logs on stderr at
    /// start without --json): plegd refuses a revision of another instance instead of
    /// misreading it.
    #[arg(long, value_name = "ID", requires = "since")]
    pub instance_id: Option<String>,
    /// One JSON object per line: first the Hello ({"type":"Hello","instance_id",
    /// "node_name","latest_revision","hint_sources"}), then each event with the
    /// fields of `plegd run`'s output.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub socket: SocketArg,
}

/// The event types, as `plegd run` prints them.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum EventTypeArg {
    #[value(name = "ContainerStarted")]
    ContainerStarted,
    #[value(name = "ContainerDied")]
    ContainerDied,
    #[value(name = "ContainerRemoved")]
    ContainerRemoved,
    #[value(name = "PodSync")]
    PodSync,
}

impl From<EventTypeArg> for v1::EventType {
    fn from(t: EventTypeArg) -> Self {
        match t {
            EventTypeArg::ContainerStarted => v1::EventType::ContainerStarted,
            EventTypeArg::ContainerDied => v1::EventType::ContainerDied,
            EventTypeArg::ContainerRemoved => v1::EventType::ContainerRemoved,
            EventTypeArg::PodSync => v1::EventType::PodSync,
        }
    }
}

/// The Hello, `--json`'s first line: who answers, and from which revision.
#[derive(Serialize)]
struct JsonHello<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    instance_id: &'a str,
    node_name: &'a str,
    latest_revision: u64,
    hint_sources: Vec<JsonHintSource<'a>>,
}

#[derive(Serialize)]
struct JsonHintSource<'a> {
    name: &'a str,
    state: &'a str,
}

#[derive(Serialize)]
struct JsonBookmark {
    #[serde(rename = "type")]
    kind: &'static str,
    revision: u64,
    initial_events_end: bool,
}

#[derive(Serialize)]
struct JsonGap {
    #[serde(rename = "type")]
    kind: &'static str,
    after_revision: u64,
    through_revision: u64,
    dropped: u64,
}

pub async fn run(args: WatchArgs) -> Result<(), ExitError> {
    let socket = args.socket.api_socket.clone();
    let handlers = signal(SignalKind::terminate())
        .map_err(ExitError::runtime("installing SIGTERM"))
        .and_then(|term| {
            let int =
                signal(SignalKind::interrupt()).map_err(ExitError::runtime("installing SIGINT"))?;
            Ok((term, int))
        });
    // Held since `main`'s first line: one sent meanwhile is taken by the handlers now.
    crate::signals::release();
    let (mut term, mut int) = handlers?;
    let format = if args.json {
        Format::Json
    } else {
        Format::Text
    };
    let request = v1::WatchRequest {
        pod_uids: args.pods,
        namespaces: args.namespaces,
        types: args
            .types
            .into_iter()
            .map(|t| v1::EventType::from(t).into())
            .collect(),
        label_selector: args.selector.unwrap_or_default(),
        send_initial_events: args.initial_events,
        since_revision: args.since,
        instance_id: args.instance_id.unwrap_or_default(),
        ..v1::WatchRequest::default()
    };
    let watching = async {
        // The start (connect, the call, the Hello) within the deadline; then events
        // for as long as they come.
        let stream = within(&socket, args.socket.timeout, async {
            let mut client = connect(&socket).await?;
            let mut stream = client
                .watch(request)
                .await
                .map_err(|s| call_failed(&socket, &s))?
                .into_inner();
            let first = stream
                .message()
                .await
                .map_err(|s| call_failed(&socket, &s))?;
            Ok((stream, first))
        })
        .await
        .and_then(|(stream, first)| {
            let mut instance = String::new();
            if let Some(hello) = first {
                if let Some(v1::watch_response::Kind::Hello(h)) = &hello.kind {
                    instance = h.instance_id.clone();
                }
                show(hello, format, &instance)?;
            }
            Ok((stream, instance))
        })?;
        let (mut stream, instance) = stream;
        loop {
            let msg = match stream.message().await {
                Ok(Some(m)) => m,
                Ok(None) => {
                    return Err(ExitError::Runtime(anyhow::anyhow!(
                        "plegd at {} ended the stream",
                        socket.display()
                    )))
                }
                Err(s) => return Err(call_failed(&socket, &s)),
            };
            show(msg, format, &instance)?;
        }
    };
    tokio::select! {
        r = watching => r,
        _ = term.recv() => Ok(()),
        _ = int.recv() => Ok(()),
    }
}

/// One message as a line; `instance` (the Hello's) goes on each event's JSON, as on
/// `plegd run`'s.
fn show(msg: v1::WatchResponse, format: Format, instance: &str) -> Result<(), ExitError> {
    use v1::watch_response::Kind;
    match msg.kind {
        Some(Kind::Hello(h)) => match format {
            Format::Json => {
                let line = serde_json::to_string(&JsonHello {
                    kind: "Hello",
                    instance_id: &h.instance_id,
                    node_name: &h.node_name,
                    latest_revision: h.latest_revision,
                    hint_sources: h
                        .hint_sources
                        .iter()
                        .map(|s| JsonHintSource {
                            name: &s.name,
                            state: &s.state,
                        })
                        .collect(),
                })
                .map_err(ExitError::runtime("encoding the hello"))?;
                print_line(&line)
            }
            Format::Text => {
                eprintln!(
                    "plegd: watching node {} (plegd instance {}, revision {})",
                    h.node_name, h.instance_id, h.latest_revision
                );
                Ok(())
            }
        },
        Some(Kind::Event(e)) => {
            let r = plegd_api::convert::received(&e)
                .map_err(|e| ExitError::Runtime(anyhow::Error::new(e)))?;
            let d = Delivery {
                seq: r.seq,
                missed: r.missed,
                event: Arc::new(r.event),
            };
            print_line(&format_event(&d, format, r.snapshot, Some(instance)))
        }
        // Only the initial-events one is asked for; others would be resume points.
        Some(Kind::Bookmark(b)) => match format {
            Format::Json => {
                let line = serde_json::to_string(&JsonBookmark {
                    kind: "Bookmark",
                    revision: b.revision,
                    initial_events_end: b.initial_events_end,
                })
                .map_err(ExitError::runtime("encoding a bookmark"))?;
                print_line(&line)
            }
            Format::Text if b.initial_events_end => print_line(&format!(
                "--- initial events end at revision {} ---",
                b.revision
            )),
            Format::Text => Ok(()),
        },
        Some(Kind::Gap(g)) => match format {
            Format::Json => {
                let line = serde_json::to_string(&JsonGap {
                    kind: "Gap",
                    after_revision: g.after_revision,
                    through_revision: g.through_revision,
                    dropped: g.dropped,
                })
                .map_err(ExitError::runtime("encoding a gap"))?;
                print_line(&line)
            }
            Format::Text => print_line(&format!(
                "--- events lost after revision {} through {} ({} dropped); watch again with --since {} ---",
                g.after_revision, g.through_revision, g.dropped, g.after_revision
            )),
        },
        None => Ok(()),
    }
}
