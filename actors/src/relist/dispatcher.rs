//! RelistDispatcher: the Generic PLEG as one actor, so global and targeted relists are
//! serialized and race-free (KEP-3386 "Design Details").
//!
//! - A global relist runs every `relist_period`, whatever the event stream does; when,
//!   and which requests it covers, is the [`GlobalSchedule`]'s business.
//! - Its bounded mailbox is the on-demand queue: [`RelistQueue::request`] uses
//!   `try_send`; a full mailbox drops the request (counted) — the next global relist
//!   reconciles anyway. (actix's real bound: capacity - 1, plus one message from each
//!   sender handle, which that message parks.)
//! - Order of work: shutdown, then a due global relist, then targeted relists: a
//!   relist runs inside `ctx.wait`, which holds the mailbox, and every unit of work
//!   first runs a due global relist — unless the last unit was one and requests wait:
//!   then they get this unit — so a storm of targeted requests delays a global relist
//!   by at most one batch, and global relists slower than their period never starve
//!   the requests.
//! - Batches (issue 11: a storm of 5,000 stops overflowed the queue when requests ran
//!   one at a time): between two units of work the whole mailbox is drained into the
//!   pending requests, one per pod (a newer request for a pod already waiting takes
//!   its place; the older is counted `merged`); the next unit relists them together
//!   (at most [`MAX_BATCH`] pods), their lists read `--status-concurrency` pods at a
//!   time and their status reads under the same bound.
//! - A targeted request enqueued before the start of a global relist that has since
//!   completed is skipped (that relist already saw the pod) — unless that relist left
//!   the pod alone (a sync held it) or failed to read it; one for a pod a sync
//!   holds is coalesced into the gate's pending relist. `RelistDispatcher::settle`
//!   takes that decision, in one place.
//! - Each relist's events get their revisions here (`revision`), before its cache
//!   updates are applied (and acknowledged) with the last of them, then the events are
//!   published: the cache and the revision it reflects change together.
//! - Each relist's cache updates are applied (and acknowledged) before its events are
//!   published. Both are awaited inside the unit of work, so a CacheOwner or an
//!   EventPublisher that stops answering stalls every relist and shutdown with it
//!   (neither blocks in these handlers today).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix::prelude::*;
use opentelemetry::trace::{Span as _, SpanContext};
use opentelemetry::KeyValue;
use plegd_telemetry::logging::RateLimiter;
use plegd_telemetry::{Metrics, RelistPhase, RequestResult};

use super::queue::RelistQueue;
use super::schedule::{GlobalSchedule, Verdict};
use crate::cache::ApplyRelist;
use crate::event::RelistSource;
use crate::health::Health;
use crate::pleg::{CacheUpdate, GenericPleg, RelistOutput, RelistScope};
use crate::publisher::Publish;
use crate::revision::Revisions;
use crate::spans;
use crate::sync::HeldPods;

#[derive(Clone, Debug)]
pub struct DispatcherConfig {
    pub relist_period: Duration,
    /// Mailbox capacity: the bound of the on-demand queue.
    pub queue_capacity: usize,
}

/// Everything a relist needs besides the Generic PLEG state; cloned into each unit
/// of work (the work runs as a future outside `&mut self`). The cache and the
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
    /// Issues each event's revision (this dispatcher is the only issuer).
    pub revisions: Revisions,
}

pub struct RelistDispatcher {
    /// Taken by the relist in progress, put back when it ends.
    core: Option<GenericPleg>,
    deps: DispatcherDeps,
    schedule: GlobalSchedule,
    /// Pods the last successful global relist did not read (a sync held them, or
    /// their status read failed): it covers no request for them.
    not_read: HashSet<String>,
    stopping: Arc<AtomicBool>,
    timer: Option<SpawnHandle>,
    list_errors: RateLimiter,
    /// Requests waiting for the next batch, one per pod, in arrival order. A request
    /// whose turn comes while a unit of work holds the core waits here too (actix may
    /// run the relist timer in the same poll in which a handler started a unit; the
    /// soak saw it twice an hour, and such a request was once lost).
    pending: Vec<RequestRelist>,
    /// Pod UID → its index in `pending`.
    pending_index: HashMap<String, usize>,
    /// A batch is scheduled to start once the mailbox is drained.
    batch_scheduled: bool,
    /// The pending requests are owed the next unit: a global relist ran in the last
    /// one. Alternating, a due global relist waits for at most one batch and a batch
    /// for at most one global relist.
    batch_next: bool,
    /// Rate limit of the per-batch debug line.
    batch_log: RateLimiter,
}

