//! RelistDispatcher: the Generic PLEG as one actor, so global and targeted relists are
//! serialized and race-free (KEP-3386 "Design Details").
//!
//! - A global relist runs every `relist_period`, whatever the event stream does.
//! - Its bounded mailbox is the on-demand queue: [`RelistQueue::request`] uses
//!   `try_send`; a full mailbox drops the request (counted) — the next global relist
//!   reconciles anyway. (actix's real bound is capacity + number of sender handles.)
//! - Order of work: shutdown, then a due global relist, then targeted relists: a
//!   relist runs inside `ctx.wait`, which holds the mailbox, and every unit of work
//!   first runs a due global relist, so a storm of targeted requests delays a global
//!   relist by at most one targeted relist.
//! - A targeted request enqueued before the start of a global relist that has since
//!   completed is skipped (that relist already saw the pod).
//! - Each relist's cache updates are applied (and acknowledged) before its events are
//!   published.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix::prelude::*;
use opentelemetry::trace::{Span as _, SpanContext};
use opentelemetry::KeyValue;
use plegd_telemetry::logging::RateLimiter;
use plegd_telemetry::{Metrics, RelistPhase, RequestResult};

use super::queue::RelistQueue;
use crate::cache::{ApplyRelist, CacheOwner};
use crate::event::RelistSource;
use crate::health::Health;
use crate::pleg::{GenericPleg, RelistOutput, RelistScope};
use crate::publisher::{EventPublisher, Publish};
use crate::spans;
use crate::sync::suspended::SuspendedPods;

#[derive(Clone, Debug)]
pub struct DispatcherConfig {
    pub relist_period: Duration,
    /// Mailbox capacity: the bound of the on-demand queue.
    pub queue_capacity: usize,
}

/// Everything a relist needs besides the Generic PLEG state; cloned into each unit
/// of work (the work runs as a future outside `&mut self`).
#[derive(Clone)]
struct Deps {
    cache: Addr<CacheOwner>,
    publisher: Addr<EventPublisher>,
    metrics: Arc<Metrics>,
    health: Health,
    suspended: SuspendedPods,
}

pub struct RelistDispatcher {
    /// Taken by the unit of work in progress, put back when it ends.
    core: Option<GenericPleg>,
    deps: Deps,
    cfg: DispatcherConfig,
    stopping: Arc<AtomicBool>,
    next_global: Instant,
    last_global_start: Option<Instant>,
    /// Start of the last global relist that completed successfully.
    covered_until: Option<Instant>,
    timer: Option<SpawnHandle>,
    list_errors: RateLimiter,
    /// Start of the last brought-forward global relist that succeeded.
    last_forced: Option<Instant>,
    /// The next global relist was brought forward.
    forced_pending: bool,
}

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
pub struct RelistSoon;

/// Stops the dispatcher: sets a flag every unit of work checks first, then nudges the
/// mailbox (which may be full: queued messages then see the flag).
#[derive(Clone)]
pub struct Stopper {
    addr: Addr<RelistDispatcher>,
    flag: Arc<AtomicBool>,
}

impl Stopper {
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
    pub stopper: Stopper,
}

impl RelistDispatcher {
    /// Starts the dispatcher on the current arbiter with its bounded mailbox.
    pub fn start(
        core: GenericPleg,
        cfg: DispatcherConfig,
        cache: Addr<CacheOwner>,
        publisher: Addr<EventPublisher>,
        metrics: Arc<Metrics>,
        health: Health,
        suspended: SuspendedPods,
    ) -> DispatcherHandle {
        let stopping = Arc::new(AtomicBool::new(false));
        let mut ctx = Context::new();
        ctx.set_mailbox_capacity(cfg.queue_capacity.max(1));
        let actor = RelistDispatcher {
            core: Some(core),
            deps: Deps {
                cache,
                publisher,
                metrics: metrics.clone(),
                health,
                suspended,
            },
            cfg,
            stopping: stopping.clone(),
            next_global: Instant::now(),
            last_global_start: None,
            covered_until: None,
            timer: None,
            list_errors: RateLimiter::new(Duration::from_secs(30)),
            last_forced: None,
            forced_pending: false,
        };
        let addr = ctx.run(actor);
        DispatcherHandle {
            queue: RelistQueue::new(addr.clone().recipient(), addr.clone().recipient(), metrics),
            stopper: Stopper {
                addr,
                flag: stopping,
            },
        }
    }

