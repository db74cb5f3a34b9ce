//! EventPublisher: fans lifecycle events out to any number of subscribers, each
//! through its own bounded queue. A full queue drops the event for that subscriber
//! only (counted in kubelet_pleg_discard_events) and never slows the dispatcher.
//!
//! Unlike kubelet, a drop is never silent: every event a subscriber is offered takes
//! the next number of its sequence, and the next event it does receive carries how
//! many it missed, so the consumer knows to re-read pod status from the cache.

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use crossbeam_channel::{
    bounded, Receiver, RecvError, RecvTimeoutError, Sender, TryIter, TryRecvError, TrySendError,
};
use plegd_telemetry::Metrics;

use crate::event::LifecycleEvent;

/// One event as a subscriber receives it.
#[derive(Clone, Debug)]
pub struct Delivery {
    /// Per-subscriber sequence number, from 1; a gap equals `missed`.
    pub seq: u64,
    /// Events dropped for this subscriber since the previous delivery.
    pub missed: u64,
    pub event: Arc<LifecycleEvent>,
}

/// The receiving end of a subscription. Dropping it unsubscribes at once, even on a
/// quiet node. Blocking receives (`recv`, `recv_timeout`) suit a consumer on its own
/// thread. After the publisher closes, `recv` returns what is queued, then an error.
///
/// The receiver is reached only through the subscription, so whoever receives also
/// keeps the subscription alive (a closure capturing only a receiver field would
/// unsubscribe at once).
pub struct Subscription {
    name: String,
    rx: Receiver<Delivery>,
    _unsubscribe: Unsubscriber,
}

impl Subscription {
    /// The name given at subscription (for logs).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Blocks until the next delivery; an error once the publisher has closed and
    /// the queue is empty.
    pub fn recv(&self) -> Result<Delivery, RecvError> {
        self.rx.recv()
    }

    /// As [`Self::recv`], giving up after `timeout`.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Delivery, RecvTimeoutError> {
        self.rx.recv_timeout(timeout)
    }

    /// The next delivery if one is queued.
    pub fn try_recv(&self) -> Result<Delivery, TryRecvError> {
        self.rx.try_recv()
    }

    /// Every delivery queued now.
    pub fn try_iter(&self) -> TryIter<'_, Delivery> {
        self.rx.try_iter()
    }

    /// True if nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.rx.is_empty()
    }
}

/// Tells the publisher when its subscription is dropped.
struct Unsubscriber {
    id: u64,
    publisher: Addr<EventPublisher>,
}

impl Drop for Unsubscriber {
    fn drop(&mut self) {
        // After Stop the publisher is gone and there is nothing to remove.
        self.publisher.do_send(Unsubscribe(self.id));
    }
}

struct Subscriber {
    id: u64,
    name: String,
    tx: Sender<Delivery>,
    next_seq: u64,
    missed: u64,
}

pub struct EventPublisher {
    subscribers: Vec<Subscriber>,
    next_id: u64,
    /// The revision the next published event gets: node-wide, strictly increasing,
    /// one sequence for every subscriber (unlike `seq`, which is per subscriber).
    next_revision: u64,
    metrics: Arc<Metrics>,
}

impl EventPublisher {
    pub fn new(metrics: Arc<Metrics>) -> Self {
        EventPublisher {
            subscribers: Vec::new(),
            next_id: 0,
            next_revision: 1,
            metrics,
        }
    }
}

impl Actor for EventPublisher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(64);
    }
}

/// Adds a subscriber with a queue of `capacity` events.
#[derive(Message)]
#[rtype(result = "Subscription")]
pub struct Subscribe {
    pub name: String,
    pub capacity: usize,
}

impl Handler<Subscribe> for EventPublisher {
    type Result = MessageResult<Subscribe>;

    fn handle(&mut self, msg: Subscribe, ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = bounded(msg.capacity.max(1));
        self.next_id += 1;
        let id = self.next_id;
        self.subscribers.push(Subscriber {
            id,
            name: msg.name.clone(),
            tx,
            next_seq: 1,
            missed: 0,
        });
        self.metrics.subscribers.set(self.subscribers.len() as i64);
        MessageResult(Subscription {
            name: msg.name,
            rx,
            _unsubscribe: Unsubscriber {
                id,
                publisher: ctx.address(),
            },
        })
    }
}

/// A subscription was dropped: forget its queue.
#[derive(Message)]
#[rtype(result = "()")]
struct Unsubscribe(u64);

impl Handler<Unsubscribe> for EventPublisher {
    type Result = ();

    fn handle(&mut self, msg: Unsubscribe, _: &mut Self::Context) {
        self.subscribers.retain(|s| s.id != msg.0);
        self.metrics.subscribers.set(self.subscribers.len() as i64);
    }
}

/// Publishes the events of one relist, in order.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Publish(pub Vec<LifecycleEvent>);

impl Handler<Publish> for EventPublisher {
    type Result = ();

