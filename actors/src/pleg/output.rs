//! What a relist hands over, global or targeted: the cache updates and the
//! lifecycle events, in order (cache first), and the CRI values events carry.

use std::time::SystemTime;

use super::record::PodRecord;
use super::status::{PodStatus, PrefetchCounts};
use crate::event::{LifecycleEvent, RelistSource};
use plegd_runtime::ContainerStatus;

/// A change for the CacheOwner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CacheUpdate {
    /// The pod was read at `read_at` (the read's start) by a relist from `source`:
    /// its status, or the error.
    Set {
        uid: String,
        status: Result<PodStatus, String>,
        read_at: SystemTime,
        source: RelistSource,
    },
    /// The pod is gone from the runtime, as the read that began at `read_at` (a
    /// relist from `source`) found.
    Delete {
        uid: String,
        read_at: SystemTime,
        source: RelistSource,
    },
    /// One container's status, read at `read_at` while the pod's lists were still
    /// being read (`early`): it replaces that container's in the pod's status, which
    /// keeps the time of the pod's last read (the others were not read again).
    Container {
        uid: String,
        status: ContainerStatus,
        read_at: SystemTime,
    },
}

impl CacheUpdate {
    /// The pod it changes.
    pub fn uid(&self) -> &str {
        match self {
            CacheUpdate::Set { uid, .. }
            | CacheUpdate::Delete { uid, .. }
            | CacheUpdate::Container { uid, .. } => uid,
        }
    }
}

/// The result of one relist, to be applied in order: cache first, then events.
#[derive(Debug, Default)]
pub struct RelistOutput {
    pub cache: Vec<CacheUpdate>,
    pub events: Vec<LifecycleEvent>,
    /// Pods whose status read failed this time.
    pub status_errors: usize,
    /// Pods whose record changed or were re-read.
    pub pods_inspected: usize,
    /// Pods left alone because a sync holds them: this relist says nothing of them.
    pub held: Vec<String>,
    /// What became of the container statuses read together with the lists.
    pub prefetch: PrefetchCounts,
    /// The records this relist changed, in order (None: the pod is gone); only when
    /// the Generic PLEG keeps them for the state dir.
    pub records: Vec<(String, Option<PodRecord>)>,
}

impl RelistOutput {
    /// Appends `other`, the output of what followed (the next chunk of a relist).
    pub fn append(&mut self, other: RelistOutput) {
        self.cache.extend(other.cache);
        self.events.extend(other.events);
        self.status_errors += other.status_errors;
        self.pods_inspected += other.pods_inspected;
        self.held.extend(other.held);
        self.prefetch.add(other.prefetch);
        self.records.extend(other.records);
    }

    /// Nothing to apply: no cache update, no event, nothing counted (`held` aside).
    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
            && self.events.is_empty()
            && self.status_errors == 0
            && self.prefetch == PrefetchCounts::default()
    }
}

/// Nanoseconds since the epoch (CRI's unit, 0 when unset) as a time.
pub(super) fn cri_time(ns: i64) -> Option<SystemTime> {
    u64::try_from(ns)
        .ok()
        .filter(|&ns| ns > 0)
        .map(|ns| SystemTime::UNIX_EPOCH + std::time::Duration::from_nanos(ns))
}

pub(super) fn non_empty(s: &str) -> Option<String> {
    Some(s.to_string()).filter(|s| !s.is_empty())
}
