//! EventPublisher: fans lifecycle events out to any number of subscribers, each
//! through its own bounded queue. A full queue drops the event for that subscriber
//! only (counted in kubelet_pleg_discard_events) and never slows the dispatcher.
//!
//! Unlike kubelet, a drop is never silent: every event a subscriber is offered takes
//! the next number of its sequence, and each run of drops is one loss (the revisions
//! it covers and how many events it dropped), attached to the next event queued and
//! held for the subscription to take if none comes (see `subscription`); the
//! consumer knows what to replay from the history or re-read from the cache.
//!
//! Resuming (list + watch with resourceVersion): events come numbered (see
//! `revision`), and the publisher keeps the last `history` of them, shared with the
//! subscriptions that replay from it. A subscription from revision `r` is taken in
//! this actor's mailbox, between two published batches: it replays what the history
//! holds after `r`, and is offered every batch published after that — no gap, no
//! duplicate. `r` may be issued but not published yet (the cache already reflects it,
//! its events are on their way): then those events, up to `r`, are not offered.

use std::sync::Arc;

use actix::prelude::*;
use crossbeam_channel::{bounded, Sender, TrySendError};
use plegd_telemetry::Metrics;
use tokio::sync::Notify;

use crate::event::LifecycleEvent;
use crate::packed::PackedEvent;
use crate::revision::Revisions;
use crate::stop::Stop;
use crate::subscription::{
    lock_loss, read, Delivery, History, LossState, Queued, Replay, SharedHistory, SharedLoss,
    Subscription, Unsubscribe, WakeOnDrop,
};

/// Why a subscription from a revision was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubscribeError {
    /// `after` is older than the oldest event still in the history (the client must
    /// re-list).
    #[error(
        "revision {after} is too old: the oldest event still held is revision {oldest_available}"
    )]
    TooOld { after: u64, oldest_available: u64 },
    /// `after` is larger than any revision this instance issued.
    #[error("revision {after} was never issued by this plegd (latest: {latest})")]
    Future { after: u64, latest: u64 },
    /// The publisher is gone (shutting down).
    #[error("the event publisher is closed")]
    Closed,
}

struct Subscriber {
    id: u64,
    name: String,
    counted: bool,
    tx: Sender<Queued>,
    /// Dropped after `tx` (field order), so an async receiver it wakes sees the end.
    _wake_on_drop: WakeOnDrop,
    wake: Arc<Notify>,
    next_seq: u64,
    /// Its loss not yet taken, shared with its subscription.
    loss: SharedLoss,
    /// Events up to this revision are not offered (the subscriber resumed from it).
    skip_through: u64,
}

pub struct EventPublisher {
    subscribers: Vec<Subscriber>,
    next_id: u64,
    /// The revision of the last event published (0: none yet).
    published: u64,
    history: SharedHistory,
    revisions: Revisions,
    metrics: Arc<Metrics>,
}

impl EventPublisher {
    fn count_subscribers(&self) {
        let counted = self.subscribers.iter().filter(|s| s.counted).count();
        self.metrics.subscribers.set(counted as i64);
    }

    /// `history`: how many of the last published events are kept for replay.
    /// `revisions`: what the dispatcher has issued (a subscription may resume from
    /// any of them).
    pub fn new(metrics: Arc<Metrics>, history: usize, revisions: Revisions) -> Self {
        EventPublisher {
            subscribers: Vec::new(),
            next_id: 0,
            published: 0,
            history: History::shared(history),
            revisions,
            metrics,
        }
    }

    /// Goes on from a restart's stored history (oldest first) and the last revision
    /// stored (`state`): resumes replay from it as if plegd had never stopped.
    pub(crate) fn with_history(
        self,
        events: impl IntoIterator<Item = PackedEvent>,
        published: u64,
    ) -> Self {
        {
            let mut history = self.history.write().unwrap_or_else(|e| e.into_inner());
            for ev in events {
                history.push_packed(ev);
            }
            history.flush();
        }
        EventPublisher { published, ..self }
    }

    /// Keeps the history in a file at `path` (in the state dir) rather than in
    /// memory (`history_file`).
    pub fn with_history_file(self, path: &std::path::Path) -> Self {
        self.history
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .spill_to(path);
        self
    }

