//! StreamWatcher: one long-lived CRI GetContainerEvents stream, used only as a hint
//! (KEP-3386). Its connection is the pure state machine of machine.rs; this actor only
//! performs the machine's actions (the RPC, the stream, the retry timer, metrics,
//! spans, logs) and feeds back what happened, each stream item tagged with its attempt.
//!
//! For each event (hint.rs): require pod_sandbox_status, its metadata and a non-empty
//! UID (else count it invalid, log rate-limited, ignore); record created_at-to-receipt
//! latency; for CONTAINER_STOPPED_EVENT only — any exit code, with or without container
//! statuses — request a relist of the pod (source evented_pleg). The payload is never
//! stored. The stream is drained promptly: requests never wait (containerd 2.x blocks
//! its dispatcher on a subscriber that stops reading).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures::StreamExt as _;
use opentelemetry::trace::Span as _;
use opentelemetry::KeyValue;
use plegd_runtime::cri::ContainerEventResponse;
use plegd_telemetry::logging::RateLimiter;
use plegd_telemetry::{Metrics, StreamEventType};

use crate::event::RelistSource;
use crate::relist::router::RelistRouter;
use crate::spans;
use crate::stream::hint::{self, Hint};
use crate::stream::machine::{Action, Input, LogLine, Machine};
use crate::stream::reconnect::{AttemptEnd, ReconnectPolicy};
use plegd_runtime::{now_ns, EventStream, RuntimeClient, RuntimeError};

/// Counts the watcher's live futures (RPC, stream, retry timer): each holds a
/// [`Live`] token, dropped with it, so a future cancelled but never dropped shows.
#[derive(Clone, Default)]
struct LiveFutures(Arc<AtomicUsize>);

struct Live(Arc<AtomicUsize>);

impl LiveFutures {
    fn token(&self) -> Live {
        self.0.fetch_add(1, Ordering::Relaxed);
        Live(self.0.clone())
    }

