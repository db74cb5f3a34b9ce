//! HintWatcher: the one actor that runs any [`HintSource`] (module docs: the
//! contract). Its connection is the pure state machine of `stream/machine.rs`; this
//! actor only performs the machine's actions (the source's open, its stream, the retry
//! timer, the state gauge, logs) and feeds back what happened, each stream item
//! tagged with its attempt. Items become relist requests through the router, never
//! waiting: a source's stream is drained promptly. Each hint writes one debug line
//! (the source, what it asked for, what became of it) under a budget, so a single
//! exit's latency can be followed in the log while a storm writes a few dozen lines
//! a second.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use actix::prelude::*;
use futures::StreamExt as _;
use plegd_runtime::{ContainerState, SandboxState};
use plegd_telemetry::logging::RateLimiter;
use plegd_telemetry::{HintSourceState, Metrics};

use crate::cache::PodCache;
use crate::hints::coverage::Coverage;
use crate::hints::cri_stops::CriStops;
use crate::hints::rechecks::{Awaited, Rechecks, PENDING_FOR};
use crate::hints::resolve::{Lookup, Owner, Resolver};
use crate::hints::{Connection, Hint, HintSource, ItemContext, SourceError};
use crate::relist::router::RelistRouter;
use crate::stop::Stop;
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
    /// The stops the CRI event stream reported, shared by every watcher (a recheck of
    /// one is dropped).
    pub cri_stops: CriStops,
    /// Claims, pending requests and confirmations, shared by every watcher.
    pub rechecks: Rechecks,
    /// Traces IDs the cache does not know to their pods (shared: one rate).
    pub resolver: Resolver,
    /// Which stops each source reported (the watcher records when it is up).
    pub coverage: Coverage,
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
    /// Budget of the per-hint debug lines.
    hint_log: RateLimiter,
}

/// What became of a hint, for its debug line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    /// A relist request went to the router (queued, or coalesced into a held pod's
    /// gate).
    Requested,
    /// The queue was full: dropped (counted).
    Dropped,
    /// A hint's last request for the pod is still pending.
    AlreadyPending,
    /// The runtime has the ID in no pod: nothing asked.
    UnknownContainer,
    /// The cache does not know the ID: being traced to its pod.
    Resolving,
    /// The cache does not know the ID and it is being traced already, or tracing is
    /// over its rate: nothing asked (the next global relist finds it).
    Unresolved,
    /// A recheck of a change the cache has shown for one more relist already.
    AlreadyConfirmed,
    /// A recheck of a stop the CRI event stream has reported (its relist covers it).
    ReportedByCri,
    /// The next global relist was asked to come now.
    BroughtForward,
    /// Put on the watcher's timer.
    Scheduled,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Requested => "requested",
            Outcome::Dropped => "dropped (queue full)",
            Outcome::AlreadyPending => "already pending",
            Outcome::UnknownContainer => "in no pod",
            Outcome::Resolving => "tracing its pod",
            Outcome::Unresolved => "unknown, not traced now",
            Outcome::AlreadyConfirmed => "change already confirmed",
            Outcome::ReportedByCri => "stop reported by the CRI stream",
            Outcome::BroughtForward => "global relist brought forward",
            Outcome::Scheduled => "scheduled",
        }
    }

    fn of_request(queued: bool) -> Self {
        if queued {
            Outcome::Requested
        } else {
            Outcome::Dropped
        }
    }
}

