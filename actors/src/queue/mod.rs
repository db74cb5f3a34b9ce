//! The on-demand relist queue: the handle every request source holds, and the inbox
//! behind it. A request is stamped with its enqueue time and put in the inbox under a
//! lock, never blocking: one per pod (a newer request for a pod already there takes
//! its place, the older counted `merged`), at most `capacity` pods (a request for one
//! more is dropped and counted; the next global relist reconciles). The dispatcher is
//! woken by one message per drain, whatever the rate of requests, and takes the whole
//! inbox at once: no number of senders on any number of threads can keep its mailbox
//! busy and starve its schedule (actix handles mailbox messages until none is left
//! before it polls anything else). Once the dispatcher is asked to stop, the queue
//! refuses every request the same way (the dispatcher relists those it accepted).
//!
//! Requests from API clients (RequestRelist) have their own budget, apart from the
//! runtime's hints: at most `--api-relist-budget` pods wait with one (in the inbox or
//! in the dispatcher's pending requests, until their read begins or they are
//! settled), and those pods count in neither the inbox's capacity nor the
//! dispatcher's bound. So no flood of API requests, whatever its UIDs, makes a hint
//! from the runtime wait or drop.
//!
//! Below `relist` (the dispatcher reads it) and `sync` (a sync gate's release writes
//! into it): both import it, neither through the other.

mod priority;
pub(crate) mod request;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use actix::prelude::*;
use opentelemetry::trace::SpanContext;
use plegd_telemetry::{Metrics, Refusal, RequestResult};

use crate::event::RelistSource;
pub(crate) use priority::GlobalPriority;
pub(crate) use request::RequestRelist;
use request::{Added, ApiPlace, PodRequests};

/// Pods that may wait with an API client's request, by default: a node's pods with
/// room to spare (a pod worker asks once per pod it allocates or syncs).
pub const DEFAULT_API_RELIST_BUDGET: usize = 256;

/// What became of an API client's request (RequestRelist's answer).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ApiRelistOutcome {
    /// A new request for the pod waits.
    Queued,
    /// A request for the pod was waiting already (or a sync holds it): this one
    /// joined it.
    Coalesced,
    /// The API clients' budget was full: not queued (the next global relist covers
    /// the pod).
    Dropped,
    /// The dispatcher is stopping or gone.
    Unavailable,
}

/// The API clients' budget: how many pods wait with a request from one, at most.
#[derive(Clone, Debug)]
pub(crate) struct ApiBudget {
    waiting: Arc<AtomicUsize>,
    limit: usize,
}

impl ApiBudget {
    pub(crate) fn new(limit: usize) -> Self {
        ApiBudget {
            waiting: Arc::new(AtomicUsize::new(0)),
            limit,
        }
    }

    /// A place for one more pod, if the budget has one.
    fn take(&self) -> Option<Arc<ApiPlace>> {
        self.waiting
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .ok()
            .map(|_| Arc::new(ApiPlace(self.waiting.clone())))
    }

    /// Pods waiting with an API client's request.
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }
}

/// Tells the inbox's reader that requests wait. Sent once per drain.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Wake;

/// Asks the inbox's reader to bring the next global relist forward (at most once
/// per period).
#[derive(Message)]
#[rtype(result = "()")]
pub struct BringForward;

/// Where requests wait until the dispatcher takes them.
pub(crate) struct Inbox {
    pods: Mutex<PodRequests>,
    capacity: usize,
    /// A [`Wake`] is on its way (or the reader will look anyway): set by the request
    /// that finds it clear, cleared by [`Inbox::take`].
    woken: AtomicBool,
}

impl Inbox {
    /// An inbox of at most `capacity` pods (at least one).
    pub(crate) fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Inbox {
            pods: Mutex::new(PodRequests::default()),
            capacity: capacity.max(1),
            woken: AtomicBool::new(false),
        })
    }

    fn lock(&self) -> MutexGuard<'_, PodRequests> {
        // A panic while holding the lock leaves a consistent set (every mutation is
        // one push or one swap): go on with it.
        self.pods.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every request waiting, in arrival order; the next request wakes the reader.
    pub(crate) fn take(&self, metrics: &Metrics) -> Vec<RequestRelist> {
        self.woken.store(false, Ordering::SeqCst);
        let reqs = self.lock().take();
        metrics.queue_depth.set(0);
        reqs
    }

    /// Adds a request; false if the inbox was full (the request is dropped, counted).
    /// True if it was added and the reader must be woken.
    fn push(&self, req: RequestRelist, metrics: &Metrics) -> Result<bool, ()> {
        let source = req.source;
        let depth = {
            let mut pods = self.lock();
            match pods.add(req, self.capacity) {
                Added::New => {}
                Added::Merged(merged) => metrics.count_request(RequestResult::Merged, merged),
                Added::Refused(_) => {
                    metrics.count_request(RequestResult::Dropped, source);
                    return Err(());
                }
            }
            pods.len()
        };
        metrics.count_request(RequestResult::Queued, source);
        metrics.queue_depth.set(depth as i64);
        Ok(!self.woken.swap(true, Ordering::SeqCst))
    }

    /// Adds an API client's request: joins the request waiting for its pod, else
    /// takes a place in `budget` (none left: dropped, counted). The inbox's capacity
    /// is the runtime's, not the API's. With the outcome, whether the reader must be
    /// woken.
    fn push_api(
        &self,
        mut req: RequestRelist,
        budget: &ApiBudget,
        metrics: &Metrics,
    ) -> (ApiRelistOutcome, bool) {
        let source = req.source;
        let (outcome, depth) = {
            let mut pods = self.lock();
            let outcome = if pods.contains(&req.uid) {
                ApiRelistOutcome::Coalesced
            } else if let Some(place) = budget.take() {
                req.api = Some(place);
                ApiRelistOutcome::Queued
            } else {
                drop(pods);
                metrics.count_request(RequestResult::Dropped, source);
                metrics.count_refused(Refusal::RelistBudget);
                return (ApiRelistOutcome::Dropped, false);
            };
            // Merged, or holding a place: never refused.
            if let Added::Merged(merged) = pods.add(req, self.capacity) {
                metrics.count_request(RequestResult::Merged, merged);
            }
            (outcome, pods.len())
        };
        metrics.count_request(RequestResult::Queued, source);
        metrics.queue_depth.set(depth as i64);
        (outcome, !self.woken.swap(true, Ordering::SeqCst))
    }

    /// The reader could not be woken: the next request tries again.
    fn wake_failed(&self) {
        self.woken.store(false, Ordering::SeqCst);
    }
}

