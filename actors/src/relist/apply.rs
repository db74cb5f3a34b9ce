//! A relist's output applied, global or targeted: its events numbered, the cache
//! updated (and acknowledged) first, then the events published (module docs of
//! `dispatcher`: the order every subscriber relies on).

use plegd_telemetry::{PrefetchResult, RelistPhase};

use super::dispatcher::DispatcherDeps;
use crate::cache::ApplyRelist;
use crate::pleg::RelistOutput;
use crate::publisher::Publish;
use std::time::SystemTime;

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
            held: if global_timestamp.is_some() {
                out.held
            } else {
                Vec::new()
            },
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