    /// Where a subscription from `after` starts replaying, or why it cannot.
    fn replay_from(&self, after: u64) -> Result<Replay, SubscribeError> {
        let latest = self.revisions.latest();
        if after > latest {
            return Err(SubscribeError::Future { after, latest });
        }
        let history = read(&self.history);
        let oldest_available = history.oldest().unwrap_or(self.published + 1);
        if after.saturating_add(1) < oldest_available {
            return Err(SubscribeError::TooOld {
                after,
                oldest_available,
            });
        }
        Ok(Replay {
            history: self.history.clone(),
            next: history.position_after(after),
            end: history.end(),
            next_seq: 1,
            reached: after,
            end_revision: self.published,
        })
    }
}

impl Actor for EventPublisher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(64);
    }
}

/// Adds a subscriber with a queue of `capacity` live events. `after`: resume after
/// this revision (replay the history, then live); None: only events published from
/// now on.
#[derive(Message)]
#[rtype(result = "Result<Subscription, SubscribeError>")]
pub struct Subscribe {
    pub name: String,
    pub capacity: usize,
    pub after: Option<u64>,
    /// Counted in `plegd_subscribers` (false: plegd's own bookkeeping, not an output).
    pub counted: bool,
}

impl Handler<Subscribe> for EventPublisher {
    type Result = MessageResult<Subscribe>;

    fn handle(&mut self, msg: Subscribe, ctx: &mut Self::Context) -> Self::Result {
        let (replay, skip_through) = match msg.after {
            None => (None, self.published),
            Some(after) => match self.replay_from(after) {
                Ok(r) => (Some(r), after.max(self.published)),
                Err(e) => return MessageResult(Err(e)),
            },
        };
        let first_live_seq = replay.as_ref().map_or(1, |r| 1 + r.end - r.next);
        let (tx, rx) = bounded(msg.capacity.max(1));
        let wake = Arc::new(Notify::new());
        let loss: SharedLoss =
            Arc::new(std::sync::Mutex::new(LossState::starting_at(skip_through)));
        self.next_id += 1;
        let id = self.next_id;
        self.subscribers.push(Subscriber {
            id,
            name: msg.name.clone(),
            counted: msg.counted,
            tx,
            _wake_on_drop: WakeOnDrop(wake.clone()),
            wake: wake.clone(),
            next_seq: first_live_seq,
            loss: loss.clone(),
            skip_through,
        });
        self.count_subscribers();
        MessageResult(Ok(Subscription::new(
            msg.name,
            msg.after.unwrap_or(self.published),
            skip_through,
            replay,
            rx,
            loss,
            wake,
            id,
            ctx.address().recipient(),
        )))
    }
}

impl Handler<Unsubscribe> for EventPublisher {
    type Result = ();

    fn handle(&mut self, msg: Unsubscribe, _: &mut Self::Context) {
        self.subscribers.retain(|s| s.id != msg.0);
        self.count_subscribers();
    }
}

/// The history's events as packed bytes, oldest first (a new state file's).
#[derive(Message)]
#[rtype(result = "Vec<Vec<u8>>")]
pub(crate) struct TakeHistory;

impl Handler<TakeHistory> for EventPublisher {
    type Result = MessageResult<TakeHistory>;

    fn handle(&mut self, _: TakeHistory, _: &mut Self::Context) -> Self::Result {
        MessageResult(read(&self.history).packed_bytes())
    }
}

/// Publishes the events of one relist, in order. Their revisions are already issued
/// (by the dispatcher) and larger than any published before.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Publish(pub Vec<LifecycleEvent>);

impl Handler<Publish> for EventPublisher {
    type Result = ();

