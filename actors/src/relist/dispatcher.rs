//! RelistDispatcher: the Generic PLEG as one actor, so global and targeted relists are
//! serialized and race-free (KEP-3386 "Design Details"). What to do when is the
//! [`Machine`]'s (`machine` module docs: the rules); this actor feeds it what happens
//! and performs its actions.
//!
//! - Requests reach it through the [`Inbox`] behind the [`RelistQueue`]: a [`Wake`]
//!   in the mailbox (one per drain) has the actor take the inbox whole once the
//!   mailbox is handled, so no rate of requests keeps the actor in its mailbox (actix
//!   handles messages until none is left before it polls spawned units and timers).
//! - A unit of work (`global`: a global relist; `batch`: a batch of targeted relists)
//!   takes the Generic PLEG, runs as a spawned future (the inbox keeps being drained
//!   meanwhile) and puts it back when it ends. A batch reports each pod it read; the
//!   requests it may take while it runs reach it through its own channel, closed when
//!   the machine says it has nothing left to read. Either unit takes the containers
//!   to read beside it the same way.
//! - Each relist's output is applied by `apply`: revisions, then the cache
//!   (acknowledged), then the events.
//! - Stop: the queue refuses new requests at once (dropped, counted); the unit in
//!   progress finishes; every request accepted is relisted; then the actor stops.
//! - Debug lines (to follow a relist's latency without traces): one per global
//!   relist, one per batch, one per pod a batch relisted, each kind under a
//!   `RateLimiter::for_event_lines`; the first line after suppressed ones counts them.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use plegd_telemetry::logging::RateLimiter;
use tokio::sync::mpsc::{unbounded_channel, UnboundedSender};

pub(crate) use super::apply::DispatcherDeps;
use super::batch::{targeted_relists, Batch, BatchSummary, Taken};
use super::global::global_relist;
use super::machine::{Action, Input, Machine, Rules};
use crate::pleg::{BesideAsk, GenericPleg};
use crate::queue::BringForward;
use crate::queue::{GlobalPriority, Inbox, RelistQueue, RequestRelist, Wake};
use crate::stop::Stop;

#[derive(Clone, Debug)]
pub struct DispatcherConfig {
    pub relist_period: Duration,
    /// The bound of the on-demand queue.
    pub queue_capacity: usize,
    /// Batches take requests while they run (see [`Rules::admission`]).
    pub admission: bool,
}

pub struct RelistDispatcher {
    machine: Machine,
    /// Taken by the unit of work in progress, put back when it ends.
    core: Option<GenericPleg>,
    deps: DispatcherDeps,
    /// Set by [`StopHandle::stop`] (and read by the queue, which then refuses).
    stopping: Arc<AtomicBool>,
    /// Where request sources put their requests; taken whole on each [`Wake`].
    inbox: Arc<Inbox>,
    /// A drain of the inbox is scheduled (after the mailbox).
    drain_scheduled: bool,
    /// Tells hint sources when a global relist is due or running (they wait then, but
    /// for the few items a running one hears).
    priority: GlobalPriority,
    timer: Option<SpawnHandle>,
    /// Where the batch in progress takes more requests (dropped: it takes no more).
    batch_input: Option<UnboundedSender<Taken>>,
    /// Where the unit in progress takes containers to read beside it.
    beside: Option<UnboundedSender<BesideAsk>>,
    logs: Logs,
}

/// The dispatcher's log lines, each kind under its own budget.
struct Logs {
    /// One per global relist or batch.
    unit: RateLimiter,
    /// One per pod a batch relisted.
    pod: RateLimiter,
    /// A request dropped because too many pods wait (a warning).
    pending_full: RateLimiter,
    /// A global relist failed (a warning).
    list_errors: RateLimiter,
}

/// The dispatcher's mailbox: [`Wake`] (one at a time), [`BringForward`], [`Stop`].
const MAILBOX: usize = 64;

/// Sends [`Stop`] to the dispatcher: sets a flag the actor checks before anything it
/// does (and the queue, which then refuses new requests), then nudges the mailbox
/// (which may be full: the queued messages then lead to the flag).
#[derive(Clone)]
pub struct StopHandle {
    addr: Addr<RelistDispatcher>,
    flag: Arc<AtomicBool>,
}

