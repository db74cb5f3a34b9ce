//! `plegd status [UID [--newer-than RFC3339]] [--json]`: without a UID, plegd itself
//! (node, instance, latest revision, health, whether the runtime answers and the hint
//! sources, from a Watch's `Hello`);
//! with one, one pod, as the cache holds it
//! (with `--newer-than`: once the cache read it after that time), the node it is on,
//! and when it went away if it did; and plegd's relist hint sources with their states
//! (as the `plegd_hint_source_state` gauge has them). `--clients`: the connected
//! watchers and active holds instead (`clients.rs`).

use std::time::{Duration, SystemTime};

use clap::Args;
use plegd_api::convert::{container_state_name, unix_nanos};
use plegd_api::v1;
use serde::Serialize;

use super::pods::{container_summary, json_containers, JsonContainer};
use super::{call_failed, connect, print_line, rfc3339, within, SocketArg};
use crate::exit::ExitError;

/// How long `--newer-than` waits for a fresh read.
const NEWER_THAN_WAIT: Duration = Duration::from_secs(30);

#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The pod's UID; without it, plegd's own status (node, instance, latest
    /// revision, health with the age of the last global relist, whether the runtime
    /// answers, hint sources with their states and the stops they missed).
    pub uid: Option<String>,
    /// Answer only once plegd has read the pod after this time (RFC 3339, e.g.
    /// 2026-11-30T05:21:00Z); waits up to 30s. Needs a UID.
    #[arg(long, value_name = "RFC3339", value_parser = parse_time, requires = "uid")]
    pub newer_than: Option<SystemTime>,
    /// One JSON object (node_name, pod_uid, pod_name, pod_namespace, containers,
    /// read_at, removed_at when the pod went away, hint_sources: [{name, state,
    /// stops_judged, stops_missed}]; without a UID: node_name, instance_id,
    /// latest_revision, health {healthy, reason, last_global_relist, runtime,
    /// runtime_error, answering_for_s}, hint_sources).
    #[arg(long)]
    pub json: bool,
    /// The connected watchers (filter, queue depth/capacity, dropped, revision
    /// reached, opened at) and active sync holds (pod, held since, expires at, pod
    /// known) instead; --json: {watchers: [...], holds: [...]}.
    #[arg(long, conflicts_with = "uid")]
    pub clients: bool,
    #[command(flatten)]
    pub socket: SocketArg,
}

fn parse_time(s: &str) -> Result<SystemTime, String> {
    humantime::parse_rfc3339_weak(s)
        .map_err(|e| format!("{e} (expected RFC 3339, e.g. 2026-11-30T05:21:00Z)"))
}

#[derive(Serialize)]
struct JsonStatus<'a> {
    node_name: &'a str,
    pod_uid: &'a str,
    pod_name: &'a str,
    pod_namespace: &'a str,
    containers: Vec<JsonContainer<'a>>,
    read_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    removed_at: Option<String>,
    hint_sources: Vec<JsonHintSource<'a>>,
}

#[derive(Serialize)]
struct JsonHintSource<'a> {
    name: &'a str,
    state: &'a str,
    stops_judged: u64,
    stops_missed: u64,
}

#[derive(Serialize)]
struct JsonHealth<'a> {
    healthy: bool,
    #[serde(skip_serializing_if = "str::is_empty")]
    reason: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_global_relist: Option<String>,
    /// `answering`, `failing` or `unknown` (no global relist ended yet).
    runtime: &'static str,
    #[serde(skip_serializing_if = "str::is_empty")]
    runtime_error: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    answering_for_s: Option<f64>,
}

fn runtime_answer(h: &v1::Health) -> &'static str {
    match v1::RuntimeAnswer::try_from(h.runtime) {
        Ok(v1::RuntimeAnswer::Answering) => "answering",
        Ok(v1::RuntimeAnswer::Failing) => "failing",
        _ => "unknown",
    }
}