    fn handle(&mut self, msg: Publish, _: &mut Self::Context) {
        let events: Vec<Arc<LifecycleEvent>> = msg.0.into_iter().map(Arc::new).collect();
        {
            let mut history = self.history.write().unwrap_or_else(|e| e.into_inner());
            for ev in &events {
                history.push(ev);
            }
            history.flush();
            self.metrics.history_events.set(history.len() as i64);
            self.metrics.history_bytes.set(history.heap_bytes() as i64);
        }
        for ev in events {
            self.metrics.count_event(ev.relist_source);
            debug_assert!(ev.revision > self.published, "revisions must increase");
            self.published = ev.revision;
            self.subscribers.retain_mut(|s| {
                if ev.revision <= s.skip_through {
                    return true;
                }
                let seq = s.next_seq;
                s.next_seq += 1;
                // Queued under the loss lock: see `LossState`.
                let mut loss = lock_loss(&s.loss);
                let attached = loss.pending();
                let queued = Queued {
                    delivery: Delivery {
                        seq,
                        missed: attached.map_or(0, |l| l.dropped),
                        event: ev.clone(),
                    },
                    loss: attached,
                };
                match s.tx.try_send(queued) {
                    Ok(()) => {
                        loss.queued(ev.revision);
                        drop(loss);
                        s.wake.notify_one();
                        true
                    }
                    Err(TrySendError::Full(_)) => {
                        let begins = loss.dropped(ev.revision);
                        drop(loss);
                        self.metrics.discard_events.inc();
                        self.metrics.subscriber_drops.inc();
                        if begins {
                            tracing::warn!(subscriber = %s.name, "subscriber queue full; dropping events");
                            // A receiver waiting on an empty queue learns of the loss.
                            s.wake.notify_one();
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
        self.count_subscribers();
    }
}

/// Stopping drops every subscriber (their queues drain, then report disconnection).
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
    //! The publisher alone, with subscribers that keep up, stall, vanish, or resume
    //! from a revision.

    use std::time::{Duration, Instant, SystemTime};

    use plegd_runtime::PodRef;
    use plegd_telemetry::RelistSource;

    use super::*;
    use crate::event::EventKind;

    /// The event numbered `i` gets revision `i + 1`, as the dispatcher issues them.
    fn event(i: usize) -> LifecycleEvent {
        LifecycleEvent {
            revision: i as u64 + 1,
            // A fixed time, so every event packs to the same size whatever the clock
            // (LEB128 nanoseconds take 1 to 5 bytes): the history's chunks fill alike.
            time: SystemTime::UNIX_EPOCH + Duration::new(1_764_000_000 + i as u64, 500_000_000),
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

    /// A publisher keeping `history` events, and the revisions its "dispatcher" issues.
    fn publisher(history: usize) -> (Addr<EventPublisher>, Revisions, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new());
        let revisions = Revisions::default();
        let p = EventPublisher::new(metrics.clone(), history, revisions.clone()).start();
        (p, revisions, metrics)
    }

    /// Issues then publishes events `from..to`, one relist each.
    async fn publish(p: &Addr<EventPublisher>, r: &Revisions, from: usize, to: usize) {
        for i in from..to {
            let mut batch = vec![event(i)];
            r.show(r.issue(&mut batch));
            assert_eq!(batch[0].revision, i as u64 + 1, "test numbering");
            p.send(Publish(batch)).await.unwrap();
        }
    }

    async fn subscribe(p: &Addr<EventPublisher>, name: &str, capacity: usize) -> Subscription {
        subscribe_after(p, name, capacity, None).await.unwrap()
    }

    async fn subscribe_after(
        p: &Addr<EventPublisher>,
        name: &str,
        capacity: usize,
        after: Option<u64>,
    ) -> Result<Subscription, SubscribeError> {
        p.send(Subscribe {
            name: name.into(),
            capacity,
            after,
            counted: true,
        })
        .await
        .unwrap()
    }

    fn revisions(got: &[Delivery]) -> Vec<u64> {
        got.iter().map(|d| d.event.revision).collect()
    }

    #[actix_rt::test]
    async fn a_stalled_subscriber_loses_only_its_own_events_and_is_told_how_many() {
        let (p, r, metrics) = publisher(16);
        let healthy = subscribe(&p, "healthy", 1000).await;
        let stalled = subscribe(&p, "stalled", 2).await;
        publish(&p, &r, 0, 100).await;
        let got: Vec<Delivery> = healthy.try_iter().collect();
        assert_eq!(got.len(), 100);
        // The revisions issued, as issued, for everyone.
        assert_eq!(revisions(&got), (1..=100).collect::<Vec<_>>());
        assert!(got.iter().enumerate().all(|(i, d)| d.seq == i as u64 + 1
            && d.missed == 0
            && d.event.container_id == format!("c{i}")));
        // The stalled one kept the first two; it learns of the 98 others with its next
        // delivery, and the sequence shows the gap.
        let first: Vec<u64> = stalled.try_iter().map(|d| d.seq).collect();
        assert_eq!(first, [1, 2]);
        assert_eq!(metrics.discard_events.get(), 98);
        publish(&p, &r, 100, 101).await;
        let next = stalled.try_recv().unwrap();
        assert_eq!((next.seq, next.missed, next.event.revision), (101, 98, 101));
        assert_eq!(healthy.try_recv().unwrap().seq, 101);
    }

    #[actix_rt::test]
    async fn a_vanished_subscriber_is_forgotten_and_the_others_go_on() {
        let (p, r, metrics) = publisher(16);
        let stays = subscribe(&p, "stays", 10).await;
        let goes = subscribe(&p, "goes", 10).await;
        assert_eq!(metrics.subscribers.get(), 2);
        drop(goes);
        let deadline = Instant::now() + Duration::from_secs(20);
        while metrics.subscribers.get() != 1 {
            assert!(Instant::now() < deadline, "the dropped subscriber stayed");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        publish(&p, &r, 0, 2).await;
        assert_eq!(stays.try_iter().count(), 2);
        assert_eq!(metrics.discard_events.get(), 0);
    }

    #[actix_rt::test]
    async fn stop_lets_subscribers_drain_then_disconnects_them() {
        let (p, r, _) = publisher(16);
        let sub = subscribe(&p, "t", 10).await;
        publish(&p, &r, 0, 1).await;
        // Resumed: one to replay, then one live, when the publisher stops.
        let resumed = subscribe_after(&p, "r", 10, Some(0)).await.unwrap();
        publish(&p, &r, 1, 2).await;
        p.send(Stop).await.unwrap();
        assert_eq!(sub.recv().unwrap().event.container_id, "c0");
        assert_eq!(sub.recv().unwrap().event.container_id, "c1");
        assert!(sub.recv().is_err());
        let got: Vec<u64> = std::iter::from_fn(|| resumed.recv().ok())
            .map(|d| d.event.revision)
            .collect();
        assert_eq!(got, [1, 2]);
        assert!(resumed.try_recv().is_err() && resumed.is_empty());
    }

    #[actix_rt::test]
    async fn an_async_receiver_gets_each_event_then_sees_the_publisher_close() {
        let (p, r, _) = publisher(16);
        let sub = Arc::new(subscribe(&p, "t", 10).await);
        let rx = sub.clone();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(d) = rx.recv_async().await {
                got.push(d.event.revision);
            }
            got
        });
        publish(&p, &r, 0, 5).await;
        p.send(Stop).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(20), reader)
            .await
            .expect("the async receiver saw the close")
            .unwrap();
        assert_eq!(got, [1, 2, 3, 4, 5]);
    }

    #[actix_rt::test]
    async fn resuming_replays_exactly_the_events_after_the_revision_then_goes_live() {
        let (p, r, _) = publisher(100);
        publish(&p, &r, 0, 10).await;
        let sub = subscribe_after(&p, "t", 10, Some(6)).await.unwrap();
        publish(&p, &r, 10, 12).await;
        let got: Vec<Delivery> = sub.try_iter().collect();
        assert_eq!(revisions(&got), [7, 8, 9, 10, 11, 12]);
        assert!(got
            .iter()
            .enumerate()
            .all(|(i, d)| d.seq == i as u64 + 1 && d.missed == 0));
        // From the latest: nothing to replay, live only; from 0: everything.
        let latest = subscribe_after(&p, "l", 10, Some(12)).await.unwrap();
        let all = subscribe_after(&p, "a", 100, Some(0)).await.unwrap();
        publish(&p, &r, 12, 13).await;
        assert_eq!(revisions(&latest.try_iter().collect::<Vec<_>>()), [13]);
        assert_eq!(
            revisions(&all.try_iter().collect::<Vec<_>>()),
            (1..=13).collect::<Vec<_>>()
        );
    }

    #[actix_rt::test]
    async fn the_history_reports_how_many_events_it_holds_and_their_bytes() {
        let (p, r, metrics) = publisher(100);
        publish(&p, &r, 0, 10).await;
        assert_eq!(metrics.history_events.get(), 10);
        let ten = metrics.history_bytes.get();
        // Packed: well under the ≈ 680 bytes of an event as a struct.
        assert!((10 * 40..10 * 150).contains(&ten), "{ten} bytes");
        publish(&p, &r, 10, 150).await;
        assert_eq!(metrics.history_events.get(), 100);
        let full = metrics.history_bytes.get();
        assert!((5 * ten..=12 * ten).contains(&full), "{full} bytes");
        // Full: it stays that size.
        publish(&p, &r, 150, 300).await;
        assert_eq!(metrics.history_events.get(), 100);
        let now = metrics.history_bytes.get();
        assert!(
            (full - 100..=full + 100).contains(&now),
            "{full} then {now}"
        );
        // And what it holds is the events as published.
        let replay = subscribe_after(&p, "t", 1, Some(298)).await.unwrap();
        let got: Vec<Delivery> = replay.try_iter().collect();
        assert_eq!(revisions(&got), [299, 300]);
        let mut want = event(299);
        want.time = got[1].event.time;
        assert_eq!(*got[1].event, want);
    }

    #[actix_rt::test]
    async fn a_revision_older_than_the_history_or_never_issued_is_refused() {
        let (p, r, _) = publisher(4);
        // Nothing issued yet: 0 is fine, 1 is in the future.
        assert!(subscribe_after(&p, "t", 10, Some(0)).await.is_ok());
        assert!(matches!(
            subscribe_after(&p, "t", 10, Some(1)).await,
            Err(SubscribeError::Future {
                after: 1,
                latest: 0
            })
        ));
        publish(&p, &r, 0, 10).await;
        // The history holds 7..=10: resuming after 6 still works, after 5 does not.
        let ok = subscribe_after(&p, "t", 10, Some(6)).await.unwrap();
        assert_eq!(revisions(&ok.try_iter().collect::<Vec<_>>()), [7, 8, 9, 10]);
        let err = subscribe_after(&p, "t", 10, Some(5)).await.err();
        assert_eq!(
            err,
            Some(SubscribeError::TooOld {
                after: 5,
                oldest_available: 7
            })
        );
        assert!(err.is_some_and(|e| e.to_string().contains("too old")));
        assert_eq!(
            subscribe_after(&p, "t", 10, Some(11)).await.err(),
            Some(SubscribeError::Future {
                after: 11,
                latest: 10
            })
        );
        p.send(Stop).await.unwrap();
        assert!(p
            .send(Subscribe {
                name: "late".into(),
                capacity: 1,
                after: Some(10),
                counted: true,
            })
            .await
            .is_err());
    }

    #[actix_rt::test]
    async fn with_no_history_only_the_latest_published_revision_can_be_resumed() {
        let (p, r, _) = publisher(0);
        publish(&p, &r, 0, 3).await;
        assert!(matches!(
            subscribe_after(&p, "t", 10, Some(2)).await,
            Err(SubscribeError::TooOld {
                after: 2,
                oldest_available: 4
            })
        ));
        let sub = subscribe_after(&p, "t", 10, Some(3)).await.unwrap();
        publish(&p, &r, 3, 4).await;
        assert_eq!(revisions(&sub.try_iter().collect::<Vec<_>>()), [4]);
    }

    #[actix_rt::test]
    async fn a_revision_issued_but_not_yet_published_skips_its_events_when_they_come() {
        let (p, r, _) = publisher(100);
        publish(&p, &r, 0, 2).await;
        // The dispatcher issued 3..=5 and applied them to the cache; a snapshot then
        // reflects 5 while the events are still on their way to the publisher.
        let mut batch = vec![event(2), event(3), event(4)];
        assert_eq!(r.issue(&mut batch), 5);
        r.show(5);
        let sub = subscribe_after(&p, "t", 10, Some(5)).await.unwrap();
        let from_4 = subscribe_after(&p, "t4", 10, Some(4)).await.unwrap();
        p.send(Publish(batch)).await.unwrap();
        publish(&p, &r, 5, 6).await;
        let got: Vec<Delivery> = sub.try_iter().collect();
        assert_eq!(revisions(&got), [6]);
        assert_eq!(got[0].seq, 1);
        assert_eq!(revisions(&from_4.try_iter().collect::<Vec<_>>()), [5, 6]);
    }

    #[actix_rt::test]
    async fn a_replay_longer_than_the_live_queue_is_delivered_whole_then_the_queue_bounds_live_events(
    ) {
        let (p, r, _) = publisher(1000);
        publish(&p, &r, 0, 500).await;
        let sub = subscribe_after(&p, "t", 4, Some(0)).await.unwrap();
        // Ten more while the subscriber reads nothing: its live queue holds 4.
        publish(&p, &r, 500, 510).await;
        let got: Vec<Delivery> = sub.try_iter().collect();
        assert_eq!(revisions(&got), (1..=504).collect::<Vec<_>>());
        // Sequence numbers run on from the replay into the live events.
        assert!(got
            .iter()
            .enumerate()
            .all(|(i, d)| d.seq == i as u64 + 1 && d.missed == 0));
        // The next one tells of the 6 live events the full queue lost.
        publish(&p, &r, 510, 511).await;
        let next = sub.try_recv().unwrap();
        assert_eq!((next.event.revision, next.seq, next.missed), (511, 511, 6));
    }

    #[actix_rt::test]
    async fn a_replay_outrun_by_the_history_reports_what_it_missed() {
        let (p, r, _) = publisher(10);
        publish(&p, &r, 0, 10).await;
        let sub = subscribe_after(&p, "t", 100, Some(0)).await.unwrap();
        assert_eq!(sub.try_recv().unwrap().event.revision, 1);
        // 13 more evict 2..=10 (and 11..=13) before the subscriber reads on.
        publish(&p, &r, 10, 23).await;
        let got: Vec<Delivery> = sub.try_iter().collect();
        // Nothing of the replay is left: the first live event carries the loss.
        assert_eq!(revisions(&got), (11..=23).collect::<Vec<_>>());
        assert_eq!((got[0].seq, got[0].missed), (11, 9));
        assert!(got[1..].iter().all(|d| d.missed == 0));

        // Partly outrun: the replay goes on from the oldest event still held.
        let (p, r, _) = publisher(10);
        publish(&p, &r, 0, 10).await;
        let sub = subscribe_after(&p, "t", 100, Some(0)).await.unwrap();
        publish(&p, &r, 10, 14).await;
        let got: Vec<Delivery> = sub.try_iter().collect();
        assert_eq!(revisions(&got), (5..=14).collect::<Vec<_>>());
        assert_eq!((got[0].seq, got[0].missed), (5, 4));
    }

    use crate::subscription::{Loss, Received};

    /// Everything `try_next` gives now.
    fn items(sub: &Subscription) -> Vec<Received> {
        std::iter::from_fn(|| sub.try_next().ok()).collect()
    }

    fn losses(got: &[Received]) -> Vec<Loss> {
        got.iter()
            .filter_map(|r| match r {
                Received::Loss(l) => Some(*l),
                Received::Event(_) => None,
            })
            .collect()
    }

    #[actix_rt::test]
    async fn a_loss_is_given_once_the_queue_drains_even_when_nothing_follows_it() {
        let (p, r, _) = publisher(100);
        publish(&p, &r, 0, 3).await;
        let sub = subscribe(&p, "t", 2).await;
        // 4 and 5 queued, 6..=10 dropped, and nothing after.
        publish(&p, &r, 3, 10).await;
        let pending = Loss {
            after: 5,
            through: 10,
            dropped: 5,
        };
        assert_eq!(sub.pending_loss(), Some(pending));
        let got = items(&sub);
        assert_eq!(got.len(), 3, "{got:?}");
        assert!(matches!(&got[0], Received::Event(d) if d.event.revision == 4));
        assert!(matches!(&got[1], Received::Event(d) if d.event.revision == 5));
        assert_eq!(losses(&got), [pending]);
        assert_eq!(sub.pending_loss(), None);
        // The next event counts it in `missed` and its sequence shows it; a second
        // run of drops starts where the first ended.
        publish(&p, &r, 10, 14).await;
        let got = items(&sub);
        assert!(matches!(&got[0], Received::Event(d)
            if (d.event.revision, d.seq, d.missed) == (11, 8, 5)));
        assert_eq!(
            losses(&got),
            [Loss {
                after: 12,
                through: 14,
                dropped: 2
            }]
        );
        publish(&p, &r, 14, 17).await;
        assert_eq!(
            losses(&items(&sub)),
            [Loss {
                after: 16,
                through: 17,
                dropped: 1
            }]
        );
    }

    #[actix_rt::test]
    async fn a_loss_comes_after_what_was_queued_before_it_and_before_what_was_queued_after() {
        let (p, r, _) = publisher(100);
        let sub = subscribe(&p, "t", 3).await;
        publish(&p, &r, 0, 6).await;
        // The subscriber reads one: room for one more, which carries the loss.
        assert_eq!(
            sub.try_next().ok().map(|r| matches!(r, Received::Event(_))),
            Some(true)
        );
        publish(&p, &r, 6, 7).await;
        let got = items(&sub);
        let order: Vec<String> = got
            .iter()
            .map(|r| match r {
                Received::Event(d) => format!("e{}", d.event.revision),
                Received::Loss(l) => format!("l{}-{}x{}", l.after, l.through, l.dropped),
            })
            .collect();
        assert_eq!(order, ["e2", "e3", "l3-6x3", "e7"]);
        assert!(matches!(&got[3], Received::Event(d) if d.missed == 3 && d.seq == 7));
        // The deliveries-only receive counts the same loss into `missed`.
        let (p, r, _) = publisher(100);
        let old = subscribe(&p, "old", 3).await;
        publish(&p, &r, 0, 6).await;
        assert_eq!(old.try_recv().unwrap().event.revision, 1);
        publish(&p, &r, 6, 7).await;
        let got: Vec<(u64, u64)> = old
            .try_iter()
            .map(|d| (d.event.revision, d.missed))
            .collect();
        assert_eq!(got, [(2, 0), (3, 0), (7, 3)]);
    }

    #[actix_rt::test]
    async fn a_loss_is_given_after_the_publisher_closes() {
        let (p, r, _) = publisher(100);
        let sub = Arc::new(subscribe(&p, "t", 1).await);
        publish(&p, &r, 0, 4).await;
        p.send(Stop).await.unwrap();
        let mut got = Vec::new();
        while let Some(r) = sub.next_async().await {
            got.push(r);
        }
        assert!(matches!(&got[0], Received::Event(d) if d.event.revision == 1));
        assert_eq!(
            losses(&got),
            [Loss {
                after: 1,
                through: 4,
                dropped: 3
            }]
        );
    }

    #[actix_rt::test]
    async fn an_async_receiver_waiting_on_an_empty_queue_learns_of_a_loss() {
        let (p, r, _) = publisher(100);
        publish(&p, &r, 0, 2).await;
        let sub = Arc::new(subscribe(&p, "t", 1).await);
        let rx = sub.clone();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            while let Some(r) = rx.next_async().await {
                let loss = matches!(r, Received::Loss(_));
                got.push(r);
                if loss {
                    break;
                }
                // Stalls after its first event until the loss is there.
                let deadline = Instant::now() + Duration::from_secs(20);
                while rx.pending_loss().is_none() {
                    assert!(Instant::now() < deadline, "no loss");
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            got
        });
        publish(&p, &r, 2, 6).await;
        let got = tokio::time::timeout(Duration::from_secs(20), reader)
            .await
            .expect("the loss reached the waiting receiver")
            .unwrap();
        let loss = losses(&got)[0];
        assert_eq!((loss.through, loss.dropped + got.len() as u64 - 1), (6, 4));
        assert_eq!(loss.after, 2 + got.len() as u64 - 1);
    }

    #[actix_rt::test]
    async fn a_replay_outrun_by_the_history_gives_the_revisions_it_lost() {
        let (p, r, _) = publisher(10);
        publish(&p, &r, 0, 10).await;
        let sub = subscribe_after(&p, "t", 100, Some(0)).await.unwrap();
        assert!(matches!(sub.try_next(), Ok(Received::Event(d)) if d.event.revision == 1));
        // Evicts 2..=13: the replay (2..=10) is lost whole; its live events are queued.
        publish(&p, &r, 10, 23).await;
        let got = items(&sub);
        assert_eq!(
            losses(&got),
            [Loss {
                after: 1,
                through: 10,
                dropped: 9
            }]
        );
        assert!(matches!(&got[0], Received::Loss(_)));
        assert!(matches!(&got[1], Received::Event(d)
            if (d.event.revision, d.seq, d.missed) == (11, 11, 9)));
        assert_eq!(got.len(), 14);

        // Partly outrun: lost up to the last event evicted, then the replay goes on.
        let (p, r, _) = publisher(10);
        publish(&p, &r, 0, 10).await;
        let sub = subscribe_after(&p, "t", 100, Some(0)).await.unwrap();
        publish(&p, &r, 10, 14).await;
        let got = items(&sub);
        assert_eq!(
            losses(&got),
            [Loss {
                after: 0,
                through: 4,
                dropped: 4
            }]
        );
        assert!(matches!(&got[1], Received::Event(d) if d.event.revision == 5 && d.missed == 4));
        assert_eq!(got.len(), 11);
    }

    /// A publisher as [`publisher`], its history spilled to a file at `path`.
    fn spilled(
        history: usize,
        path: &std::path::Path,
    ) -> (Addr<EventPublisher>, Revisions, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new());
        let revisions = Revisions::default();
        let p = EventPublisher::new(metrics.clone(), history, revisions.clone())
            .with_history(Vec::new(), 0)
            .with_history_file(path)
            .start();
        (p, revisions, metrics)
    }

    /// What subscribers from several revisions receive while `total` events are
    /// published in runs, some outrun by the history (`history` events), with the
    /// history's size at the end.
    async fn replays(
        (p, r, metrics): (Addr<EventPublisher>, Revisions, Arc<Metrics>),
        history: usize,
        total: usize,
    ) -> (Vec<Vec<Received>>, i64) {
        let mut subs = Vec::new();
        let mut got = Vec::new();
        let mut at = 0;
        while at < total {
            let to = (at + history / 3 + 7).min(total);
            publish(&p, &r, at, to).await;
            at = to;
            // One resumes from just inside the history, one from its oldest event.
            for after in [
                at.saturating_sub(history / 2),
                at.saturating_sub(history - 1),
            ] {
                subs.push(
                    subscribe_after(&p, "t", 4, Some(after as u64))
                        .await
                        .unwrap(),
                );
            }
            // Half read on at once, the others only at the end (outrun meanwhile).
            for sub in subs.iter().skip(subs.len() - 2).step_by(2) {
                got.push(items(sub));
            }
        }
        got.extend(subs.iter().map(items));
        (got, metrics.history_events.get())
    }

    fn strip_times(got: Vec<Vec<Received>>) -> Vec<Vec<String>> {
        got.into_iter()
            .map(|items| {
                items
                    .into_iter()
                    .map(|r| match r {
                        Received::Event(d) => {
                            let mut ev = (*d.event).clone();
                            ev.time = std::time::UNIX_EPOCH;
                            format!("{} {} {:?}", d.seq, d.missed, ev)
                        }
                        Received::Loss(l) => format!("{l:?}"),
                    })
                    .collect()
            })
            .collect()
    }

    #[actix_rt::test]
    async fn a_history_in_a_file_replays_and_evicts_exactly_as_one_in_memory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history");
        // 12,000 events of ≈ 100 bytes through 1,000 slots: the file's dead head
        // passes the compaction threshold several times.
        let (memory, _) = replays(publisher(1_000), 1_000, 12_000).await;
        let (file, held) = replays(spilled(1_000, &path), 1_000, 12_000).await;
        assert_eq!(held, 1_000);
        assert!(memory
            .iter()
            .flatten()
            .any(|r| matches!(r, Received::Loss(_))));
        assert_eq!(strip_times(file), strip_times(memory));
        let on_disk = std::fs::metadata(&path).unwrap().len();
        assert!(
            on_disk < 3 << 20,
            "the file keeps its dead head: {on_disk} bytes"
        );
    }

    #[actix_rt::test]
    async fn a_history_in_a_file_takes_a_fraction_of_the_memory() {
        let dir = tempfile::tempdir().unwrap();
        let (p, r, in_memory) = publisher(10_000);
        publish(&p, &r, 0, 10_000).await;
        let (p, r, in_file) = spilled(10_000, &dir.path().join("history"));
        publish(&p, &r, 0, 10_000).await;
        let (memory, file) = (in_memory.history_bytes.get(), in_file.history_bytes.get());
        // 16 bytes an event in the index (its room rounded up to a power of two),
        // against the packed event itself in memory (≈ 70 bytes for these).
        assert!(
            file * 2 < memory,
            "{file} bytes in a file's index vs {memory} in memory"
        );
        assert!(file <= 32 * 10_000, "{file} bytes for 10,000 events");
    }

    #[actix_rt::test]
    async fn a_history_file_that_cannot_be_written_goes_back_to_memory_losing_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("history");
        // Every write to /dev/full fails with ENOSPC (the link, not the device, is
        // removed when the history leaves the file).
        std::os::unix::fs::symlink("/dev/full", &path).unwrap();
        let (memory, _) = replays(publisher(100), 100, 1_000).await;
        let (file, held) = replays(spilled(100, &path), 100, 1_000).await;
        assert_eq!(held, 100);
        assert_eq!(strip_times(file), strip_times(memory));
        assert!(std::fs::symlink_metadata(&path).is_err());
        assert!(std::path::Path::new("/dev/full").exists());
    }
}
