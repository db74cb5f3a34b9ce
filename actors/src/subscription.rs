//! A subscriber's end of the EventPublisher: its bounded queue of live events, and,
//! for a subscription that resumes from a revision, what it still has to replay from
//! the publisher's history.
//!
//! The replay is read straight from the shared history (a cursor, no copy per
//! subscriber), so a replay longer than the live queue's capacity is delivered whole:
//! the capacity bounds the live events only. The history is bounded, though: a
//! subscriber so slow that the events it has yet to replay are evicted meanwhile is
//! told what it lost, exactly as one whose live queue overflowed.
//!
//! Every loss is told as a [`Loss`]: the revisions it may cover (after the last one
//! the subscriber was given, through the last one dropped) and how many events were
//! dropped, in its place among the deliveries, also when nothing is published after
//! it (see [`Subscription::next_async`]).

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use actix::prelude::*;
use crossbeam_channel::{Receiver, RecvError, RecvTimeoutError, TryRecvError};
use tokio::sync::Notify;

use crate::event::LifecycleEvent;
use crate::history_file::HistoryFile;
use crate::packed::{self, PackedEvent};
use crate::packed_ring::PackedRing;

/// One event as a subscriber receives it.
#[derive(Clone, Debug)]
pub struct Delivery {
    /// Per-subscriber sequence number, from 1; a gap equals `missed`.
    pub seq: u64,
    /// Events dropped for this subscriber since the previous delivery (the sum of the
    /// losses since then).
    pub missed: u64,
    pub event: Arc<LifecycleEvent>,
}

/// The last published events, oldest first, packed (see `packed`: a seventh of the
/// memory of the events themselves), in memory (one after another in a few chunks,
/// `packed_ring`) or, with a state dir, in a file of it (`history_file`); written by
/// the publisher only.
pub(crate) struct History {
    ring: PackedRing,
    /// Where the events are instead of `ring` once spilled ([`Self::spill_to`]).
    file: Option<HistoryFile>,
    /// Events evicted since the start: the position of `ring[0]` among every event
    /// ever published (positions, not revisions, so nothing assumes revisions are
    /// contiguous).
    evicted: u64,
    /// The revision of the last event evicted (0: none).
    last_evicted: u64,
    capacity: usize,
    /// Bytes of the packed events held.
    bytes: usize,
    /// Scratch for packing, kept between events.
    buf: Vec<u8>,
}

pub(crate) type SharedHistory = Arc<RwLock<History>>;

impl History {
    pub(crate) fn shared(capacity: usize) -> SharedHistory {
        Arc::new(RwLock::new(History {
            ring: PackedRing::new(capacity),
            file: None,
            evicted: 0,
            last_evicted: 0,
            capacity,
            bytes: 0,
            buf: Vec::new(),
        }))
    }

    pub(crate) fn push(&mut self, ev: &LifecycleEvent) {
        let mut buf = std::mem::take(&mut self.buf);
        PackedEvent::pack_into(ev, &mut buf);
        self.push_bytes(&buf);
        self.buf = buf;
    }

    pub(crate) fn push_packed(&mut self, packed: PackedEvent) {
        self.push_bytes(packed.as_bytes());
    }

    /// Adds an event's packed bytes ([`PackedEvent::pack_into`]'s).
    fn push_bytes(&mut self, packed: &[u8]) {
        if self.capacity == 0 {
            self.evicted += 1;
            self.last_evicted = packed::revision_of(packed);
            return;
        }
        if self.len() >= self.capacity {
            let old = match &mut self.file {
                Some(file) => file.pop_front(),
                None => {
                    let revision = self.ring.get(0).map(packed::revision_of);
                    if let Some(len) = self.ring.pop_front() {
                        self.bytes -= len;
                    }
                    revision
                }
            };
            if let Some(revision) = old {
                self.last_evicted = revision;
            }
            self.evicted += 1;
        }
        match &mut self.file {
            Some(file) => file.push_bytes(packed),
            None => {
                self.bytes += packed.len();
                self.ring.push_back(packed);
            }
        }
    }

