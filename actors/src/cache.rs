//! CacheOwner: the only writer of the pod cache. Per pod it keeps the last status
//! read from the runtime (or the error of the last failed read) and when that read
//! began; plus a global timestamp, advanced after each successful global relist.
//!
//! Readers hold a cheap [`PodCache`] handle: `get` a pod, or `wait_newer_than` a time
//! (kubelet's pod workers do this after a sync): it returns once the pod's entry, or
//! the global timestamp, is newer — so waiters for pods that do not exist are released
//! by the next global relist.
//!
//! The cache also knows the revision it reflects: each [`ApplyRelist`] carries the last
//! revision issued for that relist's events, stored in the same handler as the
//! updates. A [`Snapshot`] is answered by this actor between two applies, so it holds
//! every change whose event has a revision up to its own and none after: list it, then
//! watch from that revision, and each change is seen once (see `revision`).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use actix::prelude::*;
use dashmap::DashMap;
use tokio::sync::watch;

use crate::pleg::{CacheUpdate, PodStatus};

/// One pod's cache entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedPod {
    /// The last status read successfully (kept when a later read fails).
    pub status: Option<PodStatus>,
    /// The error of the last read, if it failed.
    pub error: Option<String>,
    /// When the last read (successful or not) began.
    pub modified: SystemTime,
}

struct Shared {
    pods: DashMap<String, CachedPod>,
    /// Pods the last global relist left alone (a sync held them) → the last global
    /// timestamp that did cover them: a waiter on such a pod is not released by a
    /// relist that never looked at it.
    held_cover: DashMap<String, Option<SystemTime>>,
    /// (global timestamp, change counter): every write bumps it to wake waiters.
    changes: watch::Sender<(Option<SystemTime>, u64)>,
}

/// A pod as the cache knows it (see [`crate::Pleg::pod_status`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodLookup {
    Present(CachedPod),
    /// Removed from the runtime; kept for `PlegConfig::tombstone_ttl`.
    Removed {
        last: CachedPod,
        removed_at: SystemTime,
    },
    Unknown,
    /// `newer_than` was given and no newer read arrived before the timeout; carries
    /// what the cache has now (if anything).
    TimedOut(Option<CachedPod>),
}

/// Read-only handle on the pod cache.
#[derive(Clone)]
pub struct PodCache {
    shared: Arc<Shared>,
}

impl PodCache {
    /// A pod's entry, if the cache has one.
    pub fn get(&self, uid: &str) -> Option<CachedPod> {
        self.shared.pods.get(uid).map(|e| e.value().clone())
    }

    /// A pod as the cache knows it now.
    pub fn lookup(&self, uid: &str) -> PodLookup {
        match self.get(uid) {
            Some(p) => PodLookup::Present(p),
            None => PodLookup::Unknown,
        }
    }

    /// Number of pods cached.
    pub fn len(&self) -> usize {
        self.shared.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.shared.pods.is_empty()
    }

    /// Time of the last successful global relist's start, if any.
    pub fn global_timestamp(&self) -> Option<SystemTime> {
        self.shared.changes.borrow().0
    }

