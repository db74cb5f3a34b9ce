//! plegd telemetry: Prometheus metrics with the names KEP-3386 keeps, and logging.
//! No metric carries a pod UID, container ID, error text or endpoint as a label:
//! every label here has a small fixed set of values.

pub mod http;
pub mod labels;
pub mod logging;
pub mod malloc;
pub mod metrics;
pub mod runtime_thread;
pub mod spare_fd;
pub mod traces;

pub use labels::{
    ApiConnectionClose, HintSourceName, HintSourceState, PrefetchResult, RelistPhase, RelistSource,
    RequestResult, ResolveResult, StreamEventType,
};
pub use metrics::{Metrics, Refusal};
