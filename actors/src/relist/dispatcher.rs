//! RelistDispatcher: the Generic PLEG as one actor, so global and targeted relists are
//! serialized and race-free (KEP-3386 "Design Details").
//!
//! - A global relist runs every `relist_period`, whatever the event stream does; when,
//!   and which requests it covers, is the [`GlobalSchedule`]'s business. It goes
//!   first: a batch starts no read once one is due (but its first round), and hint
//!   sources take no event while one is due or running ([`GlobalPriority`]).
//! - The on-demand queue is the [`Inbox`] behind [`RelistQueue`]: one request per
//!   pod, bounded, filled under a lock by any thread; a [`Wake`] in the mailbox (one
//!   per drain) has the dispatcher take it whole after the mailbox is handled. So no
//!   rate of requests keeps the actor in its mailbox (actix handles messages until
//!   none is left before it polls the spawned units and timers).
//! - Units of work: a global relist, or a batch of targeted relists. One runs at a
//!   time (it takes the Generic PLEG, `core`, and puts it back when it ends), as a
//!   spawned future: the queue keeps being drained while it runs (a batch that held
//!   the actor let a storm overflow the queue whenever the machine was busy). Only the unit's end, on the actor, writes the dispatcher's state.
//! - Order of work: a due global relist, then targeted relists: every unit of work
//!   first runs a due global relist — unless the last unit was one and requests wait
//!   that came before it started: then they get this unit — so a storm of targeted
//!   requests delays a global relist by at most one round of reads, and global
//!   relists slower than their period never starve the requests (those that came
//!   during a global relist are covered by the next, due one).
//! - Batches: every request taken from the queue joins the pending requests, one per
//!   pod (a newer request for a pod already waiting takes its place; the older is
//!   counted `merged`), also while a unit runs; the next unit relists them together
//!   (at most [`MAX_BATCH`] pods), `--status-concurrency` pods read at a time and
//!   their status reads under the same bound; each pod is applied and published as
//!   soon as it is read (none waits for the batch's slowest read), and a death the
//!   prefetched status of a named container shows, as soon as that status is read
//!   (`pleg/early.rs`). A batch runs in `batch.rs`, a global relist in `global.rs`.
//! - A batch in progress takes the requests that come while it runs (a
//!   burst's later exits need not wait for its first reads), settled at once,
//!   unless a global relist is due (that runs next), the pod is waiting already, or
//!   the batch has taken [`MAX_BATCH`] pods: those join the pending requests. So a
//!   storm still delays a due global relist by at most one round of reads. A request for a
//!   pod whose read is in progress (it may have begun before the request's cause)
//!   runs again in the batch once that read ends (requests that come meanwhile are
//!   merged into it); one for a pod the batch has read already reads it again. The pending requests are
//!   bounded by the pods plegd knows plus twice the queue's capacity (pods not listed
//!   yet): a storm on the node's pods never drops; a request for one more pod than
//!   that (only hints for UIDs that are not pods can get there; API clients'
//!   requests wait under their own budget and count in neither bound) is dropped and
//!   counted like a full queue's; one for a pod already waiting is
//!   always merged. Merged requests keep the containers each asked to prefetch (the
//!   one a CRI event is about: read together with the pod's lists), at most
//!   [`MAX_PREFETCH`] per pod; more are just not prefetched.
//! - A targeted request enqueued before the start of a global relist that has since
//!   completed is skipped (that relist already saw the pod) — unless that relist left
//!   the pod alone (a sync held it) or failed to read it; one for a pod a sync
//!   holds is coalesced into the gate's pending relist. `RelistDispatcher::settle`
//!   takes that decision, in one place.
//! - Each relist's events get their revisions here (`revision`), before its cache
//!   updates are applied (and acknowledged) with the last of them, then the events are
//!   published: the cache and the revision it reflects change together. A global
//!   relist does this chunk by chunk (a few hundred pods each, for memory); the
//!   cache holds snapshots back until its last chunk, which alone carries the global
//!   timestamp and makes plegd ready.
//! - Each relist's cache updates are applied (and acknowledged) before its events are
//!   published. Both are awaited inside the unit of work, so a CacheOwner or an
//!   EventPublisher that stops answering stalls every relist and shutdown with it
//!   (neither blocks in these handlers today); requests still join the pending ones
//!   meanwhile.
//! - Stop: the queue refuses new requests at once (dropped, counted); the unit in
//!   progress finishes (its cache updates applied, its events published); then every
//!   request accepted before the stop is relisted, in batches, no global relist
//!   started; then the actor stops. A request accepted is never lost: it ends
//!   `done`, `skipped`, `coalesced` or `merged`.
//! - Debug lines (to follow a relist's latency without traces): one per global
//!   relist, one per batch, one per pod a batch relisted (how long its request waited,
//!   how long the batch took, its events or its error), each kind under a
//!   [`LogBudget`]; the first line after suppressed ones counts them.

