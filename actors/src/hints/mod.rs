//! Relist hint sources: everything that may tell plegd "look at this pod now" — the
//! CRI event stream (`cri_events.rs`), containerd's own event service
//! (`containerd_events.rs`), the NRI plugin (`nri.rs`) — behind one seam, [`HintSource`]. A
//! source is only a hint: polling stays the single source of truth, so a lost, late,
//! duplicated or garbage hint costs latency, never correctness.
//!
//! # The contract (what a source implements, what it may rely on)
//!
//! A source is one file implementing [`HintSource`], plus its name in
//! `plegd_telemetry::labels` ([`HintSourceName`], and a [`RelistSource`] for the
//! events it finds) and its arms in `select.rs` (`unavailable`, `resolve`'s detection,
//! `start_source`). The generic actor
//! `watcher::HintWatcher` runs it; the source never sees the actor, the router,
//! the dispatcher or the cache writer.
//!
//! - **Connection.** [`HintSource::open`] makes one connection attempt and resolves
//!   to a stream of items, or to a [`SourceError`]. It may resolve only with the
//!   first item (containerd sends no response headers before it): the watcher puts
//!   no deadline on it and counts a pending attempt as a healthy connection. The
//!   stream's end (`None`), or any `Err` item, ends the connection. The watcher then
//!   retries forever with the CRI stream's capped backoff (`stream/machine.rs`,
//!   `stream/reconnect.rs`: first retry immediate, then exponential with jitter up
//!   to `--reconnect-cap`, reset after `--reconnect-healthy-reset` of good
//!   connection); [`SourceError::unsupported`] (the runtime does not have it:
//!   gRPC Unimplemented, no socket) waits the cap every time and shows as
//!   `unsupported`. Nothing a source does stops plegd or affects `/healthz`.
//! - **Items.** Each item is passed to [`HintSource::hint`] on the actor's thread, in
//!   order; it must return at once (containerd 2.x blocks its event queue on a
//!   subscriber that stops reading; NRI disconnects a plugin that misses its hook
//!   timeout — so a hook handler must answer the runtime itself, then yield the item).
//!   It returns what the item asks for, [`Hint`]s (usually one, or none):
//!   [`Hint::Pod`] (a pod UID, and the container the item is about if it knows it:
//!   the relist reads that container's status together with the pod's lists — a
//!   prefetch that saves a round trip, never needed for correctness; today only the
//!   CRI source names one), [`Hint::Container`] (a container or sandbox ID, mapped
//!   to its pod through the cache; an ID the cache does not know asks for nothing), [`Hint::Global`] (bring the next global relist forward, honoured at
//!   most once per relist period — a resynchronisation), [`Hint::After`] (a hint
//!   later, on the watcher's timer) and [`Hint::Recheck`] (a `Container` hint
//!   skipped once the cache has had the container exited for one more relist, or once
//!   the CRI event stream has reported its stop): containerd publishes a task's
//!   exit before CRI has recorded it, so a read at once may still find the container
//!   running. A `Container` or `Recheck` hint for a pod whose last such request is
//!   still pending (no read of the pod begun since) is dropped: many events about one
//!   pod cost one relist at a time. The watcher turns a hint into a targeted relist request, with the
//!   source's [`HintSource::relist_source`], through the relist router: a held pod's
//!   request is coalesced into its sync gate, anything else goes to the dispatcher's
//!   bounded queue, which drops (and counts) when full. A source never writes state
//!   and never waits.
//! - **Reconnects.** Events may be lost around a reconnect, so every attempt after a
//!   failure (and the first open after one) brings the global relist forward.
//! - **State.** The watcher exports the source's state as `plegd_hint_source_state
//!   {source, state}` (`detected`, `connecting`, `streaming`, `waiting`,
//!   `unsupported`, `stopped`; `off` when not selected), logs each change and shows
//!   it on `/readyz`. Payloads are never stored; no pod UID, container ID or error
//!   text goes into a label.
//! - **Metrics of its own.** [`HintSource::connection`] sees each connection change
//!   (the CRI source keeps the kubelet `kubelet_evented_pleg_*` metrics with it).
//! - **Early sources wait for the CRI stream.** A source whose stop events come before
//!   the runtime's CRI status says so (containerd's event service, NRI) announces each
//!   stop to the shared [`cri_stops::CriStops`] (the CRI source records the stops its
//!   stream reports): while the stream is up and reports the early sources' stops, the
//!   early source reads the pod only after a grace (how late the stream's recent
//!   reports came), and not at all once the stream has reported the stop — its reads
//!   before then could only find the container running, and they load the runtime
//!   while it finishes the exit (issue 11). A stop the stream misses is read at the
//!   grace. Hint-side bookkeeping only: it moves reads, never writes state.
//! - **Duplicates.** The same stop seen by several sources asks for several relists
//!   of the pod; the dispatcher's rules (a request covered by a newer relist is
//!   skipped, a pod whose status did not change publishes nothing) make them one
//!   lifecycle event.

