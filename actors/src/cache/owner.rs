//! The CacheOwner actor: the only writer, and the snapshots it answers between two
//! applies.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use dashmap::DashMap;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use super::{CachedPod, PodCache, Shared};

/// The single writer. Build one with [`CacheOwner::new`], start it, and hand out
/// [`PodCache`] readers.
pub struct CacheOwner {
    pub(super) shared: Arc<Shared>,
    /// Every event up to this revision is reflected in the cache, none after.
    pub(super) revision: u64,
    pub(super) tombstone_ttl: Duration,
    /// Tombstones in the order they expire (one TTL for all: the order of removal).
    pub(super) expiry: VecDeque<(Instant, u64, String)>,
    pub(super) generation: u64,
    /// Scratch for packing statuses, kept between pods.
    pub(super) buf: Vec<u8>,
    /// A relist is partly applied (see [`super::ApplyRelist::more`]): snapshots asked
    /// meanwhile wait here.
    pub(super) partial: bool,
    pub(super) waiting: Vec<oneshot::Sender<CacheSnapshot>>,
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
    /// `tombstone_ttl`: how long a removed pod stays answerable.
    pub fn new(tombstone_ttl: Duration) -> (Self, PodCache) {
        let (changes, _) = watch::channel((None, 0));
        let shared = Arc::new(Shared {
            pods: DashMap::new(),
            held_cover: DashMap::new(),
            changes,
            tombstones: DashMap::new(),
        });
        (
            CacheOwner {
                shared: shared.clone(),
                revision: 0,
                tombstone_ttl,
                expiry: VecDeque::new(),
                generation: 0,
                buf: Vec::new(),
                partial: false,
                waiting: Vec::new(),
            },
            PodCache { shared },
        )
    }
}

impl Actor for CacheOwner {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(64);
    }
}

impl CacheOwner {
    /// Every cached pod with the revision the cache reflects.
    pub(super) fn snapshot(&self) -> CacheSnapshot {
        // Only this actor writes, so nothing changes while the entries are copied.
        let mut pods: Vec<(String, CachedPod)> = self
            .shared
            .pods
            .iter()
            .map(|e| (e.key().to_string(), e.value().unpack()))
            .collect();
        pods.sort_by(|a, b| a.0.cmp(&b.0));
        CacheSnapshot {
            revision: self.revision,
            pods,
        }
    }
}

/// Reads the whole cache with the revision it reflects.
#[derive(Message)]
#[rtype(result = "CacheSnapshot")]
pub struct Snapshot;

/// Answered between two applies; while a relist is partly applied, once its last
/// chunk is.
impl Handler<Snapshot> for CacheOwner {
    type Result = ResponseActFuture<Self, CacheSnapshot>;

    fn handle(&mut self, _: Snapshot, _: &mut Self::Context) -> Self::Result {
        if !self.partial {
            return Box::pin(fut::ready(self.snapshot()));
        }
        let (tx, rx) = oneshot::channel();
        self.waiting.push(tx);
        // (The sender is only dropped unanswered with the actor, which then polls
        // this no more.)
        Box::pin(
            fut::wrap_future::<_, Self>(rx)
                .map(|answer, act, _| answer.unwrap_or_else(|_| act.snapshot())),
        )
    }
}
#[cfg(test)]
mod tests {
    use actix::prelude::*;

    use super::*;
    use crate::cache::test_support::*;

    #[actix_rt::test]
    async fn a_snapshot_holds_exactly_the_relists_up_to_its_revision() {
        let (owner, _cache) = CacheOwner::new(TTL);
        let owner = owner.start();
        // Relist i adds pod i and issues revision i; snapshots are asked for in between,
        // all in flight at once.
        let mut applies = Vec::new();
        let mut snapshots = Vec::new();
        for i in 1..=200u64 {
            applies.push(owner.send(relist(vec![set(&format!("p{i:03}"), at(i))], i)));
            snapshots.push(owner.send(Snapshot));
        }
        futures::future::join_all(applies).await;
        for snap in futures::future::join_all(snapshots).await {
            let snap = snap.unwrap();
            let uids: Vec<&str> = snap.pods.iter().map(|(u, _)| u.as_str()).collect();
            let want: Vec<String> = (1..=snap.revision).map(|i| format!("p{i:03}")).collect();
            assert_eq!(uids, want);
        }
        // A relist with no events keeps the revision.
        owner
            .send(relist(vec![delete("p001", at(500))], 200))
            .await
            .unwrap();
        let snap = owner.send(Snapshot).await.unwrap();
        assert_eq!((snap.revision, snap.pods.len()), (200, 199));
    }
}