    fn count(&self) -> usize {
        self.0.load(Ordering::Relaxed)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Performs [`Action::BringGlobalRelistForward`]: plegd asks the dispatcher for the next
/// global relist now (events around a reconnect may be lost).
pub type ReconnectHook = Box<dyn Fn() + 'static>;

/// One item of the stream opened by `attempt`; `item` None marks its end (EOF or a
/// clean close), so even the end says which stream it belongs to.
pub struct StreamItem {
    attempt: u64,
    item: Option<Result<ContainerEventResponse, RuntimeError>>,
}

pub struct StreamWatcher {
    runtime: Arc<dyn RuntimeClient>,
    router: RelistRouter,
    metrics: Arc<Metrics>,
    machine: Machine,
    /// The attempt, stream or retry timer the machine last started: what
    /// [`Action::Cancel`] cancels (the machine has at most one running).
    running: Option<SpawnHandle>,
    on_reconnect: Option<ReconnectHook>,
    error_log: RateLimiter,
    invalid_log: RateLimiter,
    open_log: RateLimiter,
    live: LiveFutures,
}

impl StreamWatcher {
    pub fn new(
        runtime: Arc<dyn RuntimeClient>,
        router: RelistRouter,
        metrics: Arc<Metrics>,
        policy: ReconnectPolicy,
        on_reconnect: Option<ReconnectHook>,
    ) -> Self {
        StreamWatcher {
            runtime,
            router,
            metrics,
            machine: Machine::new(policy),
            running: None,
            on_reconnect,
            error_log: RateLimiter::new(Duration::from_secs(30)),
            invalid_log: RateLimiter::new(Duration::from_secs(30)),
            open_log: RateLimiter::new(Duration::from_secs(30)),
            live: LiveFutures::default(),
        }
    }

    /// Steps the machine and performs its actions; `stream` is the one an
    /// [`Input::Opened`] brings (dropped unless the machine reads it).
    fn input(&mut self, input: Input, stream: Option<EventStream>, ctx: &mut Context<Self>) {
        let now = Instant::now();
        let mut stream = stream;
        for action in self.machine.step(input, now) {
            self.perform(action, &mut stream, now, ctx);
        }
    }

    fn perform(
        &mut self,
        action: Action,
        stream: &mut Option<EventStream>,
        now: Instant,
        ctx: &mut Context<Self>,
    ) {
        match action {
            Action::OpenStream { attempt } => self.open(attempt, ctx),
            // Only an Opened input, which always brings its stream, leads here.
            Action::ReadStream { attempt } => {
                if let Some(stream) = stream.take() {
                    let live = self.live.token();
                    let tagged = stream
                        .map(move |item| StreamItem {
                            attempt,
                            item: Some(item),
                        })
                        .chain(futures::stream::once(async move {
                            drop(live);
                            StreamItem {
                                attempt,
                                item: None,
                            }
                        }));
                    self.running = Some(ctx.add_stream(tagged));
                }
            }
            Action::Cancel => {
                if let Some(handle) = self.running.take() {
                    ctx.cancel_future(handle);
                }
            }
            Action::ScheduleRetry(delay) => {
                let live = self.live.token();
                self.running = Some(ctx.run_later(delay, move |act, ctx| {
                    drop(live);
                    act.input(Input::TimerFired, None, ctx)
                }));
            }
            Action::BringGlobalRelistForward => {
                if let Some(hook) = &self.on_reconnect {
                    hook();
                }
            }
            Action::CountReconnectAttempt => self.metrics.reconnect_attempts.inc(),
            Action::CountConnectionSuccess => self.metrics.connection_successes.inc(),
            Action::CountConnectionError => self.metrics.connection_errors.inc(),
            Action::SetConnected(up) => self.metrics.stream_connected.set(i64::from(up)),
            Action::Log(LogLine::Opened { attempt }) => {
                if let Some(suppressed) = self.open_log.allow(now) {
                    tracing::info!(attempt, suppressed, "CRI event stream open");
                } else {
                    tracing::debug!(attempt, "CRI event stream open");
                }
            }
            Action::Log(LogLine::Unavailable { reason, retry_in }) => {
                if let Some(suppressed) = self.error_log.allow(now) {
                    tracing::warn!(
                        reason,
                        ?retry_in,
                        suppressed,
                        "CRI event stream unavailable; global relists continue"
                    );
                }
            }
            Action::StopActor => ctx.stop(),
        }
    }

    /// Calls GetContainerEvents without a deadline (containerd sends no headers before
    /// the first event); the attempt's span ends with its outcome, or when cancelled.
    fn open(&mut self, attempt: u64, ctx: &mut Context<Self>) {
        let mut span = spans::start(
            spans::STREAM_CONNECT,
            vec![KeyValue::new(
                "attempt",
                i64::try_from(attempt).unwrap_or(i64::MAX),
            )],
            None,
        );
        let runtime = self.runtime.clone();
        let live = self.live.token();
        let call = async move {
            let _live = live;
            let res = runtime.container_events().await;
            match &res {
                Ok(_) => {
                    span.set_attribute(KeyValue::new("outcome", "open"));
                    span.end();
                }
                Err(e) => spans::end_error(span, e.to_string()),
            }
            res
        };
        let handle = ctx.spawn(call.into_actor(self).map(move |res, act, ctx| match res {
            Ok(stream) => act.input(Input::Opened { attempt }, Some(stream), ctx),
            Err(e) => {
                let (end, reason) = (end_of(&e), e.to_string());
                let failed = Input::AttemptFailed {
                    attempt,
                    end,
                    reason,
                };
                act.input(failed, None, ctx)
            }
        }));
        self.running = Some(handle);
    }

    fn event(&mut self, ev: &ContainerEventResponse) {
        let now = Instant::now();
        let (uid, kind, relist) = match hint::read(ev) {
            Hint::Invalid { deleted } => {
                self.metrics.count_stream_event(StreamEventType::Invalid);
                if deleted {
                    tracing::debug!(container = %ev.container_id, "ignoring a DELETED event without pod sandbox status");
                } else if let Some(suppressed) = self.invalid_log.allow(now) {
                    tracing::info!(
                        container = %ev.container_id,
                        suppressed,
                        "ignoring a CRI event without pod sandbox status, metadata or UID"
                    );
                }
                return;
            }
            Hint::Valid { uid, kind, relist } => (uid, kind, relist),
        };
        if let Some(started) = self.machine.attempt_started() {
            let age = now.saturating_duration_since(started);
            if let Some(latency) = hint::latency(ev.created_at, now_ns(), age) {
                self.metrics
                    .connection_latency
                    .observe(latency.as_secs_f64());
            }
        }
        self.metrics.count_stream_event(kind);
        if relist {
            let mut span = spans::start(
                spans::STOP_EVENT,
                vec![
                    KeyValue::new("pod.uid", uid.to_string()),
                    KeyValue::new("container.id", ev.container_id.clone()),
                ],
                None,
            );
            let cause = span.span_context().clone();
            span.end();
            self.router
                .request(uid, RelistSource::EventedPleg, Some(cause));
        }
    }
}

/// Unimplemented waits the cap (the runtime may be upgraded later); anything else
/// backs off. Transport failures arrive as Unknown as often as Unavailable.
fn end_of(e: &RuntimeError) -> AttemptEnd {
    if e.code() == tonic::Code::Unimplemented {
        AttemptEnd::Unimplemented
    } else {
        AttemptEnd::Failed
    }
}

impl Actor for StreamWatcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(16);
        self.input(Input::Start, None, ctx);
    }