pub(crate) mod containerd_events;
pub(crate) mod coverage;
pub(crate) mod cri_events;
pub(crate) mod cri_stops;
pub(crate) mod nri;
pub(crate) mod rechecks;
pub(crate) mod resolve;
pub(crate) mod select;
#[cfg(test)]
mod tests;
pub(crate) mod watcher;

use std::time::{Duration, Instant};

use futures::future::LocalBoxFuture;
use futures::stream::LocalBoxStream;
use opentelemetry::trace::SpanContext;

pub use crate::event::RelistSource;
pub use crate::hints::rechecks::Awaited;
pub use crate::stream::reconnect::AttemptEnd;
pub use plegd_telemetry::{HintSourceName, HintSourceState};

/// What one item of a source asks for: at most one targeted relist, never state.
#[derive(Clone, Debug, PartialEq)]
pub enum Hint {
    /// Relist this pod. `cause` is the span of what caused it (linked from the relist);
    /// `container` a container of the pod the item is about (not a sandbox), whose
    /// status the relist reads together with the pod's lists (a prefetch: dropped
    /// if the request is coalesced into a sync gate or merged beyond a few per pod).
    Pod {
        uid: String,
        cause: Option<SpanContext>,
        container: Option<String>,
    },
    /// Relist the pod this container or sandbox belongs to: as the cache knows it, or
    /// traced through the runtime (`resolve.rs`) when the cache does not; an ID in no
    /// pod asks for nothing.
    Container { id: String },
    /// As `Container` (with `pod` its UID when the source knows it), unless the cache
    /// already shows the awaited change (read once more after it first does), or,
    /// for a stop, the CRI event stream has reported it: a recheck after an event that
    /// comes before the runtime's status says so (`rechecks.rs`).
    Recheck {
        id: String,
        pod: Option<String>,
        awaited: Awaited,
    },
    /// Bring the next global relist forward (honoured at most once per period).
    Global,
    /// `hint`, `delay` from now (the watcher's timer; dropped if it stops first): for
    /// a source whose event may come before the runtime's status says so.
    After { delay: Duration, hint: Box<Hint> },
}

/// Why a connection attempt failed or a connection ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceError {
    pub end: AttemptEnd,
    pub reason: String,
}

impl SourceError {
    /// Any failure: retried with the capped exponential backoff.
    pub fn failed(reason: impl Into<String>) -> Self {
        SourceError {
            end: AttemptEnd::Failed,
            reason: reason.into(),
        }
    }

    /// The runtime does not have this source: retried every backoff cap (the runtime
    /// may be upgraded or reconfigured), shown as `unsupported`.
    pub fn unsupported(reason: impl Into<String>) -> Self {
        SourceError {
            end: AttemptEnd::Unimplemented,
            reason: reason.into(),
        }
    }

    /// The runtime does not have this source now, and a look for it is cheap: tried
    /// again after `retry`, shown as `unsupported`.
    pub fn absent(reason: impl Into<String>, retry: Duration) -> Self {
        SourceError {
            end: AttemptEnd::Absent { retry },
            reason: reason.into(),
        }
    }
}

/// The items of one connection; an `Err` or the end closes it.
pub type ItemStream<T> = LocalBoxStream<'static, Result<T, SourceError>>;

/// What the watcher knows when it hands a source an item.
#[derive(Clone, Copy, Debug)]
pub struct ItemContext {
    /// When the connection attempt that delivered the item began: items created
    /// earlier were buffered by the runtime and say nothing about its latency.
    pub attempt_started: Option<Instant>,
}

/// A change of a source's connection, for metrics the source keeps itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connection {
    /// A reconnect attempt begins (not the first attempt).
    ReconnectAttempt,
    /// An attempt opened its stream.
    Opened,
    /// An attempt or its stream failed (the end of a stream included).
    Failed,
    /// Up (true) or down.
    Up(bool),
}

/// One relist hint source. See the module docs for the contract.
pub trait HintSource: Unpin + 'static {
    /// What the source's connection yields.
    type Item: 'static;
    /// Its name: `--hint-sources` value, metric label, log field.
    fn name(&self) -> HintSourceName;
    /// The `relist_source` of the relists it asks for.
    fn relist_source(&self) -> RelistSource;
    /// How logs call its connection, e.g. "CRI event stream".
    fn describe(&self) -> &'static str;
    /// One connection attempt (`attempt` counts from 1). No deadline is put on it.
    fn open(
        &mut self,
        attempt: u64,
    ) -> LocalBoxFuture<'static, Result<ItemStream<Self::Item>, SourceError>>;
    /// What one item asks for (usually one hint or none). Must return at once.
    fn hint(&mut self, item: Self::Item, ctx: ItemContext) -> Vec<Hint>;
    /// A change of the connection (default: nothing).
    fn connection(&mut self, _change: Connection) {}
}
