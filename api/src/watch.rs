//! One Watch stream: a subscriber of the EventPublisher with its own bounded queue
//! (--watch-queue), forwarded to the client by its own task. A client that does not
//! keep up only fills its own queue (the publisher drops for it alone); the
//! dispatcher and other watchers never wait for it.
//!
//! Order on the stream: Hello; with send_initial_events the synthetic snapshot events
//! and the bookmark that ends them (the subscription resumes exactly after the
//! snapshot's revision, so a change racing the snapshot is neither lost nor doubled);
//! then events (a replay from since_revision first), and idle bookmarks if asked.
//!
//! Losses: the stream follows a revision, `reached` (its last event's, or a filtered
//! one's, or the end of its last gap). Each loss the subscription gives is sent at
//! once as a Gap from `reached` through the loss's last revision, whatever the
//! filters, in its place: before any later event or bookmark, so a bookmark never
//! passes a loss not yet told. The next event's `missed` sums the Gaps since the
//! previous event, and its `seq` jumps by as much.

use std::sync::Arc;
use std::time::Duration;

use plegd_actors::{
    CacheSnapshot, CachedPod, Delivery, Loss, Pleg, PodLookup, Received, SubscribeError,
    Subscription,
};
use plegd_protocol::v1;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tonic::metadata::MetadataValue;
use tonic::Status;

use crate::clients::{Clients, WatcherGuard};
use crate::convert::{self, pod_labels};
use crate::filter::WatchFilter;

/// Messages buffered between a watcher's task and its client connection; beyond it
/// the task waits and the subscriber's own queue takes the overflow.
const STREAM_BUFFER: usize = 16;
/// The longest idle-bookmark interval accepted.
const MAX_BOOKMARK_INTERVAL_SECS: u32 = 3600;
/// Attempts at a snapshot whose revision the history still holds (only a burst of
/// more than --history-events events during one snapshot fails one).
const SNAPSHOT_ATTEMPTS: usize = 3;

pub type WatchStream = tokio_stream::wrappers::ReceiverStream<Result<v1::WatchResponse, Status>>;

/// What every watcher shares.
#[derive(Clone)]
pub struct WatchContext {
    pub pleg: Pleg,
    pub node_name: String,
    /// Capacity of each watcher's subscriber queue.
    pub queue: usize,
    /// Becomes true when plegd shuts down: streams end with UNAVAILABLE.
    pub shutdown: watch::Receiver<bool>,
    /// Where each stream is listed for ListClients.
    pub clients: Clients,
}

/// The status of a revision this plegd cannot serve: FAILED_PRECONDITION, with the
/// reason in the `plegd-reason` metadata key.
pub fn refused(reason: &'static str, message: String) -> Status {
    let mut status = Status::failed_precondition(message);
    status
        .metadata_mut()
        .insert("plegd-reason", MetadataValue::from_static(reason));
    status
}

pub fn shutting_down() -> Status {
    Status::unavailable("plegd is shutting down")
}

/// Where a stream starts.
enum Start {
    /// The snapshot to send first; the subscription resumes after its revision.
    Initial(CacheSnapshot),
    /// Replay after this revision, or live after it.
    From(u64),
}

