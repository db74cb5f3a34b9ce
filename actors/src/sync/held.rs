//! The pods whose relists are held while a sync holds them, each with its
//! "a relist is pending" flag.
//!
//! Each key is written (inserted, removed) only by that pod's PodSyncGate; request
//! sources and the dispatcher only read it and set the flag. The flag is set while
//! holding the map's read guard and the gate checks it after removing the key (which
//! waits for readers), so a request either lands in the flag before the gate looks,
//! or finds no key and goes to the dispatcher: never lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dashmap::DashMap;

/// Looked up for every pod in every global relist: hashed with a randomly keyed fast
/// hash, not SipHash.
#[derive(Clone, Default)]
pub struct HeldPods(Arc<DashMap<String, Arc<AtomicBool>, foldhash::fast::RandomState>>);

impl HeldPods {
    pub fn contains(&self, uid: &str) -> bool {
        self.0.contains_key(uid)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// If the pod is held, marks a relist pending and returns true.
    pub fn coalesce(&self, uid: &str) -> bool {
        match self.0.get(uid) {
            Some(flag) => {
                flag.store(true, Ordering::SeqCst);
                true
            }
            None => false,
        }
    }

    /// Holds the pod (its gate only).
    pub(crate) fn hold(&self, uid: &str) {
        self.0
            .insert(uid.to_string(), Arc::new(AtomicBool::new(false)));
    }

    /// Releases the pod (its gate only); true if a relist was pending.
    pub(crate) fn release(&self, uid: &str) -> bool {
        self.0
            .remove(uid)
            .is_some_and(|(_, flag)| flag.load(Ordering::SeqCst))
    }
}