    /// Waits until the pod's entry was read after `t`, or a global relist that started
    /// after `t` has completed; returns the entry then (None: the pod does not exist).
    /// Gives up after `timeout` with Err(()).
    pub async fn wait_newer_than(
        &self,
        uid: &str,
        t: SystemTime,
        timeout: Duration,
    ) -> Result<Option<CachedPod>, ()> {
        let mut rx = self.shared.changes.subscribe();
        let wait = async {
            loop {
                let mut global = rx.borrow_and_update().0;
                if let Some(cover) = self.shared.held_cover.get(uid) {
                    global = *cover;
                }
                let entry = self.get(uid);
                if entry.as_ref().is_some_and(|e| e.modified > t) || global.is_some_and(|g| g > t) {
                    return entry;
                }
                if rx.changed().await.is_err() {
                    // The owner is gone: nothing newer will ever come.
                    return entry;
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.map_err(|_| ())
    }
}

/// The single writer. Build one with [`CacheOwner::new`], start it, and hand out
/// [`PodCache`] readers.
pub struct CacheOwner {
    shared: Arc<Shared>,
    /// Every event up to this revision is reflected in the cache, none after.
    revision: u64,
}

/// The cache and the revision it reflects, consistent (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheSnapshot {
    /// Every event with a revision up to this one is reflected in `pods`; no later one.
    pub revision: u64,
    /// Every cached pod, by UID, sorted by UID.
    pub pods: Vec<(String, CachedPod)>,
}

impl CacheOwner {
    pub fn new() -> (Self, PodCache) {
        let (changes, _) = watch::channel((None, 0));
        let shared = Arc::new(Shared {
            pods: DashMap::new(),
            held_cover: DashMap::new(),
            changes,
        });
        (
            CacheOwner {
                shared: shared.clone(),
                revision: 0,
            },
            PodCache { shared },
        )
    }

    fn apply(&self, update: CacheUpdate) {
        match update {
            CacheUpdate::Delete { uid } => {
                self.shared.pods.remove(&uid);
            }
            CacheUpdate::Set {
                uid,
                status,
                read_at,
            } => {
                let mut entry = self.shared.pods.entry(uid).or_insert_with(|| CachedPod {
                    status: None,
                    error: None,
                    modified: SystemTime::UNIX_EPOCH,
                });
                // Never let an older read overwrite a newer one.
                if read_at < entry.modified {
                    return;
                }
                entry.modified = read_at;
                match status {
                    Ok(s) => {
                        entry.status = Some(s);
                        entry.error = None;
                    }
                    Err(e) => entry.error = Some(e),
                }
            }
        }
    }
}

impl Actor for CacheOwner {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(64);
    }
}

/// Apply the cache updates of one relist; `global_timestamp` is set for a successful
/// global relist (its start time). The sender awaits the reply before publishing the
/// relist's events, so a subscriber that reads the cache after an event sees its cause.
#[derive(Message)]
#[rtype(result = "()")]
pub struct ApplyRelist {
    pub updates: Vec<CacheUpdate>,
    pub global_timestamp: Option<SystemTime>,
    /// With a global timestamp: the pods that relist left alone (held by a sync).
    pub held: Vec<String>,
    /// The latest revision issued, that of this relist's last event if it had any:
    /// once applied, the cache reflects every event up to it.
    pub revision: u64,
}

impl Handler<ApplyRelist> for CacheOwner {
    type Result = ();

    fn handle(&mut self, msg: ApplyRelist, _: &mut Self::Context) {
        for u in msg.updates {
            self.apply(u);
        }
        self.revision = self.revision.max(msg.revision);
        if msg.global_timestamp.is_some() {
            let previous = self.shared.changes.borrow().0;
            let held = &msg.held;
            self.shared.held_cover.retain(|uid, _| held.contains(uid));
            for uid in held {
                self.shared
                    .held_cover
                    .entry(uid.clone())
                    .or_insert(previous);
            }
        }
        self.shared.changes.send_modify(|(global, n)| {
            if let Some(t) = msg.global_timestamp {
                if global.is_none_or(|g| t > g) {
                    *global = Some(t);
                }
            }
            *n += 1;
        });
    }
}

/// Reads the whole cache with the revision it reflects.
#[derive(Message)]
#[rtype(result = "CacheSnapshot")]
pub struct Snapshot;

impl Handler<Snapshot> for CacheOwner {
    type Result = MessageResult<Snapshot>;

    fn handle(&mut self, _: Snapshot, _: &mut Self::Context) -> Self::Result {
        // Only this actor writes, so nothing changes while the entries are copied.
        let mut pods: Vec<(String, CachedPod)> = self
            .shared
            .pods
            .iter()
            .map(|e| (e.key().clone(), e.value().clone()))
            .collect();
        pods.sort_by(|a, b| a.0.cmp(&b.0));
        MessageResult(CacheSnapshot {
            revision: self.revision,
            pods,
        })
    }
}
