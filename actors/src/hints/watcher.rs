//! HintWatcher: the one actor that runs any [`HintSource`] (module docs: the
//! contract). Its connection is the pure state machine of `stream/machine.rs`; this
//! actor only performs the machine's actions (the source's open, its stream, the retry
//! timer, the state gauge, logs) and feeds back what happened, each stream item
//! tagged with its attempt. Items become relist requests through the router, never
//! waiting: a source's stream is drained promptly.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures::StreamExt as _;
use plegd_telemetry::logging::RateLimiter;
use plegd_telemetry::{HintSourceState, Metrics};

use crate::cache::PodCache;
use crate::hints::{Connection, Hint, HintSource, ItemContext, SourceError};
use crate::relist::router::RelistRouter;
use crate::stream::machine::{Action, Input, LogLine, Machine};
use crate::stream::reconnect::ReconnectPolicy;

/// Counts the watcher's live futures (open, stream, retry timer): each holds a
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

/// What every watcher needs besides its source.
pub struct WatcherDeps {
    pub router: RelistRouter,
    /// Maps a [`Hint::Container`] to its pod (read only).
    pub cache: PodCache,
    pub metrics: Arc<Metrics>,
    pub policy: ReconnectPolicy,
    pub on_reconnect: Option<ReconnectHook>,
}

/// One item of the stream opened by `attempt`; `item` None marks its end (EOF or a
/// clean close), so even the end says which stream it belongs to.
pub struct StreamItem<T> {
    attempt: u64,
    item: Option<Result<T, SourceError>>,
}

pub struct HintWatcher<S: HintSource> {
    source: S,
    deps: WatcherDeps,
    machine: Machine,
    /// The attempt, stream or retry timer the machine last started: what
    /// [`Action::Cancel`] cancels (the machine has at most one running).
    running: Option<SpawnHandle>,
    error_log: RateLimiter,
    open_log: RateLimiter,
    live: LiveFutures,
    /// The state last exported.
    state: HintSourceState,
    /// States already logged at info; a state seen before is logged at info only when
    /// `state_log` allows (a flapping runtime must not flood the log).
    logged: Vec<HintSourceState>,
    state_log: RateLimiter,
}

impl<S: HintSource> HintWatcher<S> {
    pub fn new(source: S, deps: WatcherDeps) -> Self {
        HintWatcher {
            machine: Machine::new(deps.policy),
            source,
            deps,
            running: None,
            error_log: RateLimiter::new(Duration::from_secs(30)),
            open_log: RateLimiter::new(Duration::from_secs(30)),
            live: LiveFutures::default(),
            state: HintSourceState::Off,
            logged: vec![],
            state_log: RateLimiter::new(Duration::from_secs(30)),
        }
    }

    /// Steps the machine, performs its actions and exports the new state; `stream` is
    /// the one an [`Input::Opened`] brings (dropped unless the machine reads it).
    fn input(
        &mut self,
        input: Input,
        stream: Option<super::ItemStream<S::Item>>,
        ctx: &mut Context<Self>,
    ) {
        let now = Instant::now();
        let mut stream = stream;
        for action in self.machine.step(input, now) {
            self.perform(action, &mut stream, now, ctx);
        }
        self.export_state();
    }

    /// Sets the state gauge on a change, and logs it: at info the first time the
    /// source reaches a state, then at most once per 30 s (with the count of changes
    /// left at debug), so a flapping runtime cannot flood the log.
    fn export_state(&mut self) {
        let state = self.machine.source_state();
        if state == self.state {
            return;
        }
        let source = self.source.name();
        self.deps.metrics.set_hint_source_state(source, state);
        let (from, now) = (self.state, Instant::now());
        if !self.logged.contains(&state) {
            self.logged.push(state);
            tracing::info!(%source, %from, to = %state, "hint source state");
        } else if let Some(suppressed) = self.state_log.allow(now) {
            tracing::info!(%source, %from, to = %state, suppressed, "hint source state");
        } else {
            tracing::debug!(%source, %from, to = %state, "hint source state");
        }
        self.state = state;
    }

