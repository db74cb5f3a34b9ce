//! Reads beside a unit of work: while a global relist reads its lists and statuses,
//! or a batch reads a pod that a hint then asks about again, the containers the hint
//! names are read too (ContainerStatus alone, a few at a time), and an exit the pod's
//! record does not have is published at once, as a prefetch's early death is (`early`
//! module), rather than when the unit ends and the hint's own targeted relist runs.
//! The request stays pending all the same: this only publishes sooner what that
//! relist would find.
//!
//! The unit's lists, and its status reads, may be older than such a read (asked
//! before it): the containers reported are kept exited, with the status read beside,
//! in every pod the unit commits meanwhile (`GenericPleg::early`), and forgotten when
//! it ends.

use std::future::Future;
use std::sync::Arc;
use std::time::SystemTime;

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt as _, StreamExt as _};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::Semaphore;

use super::early::EarlyExits;
use super::output::RelistOutput;
use crate::event::RelistSource;
use plegd_runtime::{ContainerState, RuntimeClient};

/// ContainerStatus calls in flight beside a unit of work, at most (its own reads have
/// their own bound). Two at a time queued them behind each other in a burst, when
/// containerd answers each in tens of milliseconds (docs/architecture.md).
const BESIDE_CALLS: usize = 16;

/// Containers a hint names, to read beside the global relist in progress.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BesideAsk {
    pub uid: String,
    /// The hint's source: the events' `relist_source`.
    pub source: RelistSource,
    pub containers: Vec<String>,
}

/// What a global relist hands over as it goes.
#[derive(Debug)]
pub enum GlobalStep {
    /// A chunk of the relist; `last`: the relist's last.
    Chunk { out: RelistOutput, last: bool },
    /// Deaths read beside it: already in the records, to be applied and published.
    Early(RelistOutput),
}

/// What was read beside one global relist, for its debug line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BesideCounts {
    /// Containers asked.
    pub asked: usize,
    /// Of those, read and handled before the relist ended (the others' reads were
    /// dropped).
    pub answered: usize,
}

/// The asks of one global relist and their reads in flight.
pub(super) struct Beside<'a> {
    asks: Option<&'a mut UnboundedReceiver<BesideAsk>>,
    reads: FuturesUnordered<BoxFuture<'static, EarlyExits>>,
    pub(super) counts: BesideCounts,
    runtime: Arc<dyn RuntimeClient>,
    calls: Arc<Semaphore>,
}

impl<'a> Beside<'a> {
    /// `asks`: None, the relist reads nothing beside.
    pub(super) fn new(
        asks: Option<&'a mut UnboundedReceiver<BesideAsk>>,
        runtime: Arc<dyn RuntimeClient>,
    ) -> Self {
        Beside {
            asks,
            reads: FuturesUnordered::new(),
            counts: BesideCounts::default(),
            runtime,
            calls: Arc::new(Semaphore::new(BESIDE_CALLS)),
        }
    }

    /// Runs `work` (a part of the relist) to its end while reading what is asked
    /// meanwhile; each read's exits go through `deaths` (to the records) and what
    /// that gives is handed to `each` at once. Reads still in flight when `work`
    /// ends go on during the next part (or are dropped with the relist: their
    /// requests are still pending).
    pub(super) async fn during<T, D, F, Fut>(
        &mut self,
        work: impl Future<Output = T>,
        deaths: &mut D,
        each: &mut F,
    ) -> T
    where
        D: FnMut(EarlyExits) -> RelistOutput,
        F: FnMut(GlobalStep) -> Fut,
        Fut: Future<Output = ()>,
    {
        tokio::pin!(work);
        loop {
            tokio::select! {
                biased;
                t = &mut work => return t,
                exits = self.next_exits() => {
                    let out = deaths(exits);
                    if !out.is_empty() {
                        each(GlobalStep::Early(out)).await;
                    }
                }
            }
        }
    }

    /// The exits of the next read to end, reading what is asked meanwhile; pending
    /// for ever once nothing is asked or read.
    pub(super) async fn next_exits(&mut self) -> EarlyExits {
        loop {
            let open = self.asks.is_some();
            let next_ask = async {
                match self.asks.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                Some(exits) = self.reads.next() => {
                    self.counts.answered += 1;
                    return exits;
                }
                ask = next_ask, if open => match ask {
                    Some(ask) => self.read(ask),
                    None => self.asks = None,
                },
                else => std::future::pending::<()>().await,
            }
        }
    }

    /// One read per container, each timed from its own call (the event's time).
    fn read(&mut self, ask: BesideAsk) {
        self.counts.asked += ask.containers.len();
        for id in ask.containers {
            let runtime = self.runtime.clone();
            let calls = self.calls.clone();
            let (uid, source) = (ask.uid.clone(), ask.source);
            self.reads.push(
                async move {
                    let _permit = calls.acquire_owned().await;
                    let read_at = SystemTime::now();
                    let exited = match runtime.container_status(&id).await {
                        Ok(st) if st.state == ContainerState::Exited => vec![st],
                        Ok(_) => Vec::new(),
                        // Nothing to publish early: the pending request reads it again.
                        Err(e) => {
                            tracing::debug!(container = %id, error = %e, "status read beside a relist failed");
                            Vec::new()
                        }
                    };
                    EarlyExits {
                        uid,
                        source,
                        read_at,
                        exited,
                    }
                }
                .boxed(),
            );
        }
    }
}