/// The most pods one batch relists, so that a due global relist never waits for more.
pub const MAX_BATCH: usize = 256;

/// Ask for a relist of one pod. Build with [`RelistQueue::request`], which stamps the
/// enqueue time and never blocks.
#[derive(Message, Clone, Debug)]
#[rtype(result = "()")]
pub struct RequestRelist {
    pub uid: String,
    pub source: RelistSource,
    pub enqueued_at: Instant,
    /// The span of what caused the request (a stream event), linked from the relist's.
    pub cause: Option<SpanContext>,
}

/// Stop after the unit of work in progress.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Stop;

/// Bring the next global relist forward (at most once per period).
#[derive(Message)]
#[rtype(result = "()")]
pub struct BringForward;

/// Sends [`Stop`] to the dispatcher: sets a flag every unit of work checks first, then
/// nudges the mailbox (which may be full: queued messages then see the flag).
#[derive(Clone)]
pub struct StopHandle {
    addr: Addr<RelistDispatcher>,
    flag: Arc<AtomicBool>,
}

impl StopHandle {
    /// The dispatcher itself, for test-only messages.
    #[cfg(test)]
    pub(crate) fn addr(&self) -> Addr<RelistDispatcher> {
        self.addr.clone()
    }

    pub fn stop(&self) {
        self.flag.store(true, Ordering::SeqCst);
        let _ = self.addr.try_send(Stop);
    }

    /// True once the actor has stopped.
    pub fn stopped(&self) -> bool {
        !self.addr.connected()
    }
}

/// The running dispatcher's handles.
pub struct DispatcherHandle {
    pub queue: RelistQueue,
    pub stop: StopHandle,
}

impl RelistDispatcher {
    /// Starts the dispatcher on the current arbiter with its bounded mailbox.
    pub fn start(
        core: GenericPleg,
        cfg: DispatcherConfig,
        deps: DispatcherDeps,
    ) -> DispatcherHandle {
        let stopping = Arc::new(AtomicBool::new(false));
        let metrics = deps.metrics.clone();
        let mut ctx = Context::new();
        ctx.set_mailbox_capacity(cfg.queue_capacity.max(1));
        let actor = RelistDispatcher {
            core: Some(core),
            deps,
            schedule: GlobalSchedule::new(cfg.relist_period, Instant::now()),
            not_read: HashSet::new(),
            stopping: stopping.clone(),
            timer: None,
            list_errors: RateLimiter::new(Duration::from_secs(30)),
            pending: Vec::new(),
            pending_index: HashMap::new(),
            batch_scheduled: false,
            batch_next: false,
            batch_log: RateLimiter::new(Duration::from_millis(100)),
        };
        let addr = ctx.run(actor);
        DispatcherHandle {
            queue: RelistQueue::new(addr.clone().recipient(), addr.clone().recipient(), metrics),
            stop: StopHandle {
                addr,
                flag: stopping,
            },
        }
    }

    /// (Re-)arms the timer for the next due global relist.
    fn schedule_tick(&mut self, ctx: &mut Context<Self>) {
        if let Some(h) = self.timer.take() {
            ctx.cancel_future(h);
        }
        let delay = self
            .schedule
            .next_due()
            .saturating_duration_since(Instant::now());
        self.timer = Some(ctx.run_later(delay, |act, ctx| {
            act.timer = None;
            if act.stop_if_asked(ctx) {
                return;
            }
            if act.schedule.due(Instant::now()) {
                act.run(ctx);
            } else {
                act.schedule_tick(ctx);
            }
        }));
    }

    fn stop_if_asked(&mut self, ctx: &mut Context<Self>) -> bool {
        if self.stopping.load(Ordering::SeqCst) {
            ctx.stop();
            true
        } else {
            false
        }
    }

