//! plegd's domain types ↔ plegd.v1 messages: events, pods and times. Both ways, so
//! the CLI clients print what `plegd run` prints from the same domain event.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use plegd_actors::{
    CachedPod, EventKind, Exit, HintSourceName, LifecycleEvent, Pleg, RelistSource, Runtime,
};
use plegd_protocol::v1;
use plegd_runtime::{ContainerState, ContainerStatus, PodRef, Sandbox};

/// Nanoseconds since the Unix epoch (negative before it; saturating).
pub fn unix_nanos(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_nanos()).map_or(i64::MIN, |n| -n),
    }
}

/// The time `ns` nanoseconds after the Unix epoch.
pub fn from_unix_nanos(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns.unsigned_abs())
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

/// A CRI time (0: not reported).
fn cri_time(ns: i64) -> Option<i64> {
    (ns != 0).then_some(ns)
}

pub fn event_type(kind: EventKind) -> v1::EventType {
    match kind {
        EventKind::ContainerStarted => v1::EventType::ContainerStarted,
        EventKind::ContainerDied => v1::EventType::ContainerDied,
        EventKind::ContainerRemoved => v1::EventType::ContainerRemoved,
        EventKind::PodSync => v1::EventType::PodSync,
        // Never published.
        EventKind::ContainerChanged => v1::EventType::Unspecified,
    }
}

pub fn event_kind(t: v1::EventType) -> Option<EventKind> {
    match t {
        v1::EventType::ContainerStarted => Some(EventKind::ContainerStarted),
        v1::EventType::ContainerDied => Some(EventKind::ContainerDied),
        v1::EventType::ContainerRemoved => Some(EventKind::ContainerRemoved),
        v1::EventType::PodSync => Some(EventKind::PodSync),
        v1::EventType::Unspecified => None,
    }
}

/// Every hint source with its state now, as the `plegd_hint_source_state` gauge
/// has them (source and state label values).
pub fn hint_sources(pleg: &Pleg) -> Vec<v1::HintSource> {
    let metrics = pleg.metrics();
    HintSourceName::ALL
        .iter()
        .map(|&name| {
            let (stops_judged, stops_missed) = pleg.hint_source_stops(name);
            v1::HintSource {
                name: name.to_string(),
                state: metrics.hint_source_state(name).to_string(),
                stops_judged,
                stops_missed,
            }
        })
        .collect()
}

/// plegd's health and whether the runtime answers, now.
pub fn health(pleg: &Pleg) -> v1::Health {
    let health = pleg.health();
    let now = Instant::now();
    let (healthy, reason) = match health.check_at(now) {
        Ok(()) => (true, String::new()),
        Err(reason) => (false, reason),
    };
    let last_global_relist_unix_nano = if health.ready() {
        let ended = SystemTime::now()
            .checked_sub(health.since_last_relist(now))
            .unwrap_or(UNIX_EPOCH);
        unix_nanos(ended)
    } else {
        0
    };
    let (runtime, runtime_error, answering_for) = match health.runtime(now) {
        Runtime::Unknown => (v1::RuntimeAnswer::Unspecified, String::new(), 0),
        Runtime::Answering(d) => (
            v1::RuntimeAnswer::Answering,
            String::new(),
            i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        ),
        Runtime::Failing(e) => (v1::RuntimeAnswer::Failing, e, 0),
    };
    v1::Health {
        healthy,
        reason,
        last_global_relist_unix_nano,
        runtime: runtime as i32,
        runtime_error,
        answering_for_millis: answering_for,
    }
}

pub fn relist_source(s: RelistSource) -> v1::RelistSource {
    match s {
        RelistSource::Global => v1::RelistSource::Global,
        RelistSource::EventedPleg => v1::RelistSource::EventedPleg,
        RelistSource::PostSync => v1::RelistSource::PostSync,
        RelistSource::PostAllocation => v1::RelistSource::PostAllocation,
        RelistSource::Nri => v1::RelistSource::Nri,
        RelistSource::ContainerdEvents => v1::RelistSource::ContainerdEvents,
    }
}

pub fn from_relist_source(s: v1::RelistSource) -> Option<RelistSource> {
    match s {
        v1::RelistSource::Global => Some(RelistSource::Global),
        v1::RelistSource::EventedPleg => Some(RelistSource::EventedPleg),
        v1::RelistSource::PostSync => Some(RelistSource::PostSync),
        v1::RelistSource::PostAllocation => Some(RelistSource::PostAllocation),
        v1::RelistSource::Nri => Some(RelistSource::Nri),
        v1::RelistSource::ContainerdEvents => Some(RelistSource::ContainerdEvents),
        v1::RelistSource::Unspecified => None,
    }
}

