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
//! skipped by readers once expired; at most [`MAX_TOMBSTONES`] are kept (the oldest go
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

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use actix::prelude::*;
use dashmap::DashMap;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::event::{EventKind, RelistSource};
use crate::id_map::IdMap;
use crate::packed_status::{PackedReported, PackedStatus};
use crate::pleg::{CacheUpdate, LastRead, LastReads, PodStatus};
use crate::room::give_back_room;

/// One pod's cache entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedPod {
    /// The last status read successfully (kept when a later read fails).
    pub status: Option<PodStatus>,
    /// The error of the last read, if it failed.
    pub error: Option<String>,
    /// When the last read (successful or not) began.
    pub modified: SystemTime,
    /// The relist that made that read.
    pub read_by: RelistSource,
    /// What the events published so far (up to the cache's revision) last said of
    /// each sandbox and container of the pod: `ContainerStarted` or `ContainerDied`
    /// (one removed is absent). A watch's initial events come from here, so they agree
    /// with the events exactly, even where `status` is already ahead of them (read
    /// after the list the events came from, it may show a death the next relist will
    /// publish).
    pub reported: IdMap<EventKind>,
}

/// A [`CachedPod`] as the cache holds it: the status packed into one block (see
/// `packed_status`: ≈ 250 bytes instead of ≈ 1.3 KB at a sandbox and two
/// containers). Unpacked for readers.
#[derive(Clone, Debug)]
struct StoredPod {
    status: Option<PackedStatus>,
    error: Option<Box<str>>,
    read: ReadStamp,
    reported: PackedReported,
}

/// When a pod's last read began and which relist made it, in the 16 bytes a
/// `SystemTime` alone takes (nanoseconds since the epoch: exact on Linux, until 2554).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ReadStamp {
    at: u64,
    by: RelistSource,
}

impl ReadStamp {
    const NEVER: ReadStamp = ReadStamp {
        at: 0,
        by: RelistSource::Global,
    };

    fn new(at: SystemTime, by: RelistSource) -> Self {
        let at = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        ReadStamp { at, by }
    }

    fn time(self) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_nanos(self.at)
    }
}

/// The relist that covered a pod last, and when it began (see [`PodCache::cover`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cover {
    pub by: RelistSource,
    pub at: SystemTime,
}

impl StoredPod {
    fn unpack(&self) -> CachedPod {
        CachedPod {
            status: self.status.as_ref().and_then(|s| {
                let status = s.unpack();
                debug_assert!(status.is_some(), "a packed status that does not unpack");
                status
            }),
            error: self.error.as_deref().map(str::to_owned),
            modified: self.read.time(),
            read_by: self.read.by,
            reported: self.reported.unpack(),
        }
    }
}

struct Shared {
    pods: DashMap<String, StoredPod>,
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

/// A table's room is given back counting it as at least this many entries
/// ([`crate::room`]).
const MIN_ROOM: usize = 256;

/// At most this many removed pods are remembered (a node removing 55 pods a second
/// for the default 5 minutes); beyond, the oldest tombstone goes before its TTL.
pub const MAX_TOMBSTONES: usize = 16_384;

#[derive(Clone, Debug)]
struct Tombstone {
    last: StoredPod,
    /// The start of the read that found the pod gone.
    removed_at: SystemTime,
    /// The relist that made that read.
    removed_by: RelistSource,
    expires: Instant,
    /// Tells this tombstone from a later one of the same pod.
    generation: u64,
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
        self.shared.pods.iter().find_map(|e| {
            let state = e.value().status.as_ref()?.find_id(id)?;
            Some((e.key().clone(), state))
        })
    }

    /// True when the cache has this container as exited (sandboxes: never).
    pub fn container_exited(&self, id: &str) -> bool {
        self.shared.pods.iter().any(|e| {
            e.value().status.as_ref().is_some_and(|s| {
                s.container_state(id) == Some(plegd_runtime::ContainerState::Exited)
            })
        })
    }