    /// Writes the events pushed since the last call to the file, if spilled. If that
    /// fails, the history goes back to memory for the rest of the process's life,
    /// with every event the file still gives (the oldest it cannot are evicted: a
    /// replay tells them as lost).
    pub(crate) fn flush(&mut self) {
        let Some(file) = &mut self.file else {
            return;
        };
        let Err(e) = file.flush() else {
            return;
        };
        tracing::warn!(error = %e, "cannot write the history file in the state dir: the history is kept in memory from now on");
        self.unspill();
    }

    fn unspill(&mut self) {
        let Some(file) = self.file.take() else {
            return;
        };
        let back = file.into_memory();
        if let Some(&last) = back.lost.last() {
            tracing::warn!(
                events = back.lost.len(),
                "history events could not be read back from the state dir: resumes from before revision {} are refused",
                last + 1
            );
            self.evicted += back.lost.len() as u64;
            self.last_evicted = last;
        }
        self.ring = PackedRing::new(self.capacity);
        self.bytes = 0;
        for ev in &back.events {
            self.bytes += ev.heap_bytes();
            self.ring.push_back(ev.as_bytes());
        }
    }

    /// Moves the events to a new file at `path` and keeps them there from now on; if
    /// the file cannot be made or written, they stay in memory (said in the log).
    pub(crate) fn spill_to(&mut self, path: &std::path::Path) {
        let mut file = match HistoryFile::create(path) {
            Ok(file) => file,
            Err(e) => {
                tracing::warn!(error = %e, path = %path.display(), "cannot make the history file: the history is kept in memory");
                return;
            }
        };
        for ev in self.ring.iter() {
            file.push_bytes(ev);
        }
        self.file = Some(file);
        self.ring = PackedRing::new(0);
        self.bytes = 0;
        self.flush();
    }

    /// The events held as packed bytes, oldest first (a new state file's). With a
    /// file that cannot be read, the newest that can be read in a row.
    pub(crate) fn packed_bytes(&self) -> Vec<Vec<u8>> {
        let Some(file) = &self.file else {
            return self.ring.iter().map(<[u8]>::to_vec).collect();
        };
        let mut out = Vec::with_capacity(file.len());
        for i in 0..file.len() {
            match file.get(i) {
                Ok(Some(ev)) => out.push(ev.as_bytes().to_vec()),
                _ => out.clear(),
            }
        }
        out
    }

    /// Events held.
    pub(crate) fn len(&self) -> usize {
        self.file.as_ref().map_or(self.ring.len(), HistoryFile::len)
    }

    /// Heap bytes the history takes: the packed events and their places in the ring
    /// (not the free ends of its first and last chunks, `packed_ring`), or the file's
    /// index.
    pub(crate) fn heap_bytes(&self) -> usize {
        match &self.file {
            Some(file) => file.heap_bytes(),
            None => self.bytes + self.ring.places_bytes(),
        }
    }

    /// The oldest revision still held.
    pub(crate) fn oldest(&self) -> Option<u64> {
        match &self.file {
            Some(file) => file.revision(0),
            None => self.ring.get(0).map(packed::revision_of),
        }
    }

    /// The position after the newest event.
    pub(crate) fn end(&self) -> u64 {
        self.evicted + self.len() as u64
    }

    /// The position of the first event with a revision above `after`.
    pub(crate) fn position_after(&self, after: u64) -> u64 {
        self.evicted
            + match &self.file {
                Some(file) => file.count_through(after),
                None => self
                    .ring
                    .partition_point(|e| packed::revision_of(e) <= after),
            } as u64
    }

    /// The event at `position`, unpacked (a replay's copy of its own); Err with its
    /// revision if it cannot be read back from the file.
    fn get(&self, position: u64) -> Option<Result<LifecycleEvent, u64>> {
        let i = usize::try_from(position.checked_sub(self.evicted)?).ok()?;
        let event = match &self.file {
            Some(file) => match file.get(i) {
                Ok(packed) => packed?.unpack(),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read an event back from the history file");
                    return file.revision(i).map(Err);
                }
            },
            None => packed::unpack(self.ring.get(i)?),
        };
        debug_assert!(event.is_some(), "a packed event that does not unpack");
        event.map(Ok)
    }
}

