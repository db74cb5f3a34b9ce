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
use crate::relist_dispatcher::{DispatcherConfig, RelistDispatcher, RelistQueue, Stopper};
use crate::runtime::RuntimeClient;
use crate::suspended::SuspendedPods;

#[derive(Clone, Debug)]
pub struct PlegConfig {
    pub relist_period: Duration,
    pub health_threshold: Duration,
    pub queue_capacity: usize,
    /// Pods whose status is read concurrently during a relist.
    pub status_concurrency: usize,
}

impl Default for PlegConfig {
    fn default() -> Self {
        PlegConfig {
            relist_period: Duration::from_secs(1),
            health_threshold: Duration::from_secs(180),
            queue_capacity: 1024,
            status_concurrency: 8,
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
    pub metrics: Arc<Metrics>,
}

impl Pleg {
    /// Starts CacheOwner, EventPublisher and RelistDispatcher (in that order, so the
    /// first relist has somewhere to go). Must run inside an actix System.
    pub fn start(runtime: Arc<dyn RuntimeClient>, cfg: &PlegConfig, metrics: Arc<Metrics>) -> Pleg {
        let (owner, cache) = CacheOwner::new();
        let cache_addr = owner.start();
        let publisher = EventPublisher::new(metrics.clone()).start();
        let health = Health::new(cfg.health_threshold);
        let suspended = SuspendedPods::default();
        let dispatcher = RelistDispatcher::start(
            GenericPleg::new(runtime, cfg.status_concurrency),
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
        Pleg {
            cache,
            health,
            queue: dispatcher.queue,
            publisher,
            dispatcher: dispatcher.stopper,
            suspended,
            metrics,
        }
    }

    /// Subscribes to lifecycle events with a queue of `capacity`.
    pub async fn subscribe(&self, name: &str, capacity: usize) -> Result<Subscription, MailboxError> {
        self.publisher
            .send(Subscribe {
                name: name.to_string(),
                capacity,
            })
            .await
    }
}
