//! Starts the Generic PLEG's actors on the current arbiter and wires them together.
//! The binary and the component tests both start plegd through this one function.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use plegd_telemetry::Metrics;

use crate::cache_owner::{CacheOwner, PodCache};
use crate::event_publisher::{EventPublisher, Subscribe, Subscription};
use crate::health::Health;
use crate::pleg::GenericPleg;
use crate::reconnect_backoff::ReconnectPolicy;
use crate::relist_dispatcher::{DispatcherConfig, RelistDispatcher, RelistQueue, Stopper};
use crate::relist_router::RelistRouter;
use crate::runtime::RuntimeClient;
use crate::stream_watcher::{StopWatcher, StreamWatcher};
use crate::suspended::SuspendedPods;
use crate::sync_gate_registry::{SyncGateRegistry, SyncGates};

#[derive(Clone, Debug)]
pub struct PlegConfig {
    pub relist_period: Duration,
    pub health_threshold: Duration,
    pub queue_capacity: usize,
    /// Pods whose status is read concurrently during a relist.
    pub status_concurrency: usize,
    /// Watch the CRI event stream (the fast path).
    pub evented: bool,
    pub reconnect: ReconnectPolicy,
    /// A released PodSyncGate stops after this long unused.
    pub gate_idle: Duration,
}

impl Default for PlegConfig {
    fn default() -> Self {
        PlegConfig {
            relist_period: Duration::from_secs(1),
            health_threshold: Duration::from_secs(180),
            queue_capacity: 1024,
            status_concurrency: 8,
            evented: true,
            reconnect: ReconnectPolicy::default(),
            gate_idle: Duration::from_secs(5),
        }
    }
}

/// Handles on a running plegd core.
pub struct Pleg {
    pub cache: PodCache,
    pub health: Health,
    pub queue: RelistQueue,
    pub publisher: Addr<EventPublisher>,
    pub dispatcher: Stopper,
    pub suspended: SuspendedPods,
    pub router: RelistRouter,
    pub gates: SyncGates,
    pub watcher: Option<Addr<StreamWatcher>>,
    pub metrics: Arc<Metrics>,
}

impl Pleg {
    /// Starts CacheOwner, EventPublisher, RelistDispatcher, the sync gate registry and
    /// (if evented) the StreamWatcher, in that order, so each has somewhere to send.
    /// Must run inside an actix System.
    pub fn start(runtime: Arc<dyn RuntimeClient>, cfg: &PlegConfig, metrics: Arc<Metrics>) -> Pleg {
        let (owner, cache) = CacheOwner::new();
        let cache_addr = owner.start();
        let publisher = EventPublisher::new(metrics.clone()).start();
        let health = Health::new(cfg.health_threshold);
        let suspended = SuspendedPods::default();
        let dispatcher = RelistDispatcher::start(
            GenericPleg::new(runtime.clone(), cfg.status_concurrency),
            DispatcherConfig {
                relist_period: cfg.relist_period,
                queue_capacity: cfg.queue_capacity,
            },
            cache_addr,
            publisher.clone(),
            metrics.clone(),
            health.clone(),
            suspended.clone(),
        );
        let router =
            RelistRouter::new(dispatcher.queue.clone(), suspended.clone(), metrics.clone());
        let gates = SyncGates::new(
            SyncGateRegistry::new(
                dispatcher.queue.clone(),
                suspended.clone(),
                metrics.clone(),
                cfg.gate_idle,
            )
            .start(),
        );
        let watcher = cfg.evented.then(|| {
            let queue = dispatcher.queue.clone();
            StreamWatcher::new(
                runtime,
                router.clone(),
                metrics.clone(),
                cfg.reconnect,
                Some(Box::new(move || queue.relist_soon())),
            )
            .start()
        });
        Pleg {
            cache,
            health,
            queue: dispatcher.queue,
            publisher,
            dispatcher: dispatcher.stopper,
            suspended,
            router,
            gates,
            watcher,
            metrics,
        }
    }

    /// Stops the event stream and the dispatcher (after its relist in progress).
    pub fn stop(&self) {
        if let Some(w) = &self.watcher {
            let _ = w.try_send(StopWatcher);
        }
        self.dispatcher.stop();
    }

    /// Subscribes to lifecycle events with a queue of `capacity`.
    pub async fn subscribe(
        &self,
        name: &str,
        capacity: usize,
    ) -> Result<Subscription, MailboxError> {
        self.publisher
            .send(Subscribe {
                name: name.to_string(),
                capacity,
            })
            .await
    }
}
