//! StreamWatcher: one long-lived CRI GetContainerEvents stream, used only as a hint.
//!
//! States (one at a time, every reconnect a transition):
//!
//! ```text
//!   Connecting ──open──> Streaming ──error / EOF / clean close──> Waiting
//!       │                                                           │
//!       └──────────────error (incl. Unimplemented)──────> Waiting ──timer──> Connecting
//!   any ──Stop──> Stopped   (cancels the RPC, the stream and the retry timer)
//! ```
//!
//! For each event: require pod_sandbox_status, its metadata and a non-empty UID
//! (else count it invalid, log rate-limited, ignore); record created_at-to-receipt
//! latency; for CONTAINER_STOPPED_EVENT only — any exit code, with or without container
//! statuses — request a relist of the pod (source evented_pleg). The payload is never
//! stored. The stream is drained promptly: requests never wait (containerd 2.x blocks
//! its dispatcher on a subscriber that stops reading).
//!
//! Opening has no deadline: containerd sends no headers before the first event.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use opentelemetry::global::BoxedSpan;
use opentelemetry::trace::Span as _;
use opentelemetry::KeyValue;
use plegd_runtime::cri::{ContainerEventResponse, ContainerEventType};
use plegd_telemetry::logging::RateLimiter;
use plegd_telemetry::{Metrics, StreamEventType};

use crate::event::RelistSource;
use crate::relist::router::RelistRouter;
use crate::spans;
use crate::stream::reconnect::{Failure, ReconnectBackoff, ReconnectPolicy};
use plegd_runtime::{now_ns, EventStream, RuntimeClient, RuntimeError};

/// The watcher's state, as in the diagram above.
#[derive(Debug)]
#[allow(dead_code)] // since/until: read once the watcher is a pure state machine (issue 8)
pub enum StreamState {
    Connecting { handle: SpawnHandle, since: Instant },
    Streaming { handle: SpawnHandle, since: Instant },
    Waiting { handle: SpawnHandle, until: Instant },
    Stopped,
}

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

/// Called after a stream opens following a failure (plegd brings the next global
/// relist forward then: events around a reconnect may be lost).
pub type ReconnectHook = Box<dyn Fn() + 'static>;