/// A published event as sent on a stream (`seq`/`missed` are the stream's).
pub fn event(e: &LifecycleEvent, seq: u64, missed: u64) -> v1::Event {
    let exit = e.exit.as_ref();
    v1::Event {
        revision: e.revision,
        time_unix_nano: unix_nanos(e.time),
        pod_uid: e.pod.uid.clone(),
        pod_name: e.pod.name.clone(),
        pod_namespace: e.pod.namespace.clone(),
        r#type: event_type(e.kind).into(),
        container_id: e.container_id.clone(),
        container_name: e.container_name.clone(),
        sandbox: e.sandbox,
        attempt: e.attempt,
        image: e.image.clone(),
        relist_source: relist_source(e.relist_source).into(),
        seq,
        missed,
        snapshot: false,
        exit_code: exit.map(|x| x.code),
        reason: exit.and_then(|x| x.reason.clone()),
        message: exit.and_then(|x| x.message.clone()),
        started_at_unix_nano: exit.and_then(|x| x.started_at).map(unix_nanos),
        finished_at_unix_nano: exit.and_then(|x| x.finished_at).map(unix_nanos),
    }
}

/// An event received on a stream, back in plegd's terms (what `plegd watch` prints).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    pub event: LifecycleEvent,
    pub seq: u64,
    pub missed: u64,
    /// A synthetic event of the initial state (its `relist_source` means nothing).
    pub snapshot: bool,
}

/// Why a received event cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadEvent {
    #[error("event at revision {0} has no known type")]
    Type(u64),
    #[error("event at revision {0} has no known relist source")]
    RelistSource(u64),
}

