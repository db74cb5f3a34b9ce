//! CacheOwner: the only writer of the pod cache. Per pod it keeps the last status
//! read from the runtime (or the error of the last failed read) and when that read
//! began; plus a global timestamp, advanced after each successful global relist.
//!
//! Readers hold a cheap [`PodCache`] handle: `get` a pod, or `wait_newer_than` a time
//! (kubelet's pod workers do this after a sync): it returns once the pod's entry, or
//! the global timestamp, is newer — so waiters for pods that do not exist are released
//! by the next global relist.

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

    /// The UID of the pod that has this container or sandbox, as last read. A scan of
    /// the cache (a hint source's lookup; 10,000 pods take well under a millisecond).
    pub fn pod_of_container(&self, id: &str) -> Option<String> {
        self.shared.pods.iter().find_map(|e| {
            let status = e.value().status.as_ref()?;
            let has = status.containers.iter().any(|c| c.id == id)
                || status.sandboxes.iter().any(|s| s.id == id);
            has.then(|| e.key().clone())
        })
    }

    /// True when the cache has this container as exited (sandboxes: never).
    pub fn container_exited(&self, id: &str) -> bool {
        self.shared.pods.iter().any(|e| {
            e.value().status.as_ref().is_some_and(|s| {
                s.containers
                    .iter()
                    .any(|c| c.id == id && c.state == plegd_runtime::ContainerState::Exited)
            })
        })
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
            },
            PodCache { shared },
        )
    }

    pub(crate) fn apply(&self, update: CacheUpdate) {
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
}

impl Handler<ApplyRelist> for CacheOwner {
    type Result = ();

    fn handle(&mut self, msg: ApplyRelist, _: &mut Self::Context) {
        for u in msg.updates {
            self.apply(u);
        }
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