    fn perform(
        &mut self,
        action: Action,
        stream: &mut Option<super::ItemStream<S::Item>>,
        now: Instant,
        ctx: &mut Context<Self>,
    ) {
        let what = self.source.describe();
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
                if let Some(hook) = &self.deps.on_reconnect {
                    hook();
                }
            }
            Action::CountReconnectAttempt => self.source.connection(Connection::ReconnectAttempt),
            Action::CountConnectionSuccess => self.source.connection(Connection::Opened),
            Action::CountConnectionError => self.source.connection(Connection::Failed),
            Action::SetConnected(up) => self.source.connection(Connection::Up(up)),
            Action::Log(LogLine::Opened { attempt }) => {
                let source = self.source.name();
                if let Some(suppressed) = self.open_log.allow(now) {
                    tracing::info!(%source, attempt, suppressed, "{what} open");
                } else {
                    tracing::debug!(%source, attempt, "{what} open");
                }
            }
            Action::Log(LogLine::Unavailable { reason, retry_in }) => {
                if let Some(suppressed) = self.error_log.allow(now) {
                    let source = self.source.name();
                    tracing::warn!(
                        %source,
                        reason,
                        ?retry_in,
                        suppressed,
                        "{what} unavailable; global relists continue"
                    );
                }
            }
            Action::StopActor => ctx.stop(),
        }
    }

    /// One attempt of the source's open, without a deadline.
    fn open(&mut self, attempt: u64, ctx: &mut Context<Self>) {
        let live = self.live.token();
        let call = self.source.open(attempt);
        let call = async move {
            let _live = live;
            call.await
        };
        let handle = ctx.spawn(call.into_actor(self).map(move |res, act, ctx| match res {
            Ok(stream) => act.input(Input::Opened { attempt }, Some(stream), ctx),
            Err(SourceError { end, reason }) => {
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

    /// One item: what it asks for becomes relist requests (never waiting).
    fn item(&mut self, item: S::Item, ctx: &mut Context<Self>) {
        let item_ctx = ItemContext {
            attempt_started: self.machine.attempt_started(),
        };
        for hint in self.source.hint(item, item_ctx) {
            self.request(hint, ctx);
        }
    }

    fn request(&mut self, hint: Hint, ctx: &mut Context<Self>) {
        let source = self.source.relist_source();
        match hint {
            Hint::Pod { uid, cause } => {
                self.deps.router.request(&uid, source, cause);
            }
            Hint::Container { id } => {
                if let Some(uid) = self.deps.cache.pod_of_container(&id) {
                    self.deps.router.request(&uid, source, None);
                }
            }
            Hint::Recheck { id } => {
                if self.deps.cache.container_exited(&id) {
                    return;
                }
                if let Some(uid) = self.deps.cache.pod_of_container(&id) {
                    self.deps.router.request(&uid, source, None);
                }
            }
            Hint::Global => self.deps.router.bring_forward(),
            Hint::After { delay, hint } => {
                ctx.run_later(delay, move |act, ctx| act.request(*hint, ctx));
            }
        }
    }
}

impl<S: HintSource> Actor for HintWatcher<S> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(16);
        self.export_state();
        self.input(Input::Start, None, ctx);
    }

    /// However the actor stops (a [`Stop`], the system shutting down), the machine
    /// stops too: the open, stream or timer is cancelled and the state reads stopped.
    fn stopped(&mut self, ctx: &mut Self::Context) {
        self.input(Input::Stop, None, ctx);
    }
}

impl<S: HintSource> StreamHandler<StreamItem<S::Item>> for HintWatcher<S> {
    fn handle(
        &mut self,
        StreamItem { attempt, item }: StreamItem<S::Item>,
        ctx: &mut Self::Context,
    ) {
        let input = match item {
            // Even an item of a stream already given up is a good hint.
            Some(Ok(item)) => return self.item(item, ctx),
            // The machine counts only the first error or end of the current stream.
            Some(Err(SourceError { end, reason })) => Input::StreamError {
                attempt,
                end,
                reason,
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

/// Stops the watcher: cancels the open, the stream and any retry timer.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Stop;

impl<S: HintSource> Handler<Stop> for HintWatcher<S> {
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

impl<S: HintSource> Handler<GetState> for HintWatcher<S> {
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
