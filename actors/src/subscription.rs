//! A subscriber's end of the EventPublisher: its bounded queue of live events, and,
//! for a subscription that resumes from a revision, what it still has to replay from
//! the publisher's history.
//!
//! The replay is read straight from the shared history (a cursor, no copy per
//! subscriber), so a replay longer than the live queue's capacity is delivered whole:
//! the capacity bounds the live events only. The history is bounded, though: a
//! subscriber so slow that the events it has yet to replay are evicted meanwhile is
//! told how many it missed, exactly as one whose live queue overflowed.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use actix::prelude::*;
use crossbeam_channel::{Receiver, RecvError, RecvTimeoutError, TryRecvError};
use tokio::sync::Notify;

use crate::event::LifecycleEvent;
use crate::packed::PackedEvent;
use crate::publisher::{EventPublisher, Unsubscribe};

/// One event as a subscriber receives it.
#[derive(Clone, Debug)]
pub struct Delivery {
    /// Per-subscriber sequence number, from 1; a gap equals `missed`.
    pub seq: u64,
    /// Events dropped for this subscriber since the previous delivery.
    pub missed: u64,
    pub event: Arc<LifecycleEvent>,
}

/// The last published events, oldest first, packed (see `packed`: a seventh of the
/// memory of the events themselves); written by the publisher only.
pub(crate) struct History {
    ring: VecDeque<PackedEvent>,
    /// Events evicted since the start: the position of `ring[0]` among every event
    /// ever published (positions, not revisions, so nothing assumes revisions are
    /// contiguous).
    evicted: u64,
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
            ring: VecDeque::new(),
            evicted: 0,
            capacity,
            bytes: 0,
            buf: Vec::new(),
        }))
    }

    pub(crate) fn push(&mut self, ev: &LifecycleEvent) {
        if self.capacity == 0 {
            self.evicted += 1;
            return;
        }
        if self.ring.len() >= self.capacity {
            if let Some(old) = self.ring.pop_front() {
                self.bytes -= old.heap_bytes();
            }
            self.evicted += 1;
        }
        let packed = PackedEvent::pack(ev, &mut self.buf);
        self.bytes += packed.heap_bytes();
        self.ring.push_back(packed);
    }

    /// Events held.
    pub(crate) fn len(&self) -> usize {
        self.ring.len()
    }

    /// Heap bytes the history takes: the packed events and the ring's slots.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.bytes + self.ring.capacity() * std::mem::size_of::<PackedEvent>()
    }

    /// The oldest revision still held.
    pub(crate) fn oldest(&self) -> Option<u64> {
        self.ring.front().map(PackedEvent::revision)
    }

    /// The position after the newest event.
    pub(crate) fn end(&self) -> u64 {
        self.evicted + self.ring.len() as u64
    }

    /// The position of the first event with a revision above `after`.
    pub(crate) fn position_after(&self, after: u64) -> u64 {
        self.evicted + self.ring.partition_point(|e| e.revision() <= after) as u64
    }

    /// The event at `position`, unpacked (a replay's copy of its own).
    fn get(&self, position: u64) -> Option<LifecycleEvent> {
        let i = usize::try_from(position.checked_sub(self.evicted)?).ok()?;
        let event = self.ring.get(i)?.unpack();
        debug_assert!(event.is_some(), "a packed event that does not unpack");
        event
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
}