/// The handle every request source uses. Cheap to clone.
#[derive(Clone)]
pub struct RelistQueue {
    inbox: Arc<Inbox>,
    wake: Recipient<Wake>,
    soon: Recipient<BringForward>,
    metrics: Arc<Metrics>,
    /// Set when the dispatcher is asked to stop: requests are refused from then on.
    closed: Arc<AtomicBool>,
    /// Whether a global relist is due or running (hint sources wait then, but for the
    /// few items a running one hears).
    priority: GlobalPriority,
    /// The API clients' requests' own budget.
    api: ApiBudget,
}

impl RelistQueue {
    /// A queue whose inbox `wake` reads: the dispatcher, or a recording actor in a
    /// component test.
    pub(crate) fn new(
        inbox: Arc<Inbox>,
        wake: Recipient<Wake>,
        soon: Recipient<BringForward>,
        metrics: Arc<Metrics>,
    ) -> Self {
        RelistQueue {
            inbox,
            wake,
            soon,
            metrics,
            closed: Arc::new(AtomicBool::new(false)),
            priority: GlobalPriority::default(),
            api: ApiBudget::new(DEFAULT_API_RELIST_BUDGET),
        }
    }

    /// The same queue, with at most `budget` pods waiting with an API client's
    /// request (at least one).
    pub(crate) fn with_api_budget(self, budget: usize) -> Self {
        RelistQueue {
            api: ApiBudget::new(budget.max(1)),
            ..self
        }
    }

    /// Pods waiting with an API client's request.
    pub fn api_waiting(&self) -> usize {
        self.api.waiting()
    }

    /// The same queue, whose reader sets `priority`.
    pub(crate) fn with_priority(self, priority: GlobalPriority) -> Self {
        RelistQueue { priority, ..self }
    }

    /// Whether the global relist goes first now: hint sources wait for it.
    pub fn priority(&self) -> &GlobalPriority {
        &self.priority
    }

    /// The same queue, refusing every request once `closed` is set.
    pub(crate) fn refusing_once(self, closed: Arc<AtomicBool>) -> Self {
        RelistQueue { closed, ..self }
    }

    /// Enqueues a targeted relist without blocking, remembering the span of its cause
    /// (linked from the relist's) and the container it is about, if any (its status is
    /// read together with the pod's lists). False if the inbox was full (the request
    /// is dropped and counted), or the dispatcher is stopping or gone (dropped and
    /// counted too).
    pub fn request(
        &self,
        uid: &str,
        source: RelistSource,
        cause: Option<SpanContext>,
        container: Option<&str>,
    ) -> bool {
        self.push(RequestRelist {
            uid: uid.to_string(),
            source,
            enqueued_at: Instant::now(),
            cause,
            prefetch: container.map(String::from).into_iter().collect(),
            api: None,
        })
    }

    /// An API client's request (RequestRelist): under the API clients' own budget,
    /// never taking a place the runtime's hints need. Never blocks.
    pub fn request_api(&self, uid: &str, source: RelistSource) -> ApiRelistOutcome {
        let req = RequestRelist {
            uid: uid.to_string(),
            source,
            enqueued_at: Instant::now(),
            cause: None,
            prefetch: Vec::new(),
            api: None,
        };
        if self.closed.load(Ordering::SeqCst) || !self.wake.connected() {
            self.metrics.count_request(RequestResult::Dropped, source);
            return ApiRelistOutcome::Unavailable;
        }
        let (outcome, wake) = self.inbox.push_api(req, &self.api, &self.metrics);
        if wake && self.wake.try_send(Wake).is_err() {
            self.inbox.wake_failed();
        }
        outcome
    }

    /// Enqueues a request as it is (tests: one stamped in the past).
    pub(crate) fn push(&self, req: RequestRelist) -> bool {
        if self.closed.load(Ordering::SeqCst) || !self.wake.connected() {
            self.metrics
                .count_request(RequestResult::Dropped, req.source);
            return false;
        }
        match self.inbox.push(req, &self.metrics) {
            Err(()) => false,
            Ok(false) => true,
            Ok(true) => {
                if self.wake.try_send(Wake).is_err() {
                    self.inbox.wake_failed();
                }
                true
            }
        }
    }

    /// Asks for the next global relist to run now (after a stream reconnect: events
    /// around it may be lost). Honoured at most once per relist period; a brought-forward
    /// relist that failed (the runtime still down) does not count.
    pub fn bring_forward(&self) {
        let _ = self.soon.try_send(BringForward);
    }
}