    /// Room for pods and tombstones (for tests).
    #[cfg(test)]
    fn capacities(&self) -> (usize, usize) {
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

/// The single writer. Build one with [`CacheOwner::new`], start it, and hand out
/// [`PodCache`] readers.
pub struct CacheOwner {
    shared: Arc<Shared>,
    /// Every event up to this revision is reflected in the cache, none after.
    revision: u64,
    tombstone_ttl: Duration,
    /// Tombstones in the order they expire (one TTL for all: the order of removal).
    expiry: VecDeque<(Instant, u64, String)>,
    generation: u64,
    /// Scratch for packing statuses, kept between pods.
    buf: Vec<u8>,
    /// A relist is partly applied (see [`ApplyRelist::more`]): snapshots asked
    /// meanwhile wait here.
    partial: bool,
    waiting: Vec<oneshot::Sender<CacheSnapshot>>,
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

    pub(crate) fn apply(&mut self, update: CacheUpdate) {
        match update {
            CacheUpdate::Delete {
                uid,
                read_at,
                source,
            } => {
                if let Some((uid, last)) = self.shared.pods.remove(&uid) {
                    self.bury(uid, last, read_at, source);
                }
            }
            CacheUpdate::Set {
                uid,
                status,
                read_at,
                source,
            } => {
                // Back (same UID): alive again.
                self.shared.tombstones.remove(&uid);
                let mut entry = self.shared.pods.entry(uid).or_insert_with(|| StoredPod {
                    status: None,
                    error: None,
                    read: ReadStamp::NEVER,
                    reported: PackedReported::default(),
                });
                let read = ReadStamp::new(read_at, source);
                // Never let an older read overwrite a newer one.
                if read.at < entry.read.at {
                    return;
                }
                entry.read = read;
                match status {
                    Ok(s) => {
                        entry.status = Some(PackedStatus::pack(&s, &mut self.buf));
                        entry.error = None;
                    }
                    Err(e) => entry.error = Some(e.into_boxed_str()),
                }
            }
            CacheUpdate::Container {
                uid,
                status,
                read_at,
            } => {
                let Some(mut entry) = self.shared.pods.get_mut(&uid) else {
                    return;
                };
                // A read of the whole pod that began later has it already.
                if ReadStamp::new(read_at, RelistSource::Global).at < entry.read.at {
                    return;
                }
                let Some(mut pod) = entry.status.as_ref().and_then(PackedStatus::unpack) else {
                    return;
                };
                let Some(old) = pod.containers.iter_mut().find(|c| c.id == status.id) else {
                    return;
                };
                *old = status;
                // `read` stays the pod's last read's: the other containers were
                // not read again (what `LastReads` reuses is judged by it).
                entry.status = Some(PackedStatus::pack(&pod, &mut self.buf));
            }
        }
    }
}

impl CacheOwner {
    fn bury(
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
    fn prune(&mut self) {
        let now = Instant::now();
        while self.expiry.front().is_some_and(|(at, ..)| *at <= now) {
            self.forget_oldest();
        }
    }

    /// Gives back the room of tables far larger than what they hold (pods and
    /// tombstones gone after a burst).
    fn shrink(&mut self) {
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
    /// This relist's events, in order, as (pod UID, sandbox or container ID, kind):
    /// folded into each pod's `reported`.
    pub events: Vec<(String, String, EventKind)>,
    /// A chunk of a global relist that more chunks follow: snapshots wait until a
    /// message without it (the last chunk) is applied, so that no snapshot presents a
    /// relist half applied.
    pub more: bool,
}

impl Handler<ApplyRelist> for CacheOwner {
    type Result = ();

    fn handle(&mut self, msg: ApplyRelist, _: &mut Self::Context) {
        for u in msg.updates {
            self.apply(u);
        }
        // After the updates: a pod this relist found gone has no entry left to fold
        // its last events into.
        // A pod's events come one after the other: its states are unpacked and packed
        // again once for them all.
        let mut events = msg.events.into_iter().peekable();
        while let Some((uid, id, kind)) = events.next() {
            let mut run = vec![(id, kind)];
            while let Some((_, id, kind)) = events.next_if(|(u, ..)| *u == uid) {
                run.push((id, kind));
            }
            let Some(mut pod) = self.shared.pods.get_mut(&uid) else {
                continue;
            };
            let mut reported = pod.reported.unpack();
            for (id, kind) in run {
                match kind {
                    EventKind::ContainerStarted | EventKind::ContainerDied => {
                        reported.insert(id, kind);
                    }
                    EventKind::ContainerRemoved => {
                        reported.remove(&id);
                    }
                    EventKind::PodSync | EventKind::ContainerChanged => {}
                }
            }
            pod.reported = PackedReported::pack(&reported, &mut self.buf);
        }
        self.revision = self.revision.max(msg.revision);
        self.prune();
        self.shrink();
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
        self.partial = msg.more;
        if !self.partial && !self.waiting.is_empty() {
            let snapshot = self.snapshot();
            for tx in self.waiting.drain(..) {
                let _ = tx.send(snapshot.clone());
            }
        }
    }
}

impl CacheOwner {
    /// Every cached pod with the revision the cache reflects.
    fn snapshot(&self) -> CacheSnapshot {
        // Only this actor writes, so nothing changes while the entries are copied.
        let mut pods: Vec<(String, CachedPod)> = self
            .shared
            .pods
            .iter()
            .map(|e| (e.key().clone(), e.value().unpack()))
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
    //! The CacheOwner alone: snapshots between applies, tombstones, newer-than.

    use plegd_runtime::{ContainerStatus, PodRef};

    use super::*;
    use crate::room::SHRINK_RATIO;

    const TTL: Duration = Duration::from_secs(300);

    fn status(uid: &str) -> PodStatus {
        PodStatus {
            pod: PodRef {
                uid: uid.into(),
                name: format!("name-{uid}"),
                namespace: "ns".into(),
            },
            sandboxes: Vec::new(),
            containers: Vec::new(),
        }
    }

    fn set(uid: &str, read_at: SystemTime) -> CacheUpdate {
        CacheUpdate::Set {
            uid: uid.into(),
            status: Ok(status(uid)),
            read_at,
            source: RelistSource::Global,
        }
    }

    fn delete(uid: &str, read_at: SystemTime) -> CacheUpdate {
        CacheUpdate::Delete {
            uid: uid.into(),
            read_at,
            source: RelistSource::Global,
        }
    }

    fn relist(updates: Vec<CacheUpdate>, revision: u64) -> ApplyRelist {
        ApplyRelist {
            updates,
            global_timestamp: None,
            held: Vec::new(),
            revision,
            events: Vec::new(),
            more: false,
        }
    }

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
    }

    /// A container `c` of pod `a` in `state`.
    fn container(state: plegd_runtime::ContainerState, exit_code: i32) -> ContainerStatus {
        ContainerStatus {
            id: "c".into(),
            sandbox_id: "s".into(),
            name: "app".into(),
            attempt: 0,
            state,
            created_at: 1,
            started_at: 2,
            finished_at: 0,
            exit_code,
            reason: String::new(),
            message: String::new(),
            image: String::new(),
        }
    }

    /// An early death (`pleg::early`): one container's status replaced, the pod's
    /// read time kept; nothing for a read older than the pod's, an unknown container
    /// or an unknown pod.
    #[test]
    fn a_container_update_replaces_that_container_only() {
        use plegd_runtime::ContainerState::{Exited, Running};
        let (mut owner, cache) = CacheOwner::new(TTL);
        let mut st = status("a");
        st.containers.push(container(Running, 0));
        let mut other = container(Running, 0);
        other.id = "d".into();
        st.containers.push(other.clone());
        owner.apply(CacheUpdate::Set {
            uid: "a".into(),
            status: Ok(st),
            read_at: at(5),
            source: RelistSource::Global,
        });
        let update = |read_at, status: ContainerStatus| CacheUpdate::Container {
            uid: "a".into(),
            status,
            read_at,
        };
        let state_of = |id: &str| {
            let pod = cache.get("a").unwrap();
            let st = pod.status.unwrap();
            let c = st.containers.into_iter().find(|c| c.id == id).unwrap();
            (c.state, c.exit_code, pod.modified)
        };
        owner.apply(update(at(4), container(Exited, 9)));
        assert_eq!(
            state_of("c"),
            (Running, 0, at(5)),
            "older than the pod's read"
        );
        owner.apply(update(at(6), container(Exited, 2)));
        assert_eq!(state_of("c"), (Exited, 2, at(5)));
        assert_eq!(state_of("d"), (Running, 0, at(5)));
        let mut unknown = container(Exited, 1);
        unknown.id = "x".into();
        owner.apply(update(at(7), unknown));
        assert_eq!(cache.get("a").unwrap().status.unwrap().containers.len(), 2);
        owner.apply(CacheUpdate::Container {
            uid: "nobody".into(),
            status: container(Exited, 1),
            read_at: at(7),
        });
        assert!(cache.get("nobody").is_none());
    }

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

    /// The read's time and relist take no more room than the time alone did.
    #[test]
    fn a_read_stamp_is_exact_and_as_small_as_a_time() {
        assert_eq!(
            std::mem::size_of::<ReadStamp>(),
            std::mem::size_of::<SystemTime>()
        );
        let t = SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
        assert_eq!(ReadStamp::new(t, RelistSource::Nri).time(), t);
    }

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

    #[actix_rt::test]
    async fn each_pod_keeps_what_the_events_last_said_of_its_sandboxes_and_containers() {
        use EventKind::*;
        let (owner, cache) = CacheOwner::new(TTL);
        let owner = owner.start();
        let ev = |uid: &str, id: &str, kind| (uid.to_string(), id.to_string(), kind);
        let reported = |uid: &str| cache.get(uid).map(|p| p.reported.into_iter().collect());
        owner
            .send(ApplyRelist {
                events: vec![
                    ev("a", "sa", ContainerStarted),
                    ev("a", "c1", ContainerStarted),
                    ev("a", "c2", ContainerDied),
                    // No cache entry (never read): nothing is made up for it.
                    ev("nobody", "cx", ContainerStarted),
                ],
                ..relist(vec![set("a", at(1))], 4)
            })
            .await
            .unwrap();
        assert_eq!(
            reported("a"),
            Some(vec![
                ("c1".to_string(), ContainerStarted),
                ("c2".to_string(), ContainerDied),
                ("sa".to_string(), ContainerStarted)
            ])
        );
        assert!(cache.get("nobody").is_none());
        // Later events replace, Removed deletes; a failed read keeps them.
        owner
            .send(ApplyRelist {
                events: vec![
                    ev("a", "c1", ContainerDied),
                    ev("a", "c2", ContainerRemoved),
                    ev("a", "", PodSync),
                ],
                ..relist(
                    vec![CacheUpdate::Set {
                        uid: "a".into(),
                        status: Err("unavailable".into()),
                        read_at: at(2),
                        source: RelistSource::Global,
                    }],
                    7,
                )
            })
            .await
            .unwrap();
        assert_eq!(
            reported("a"),
            Some(vec![
                ("c1".to_string(), ContainerDied),
                ("sa".to_string(), ContainerStarted)
            ])
        );
        // Gone: the tombstone keeps the last entry; back with the same UID: nothing
        // reported yet of the new one.
        owner
            .send(ApplyRelist {
                events: vec![
                    ev("a", "c1", ContainerRemoved),
                    ev("a", "sa", ContainerDied),
                    ev("a", "sa", ContainerRemoved),
                ],
                ..relist(vec![delete("a", at(3))], 10)
            })
            .await
            .unwrap();
        assert!(matches!(cache.lookup("a"), PodLookup::Removed { .. }));
        owner.send(relist(vec![set("a", at(4))], 10)).await.unwrap();
        assert_eq!(reported("a"), Some(vec![]));
    }
}