pub(crate) fn read(history: &SharedHistory) -> std::sync::RwLockReadGuard<'_, History> {
    // Poisoned only if the publisher panicked while pushing; what it holds is intact.
    history.read().unwrap_or_else(|e| e.into_inner())
}

/// What a subscription still has to replay: history positions `next..end`.
pub(crate) struct Replay {
    pub(crate) history: SharedHistory,
    pub(crate) next: u64,
    pub(crate) end: u64,
    /// The sequence number of the delivery at `next`.
    pub(crate) next_seq: u64,
    /// The revision the replay has reached: the last one replayed (or told lost), at
    /// first the revision it resumes after.
    pub(crate) reached: u64,
    /// The revision of the event at `end - 1` (the last one to replay).
    pub(crate) end_revision: u64,
}

/// What a replay gives next.
enum Replayed {
    Event(Delivery),
    /// Events evicted from the history before they could be replayed.
    Lost(Loss),
}

impl Replay {
    /// The next replayed delivery or loss, or None when the replay is over.
    fn pop(&mut self) -> Option<Replayed> {
        let history = read(&self.history);
        if self.next >= self.end {
            return None;
        }
        if self.next < history.evicted {
            let (upto, through) = if history.evicted <= self.end {
                (history.evicted, history.last_evicted)
            } else {
                (self.end, self.end_revision)
            };
            let loss = Loss {
                after: self.reached,
                through,
                dropped: upto - self.next,
            };
            self.next = upto;
            self.next_seq += loss.dropped;
            self.reached = through;
            return Some(Replayed::Lost(loss));
        }
        let event = match history.get(self.next)? {
            Ok(event) => Arc::new(event),
            Err(revision) => {
                let loss = Loss {
                    after: self.reached,
                    through: revision,
                    dropped: 1,
                };
                self.next += 1;
                self.next_seq += 1;
                self.reached = revision;
                return Some(Replayed::Lost(loss));
            }
        };
        self.reached = event.revision;
        let d = Delivery {
            seq: self.next_seq,
            missed: 0,
            event,
        };
        self.next += 1;
        self.next_seq += 1;
        Some(Replayed::Event(d))
    }
}

/// Events a subscription lost in one episode: every event after revision `after` up
/// to revision `through` that it was offered may be lost (`dropped` were), and it
/// goes on after `through`. Counted before any filter of the consumer's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loss {
    /// The revision the subscription had reached before the loss: that of the last
    /// event queued for it (or replayed, or of the previous loss's end), at first the
    /// revision it started from.
    pub after: u64,
    /// The last revision lost.
    pub through: u64,
    /// How many events were dropped.
    pub dropped: u64,
}

/// What [`Subscription::next_async`] and [`Subscription::try_next`] give: every loss,
/// in its place among the deliveries.
#[derive(Clone, Debug)]
pub enum Received {
    Event(Delivery),
    Loss(Loss),
}

/// A live queue entry: the delivery, and the loss just before it, if any.
pub(crate) struct Queued {
    pub(crate) delivery: Delivery,
    pub(crate) loss: Option<Loss>,
}

/// The live side's loss bookkeeping, shared by the publisher (which records drops
/// and attaches a loss to the next event it queues) and the subscription (which takes
/// a loss nothing was queued after, once its queue is empty). The publisher queues
/// under this lock, so an empty queue seen under it stays empty meanwhile: a loss is
/// never taken ahead of an event queued before it.
#[derive(Debug, Default)]
pub(crate) struct LossState {
    /// The loss not yet told: drops since the last event queued.
    pending: Option<Loss>,
    /// The revision the live side has reached: the last event queued, or the end of
    /// the last loss taken, at first where the live events start.
    reached: u64,
}

