//! Giving back the room of the cache's tables once a burst of pods is gone.

use super::{CacheOwner, Shared};
use crate::room::give_back_room;

/// A table's room is given back counting it as at least this many entries
/// ([`crate::room`]).
const MIN_ROOM: usize = 256;

impl CacheOwner {
    /// Gives back the room of tables far larger than what they hold (pods and
    /// tombstones gone after a burst).
    pub(super) fn shrink(&mut self) {
        let Shared {
            pods,
            tombstones,
            held_cover,
            ..
        } = &*self.shared;
        give_back_room(&mut &*pods, MIN_ROOM);
        give_back_room(&mut &*tombstones, MIN_ROOM);
        give_back_room(&mut &*held_cover, MIN_ROOM);
        give_back_room(&mut self.expiry, MIN_ROOM);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use actix::prelude::*;

    use super::*;
    use crate::cache::test_support::*;
    use crate::cache::*;
    use crate::pleg::CacheUpdate;
    use crate::room::SHRINK_RATIO;

    /// After a churn: the pod and tombstone tables kept the room they grew to
    /// after a burst of short-lived pods, for good.
    #[actix_rt::test]
    async fn the_tables_give_back_their_room_once_a_burst_of_pods_is_gone() {
        tokio::time::pause();
        let ttl = Duration::from_secs(1);
        let (owner, cache) = CacheOwner::new(ttl);
        let owner = owner.start();
        let uids: Vec<String> = (0..5000).map(|i| format!("p{i}")).collect();
        let keep = ["p1", "p2"];
        owner
            .send(relist(uids.iter().map(|u| set(u, at(1))).collect(), 0))
            .await
            .unwrap();
        assert!(cache.capacities().0 >= 5000);
        owner
            .send(relist(
                uids.iter()
                    .filter(|u| !keep.contains(&u.as_str()))
                    .map(|u| delete(u, at(2)))
                    .collect(),
                0,
            ))
            .await
            .unwrap();
        assert_eq!((cache.len(), cache.tombstones()), (2, 4998));
        let small = SHRINK_RATIO * MIN_ROOM;
        assert!(cache.capacities().0 <= small, "{:?}", cache.capacities());
        assert!(cache.capacities().1 >= 4998);
        // Past the TTL the tombstones go, and so does their room.
        tokio::time::advance(ttl + Duration::from_secs(1)).await;
        owner.send(relist(Vec::new(), 0)).await.unwrap();
        assert_eq!(cache.tombstones(), 0);
        assert!(cache.capacities().1 <= small, "{:?}", cache.capacities());
        // What is left is intact.
        for uid in keep {
            assert_eq!(cache.get(uid).unwrap().status, Some(status(uid)));
        }
    }

    /// A churn of short-lived pods with the same live pods all along
    /// left the pod table twice as large (a hash table that removes and inserts at
    /// over half its capacity doubles once, then rehashes in place), for good: room
    /// for 3,548 pods after, 1,680 before (SHRINK_RATIO was 4).
    #[actix_rt::test]
    async fn the_pod_table_gives_back_the_room_a_churn_doubled() {
        tokio::time::pause();
        let ttl = Duration::from_secs(1);
        let (owner, cache) = CacheOwner::new(ttl);
        let owner = owner.start();
        let live: Vec<CacheUpdate> = (0..1000).map(|i| set(&format!("live{i}"), at(1))).collect();
        owner.send(relist(live, 0)).await.unwrap();
        let before = cache.capacities().0;
        // Batches of 250 short-lived pods, each batch going as the next one comes.
        for b in 0..40u64 {
            let batch = |b: u64| (0..250).map(move |i| format!("short{b}-{i}"));
            let mut updates: Vec<CacheUpdate> = batch(b).map(|u| set(&u, at(2 + b))).collect();
            if b > 0 {
                updates.extend(batch(b - 1).map(|u| delete(&u, at(2 + b))));
            }
            owner.send(relist(updates, 0)).await.unwrap();
        }
        let last = (0..250).map(|i| delete(&format!("short39-{i}"), at(50)));
        owner.send(relist(last.collect(), 0)).await.unwrap();
        tokio::time::advance(ttl + Duration::from_secs(1)).await;
        owner.send(relist(Vec::new(), 0)).await.unwrap();
        assert_eq!((cache.len(), cache.tombstones()), (1000, 0));
        assert!(
            cache.capacities().0 <= before,
            "room for {} pods after the churn, {before} before",
            cache.capacities().0
        );
    }
}
