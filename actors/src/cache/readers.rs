//! Readers of the cache: [`PodCache`] handles, lock-free, and their waits for a read
//! newer than a time (kubelet's `GetNewerThan`).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::{CachedPod, Cover, Shared, Tombstone};
use crate::event::RelistSource;
use crate::packed_status::IdKey;
use crate::pleg::{LastRead, LastReads};

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
    pub(super) shared: Arc<Shared>,
}

impl PodCache {
    /// A pod's entry, if the cache has one.
    pub fn get(&self, uid: &str) -> Option<CachedPod> {
        self.shared.pods.get(uid).map(|e| e.value().unpack())
    }

    /// A pod as the cache knows it now: present, removed (within the tombstone TTL),
    /// or unknown.
    pub fn lookup(&self, uid: &str) -> PodLookup {
        if let Some(p) = self.get(uid) {
            return PodLookup::Present(p);
        }
        match self.tombstone(uid) {
            Some(t) => PodLookup::Removed {
                last: t.last.unpack(),
                removed_at: t.removed_at,
            },
            None => PodLookup::Unknown,
        }
    }

    /// The pod as [`Self::lookup`] answers it, and the relist that covered it last
    /// (None: unknown): the newer of the pod's last read (the read that found it gone,
    /// for a removed pod) and the last global relist, which covers every pod it did not
    /// leave alone for a sync (it read those that changed and found the others as they
    /// were). The global timestamp is taken first: a global relist it shows was applied
    /// whole before the pod is read, so it never claims to have covered a newer read.
    pub fn lookup_covered(&self, uid: &str) -> (PodLookup, Option<Cover>) {
        let global = self.global_cover(uid);
        let lookup = self.lookup(uid);
        let read = match &lookup {
            PodLookup::Present(p) => Some(Cover {
                by: p.read_by,
                at: p.modified,
            }),
            PodLookup::Removed { .. } => self.tombstone(uid).map(|t| Cover {
                by: t.removed_by,
                at: t.removed_at,
            }),
            PodLookup::Unknown | PodLookup::TimedOut(_) => None,
        };
        let cover = match (read, global) {
            (None, _) => None,
            (Some(r), Some(g)) if g > r.at => Some(Cover {
                by: RelistSource::Global,
                at: g,
            }),
            (Some(r), _) => Some(r),
        };
        (lookup, cover)
    }

    /// The start of the last global relist that covered the pod: the last one, or for
    /// a pod it left alone (held by a sync), the last one before that.
    fn global_cover(&self, uid: &str) -> Option<SystemTime> {
        let global = self.shared.changes.borrow().0;
        match self.shared.held_cover.get(uid) {
            Some(cover) => *cover,
            None => global,
        }
    }

    /// The pod's tombstone, unless expired.
    fn tombstone(&self, uid: &str) -> Option<Tombstone> {
        self.shared
            .tombstones
            .get(uid)
            .filter(|t| t.expires > Instant::now())
            .map(|t| Tombstone::clone(t.value()))
    }

    /// Number of tombstones held (expired ones included until pruned).
    pub fn tombstones(&self) -> usize {
        self.shared.tombstones.len()
    }

    /// The UID of the pod that has this container or sandbox, as last read. A scan of
    /// the cache (a hint source's lookup; 10,000 pods take well under a millisecond).
    pub fn pod_of_container(&self, id: &str) -> Option<String> {
        self.owner_of(id).map(|(uid, _)| uid)
    }

    /// The UID of the pod that has this container or sandbox, as last read, and the
    /// container's state (None: a sandbox). One scan of the cache, as
    /// [`Self::pod_of_container`]'s (≈ 0.4 ms at 10,000 pods, release build).
    pub fn owner_of(&self, id: &str) -> Option<(String, Option<plegd_runtime::ContainerState>)> {
        let id = IdKey::new(id);
        self.shared.pods.iter().find_map(|e| {
            let state = e.value().status.as_ref()?.find_id(&id)?;
            Some((e.key().to_string(), state))
        })
    }

    /// True when the cache has this container as exited (sandboxes: never).
    pub fn container_exited(&self, id: &str) -> bool {
        let id = IdKey::new(id);
        self.shared.pods.iter().any(|e| {
            e.value().status.as_ref().is_some_and(|s| {
                s.container_state(&id) == Some(plegd_runtime::ContainerState::Exited)
            })
        })
    }

    /// Room for pods and tombstones (for tests).
    #[cfg(test)]
    pub(super) fn capacities(&self) -> (usize, usize) {
        (
            self.shared.pods.capacity(),
            self.shared.tombstones.capacity(),
        )
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

    /// Waits until the pod's entry was read after `t` (a read that found it gone
    /// counts: its tombstone), or a global relist that started after `t` has
    /// completed; returns the entry then (None: the pod does not exist). Gives up
    /// after `timeout` with Err(()).
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
                let modified = self.shared.pods.get(uid).map(|e| e.read.time());
                let newer = match modified {
                    Some(m) => m > t,
                    None => self.tombstone(uid).is_some_and(|d| d.removed_at > t),
                };
                if newer || global.is_some_and(|g| g > t) || rx.changed().await.is_err() {
                    // (An error: the owner is gone, nothing newer will ever come.)
                    return self.get(uid);
                }
            }
        };
        tokio::time::timeout(timeout, wait).await.map_err(|_| ())
    }
}

