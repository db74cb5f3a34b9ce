//! Pods removed from the runtime, answerable for the tombstone TTL and at most
//! [`MAX_TOMBSTONES`] of them.

use std::time::SystemTime;

use tokio::time::Instant;

use super::{CacheOwner, StoredPod};
use crate::event::RelistSource;

/// At most this many removed pods are remembered (a node removing 55 pods a second
/// for the default 5 minutes); beyond, the oldest tombstone goes before its TTL.
pub const MAX_TOMBSTONES: usize = 16_384;

#[derive(Clone, Debug)]
pub(super) struct Tombstone {
    pub(super) last: StoredPod,
    /// The start of the read that found the pod gone.
    pub(super) removed_at: SystemTime,
    /// The relist that made that read.
    pub(super) removed_by: RelistSource,
    pub(super) expires: Instant,
    /// Tells this tombstone from a later one of the same pod.
    pub(super) generation: u64,
}

impl CacheOwner {
    pub(super) fn bury(
        &mut self,
        uid: String,
        last: StoredPod,
        removed_at: SystemTime,
        removed_by: RelistSource,
    ) {
        let expires = Instant::now() + self.tombstone_ttl;
        self.generation += 1;
        let generation = self.generation;
        self.expiry.push_back((expires, generation, uid.clone()));
        self.shared.tombstones.insert(
            uid,
            Box::new(Tombstone {
                last,
                removed_at,
                removed_by,
                expires,
                generation,
            }),
        );
        while self.shared.tombstones.len() > MAX_TOMBSTONES {
            if !self.forget_oldest() {
                break;
            }
        }
    }

    /// Forgets the tombstones whose TTL is over.
    pub(super) fn prune(&mut self) {
        let now = Instant::now();
        while self.expiry.front().is_some_and(|(at, ..)| *at <= now) {
            self.forget_oldest();
        }
    }

    /// Forgets the oldest tombstone; false if there is none.
    fn forget_oldest(&mut self) -> bool {
        let Some((_, generation, uid)) = self.expiry.pop_front() else {
            return false;
        };
        // Unless the pod came back and went again since: that is a newer tombstone.
        self.shared
            .tombstones
            .remove_if(&uid, |_, t| t.generation == generation);
        true
    }
}
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use actix::prelude::*;

    use super::*;
    use crate::cache::test_support::*;
    use crate::cache::*;

    #[actix_rt::test]
    async fn a_removed_pod_is_answered_for_its_ttl_and_alive_again_if_it_comes_back() {
        tokio::time::pause();
        let (owner, cache) = CacheOwner::new(TTL);
        let owner = owner.start();
        owner
            .send(relist(vec![set("a", at(1)), set("b", at(1))], 0))
            .await
            .unwrap();
        let last = cache.get("a").unwrap();
        owner
            .send(relist(vec![delete("a", at(2))], 0))
            .await
            .unwrap();
        assert_eq!(
            cache.lookup("a"),
            PodLookup::Removed {
                last,
                removed_at: at(2)
            }
        );
        assert_eq!(cache.lookup("nobody"), PodLookup::Unknown);
        assert!(matches!(cache.lookup("b"), PodLookup::Present(_)));

        // Back with the same UID: present; gone again: a new tombstone, which the
        // first one's expiry does not take away.
        tokio::time::advance(TTL / 2).await;
        owner.send(relist(vec![set("a", at(3))], 0)).await.unwrap();
        assert!(matches!(cache.lookup("a"), PodLookup::Present(_)));
        owner
            .send(relist(vec![delete("a", at(4))], 0))
            .await
            .unwrap();
        tokio::time::advance(TTL / 2 + Duration::from_secs(1)).await;
        owner.send(relist(Vec::new(), 0)).await.unwrap();
        assert!(matches!(
            cache.lookup("a"),
            PodLookup::Removed { removed_at, .. } if removed_at == at(4)
        ));
        assert_eq!(cache.tombstones(), 1);

        // Past its TTL: unknown at once for readers, forgotten at the next apply.
        tokio::time::advance(TTL / 2).await;
        assert_eq!(cache.lookup("a"), PodLookup::Unknown);
        assert_eq!(cache.tombstones(), 1);
        owner.send(relist(Vec::new(), 0)).await.unwrap();
        assert_eq!(cache.tombstones(), 0);
    }

    #[actix_rt::test]
    async fn tombstones_are_bounded_the_oldest_going_first() {
        let (owner, cache) = CacheOwner::new(TTL);
        let owner = owner.start();
        let n = MAX_TOMBSTONES + 10;
        let uids: Vec<String> = (0..n).map(|i| format!("p{i}")).collect();
        owner
            .send(relist(uids.iter().map(|u| set(u, at(1))).collect(), 0))
            .await
            .unwrap();
        owner
            .send(relist(uids.iter().map(|u| delete(u, at(2))).collect(), 0))
            .await
            .unwrap();
        assert_eq!(cache.tombstones(), MAX_TOMBSTONES);
        assert_eq!(cache.lookup("p9"), PodLookup::Unknown);
        assert!(matches!(cache.lookup("p10"), PodLookup::Removed { .. }));
        assert!(matches!(
            cache.lookup(&uids[n - 1]),
            PodLookup::Removed { .. }
        ));
    }
}
