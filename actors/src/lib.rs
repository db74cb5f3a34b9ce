//! plegd's actors and the Generic PLEG logic (KEP-3386); docs/architecture.md has
//! the picture.
//!
//! Where each behaviour lives:
//!
//! - `relist`: the RelistDispatcher actor and its state machine (global and targeted
//!   relists, one at a time), and the router that sends a held pod's requests to its
//!   sync gate.
//! - `queue`: a targeted relist's request and the bounded queue every request source
//!   writes into (the dispatcher takes it whole); whether the global relist goes first.
//! - `sync`: PodSyncGate (SyncPod suspension), the registry of gates, the set of
//!   held pods.
//! - `hints`: the relist hint sources behind one seam (`HintSource`: the contract is
//!   in its module docs) — the CRI event stream, containerd's event service — and
//!   the one actor that runs any of them.
//! - `stream`: the connection state machine and reconnect policy every source uses,
//!   and what a CRI event is worth.
//! - `cache`: the CacheOwner and its readers; `publisher`: the EventPublisher (with
//!   its history, for resuming); `subscription`: a subscriber's end; `revision`: how
//!   events are numbered, and why the dispatcher numbers them; `pleg`: one relist and
//!   the old/new diff, without actors.
//! - `wiring`: starts everything and hands out [`Pleg`], the handles a user needs.
//!
//! Modules are private; this file is the crate's API.

mod cache;
mod event;
mod health;
pub mod hints;
mod history_file;
mod id_map;
#[cfg(test)]
mod mock;
mod packed;
mod packed_ring;
mod packed_status;
mod pleg;
mod publisher;
mod queue;
mod relist;
mod revision;
mod room;
pub mod spans;
pub mod state;
mod stop;
mod stream;
mod subscription;
mod sync;
#[cfg(test)]
mod testing;
mod wiring;

pub use cache::{CacheSnapshot, CachedPod, Cover, PodCache, PodLookup};
pub use event::{EventKind, Exit, LifecycleEvent, RelistSource};
pub use health::{Health, Runtime};
pub use hints::select::{unavailable as hint_source_unavailable, HintSelection};
pub use hints::watcher::WatcherState;
pub use hints::{HintSourceName, HintSourceState};
pub use id_map::IdMap;
pub use pleg::{GenericPleg, PodStatus, PrefetchCounts, RelistOutput, RelistScope};
/// NRI's default socket (`--nri-socket`).
pub use plegd_nri::DEFAULT_SOCKET as DEFAULT_NRI_SOCKET;
pub use publisher::SubscribeError;
pub use queue::{ApiRelistOutcome, DEFAULT_API_RELIST_BUDGET};
pub use stream::reconnect::{ReconnectPolicy, ReconnectPolicyError};
pub use subscription::{Delivery, Loss, Received, Subscription};
pub use sync::gate::{SyncError, SyncHold, SyncOutcome};
pub use sync::registry::SyncGates;
pub use sync::{KnownPod, DEFAULT_MAX_SYNC_HOLD, DEFAULT_MAX_UNKNOWN_HOLDS};
pub use wiring::{Pleg, PlegConfig};

/// For fuzzing only (the `fuzzing` feature, enabled by nothing but the fuzz/ package):
/// the crate-private pieces its targets drive directly. Not an API.
#[cfg(feature = "fuzzing")]
pub mod fuzzing {
    use plegd_runtime::cri::ContainerEventResponse;
    use plegd_telemetry::StreamEventType;

    pub use crate::pleg::{group, pod_events, PlegState, PodRecord};

    /// `hints::cri_event::read`: `Ok((uid, kind, relist))` for a valid event,
    /// `Err(deleted)` for an invalid one.
    pub fn read_hint(ev: &ContainerEventResponse) -> Result<(&str, StreamEventType, bool), bool> {
        use crate::hints::cri_event::{read, CriEvent};
        match read(ev) {
            CriEvent::Valid { uid, kind, relist } => Ok((uid, kind, relist)),
            CriEvent::Invalid { deleted } => Err(deleted),
        }
    }

    /// `hints::cri_event::latency`.
    pub fn hint_latency(
        created_at: i64,
        received_ns: i64,
        attempt_age: std::time::Duration,
    ) -> Option<std::time::Duration> {
        crate::hints::cri_event::latency(created_at, received_ns, attempt_age)
    }
}