fn json_health(h: &v1::Health) -> JsonHealth<'_> {
    let answering = runtime_answer(h) == "answering";
    JsonHealth {
        healthy: h.healthy,
        reason: &h.reason,
        last_global_relist: (h.last_global_relist_unix_nano > 0)
            .then(|| rfc3339(h.last_global_relist_unix_nano)),
        runtime: runtime_answer(h),
        runtime_error: &h.runtime_error,
        answering_for_s: answering.then(|| h.answering_for_millis as f64 / 1e3),
    }
}

/// `healthy (last global relist 0.4 s ago)` or `UNHEALTHY: <reason>`, and
/// `answering for 3m 12s`, `failing: <error>` or `unknown (no global relist ended yet)`.
fn health_lines(h: &v1::Health, now: SystemTime) -> (String, String) {
    let age = (h.last_global_relist_unix_nano > 0).then(|| {
        now.duration_since(plegd_api::convert::from_unix_nanos(
            h.last_global_relist_unix_nano,
        ))
        .unwrap_or_default()
    });
    let last = match age {
        Some(age) => format!("last global relist {:.1} s ago", age.as_secs_f64()),
        None => "no global relist yet".to_string(),
    };
    let health = if h.healthy {
        format!("healthy ({last})")
    } else {
        format!("UNHEALTHY: {} ({last})", h.reason)
    };
    let runtime = match runtime_answer(h) {
        "answering" => format!(
            "answering (for {})",
            humantime::format_duration(Duration::from_secs(
                u64::try_from(h.answering_for_millis / 1000).unwrap_or(0)
            ))
        ),
        "failing" => format!("FAILING: {}", h.runtime_error),
        _ => "unknown (no global relist ended yet)".to_string(),
    };
    (health, runtime)
}