pub struct StreamWatcher {
    runtime: Arc<dyn RuntimeClient>,
    router: RelistRouter,
    metrics: Arc<Metrics>,
    backoff: ReconnectBackoff,
    state: StreamState,
    attempts: u64,
    /// The stream failed since the last successful open.
    had_failure: bool,
    /// The delay chosen after the last failure.
    last_delay: Option<Duration>,
    on_reconnect: Option<ReconnectHook>,
    error_log: RateLimiter,
    invalid_log: RateLimiter,
    open_log: RateLimiter,
    /// When the current connection attempt began (ns): older events were buffered
    /// by the runtime and would skew the latency histogram.
    attempt_started_ns: i64,
    /// The span of the connection attempt in progress.
    connect_span: Option<BoxedSpan>,
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
            backoff: ReconnectBackoff::new(policy),
            state: StreamState::Stopped,
            attempts: 0,
            had_failure: false,
            last_delay: None,
            on_reconnect,
            error_log: RateLimiter::new(Duration::from_secs(30)),
            invalid_log: RateLimiter::new(Duration::from_secs(30)),
            open_log: RateLimiter::new(Duration::from_secs(30)),
            connect_span: None,
            attempt_started_ns: 0,
            live: LiveFutures::default(),
        }
    }

    fn connect(&mut self, ctx: &mut Context<Self>) {
        self.attempts += 1;
        if self.attempts > 1 {
            self.metrics.reconnect_attempts.inc();
        }
        self.attempt_started_ns = now_ns();
        // containerd answers nothing before its next event, so "reconnected" may be
        // observed late; every attempt after a failure already asks for the global
        // relist to come early (the dispatcher allows one per period).
        if self.had_failure {
            if let Some(hook) = &self.on_reconnect {
                hook();
            }
        }
        self.connect_span = Some(spans::start(
            spans::STREAM_CONNECT,
            vec![KeyValue::new("attempt", self.attempts as i64)],
            None,
        ));
        let runtime = self.runtime.clone();
        let live = self.live.token();
        let handle = ctx.spawn(
            async move {
                let _live = live;
                runtime.container_events().await
            }
            .into_actor(self)
            .map(|res, act, ctx| match res {
                Ok(stream) => act.opened(stream, ctx),
                Err(e) => act.failed(&e, ctx),
            }),
        );
        self.state = StreamState::Connecting {
            handle,
            since: Instant::now(),
        };
    }

    fn opened(&mut self, stream: EventStream, ctx: &mut Context<Self>) {
        let now = Instant::now();
        self.metrics.connection_successes.inc();
        self.metrics.stream_connected.set(1);
        self.backoff.connected(now);
        if let Some(mut span) = self.connect_span.take() {
            span.set_attribute(KeyValue::new("outcome", "open"));
            span.end();
        }
        if let Some(suppressed) = self.open_log.allow(now) {
            tracing::info!(attempt = self.attempts, suppressed, "CRI event stream open");
        } else {
            tracing::debug!(attempt = self.attempts, "CRI event stream open");
        }
        let live = self.live.token();
        let handle = ctx.add_stream(futures::StreamExt::map(stream, move |item| {
            let _ = &live;
            item
        }));
        self.state = StreamState::Streaming { handle, since: now };
        if std::mem::take(&mut self.had_failure) {
            if let Some(hook) = &self.on_reconnect {
                hook();
            }
        }
    }

    fn failed(&mut self, e: &RuntimeError, ctx: &mut Context<Self>) {
        let why = if e.code() == tonic::Code::Unimplemented {
            Failure::Unimplemented
        } else {
            Failure::Other
        };
        if let Some(span) = self.connect_span.take() {
            spans::end_error(span, e.to_string());
        }
        self.fail(why, &e.to_string(), ctx);
    }

    fn fail(&mut self, why: Failure, reason: &str, ctx: &mut Context<Self>) {
        if let StreamState::Streaming { handle, .. } = self.state {
            ctx.cancel_future(handle);
        }
        // containerd sends no headers before its first event: an attempt that stayed
        // pending for the healthy-reset time was a healthy stream on a quiet node.
        if let StreamState::Connecting { since, .. } = self.state {
            self.backoff.connected(since);
        }
        self.metrics.stream_connected.set(0);
        self.metrics.connection_errors.inc();
        self.had_failure = true;
        let now = Instant::now();
        let delay = self.backoff.failed(now, why);
        self.last_delay = Some(delay);
        if let Some(suppressed) = self.error_log.allow(now) {
            tracing::warn!(
                reason,
                retry_in = ?delay,
                suppressed,
                "CRI event stream unavailable; global relists continue"
            );
        }
        let live = self.live.token();
        let handle = ctx.run_later(delay, move |act, ctx| {
            drop(live);
            act.connect(ctx)
        });
        self.state = StreamState::Waiting {
            handle,
            until: now + delay,
        };
    }

    fn event(&mut self, ev: ContainerEventResponse) {
        let uid = ev
            .pod_sandbox_status
            .as_ref()
            .and_then(|s| s.metadata.as_ref())
            .map(|m| m.uid.as_str())
            .filter(|uid| !uid.is_empty());
        let Some(uid) = uid else {
            self.metrics.count_stream_event(StreamEventType::Invalid);
            // containerd sends every sandbox DELETED event without a sandbox status:
            // expected, so not worth an info line.
            let deleted =
                ev.container_event_type == ContainerEventType::ContainerDeletedEvent as i32;
            if deleted {
                tracing::debug!(container = %ev.container_id, "ignoring a DELETED event without pod sandbox status");
            } else if let Some(suppressed) = self.invalid_log.allow(Instant::now()) {
                tracing::info!(
                    container = %ev.container_id,
                    suppressed,
                    "ignoring a CRI event without pod sandbox status, metadata or UID"
                );
            }
            return;
        };
        if ev.created_at > 0 && ev.created_at >= self.attempt_started_ns {
            let latency = (now_ns() - ev.created_at).max(0) as f64 / 1e9;
            self.metrics.connection_latency.observe(latency);
        }
        let kind = ContainerEventType::try_from(ev.container_event_type);
        let label = match kind {
            Ok(ContainerEventType::ContainerCreatedEvent) => StreamEventType::Created,
            Ok(ContainerEventType::ContainerStartedEvent) => StreamEventType::Started,
            Ok(ContainerEventType::ContainerStoppedEvent) => StreamEventType::Stopped,
            Ok(ContainerEventType::ContainerDeletedEvent) => StreamEventType::Deleted,
            Err(_) => StreamEventType::Unknown,
        };
        self.metrics.count_stream_event(label);
        if kind == Ok(ContainerEventType::ContainerStoppedEvent) {
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

    /// The current state's name (for tests and logs).
    pub fn state_name(&self) -> &'static str {
        match self.state {
            StreamState::Connecting { .. } => "connecting",
            StreamState::Streaming { .. } => "streaming",
            StreamState::Waiting { .. } => "waiting",
            StreamState::Stopped => "stopped",
        }
    }
}

impl Actor for StreamWatcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(16);
        self.connect(ctx);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        self.state = StreamState::Stopped;
        self.metrics.stream_connected.set(0);
    }
}

impl StreamHandler<Result<ContainerEventResponse, RuntimeError>> for StreamWatcher {
    fn handle(
        &mut self,
        item: Result<ContainerEventResponse, RuntimeError>,
        ctx: &mut Self::Context,
    ) {
        match item {
            Ok(ev) => self.event(ev),
            // An open stream may report its error more than once before it ends:
            // drop it at the first and reconnect once.
            // Only the first error of the current stream counts; tonic reports a
            // transport error twice, and items keep coming after cancel_future.
            Err(e) => {
                if matches!(self.state, StreamState::Streaming { .. }) {
                    self.failed(&e, ctx)
                }
            }
        }
    }

    fn started(&mut self, _: &mut Self::Context) {}

    /// EOF or a clean close is a failure like any other (the default would stop the
    /// actor).
    fn finished(&mut self, ctx: &mut Self::Context) {
        if matches!(self.state, StreamState::Streaming { .. }) {
            self.fail(Failure::Other, "the event stream ended", ctx);
        }
    }
}

/// Stop: cancels the RPC, the stream and any retry timer.
#[derive(Message)]
#[rtype(result = "()")]
pub struct StopWatcher;

impl Handler<StopWatcher> for StreamWatcher {
    type Result = ();

    fn handle(&mut self, _: StopWatcher, ctx: &mut Self::Context) {
        match std::mem::replace(&mut self.state, StreamState::Stopped) {
            StreamState::Connecting { handle, .. }
            | StreamState::Streaming { handle, .. }
            | StreamState::Waiting { handle, .. } => {
                ctx.cancel_future(handle);
            }
            StreamState::Stopped => {}
        }
        ctx.stop();
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
            state: self.state_name(),
            attempts: self.attempts,
            last_delay: self.last_delay,
            live_futures: self.live.count(),
        })
    }
}
