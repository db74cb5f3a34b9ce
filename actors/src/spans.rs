//! Trace spans (OpenTelemetry API; a no-op until the binary installs an exporter):
//! each global relist, each targeted relist (linked to the stream event that caused
//! it), each stream connection attempt, each sync hold.

use opentelemetry::global::{self, BoxedSpan, BoxedTracer};
use opentelemetry::trace::{Link, Span, SpanContext, Status, Tracer};
use opentelemetry::KeyValue;

pub const GLOBAL_RELIST: &str = "pleg.global_relist";
pub const TARGETED_RELIST: &str = "pleg.targeted_relist";
pub const STREAM_CONNECT: &str = "evented_pleg.connect";
pub const STOP_EVENT: &str = "evented_pleg.stop_event";
pub const SYNC_HOLD: &str = "pod_sync.hold";

pub fn tracer() -> BoxedTracer {
    global::tracer("plegd")
}

/// Starts a span with attributes and, if given, a link to its cause.
pub fn start(name: &'static str, attrs: Vec<KeyValue>, cause: Option<&SpanContext>) -> BoxedSpan {
    let t = tracer();
    let mut b = t.span_builder(name).with_attributes(attrs);
    if let Some(c) = cause.filter(|c| c.is_valid()) {
        b = b.with_links(vec![Link::with_context(c.clone())]);
    }
    b.start(&t)
}

/// Ends a span as failed with `reason`.
pub fn end_error(mut span: BoxedSpan, reason: String) {
    span.set_status(Status::error(reason));
    span.end();
}