    fn handle(&mut self, msg: Publish, _: &mut Self::Context) {
        for mut ev in msg.0 {
            self.metrics.count_event(ev.relist_source);
            ev.revision = self.next_revision;
            self.next_revision += 1;
            let ev = Arc::new(ev);
            self.subscribers.retain_mut(|s| {
                let seq = s.next_seq;
                s.next_seq += 1;
                let delivery = Delivery {
                    seq,
                    missed: s.missed,
                    event: ev.clone(),
                };
                match s.tx.try_send(delivery) {
                    Ok(()) => {
                        s.missed = 0;
                        true
                    }
                    Err(TrySendError::Full(_)) => {
                        s.missed += 1;
                        self.metrics.discard_events.inc();
                        self.metrics.subscriber_drops.inc();
                        if s.missed == 1 {
                            tracing::warn!(subscriber = %s.name, "subscriber queue full; dropping events");
                        }
                        true
                    }
                    Err(TrySendError::Disconnected(_)) => {
                        tracing::debug!(subscriber = %s.name, "subscriber gone");
                        false
                    }
                }
            });
        }
        self.metrics.subscribers.set(self.subscribers.len() as i64);
    }
}

/// Drops every subscriber (their queues drain, then report disconnection) and stops.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Stop;

impl Handler<Stop> for EventPublisher {
    type Result = ();

    fn handle(&mut self, _: Stop, ctx: &mut Self::Context) {
        self.subscribers.clear();
        self.metrics.subscribers.set(0);
        ctx.stop();
    }
}

#[cfg(test)]
mod tests {
    //! The publisher alone, with subscribers that keep up, stall, or vanish.

    use std::time::{Instant, SystemTime};

    use plegd_runtime::PodRef;
    use plegd_telemetry::RelistSource;

    use super::*;
    use crate::event::EventKind;

    fn event(i: usize) -> LifecycleEvent {
        LifecycleEvent {
            revision: 0,
            time: SystemTime::now(),
            pod: PodRef {
                uid: "u1".into(),
                name: "web".into(),
                namespace: "ns".into(),
            },
            kind: EventKind::ContainerStarted,
            container_id: format!("c{i}"),
            relist_source: RelistSource::Global,
            container_name: "app".into(),
            sandbox: false,
            attempt: Some(0),
            image: None,
            exit: None,
        }
    }

    async fn subscribe(p: &Addr<EventPublisher>, name: &str, capacity: usize) -> Subscription {
        p.send(Subscribe {
            name: name.into(),
            capacity,
        })
        .await
        .unwrap()
    }

    #[actix_rt::test]
    async fn a_stalled_subscriber_loses_only_its_own_events_and_is_told_how_many() {
        let metrics = Arc::new(Metrics::new());
        let p = EventPublisher::new(metrics.clone()).start();
        let healthy = subscribe(&p, "healthy", 1000).await;
        let stalled = subscribe(&p, "stalled", 2).await;
        for i in 0..100 {
            p.send(Publish(vec![event(i)])).await.unwrap();
        }
        let got: Vec<Delivery> = healthy.try_iter().collect();
        assert_eq!(got.len(), 100);
        // One revision per event for everyone, from 1, strictly increasing.
        assert!(got
            .iter()
            .enumerate()
            .all(|(i, d)| d.event.revision == i as u64 + 1));
        assert!(got.iter().enumerate().all(|(i, d)| d.seq == i as u64 + 1
            && d.missed == 0
            && d.event.container_id == format!("c{i}")));
        // The stalled one kept the first two; it learns of the 98 others with its next
        // delivery, and the sequence shows the gap.
        let first: Vec<u64> = stalled.try_iter().map(|d| d.seq).collect();
        assert_eq!(first, [1, 2]);
        assert_eq!(metrics.discard_events.get(), 98);
        p.send(Publish(vec![event(100)])).await.unwrap();
        let next = stalled.try_recv().unwrap();
        assert_eq!((next.seq, next.missed, next.event.revision), (101, 98, 101));
        assert_eq!(healthy.try_recv().unwrap().seq, 101);
    }

    #[actix_rt::test]
    async fn a_vanished_subscriber_is_forgotten_and_the_others_go_on() {
        let metrics = Arc::new(Metrics::new());
        let p = EventPublisher::new(metrics.clone()).start();
        let stays = subscribe(&p, "stays", 10).await;
        let goes = subscribe(&p, "goes", 10).await;
        assert_eq!(metrics.subscribers.get(), 2);
        drop(goes);
        let deadline = Instant::now() + Duration::from_secs(20);
        while metrics.subscribers.get() != 1 {
            assert!(Instant::now() < deadline, "the dropped subscriber stayed");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        p.send(Publish(vec![event(0), event(1)])).await.unwrap();
        assert_eq!(stays.try_iter().count(), 2);
        assert_eq!(metrics.discard_events.get(), 0);
    }

    #[actix_rt::test]
    async fn stop_lets_subscribers_drain_then_disconnects_them() {
        let p = EventPublisher::new(Arc::new(Metrics::new())).start();
        let sub = subscribe(&p, "t", 10).await;
        p.send(Publish(vec![event(0)])).await.unwrap();
        p.send(Stop).await.unwrap();
        assert_eq!(sub.recv().unwrap().event.container_id, "c0");
        assert!(sub.recv().is_err());
    }
}
