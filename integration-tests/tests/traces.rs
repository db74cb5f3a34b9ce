//! OTLP traces reach a collector: an in-process OTLP/gRPC receiver (tonic, with the
//! opentelemetry-proto service) gets plegd's spans — global relists, targeted relists
//! linked to the stream event that caused them, stream connection attempts and sync
//! holds — with their attributes. One test per process: the tracer provider is global.

use plegd_telemetry::RequestResult;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use integration_tests::otlp;
use integration_tests::traces::identity;
use integration_tests::wait::*;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use plegd_actors::spans;
use plegd_actors::SyncOutcome;
use plegd_actors::{EventKind, RelistSource};
use plegd_actors::{Pleg, PlegConfig};
use plegd_sim::FakeRuntime;
use plegd_telemetry::traces::TraceExport;
use plegd_telemetry::Metrics;

#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
    resources: Arc<Mutex<Vec<String>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        for rs in req.into_inner().resource_spans {
            if let Some(r) = rs.resource {
                for kv in r.attributes {
                    if let Some(Value::StringValue(s)) = kv.value.and_then(|v| v.value) {
                        self.resources
                            .lock()
                            .unwrap()
                            .push(format!("{}={s}", kv.key));
                    }
                }
            }
            for ss in rs.scope_spans {
                self.spans.lock().unwrap().extend(ss.spans);
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// Serves the receiver on its own thread and runtime; returns its endpoint.
fn start_receiver(rx: Receiver) -> String {
    otlp::serve(move |mut s| s.add_service(TraceServiceServer::new(rx)))
}

fn attr(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some(s.clone()),
            Value::IntValue(i) => Some(i.to_string()),
            Value::BoolValue(b) => Some(b.to_string()),
            _ => None,
        })
}

#[actix_rt::test]
async fn spans_reach_an_otlp_receiver_with_their_attributes_and_links() {
    let rx = Receiver::default();
    let endpoint = start_receiver(rx.clone());
    let export = TraceExport::start(&endpoint, &identity()).unwrap();

    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "web", "ns");
    let c = rt.run_container(&sb, "app");
    let cfg = PlegConfig {
        relist_period: Duration::from_secs(3600),
        ..PlegConfig::default()
    };
    let pleg = Pleg::start(Arc::new(rt.clone()), &cfg, Arc::new(Metrics::new()));
    let sub = pleg.subscribe("t", 64).await.unwrap();
    expect_event(&sub, EventKind::ContainerStarted, &c).await;
    let m = pleg.metrics().clone();
    wait_until("stream open", || m.stream_connected.get() == 1).await;
    rt.exit_container(&c, 1);
    let d = expect_event(&sub, EventKind::ContainerDied, &c).await;
    assert_eq!(d.event.relist_source, RelistSource::EventedPleg);
    let hold = pleg.gates().begin_sync("u1").await.unwrap();
    hold.end(SyncOutcome::Success);
    wait_until("post-sync relist", || {
        m.requests(RequestResult::Done, RelistSource::PostSync) == 1
    })
    .await;

    // Export failures never affect the service; flushing here makes the test quick.
    let spans_seen = rx.spans.clone();
    let mut flushed = false;
    for _ in 0..100 {
        export.flush();
        let names: Vec<String> = spans_seen
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.name.clone())
            .collect();
        if [
            spans::GLOBAL_RELIST,
            spans::TARGETED_RELIST,
            spans::STREAM_CONNECT,
            spans::STOP_EVENT,
            spans::SYNC_HOLD,
        ]
        .iter()
        .all(|n| names.iter().any(|x| x == n))
        {
            flushed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let spans = spans_seen.lock().unwrap().clone();
    assert!(
        flushed,
        "spans received: {:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );

    let by_name = |n: &str| spans.iter().filter(|s| s.name == n).collect::<Vec<_>>();
    let global = by_name(spans::GLOBAL_RELIST);
    assert!(global
        .iter()
        .any(|s| attr(s, "events").is_some_and(|e| e != "0")));
    let stop = by_name(spans::STOP_EVENT);
    let stop = stop
        .iter()
        .find(|s| attr(s, "container.id").as_deref() == Some(c.as_str()))
        .expect("stop event span");
    assert_eq!(attr(stop, "pod.uid").as_deref(), Some("u1"));
    let targeted = by_name(spans::TARGETED_RELIST);
    let evented = targeted
        .iter()
        .find(|s| attr(s, "relist_source").as_deref() == Some("evented_pleg"))
        .expect("evented targeted relist span");
    assert_eq!(attr(evented, "pod.uid").as_deref(), Some("u1"));
    assert_eq!(attr(evented, "events").as_deref(), Some("1"));
    assert!(
        evented
            .links
            .iter()
            .any(|l| l.span_id == stop.span_id && l.trace_id == stop.trace_id),
        "the targeted relist links to the event that caused it"
    );
    assert!(targeted
        .iter()
        .any(|s| attr(s, "relist_source").as_deref() == Some("post_sync")));
    let connect = by_name(spans::STREAM_CONNECT);
    assert!(connect
        .iter()
        .any(|s| attr(s, "outcome").as_deref() == Some("open")));
    let hold = by_name(spans::SYNC_HOLD);
    assert!(hold
        .iter()
        .any(|s| attr(s, "outcome").as_deref() == Some("success")
            && attr(s, "relist_queued").as_deref() == Some("true")));
    assert!(rx
        .resources
        .lock()
        .unwrap()
        .iter()
        .any(|r| r == "service.name=plegd"));
    // Node identity, on the resource of every span.
    for want in [
        "k8s.node.name=test-node",
        "host.name=test-host",
        "service.version=0.0.0-test",
    ] {
        assert!(
            rx.resources.lock().unwrap().iter().any(|r| r == want),
            "{want} missing"
        );
    }
    pleg.stop();
    export.shutdown(Duration::from_secs(1));
}