pub(crate) type SharedLoss = Arc<Mutex<LossState>>;

pub(crate) fn lock_loss(loss: &SharedLoss) -> std::sync::MutexGuard<'_, LossState> {
    // Poisoned only if a holder panicked between two plain assignments.
    loss.lock().unwrap_or_else(|e| e.into_inner())
}

impl LossState {
    pub(crate) fn starting_at(reached: u64) -> Self {
        LossState {
            pending: None,
            reached,
        }
    }

    /// The loss to attach to the next event queued.
    pub(crate) fn pending(&self) -> Option<Loss> {
        self.pending
    }

    /// The event of `revision` was queued: any pending loss went with it.
    pub(crate) fn queued(&mut self, revision: u64) {
        self.pending = None;
        self.reached = revision;
    }

    /// The event of `revision` was dropped; true if that begins a loss.
    pub(crate) fn dropped(&mut self, revision: u64) -> bool {
        match &mut self.pending {
            Some(loss) => {
                loss.through = revision;
                loss.dropped += 1;
                false
            }
            None => {
                self.pending = Some(Loss {
                    after: self.reached,
                    through: revision,
                    dropped: 1,
                });
                true
            }
        }
    }

    /// Takes the pending loss (the subscriber's queue is empty).
    fn take(&mut self) -> Option<Loss> {
        let loss = self.pending.take()?;
        self.reached = loss.through;
        Some(loss)
    }
}

/// The receiving end of a subscription. Dropping it unsubscribes at once, even on a
/// quiet node. Blocking receives (`recv`, `recv_timeout`) suit a consumer on its own
/// thread, [`Self::recv_async`] an async task. After the publisher closes, receiving
/// returns what is queued, then an error (None).
///
/// A subscription that resumes from a revision first delivers the replay from the
/// history, then the live events; the sequence numbers run on across both.
///
/// Losses, two ways: `recv*` and `try_recv` give deliveries only, each with the
/// events dropped just before it in `missed` (a loss after the last delivery waits
/// for the next one); [`Self::next_async`] and [`Self::try_next`] give every loss as
/// a [`Received::Loss`] in its place, as soon as everything queued before it was
/// received, whether or not anything follows it (and `missed` of the next delivery
/// sums the losses given since the previous one). Use one way per subscription.
///
/// The receiver is reached only through the subscription, so whoever receives also
/// keeps the subscription alive (a closure capturing only a receiver field would
/// unsubscribe at once).
pub struct Subscription {
    name: String,
    /// The revision its events follow (see [`Self::starts_after`]).
    starts_after: u64,
    /// See [`Self::live_after`].
    live_after: u64,
    local: Mutex<Local>,
    rx: Receiver<Queued>,
    loss: SharedLoss,
    /// Woken by the publisher after each event queued, when a loss begins, and when
    /// it lets go.
    wake: Arc<Notify>,
    _unsubscribe: Unsubscriber,
}

/// The receiving side's own state.
struct Local {
    replay: Option<Replay>,
    /// A live delivery whose loss was given first (next_async/try_next).
    stashed: Option<Delivery>,
    /// Events lost since the previous delivery (the next one's `missed`).
    untold: u64,
}

impl Local {
    fn deliver(&mut self, mut d: Delivery) -> Delivery {
        d.missed = std::mem::take(&mut self.untold);
        d
    }
}

