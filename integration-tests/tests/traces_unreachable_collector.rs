//! Trace export to a collector that is not there never affects the service (its
//! own process: the tracer provider is global).

use std::sync::Arc;
use std::time::Duration;

use integration_tests::traces::identity;
use integration_tests::wait::*;
use plegd_actors::EventKind;
use plegd_actors::{Pleg, PlegConfig};
use plegd_sim::FakeRuntime;
use plegd_telemetry::traces::TraceExport;
use plegd_telemetry::Metrics;

#[actix_rt::test]
async fn an_unreachable_collector_never_affects_the_service() {
    // Nothing listens there: exports fail in the background.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let export = TraceExport::start(&dead, &identity()).unwrap();
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "web", "ns");
    let cfg = PlegConfig {
        relist_period: Duration::from_millis(20),
        ..PlegConfig::default()
    };
    let pleg = Pleg::start(Arc::new(rt.clone()), &cfg, Arc::new(Metrics::new()));
    let sub = pleg.subscribe("t", 64).await.unwrap();
    expect_event(&sub, EventKind::ContainerStarted, &sb).await;
    let m = pleg.metrics().clone();
    let before = m.relist_duration.get_sample_count();
    wait_until("relists continue", || {
        m.relist_duration.get_sample_count() >= before + 10
    })
    .await;
    let c = rt.run_container(&sb, "app");
    expect_event(&sub, EventKind::ContainerStarted, &c).await;
    pleg.stop();
    export.shutdown(Duration::from_millis(200));
}