    /// One unit of work: a due global relist, else a batch of the pending requests.
    /// While a unit holds the core, nothing starts: its end looks at what is pending
    /// (a timer tick is dropped: the unit re-arms the timer when it ends).
    fn run(&mut self, ctx: &mut Context<Self>) {
        if self.core.is_none() {
            return;
        }
        let owed = self.batch_next && !self.pending.is_empty();
        self.batch_next = false;
        if self.schedule.due(Instant::now()) && !owed {
            self.global(ctx);
        } else if !self.pending.is_empty() {
            self.batch(ctx);
        } else {
            self.schedule_tick(ctx);
        }
    }

    /// Ends a unit of work: stop if asked, else run the pending requests once the
    /// mailbox is drained, else wait for the next due global relist.
    fn unit_done(&mut self, ctx: &mut Context<Self>) {
        if self.stop_if_asked(ctx) {
            return;
        }
        if self.pending.is_empty() {
            self.schedule_tick(ctx);
        } else {
            self.schedule_batch(ctx);
        }
    }

    /// Runs the next unit after every message now in the mailbox is handled (actix
    /// drains the mailbox before it polls the context's spawned futures), so that
    /// they join the batch.
    fn schedule_batch(&mut self, ctx: &mut Context<Self>) {
        if self.batch_scheduled {
            return;
        }
        self.batch_scheduled = true;
        ctx.spawn(fut::ready(()).map(|(), act: &mut Self, ctx| {
            act.batch_scheduled = false;
            if !act.stop_if_asked(ctx) {
                act.run(ctx);
            }
        }));
    }

    /// A request that must wait for its turn: one per pod. The newer of two requests
    /// for a pod is kept (a global relist that covers it covers the older too).
    fn enqueue(&mut self, req: RequestRelist) {
        let Some(&i) = self.pending_index.get(&req.uid) else {
            self.pending_index
                .insert(req.uid.clone(), self.pending.len());
            self.pending.push(req);
            return;
        };
        let merged = if req.enqueued_at >= self.pending[i].enqueued_at {
            std::mem::replace(&mut self.pending[i], req)
        } else {
            req
        };
        self.deps
            .metrics
            .count_request(RequestResult::Merged, merged.source);
    }

    fn take_core(&mut self) -> Option<GenericPleg> {
        let core = self.core.take();
        if core.is_none() {
            // Cannot happen: relists run under ctx.wait, one at a time.
            tracing::error!("relist requested while another is in progress");
        }
        core
    }

    /// The global relist of a unit of work; the pending requests get the next unit
    /// (after the mailbox is drained: requests that came during the relist join them).
    fn global(&mut self, ctx: &mut Context<Self>) {
        let Some(mut core) = self.take_core() else {
            return;
        };
        let deps = self.deps.clone();
        let fut = async move {
            let (start, result) = global_relist(&mut core, &deps).await;
            (core, start, result)
        };
        ctx.wait(
            fut.into_actor(self)
                .map(move |(core, start, result), act, ctx| {
                    act.core = Some(core);
                    if let Some(interval) = act.schedule.completed(start, result.is_ok()) {
                        act.deps
                            .metrics
                            .relist_interval
                            .observe(interval.as_secs_f64());
                    }
                    match result {
                        Ok(not_read) => act.not_read = not_read,
                        Err(e) => {
                            if let Some(suppressed) = act.list_errors.allow(Instant::now()) {
                                tracing::warn!(error = %e, suppressed, "global relist failed");
                            }
                        }
                    }
                    // The pending requests are owed the next unit, even if another
                    // global relist is due by then (relists slower than their period
                    // must not starve them); those this one covers are skipped then.
                    act.batch_next = !act.pending.is_empty();
                    act.unit_done(ctx);
                }),
        );
    }