use std::cell::RefCell;
use std::collections::HashSet;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use plegd_telemetry::logging::RateLimiter;
use plegd_telemetry::{Metrics, RequestResult};
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

use super::batch::{targeted_relists, Batch, BatchPods, BatchSummary, Taken};
use super::global::global_relist;
use super::log_budget::{LogBudget, LINES_PER_WINDOW, WINDOW};
use super::priority::GlobalPriority;
use super::queue::{merge, Inbox, PodRequests, RelistQueue, RequestRelist, Wake};
use super::schedule::{GlobalSchedule, Verdict};
use crate::cache::ApplyRelist;
use crate::health::Health;
use crate::pleg::{GenericPleg, PodAsk};
use crate::publisher::Publish;
use crate::revision::Revisions;
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
    /// Taken by the unit of work in progress, put back when it ends.
    core: Option<GenericPleg>,
    deps: DispatcherDeps,
    schedule: GlobalSchedule,
    /// Pods the last successful global relist did not read (a sync held them, or
    /// their status read failed): it covers no request for them.
    not_read: HashSet<String>,
    /// Set by [`StopHandle::stop`] (and read by the queue, which then refuses).
    stopping: Arc<AtomicBool>,
    timer: Option<SpawnHandle>,
    list_errors: RateLimiter,
    /// Where request sources put their requests; taken whole on each [`Wake`].
    inbox: Arc<Inbox>,
    /// A drain of the inbox is scheduled (after the mailbox).
    drain_scheduled: bool,
    /// Tells hint sources when a global relist is due or running (they wait then).
    priority: GlobalPriority,
    /// A global relist is in progress.
    global_running: bool,
    /// Requests waiting for the next batch, one per pod, in arrival order: every
    /// request taken from the inbox that must run, also while a unit of work runs.
    pending: PodRequests,
    /// Pods the Generic PLEG had a record of when the last unit of work ended.
    known_pods: usize,
    /// The queue's capacity: with `known_pods`, the bound of `pending`.
    queue_capacity: usize,
    /// A batch is scheduled to start once the mailbox is drained.
    batch_scheduled: bool,
    /// The batch in progress, while it takes more requests.
    open_batch: Option<OpenBatch>,
    /// Batches take requests while they run (tests of the pending requests alone
    /// turn it off).
    admission: bool,
    /// The pending requests are owed the next unit: a global relist ran in the last
    /// one. Alternating, a due global relist waits for at most one batch and a batch
    /// for at most one global relist.
    batch_next: bool,
    logs: Logs,
}

/// The batch in progress: where requests that come while it runs join it, the pods
/// it is reading, and how many it has taken.
struct OpenBatch {
    more: UnboundedSender<PodAsk<Taken>>,
    pods: BatchPods,
    taken: usize,
}

/// The dispatcher's debug lines, each kind under its own budget.
struct Logs {
    /// One per global relist or batch.
    unit: LogBudget,
    /// One per pod a batch relisted.
    pod: LogBudget,
    /// A request dropped because too many pods wait (a warning).
    pending_full: RateLimiter,
}

/// The most pods one batch takes.
pub const MAX_BATCH: usize = 256;

/// The dispatcher's mailbox: [`Wake`] (one at a time), [`BringForward`], [`Stop`].
const MAILBOX: usize = 64;

