//! Starts the Generic PLEG's actors on the current arbiter and wires them together.
//! The binary and the component tests both start plegd through this one function.

use std::collections::{HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use actix::prelude::*;
use plegd_telemetry::logging::RateLimiter;
use plegd_telemetry::Metrics;

use plegd_runtime::RuntimeClient;

use crate::cache::{CacheOwner, CacheSnapshot, Cover, PodCache, PodLookup, Snapshot};
use crate::event::{EventKind, RelistSource};
use crate::health::{Health, HealthLog};
use crate::hints::coverage::{Coverage, Verdict};
use crate::hints::cri_stops::CriStops;
use crate::hints::rechecks::Rechecks;
use crate::hints::resolve::Resolver;
use crate::hints::select::{start_source, RunningSource};
use crate::hints::watcher::{WatcherDeps, WatcherState};
use crate::hints::HintSourceName;
use crate::pleg::GenericPleg;
use crate::publisher::{EventPublisher, Subscribe, SubscribeError};
use crate::queue::{ApiRelistOutcome, RelistQueue};
use crate::relist::dispatcher::{DispatcherConfig, DispatcherDeps, RelistDispatcher, StopHandle};
use crate::relist::router::RelistRouter;
use crate::revision::{new_instance_id, Revisions};
use crate::state::{
    boot_id, Header, Opened, Persistence, Snapshot as StateSnapshot, StateStore, FORMAT,
};
use crate::stop::Stop;
use crate::stream::reconnect::ReconnectPolicy;
use crate::subscription::{Received, Subscription};
use crate::sync::registry::{SyncGateRegistry, SyncGates};
use crate::sync::HeldPods;

#[derive(Clone, Debug)]
pub struct PlegConfig {
    pub relist_period: Duration,
    pub health_threshold: Duration,
    pub queue_capacity: usize,
    /// Pods whose status is read concurrently during a relist.
    pub status_concurrency: usize,
    /// The relist hint sources to run (`--hint-sources`, resolved at start); none:
    /// polling only.
    pub hint_sources: Vec<HintSourceName>,
    /// The runtime's NRI socket (`--nri-socket`), for the `nri` hint source.
    pub nri_socket: PathBuf,
    pub reconnect: ReconnectPolicy,
    /// A released PodSyncGate stops after this long unused.
    pub gate_idle: Duration,
    /// How many of the last published events are kept for subscribers that resume
    /// from a revision.
    pub history_events: usize,
    /// How long a pod removed from the runtime stays answerable (its last status and
    /// when it went).
    pub tombstone_ttl: Duration,
    /// Pods that may wait with an API client's RequestRelist (`--api-relist-budget`),
    /// apart from the runtime's hints.
    pub api_relist_budget: usize,
    /// The longest a sync may hold a pod without a renew (`--max-sync-hold`).
    pub max_sync_hold: Duration,
    /// Holds of pods plegd does not know, at most at once.
    pub max_unknown_holds: usize,
}

impl Default for PlegConfig {
    fn default() -> Self {
        PlegConfig {
            relist_period: Duration::from_secs(1),
            health_threshold: Duration::from_secs(180),
            queue_capacity: 1024,
            // plegd's --status-concurrency default (8, 16, 32, 64 measured: docs/architecture.md,
            // "Performance decisions").
            status_concurrency: 32,
            hint_sources: vec![HintSourceName::CriEvents],
            nri_socket: PathBuf::from(plegd_nri::DEFAULT_SOCKET),
            reconnect: ReconnectPolicy::default(),
            gate_idle: Duration::from_secs(5),
            history_events: 65_536,
            tombstone_ttl: Duration::from_secs(300),
            api_relist_budget: crate::queue::DEFAULT_API_RELIST_BUDGET,
            max_sync_hold: crate::sync::DEFAULT_MAX_SYNC_HOLD,
            max_unknown_holds: crate::sync::DEFAULT_MAX_UNKNOWN_HOLDS,
        }
    }
}

/// Handles on a running plegd core: what a user of the PLEG needs, nothing more.
/// Cheap to clone; every clone controls the same actors.
#[derive(Clone)]
pub struct Pleg {
    instance_id: Arc<str>,
    revisions: Revisions,
    cache: PodCache,
    cache_owner: Addr<CacheOwner>,
    health: Health,
    queue: RelistQueue,
    publisher: Addr<EventPublisher>,
    dispatcher: StopHandle,
    held: HeldPods,
    router: RelistRouter,
    gates: SyncGates,
    sources: Vec<RunningSource>,
    metrics: Arc<Metrics>,
    /// Background tasks: the health log, the hint sources' judge (aborted by
    /// [`Pleg::stop`]).
    tasks: Arc<Mutex<Vec<actix_rt::task::JoinHandle<()>>>>,
    coverage: Coverage,
    state: Option<StateStore>,
}

/// Judges each published container death against the hint sources that were up
/// (`hints/coverage.rs`), and counts and logs what they missed; a sandbox's death
/// only makes them forget its stop.
async fn judge_coverage(pleg: Pleg) {
    let subscribe = pleg.publisher.send(Subscribe {
        name: "hint-coverage".into(),
        capacity: 4096,
        after: None,
        // plegd's own bookkeeping, not an output.
        counted: false,
    });
    let Ok(Ok(sub)) = subscribe.await else {
        return;
    };
    let metrics = pleg.metrics.clone();
    let mut missed_log = RateLimiter::new(Duration::from_secs(60));
    let mut tick = actix_rt::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            received = sub.next_async() => match received {
                Some(Received::Event(d)) => {
                    let e = &d.event;
                    if e.kind == EventKind::ContainerDied && e.sandbox {
                        pleg.coverage.sandbox_died(&e.container_id, Instant::now());
                    } else if e.kind == EventKind::ContainerDied {
                        let finished = e.exit.as_ref().and_then(|x| x.finished_at);
                        pleg.coverage
                            .died(&e.container_id, finished, Instant::now(), SystemTime::now());
                    }
                }
                Some(_) => {}
                None => return,
            },
            _ = tick.tick() => {
                for (source, verdict) in pleg.coverage.judge(Instant::now()) {
                    metrics.count_hint_stop(source, verdict == Verdict::Reported);
                    if verdict == Verdict::Missed {
                        if let Some(suppressed) = missed_log.allow(Instant::now()) {
                            let (judged, missed) = pleg.coverage.counts(source);
                            tracing::info!(
                                %source,
                                judged,
                                missed,
                                suppressed,
                                "a hint source missed a container stop it should have reported; global relists found it"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Checks health every second and logs each change (`health.rs`).
async fn log_health_changes(health: Health) {
    let mut log = HealthLog::new(health);
    let mut tick = actix_rt::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        log.log(Instant::now());
    }
}

impl Pleg {
    /// Starts CacheOwner, EventPublisher, RelistDispatcher, the sync gate registry and
    /// the hint sources, in that order, so each has somewhere to send.
    /// Must run inside an actix System.
    pub fn start(runtime: Arc<dyn RuntimeClient>, cfg: &PlegConfig, metrics: Arc<Metrics>) -> Pleg {
        Self::start_with_state(runtime, cfg, metrics, None)
    }

    /// [`Self::start`] with a state dir ([`crate::state`], opened by the caller):
    /// goes on from what it held, if anything, and stores every relist in it.
    pub fn start_with_state(
        runtime: Arc<dyn RuntimeClient>,
        cfg: &PlegConfig,
        metrics: Arc<Metrics>,
        state: Option<Opened>,
    ) -> Pleg {
        let (store, loaded) = match state {
            Some(o) => (Some(o.store), o.loaded),
            None => (None, None),
        };
        let (instance_id, revision, records, reinspect, (owner, cache), history) = match loaded {
            Some(l) => (
                l.instance_id,
                l.revision,
                l.records,
                l.reinspect,
                l.cache,
                l.history,
            ),
            None => (
                new_instance_id(),
                0,
                Default::default(),
                HashSet::new(),
                CacheOwner::new(cfg.tombstone_ttl),
                VecDeque::new(),
            ),
        };
        let instance_id: Arc<str> = instance_id.into();
        let revisions = Revisions::starting_at(revision);
        let mut core = GenericPleg::new(runtime.clone(), cfg.status_concurrency)
            .with_last_reads(Arc::new(cache.clone()));
        let persistence = store.map(|store| {
            core = std::mem::replace(
                &mut core,
                GenericPleg::new(runtime.clone(), cfg.status_concurrency),
            )
            .restored(records, reinspect);
            let header = Arc::new(Header {
                format: FORMAT,
                instance_id: instance_id.to_string(),
                boot_id: boot_id(),
            });
            // The first state file, before any relist: the identity and everything
            // gone on from, with this boot's id.
            let first = StateSnapshot {
                header: &header,
                records: core.records(),
                cache: &owner.image(),
                history: history.iter().map(|e| e.as_bytes().to_vec()).collect(),
            }
            .bytes();
            // Awaited before anything can show the identity (a Hello): killed before
            // this file is there, plegd would come back as another instance. (Only
            // start-up waits: a write and one sync.)
            let ok = futures::executor::block_on(store.rewrite(first));
            metrics.state_persisting.set(i64::from(ok));
            metrics.state_bytes.set(store.size() as i64);
            (store, header)
        });
        let cache_addr = owner.start();
        let mut publisher =
            EventPublisher::new(metrics.clone(), cfg.history_events, revisions.clone())
                .with_history(history, revision);
        if let Some((store, _)) = &persistence {
            publisher = publisher.with_history_file(&store.history_path());
        }
        let publisher = publisher.start();
        let health = Health::new(cfg.health_threshold);
        let held = HeldPods::default();
        let state = persistence.map(|(store, header)| Persistence {
            store,
            header,
            images: cache_addr.clone().recipient(),
            history: publisher.clone().recipient(),
        });
        let dispatcher = RelistDispatcher::start(
            core,
            DispatcherConfig {
                relist_period: cfg.relist_period,
                queue_capacity: cfg.queue_capacity,
                admission: true,
            },
            DispatcherDeps {
                cache: cache_addr.clone().recipient(),
                publisher: publisher.clone().recipient(),
                metrics: metrics.clone(),
                health: health.clone(),
                held: held.clone(),
                revisions: revisions.clone(),
                state: state.clone(),
            },
        );
        let mut dispatcher = dispatcher;
        dispatcher.queue = dispatcher.queue.with_api_budget(cfg.api_relist_budget);
        let router = RelistRouter::new(dispatcher.queue.clone(), held.clone(), metrics.clone());
        let known_cache = cache.clone();
        let gates = SyncGates::new(
            SyncGateRegistry::new(
                dispatcher.queue.clone(),
                held.clone(),
                metrics.clone(),
                cfg.gate_idle,
            )
            .with_max_hold(cfg.max_sync_hold)
            .start(),
        )
        .with_known(
            Arc::new(move |uid| !matches!(known_cache.lookup(uid), PodLookup::Unknown)),
            cfg.max_unknown_holds,
        );
        // What the CRI stream reported, for the sources whose stops come earlier; the
        // rechecks and ID tracing every source shares.
        let cri_stops = CriStops::default();
        let rechecks = Rechecks::default();
        let coverage = Coverage::default();
        let resolver = Resolver::new(runtime.clone(), metrics.clone());
        let sources = cfg
            .hint_sources
            .iter()
            .map(|&name| {
                let queue = dispatcher.queue.clone();
                let deps = WatcherDeps {
                    router: router.clone(),
                    cache: cache.clone(),
                    metrics: metrics.clone(),
                    policy: cfg.reconnect,
                    on_reconnect: Some(Box::new(move || queue.bring_forward())),
                    cri_stops: cri_stops.clone(),
                    rechecks: rechecks.clone(),
                    resolver: resolver.clone(),
                    coverage: coverage.clone(),
                };
                start_source(name, &runtime, &cfg.nri_socket, &metrics, &health, deps)
            })
            .collect();
        let tasks = Arc::new(Mutex::new(vec![actix_rt::spawn(log_health_changes(
            health.clone(),
        ))]));
        let pleg = Pleg {
            tasks,
            coverage: coverage.clone(),
            instance_id,
            state: state.map(|s| s.store),
            revisions,
            cache,
            cache_owner: cache_addr,
            health,
            queue: dispatcher.queue,
            publisher,
            dispatcher: dispatcher.stop,
            held,
            router,
            gates,
            sources,
            metrics,
        };
        if !cfg.hint_sources.is_empty() {
            let judge = actix_rt::spawn(judge_coverage(pleg.clone()));
            pleg.tasks
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(judge);
        }
        pleg
    }

    /// Stops the hint sources and the dispatcher (after its relist in progress).
    pub fn stop(&self) {
        for task in self
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            task.abort();
        }
        for s in &self.sources {
            let _ = s.stop.try_send(Stop);
        }
        self.dispatcher.stop();
    }

    /// Asks for a targeted relist of one pod (a hint: `post_sync`, `post_allocation`,
    /// `evented_pleg`). Never blocks; a held pod's request is coalesced into its
    /// gate's pending relist. False only if the request was dropped (full queue,
    /// counted).
    pub fn request_relist(&self, uid: &str, source: RelistSource) -> bool {
        self.router.request(uid, source, None, None)
    }

    /// [`Self::request_relist`] naming the container the hint is about (as the hint
    /// sources name it).
    #[cfg(test)]
    pub(crate) fn request_relist_of(
        &self,
        uid: &str,
        source: RelistSource,
        container: &str,
    ) -> bool {
        self.router.request(uid, source, None, Some(container))
    }

    /// An API client's RequestRelist: under the API clients' own budget
    /// (`api_relist_budget` pods waiting), never crowding out the runtime's hints; a
    /// held pod's request joins its gate's pending relist. Never blocks. Unless
    /// dropped or unavailable, a read of the pod (or a global relist) begins after
    /// the request was accepted.
    pub fn request_relist_from_api(&self, uid: &str, source: RelistSource) -> ApiRelistOutcome {
        self.router.request_api(uid, source)
    }

    /// Asks for the next global relist to run now (honoured at most once per period).
    pub fn bring_global_relist_forward(&self) {
        self.queue.bring_forward();
    }

    /// The pod cache (read-only).
    pub fn cache(&self) -> &PodCache {
        &self.cache
    }

    /// Generic PLEG health (liveness and readiness).
    pub fn health(&self) -> &Health {
        &self.health
    }

    /// Hold pods while syncing them (SyncPod suspension).
    pub fn gates(&self) -> &SyncGates {
        &self.gates
    }

    /// The metrics this PLEG writes.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// Number of pods a sync holds right now.
    pub fn held_pods(&self) -> usize {
        self.held.len()
    }

    /// True while a sync holds the pod.
    pub fn is_held(&self, uid: &str) -> bool {
        self.held.contains(uid)
    }

    /// True once the dispatcher has stopped.
    pub fn stopped(&self) -> bool {
        self.dispatcher.stopped()
    }

    fn source(&self, name: HintSourceName) -> Option<&RunningSource> {
        self.sources.iter().find(|s| s.name == name)
    }

    /// The CRI event stream watcher's state; None when not running.
    pub async fn watcher_state(&self) -> Option<WatcherState> {
        self.source_state(HintSourceName::CriEvents).await
    }

    /// A hint source watcher's state; None when it does not run (or stopped).
    pub async fn source_state(&self, name: HintSourceName) -> Option<WatcherState> {
        self.source(name)?.get_state().await
    }

    /// True while the CRI event stream watcher runs.
    pub fn watcher_running(&self) -> bool {
        self.source(HintSourceName::CriEvents)
            .is_some_and(|s| s.stop.connected())
    }

    /// Container stops judged for a hint source, and of those it missed
    /// (`hints/coverage.rs`).
    pub fn hint_source_stops(&self, source: HintSourceName) -> (u64, u64) {
        self.coverage.counts(source)
    }

    /// A clean stop of the state dir, once the dispatcher has stopped: the last
    /// revision recorded and the file synced, so that a restart goes on from it
    /// exactly (even after the machine restarts). False if there is no state dir, the
    /// dispatcher still runs, or the stop could not be written.
    pub async fn close_state(&self) -> bool {
        match &self.state {
            Some(store) if self.stopped() => store.stop(self.revisions.latest()).await,
            _ => false,
        }
    }

    /// The state dir's writer, if there is one.
    pub fn state(&self) -> Option<&StateStore> {
        self.state.as_ref()
    }

    /// Stops the publisher: subscribers receive what is queued, then disconnection.
    pub async fn close_publisher(&self) {
        let _ = self.publisher.send(Stop).await;
    }

    /// Subscribes to lifecycle events with a queue of `capacity`.
    pub async fn subscribe(
        &self,
        name: &str,
        capacity: usize,
    ) -> Result<Subscription, MailboxError> {
        match self.subscribe_after(name, capacity, None).await {
            Ok(s) => Ok(s),
            // Without a revision only a closed publisher refuses.
            Err(_) => Err(MailboxError::Closed),
        }
    }

    /// This plegd instance's id: random, 32 lowercase hex digits, fixed for the
    /// process. Revisions are meaningful only with it.
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// The latest revision issued so far (0 before any event).
    pub fn latest_revision(&self) -> u64 {
        self.revisions.latest()
    }

    /// The cache and the revision it reflects, consistent: every event with a revision
    /// up to `revision` is reflected in `pods`, no later event is. Then
    /// `subscribe_after(.., Some(revision))` gives every later change exactly once.
    pub async fn snapshot(&self) -> Result<CacheSnapshot, MailboxError> {
        self.cache_owner.send(Snapshot).await
    }

    /// Subscribes to the events with a revision above `after` (None: only those
    /// published from now on): those still in the history first, then live ones, in
    /// order, with no gap and no duplicate, through one [`Subscription`]. `capacity`
    /// bounds the queue of live events; the replay is read from the history and is
    /// never lost to it.
    pub async fn subscribe_after(
        &self,
        name: &str,
        capacity: usize,
        after: Option<u64>,
    ) -> Result<Subscription, SubscribeError> {
        self.publisher
            .send(Subscribe {
                name: name.to_string(),
                capacity,
                after,
                counted: true,
            })
            .await
            .map_err(|_| SubscribeError::Closed)?
    }

    /// A pod as the cache knows it. With `newer_than`: waits (at most `timeout`) until
    /// a relist that began after that time covered the pod: any relist that read it,
    /// targeted or global, or a global relist that found it unchanged (kubelet's
    /// GetNewerThan).
    pub async fn pod_status(
        &self,
        uid: &str,
        newer_than: Option<SystemTime>,
        timeout: Duration,
    ) -> PodLookup {
        self.pod_status_covered(uid, newer_than, timeout).await.0
    }

    /// As [`Self::pod_status`], with the relist that covered the answer last and when
    /// it began ([`PodCache::lookup_covered`]; None: unknown, or timed out). With
    /// `newer_than`, that relist began after it.
    pub async fn pod_status_covered(
        &self,
        uid: &str,
        newer_than: Option<SystemTime>,
        timeout: Duration,
    ) -> (PodLookup, Option<Cover>) {
        if let Some(t) = newer_than {
            if self.cache.wait_newer_than(uid, t, timeout).await.is_err() {
                return (PodLookup::TimedOut(self.cache.get(uid)), None);
            }
        }
        self.cache.lookup_covered(uid)
    }
}
