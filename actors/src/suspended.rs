//! The set of pods whose relists are suspended while a sync holds them. Written
//! only by the PodSyncGate side; read by the RelistDispatcher (one writer, many
//! readers, as DESIGN.md allows for a concurrent map).

use std::sync::Arc;

use dashmap::DashSet;

#[derive(Clone, Default)]
pub struct SuspendedPods(Arc<DashSet<String>>);

impl SuspendedPods {
    pub fn contains(&self, uid: &str) -> bool {
        self.0.contains(uid)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn insert(&self, uid: &str) {
        self.0.insert(uid.to_string());
    }

    pub(crate) fn remove(&self, uid: &str) {
        self.0.remove(uid);
    }
}