/// What a hint asked for, for its debug line.
fn kind(hint: &Hint) -> &'static str {
    match hint {
        Hint::Pod { .. } => "pod",
        Hint::Container { .. } => "container",
        Hint::Recheck { .. } => "recheck",
        Hint::Global => "global",
        Hint::After { .. } => "after",
    }
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
            hint_log: RateLimiter::for_event_lines(),
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
                    // No item is taken while a global relist is due or running
                    // (but the few one hears: `queue::priority`).
                    let tagged = self
                        .deps
                        .router
                        .priority()
                        .pace(stream)
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
            // No live token: a confirmation of an attempt already over is ignored.
            Action::ConfirmAfter { attempt, delay } => {
                ctx.run_later(delay, move |act, ctx| {
                    act.input(Input::Subscribed { attempt }, None, ctx)
                });
            }
            Action::BringGlobalRelistForward => {
                if let Some(hook) = &self.deps.on_reconnect {
                    hook();
                }
            }
            Action::CountReconnectAttempt => self.source.connection(Connection::ReconnectAttempt),
            Action::CountConnectionSuccess => self.source.connection(Connection::Opened),
            Action::CountConnectionError => self.source.connection(Connection::Failed),
            Action::SetConnected(up) => {
                self.deps.coverage.up(self.source.name(), up, now);
                self.source.connection(Connection::Up(up));
            }
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
        let what = kind(&hint);
        match hint {
            Hint::Pod {
                uid,
                cause,
                container,
            } => {
                let queued = self
                    .deps
                    .router
                    .request(&uid, source, cause, container.as_deref());
                self.log_hint(what, None, Some(&uid), Outcome::of_request(queued), None);
            }
            Hint::Container { id } => self.request_for(what, &id, None, true, ctx),
            Hint::Recheck { id, pod, awaited } => {
                if awaited != Awaited::Started && self.deps.cri_stops.was_reported(&id) {
                    self.log_hint(what, Some(&id), None, Outcome::ReportedByCri, None);
                    return;
                }
                // The cache's status read may show the change before the container
                // list the events are diffed from does (a read in the middle of the
                // runtime's update): one more relist after the cache first shows it.
                if shows(&self.deps.cache, &id, pod.as_deref(), awaited)
                    && !self.deps.rechecks.confirm(&id, awaited)
                {
                    self.log_hint(what, Some(&id), None, Outcome::AlreadyConfirmed, None);
                    return;
                }
                let prefetch = matches!(awaited, Awaited::Started | Awaited::Exited);
                self.request_for(what, &id, pod.as_deref(), prefetch, ctx);
            }
            Hint::Global => {
                self.deps.router.bring_forward();
                self.log_hint(what, None, None, Outcome::BroughtForward, None);
            }
            Hint::After { delay, hint } => {
                self.log_hint(kind(&hint), None, None, Outcome::Scheduled, Some(delay));
                ctx.run_later(delay, move |act, ctx| act.request(*hint, ctx));
            }
        }
    }

    /// The hint's debug line, if the budget allows (the next one let through counts
    /// those suppressed).
    fn log_hint(
        &mut self,
        hint: &'static str,
        id: Option<&str>,
        pod: Option<&str>,
        outcome: Outcome,
        after: Option<Duration>,
    ) {
        if !tracing::enabled!(tracing::Level::DEBUG) {
            return;
        }
        let Some(suppressed) = self.hint_log.allow(Instant::now()) else {
            return;
        };
        tracing::debug!(
            source = %self.source.name(),
            hint,
            id,
            pod,
            after_ms = after.map(|d| d.as_secs_f64() * 1e3),
            outcome = outcome.as_str(),
            suppressed,
            "hint"
        );
    }
}

