//! Exit → ContainerDied latency through the evented fast path: plegd (actix, real
//! tonic client) against the simulated CRI server on a unix socket, with a 10 s
//! global relist period so only the event stream can make it fast. Latency is from
//! the container's finished_at (set by the runtime at exit) to the event's arrival at
//! a subscriber.
//!
//! `cargo bench -p integration-tests --bench evented_latency [-- N]` prints p50/p99.
//! Run as a test it does a few exits as a smoke test.

use plegd_telemetry::RequestResult;
use std::sync::Arc;
use std::time::{Duration, Instant};

use plegd_actors::{EventKind, RelistSource};
use plegd_actors::{Pleg, PlegConfig};
use plegd_runtime::now_ns;
use plegd_runtime::CriRuntime;
use plegd_sim::{spawn_in_thread, FakeRuntime};
use plegd_telemetry::Metrics;

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(if bench { 500 } else { 5 });
    let background_pods = if bench { 100 } else { 5 };

    let dir = tempfile::tempdir().expect("tempdir");
    let sim = FakeRuntime::new();
    for i in 0..background_pods {
        let sb = sim.run_pod(&format!("bg-{i}"), "bg", "bench");
        sim.run_container(&sb, "app");
    }
    let server = spawn_in_thread(&dir.path().join("cri.sock"), sim.clone()).expect("sim");
    let endpoint = server.endpoint();

    let system = actix_rt::System::new();
    let mut latencies = system.block_on(async move {
        let cri = CriRuntime::new(&endpoint, Duration::from_secs(2)).expect("client");
        let cfg = PlegConfig {
            relist_period: Duration::from_secs(10),
            ..PlegConfig::default()
        };
        let pleg = Pleg::start(Arc::new(cri), &cfg, Arc::new(Metrics::new()));
        let sub = pleg.subscribe("bench", 100_000).await.expect("subscribe");
        let deadline = Instant::now() + Duration::from_secs(20);
        // Wait for the stream and for the first global relist: after it, only the
        // stream (or our own post-allocation requests) can trigger a relist.
        while pleg.metrics().stream_connected.get() != 1
            || sim.event_streams() == 0
            || !pleg.health().ready()
        {
            assert!(Instant::now() < deadline, "stream never opened");
            actix_rt::time::sleep(Duration::from_millis(1)).await;
        }
        let sb = sim.run_pod("target", "target", "bench");
        let mut latencies = Vec::with_capacity(n);
        for i in 0..n {
            let c = sim.run_container(&sb, &format!("c{i}"));
            pleg.request_relist("target", RelistSource::PostAllocation);
            wait_for(&sub, EventKind::ContainerStarted, &c).await;
            // The post-allocation relist may still be queued when the start arrives
            // through the stream; were it to run after the exit, it, not the stream,
            // would report the death.
            wait_settled(&pleg, RelistSource::PostAllocation, i as u64 + 1).await;
            sim.exit_container(&c, 1);
            let d = wait_for(&sub, EventKind::ContainerDied, &c).await;
            let received = now_ns();
            assert_eq!(
                d.event.relist_source,
                RelistSource::EventedPleg,
                "exit {i}: {:?} queued={} done={} skipped={}",
                d,
                pleg.metrics()
                    .requests(RequestResult::Queued, RelistSource::EventedPleg),
                pleg.metrics()
                    .requests(RequestResult::Done, RelistSource::EventedPleg),
                pleg.metrics()
                    .requests(RequestResult::Skipped, RelistSource::EventedPleg)
            );
            let finished = sim.container(&c).expect("container").finished_at;
            latencies.push(Duration::from_nanos((received - finished).max(0) as u64));
            sim.remove_container(&c);
        }
        pleg.stop();
        latencies
    });
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 - 1.0) * p).round() as usize];
    println!(
        "evented exit→ContainerDied over {n} exits (relist period 10 s, {background_pods} other pods): \
         p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        pct(0.5).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
        pct(1.0).as_secs_f64() * 1e3,
    );
    server.stop();
}

/// Waits until `count` requests from `source` have run or been merged, coalesced,
/// skipped or dropped: none of them can trigger a relist any more.
async fn wait_settled(pleg: &Pleg, source: RelistSource, count: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let settled: u64 = [
            RequestResult::Done,
            RequestResult::Merged,
            RequestResult::Coalesced,
            RequestResult::Skipped,
            RequestResult::Dropped,
        ]
        .into_iter()
        .map(|r| pleg.metrics().requests(r, source))
        .sum();
        if settled >= count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{source:?} requests never settled"
        );
        actix_rt::time::sleep(Duration::from_micros(100)).await;
    }
}

async fn wait_for(
    sub: &plegd_actors::Subscription,
    kind: EventKind,
    id: &str,
) -> plegd_actors::Delivery {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        while let Ok(d) = sub.try_recv() {
            if d.event.kind == kind && d.event.container_id == id {
                return d;
            }
        }
        assert!(Instant::now() < deadline, "no {kind} for {id}");
        actix_rt::time::sleep(Duration::from_micros(100)).await;
    }
}