/// Through [`PodCache::get`]: an entry whose last read failed (`error`) offers
/// nothing, even though it keeps the status read before. `modified` is when that
/// successful read began.
impl LastReads for PodCache {
    fn last_read(&self, uid: &str) -> Option<LastRead> {
        let pod = self.get(uid)?;
        if pod.error.is_some() {
            return None;
        }
        Some(LastRead {
            status: pod.status?,
            read_at: pod.modified,
        })
    }
}
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use actix::prelude::*;

    use super::*;
    use crate::cache::test_support::*;
    use crate::cache::*;
    use crate::event::RelistSource;
    use crate::pleg::CacheUpdate;

    /// GetPodStatus's `covered_by`/`covered_at`: the newer of the pod's last read and
    /// the last global relist that did not leave it alone.
    #[actix_rt::test]
    async fn the_cover_is_the_newer_of_the_pods_last_read_and_the_last_global_relist() {
        use RelistSource::{Global, Nri, PostSync};
        let (owner, cache) = CacheOwner::new(TTL);
        let owner = owner.start();
        let cover = |by, secs| Some(Cover { by, at: at(secs) });
        let global = |secs, held: &[&str]| ApplyRelist {
            global_timestamp: Some(at(secs)),
            held: held.iter().map(|u| u.to_string()).collect(),
            ..relist(Vec::new(), 0)
        };
        let read = |uid: &str, secs, source| CacheUpdate::Set {
            uid: uid.into(),
            status: Ok(status(uid)),
            read_at: at(secs),
            source,
        };
        assert_eq!(cache.lookup_covered("a"), (PodLookup::Unknown, None));
        owner
            .send(relist(vec![read("a", 5, PostSync)], 0))
            .await
            .unwrap();
        assert_eq!(cache.lookup_covered("a").1, cover(PostSync, 5));
        // A global relist that found it unchanged.
        owner.send(global(7, &[])).await.unwrap();
        assert_eq!(cache.lookup_covered("a").1, cover(Global, 7));
        owner
            .send(relist(vec![read("a", 8, PostSync)], 0))
            .await
            .unwrap();
        assert_eq!(cache.lookup_covered("a").1, cover(PostSync, 8));
        // A global relist that left it alone (held) covers it not.
        owner.send(global(10, &["a"])).await.unwrap();
        assert_eq!(cache.lookup_covered("a").1, cover(PostSync, 8));
        owner.send(global(11, &[])).await.unwrap();
        assert_eq!(cache.lookup_covered("a").1, cover(Global, 11));
        // Found gone by a read: that read, then the global relists after it.
        owner
            .send(relist(
                vec![CacheUpdate::Delete {
                    uid: "a".into(),
                    read_at: at(12),
                    source: Nri,
                }],
                0,
            ))
            .await
            .unwrap();
        let (lookup, c) = cache.lookup_covered("a");
        assert!(matches!(lookup, PodLookup::Removed { .. }));
        assert_eq!(c, cover(Nri, 12));
        owner.send(global(13, &[])).await.unwrap();
        assert_eq!(cache.lookup_covered("a").1, cover(Global, 13));
        // What the cache shows of a read: its time and relist.
        owner
            .send(relist(vec![read("b", 14, Global)], 0))
            .await
            .unwrap();
        let b = cache.get("b").unwrap();
        assert_eq!((b.modified, b.read_by), (at(14), Global));
    }

    #[actix_rt::test]
    async fn a_read_that_found_the_pod_gone_releases_a_newer_than_waiter() {
        let (owner, cache) = CacheOwner::new(TTL);
        let owner = owner.start();
        owner.send(relist(vec![set("a", at(1))], 0)).await.unwrap();
        let waiter = {
            let cache = cache.clone();
            tokio::spawn(async move {
                cache
                    .wait_newer_than("a", at(5), Duration::from_secs(20))
                    .await
            })
        };
        // Gone, but found so by a read older than asked: not released.
        owner
            .send(relist(vec![delete("a", at(4))], 0))
            .await
            .unwrap();
        owner.send(relist(vec![set("a", at(4))], 0)).await.unwrap();
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiter.is_finished());
        // Found gone by a newer read: released, the pod is not there.
        owner
            .send(relist(vec![delete("a", at(6))], 0))
            .await
            .unwrap();
        let got = tokio::time::timeout(Duration::from_secs(20), waiter)
            .await
            .expect("released")
            .unwrap();
        assert_eq!(got, Ok(None));
        assert!(
            matches!(cache.lookup("a"), PodLookup::Removed { removed_at, .. } if removed_at == at(6))
        );
    }
}