    fn schedule_tick(&mut self, ctx: &mut Context<Self>) {
        if let Some(h) = self.timer.take() {
            ctx.cancel_future(h);
        }
        let delay = self.next_global.saturating_duration_since(Instant::now());
        self.timer = Some(ctx.run_later(delay, |act, ctx| {
            act.timer = None;
            if act.stop_if_asked(ctx) {
                return;
            }
            if Instant::now() >= act.next_global {
                act.run(ctx, None);
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

    /// One unit of work: a due global relist, then the targeted request if any.
    fn run(&mut self, ctx: &mut Context<Self>, targeted: Option<RequestRelist>) {
        let Some(mut core) = self.core.take() else {
            // Cannot happen: work runs under ctx.wait, one unit at a time.
            tracing::error!("relist requested while another is in progress");
            return;
        };
        let global_due = Instant::now() >= self.next_global;
        let deps = self.deps.clone();
        let fut = async move {
            let global = if global_due {
                Some(global_relist(&mut core, &deps).await)
            } else {
                None
            };
            if let Some(req) = targeted {
                let covered = matches!(global, Some((start, Ok(()))) if req.enqueued_at < start);
                // A global relist does not cover a pod a sync holds (it skipped it).
                if covered && deps.suspended.coalesce(&req.uid) {
                    deps.metrics
                        .count_request(RequestResult::Coalesced, req.source);
                } else if covered {
                    deps.metrics
                        .count_request(RequestResult::Skipped, req.source);
                } else {
                    targeted_relist(&mut core, &deps, &req).await;
                }
            }
            (core, global)
        };
        ctx.wait(fut.into_actor(self).map(|(core, global), act, ctx| {
            act.core = Some(core);
            if let Some((start, result)) = global {
                if let Some(prev) = act.last_global_start {
                    act.deps
                        .metrics
                        .relist_interval
                        .observe(start.duration_since(prev).as_secs_f64());
                }
                act.last_global_start = Some(start);
                act.next_global = start + act.cfg.relist_period;
                let forced = std::mem::take(&mut act.forced_pending);
                match result {
                    Ok(()) => {
                        act.covered_until = Some(start);
                        // Only a forced relist that worked uses up the period's one.
                        if forced {
                            act.last_forced = Some(start);
                        }
                    }
                    Err(e) => {
                        if let Some(suppressed) = act.list_errors.allow(Instant::now()) {
                            tracing::warn!(error = %e, suppressed, "global relist failed");
                        }
                    }
                }
            }
            if !act.stop_if_asked(ctx) {
                act.schedule_tick(ctx);
            }
        }));
    }
}

/// Applies a relist's output: cache first (acknowledged), then events.
async fn apply(deps: &Deps, out: RelistOutput, global_timestamp: Option<SystemTime>) {
    if out.status_errors > 0 {
        deps.metrics
            .count_relist_errors(RelistPhase::Status, out.status_errors as u64);
    }
    if deps
        .cache
        .send(ApplyRelist {
            updates: out.cache,
            held: if global_timestamp.is_some() {
                out.skipped
            } else {
                Vec::new()
            },
            global_timestamp,
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

async fn global_relist(
    core: &mut GenericPleg,
    deps: &Deps,
) -> (Instant, Result<(), plegd_runtime::RuntimeError>) {
    let start = Instant::now();
    let started_wall = SystemTime::now();
    let mut span = spans::start(spans::GLOBAL_RELIST, vec![], None);
    let suspended = deps.suspended.clone();
    let result = core
        .relist(&RelistScope::Global, &|uid| suspended.contains(uid))
        .await;
    let result = match result {
        Ok(out) => {
            span.set_attributes([
                KeyValue::new("pods_inspected", out.pods_inspected as i64),
                KeyValue::new("events", out.events.len() as i64),
                KeyValue::new("status_errors", out.status_errors as i64),
            ]);
            span.end();
            apply(deps, out, Some(started_wall)).await;
            deps.health.relist_succeeded(Instant::now());
            if let Ok(d) = SystemTime::now().duration_since(UNIX_EPOCH) {
                deps.metrics.last_seen.set(d.as_secs_f64());
            }
            Ok(())
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

async fn targeted_relist(core: &mut GenericPleg, deps: &Deps, req: &RequestRelist) {
    // Enqueued before a sync took the pod: it becomes the gate's pending relist.
    if deps.suspended.coalesce(&req.uid) {
        deps.metrics
            .count_request(RequestResult::Coalesced, req.source);
        return;
    }
    let start = Instant::now();
    let mut span = spans::start(
        spans::TARGETED_RELIST,
        vec![
            KeyValue::new("relist_source", req.source.as_str()),
            KeyValue::new("pod.uid", req.uid.clone()),
        ],
        req.cause.as_ref(),
    );
    let suspended = deps.suspended.clone();
    let scope = RelistScope::Pod {
        uid: req.uid.clone(),
        source: req.source,
    };
    // A sync that takes the pod meanwhile gets this request as its pending relist.
    match core.relist(&scope, &|uid| suspended.coalesce(uid)).await {
        Ok(out) => {
            span.set_attribute(KeyValue::new("events", out.events.len() as i64));
            span.end();
            apply(deps, out, None).await
        }
        Err(e) => {
            deps.metrics.count_relist_errors(RelistPhase::List, 1);
            tracing::debug!(pod = %req.uid, error = %e, "targeted relist failed");
            spans::end_error(span, e.to_string());
        }
    }
    deps.metrics
        .observe_pod_relist(req.source, start.elapsed().as_secs_f64());
    deps.metrics.count_request(RequestResult::Done, req.source);
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
        if self.covered_until.is_some_and(|c| msg.enqueued_at < c) {
            // A global relist does not cover a pod a sync holds (it skipped it).
            let held = self.deps.suspended.coalesce(&msg.uid);
            self.deps.metrics.count_request(
                if held {
                    RequestResult::Coalesced
                } else {
                    RequestResult::Skipped
                },
                msg.source,
            );
            return;
        }
        self.run(ctx, Some(msg));
    }
}

impl Handler<Stop> for RelistDispatcher {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

impl Handler<RelistSoon> for RelistDispatcher {
    type Result = ();

    fn handle(&mut self, _: RelistSoon, ctx: &mut Self::Context) {
        if self.stop_if_asked(ctx) {
            return;
        }
        let now = Instant::now();
        if self
            .last_forced
            .is_some_and(|t| now.duration_since(t) < self.cfg.relist_period)
        {
            return;
        }
        if self.next_global > now {
            self.forced_pending = true;
            self.next_global = now;
            self.schedule_tick(ctx);
        }
    }
}
