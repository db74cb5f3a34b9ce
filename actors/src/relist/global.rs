//! One global relist as the dispatcher runs it: applied chunk by chunk, the global
//! timestamp and the held pods with the last chunk, its span, metrics and health.

use std::collections::HashSet;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use opentelemetry::trace::Span as _;
use opentelemetry::KeyValue;
use plegd_telemetry::RelistPhase;
use tokio::sync::mpsc::UnboundedReceiver;

use super::apply::{apply, DispatcherDeps};
use crate::pleg::{BesideAsk, BesideCounts, CacheUpdate, GenericPleg, GlobalStep, RelistOutput};
use crate::spans;

/// What a global relist did, for its debug line.
pub(super) struct GlobalSummary {
    pub(super) pods_inspected: usize,
    pub(super) events: usize,
    /// Of `events`, the deaths read beside the relist.
    pub(super) early: usize,
    /// The containers read beside it.
    pub(super) beside: BesideCounts,
    pub(super) status_errors: usize,
    pub(super) took: Duration,
}

/// The pods a global relist did not read (held, or read failed), and what it did.
pub(super) type GlobalResult =
    Result<(HashSet<String>, GlobalSummary), plegd_runtime::RuntimeError>;

/// One global relist, reading beside it what `beside` asks (`pleg::beside`); on
/// success, the pods it did not read (held, or read failed).
/// Applied chunk by chunk (`GenericPleg::relist_global`): each chunk's revisions,
/// cache updates and events in turn; the global timestamp and the pods held go with
/// the last chunk, and only then is plegd ready (the cache answers no snapshot while
/// a relist is partly applied).
pub(super) async fn global_relist(
    core: &mut GenericPleg,
    deps: &DispatcherDeps,
    beside: &mut UnboundedReceiver<BesideAsk>,
) -> (Instant, GlobalResult) {
    let start = Instant::now();
    let started_wall = SystemTime::now();
    let mut span = spans::start(spans::GLOBAL_RELIST, vec![], None);
    let held = deps.held.clone();
    let mut summary = GlobalSummary {
        pods_inspected: 0,
        events: 0,
        early: 0,
        beside: BesideCounts::default(),
        status_errors: 0,
        took: Duration::ZERO,
    };
    let mut not_read: HashSet<String> = HashSet::new();
    let mut held_pods: Vec<String> = Vec::new();
    // A chunk that is not the last has been applied: the cache waits for the rest.
    let mut open = false;
    let result = core
        .relist_global_hearing(&|uid| held.contains(uid), Some(beside), |step| {
            let (mut out, last) = match step {
                GlobalStep::Chunk { out, last } => (out, last),
                GlobalStep::Early(out) => {
                    summary.events += out.events.len();
                    summary.early += out.events.len();
                    // Between two chunks, the cache still waits for the rest.
                    return apply(deps, out, None, open);
                }
            };
            summary.pods_inspected += out.pods_inspected;
            summary.events += out.events.len();
            summary.status_errors += out.status_errors;
            let failed = out.cache.iter().filter_map(|u| match u {
                CacheUpdate::Set {
                    uid,
                    status: Err(_),
                    ..
                } => Some(uid.clone()),
                _ => None,
            });
            not_read.extend(out.held.iter().cloned().chain(failed));
            held_pods.append(&mut out.held);
            if last {
                out.held = std::mem::take(&mut held_pods);
            }
            open = !last;
            apply(deps, out, last.then_some(started_wall), !last)
        })
        .await;
    let result = match result {
        Ok(beside) => {
            summary.beside = beside;
            span.set_attributes([
                KeyValue::new("pods_inspected", summary.pods_inspected as i64),
                KeyValue::new("events", summary.events as i64),
                KeyValue::new("status_errors", summary.status_errors as i64),
            ]);
            span.end();
            deps.health.relist_succeeded(Instant::now());
            if let Ok(d) = SystemTime::now().duration_since(UNIX_EPOCH) {
                deps.metrics.last_seen.set(d.as_secs_f64());
            }
            Ok((
                not_read,
                GlobalSummary {
                    took: start.elapsed(),
                    ..summary
                },
            ))
        }
        Err(e) => {
            if open {
                // Failed after some chunks (see `relist_global`): what they applied
                // stands; the cache answers snapshots again. No global timestamp.
                apply(deps, RelistOutput::default(), None, false).await;
            }
            deps.metrics.count_relist_errors(RelistPhase::List, 1);
            deps.health.relist_failed(&e.to_string());
            spans::end_error(span, e.to_string());
            Err(e)
        }
    };
    deps.metrics
        .relist_duration
        .observe(start.elapsed().as_secs_f64());
    if let Some(state) = &deps.state {
        // Between two units of work: the records, the cache and the history agree.
        if state.store.rewrite_due(Instant::now()) {
            state.rewrite(core).await;
        }
        deps.metrics.state_bytes.set(state.store.size() as i64);
        deps.metrics
            .state_persisting
            .set(i64::from(!state.store.failing()));
    }
    // The lists and what was built of them are freed: give the memory back now.
    plegd_telemetry::malloc::relist_ended();
    (start, result)
}