impl StopHandle {
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
        ctx.set_mailbox_capacity(MAILBOX);
        let inbox = Inbox::new(cfg.queue_capacity.max(1));
        let machine = Machine::new(
            Rules {
                relist_period: cfg.relist_period,
                queue_capacity: cfg.queue_capacity,
                admission: cfg.admission,
            },
            core.pod_count(),
            Instant::now(),
        );
        let priority = GlobalPriority::default();
        priority.set(false, false, machine.next_due());
        let actor = RelistDispatcher {
            machine,
            core: Some(core),
            deps,
            stopping: stopping.clone(),
            inbox: inbox.clone(),
            drain_scheduled: false,
            priority: priority.clone(),
            timer: None,
            batch_input: None,
            beside: None,
            logs: Logs {
                unit: RateLimiter::for_event_lines(),
                pod: RateLimiter::for_event_lines(),
                pending_full: RateLimiter::new(Duration::from_secs(30)),
                list_errors: RateLimiter::new(Duration::from_secs(30)),
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

    /// Feeds the machine one input (a stop asked through the flag first) and performs
    /// what it says.
    fn step(&mut self, input: Input, ctx: &mut Context<Self>) {
        if self.stopping.load(Ordering::SeqCst) && !self.machine.stopping() {
            self.step_only(Input::Stop, ctx);
        }
        self.step_only(input, ctx);
    }

    fn step_only(&mut self, input: Input, ctx: &mut Context<Self>) {
        let held = self.deps.held.clone();
        let actions = self
            .machine
            .step(input, Instant::now(), &|uid| held.coalesce(uid));
        for action in actions {
            self.perform(action, ctx);
        }
    }

    fn perform(&mut self, action: Action, ctx: &mut Context<Self>) {
        let metrics = &self.deps.metrics;
        match action {
            Action::StartGlobal => self.global(ctx),
            Action::StartBatch { batch, requests } => self.batch(batch, requests, ctx),
            Action::Admit(req) => {
                let sent = self
                    .batch_input
                    .as_ref()
                    .is_some_and(|input| input.send(Taken::new(req)).is_ok());
                if !sent {
                    // Cannot happen: the batch takes requests until the machine closes it.
                    tracing::error!("no batch takes a request admitted; it is lost");
                }
            }
            Action::CloseBatch => self.batch_input = None,
            Action::ScheduleRun => {
                // After every message now in the mailbox, so that they join the batch.
                ctx.spawn(fut::ready(()).map(|(), act: &mut Self, ctx| {
                    act.drain(ctx);
                    act.step(Input::Run, ctx);
                }));
            }
            Action::ArmTimer(at) => self.arm_timer(at, ctx),
            Action::SetPriority {
                running,
                hearing,
                next_due,
            } => self.priority.set(running, hearing, next_due),
            Action::ReadBeside(ask) => {
                if let Some(asks) = &self.beside {
                    // Refused only once the relist has ended: the request still waits.
                    let _ = asks.send(ask);
                }
            }
            Action::Count(result, source) => metrics.count_request(result, source),
            Action::SetPending(n) => metrics.relist_pending.set(n as i64),
            Action::ObserveInterval(d) => metrics.relist_interval.observe(d.as_secs_f64()),
            Action::PendingFull { pending } => {
                if let Some(suppressed) = self.logs.pending_full.allow(Instant::now()) {
                    tracing::warn!(
                        pending,
                        suppressed,
                        "more pods wait for a targeted relist than plegd knows; request \
                         dropped (the next global relist reconciles)"
                    );
                }
            }
            Action::StopActor => ctx.stop(),
        }
    }

    /// (Re-)arms the timer for `at`.
    fn arm_timer(&mut self, at: Instant, ctx: &mut Context<Self>) {
        if let Some(h) = self.timer.take() {
            ctx.cancel_future(h);
        }
        let delay = at.saturating_duration_since(Instant::now());
        self.timer = Some(ctx.run_later(delay, |act, ctx| {
            act.timer = None;
            act.drain(ctx);
            act.step(Input::Tick, ctx);
        }));
    }

    /// Takes every request from the inbox (at most its capacity: the work between
    /// two looks at the schedule is bounded whatever the rate of requests).
    fn drain(&mut self, ctx: &mut Context<Self>) {
        for req in self.inbox.take(&self.deps.metrics) {
            self.step(Input::Request(req), ctx);
        }
    }

    fn take_core(&mut self) -> Option<GenericPleg> {
        let core = self.core.take();
        if core.is_none() {
            // Cannot happen: the machine starts a unit only when none runs.
            tracing::error!("relist requested while another is in progress");
        }
        core
    }

    /// A global relist.
    fn global(&mut self, ctx: &mut Context<Self>) {
        let Some(mut core) = self.take_core() else {
            return;
        };
        let deps = self.deps.clone();
        let (asks, mut beside) = unbounded_channel();
        self.beside = Some(asks);
        let fut = async move {
            let (start, result) = global_relist(&mut core, &deps, &mut beside).await;
            (core, start, result)
        };
        ctx.spawn(
            fut.into_actor(self)
                .map(move |(core, start, result), act, ctx| {
                    act.beside = None;
                    let known_pods = core.pod_count();
                    act.core = Some(core);
                    let not_read = match result {
                        Ok((not_read, summary)) => {
                            if let Some(suppressed) = act.logs.unit.allow(Instant::now()) {
                                tracing::debug!(
                                    pods_inspected = summary.pods_inspected,
                                    events = summary.events,
                                    early_deaths = summary.early,
                                    asked_beside = summary.beside.asked,
                                    read_beside = summary.beside.answered,
                                    status_errors = summary.status_errors,
                                    took_ms = summary.took.as_secs_f64() * 1e3,
                                    pending = act.machine.pending(),
                                    suppressed,
                                    "global relist"
                                );
                            }
                            Some(not_read)
                        }
                        Err(e) => {
                            if let Some(suppressed) = act.logs.list_errors.allow(Instant::now()) {
                                tracing::warn!(error = %e, suppressed, "global relist failed");
                            }
                            None::<HashSet<String>>
                        }
                    };
                    act.step(
                        Input::GlobalEnded {
                            start,
                            not_read,
                            known_pods,
                        },
                        ctx,
                    );
                }),
        );
    }

    /// A batch of targeted relists, numbered `number`; the pods it reads are reported
    /// to the machine as they are.
    fn batch(&mut self, number: u64, reqs: Vec<RequestRelist>, ctx: &mut Context<Self>) {
        let Some(mut core) = self.take_core() else {
            return;
        };
        let deps = self.deps.clone();
        let detail = tracing::enabled!(tracing::Level::DEBUG);
        let (input, more) = unbounded_channel();
        self.batch_input = Some(input);
        let (asks, beside) = unbounded_channel();
        self.beside = Some(asks);
        let (read, reads) = futures::channel::mpsc::unbounded();
        ctx.spawn(
            fut::wrap_stream::<_, Self>(reads)
                .map(move |uid, act, ctx| act.step(Input::PodRead { batch: number, uid }, ctx))
                .finish(),
        );
        let batch = Batch {
            reqs,
            priority: self.priority.clone(),
            more,
            beside,
            read,
        };
        let fut = async move {
            let summary = targeted_relists(&mut core, &deps, batch, detail).await;
            (core, summary)
        };
        ctx.spawn(
            fut.into_actor(self)
                .map(move |(core, mut summary), act, ctx| {
                    act.batch_input = None;
                    act.beside = None;
                    let known_pods = core.pod_count();
                    act.core = Some(core);
                    let deferred = std::mem::take(&mut summary.deferred);
                    act.log_batch(&summary);
                    act.step(
                        Input::BatchEnded {
                            batch: number,
                            deferred,
                            known_pods,
                        },
                        ctx,
                    );
                }),
        );
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
                still_pending = self.machine.pending(),
                suppressed,
                "targeted relist batch"
            );
        }
    }
}