    /// A batch of pending requests as one unit of work: each settled first (a global
    /// relist may have covered it since it came), the rest relisted together.
    fn batch(&mut self, ctx: &mut Context<Self>) {
        let rest = self.pending.split_off(self.pending.len().min(MAX_BATCH));
        let taken = std::mem::replace(&mut self.pending, rest);
        self.pending_index = self
            .pending
            .iter()
            .enumerate()
            .map(|(i, r)| (r.uid.clone(), i))
            .collect();
        let reqs: Vec<RequestRelist> = taken.into_iter().filter_map(|r| self.settle(r)).collect();
        if reqs.is_empty() {
            return self.unit_done(ctx);
        }
        let Some(mut core) = self.take_core() else {
            // Cannot happen (run checked); the requests are not lost.
            self.pending.extend(reqs);
            return;
        };
        let deps = self.deps.clone();
        let fut = async move {
            let summary = targeted_relists(&mut core, &deps, &reqs).await;
            (core, summary)
        };
        ctx.wait(fut.into_actor(self).map(|(core, summary), act, ctx| {
            act.core = Some(core);
            if let Some(suppressed) = act.batch_log.allow(Instant::now()) {
                tracing::debug!(
                    pods = summary.pods,
                    events = summary.events,
                    failed = summary.failed,
                    took_ms = summary.took.as_secs_f64() * 1e3,
                    still_pending = act.pending.len(),
                    suppressed,
                    "targeted relist batch"
                );
            }
            act.unit_done(ctx);
        }));
    }

    /// The one place a targeted request's verdict is taken: counted if it needs no
    /// relist (skipped: covered; coalesced: held), returned if it must run.
    fn settle(&self, req: RequestRelist) -> Option<RequestRelist> {
        // Asking whether a sync holds the pod also marks its gate's pending relist.
        let held = self.deps.held.coalesce(&req.uid);
        let verdict = match self.schedule.verdict(req.enqueued_at, held) {
            // The covering relist did not read this pod: the request's cause is unseen.
            Verdict::Skip if self.not_read.contains(&req.uid) => Verdict::Run,
            v => v,
        };
        let result = match verdict {
            Verdict::Run => return Some(req),
            Verdict::Skip => RequestResult::Skipped,
            Verdict::Coalesce => RequestResult::Coalesced,
        };
        self.deps.metrics.count_request(result, req.source);
        None
    }
}

