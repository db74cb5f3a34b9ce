//! A request for a targeted relist, and the requests waiting one per pod: the
//! queue's inbox and the dispatcher's pending requests both hold them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use opentelemetry::trace::SpanContext;

use crate::event::RelistSource;

/// The most containers prefetched for one pod (the requests merged into its
/// relist asked for more: the rest are read as usual).
pub const MAX_PREFETCH: usize = 4;

/// A request for a relist of one pod. Built by [`super::RelistQueue::request`], which stamps
/// the enqueue time.
#[derive(Clone, Debug)]
pub struct RequestRelist {
    pub uid: String,
    pub source: RelistSource,
    pub enqueued_at: Instant,
    /// The span of what caused the request (a stream event), linked from the relist's.
    pub cause: Option<SpanContext>,
    /// Containers whose status the relist reads together with the pod's lists (the
    /// one the event is about; several once requests are merged, at most
    /// [`MAX_PREFETCH`]).
    pub prefetch: Vec<String>,
    /// The pod's place in the API clients' budget, when an API client asked for it
    /// (freed when the last copy of the request is dropped: read, settled or merged
    /// into one that keeps it).
    pub(crate) api: Option<Arc<ApiPlace>>,
}

/// One pod's place in the [`super::ApiBudget`]; given back when dropped.
#[derive(Debug)]
pub(crate) struct ApiPlace(pub(crate) Arc<AtomicUsize>);

impl Drop for ApiPlace {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Requests waiting, one per pod, in arrival order: the inbox, and the dispatcher's
/// pending requests.
#[derive(Default)]
pub(crate) struct PodRequests {
    reqs: Vec<RequestRelist>,
    /// Pod UID → its index in `reqs`.
    index: HashMap<String, usize>,
    /// How many of `reqs` hold a place in the API clients' budget (bounded by it, not
    /// by the bound of [`PodRequests::add`]).
    api: usize,
}

impl PodRequests {
    pub(crate) fn len(&self) -> usize {
        self.reqs.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    pub(crate) fn contains(&self, uid: &str) -> bool {
        self.index.contains_key(uid)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &RequestRelist> {
        self.reqs.iter()
    }

    /// Adds `req`: merged into the request waiting for its pod, else
    /// appended if fewer than `bound` pods wait without an API client's place (one
    /// with a place is bounded by the API budget instead); else given back (refused).
    pub(crate) fn add(&mut self, req: RequestRelist, bound: usize) -> Added {
        if let Some(&i) = self.index.get(&req.uid) {
            let had_place = self.reqs[i].api.is_some();
            let merged = merge(&mut self.reqs[i], req);
            if !had_place && self.reqs[i].api.is_some() {
                self.api += 1;
            }
            return Added::Merged(merged);
        }
        if req.api.is_none() && self.reqs.len() - self.api >= bound {
            return Added::Refused(req);
        }
        if req.api.is_some() {
            self.api += 1;
        }
        self.index.insert(req.uid.clone(), self.reqs.len());
        self.reqs.push(req);
        Added::New
    }

    /// Takes every request, in arrival order.
    pub(crate) fn take(&mut self) -> Vec<RequestRelist> {
        self.index.clear();
        self.api = 0;
        std::mem::take(&mut self.reqs)
    }

    /// Puts back requests taken (in their order, ahead of none: the set is empty or
    /// they come last).
    pub(crate) fn put_back(&mut self, reqs: impl IntoIterator<Item = RequestRelist>) {
        for req in reqs {
            if let Some(&i) = self.index.get(&req.uid) {
                // Cannot merge twice (one per pod), but keep the newer if it happens.
                if req.enqueued_at > self.reqs[i].enqueued_at {
                    self.reqs[i] = req;
                }
                continue;
            }
            self.index.insert(req.uid.clone(), self.reqs.len());
            self.reqs.push(req);
        }
        self.api = self.reqs.iter().filter(|r| r.api.is_some()).count();
    }
}

/// Merges two requests for one pod into `kept`: the newer is kept (a global relist
/// that covers it covers the older too), with the containers both asked to prefetch
/// (at most [`MAX_PREFETCH`]). Returns the source of the other, to count `merged`.
#[must_use]
pub(crate) fn merge(kept: &mut RequestRelist, req: RequestRelist) -> RelistSource {
    let mut merged = if req.enqueued_at >= kept.enqueued_at {
        std::mem::replace(kept, req)
    } else {
        req
    };
    if kept.api.is_none() {
        kept.api = merged.api.take();
    }
    let ids = &mut kept.prefetch;
    for id in merged.prefetch.drain(..) {
        if ids.len() < MAX_PREFETCH && !ids.contains(&id) {
            ids.push(id);
        }
    }
    merged.source
}

/// What [`PodRequests::add`] did with a request.
#[derive(Debug)]
pub(crate) enum Added {
    /// The first request for its pod.
    New,
    /// Merged with the request waiting for its pod: the source of the one to count
    /// `merged`.
    Merged(RelistSource),
    /// Too many pods wait: given back.
    Refused(RequestRelist),
}
