//! Relist hint sources: everything that may tell plegd "look at this pod now" — the
//! CRI event stream (`cri_events.rs`), containerd's own event service
//! (`containerd_events.rs`), the NRI plugin (`nri.rs`) — behind one seam,
//! [`HintSource`]. A source is only a hint: polling stays the single source of truth,
//! so a lost, late, duplicated or garbage hint costs latency, never correctness.
//!
//! A source is one file implementing [`HintSource`], its name in
//! `plegd_telemetry::labels` ([`HintSourceName`], and a [`RelistSource`]), and its arms
//! in `select.rs`. The generic actor `watcher::HintWatcher` runs it; the source never
//! sees the actor, the router, the dispatcher or the cache writer.
//!
//! - **Connection.** [`HintSource::open`] makes one attempt and resolves to a stream
//!   of items or a [`SourceError`]; it may resolve only with the first item
//!   (containerd sends no response headers before it), so no deadline is put on it
//!   and an attempt without an error a moment after it began counts as subscribed
//!   (`streaming`). The stream's end or an `Err` item ends the connection; the watcher
//!   retries forever with a capped backoff (`stream/machine.rs`,
//!   `stream/reconnect.rs`), every attempt after a failure bringing the global relist
//!   forward (events around a reconnect may be lost). [`SourceError::unsupported`]
//!   waits the cap, [`SourceError::absent`] its own short delay; both show
//!   `unsupported`. Nothing a source does stops plegd or affects `/healthz`.
//! - **Items.** [`HintSource::hint`] runs on the actor's thread, in order, and must
//!   return at once (containerd 2.x blocks its event queue on a slow subscriber; NRI
//!   drops a plugin that misses its hook timeout). It returns [`Hint`]s; the watcher
//!   turns them into targeted relist requests with the source's
//!   [`HintSource::relist_source`] through the relist router (a held pod's request
//!   joins its sync gate; the dispatcher's bounded queue drops and counts when full).
//!   A container or sandbox ID the cache does not know is traced to its pod by
//!   filtered runtime calls (`resolve.rs`). A pod whose last hint request is still
//!   pending gets no second one, whichever source asks.
//! - **Early events.** containerd's task events and NRI's hooks come before CRI's
//!   status says what they announce: they ask for the rechecks of `rechecks.rs`, one
//!   schedule per change however many sources report it. While the CRI stream
//!   reports stops, an early source waits a grace for it and asks nothing once it has
//!   reported the stop (`cri_stops.rs`).
//! - **State.** The watcher exports `plegd_hint_source_state{source, state}`, logs
//!   each change and shows it on `/readyz`; `coverage.rs` judges which published
//!   container stops each source reported. Payloads are never stored; no pod UID,
//!   container ID or error text goes into a label.
//! - **Duplicates.** What several sources report of one stop becomes one lifecycle
//!   event: the dispatcher skips a request a newer relist covered, and a pod whose
//!   status did not change publishes nothing.

pub(crate) mod containerd_events;
pub(crate) mod coverage;
pub(crate) mod cri_event;
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
