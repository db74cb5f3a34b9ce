//! The CRI event stream (GetContainerEvents) as a hint source (KEP-3386).
//!
//! For each event (`cri_event.rs`): require pod_sandbox_status, its metadata and a
//! non-empty UID (else count it invalid, log rate-limited, ignore); record
//! created_at-to-receipt latency; for CONTAINER_STOPPED_EVENT only — any exit code,
//! with or without container statuses — ask for a relist of the pod (source
//! `evented_pleg`), naming the event's container (not a sandbox) so that the relist
//! reads its status together with the pod's lists (a prefetch). It keeps the kubelet
//! `kubelet_evented_pleg_*` metrics, and tells the early sources (`cri_stops.rs`)
//! which stops it reported and whether it is up.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::LocalBoxFuture;
use futures::{FutureExt as _, StreamExt as _};
use opentelemetry::trace::Span as _;
use opentelemetry::KeyValue;
use plegd_runtime::cri::ContainerEventResponse;
use plegd_runtime::{now_ns, RuntimeClient, RuntimeError};
use plegd_telemetry::logging::RateLimiter;
use plegd_telemetry::{HintSourceName, Metrics, StreamEventType};

use crate::event::RelistSource;
use crate::hints::coverage::Coverage;
use crate::hints::cri_event::{self, CriEvent};
use crate::hints::cri_stops::CriStops;
use crate::hints::{Connection, Hint, HintSource, ItemContext, ItemStream, SourceError};
use crate::spans;

pub struct CriEvents {
    runtime: Arc<dyn RuntimeClient>,
    metrics: Arc<Metrics>,
    invalid_log: RateLimiter,
    stops: CriStops,
    coverage: Coverage,
}

impl CriEvents {
    pub fn new(
        runtime: Arc<dyn RuntimeClient>,
        metrics: Arc<Metrics>,
        stops: CriStops,
        coverage: Coverage,
    ) -> Self {
        CriEvents {
            runtime,
            metrics,
            invalid_log: RateLimiter::new(Duration::from_secs(30)),
            stops,
            coverage,
        }
    }
}

/// A runtime error as the source's end: Unimplemented waits the cap (the runtime may
/// be upgraded later); anything else backs off. Transport failures arrive as Unknown
/// as often as Unavailable.
pub(crate) fn source_error(e: &RuntimeError) -> SourceError {
    if e.code() == tonic::Code::Unimplemented {
        SourceError::unsupported(e.to_string())
    } else {
        SourceError::failed(e.to_string())
    }
}

/// The container whose status the relist an event asks for reads together with the
/// pod's lists: the event's, for a container's created, started or stopped event;
/// none for a sandbox's (its id is the pod sandbox's: its status is not a container
/// status), a deleted one (nothing left to read) or an event without an id.
fn prefetched(ev: &ContainerEventResponse, kind: StreamEventType) -> Option<String> {
    let about_a_container = matches!(
        kind,
        StreamEventType::Created | StreamEventType::Started | StreamEventType::Stopped
    );
    let sandbox = ev.pod_sandbox_status.as_ref().map(|s| s.id.as_str());
    (about_a_container && !ev.container_id.is_empty() && sandbox != Some(&ev.container_id))
        .then(|| ev.container_id.clone())
}

impl HintSource for CriEvents {
    type Item = ContainerEventResponse;

    fn name(&self) -> HintSourceName {
        HintSourceName::CriEvents
    }

    fn relist_source(&self) -> RelistSource {
        RelistSource::EventedPleg
    }

    fn describe(&self) -> &'static str {
        "CRI event stream"
    }

    /// Calls GetContainerEvents without a deadline (containerd sends no headers before
    /// the first event); the attempt's span ends with its outcome, or when cancelled.
    fn open(
        &mut self,
        attempt: u64,
    ) -> LocalBoxFuture<'static, Result<ItemStream<Self::Item>, SourceError>> {
        let mut span = spans::start(
            spans::STREAM_CONNECT,
            vec![KeyValue::new(
                "attempt",
                i64::try_from(attempt).unwrap_or(i64::MAX),
            )],
            None,
        );
        let runtime = self.runtime.clone();
        async move {
            match runtime.container_events().await {
                Ok(stream) => {
                    span.set_attribute(KeyValue::new("outcome", "open"));
                    span.end();
                    let items = stream.map(|item| item.map_err(|e| source_error(&e)));
                    Ok(items.boxed_local())
                }
                Err(e) => {
                    spans::end_error(span, e.to_string());
                    Err(source_error(&e))
                }
            }
        }
        .boxed_local()
    }

    fn hint(&mut self, ev: ContainerEventResponse, ctx: ItemContext) -> Vec<Hint> {
        let now = Instant::now();
        let (uid, kind, relist) = match cri_event::read(&ev) {
            CriEvent::Invalid { deleted } => {
                self.metrics.count_stream_event(StreamEventType::Invalid);
                if deleted {
                    tracing::debug!(container = %ev.container_id, "ignoring a DELETED event without pod sandbox status");
                } else if let Some(suppressed) = self.invalid_log.allow(now) {
                    tracing::info!(
                        container = %ev.container_id,
                        suppressed,
                        "ignoring a CRI event without pod sandbox status, metadata or UID"
                    );
                }
                return vec![];
            }
            CriEvent::Valid { uid, kind, relist } => (uid, kind, relist),
        };
        if let Some(started) = ctx.attempt_started {
            let age = now.saturating_duration_since(started);
            if let Some(latency) = cri_event::latency(ev.created_at, now_ns(), age) {
                self.metrics
                    .connection_latency
                    .observe(latency.as_secs_f64());
            }
        }
        self.metrics.count_stream_event(kind);
        tracing::debug!(pod = %uid, container = %ev.container_id, %kind, relist, "CRI event");
        if !relist {
            return vec![];
        }
        if !ev.container_id.is_empty() {
            self.stops.reported(&ev.container_id, now);
            self.coverage
                .reported(HintSourceName::CriEvents, &ev.container_id, now);
        }
        let mut span = spans::start(
            spans::STOP_EVENT,
            vec![
                KeyValue::new("pod.uid", uid.to_string()),
                KeyValue::new("container.id", ev.container_id.clone()),
            ],
            None,
        );
        let cause = span.span_context().clone();
        span.end();
        vec![Hint::Pod {
            uid: uid.to_string(),
            cause: Some(cause),
            container: prefetched(&ev, kind),
        }]
    }

    /// The kubelet `kubelet_evented_pleg_*` metrics and plegd's stream gauges.
    fn connection(&mut self, change: Connection) {
        match change {
            Connection::ReconnectAttempt => self.metrics.reconnect_attempts.inc(),
            Connection::Opened => self.metrics.connection_successes.inc(),
            Connection::Failed => self.metrics.connection_errors.inc(),
            Connection::Up(up) => {
                self.metrics.stream_connected.set(i64::from(up));
                self.stops.set_streaming(up);
            }
        }
    }
}