impl<S: HintSource> HintWatcher<S> {
    /// Asks for a relist of the pod of `id` (`pod`: its UID, when the source knows it):
    /// known to the cache, or traced through the runtime first. A container's status
    /// is read together with its pod's lists (prefetch, unless `prefetch` is false: a
    /// removed one); a sandbox's is not (its relist takes it from the list).
    fn request_for(
        &mut self,
        what: &'static str,
        id: &str,
        pod: Option<&str>,
        prefetch: bool,
        ctx: &mut Context<Self>,
    ) {
        if let Some(uid) = pod {
            let container = Some(id).filter(|id| prefetch && !id.is_empty());
            let outcome = self.request_unless_pending(uid, container);
            self.log_hint(what, Some(id), Some(uid), outcome, None);
            return;
        }
        match self
            .deps
            .resolver
            .lookup(&self.deps.cache, id, Instant::now())
        {
            Lookup::Known(Some(owner)) => self.request_owner(what, id, &owner, prefetch),
            Lookup::Known(None) => {
                self.log_hint(what, Some(id), None, Outcome::UnknownContainer, None)
            }
            Lookup::Wait => self.log_hint(what, Some(id), None, Outcome::Unresolved, None),
            Lookup::Ask => {
                self.log_hint(what, Some(id), None, Outcome::Resolving, None);
                let resolver = self.deps.resolver.clone();
                let cache = self.deps.cache.clone();
                let id = id.to_string();
                let traced = async move {
                    let owner = resolver.resolve(&cache, &id).await;
                    (id, owner)
                };
                ctx.spawn(
                    traced
                        .into_actor(self)
                        .map(move |(id, owner), act, _| match owner {
                            Some(owner) => act.request_owner(what, &id, &owner, prefetch),
                            None => {
                                act.log_hint(what, Some(&id), None, Outcome::UnknownContainer, None)
                            }
                        }),
                );
            }
        }
    }

    fn request_owner(&mut self, what: &'static str, id: &str, owner: &Owner, prefetch: bool) {
        let container = (prefetch && owner.container).then_some(id);
        let outcome = self.request_unless_pending(&owner.uid, container);
        self.log_hint(what, Some(id), Some(&owner.uid), outcome, None);
    }

    /// Asks for a relist of `uid` unless a hint's last request for it is still pending
    /// (`rechecks.rs`): many events and rechecks about the containers of one pod, from
    /// any source, then cost one relist at a time, not a queue of them.
    fn request_unless_pending(&mut self, uid: &str, container: Option<&str>) -> Outcome {
        let now = SystemTime::now();
        if self.deps.rechecks.pending(&self.deps.cache, uid, now) {
            return Outcome::AlreadyPending;
        }
        let queued = self
            .deps
            .router
            .request(uid, self.source.relist_source(), None, container);
        if queued {
            self.deps.rechecks.requested(&self.deps.cache, uid, now);
        }
        Outcome::of_request(queued)
    }
}

/// Whether the cache shows the change a recheck waits for.
fn shows(cache: &PodCache, id: &str, pod: Option<&str>, awaited: Awaited) -> bool {
    let owner = match pod {
        Some(uid) => Some(uid.to_string()),
        None => cache.pod_of_container(id),
    };
    let status = owner.and_then(|uid| cache.get(&uid)).and_then(|e| e.status);
    let Some(status) = status else {
        // No read of the pod: a removal is past, anything else still to be found.
        return awaited == Awaited::Removed;
    };
    let container = status.containers.iter().find(|c| c.id == id);
    let sandbox = status.sandboxes.iter().find(|s| s.id == id);
    match (container, sandbox, awaited) {
        (None, None, Awaited::Removed) => true,
        (_, _, Awaited::Removed) => false,
        (Some(c), _, Awaited::Started) => {
            matches!(c.state, ContainerState::Running | ContainerState::Exited)
        }
        (Some(c), _, _) => c.state == ContainerState::Exited,
        // A sandbox's own task (containerd's events do not tell which it is).
        (None, Some(_), Awaited::Started) => true,
        (None, Some(s), _) => s.state == SandboxState::NotReady,
        // Not (yet) in its pod's last read: a read still has something to find.
        (None, None, _) => false,
    }
}

impl<S: HintSource> Actor for HintWatcher<S> {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(16);
        self.export_state();
        self.input(Input::Start, None, ctx);
        // What is remembered of past stops and requests is forgotten on time even
        // when no new one comes.
        ctx.run_interval(PENDING_FOR, |act, _| {
            act.deps.cri_stops.tidy(Instant::now());
            act.deps
                .rechecks
                .tidy(&act.deps.cache, Instant::now(), SystemTime::now());
        });
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

/// Stopping cancels the open, the stream and any retry timer.
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
    /// Entries the shared hint bookkeeping remembers (`rechecks.rs`).
    pub tracked: usize,
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
            tracked: self.deps.rechecks.tracked(),
        })
    }
}
