//! plegd's lifecycle events leave the node as OTLP log records: one record
//! per published event, named `plegd.container.started|died|removed` or
//! `plegd.pod.sync`, with the OpenTelemetry semantic conventions' attributes, sent over
//! OTLP/gRPC to the node's collector.
//!
//! The exporter is an ordinary subscriber of the EventPublisher: its own bounded
//! queues, its own thread and runtime. A collector that is down, slow or refusing
//! costs counted drops (`plegd_otlp_events_dropped_total`) and a warning at a limited
//! rate, never a delay of the relist schedule or of the other outputs.
//!
//! - `record`: one event → one log record (pure).
//! - `export`: the subscriber thread, the export queue and the batch exporter.
//! - `drops`: counting drops, and the rate-limited warning that reports them.

mod drops;
mod export;
mod record;

pub use export::{EventLogConfig, EventLogError, EventLogExport};
pub use record::{event_name, image_name_and_tag, severity};