/// `cri-events=streaming nri=off containerd-events=streaming` (as on /readyz).
fn hint_source_summary(sources: &[v1::HintSource]) -> String {
    if sources.is_empty() {
        return "(not reported by this plegd)".to_string();
    }
    sources
        .iter()
        .map(|s| {
            if s.stops_missed > 0 {
                format!(
                    "{}={} (missed {} of {} stops)",
                    s.name, s.state, s.stops_missed, s.stops_judged
                )
            } else {
                format!("{}={}", s.name, s.state)
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[derive(Serialize)]
struct JsonPlegd<'a> {
    node_name: &'a str,
    instance_id: &'a str,
    latest_revision: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    health: Option<JsonHealth<'a>>,
    hint_sources: Vec<JsonHintSource<'a>>,
}

fn json_hint_sources(sources: &[v1::HintSource]) -> Vec<JsonHintSource<'_>> {
    sources
        .iter()
        .map(|s| JsonHintSource {
            name: &s.name,
            state: &s.state,
            stops_judged: s.stops_judged,
            stops_missed: s.stops_missed,
        })
        .collect()
}

/// The `Hello` that starts a Watch (the Watch is then closed).
async fn hello(socket: &std::path::Path) -> Result<v1::Hello, ExitError> {
    let mut client = connect(socket).await?;
    let mut stream = client
        .watch(v1::WatchRequest::default())
        .await
        .map_err(|s| call_failed(socket, &s))?
        .into_inner();
    match stream.message().await {
        Ok(Some(v1::WatchResponse {
            kind: Some(v1::watch_response::Kind::Hello(h)),
        })) => Ok(h),
        Ok(_) => Err(ExitError::Runtime(anyhow::anyhow!(
            "plegd at {} did not start its answer with a Hello",
            socket.display()
        ))),
        Err(s) => Err(call_failed(socket, &s)),
    }
}

/// plegd itself: the `Hello` of a Watch, which is then closed.
async fn run_plegd(args: &StatusArgs) -> Result<(), ExitError> {
    let socket = &args.socket.api_socket;
    let hello = within(socket, args.socket.timeout, hello(socket)).await?;
    if args.json {
        let line = serde_json::to_string(&JsonPlegd {
            node_name: &hello.node_name,
            instance_id: &hello.instance_id,
            latest_revision: hello.latest_revision,
            health: hello.health.as_ref().map(json_health),
            hint_sources: json_hint_sources(&hello.hint_sources),
        })
        .map_err(ExitError::runtime("encoding plegd's status"))?;
        return print_line(&line);
    }
    print_line(&format!("node:         {}", hello.node_name))?;
    print_line(&format!("instance:     {}", hello.instance_id))?;
    print_line(&format!("revision:     {}", hello.latest_revision))?;
    if let Some(h) = &hello.health {
        let (health, runtime) = health_lines(h, SystemTime::now());
        print_line(&format!("health:       {health}"))?;
        print_line(&format!("runtime:      {runtime}"))?;
    }
    print_line(&format!(
        "hint sources: {}",
        hint_source_summary(&hello.hint_sources)
    ))
}

pub async fn run(args: StatusArgs) -> Result<(), ExitError> {
    if args.clients {
        return super::clients::run(&args.socket.api_socket, args.json).await;
    }
    let Some(uid) = &args.uid else {
        return run_plegd(&args).await;
    };
    let socket = &args.socket.api_socket;
    let mut deadline = args.socket.timeout;
    if args.newer_than.is_some() {
        deadline += NEWER_THAN_WAIT;
    }
    let answer = within(socket, deadline, async {
        let mut client = connect(socket).await?;
        let mut request = tonic::Request::new(v1::GetPodStatusRequest {
            pod_uid: uid.clone(),
            newer_than_unix_nano: args.newer_than.map(unix_nanos),
        });
        request.set_timeout(NEWER_THAN_WAIT);
        client
            .get_pod_status(request)
            .await
            .map_err(|s| call_failed(socket, &s))
    })
    .await?
    .into_inner();
    let Some(pod) = &answer.pod else {
        return Err(ExitError::Runtime(anyhow::anyhow!(
            "plegd at {} answered without the pod",
            socket.display()
        )));
    };
    if args.json {
        let line = serde_json::to_string(&JsonStatus {
            node_name: &answer.node_name,
            pod_uid: &pod.pod_uid,
            pod_name: &pod.pod_name,
            pod_namespace: &pod.pod_namespace,
            containers: json_containers(pod),
            read_at: rfc3339(pod.read_at_unix_nano),
            error: pod.error.as_deref(),
            removed_at: answer.removed_at_unix_nano.map(rfc3339),
            hint_sources: json_hint_sources(&answer.hint_sources),
        })
        .map_err(ExitError::runtime("encoding the pod"))?;
        return print_line(&line);
    }
    print_line(&format!("node:       {}", answer.node_name))?;
    print_line(&format!(
        "pod:        {}/{} ({})",
        pod.pod_namespace, pod.pod_name, pod.pod_uid
    ))?;
    print_line(&format!("read at:    {}", rfc3339(pod.read_at_unix_nano)))?;
    if let Some(e) = &pod.error {
        print_line(&format!("last read failed: {e}"))?;
    }
    if let Some(at) = answer.removed_at_unix_nano {
        print_line(&format!("removed at: {} (last status below)", rfc3339(at)))?;
    }
    for c in &pod.containers {
        let exit = match (c.exit_code, &c.reason) {
            (Some(code), Some(r)) => format!("  exit {code} ({r})"),
            (Some(code), None) => format!("  exit {code}"),
            _ => String::new(),
        };
        print_line(&format!(
            "container:  {} {} {}{exit}",
            c.container_name,
            c.container_id,
            container_state_name(c.state)
        ))?;
    }
    if pod.containers.is_empty() {
        print_line(&format!("containers: {}", container_summary(pod)))?;
    }
    print_line(&format!(
        "hint sources: {}",
        hint_source_summary(&answer.hint_sources)
    ))?;
    Ok(())
}
