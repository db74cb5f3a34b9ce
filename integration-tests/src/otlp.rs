//! OTLP collectors for tests: an in-process OTLP/gRPC server (tonic, with the
//! opentelemetry-proto services) on a fresh port, a logs receiver that keeps every
//! record, a collector that refuses connections, and one that accepts connections and
//! never answers.

use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{
    LogsService, LogsServiceServer,
};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::logs::v1::LogRecord;
use tonic::transport::server::Router;
use tonic::transport::Server;

/// An attribute's value, as received.
pub use opentelemetry_proto::tonic::common::v1::any_value::Value;

/// Serves the gRPC services `build` adds on a fresh local port, on its own thread and
/// runtime (for the life of the test process). Returns `http://127.0.0.1:PORT`.
pub fn serve(build: impl FnOnce(Server) -> Router + Send + 'static) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a local port");
    let addr = listener
        .local_addr()
        .expect("a bound socket has an address");
    listener
        .set_nonblocking(true)
        .expect("a listener can be non-blocking");
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a test runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
            let incoming = futures::stream::unfold(listener, |l| async move {
                let r = l.accept().await.map(|(s, _)| s);
                Some((r, l))
            });
            if let Err(e) = build(Server::builder()).serve_with_incoming(incoming).await {
                panic!("test OTLP server: {e}");
            }
        });
    });
    format!("http://{addr}")
}

/// One log record as received, with its resource's and scope's identity.
#[derive(Clone, Debug)]
pub struct ReceivedLog {
    pub resource: HashMap<String, Value>,
    pub scope: String,
    pub record: LogRecord,
}

impl ReceivedLog {
    /// The record's attribute `key`.
    pub fn attr(&self, key: &str) -> Option<&Value> {
        find(&self.record.attributes, key)
    }
}

fn find<'a>(kvs: &'a [KeyValue], key: &str) -> Option<&'a Value> {
    kvs.iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
}

/// An OTLP logs receiver that keeps every record it is sent.
#[derive(Clone, Default)]
pub struct LogsReceiver {
    logs: Arc<Mutex<Vec<ReceivedLog>>>,
    requests: Arc<AtomicUsize>,
    /// Requests still to refuse (UNAVAILABLE) before accepting again.
    refuse: Arc<AtomicUsize>,
    refused: Arc<AtomicUsize>,
}

#[tonic::async_trait]
impl LogsService for LogsReceiver {
    async fn export(
        &self,
        req: tonic::Request<ExportLogsServiceRequest>,
    ) -> Result<tonic::Response<ExportLogsServiceResponse>, tonic::Status> {
        let refusing = self
            .refuse
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if refusing {
            let records: usize = req
                .into_inner()
                .resource_logs
                .iter()
                .flat_map(|rl| &rl.scope_logs)
                .map(|sl| sl.log_records.len())
                .sum();
            self.refused.fetch_add(records, Ordering::SeqCst);
            return Err(tonic::Status::unavailable("test receiver refuses"));
        }
        let mut got = Vec::new();
        for rl in req.into_inner().resource_logs {
            let resource: HashMap<String, Value> = rl
                .resource
                .map(|r| r.attributes)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|kv| Some((kv.key, kv.value?.value?)))
                .collect();
            for sl in rl.scope_logs {
                let scope = sl.scope.map(|s| s.name).unwrap_or_default();
                for record in sl.log_records {
                    got.push(ReceivedLog {
                        resource: resource.clone(),
                        scope: scope.clone(),
                        record,
                    });
                }
            }
        }
        self.logs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(got);
        self.requests.fetch_add(1, Ordering::SeqCst);
        Ok(tonic::Response::new(ExportLogsServiceResponse::default()))
    }
}

impl LogsReceiver {
    /// Serves this receiver on a fresh port; returns its endpoint.
    pub fn start(&self) -> String {
        let svc = LogsServiceServer::new(self.clone());
        serve(move |mut s| s.add_service(svc))
    }

    /// Every record received so far, in arrival order.
    pub fn logs(&self) -> Vec<ReceivedLog> {
        self.logs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// How many records have arrived.
    pub fn count(&self) -> usize {
        self.logs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Refuses the next `n` requests (UNAVAILABLE), keeping nothing of them.
    pub fn refuse_next(&self, n: usize) {
        self.refuse.store(n, Ordering::SeqCst);
    }

    /// Records in refused requests so far.
    pub fn refused(&self) -> usize {
        self.refused.load(Ordering::SeqCst)
    }

    /// How many export requests have arrived (refused ones not counted).
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// An endpoint where nothing listens: every connection is refused.
pub fn refusing_endpoint() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a local port");
    let addr = listener
        .local_addr()
        .expect("a bound socket has an address");
    drop(listener);
    format!("http://{addr}")
}

/// A collector that accepts connections and never reads or answers: every export
/// waits for its deadline. Dropping it closes the connections.
pub struct StalledCollector {
    endpoint: String,
    accepted: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StalledCollector {
    pub fn start() -> StalledCollector {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a local port");
        let addr = listener
            .local_addr()
            .expect("a bound socket has an address");
        let accepted = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (a, s) = (accepted.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut held: Vec<TcpStream> = Vec::new();
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                match conn {
                    Ok(c) => {
                        held.push(c);
                        a.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        });
        StalledCollector {
            endpoint: format!("http://{addr}"),
            accepted,
            stop,
            thread: Some(thread),
        }
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Connections accepted (and never answered) so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for StalledCollector {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accept loop, which then sees the flag.
        let _ = TcpStream::connect(self.endpoint.trim_start_matches("http://"));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
