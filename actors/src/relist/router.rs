//! Where every relist request source sends its requests (the hint sources): to the
//! pod's sync gate if a sync holds the pod (coalesced into one pending relist), else
//! straight into the dispatcher's bounded queue, unmerged (an API client's under the
//! API clients' own budget).

use std::sync::Arc;

use opentelemetry::trace::SpanContext;
use plegd_telemetry::{Metrics, RequestResult};

use crate::event::RelistSource;
use crate::queue::{ApiRelistOutcome, GlobalPriority, RelistQueue};
use crate::sync::HeldPods;

#[derive(Clone)]
pub struct RelistRouter {
    queue: RelistQueue,
    held: HeldPods,
    metrics: Arc<Metrics>,
}

impl RelistRouter {
    pub fn new(queue: RelistQueue, held: HeldPods, metrics: Arc<Metrics>) -> Self {
        RelistRouter {
            queue,
            held,
            metrics,
        }
    }

    /// Never blocks; `cause` is the span of what caused the request (linked from the
    /// relist), `container` the container it is about (prefetched by the relist; a
    /// request coalesced into a sync gate drops it). False only if the request was
    /// dropped (full queue, counted).
    pub fn request(
        &self,
        uid: &str,
        source: RelistSource,
        cause: Option<SpanContext>,
        container: Option<&str>,
    ) -> bool {
        if self.held.coalesce(uid) {
            self.metrics.count_request(RequestResult::Coalesced, source);
            return true;
        }
        self.queue.request(uid, source, cause, container)
    }

    /// An API client's request (RequestRelist), under the API clients' own budget; a
    /// held pod's joins its gate's pending relist. Never blocks.
    pub fn request_api(&self, uid: &str, source: RelistSource) -> ApiRelistOutcome {
        if self.held.coalesce(uid) {
            self.metrics.count_request(RequestResult::Coalesced, source);
            return ApiRelistOutcome::Coalesced;
        }
        self.queue.request_api(uid, source)
    }

    /// Whether the global relist goes first now: hint sources wait for it.
    pub fn priority(&self) -> &GlobalPriority {
        self.queue.priority()
    }

    /// Asks for the next global relist now (honoured at most once per period).
    pub fn bring_forward(&self) {
        self.queue.bring_forward();
    }
}