/// Checks the request, subscribes, and starts the forwarding task.
pub async fn open(ctx: &WatchContext, req: v1::WatchRequest) -> Result<WatchStream, Status> {
    let filter = WatchFilter::from_request(&req)?;
    if req.bookmark_interval_seconds > MAX_BOOKMARK_INTERVAL_SECS {
        return Err(Status::invalid_argument(format!(
            "bookmark_interval_seconds: at most {MAX_BOOKMARK_INTERVAL_SECS}"
        )));
    }
    let instance = ctx.pleg.instance_id();
    if !req.instance_id.is_empty() && req.instance_id != instance {
        return Err(refused(
            "other-instance",
            format!(
                "instance_id {:?} is not this plegd's ({instance}): its revisions mean nothing here; list again",
                req.instance_id
            ),
        ));
    }
    let name = "api-watch";
    let (start, sub) = match (req.send_initial_events, req.since_revision) {
        (true, Some(_)) => {
            return Err(Status::invalid_argument(
                "send_initial_events and since_revision exclude each other",
            ))
        }
        (true, None) => initial(ctx, name).await?,
        (false, Some(after)) => {
            let sub = ctx
                .pleg
                .subscribe_after(name, ctx.queue, Some(after))
                .await
                .map_err(subscribe_error)?;
            (Start::From(after), sub)
        }
        (false, None) => {
            let sub = ctx
                .pleg
                .subscribe_after(name, ctx.queue, None)
                .await
                .map_err(subscribe_error)?;
            // Exactly where its live events begin.
            (Start::From(sub.starts_after()), sub)
        }
    };
    let (tx, rx) = mpsc::channel(STREAM_BUFFER);
    let hello = v1::Hello {
        instance_id: instance.to_string(),
        node_name: ctx.node_name.clone(),
        // Where its live events begin, not a later reading: an event published
        // meanwhile would be both in the Hello and sent.
        latest_revision: sub.live_after(),
        hint_sources: convert::hint_sources(&ctx.pleg),
        health: Some(convert::health(&ctx.pleg)),
    };
    let interval = (req.bookmark_interval_seconds > 0)
        .then(|| Duration::from_secs(u64::from(req.bookmark_interval_seconds)));
    let sub = Arc::new(sub);
    let client = ctx.clients.watcher(&req, ctx.queue, Arc::downgrade(&sub));
    let watcher = Watcher {
        client,
        pleg: ctx.pleg.clone(),
        filter,
        tx,
        shutdown: ctx.shutdown.clone(),
        seq: 0,
        missed: 0,
    };
    tokio::spawn(watcher.run(hello, start, sub, interval));
    Ok(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// A snapshot and a subscription resuming exactly after it.
async fn initial(ctx: &WatchContext, name: &str) -> Result<(Start, Subscription), Status> {
    let mut last = None;
    for _ in 0..SNAPSHOT_ATTEMPTS {
        let snapshot = ctx.pleg.snapshot().await.map_err(|_| shutting_down())?;
        match ctx
            .pleg
            .subscribe_after(name, ctx.queue, Some(snapshot.revision))
            .await
        {
            Ok(sub) => return Ok((Start::Initial(snapshot), sub)),
            Err(e @ SubscribeError::TooOld { .. }) => last = Some(e),
            Err(e) => return Err(subscribe_error(e)),
        }
    }
    Err(last.map_or_else(shutting_down, subscribe_error))
}

fn subscribe_error(e: SubscribeError) -> Status {
    match e {
        SubscribeError::TooOld {
            after,
            oldest_available,
        } => refused(
            "too-old",
            format!(
                "revision {after} is too old: the history starts after revision {}; list again",
                oldest_available.saturating_sub(1)
            ),
        ),
        SubscribeError::Future { after, latest } => refused(
            "future",
            format!(
                "revision {after} was never issued by this plegd (latest {latest}); list again"
            ),
        ),
        SubscribeError::Closed => shutting_down(),
    }
}

struct Watcher {
    /// Its entry in ListClients, while it lasts.
    client: WatcherGuard,
    pleg: Pleg,
    filter: WatchFilter,
    tx: mpsc::Sender<Result<v1::WatchResponse, Status>>,
    shutdown: watch::Receiver<bool>,
    /// The last sequence number sent on this stream.
    seq: u64,
    /// Events dropped in the Gaps sent since the last event (the next one's `missed`).
    missed: u64,
}

/// What wakes a watcher.
enum Next {
    Received(Option<Received>),
    /// Nothing was sent for the bookmark interval.
    Idle,
    Stop(Stop),
}

/// Why a stream stops.
enum Stop {
    /// The client went away.
    Gone,
    /// plegd shuts down (or its publisher closed).
    Shutdown,
}

impl Watcher {
    async fn run(
        mut self,
        hello: v1::Hello,
        start: Start,
        sub: Arc<Subscription>,
        interval: Option<Duration>,
    ) {
        let result = self.stream(hello, start, &sub, interval).await;
        if let Err(Stop::Shutdown) = result {
            // Best effort: the client may be gone too.
            let _ = self.tx.try_send(Err(shutting_down()));
        }
    }

    async fn stream(
        &mut self,
        hello: v1::Hello,
        start: Start,
        sub: &Subscription,
        interval: Option<Duration>,
    ) -> Result<(), Stop> {
        self.send(v1::watch_response::Kind::Hello(hello)).await?;
        let mut reached = match start {
            Start::From(rev) => rev,
            Start::Initial(snapshot) => {
                for (uid, pod) in &snapshot.pods {
                    self.send_snapshot_of(uid, pod, snapshot.revision).await?;
                }
                self.send(bookmark(snapshot.revision, true)).await?;
                snapshot.revision
            }
        };
        self.client.reached(reached);
        let mut last_sent = Instant::now();
        let tick = interval.unwrap_or(Duration::from_secs(3600));
        loop {
            let idle_bookmark = tokio::time::sleep_until(last_sent + tick);
            let next = tokio::select! {
                r = sub.next_async() => Next::Received(r),
                () = idle_bookmark, if interval.is_some() => Next::Idle,
                () = self.tx.closed() => Next::Stop(Stop::Gone),
                _ = self.shutdown.wait_for(|stop| *stop) => Next::Stop(Stop::Shutdown),
            };
            match next {
                Next::Received(None) => return Err(Stop::Shutdown),
                Next::Received(Some(Received::Event(d))) => {
                    reached = d.event.revision;
                    self.client.reached(reached);
                    if self.forward(d).await? {
                        last_sent = Instant::now();
                    }
                }
                Next::Received(Some(Received::Loss(loss))) => {
                    reached = self.tell(loss, reached).await?;
                    self.client.reached(reached);
                    last_sent = Instant::now();
                }
                Next::Idle => {
                    self.send(bookmark(reached, false)).await?;
                    last_sent = Instant::now();
                }
                Next::Stop(stop) => return Err(stop),
            }
        }
    }

    /// Sends the Gap of a loss that follows revision `reached`; the revision reached
    /// after it.
    async fn tell(&mut self, loss: Loss, reached: u64) -> Result<u64, Stop> {
        let gap = gap(loss, reached);
        self.missed += gap.dropped;
        self.client.dropped(gap.dropped);
        let through = gap.through_revision;
        self.send(v1::watch_response::Kind::Gap(gap)).await?;
        Ok(through)
    }

    /// Sends the delivery if the filters want it; true if sent.
    async fn forward(&mut self, d: Delivery) -> Result<bool, Stop> {
        let e = &d.event;
        let pleg = &self.pleg;
        let wanted = self.filter.wants_type(e.kind)
            && self
                .filter
                .wants_pod(&e.pod.uid, &e.pod.namespace, || labels_of(pleg, &e.pod.uid));
        if !wanted {
            return Ok(false);
        }
        let missed = std::mem::take(&mut self.missed);
        self.seq += missed + 1;
        let ev = convert::event(e, self.seq, missed);
        self.send(v1::watch_response::Kind::Event(ev)).await?;
        Ok(true)
    }

    async fn send_snapshot_of(
        &mut self,
        uid: &str,
        pod: &CachedPod,
        revision: u64,
    ) -> Result<(), Stop> {
        let Some(status) = &pod.status else {
            return Ok(());
        };
        if !self
            .filter
            .wants_pod(uid, &status.pod.namespace, || pod_labels(pod))
        {
            return Ok(());
        }
        for mut ev in convert::snapshot_events(pod, revision) {
            let wanted = v1::EventType::try_from(ev.r#type)
                .ok()
                .and_then(convert::event_kind)
                .is_some_and(|k| self.filter.wants_type(k));
            if wanted {
                self.seq += 1;
                ev.seq = self.seq;
                self.send(v1::watch_response::Kind::Event(ev)).await?;
            }
        }
        Ok(())
    }

    /// Waits for room on the stream, unless the client goes or plegd stops.
    async fn send(&mut self, kind: v1::watch_response::Kind) -> Result<(), Stop> {
        let msg = Ok(v1::WatchResponse { kind: Some(kind) });
        tokio::select! {
            sent = self.tx.send(msg) => sent.map_err(|_| Stop::Gone),
            _ = self.shutdown.wait_for(|stop| *stop) => Err(Stop::Shutdown),
        }
    }
}

/// The Gap telling `loss` on a stream that reached revision `reached`. The
/// subscription's own account of where the loss begins agrees with the stream's; were
/// it ever earlier, the earlier one is the safe resume point.
fn gap(loss: Loss, reached: u64) -> v1::Gap {
    debug_assert_eq!(
        loss.after, reached,
        "a loss that does not follow the stream"
    );
    v1::Gap {
        after_revision: loss.after.min(reached),
        through_revision: loss.through,
        dropped: loss.dropped,
    }
}

fn bookmark(revision: u64, initial_events_end: bool) -> v1::watch_response::Kind {
    v1::watch_response::Kind::Bookmark(v1::Bookmark {
        revision,
        initial_events_end,
    })
}

/// A pod's labels from the cache, or from its tombstone once it is gone.
fn labels_of(pleg: &Pleg, uid: &str) -> std::collections::BTreeMap<String, String> {
    match pleg.cache().lookup(uid) {
        PodLookup::Present(pod) | PodLookup::Removed { last: pod, .. } => pod_labels(&pod),
        PodLookup::Unknown | PodLookup::TimedOut(_) => Default::default(),
    }
}
