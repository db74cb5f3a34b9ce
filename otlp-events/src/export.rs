//! The export: a subscription of the EventPublisher read by one thread, which turns
//! each event into a log record and offers it to a bounded export queue (never
//! waiting: a full queue drops the record, counted); one task on the export's own
//! tokio runtime takes up to a batch at a time from that queue and sends it over
//! OTLP/gRPC, one batch after the other, so records leave in publication order.
//!
//! A batch is sent once: no retry (a retry after a timeout could deliver it twice), so
//! past the node every record arrives at most once. A batch the collector refuses, or
//! does not answer within the timeout, is dropped and counted. At shutdown the queue
//! drains for at most `drain`; what is left is counted too, so that in the end every
//! published event is either exported or dropped: `exported + dropped == published`.
//!
//! As for traces, the tonic channel lives on the export's runtime (built on the export
//! thread): one built outside a runtime panics, and one on the actor thread would tie
//! the export to the dispatcher's thread.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use opentelemetry::logs::LoggerProvider as _;
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{LogExporter, RetryPolicy, WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::logs::{LogBatch, LogExporter as _, SdkLogRecord, SdkLoggerProvider};
use opentelemetry_sdk::Resource;
use plegd_actors::Subscription;
use plegd_telemetry::runtime_thread::{self, Workers};
use plegd_telemetry::traces::Identity;
use plegd_telemetry::Metrics;
use tokio::runtime::Runtime;
use tokio::sync::mpsc::{self, error::TrySendError};

use crate::drops::Drops;
use crate::record::RecordMaker;

/// How the events are exported.
#[derive(Clone, Debug)]
pub struct EventLogConfig {
    /// The collector: `http://HOST:PORT` (OTLP/gRPC).
    pub endpoint: String,
    /// Who exports: the resource of every record, and `k8s.node.name` on each.
    pub identity: Identity,
    /// `container.runtime.name` (CRI Version's runtime_name), if known.
    pub runtime_name: Option<String>,
    /// plegd's instance id, on each record (`plegd.instance_id`).
    pub instance_id: Option<String>,
    /// Records waiting for export at most; beyond, new ones are dropped.
    pub queue: usize,
    /// Records per export request at most.
    pub batch: usize,
    /// Deadline of one export request.
    pub timeout: Duration,
    /// How long the queue may drain once the publisher has closed.
    pub drain: Duration,
}

impl EventLogConfig {
    /// The defaults: a queue of 8192 records, batches of 512, a 3 s export timeout (as
    /// for traces) and 300 ms to drain at shutdown.
    pub fn new(endpoint: &str, identity: Identity, runtime_name: Option<String>) -> Self {
        EventLogConfig {
            endpoint: endpoint.to_string(),
            identity,
            runtime_name,
            instance_id: None,
            queue: 8192,
            batch: 512,
            timeout: Duration::from_secs(3),
            drain: Duration::from_millis(300),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EventLogError {
    #[error("cannot start the OTLP event export: {0}")]
    Start(#[from] std::io::Error),
    #[error("cannot build the OTLP log exporter for {endpoint}: {reason}")]
    Exporter { endpoint: String, reason: String },
}

/// A running export. It ends by itself once the publisher has closed and its queue
/// has drained (or `drain` has passed).
pub struct EventLogExport {
    thread: std::thread::JoinHandle<()>,
}

/// Told the revision up to which every record is settled (exported or dropped),
/// as records settle, and once more (`true`) at the end: where a restart goes on.
pub type Progress = Box<dyn FnMut(u64, bool) + Send>;

impl EventLogExport {
    /// Starts exporting every delivery of `sub` (a subscription of its own).
    pub fn start(
        sub: Subscription,
        config: EventLogConfig,
        metrics: Arc<Metrics>,
    ) -> Result<EventLogExport, EventLogError> {
        Self::start_with_progress(sub, config, metrics, Box::new(|_, _| {}))
    }

    /// [`Self::start`], telling `progress` how far the export has settled.
    pub fn start_with_progress(
        sub: Subscription,
        config: EventLogConfig,
        metrics: Arc<Metrics>,
        progress: Progress,
    ) -> Result<EventLogExport, EventLogError> {
        let ((), thread) = runtime_thread::spawn::<_, EventLogError, _>(
            "otlp-events",
            Workers::One("otlp-events-io"),
            move |rt: &Runtime| {
                let started = Started::new(rt, &config, metrics)?;
                Ok(((), move |rt: Runtime| {
                    started.run(rt, &sub, &config, progress)
                }))
            },
        )?;
        Ok(EventLogExport { thread })
    }

    /// True once the export has ended (after the publisher closed).
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Waits for the end (call once the publisher has closed: then it takes at most
    /// the drain time).
    pub fn join(self) {
        if self.thread.join().is_err() {
            tracing::error!("the OTLP event export thread panicked");
        }
    }
}

/// The export thread's state once its exporter is built (its runtime is the thread's).
struct Started {
    maker: RecordMaker,
    /// Kept for the logger's sake (it makes the records; no processor).
    _provider: SdkLoggerProvider,
    tx: mpsc::Sender<SdkLogRecord>,
    worker: tokio::task::JoinHandle<()>,
    drops: Arc<Drops>,
    /// Records the export task is done with (exported or dropped).
    settled: Arc<AtomicU64>,
}

impl Started {
    fn new(
        rt: &Runtime,
        config: &EventLogConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Started, EventLogError> {
        let mut exporter = {
            let _guard = rt.enter();
            LogExporter::builder()
                .with_tonic()
                .with_endpoint(config.endpoint.clone())
                .with_timeout(config.timeout)
                .with_retry_policy(RetryPolicy::disabled())
                .build()
                .map_err(|e| EventLogError::Exporter {
                    endpoint: config.endpoint.clone(),
                    reason: e.to_string(),
                })?
        };
        exporter.set_resource(&resource(&config.identity));
        let provider = SdkLoggerProvider::builder().build();
        let scope = InstrumentationScope::builder("plegd.events")
            .with_version(config.identity.service_version.clone())
            .build();
        let maker = RecordMaker {
            logger: provider.logger_with_scope(scope.clone()),
            node_name: config.identity.node_name.clone(),
            runtime_name: config.runtime_name.clone(),
            instance_id: config.instance_id.clone(),
        };
        let (tx, rx) = mpsc::channel(config.queue.max(1));
        let drops = Arc::new(Drops::new(metrics.clone()));
        let settled = Arc::new(AtomicU64::new(0));
        let worker = rt.spawn(export_batches(
            rx,
            Exporting {
                exporter,
                scope,
                batch: config.batch.max(1),
                timeout: config.timeout,
                metrics,
                drops: drops.clone(),
                settled: settled.clone(),
            },
        ));
        Ok(Started {
            maker,
            _provider: provider,
            tx,
            worker,
            drops,
            settled,
        })
    }

    /// Forwards every delivery until the publisher closes, then drains and counts.
    fn run(self, rt: Runtime, sub: &Subscription, config: &EventLogConfig, mut progress: Progress) {
        let mut accepted: u64 = 0;
        let mut settling = Settling::default();
        while let Ok(d) = sub.recv() {
            // The subscription's own queue overflowed just before this one.
            self.drops
                .count(d.missed, "the export's subscription queue was full");
            // Taken within microseconds of the publication: this thread never waits
            // on anything but its subscription.
            let record = self.maker.make(&d, SystemTime::now());
            match self.tx.try_send(record) {
                Ok(()) => {
                    accepted += 1;
                    settling.accepted(d.event.revision);
                }
                Err(TrySendError::Full(_)) => self.drops.count(
                    1,
                    "the export queue is full (the collector is slow, stalled or down)",
                ),
                Err(TrySendError::Closed(_)) => self.drops.count(1, "the export task ended"),
            }
            if let Some(r) = settling.settled(self.settled.load(Ordering::SeqCst)) {
                progress(r, false);
            }
        }
        let Started {
            tx,
            mut worker,
            drops,
            settled,
            ..
        } = self;
        // The worker ends once it has taken the last queued record.
        drop(tx);
        let drained = rt.block_on(async {
            tokio::time::timeout(config.drain, &mut worker)
                .await
                .is_ok()
        });
        if !drained {
            worker.abort();
            let _ = rt.block_on(worker);
        }
        let lost = accepted.saturating_sub(settled.load(Ordering::SeqCst));
        drops.count(lost, "still queued at shutdown");
        // What was still queued is dropped (counted): settled too.
        if let Some(r) = settling.settled(accepted) {
            progress(r, true);
        }
        drops.tell_rest();
        rt.shutdown_timeout(Duration::from_millis(100));
    }
}

/// The revisions of the records accepted and not yet known settled, in order.
#[derive(Default)]
struct Settling {
    revisions: std::collections::VecDeque<u64>,
    /// Records accepted before `revisions[0]`.
    passed: u64,
}

impl Settling {
    fn accepted(&mut self, revision: u64) {
        self.revisions.push_back(revision);
    }

    /// With `settled` records settled so far: the revision of the last one, if it
    /// moved.
    fn settled(&mut self, settled: u64) -> Option<u64> {
        let mut last = None;
        while self.passed < settled {
            last = self.revisions.pop_front();
            self.passed += 1;
        }
        last
    }
}

/// What the export task needs.
struct Exporting {
    exporter: LogExporter,
    scope: InstrumentationScope,
    batch: usize,
    timeout: Duration,
    metrics: Arc<Metrics>,
    drops: Arc<Drops>,
    settled: Arc<AtomicU64>,
}

/// Sends the queued records, up to a batch at a time, one request after the other.
async fn export_batches(mut rx: mpsc::Receiver<SdkLogRecord>, x: Exporting) {
    let mut records = Vec::with_capacity(x.batch);
    while rx.recv_many(&mut records, x.batch).await > 0 {
        let n = records.len() as u64;
        let pairs: Vec<(&SdkLogRecord, &InstrumentationScope)> =
            records.iter().map(|r| (r, &x.scope)).collect();
        // The channel has its own deadline; this one also bounds a connection that
        // never completes.
        let outcome =
            tokio::time::timeout(x.timeout, x.exporter.export(LogBatch::new(&pairs))).await;
        drop(pairs);
        match outcome {
            Ok(Ok(())) => x.metrics.otlp_events_exported.inc_by(n),
            Ok(Err(e)) => x.drops.count(n, &format!("the export failed: {e}")),
            Err(_) => x.drops.count(n, "the collector did not answer in time"),
        }
        // No await between the count and this: an abort cannot separate them.
        x.settled.fetch_add(n, Ordering::SeqCst);
        records.clear();
    }
}

/// The resource of every record: the OpenTelemetry service and host conventions, the
/// node, and this process (`service.instance.id`: revisions restart at each start,
/// so a consumer de-duplicates on the instance and the revision).
fn resource(id: &Identity) -> Resource {
    let mut resource = Resource::builder().with_attributes([
        KeyValue::new("service.version", id.service_version.clone()),
        KeyValue::new("service.instance.id", instance_id()),
        KeyValue::new("host.name", id.host_name.clone()),
        KeyValue::new("k8s.node.name", id.node_name.clone()),
    ]);
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("plegd");
    }
    resource.build()
}

/// A random (version 4) UUID, new at each start.
fn instance_id() -> String {
    let n = rand::random::<u128>();
    let n = (n & !(0xf << 76) | (0x4 << 76)) & !(0x3 << 62) | (0x2 << 62);
    let h = format!("{n:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_settled_revision_follows_the_records_settled_in_order() {
        let mut s = super::Settling::default();
        for r in [3, 4, 7, 9] {
            s.accepted(r);
        }
        assert_eq!(s.settled(0), None);
        assert_eq!(s.settled(2), Some(4));
        assert_eq!(s.settled(2), None, "no move, nothing told");
        assert_eq!(s.settled(4), Some(9));
    }

    use super::*;

    #[test]
    fn instance_ids_are_version_4_uuids() {
        let a = instance_id();
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "4");
        assert!(["8", "9", "a", "b"].contains(&&a[19..20]), "{a}");
        assert_ne!(a, instance_id());
    }
}
