//! Mock actors for component tests: a [`Recorder`] stands in for any collaborator an
//! actor reaches through a `Recipient<M>`. It records what it receives, and can answer
//! late (each message holds its mailbox for a delay), stall (hold the mailbox until
//! released, so senders see it fill up), or have a tiny mailbox — so each actor is
//! tested alone against exactly the behaviour of its neighbours that matters.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use plegd_telemetry::Metrics;

use crate::queue::BringForward;
use crate::queue::{Inbox, RelistQueue, RequestRelist, Wake};

/// What a [`Recorder`] has received, readable from the test.
pub struct Recorded<M> {
    got: Arc<Mutex<Vec<M>>>,
    stalled: Arc<AtomicBool>,
}

impl<M> Clone for Recorded<M> {
    fn clone(&self) -> Self {
        Recorded {
            got: self.got.clone(),
            stalled: self.stalled.clone(),
        }
    }
}

impl<M: Clone> Recorded<M> {
    /// Everything received so far, in order.
    pub fn all(&self) -> Vec<M> {
        self.got.lock().map(|g| g.clone()).unwrap_or_default()
    }
}

impl<M> Recorded<M> {
    pub fn len(&self) -> usize {
        self.got.lock().map(|g| g.len()).unwrap_or(0)
    }

    /// Lets a stalled recorder handle its mailbox again.
    pub fn release(&self) {
        self.stalled.store(false, Ordering::SeqCst);
    }
}

/// Records every `M` it handles.
pub struct Recorder<M> {
    got: Arc<Mutex<Vec<M>>>,
    stalled: Arc<AtomicBool>,
    delay: Duration,
}

/// How a [`Recorder`] behaves.
#[derive(Clone, Copy, Debug, Default)]
pub struct RecorderConfig {
    /// Mailbox capacity. actix parks a sender once the queue holds `capacity`
    /// messages, after accepting that one: the real bound is capacity - 1 plus one per
    /// sender handle.
    pub capacity: Option<usize>,
    /// Each message holds the mailbox this long before it is acknowledged.
    pub delay: Duration,
    /// Start stalled: nothing is handled until [`Recorded::release`].
    pub stalled: bool,
}

impl<M> Recorder<M>
where
    M: Message<Result = ()> + Send + Unpin + 'static,
{
    /// Starts a recorder on the current arbiter.
    pub fn start(cfg: RecorderConfig) -> (Addr<Self>, Recorded<M>) {
        let got = Arc::new(Mutex::new(Vec::new()));
        let stalled = Arc::new(AtomicBool::new(cfg.stalled));
        let mut ctx = Context::new();
        if let Some(c) = cfg.capacity {
            ctx.set_mailbox_capacity(c);
        }
        let addr = ctx.run(Recorder {
            got: got.clone(),
            stalled: stalled.clone(),
            delay: cfg.delay,
        });
        (addr, Recorded { got, stalled })
    }
}

impl<M: Unpin + 'static> Actor for Recorder<M> {
    type Context = Context<Self>;
}

impl<M> Handler<M> for Recorder<M>
where
    M: Message<Result = ()> + Send + Unpin + 'static,
{
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, msg: M, ctx: &mut Self::Context) -> Self::Result {
        let stalled = self.stalled.clone();
        let delay = self.delay;
        let got = self.got.clone();
        let (done, acked) = tokio::sync::oneshot::channel();
        // Hold the mailbox (ctx.wait) while stalled or answering late, then record and
        // reply: a sender awaiting the reply sees it only after the delay.
        ctx.wait(
            async move {
                while stalled.load(Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                if let Ok(mut g) = got.lock() {
                    g.push(msg);
                }
                let _ = done.send(());
            }
            .into_actor(self),
        );
        Box::pin(
            async move {
                let _ = acked.await;
            }
            .into_actor(self),
        )
    }
}

/// Stands in for the dispatcher behind a [`RelistQueue`]: records every request it
/// takes from the queue's inbox. `capacity` is the inbox's (default 1024); a stalled
/// reader takes nothing until [`Recorded::release`], so the inbox fills.
pub fn recording_queue(
    cfg: RecorderConfig,
    soon: Recipient<BringForward>,
    metrics: Arc<Metrics>,
) -> (RelistQueue, Recorded<RequestRelist>) {
    let inbox = Inbox::new(cfg.capacity.unwrap_or(1024));
    let got = Arc::new(Mutex::new(Vec::new()));
    let stalled = Arc::new(AtomicBool::new(cfg.stalled));
    let reader = InboxReader {
        inbox: inbox.clone(),
        got: got.clone(),
        stalled: stalled.clone(),
        metrics: metrics.clone(),
    }
    .start();
    let queue = RelistQueue::new(inbox, reader.recipient(), soon, metrics);
    (queue, Recorded { got, stalled })
}

struct InboxReader {
    inbox: Arc<Inbox>,
    got: Arc<Mutex<Vec<RequestRelist>>>,
    stalled: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
}

impl InboxReader {
    fn read(&mut self, ctx: &mut Context<Self>) {
        if self.stalled.load(Ordering::SeqCst) {
            ctx.run_later(Duration::from_millis(1), Self::read);
            return;
        }
        let reqs = self.inbox.take(&self.metrics);
        if let Ok(mut g) = self.got.lock() {
            g.extend(reqs);
        }
    }
}

impl Actor for InboxReader {
    type Context = Context<Self>;
}

impl Handler<Wake> for InboxReader {
    type Result = ();

    fn handle(&mut self, _: Wake, ctx: &mut Self::Context) {
        self.read(ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Message, Clone, Debug, PartialEq)]
    #[rtype(result = "()")]
    struct Ping(u32);

    #[actix_rt::test]
    async fn a_late_recorder_acknowledges_only_after_its_delay() {
        let (addr, rec) = Recorder::<Ping>::start(RecorderConfig {
            delay: Duration::from_millis(50),
            ..RecorderConfig::default()
        });
        let start = std::time::Instant::now();
        addr.send(Ping(1)).await.unwrap();
        assert!(start.elapsed() >= Duration::from_millis(50));
        assert_eq!(rec.all(), vec![Ping(1)]);
    }

    #[actix_rt::test]
    async fn a_stalled_recorder_fills_its_mailbox_then_drains_on_release() {
        let (addr, rec) = Recorder::<Ping>::start(RecorderConfig {
            capacity: Some(2),
            stalled: true,
            ..RecorderConfig::default()
        });
        let mut accepted: u32 = 0;
        for i in 0..100 {
            if addr.try_send(Ping(i)).is_ok() {
                accepted += 1;
            }
        }
        // actix's bound is capacity - 1 + one per sender handle (one message may also be
        // taken out of the mailbox already, held by the stalled handler).
        assert!((2..=4).contains(&accepted), "accepted {accepted}");
        rec.release();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while rec.len() < accepted as usize {
            assert!(std::time::Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(rec.all(), (0..accepted).map(Ping).collect::<Vec<_>>());
    }
}