pub fn received(e: &v1::Event) -> Result<Received, BadEvent> {
    let kind = v1::EventType::try_from(e.r#type)
        .ok()
        .and_then(event_kind)
        .ok_or(BadEvent::Type(e.revision))?;
    let source = v1::RelistSource::try_from(e.relist_source)
        .ok()
        .and_then(from_relist_source);
    let source = match (source, e.snapshot) {
        (Some(s), _) => s,
        (None, true) => RelistSource::Global,
        (None, false) => return Err(BadEvent::RelistSource(e.revision)),
    };
    let exit = e.exit_code.map(|code| Exit {
        code,
        reason: e.reason.clone(),
        message: e.message.clone(),
        started_at: e.started_at_unix_nano.map(from_unix_nanos),
        finished_at: e.finished_at_unix_nano.map(from_unix_nanos),
    });
    Ok(Received {
        event: LifecycleEvent {
            revision: e.revision,
            time: from_unix_nanos(e.time_unix_nano),
            pod: PodRef {
                uid: e.pod_uid.clone(),
                name: e.pod_name.clone(),
                namespace: e.pod_namespace.clone(),
            },
            kind,
            container_id: e.container_id.clone(),
            relist_source: source,
            container_name: e.container_name.clone(),
            sandbox: e.sandbox,
            attempt: e.attempt,
            image: e.image.clone(),
            exit,
        },
        seq: e.seq,
        missed: e.missed,
        snapshot: e.snapshot,
    })
}

/// The synthetic events of `send_initial_events` for one cached pod: one per
/// sandbox and container, saying what the events up to the snapshot's revision last
/// said of it (`reported`: started or died), each at `revision`, with no relist
/// source; its details (name, attempt, image, how it ended) from the pod's status.
/// Built from `reported` rather than from the states in `status`, which may already
/// be ahead of the events (a read after the list they came from): the snapshot then
/// agrees with the events exactly.
pub fn snapshot_events(pod: &CachedPod, revision: u64) -> Vec<v1::Event> {
    let Some(status) = &pod.status else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (id, kind) in &pod.reported {
        let event_type = match kind {
            EventKind::ContainerStarted | EventKind::ContainerDied => event_type(*kind),
            _ => continue,
        };
        let mut ev = v1::Event {
            revision,
            time_unix_nano: unix_nanos(pod.modified),
            pod_uid: status.pod.uid.clone(),
            pod_name: status.pod.name.clone(),
            pod_namespace: status.pod.namespace.clone(),
            r#type: event_type.into(),
            container_id: id.to_string(),
            snapshot: true,
            ..v1::Event::default()
        };
        if let Some(sb) = status.sandboxes.iter().find(|sb| sb.id == *id) {
            ev.sandbox = true;
            ev.attempt = Some(sb.attempt);
        } else if let Some(c) = status.containers.iter().find(|c| c.id == *id) {
            ev.container_name = c.name.clone();
            ev.attempt = Some(c.attempt);
            ev.image = non_empty(&c.image);
            // How it ended, when the status read saw it ended (as a live event's
            // details come from the read of the relist that found the death).
            if *kind == EventKind::ContainerDied && c.state == ContainerState::Exited {
                ev.exit_code = Some(c.exit_code);
                ev.reason = non_empty(&c.reason);
                ev.message = non_empty(&c.message);
                ev.started_at_unix_nano = cri_time(c.started_at);
                ev.finished_at_unix_nano = cri_time(c.finished_at);
            }
        }
        out.push(ev);
    }
    out
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

/// The pod's labels: those of its newest sandbox.
pub fn pod_labels(pod: &CachedPod) -> std::collections::BTreeMap<String, String> {
    pod.status
        .as_ref()
        .and_then(|s| s.sandboxes.iter().max_by_key(|sb| sb.created_at))
        .map(|sb| sb.labels.clone())
        .unwrap_or_default()
}

/// A cached pod as ListPods and GetPodStatus send it (None: never read successfully),
/// each sandbox and container as the events up to the cache's revision left it
/// ([`container_as_of`]): the status in the cache may be ahead of them (read after
/// the list the events came from), and a client that lists, then watches from the
/// list's revision, must see each transition once.
pub fn pod(uid: &str, cached: &CachedPod) -> v1::Pod {
    let (pod_ref, sandboxes, containers) = match &cached.status {
        Some(s) => {
            let sandboxes = s
                .sandboxes
                .iter()
                .map(|sb| sandbox(sb, cached.reported.get(&sb.id).copied()))
                .collect();
            let mut containers: Vec<v1::Container> = s
                .containers
                .iter()
                .map(|c| container(c, cached.reported.get(&c.id).copied()))
                .collect();
            // Reported by the events but not found by the read that followed their
            // list (removed in between): the events' state, and the ID.
            for (id, kind) in &cached.reported {
                let read = s.sandboxes.iter().any(|sb| sb.id == *id)
                    || s.containers.iter().any(|c| c.id == *id);
                if let (false, Some(state)) = (read, reported_state(*kind)) {
                    containers.push(v1::Container {
                        container_id: id.to_string(),
                        state: state.into(),
                        ..v1::Container::default()
                    });
                }
            }
            (s.pod.clone(), sandboxes, containers)
        }
        None => (
            PodRef {
                uid: uid.to_string(),
                name: String::new(),
                namespace: String::new(),
            },
            Vec::new(),
            Vec::new(),
        ),
    };
    v1::Pod {
        pod_uid: pod_ref.uid,
        pod_name: pod_ref.name,
        pod_namespace: pod_ref.namespace,
        labels: pod_labels(cached).into_iter().collect(),
        read_at_unix_nano: unix_nanos(cached.modified),
        error: cached.error.clone(),
        sandboxes,
        containers,
    }
}

/// The state the last Started or Died event of a container says.
fn reported_state(kind: EventKind) -> Option<v1::ContainerState> {
    match kind {
        EventKind::ContainerStarted => Some(v1::ContainerState::ContainerRunning),
        EventKind::ContainerDied => Some(v1::ContainerState::ContainerExited),
        _ => None,
    }
}

/// What of a container's read a list at the cache's revision shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AsOf {
    pub state: v1::ContainerState,
    /// The read's `started_at` may be shown (the state shown is past the start).
    pub started: bool,
    /// The read's exit (`finished_at`, exit code, reason, message) may be shown.
    pub exit: bool,
}

/// A container's state at the cache's revision, from the state its last read found
/// and what the events up to that revision last said of it (`reported`):
/// - `ContainerStarted`: RUNNING, without an exit the read saw (its `ContainerDied`
///   has a later revision); UNKNOWN when the read found it created or unknown
///   (an unknown state is never published: a later start is).
/// - `ContainerDied`: EXITED, with the exit when the read saw it exited.
/// - nothing (the relist's lists saw it created or unknown, which no event tells):
///   the read's CREATED or UNKNOWN; CREATED when the read already saw it running or
///   exited (the events telling it come at a later revision).
pub fn container_as_of(read: ContainerState, reported: Option<EventKind>) -> AsOf {
    use v1::ContainerState as S;
    let read_state = container_state(read);
    let (state, started, exit) = match reported.and_then(reported_state) {
        Some(S::ContainerRunning) => match read {
            ContainerState::Running | ContainerState::Exited => (S::ContainerRunning, true, false),
            ContainerState::Created | ContainerState::Unknown => (read_state, true, false),
        },
        Some(_) => (S::ContainerExited, true, read == ContainerState::Exited),
        None => match read {
            ContainerState::Created | ContainerState::Unknown => (read_state, true, true),
            ContainerState::Running | ContainerState::Exited => (S::ContainerCreated, false, false),
        },
    };
    AsOf {
        state,
        started,
        exit,
    }
}

/// A sandbox's state at the cache's revision: READY after its `ContainerStarted`,
/// NOT_READY after its `ContainerDied`, else UNKNOWN (its list said unknown, which no
/// event tells; a read that saw more is ahead of the events).
fn sandbox_state_as_of(reported: Option<EventKind>) -> v1::SandboxState {
    match reported {
        Some(EventKind::ContainerStarted) => v1::SandboxState::SandboxReady,
        Some(EventKind::ContainerDied) => v1::SandboxState::SandboxNotReady,
        _ => v1::SandboxState::SandboxUnknown,
    }
}

fn sandbox(sb: &Sandbox, reported: Option<EventKind>) -> v1::Sandbox {
    v1::Sandbox {
        sandbox_id: sb.id.clone(),
        attempt: sb.attempt,
        state: sandbox_state_as_of(reported).into(),
        created_at_unix_nano: sb.created_at,
    }
}

fn container(c: &ContainerStatus, reported: Option<EventKind>) -> v1::Container {
    let as_of = container_as_of(c.state, reported);
    let exited = as_of.state == v1::ContainerState::ContainerExited && as_of.exit;
    let exit_detail = |s: &str| if as_of.exit { non_empty(s) } else { None };
    v1::Container {
        container_id: c.id.clone(),
        sandbox_id: c.sandbox_id.clone(),
        container_name: c.name.clone(),
        attempt: c.attempt,
        state: as_of.state.into(),
        image: non_empty(&c.image),
        created_at_unix_nano: cri_time(c.created_at),
        started_at_unix_nano: cri_time(c.started_at).filter(|_| as_of.started),
        finished_at_unix_nano: cri_time(c.finished_at).filter(|_| as_of.exit),
        exit_code: exited.then_some(c.exit_code),
        reason: exit_detail(&c.reason),
        message: exit_detail(&c.message),
    }
}

fn container_state(s: ContainerState) -> v1::ContainerState {
    match s {
        ContainerState::Created => v1::ContainerState::ContainerCreated,
        ContainerState::Running => v1::ContainerState::ContainerRunning,
        ContainerState::Exited => v1::ContainerState::ContainerExited,
        ContainerState::Unknown => v1::ContainerState::ContainerUnknown,
    }
}

/// A container state as the CLI prints it (`running`, `exited`...).
pub fn container_state_name(state: i32) -> &'static str {
    match v1::ContainerState::try_from(state) {
        Ok(v1::ContainerState::ContainerCreated) => "created",
        Ok(v1::ContainerState::ContainerRunning) => "running",
        Ok(v1::ContainerState::ContainerExited) => "exited",
        Ok(v1::ContainerState::ContainerUnknown) => "unknown",
        Ok(v1::ContainerState::Unspecified) | Err(_) => "unspecified",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip_at_nanosecond_precision() {
        for ns in [0, 1, 1_700_000_000_123_456_789, -5] {
            assert_eq!(unix_nanos(from_unix_nanos(ns)), ns);
        }
    }

    #[test]
    fn an_event_round_trips_through_the_wire_form() {
        let e = LifecycleEvent {
            revision: 9,
            time: from_unix_nanos(1_700_000_000_000_000_001),
            pod: PodRef {
                uid: "u".into(),
                name: "n".into(),
                namespace: "ns".into(),
            },
            kind: EventKind::ContainerDied,
            container_id: "c".into(),
            relist_source: RelistSource::EventedPleg,
            container_name: "app".into(),
            sandbox: false,
            attempt: Some(3),
            image: None,
            exit: Some(Exit {
                code: 137,
                reason: Some("OOMKilled".into()),
                message: None,
                started_at: None,
                finished_at: Some(from_unix_nanos(5)),
            }),
        };
        let back = received(&event(&e, 4, 2)).unwrap();
        assert_eq!(back.event, e);
        assert_eq!((back.seq, back.missed, back.snapshot), (4, 2, false));
        let mut bad = event(&e, 1, 0);
        bad.r#type = 99;
        assert_eq!(received(&bad), Err(BadEvent::Type(9)));
    }

    #[test]
    fn a_container_shows_the_state_the_events_up_to_the_revision_say() {
        use v1::ContainerState as S;
        use ContainerState::*;
        use EventKind::{ContainerDied as Died, ContainerStarted as Started};
        let cases = [
            // (read, reported) → (state, started_at shown, exit shown)
            ((Running, Some(Started)), (S::ContainerRunning, true, false)),
            // The read saw the exit; its ContainerDied comes at a later revision.
            ((Exited, Some(Started)), (S::ContainerRunning, true, false)),
            ((Unknown, Some(Started)), (S::ContainerUnknown, true, false)),
            ((Exited, Some(Died)), (S::ContainerExited, true, true)),
            // A read behind the events: no exit to show.
            ((Running, Some(Died)), (S::ContainerExited, true, false)),
            ((Created, None), (S::ContainerCreated, true, true)),
            ((Unknown, None), (S::ContainerUnknown, true, true)),
            // Listed created, read running or exited: the start is not told yet.
            ((Running, None), (S::ContainerCreated, false, false)),
            ((Exited, None), (S::ContainerCreated, false, false)),
        ];
        for ((read, reported), (state, started, exit)) in cases {
            assert_eq!(
                container_as_of(read, reported),
                AsOf {
                    state,
                    started,
                    exit
                },
                "{read:?} reported {reported:?}"
            );
        }
    }

    #[test]
    fn a_listed_pod_hides_what_its_read_saw_beyond_the_events() {
        use plegd_actors::{IdMap, PodStatus};
        use plegd_runtime::SandboxState;
        let pod_ref = PodRef {
            uid: "u".into(),
            name: "n".into(),
            namespace: "ns".into(),
        };
        let c = |id: &str, state, exit_code| ContainerStatus {
            id: id.into(),
            sandbox_id: "s".into(),
            name: format!("name-{id}"),
            attempt: 0,
            state,
            created_at: 1,
            started_at: 2,
            finished_at: if state == ContainerState::Exited {
                3
            } else {
                0
            },
            exit_code,
            reason: if state == ContainerState::Exited {
                "Error".into()
            } else {
                String::new()
            },
            message: String::new(),
            image: "img".into(),
        };
        let cached = CachedPod {
            status: Some(PodStatus {
                pod: pod_ref.clone(),
                sandboxes: vec![Sandbox {
                    id: "s".into(),
                    pod: pod_ref,
                    attempt: 0,
                    state: SandboxState::Ready,
                    created_at: 1,
                    labels: Default::default(),
                }],
                containers: vec![
                    c("c1", ContainerState::Exited, 3),
                    c("c2", ContainerState::Running, 0),
                    c("c4", ContainerState::Exited, 4),
                ],
            }),
            error: None,
            modified: from_unix_nanos(10),
            read_by: RelistSource::Global,
            reported: IdMap::from([
                ("c1".to_string(), EventKind::ContainerStarted),
                ("c3".to_string(), EventKind::ContainerDied),
                ("c4".to_string(), EventKind::ContainerDied),
                ("s".to_string(), EventKind::ContainerStarted),
            ]),
        };
        let p = pod("u", &cached);
        assert_eq!(p.sandboxes[0].state, v1::SandboxState::SandboxReady as i32);
        let by_id = |id: &str| {
            p.containers
                .iter()
                .find(|c| c.container_id == id)
                .cloned()
                .unwrap_or_else(|| panic!("{id} listed"))
        };
        let shown = |id: &str| {
            let c = by_id(id);
            (
                v1::ContainerState::try_from(c.state).unwrap(),
                c.started_at_unix_nano,
                c.finished_at_unix_nano,
                c.exit_code,
                c.reason,
            )
        };
        use v1::ContainerState as S;
        assert_eq!(
            shown("c1"),
            (S::ContainerRunning, Some(2), None, None, None)
        );
        assert_eq!(shown("c2"), (S::ContainerCreated, None, None, None, None));
        assert_eq!(
            shown("c4"),
            (
                S::ContainerExited,
                Some(2),
                Some(3),
                Some(4),
                Some("Error".into())
            )
        );
        // Reported, not found by the read: the events' state and the ID.
        assert_eq!(shown("c3"), (S::ContainerExited, None, None, None, None));
        assert_eq!(p.containers.len(), 4);
    }
}