    /// However the actor stops (a [`Stop`], the system shutting down), the machine
    /// stops too: the RPC, stream or timer is cancelled and the gauge reads 0.
    fn stopped(&mut self, ctx: &mut Self::Context) {
        self.input(Input::Stop, None, ctx);
    }
}

impl StreamHandler<StreamItem> for StreamWatcher {
    fn handle(&mut self, StreamItem { attempt, item }: StreamItem, ctx: &mut Self::Context) {
        let input = match item {
            Some(Ok(ev)) => return self.event(&ev),
            // The machine counts only the first error or end of the current stream.
            Some(Err(e)) => Input::StreamError {
                attempt,
                end: end_of(&e),
                reason: e.to_string(),
            },
            None => Input::StreamEnded { attempt },
        };
        self.input(input, None, ctx);
    }

    fn started(&mut self, _: &mut Self::Context) {}

    /// The stream's last item already reported its end; the default would stop the
    /// actor.
    fn finished(&mut self, _: &mut Self::Context) {}
}

/// Stops the watcher: cancels the RPC, the stream and any retry timer.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Stop;

impl Handler<Stop> for StreamWatcher {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Self::Context) {
        self.input(Input::Stop, None, ctx);
    }
}

/// What the watcher is doing: for tests, and for a future debug endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatcherState {
    pub state: &'static str,
    pub attempts: u64,
    /// The reconnect delay chosen after the last failure.
    pub last_delay: Option<Duration>,
    /// Futures alive in the watcher (connection attempt, open stream, retry timer):
    /// one at most, whatever happened before.
    pub live_futures: usize,
}

/// Reports the watcher's [`WatcherState`].
#[derive(Message)]
#[rtype(result = "WatcherState")]
pub struct GetState;

impl Handler<GetState> for StreamWatcher {
    type Result = MessageResult<GetState>;

    fn handle(&mut self, _: GetState, _: &mut Self::Context) -> Self::Result {
        MessageResult(WatcherState {
            state: self.machine.state_name(),
            attempts: self.machine.attempts(),
            last_delay: self.machine.last_delay(),
            live_futures: self.live.count(),
        })
    }
}
