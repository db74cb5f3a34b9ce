//! What one CRI container event is worth to plegd (KEP-3386: the event stream is a
//! latency hint that may only ask for a fresh read of one pod): which pod, whether to
//! relist it, and the event's latency. Pure; the watcher counts, logs and requests.
//!
//! - An event needs pod_sandbox_status, its metadata and a non-empty UID; anything
//!   else is invalid (containerd sends every sandbox DELETED event without a status).
//! - Only CONTAINER_STOPPED_EVENT asks for a relist, with any exit code and with or
//!   without container statuses; the payload is never stored.
//! - Latency counts only events created after the current attempt began: older ones
//!   were buffered by the runtime and would skew the histogram.

use std::time::Duration;

use plegd_runtime::cri::{ContainerEventResponse, ContainerEventType};
use plegd_telemetry::StreamEventType;

/// One event, read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CriEvent<'a> {
    /// No pod sandbox status, metadata or UID: ignored, counted invalid.
    Invalid {
        /// A DELETED event: expected without a status (containerd), so not worth a log line.
        deleted: bool,
    },
    Valid {
        uid: &'a str,
        kind: StreamEventType,
        /// A CONTAINER_STOPPED_EVENT: ask for a relist of the pod.
        relist: bool,
    },
}

pub(crate) fn read(ev: &ContainerEventResponse) -> CriEvent<'_> {
    let uid = ev
        .pod_sandbox_status
        .as_ref()
        .and_then(|s| s.metadata.as_ref())
        .map(|m| m.uid.as_str())
        .filter(|uid| !uid.is_empty());
    let kind = ContainerEventType::try_from(ev.container_event_type);
    let Some(uid) = uid else {
        return CriEvent::Invalid {
            deleted: kind == Ok(ContainerEventType::ContainerDeletedEvent),
        };
    };
    let label = match kind {
        Ok(ContainerEventType::ContainerCreatedEvent) => StreamEventType::Created,
        Ok(ContainerEventType::ContainerStartedEvent) => StreamEventType::Started,
        Ok(ContainerEventType::ContainerStoppedEvent) => StreamEventType::Stopped,
        Ok(ContainerEventType::ContainerDeletedEvent) => StreamEventType::Deleted,
        Err(_) => StreamEventType::Unknown,
    };
    CriEvent::Valid {
        uid,
        kind: label,
        relist: kind == Ok(ContainerEventType::ContainerStoppedEvent),
    }
}

/// The created_at-to-receipt latency of an event received at `received_ns` (wall clock,
/// like created_at), the current attempt having begun `attempt_age` ago; None for an
/// event without a timestamp or created before the attempt.
pub(crate) fn latency(
    created_at: i64,
    received_ns: i64,
    attempt_age: Duration,
) -> Option<Duration> {
    let age_ns = i64::try_from(attempt_age.as_nanos()).unwrap_or(i64::MAX);
    let attempt_started_ns = received_ns.saturating_sub(age_ns);
    if created_at <= 0 || created_at < attempt_started_ns {
        return None;
    }
    let ns = received_ns.saturating_sub(created_at).max(0);
    Some(Duration::from_nanos(ns.unsigned_abs()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use plegd_runtime::cri::{PodSandboxMetadata, PodSandboxStatus};

    fn event(kind: ContainerEventType, uid: Option<&str>) -> ContainerEventResponse {
        ContainerEventResponse {
            container_id: "c1".into(),
            container_event_type: kind as i32,
            created_at: 1,
            pod_sandbox_status: uid.map(|uid| PodSandboxStatus {
                metadata: Some(PodSandboxMetadata {
                    uid: uid.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            containers_statuses: vec![],
        }
    }

    #[test]
    fn only_a_stop_with_a_uid_asks_for_a_relist() {
        use ContainerEventType::*;
        let cases = [
            (ContainerCreatedEvent, StreamEventType::Created, false),
            (ContainerStartedEvent, StreamEventType::Started, false),
            (ContainerStoppedEvent, StreamEventType::Stopped, true),
            (ContainerDeletedEvent, StreamEventType::Deleted, false),
        ];
        for (kind, label, relist) in cases {
            let ev = event(kind, Some("u1"));
            assert_eq!(
                read(&ev),
                CriEvent::Valid {
                    uid: "u1",
                    kind: label,
                    relist
                }
            );
        }
        let mut unknown = event(ContainerStoppedEvent, Some("u1"));
        unknown.container_event_type = 42;
        assert!(matches!(
            read(&unknown),
            CriEvent::Valid {
                kind: StreamEventType::Unknown,
                relist: false,
                ..
            }
        ));
    }

    #[test]
    fn events_without_status_metadata_or_uid_are_invalid() {
        use ContainerEventType::*;
        let no_status = event(ContainerStoppedEvent, None);
        let mut no_meta = event(ContainerStoppedEvent, Some("u1"));
        if let Some(s) = no_meta.pod_sandbox_status.as_mut() {
            s.metadata = None;
        }
        let empty_uid = event(ContainerStoppedEvent, Some(""));
        for ev in [no_status, no_meta, empty_uid] {
            assert_eq!(read(&ev), CriEvent::Invalid { deleted: false });
        }
        let sandbox_deleted = event(ContainerDeletedEvent, None);
        assert_eq!(read(&sandbox_deleted), CriEvent::Invalid { deleted: true });
    }

    #[test]
    fn latency_counts_only_events_created_since_the_attempt_began() {
        let s = 1_000_000_000_000i64;
        let age = Duration::from_secs(10);
        // Created 2 s ago, within the attempt.
        assert_eq!(
            latency(s - 2_000_000_000, s, age),
            Some(Duration::from_secs(2))
        );
        // Created right when the attempt began: still counted.
        assert_eq!(latency(s - 10_000_000_000, s, age), Some(age));
        // Buffered by the runtime before the attempt, or with no timestamp.
        assert_eq!(latency(s - 10_000_000_001, s, age), None);
        assert_eq!(latency(0, s, age), None);
        // A clock step backwards: never negative.
        assert_eq!(latency(s + 5, s, age), Some(Duration::ZERO));
    }
}