/// Stop once the unit of work in progress and the requests accepted are done.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Stop;

/// Bring the next global relist forward (at most once per period).
#[derive(Message)]
#[rtype(result = "()")]
pub struct BringForward;

/// Sends [`Stop`] to the dispatcher: sets a flag every unit of work checks first (and
/// the queue, which then refuses new requests), then nudges the mailbox (which may be
/// full: the queued messages then lead to the flag).
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
        let queue_capacity = cfg.queue_capacity.max(1);
        ctx.set_mailbox_capacity(MAILBOX);
        let inbox = Inbox::new(queue_capacity);
        let priority = GlobalPriority::default();
        let schedule = GlobalSchedule::new(cfg.relist_period, Instant::now());
        priority.set(false, schedule.next_due());
        let actor = RelistDispatcher {
            inbox: inbox.clone(),
            drain_scheduled: false,
            priority: priority.clone(),
            global_running: false,
            known_pods: core.pod_count(),
            core: Some(core),
            deps,
            schedule,
            not_read: HashSet::new(),
            stopping: stopping.clone(),
            timer: None,
            list_errors: RateLimiter::new(Duration::from_secs(30)),
            pending: PodRequests::default(),
            queue_capacity,
            batch_scheduled: false,
            open_batch: None,
            admission: true,
            batch_next: false,
            logs: Logs {
                unit: LogBudget::new(LINES_PER_WINDOW, WINDOW),
                pod: LogBudget::new(LINES_PER_WINDOW, WINDOW),
                pending_full: RateLimiter::new(Duration::from_secs(30)),
            },
        };
        let addr = ctx.run(actor);
        DispatcherHandle {
            queue: RelistQueue::new(
                inbox,
                addr.clone().recipient(),
                addr.clone().recipient(),
                metrics,
            )
            .refusing_once(stopping.clone())
            .with_priority(priority),
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
            if act.wind_down(ctx) {
                return;
            }
            if act.schedule.due(Instant::now()) {
                act.run(ctx);
            } else {
                act.schedule_tick(ctx);
            }
        }));
    }

    /// True once a stop is asked. Then, with no unit of work in progress, the actor
    /// stops if nothing is pending, else the pending requests run first; a unit in
    /// progress calls this again when it ends.
    fn wind_down(&mut self, ctx: &mut Context<Self>) -> bool {
        if !self.stopping.load(Ordering::SeqCst) {
            return false;
        }
        self.drain(ctx);
        if self.core.is_some() {
            if self.pending.is_empty() {
                ctx.stop();
            } else {
                self.schedule_batch(ctx);
            }
        }
        true
    }

    /// One unit of work: a due global relist, else a batch of the pending requests.
    /// While a unit holds the core, nothing starts: its end looks at what is pending
    /// (a timer tick is dropped: the unit re-arms the timer when it ends). Once a stop
    /// is asked, only batches start.
    fn run(&mut self, ctx: &mut Context<Self>) {
        if self.core.is_none() {
            return;
        }
        self.drain(ctx);
        let stopping = self.stopping.load(Ordering::SeqCst);
        if stopping && self.pending.is_empty() {
            ctx.stop();
            return;
        }
        let owed = self.batch_next && !self.pending.is_empty();
        self.batch_next = false;
        if !stopping && !owed && self.schedule.due(Instant::now()) {
            self.global(ctx);
        } else if !self.pending.is_empty() {
            self.batch(ctx);
        } else {
            self.schedule_tick(ctx);
        }
    }

    /// Ends a unit of work: run the pending requests once the mailbox is drained, else
    /// wait for the next due global relist (or stop, if asked and nothing is pending).
    fn unit_done(&mut self, ctx: &mut Context<Self>) {
        if self.wind_down(ctx) {
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
            act.run(ctx);
        }));
    }

    /// How many pods may wait: every pod plegd knows, and twice as many more as the
    /// queue holds (pods not listed yet: created since the last global relist, or
    /// garbage). Twice: the mailbox itself accepts a few more than its capacity (one
    /// per sender handle), and an idle dispatcher must never drop what it accepted.
    fn pending_bound(&self) -> usize {
        self.known_pods
            .saturating_add(self.queue_capacity.saturating_mul(2))
    }

    /// A request that must wait for its turn: one per pod. The newer of two requests
    /// for a pod is kept (a global relist that covers it covers the older too), with
    /// the containers both asked to prefetch (at most `MAX_PREFETCH`). A request
    /// for one more pod beyond [`Self::pending_bound`] is dropped (counted).
    fn enqueue(&mut self, req: RequestRelist) {
        let bound = self.pending_bound();
        if let Some(req) = self.pending.add(req, bound, &self.deps.metrics) {
            self.deps
                .metrics
                .count_request(RequestResult::Dropped, req.source);
            if let Some(suppressed) = self.logs.pending_full.allow(Instant::now()) {
                tracing::warn!(
                    pending = self.pending.len(),
                    suppressed,
                    "more pods wait for a targeted relist than plegd knows; request \
                     dropped (the next global relist reconciles)"
                );
            }
        }
        self.deps
            .metrics
            .relist_pending
            .set(self.pending.len() as i64);
    }

    /// Takes every request from the inbox (at most its capacity: the work between
    /// two looks at the schedule is bounded whatever the rate of requests).
    fn drain(&mut self, ctx: &mut Context<Self>) {
        for req in self.inbox.take(&self.deps.metrics) {
            self.accept(req, ctx);
        }
    }

    /// A request from the inbox: the batch in progress takes it at once if it may
    /// (its verdict taken now: no global relist completes while a batch runs); a
    /// request a completed global relist already covers is settled at once; any other
    /// waits for its turn in the next batch, after a due global relist (a unit in
    /// progress starts it when it ends).
    fn accept(&mut self, req: RequestRelist, ctx: &mut Context<Self>) {
        let waits = if self.admissible(&req) {
            self.settle(req).and_then(|req| self.admit(req))
        } else if self.schedule.covers(req.enqueued_at) {
            self.settle(req)
        } else {
            Some(req)
        };
        if let Some(req) = waits {
            self.enqueue(req);
            if self.core.is_some() {
                self.schedule_batch(ctx);
            }
        }
    }

    fn take_core(&mut self) -> Option<GenericPleg> {
        let core = self.core.take();
        if core.is_none() {
            // Cannot happen: `run` starts a unit only when the core is here.
            tracing::error!("relist requested while another is in progress");
        }
        core
    }

    /// Puts the core back at the end of a unit of work.
    fn put_core(&mut self, core: GenericPleg) {
        self.known_pods = core.pod_count();
        self.core = Some(core);
    }

    /// The global relist of a unit of work; the pending requests get the next unit
    /// (requests that come during the relist join them).
    fn global(&mut self, ctx: &mut Context<Self>) {
        let Some(mut core) = self.take_core() else {
            return;
        };
        let deps = self.deps.clone();
        self.global_running = true;
        self.priority.set(true, self.schedule.next_due());
        let fut = async move {
            let (start, result) = global_relist(&mut core, &deps).await;
            (core, start, result)
        };
        ctx.spawn(
            fut.into_actor(self)
                .map(move |(core, start, result), act, ctx| {
                    act.put_core(core);
                    if let Some(interval) = act.schedule.completed(start, result.is_ok()) {
                        act.deps
                            .metrics
                            .relist_interval
                            .observe(interval.as_secs_f64());
                    }
                    act.global_running = false;
                    act.priority.set(false, act.schedule.next_due());
                    match result {
                        Ok((not_read, summary)) => {
                            act.not_read = not_read;
                            if let Some(suppressed) = act.logs.unit.allow(Instant::now()) {
                                tracing::debug!(
                                    pods_inspected = summary.pods_inspected,
                                    events = summary.events,
                                    status_errors = summary.status_errors,
                                    took_ms = summary.took.as_secs_f64() * 1e3,
                                    pending = act.pending.len(),
                                    suppressed,
                                    "global relist"
                                );
                            }
                        }
                        Err(e) => {
                            if let Some(suppressed) = act.list_errors.allow(Instant::now()) {
                                tracing::warn!(error = %e, suppressed, "global relist failed");
                            }
                        }
                    }
                    // Requests that waited since before this relist started are owed
                    // the next unit, even if another global relist is due by then
                    // (relists slower than their period must not starve them; those
                    // this one covers are skipped then). Those that came during it
                    // wait for a due global relist, which covers them.
                    act.batch_next = act.pending.iter().any(|r| r.enqueued_at < start);
                    act.unit_done(ctx);
                }),
        );
    }

    /// A batch of pending requests as one unit of work: each settled first, in
    /// arrival order (a global relist may have covered it since it came), until
    /// [`MAX_BATCH`] must run; those are relisted together.
    fn batch(&mut self, ctx: &mut Context<Self>) {
        let mut reqs = Vec::with_capacity(MAX_BATCH.min(self.pending.len()));
        let mut pending = self.pending.take().into_iter();
        for req in pending.by_ref() {
            if let Some(req) = self.settle(req) {
                reqs.push(req);
                if reqs.len() == MAX_BATCH {
                    break;
                }
            }
        }
        self.pending.put_back(pending);
        self.deps
            .metrics
            .relist_pending
            .set(self.pending.len() as i64);
        if reqs.is_empty() {
            return self.unit_done(ctx);
        }
        let Some(mut core) = self.take_core() else {
            // Cannot happen (run checked); the requests are not lost.
            for req in reqs {
                self.enqueue(req);
            }
            return;
        };
        let deps = self.deps.clone();
        let detail = tracing::enabled!(tracing::Level::DEBUG);
        let (more, taken) = unbounded_channel();
        let pods: BatchPods = Rc::new(RefCell::new(
            reqs.iter().map(|r| (r.uid.clone(), None)).collect(),
        ));
        self.open_batch = Some(OpenBatch {
            more: more.clone(),
            pods: pods.clone(),
            taken: reqs.len(),
        });
        let priority = self.priority.clone();
        let fut = async move {
            let batch = Batch {
                reqs,
                priority,
                more: taken,
                again: more,
                pods,
            };
            let summary = targeted_relists(&mut core, &deps, batch, detail).await;
            (core, summary)
        };
        ctx.spawn(fut.into_actor(self).map(|(core, mut summary), act, ctx| {
            act.open_batch = None;
            act.put_core(core);
            act.defer(std::mem::take(&mut summary.deferred));
            act.log_batch(&summary);
            act.unit_done(ctx);
        }));
    }

    /// Requests a batch took but did not start (a global relist came due) wait again,
    /// ahead of those that came after them.
    fn defer(&mut self, deferred: Vec<RequestRelist>) {
        if deferred.is_empty() {
            return;
        }
        let later = self.pending.take();
        for req in deferred.into_iter().chain(later) {
            // Never dropped: each was accepted already.
            let _ = self.pending.add(req, usize::MAX, &self.deps.metrics);
        }
        self.deps
            .metrics
            .relist_pending
            .set(self.pending.len() as i64);
    }

    /// Whether the batch in progress may take this request: no global relist is due
    /// (that one runs next, and covers it), the pod is not waiting for the next unit,
    /// and the batch has room or is reading the pod already.
    fn admissible(&self, req: &RequestRelist) -> bool {
        self.open_batch.as_ref().is_some_and(|open| {
            self.admission
                && !self.schedule.due(Instant::now())
                && !self.pending.contains(&req.uid)
                && (open.taken < MAX_BATCH || open.pods.borrow().contains_key(&req.uid))
        })
    }

    /// Hands a request that must run to the batch in progress; gives it back if the
    /// batch has ended. A request for a pod whose read is in progress (it may have
    /// begun before the request's cause) runs again in the batch once that read ends
    /// (merged with any other that came meanwhile).
    fn admit(&mut self, req: RequestRelist) -> Option<RequestRelist> {
        let Some(open) = &mut self.open_batch else {
            return Some(req);
        };
        let mut pods = open.pods.borrow_mut();
        if let Some(again) = pods.get_mut(&req.uid) {
            match again {
                Some(kept) => merge(kept, req, &self.deps.metrics),
                None => *again = Some(req),
            }
            return None;
        }
        let uid = req.uid.clone();
        match open.more.send(Taken::new(req)) {
            Ok(()) => {
                pods.insert(uid, None);
                open.taken += 1;
                None
            }
            Err(e) => Some(e.0.tag.req),
        }
    }

    /// The batch's debug line, and one per pod it relisted (each under its budget).
    fn log_batch(&mut self, summary: &BatchSummary) {
        let now = Instant::now();
        let took_ms = summary.took.as_secs_f64() * 1e3;
        for pod in &summary.pods_detail {
            let Some(suppressed) = self.logs.pod.allow(now) else {
                continue;
            };
            let waited_ms = pod.waited.as_secs_f64() * 1e3;
            let took_ms = pod.took.as_secs_f64() * 1e3;
            match &pod.error {
                None => tracing::debug!(
                    pod = %pod.uid,
                    source = %pod.source,
                    waited_ms,
                    took_ms,
                    events = pod.events,
                    suppressed,
                    "targeted relist"
                ),
                Some(error) => tracing::debug!(
                    pod = %pod.uid,
                    source = %pod.source,
                    waited_ms,
                    took_ms,
                    error = %error,
                    suppressed,
                    "targeted relist failed"
                ),
            }
        }
        if let Some(suppressed) = self.logs.unit.allow(now) {
            tracing::debug!(
                pods = summary.pods,
                events = summary.events,
                early_deaths = summary.early,
                failed = summary.failed,
                took_ms,
                max_waited_ms = summary.max_waited.as_secs_f64() * 1e3,
                still_pending = self.pending.len(),
                suppressed,
                "targeted relist batch"
            );
        }
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

impl Actor for RelistDispatcher {
    type Context = Context<Self>;

    /// The dispatcher stops itself only with no unit of work in progress and nothing
    /// pending; but actix hands it the mailbox once more before it stops, and a
    /// request taken off then runs first.
    fn stopping(&mut self, ctx: &mut Self::Context) -> Running {
        self.drain(ctx);
        if self.core.is_none() || !self.pending.is_empty() {
            if self.core.is_some() {
                self.schedule_batch(ctx);
            }
            return Running::Continue;
        }
        Running::Stop
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        // Requests that passed the queue's check as it closed: dropped, counted.
        for req in self.inbox.take(&self.deps.metrics) {
            self.deps
                .metrics
                .count_request(RequestResult::Dropped, req.source);
        }
        self.deps.metrics.queue_depth.set(0);
        self.deps.metrics.relist_pending.set(0);
    }

    fn started(&mut self, ctx: &mut Self::Context) {
        self.schedule_tick(ctx);
    }
}

impl Handler<Wake> for RelistDispatcher {
    type Result = ();

    /// Drains the inbox once the mailbox is handled: one drain per [`Wake`], and no
    /// [`Wake`] until the inbox is taken, so requests never hold the mailbox.
    fn handle(&mut self, _: Wake, ctx: &mut Self::Context) {
        if self.drain_scheduled {
            return;
        }
        self.drain_scheduled = true;
        ctx.spawn(fut::ready(()).map(|(), act: &mut Self, ctx| {
            act.drain_scheduled = false;
            act.drain(ctx);
        }));
    }
}

impl Handler<Stop> for RelistDispatcher {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Self::Context) {
        self.stopping.store(true, Ordering::SeqCst);
        self.wind_down(ctx);
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

/// Test only: batches take no request while they run (tests of the pending requests).
#[cfg(test)]
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct NoAdmission;

#[cfg(test)]
impl Handler<NoAdmission> for RelistDispatcher {
    type Result = ();

    fn handle(&mut self, _: NoAdmission, _: &mut Self::Context) {
        self.admission = false;
    }
}

impl Handler<BringForward> for RelistDispatcher {
    type Result = ();

    fn handle(&mut self, _: BringForward, ctx: &mut Self::Context) {
        if self.wind_down(ctx) {
            return;
        }
        if self.schedule.bring_forward(Instant::now()) {
            self.priority
                .set(self.global_running, self.schedule.next_due());
            self.schedule_tick(ctx);
        }
    }
}