impl Replay {
    /// The next replayed delivery, or None when the replay is over; `missed` counts
    /// events evicted before they could be replayed (reported with the next delivery).
    fn pop(&mut self, missed: &mut u64) -> Option<Delivery> {
        let history = read(&self.history);
        if self.next < history.evicted {
            let lost = history.evicted.min(self.end) - self.next;
            *missed += lost;
            self.next += lost;
            self.next_seq += lost;
        }
        if self.next >= self.end {
            return None;
        }
        let event = Arc::new(history.get(self.next)?);
        let d = Delivery {
            seq: self.next_seq,
            missed: std::mem::take(missed),
            event,
        };
        self.next += 1;
        self.next_seq += 1;
        Some(d)
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
/// The receiver is reached only through the subscription, so whoever receives also
/// keeps the subscription alive (a closure capturing only a receiver field would
/// unsubscribe at once).
pub struct Subscription {
    name: String,
    replay: Mutex<Option<Replay>>,
    /// Replayed events lost to eviction that no delivery has reported yet.
    carried_missed: AtomicU64,
    rx: Receiver<Delivery>,
    /// Woken by the publisher after each event queued, and when it lets go.
    wake: Arc<Notify>,
    _unsubscribe: Unsubscriber,
}

impl Subscription {
    pub(crate) fn new(
        name: String,
        replay: Option<Replay>,
        rx: Receiver<Delivery>,
        wake: Arc<Notify>,
        id: u64,
        publisher: Addr<EventPublisher>,
    ) -> Self {
        Subscription {
            name,
            replay: Mutex::new(replay),
            carried_missed: AtomicU64::new(0),
            rx,
            wake,
            _unsubscribe: Unsubscriber { id, publisher },
        }
    }

    /// The name given at subscription (for logs).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The next event still to replay, if any.
    fn replayed(&self) -> Option<Delivery> {
        let mut guard = self.replay.lock().unwrap_or_else(|e| e.into_inner());
        let replay = guard.as_mut()?;
        let mut missed = self.carried_missed.load(Ordering::Relaxed);
        let d = replay.pop(&mut missed);
        self.carried_missed.store(missed, Ordering::Relaxed);
        if d.is_none() {
            // Over: let go of the history.
            *guard = None;
        }
        d
    }

    /// A live delivery, with any replay loss not reported yet.
    fn live(&self, mut d: Delivery) -> Delivery {
        if self.carried_missed.load(Ordering::Relaxed) > 0 {
            d.missed += self.carried_missed.swap(0, Ordering::Relaxed);
        }
        d
    }

    /// Blocks until the next delivery; an error once the publisher has closed and
    /// the queue is empty.
    pub fn recv(&self) -> Result<Delivery, RecvError> {
        match self.replayed() {
            Some(d) => Ok(d),
            None => self.rx.recv().map(|d| self.live(d)),
        }
    }

    /// As [`Self::recv`], giving up after `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Delivery, RecvTimeoutError> {
        match self.replayed() {
            Some(d) => Ok(d),
            None => self.rx.recv_timeout(timeout).map(|d| self.live(d)),
        }
    }

    /// The next delivery if one is queued.
    pub fn try_recv(&self) -> Result<Delivery, TryRecvError> {
        match self.replayed() {
            Some(d) => Ok(d),
            None => self.rx.try_recv().map(|d| self.live(d)),
        }
    }

    /// Waits for the next delivery without blocking a thread; None once the publisher
    /// has closed and the queue is empty. Cancel-safe: a delivery is never lost by
    /// dropping the future (e.g. in `tokio::select!`).
    pub async fn recv_async(&self) -> Option<Delivery> {
        loop {
            match self.try_recv() {
                Ok(d) => return Some(d),
                Err(TryRecvError::Disconnected) => return None,
                // The publisher notifies after queueing; a notification sent between
                // try_recv and here is kept as a permit, so none is missed.
                Err(TryRecvError::Empty) => self.wake.notified().await,
            }
        }
    }

    /// Every delivery queued now.
    pub fn try_iter(&self) -> impl Iterator<Item = Delivery> + '_ {
        std::iter::from_fn(move || self.try_recv().ok())
    }

    /// True if nothing is queued (nor left to replay).
    pub fn is_empty(&self) -> bool {
        let replaying = self
            .replay
            .lock()
            .map(|r| r.as_ref().is_some_and(|r| r.next < r.end))
            .unwrap_or(false);
        !replaying && self.rx.is_empty()
    }

    /// Live events queued now (a replay still to send is not counted).
    pub fn len(&self) -> usize {
        self.rx.len()
    }
}

/// Tells the publisher when its subscription is dropped.
struct Unsubscriber {
    id: u64,
    publisher: Addr<EventPublisher>,
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
