//! A relist's output applied, global or targeted: its events numbered, the cache
//! updated (and acknowledged) first, then the events published: the cache and the
//! revision it reflects change together, and every subscriber sees an event only once
//! the cache has it. Both are awaited inside the unit of work, so a CacheOwner or an
//! EventPublisher that stops answering stalls every relist (and shutdown with it).

use std::sync::Arc;
use std::time::SystemTime;

use actix::Recipient;
use plegd_telemetry::{Metrics, PrefetchResult, RelistPhase};

use crate::cache::ApplyRelist;
use crate::health::Health;
use crate::pleg::RelistOutput;
use crate::publisher::Publish;
use crate::revision::Revisions;
use crate::state::{CommitRef, Persistence};
use crate::sync::HeldPods;

/// Everything a relist needs besides the Generic PLEG state; cloned into each unit
/// of work (the work runs as a future outside the actor). The cache and the
/// publisher are Recipients, so a test can stand in for either.
#[derive(Clone)]
pub struct DispatcherDeps {
    /// The CacheOwner.
    pub cache: Recipient<ApplyRelist>,
    /// The EventPublisher.
    pub publisher: Recipient<Publish>,
    pub metrics: Arc<Metrics>,
    pub health: Health,
    pub held: HeldPods,
    /// Issues each event's revision (the dispatcher is the only issuer).
    pub revisions: Revisions,
    /// The state dir, when there is one: each relist is stored before it is applied.
    pub(crate) state: Option<Persistence>,
}

/// Applies a relist's output: revisions issued, cache first (acknowledged, with the
/// revision it now reflects), then events. `more`: this is a chunk of a global relist
/// and more follow (the cache answers no snapshot until the last is applied).
pub(super) async fn apply(
    deps: &DispatcherDeps,
    mut out: RelistOutput,
    global_timestamp: Option<SystemTime>,
    more: bool,
) {
    let revision = deps.revisions.issue(&mut out.events);
    let held = if global_timestamp.is_some() {
        std::mem::take(&mut out.held)
    } else {
        Vec::new()
    };
    let nothing = out.cache.is_empty()
        && out.events.is_empty()
        && out.records.is_empty()
        && held.is_empty()
        && global_timestamp.is_none();
    if let Some(state) = deps.state.as_ref().filter(|_| !nothing) {
        // Stored before anything shows it (see `state`); a chunk that changed nothing
        // is not stored.
        let commit = CommitRef {
            revision,
            global: global_timestamp,
            more,
            held: &held,
            updates: &out.cache,
            events: &out.events,
            records: &out.records,
        };
        if !state.store.commit(&commit, &mut Vec::new()).await {
            deps.metrics.state_write_failures.inc();
        }
    }
    deps.revisions.show(revision);
    let events = out
        .events
        .iter()
        .map(|e| (e.pod.uid.clone(), e.container_id.clone(), e.kind))
        .collect();
    if out.status_errors > 0 {
        deps.metrics
            .count_relist_errors(RelistPhase::Status, out.status_errors as u64);
    }
    let p = out.prefetch;
    for (result, n) in [
        (PrefetchResult::Used, p.used),
        (PrefetchResult::ReadAgain, p.read_again),
        (PrefetchResult::Failed, p.failed),
        (PrefetchResult::Unused, p.unused),
    ] {
        deps.metrics.count_prefetches(result, n as u64);
    }
    if deps
        .cache
        .send(ApplyRelist {
            updates: out.cache,
            held,
            global_timestamp,
            revision,
            events,
            more,
        })
        .await
        .is_err()
    {
        tracing::error!("cache owner is gone; cache updates lost");
    }
    if !out.events.is_empty() && deps.publisher.send(Publish(out.events)).await.is_err() {
        tracing::error!("event publisher is gone; events lost");
    }
}