impl Actor for RelistDispatcher {
    type Context = Context<Self>;

    /// The dispatcher stops itself only with no unit of work in progress and nothing
    /// pending; but actix hands it the mailbox once more before it stops, and a
    /// request taken off then runs first.
    fn stopping(&mut self, ctx: &mut Self::Context) -> Running {
        self.drain(ctx);
        self.step(Input::ActorStopping, ctx);
        if self.machine.idle() {
            Running::Stop
        } else {
            Running::Continue
        }
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        // Requests that passed the queue's check as it closed: dropped, counted.
        for req in self.inbox.take(&self.deps.metrics) {
            self.deps
                .metrics
                .count_request(plegd_telemetry::RequestResult::Dropped, req.source);
        }
        self.deps.metrics.queue_depth.set(0);
        self.deps.metrics.relist_pending.set(0);
    }

    fn started(&mut self, ctx: &mut Self::Context) {
        self.step(Input::Start, ctx);
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

/// Stopping waits for the unit of work in progress and the requests accepted.
impl Handler<Stop> for RelistDispatcher {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Self::Context) {
        self.stopping.store(true, Ordering::SeqCst);
        self.step_only(Input::Stop, ctx);
    }
}

impl Handler<BringForward> for RelistDispatcher {
    type Result = ();

    fn handle(&mut self, _: BringForward, ctx: &mut Self::Context) {
        self.step(Input::BringForward, ctx);
    }
}