impl Subscription {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        name: String,
        starts_after: u64,
        live_after: u64,
        replay: Option<Replay>,
        rx: Receiver<Queued>,
        loss: SharedLoss,
        wake: Arc<Notify>,
        id: u64,
        publisher: Recipient<Unsubscribe>,
    ) -> Self {
        Subscription {
            name,
            starts_after,
            live_after,
            local: Mutex::new(Local {
                replay,
                stashed: None,
                untold: 0,
            }),
            rx,
            loss,
            wake,
            _unsubscribe: Unsubscriber { id, publisher },
        }
    }

    /// The name given at subscription (for logs).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The revision this subscription's events follow: the one it resumed after, or,
    /// without one, the last published when it subscribed (a resume point: every
    /// event after it is given or told lost).
    pub fn starts_after(&self) -> u64 {
        self.starts_after
    }

    /// The last revision published when it subscribed (or the one it resumed after,
    /// if later): every event it receives live comes after it; a replay's events do
    /// not.
    pub fn live_after(&self) -> u64 {
        self.live_after
    }

    fn local(&self) -> std::sync::MutexGuard<'_, Local> {
        self.local.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next delivery or loss; `tell`: give losses (else count them into the next
    /// delivery's `missed`).
    fn next_item(&self, tell: bool) -> Result<Received, TryRecvError> {
        let mut local = self.local();
        if let Some(d) = local.stashed.take() {
            return Ok(Received::Event(local.deliver(d)));
        }
        while let Some(replay) = local.replay.as_mut() {
            match replay.pop() {
                Some(Replayed::Event(d)) => return Ok(Received::Event(local.deliver(d))),
                Some(Replayed::Lost(loss)) => {
                    local.untold += loss.dropped;
                    if tell {
                        return Ok(Received::Loss(loss));
                    }
                }
                // Over: let go of the history.
                None => local.replay = None,
            }
        }
        match self.rx.try_recv() {
            Ok(Queued { delivery, loss }) => {
                if let Some(loss) = loss {
                    local.untold += loss.dropped;
                    if tell {
                        local.stashed = Some(delivery);
                        return Ok(Received::Loss(loss));
                    }
                }
                Ok(Received::Event(local.deliver(delivery)))
            }
            Err(e) => {
                if tell {
                    if let Some(loss) = self.take_pending_loss() {
                        local.untold += loss.dropped;
                        return Ok(Received::Loss(loss));
                    }
                }
                Err(e)
            }
        }
    }

    /// The loss nothing was queued after, if the queue is (still) empty.
    fn take_pending_loss(&self) -> Option<Loss> {
        let mut state = lock_loss(&self.loss);
        if self.rx.is_empty() {
            state.take()
        } else {
            None
        }
    }

    /// A live entry received by a blocking call (`tell` off).
    fn accept(&self, q: Queued) -> Delivery {
        let mut local = self.local();
        if let Some(loss) = q.loss {
            local.untold += loss.dropped;
        }
        local.deliver(q.delivery)
    }

    /// The next delivery, losses counted into its `missed`.
    fn next_delivery(&self) -> Result<Delivery, TryRecvError> {
        loop {
            // With `tell` off no loss is given; skipping one would be harmless anyway.
            if let Received::Event(d) = self.next_item(false)? {
                return Ok(d);
            }
        }
    }

    /// Blocks until the next delivery; an error once the publisher has closed and
    /// the queue is empty.
    pub fn recv(&self) -> Result<Delivery, RecvError> {
        match self.next_delivery() {
            Ok(d) => Ok(d),
            Err(TryRecvError::Disconnected) => Err(RecvError),
            Err(TryRecvError::Empty) => self.rx.recv().map(|q| self.accept(q)),
        }
    }

    /// As [`Self::recv`], giving up after `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Delivery, RecvTimeoutError> {
        match self.next_delivery() {
            Ok(d) => Ok(d),
            Err(TryRecvError::Disconnected) => Err(RecvTimeoutError::Disconnected),
            Err(TryRecvError::Empty) => self.rx.recv_timeout(timeout).map(|q| self.accept(q)),
        }
    }

    /// The next delivery if one is queued.
    pub fn try_recv(&self) -> Result<Delivery, TryRecvError> {
        self.next_delivery()
    }

    /// Waits for the next delivery without blocking a thread; None once the publisher
    /// has closed and the queue is empty. Cancel-safe: a delivery is never lost by
    /// dropping the future (e.g. in `tokio::select!`).
    pub async fn recv_async(&self) -> Option<Delivery> {
        loop {
            if let Received::Event(d) = self.next_async_with(false).await? {
                return Some(d);
            }
        }
    }

    /// The next delivery or loss if there is one now (see the type's doc).
    pub fn try_next(&self) -> Result<Received, TryRecvError> {
        self.next_item(true)
    }

    /// Waits for the next delivery or loss (see the type's doc); None once the
    /// publisher has closed and nothing is left, every loss included. Cancel-safe.
    pub async fn next_async(&self) -> Option<Received> {
        self.next_async_with(true).await
    }

    async fn next_async_with(&self, tell: bool) -> Option<Received> {
        loop {
            match self.next_item(tell) {
                Ok(r) => return Some(r),
                Err(TryRecvError::Disconnected) => return None,
                // The publisher notifies after queueing; a notification sent between
                // the try and here is kept as a permit, so none is missed.
                Err(TryRecvError::Empty) => self.wake.notified().await,
            }
        }
    }

    /// Every delivery queued now.
    pub fn try_iter(&self) -> impl Iterator<Item = Delivery> + '_ {
        std::iter::from_fn(move || self.try_recv().ok())
    }

    /// True if nothing is queued (nor left to replay). A loss nothing was queued
    /// after does not count (see [`Self::pending_loss`]).
    pub fn is_empty(&self) -> bool {
        let local = self.local();
        let replaying = local.replay.as_ref().is_some_and(|r| r.next < r.end);
        local.stashed.is_none() && !replaying && self.rx.is_empty()
    }

    /// The live events dropped since the last one queued, if any (so far: the loss
    /// may still grow).
    pub fn pending_loss(&self) -> Option<Loss> {
        lock_loss(&self.loss).pending()
    }

    /// Live events queued now (a replay still to send is not counted).
    pub fn len(&self) -> usize {
        self.rx.len()
    }
}