/// Applies a relist's output: revisions issued, cache first (acknowledged, with the
/// revision it now reflects), then events.
async fn apply(deps: &DispatcherDeps, mut out: RelistOutput, global_timestamp: Option<SystemTime>) {
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

/// One global relist; on success, the pods it did not read (held, or read failed).
async fn global_relist(
    core: &mut GenericPleg,
    deps: &DispatcherDeps,
) -> (
    Instant,
    Result<HashSet<String>, plegd_runtime::RuntimeError>,
) {
    let start = Instant::now();
    let started_wall = SystemTime::now();
    let mut span = spans::start(spans::GLOBAL_RELIST, vec![], None);
    let held = deps.held.clone();
    let result = core
        .relist(&RelistScope::Global, &|uid| held.contains(uid))
        .await;
    let result = match result {
        Ok(out) => {
            span.set_attributes([
                KeyValue::new("pods_inspected", out.pods_inspected as i64),
                KeyValue::new("events", out.events.len() as i64),
                KeyValue::new("status_errors", out.status_errors as i64),
            ]);
            span.end();
            let failed = out.cache.iter().filter_map(|u| match u {
                CacheUpdate::Set {
                    uid,
                    status: Err(_),
                    ..
                } => Some(uid.clone()),
                _ => None,
            });
            let not_read: HashSet<String> = out.held.iter().cloned().chain(failed).collect();
            apply(deps, out, Some(started_wall)).await;
            deps.health.relist_succeeded(Instant::now());
            if let Ok(d) = SystemTime::now().duration_since(UNIX_EPOCH) {
                deps.metrics.last_seen.set(d.as_secs_f64());
            }
            Ok(not_read)
        }
        Err(e) => {
            deps.metrics.count_relist_errors(RelistPhase::List, 1);
            spans::end_error(span, e.to_string());
            Err(e)
        }
    };
    deps.metrics
        .relist_duration
        .observe(start.elapsed().as_secs_f64());
    (start, result)
}

/// What a batch did, for its debug line.
struct BatchSummary {
    pods: usize,
    events: usize,
    failed: usize,
    took: Duration,
}

/// The relists of a batch of pods the dispatcher has settled must run: one span per
/// request (linked to its cause), one read of all, one application of the result.
async fn targeted_relists(
    core: &mut GenericPleg,
    deps: &DispatcherDeps,
    reqs: &[RequestRelist],
) -> BatchSummary {
    let start = Instant::now();
    let mut spans: Vec<_> = reqs
        .iter()
        .map(|req| {
            spans::start(
                spans::TARGETED_RELIST,
                vec![
                    KeyValue::new("relist_source", req.source.as_str()),
                    KeyValue::new("pod.uid", req.uid.clone()),
                    KeyValue::new("batch", reqs.len() as i64),
                ],
                req.cause.as_ref(),
            )
        })
        .collect();
    let held = deps.held.clone();
    let pods: Vec<(String, RelistSource)> =
        reqs.iter().map(|r| (r.uid.clone(), r.source)).collect();
    // A sync that takes a pod meanwhile gets its request as its pending relist.
    let (out, failed) = core.relist_pods(&pods, &|uid| held.coalesce(uid)).await;
    let failed: HashMap<String, plegd_runtime::RuntimeError> = failed.into_iter().collect();
    if !failed.is_empty() {
        deps.metrics
            .count_relist_errors(RelistPhase::List, failed.len() as u64);
    }
    for (req, span) in reqs.iter().zip(spans.iter_mut()) {
        match failed.get(&req.uid) {
            Some(e) => {
                tracing::debug!(pod = %req.uid, error = %e, "targeted relist failed");
                span.set_status(opentelemetry::trace::Status::error(e.to_string()));
            }
            None => span.set_attribute(KeyValue::new(
                "events",
                out.events.iter().filter(|ev| ev.pod.uid == req.uid).count() as i64,
            )),
        }
        span.end();
    }
    let summary = BatchSummary {
        pods: reqs.len(),
        events: out.events.len(),
        failed: failed.len(),
        took: Duration::ZERO,
    };
    apply(deps, out, None).await;
    let took = start.elapsed();
    for req in reqs {
        deps.metrics
            .observe_pod_relist(req.source, took.as_secs_f64());
        deps.metrics.count_request(RequestResult::Done, req.source);
    }
    BatchSummary { took, ..summary }
}

impl Actor for RelistDispatcher {
    type Context = Context<Self>;

    fn stopped(&mut self, _: &mut Self::Context) {
        // Requests still queued are dropped with the mailbox.
        self.deps.metrics.queue_depth.set(0);
    }

    fn started(&mut self, ctx: &mut Self::Context) {
        self.schedule_tick(ctx);
    }
}

impl Handler<RequestRelist> for RelistDispatcher {
    type Result = ();

    fn handle(&mut self, msg: RequestRelist, ctx: &mut Self::Context) {
        self.deps.metrics.queue_depth.dec();
        if self.stop_if_asked(ctx) {
            return;
        }
        // A request a completed global relist already covers is settled at once; any
        // other waits for its turn in the next batch, after a due global relist.
        let pending = if self.schedule.covers(msg.enqueued_at) {
            self.settle(msg)
        } else {
            Some(msg)
        };
        if let Some(req) = pending {
            self.enqueue(req);
            if self.core.is_some() {
                self.schedule_batch(ctx);
            }
        }
    }
}

impl Handler<Stop> for RelistDispatcher {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

/// Test only: two units of work asked for in one handler, as actix can do when the
/// relist timer and a message run in the same poll.
#[cfg(test)]
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct TwoUnitsAtOnce(pub RequestRelist, pub RequestRelist);

#[cfg(test)]
impl Handler<TwoUnitsAtOnce> for RelistDispatcher {
    type Result = ();

    fn handle(&mut self, msg: TwoUnitsAtOnce, ctx: &mut Self::Context) {
        self.enqueue(msg.0);
        self.run(ctx);
        self.enqueue(msg.1);
        self.run(ctx);
    }
}

impl Handler<BringForward> for RelistDispatcher {
    type Result = ();

    fn handle(&mut self, _: BringForward, ctx: &mut Self::Context) {
        if self.stop_if_asked(ctx) {
            return;
        }
        if self.schedule.bring_forward(Instant::now()) {
            self.schedule_tick(ctx);
        }
    }
}
