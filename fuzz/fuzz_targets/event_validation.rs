//! Fuzz target: what plegd makes of one CRI container event. The runtime's event
//! stream is untrusted input (garbage costs latency, never correctness), so arbitrary
//! bytes are decoded as a `ContainerEventResponse`, as tonic would, and read by the
//! StreamWatcher's validation (`stream::hint::read`) and latency
//! (`stream::hint::latency`). Checks, besides "no panic":
//!
//! - valid ⇔ pod_sandbox_status.metadata.uid is present and non-empty, and the
//!   hint's uid is that uid;
//! - only CONTAINER_STOPPED_EVENT asks for a relist; the label matches the type
//!   (an unknown type is `Unknown`); an invalid event says `deleted` ⇔ DELETED;
//! - latency is None for an event without a timestamp or from before the attempt,
//!   never negative, and never more than receipt − creation.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use plegd_actors::fuzzing::{hint_latency, read_hint};
use plegd_runtime::cri::{ContainerEventResponse, ContainerEventType};
use plegd_telemetry::StreamEventType;
use prost::Message as _;

fuzz_target!(|data: &[u8]| {
    let Ok(ev) = ContainerEventResponse::decode(data) else {
        return;
    };
    check_read(&ev);
    check_latency(ev.created_at);
});

fn check_read(ev: &ContainerEventResponse) {
    let uid = ev
        .pod_sandbox_status
        .as_ref()
        .and_then(|s| s.metadata.as_ref())
        .map(|m| m.uid.as_str())
        .unwrap_or("");
    let kind = ContainerEventType::try_from(ev.container_event_type).ok();
    let hint = read_hint(ev);
    assert_eq!(hint, read_hint(ev), "not deterministic");
    match hint {
        Ok((got_uid, label, relist)) => {
            assert!(!uid.is_empty(), "valid without a uid: {ev:?}");
            assert_eq!(got_uid, uid);
            let want = match kind {
                Some(ContainerEventType::ContainerCreatedEvent) => StreamEventType::Created,
                Some(ContainerEventType::ContainerStartedEvent) => StreamEventType::Started,
                Some(ContainerEventType::ContainerStoppedEvent) => StreamEventType::Stopped,
                Some(ContainerEventType::ContainerDeletedEvent) => StreamEventType::Deleted,
                None => StreamEventType::Unknown,
            };
            assert_eq!(label, want, "{ev:?}");
            assert_eq!(
                relist,
                kind == Some(ContainerEventType::ContainerStoppedEvent),
                "{ev:?}"
            );
        }
        Err(deleted) => {
            assert!(uid.is_empty(), "invalid with uid {uid:?}: {ev:?}");
            assert_eq!(
                deleted,
                kind == Some(ContainerEventType::ContainerDeletedEvent)
            );
        }
    }
}

/// Latency at a few receipt times and attempt ages around the event's own timestamp
/// and at the extremes (clock steps, overflow).
fn check_latency(created_at: i64) {
    let receipts = [
        created_at,
        created_at.saturating_add(1),
        created_at.saturating_sub(1),
        created_at.saturating_add(1_000_000_000),
        created_at.saturating_sub(1_000_000_000),
        0,
        1,
        i64::MIN,
        i64::MAX,
    ];
    let ages = [
        Duration::ZERO,
        Duration::from_nanos(1),
        Duration::from_secs(1),
        Duration::from_secs(60),
        Duration::from_nanos(u64::MAX),
        Duration::MAX,
    ];
    for received in receipts {
        for age in ages {
            let Some(latency) = hint_latency(created_at, received, age) else {
                continue;
            };
            assert!(created_at > 0, "latency of an event without a timestamp");
            let attempt_began =
                i128::from(received) - i128::try_from(age.as_nanos()).unwrap_or(i128::MAX);
            assert!(
                i128::from(created_at) >= attempt_began,
                "latency of an event from before the attempt: created {created_at}, \
                 received {received}, age {age:?}"
            );
            let most = (i128::from(received) - i128::from(created_at)).max(0);
            assert!(
                latency.as_nanos() as i128 <= most,
                "latency {latency:?} > received {received} - created {created_at}"
            );
        }
    }
}
