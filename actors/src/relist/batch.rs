//! A batch of targeted relists as the dispatcher runs it: the requests it starts with
//! and those the dispatcher hands it while it runs, each pod applied and published as
//! soon as it is read (deaths a prefetch shows, before its lists answer), each read
//! reported back to the dispatcher, and what the batch did for its debug lines.

use std::time::{Duration, Instant};

use futures::future::Either;
use opentelemetry::global::BoxedSpan;
use opentelemetry::trace::Span as _;
use opentelemetry::KeyValue;
use plegd_telemetry::{RelistPhase, RequestResult};
use tokio::sync::mpsc::UnboundedReceiver;

use super::apply::{apply, DispatcherDeps};
use crate::event::RelistSource;
use crate::pleg::{BesideAsk, EarlyDeaths, GenericPleg, PodAsk, PodStep};
use crate::queue::{GlobalPriority, RequestRelist};
use crate::spans;

/// What a batch did, for its debug lines.
pub(super) struct BatchSummary {
    pub(super) pods: usize,
    pub(super) events: usize,
    /// Of `events`, the deaths published before their pod's lists answered.
    pub(super) early: usize,
    pub(super) failed: usize,
    pub(super) took: Duration,
    /// The longest a request of the batch waited for the batch to take it.
    pub(super) max_waited: Duration,
    /// Each pod's outcome, if debug lines are on.
    pub(super) pods_detail: Vec<PodLine>,
    /// Requests the batch took but did not start before a global relist came due:
    /// they wait again (a global relist that starts after them covers them).
    pub(super) deferred: Vec<RequestRelist>,
}

/// One pod of a batch, for its debug line.
pub(super) struct PodLine {
    pub(super) uid: String,
    pub(super) source: RelistSource,
    /// From the request's enqueue to the batch taking it.
    pub(super) waited: Duration,
    /// From the batch taking it to the end of this pod's read.
    pub(super) took: Duration,
    pub(super) events: usize,
    pub(super) error: Option<String>,
}

/// A batch of targeted relists: the requests it starts with, where it takes more
/// (`more`: it ends once that is closed and its reads are done), where it reports
/// each pod read (its UID), and whether a global relist is due (no read starts then
/// but the first round).
pub(super) struct Batch {
    pub(super) reqs: Vec<RequestRelist>,
    pub(super) priority: GlobalPriority,
    pub(super) more: UnboundedReceiver<Taken>,
    /// Containers to read beside the batch (of pods whose read is in progress).
    pub(super) beside: UnboundedReceiver<BesideAsk>,
    pub(super) read: futures::channel::mpsc::UnboundedSender<String>,
}

/// A request a batch relists (the pod it reads), with its span (linked to its cause)
/// and when the batch took it.
pub(super) struct Taken {
    pub(super) req: RequestRelist,
    pub(super) span: BoxedSpan,
    pub(super) taken_at: Instant,
}

impl Taken {
    pub(super) fn new(req: RequestRelist) -> Taken {
        let span = spans::start(
            spans::TARGETED_RELIST,
            vec![
                KeyValue::new("relist_source", req.source.as_str()),
                KeyValue::new("pod.uid", req.uid.clone()),
            ],
            req.cause.as_ref(),
        );
        Taken {
            req,
            span,
            taken_at: Instant::now(),
        }
    }
}

impl PodAsk for Taken {
    fn uid(&self) -> &str {
        &self.req.uid
    }

    fn source(&self) -> RelistSource {
        self.req.source
    }

    fn prefetch(&self) -> &[String] {
        &self.req.prefetch
    }
}

/// The relists of a batch of pods the dispatcher has settled must run, and of those
/// it hands the batch while it runs (`more`): all read at once, each pod applied and
/// published as soon as it is read (`GenericPleg::relist_pods_each`: none waits for
/// the batch's slowest read, nor for the batch to end). `detail`: report each pod's
/// outcome (for the debug lines).
pub(super) async fn targeted_relists(
    core: &mut GenericPleg,
    deps: &DispatcherDeps,
    batch: Batch,
    detail: bool,
) -> BatchSummary {
    let Batch {
        reqs,
        priority,
        mut more,
        mut beside,
        read,
    } = batch;
    let start = Instant::now();
    let mut summary = BatchSummary {
        pods: 0,
        events: 0,
        early: 0,
        failed: 0,
        took: Duration::ZERO,
        max_waited: Duration::ZERO,
        pods_detail: Vec::new(),
        deferred: Vec::new(),
    };
    let asks = reqs.into_iter().map(Taken::new).collect();
    let held = deps.held.clone();
    // A sync that takes a pod meanwhile gets its request as its pending relist.
    let held = |uid: &str| held.coalesce(uid);
    let give_way = || priority.first(Instant::now());
    let left = core
        .relist_pods_each(
            asks,
            Some(&mut more),
            Some(&give_way),
            &held,
            EarlyDeaths::On(Some(&mut beside)),
            |step| {
                let (taken, out, error) = match step {
                    PodStep::Early(out) => {
                        summary.events += out.events.len();
                        summary.early += out.events.len();
                        return Either::Left(async move { apply(deps, out, None, false).await });
                    }
                    PodStep::Read(taken, out, error) => (taken, out, error),
                };
                let Taken {
                    req,
                    mut span,
                    taken_at,
                } = taken;
                // The dispatcher runs it again if a request came meanwhile, and closes
                // `more` once no pod is left. (It outlives the batch.)
                let _ = read.unbounded_send(req.uid.clone());
                let events = out.events.len();
                match &error {
                    Some(e) => span.set_status(opentelemetry::trace::Status::error(e.to_string())),
                    None => span.set_attribute(KeyValue::new("events", events as i64)),
                }
                span.end();
                let waited = taken_at.saturating_duration_since(req.enqueued_at);
                summary.pods += 1;
                summary.events += events;
                summary.max_waited = summary.max_waited.max(waited);
                if error.is_some() {
                    summary.failed += 1;
                    deps.metrics.count_relist_errors(RelistPhase::List, 1);
                }
                if detail {
                    summary.pods_detail.push(PodLine {
                        uid: req.uid,
                        source: req.source,
                        waited,
                        took: taken_at.elapsed(),
                        events,
                        error: error.as_ref().map(|e| e.to_string()),
                    });
                }
                let source = req.source;
                Either::Right(async move {
                    if !out.is_empty() {
                        apply(deps, out, None, false).await;
                    }
                    deps.metrics
                        .observe_pod_relist(source, taken_at.elapsed().as_secs_f64());
                    deps.metrics.count_request(RequestResult::Done, source);
                })
            },
        )
        .await;
    summary.deferred = left
        .into_iter()
        .map(|ask| {
            let Taken { req, mut span, .. } = ask;
            span.set_attribute(KeyValue::new("deferred", true));
            span.end();
            req
        })
        .collect();
    summary.took = start.elapsed();
    summary
}