/// A subscription was dropped: its publisher forgets its queue.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Unsubscribe(pub(crate) u64);

/// Tells the publisher when its subscription is dropped.
struct Unsubscriber {
    id: u64,
    publisher: Recipient<Unsubscribe>,
}

impl Drop for Unsubscriber {
    fn drop(&mut self) {
        // After Stop the publisher is gone and there is nothing to remove.
        self.publisher.do_send(Unsubscribe(self.id));
    }
}

/// Held by the publisher's side of a subscription, after its sender: wakes an async
/// receiver once the sender is dropped, so it sees the disconnection.
pub(crate) struct WakeOnDrop(pub(crate) Arc<Notify>);

impl Drop for WakeOnDrop {
    fn drop(&mut self) {
        self.0.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use plegd_runtime::PodRef;

    use super::*;
    use crate::event::{EventKind, RelistSource};

    fn event(revision: u64) -> LifecycleEvent {
        LifecycleEvent {
            revision,
            time: SystemTime::UNIX_EPOCH + Duration::from_secs(revision),
            pod: PodRef {
                uid: format!("0b1e4bd2-6a4e-4f4b-9d7e-{revision:012}"),
                name: format!("churn-{revision}"),
                namespace: "churn".into(),
            },
            kind: EventKind::ContainerDied,
            container_id: format!("{revision:064x}"),
            relist_source: RelistSource::EventedPleg,
            container_name: "app".into(),
            sandbox: false,
            attempt: Some(0),
            image: None,
            exit: None,
        }
    }

    /// The in-memory history held each event in a heap block of its own: after a
    /// churn, its 1,024 events lay scattered among the churn's freed memory and kept
    /// pages of it in RSS. They are in a few chunks, and read back intact.
    #[test]
    fn the_history_keeps_its_events_in_a_few_chunks_after_a_churn() {
        let history = History::shared(1024);
        let mut h = history.write().unwrap();
        for r in 1..=20_000 {
            h.push(&event(r));
        }
        assert_eq!(h.len(), 1024);
        assert!(h.ring.chunks() <= 12, "{} chunks", h.ring.chunks());
        assert_eq!(h.oldest(), Some(20_000 - 1023));
        let at = h.position_after(19_000);
        assert_eq!(h.get(at), Some(Ok(event(19_001))));
        assert_eq!(h.get(h.end()), None);
    }
}
