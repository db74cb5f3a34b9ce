//! CacheOwner: the only writer of the pod cache. Per pod it keeps the last status
//! read from the runtime (or the error of the last failed read) and when that read
//! began; plus a global timestamp, advanced after each successful global relist.
//!
//! Readers hold a cheap [`PodCache`] handle: `get` a pod, or `wait_newer_than` a time
//! (kubelet's pod workers do this after a sync): it returns once the pod's entry, or
//! the global timestamp, is newer — so waiters for pods that do not exist are released
//! by the next global relist. Which relist covered a pod last ([`Cover`]) comes from
//! the same two: the source of the pod's last read, kept with its time, and the
//! global timestamp (a global relist that found the pod unchanged covers it too).
//!
//! A pod removed from the runtime leaves a tombstone: its last entry and when it was
//! found gone, answerable for the tombstone TTL (log shippers and security agents look
//! pods up after a short-lived pod has gone). Tombstones are pruned by each apply and
//! skipped by readers once expired; at most [`tombstones::MAX_TOMBSTONES`] are kept (the oldest go
//! first), so memory stays bounded whatever the churn. A pod that comes back (same UID)
//! is a live entry again.
//!
//! The cache also knows the revision it reflects: each [`ApplyRelist`] carries the last
//! revision issued for that relist's events, stored in the same handler as the
//! updates. A [`Snapshot`] is answered by this actor between two applies, so it holds
//! every change whose event has a revision up to its own and none after: list it, then
//! watch from that revision, and each change is seen once (see `revision`). A global
//! relist applied in chunks (the first one, for memory) is not presented half
//! done: a snapshot asked between its chunks is answered after the last one.
//!
//! `entry`: what is kept of a pod; `readers`: [`PodCache`], lookups and waiters;
//! `owner`: the [`CacheOwner`] actor and its snapshots; `updates`: how a relist is
//! applied; `tombstones`: removed pods, for a while; `reclaim`: giving memory back.

use std::time::SystemTime;

use dashmap::DashMap;
use tokio::sync::watch;

mod entry;
mod owner;
mod persist;
mod readers;
mod reclaim;
#[cfg(test)]
mod test_support;
mod tombstones;
mod updates;

use entry::StoredPod;
pub use entry::{CachedPod, Cover};
pub use owner::{CacheOwner, CacheSnapshot, Snapshot};
pub(crate) use persist::{CacheImage, TakeImage};
pub use readers::{PodCache, PodLookup};
use tombstones::Tombstone;
pub use updates::ApplyRelist;

struct Shared {
    /// Keyed by UID as a `Box<str>`: 8 bytes a slot less than a `String`.
    pods: DashMap<Box<str>, StoredPod>,
    /// Pods the last global relist left alone (a sync held them) → the last global
    /// timestamp that did cover them: a waiter on such a pod is not released by a
    /// relist that never looked at it.
    held_cover: DashMap<String, Option<SystemTime>>,
    /// (global timestamp, change counter): every write bumps it to wake waiters.
    changes: watch::Sender<(Option<SystemTime>, u64)>,
    /// Pods removed from the runtime, for a while.
    /// Boxed: a table of up to 16,384 has twice as many buckets, each the size of its
    /// entry (136 bytes inline, 8 boxed; churn).
    tombstones: DashMap<String, Box<Tombstone>>,
}
