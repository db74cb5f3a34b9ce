//! The on-demand relist queue: the handle every request source holds. It stamps each
//! request with its enqueue time and `try_send`s it into the dispatcher's bounded
//! mailbox, never blocking; a full mailbox drops the request and counts it (the next
//! global relist reconciles). Once the dispatcher is asked to stop, it refuses every
//! request the same way (the dispatcher relists those it accepted before it stops).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use opentelemetry::trace::SpanContext;
use plegd_telemetry::{Metrics, RequestResult};

use super::dispatcher::{BringForward, RequestRelist};
use crate::event::RelistSource;

/// The handle every request source uses. Cheap to clone.
#[derive(Clone)]
pub struct RelistQueue {
    requests: Recipient<RequestRelist>,
    soon: Recipient<BringForward>,
    metrics: Arc<Metrics>,
    /// Set when the dispatcher is asked to stop: requests are refused from then on.
    closed: Arc<AtomicBool>,
}

impl RelistQueue {
    /// A queue in front of whatever handles the two messages: the dispatcher, or a
    /// recording actor in a component test.
    pub(crate) fn new(
        requests: Recipient<RequestRelist>,
        soon: Recipient<BringForward>,
        metrics: Arc<Metrics>,
    ) -> Self {
        RelistQueue {
            requests,
            soon,
            metrics,
            closed: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The same queue, refusing every request once `closed` is set.
    pub(crate) fn refusing_once(self, closed: Arc<AtomicBool>) -> Self {
        RelistQueue { closed, ..self }
    }

    /// Enqueues a targeted relist without blocking, remembering the span of its cause
    /// (linked from the relist's) and the container it is about, if any (its status is
    /// read together with the pod's lists). False if the queue was full (the request
    /// is dropped and counted), or the dispatcher is stopping or gone (dropped and
    /// counted too).
    pub fn request(
        &self,
        uid: &str,
        source: RelistSource,
        cause: Option<SpanContext>,
        container: Option<&str>,
    ) -> bool {
        if self.closed.load(Ordering::SeqCst) {
            self.metrics.count_request(RequestResult::Dropped, source);
            return false;
        }
        let msg = RequestRelist {
            uid: uid.to_string(),
            source,
            enqueued_at: Instant::now(),
            cause,
            prefetch: container.map(String::from).into_iter().collect(),
        };
        match self.requests.try_send(msg) {
            Ok(()) => {
                self.metrics.count_request(RequestResult::Queued, source);
                self.metrics.queue_depth.inc();
                true
            }
            Err(_) => {
                self.metrics.count_request(RequestResult::Dropped, source);
                false
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
