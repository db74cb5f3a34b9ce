//! Exit → notification latency against a real containerd 1.7 (started with
//! scripts/containerd-up.sh; root needed):
//!
//! - (b) plegd: a container's `finished_at` (ContainerStatus, set by the runtime at
//!   exit) → its ContainerDied delivered to a plegd subscriber (relist period 30 s, so
//!   only the event stream can make it fast);
//! - (a) containerd's floor: `finished_at` → receipt of its CONTAINER_STOPPED_EVENT on a
//!   raw GetContainerEvents stream, no plegd.
//!
//! Never both at once (containerd 1.7 splits events between streams); each starts by
//! making its stream containerd's only receiver (leftovers of cancelled streams swallow
//! events: see integration_tests::containerd). (b) runs first.
//!
//! `cargo bench -p integration-tests --bench containerd_latency [-- N]` (N containers,
//! default 30) prints p50/p99 of both and the difference. Without `--bench` (as
//! `cargo test --all-targets` runs it) it is a 3-container smoke run, skipped with a
//! message when containerd cannot be started (the containerd tests fail then).

use std::sync::Arc;
use std::time::Duration;

use integration_tests::containerd::*;
use plegd_actors::{Delivery, Subscription};
use plegd_actors::{EventKind, RelistSource};
use plegd_actors::{Pleg, PlegConfig};
use plegd_runtime::cri;
use plegd_runtime::now_ns;
use plegd_runtime::CriRuntime;
use plegd_telemetry::Metrics;

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(if bench { 30 } else { 3 });
    if !bench {
        if let Err(e) = try_containerd(Flavor::V1_7) {
            println!("containerd_latency: smoke run skipped, no containerd: {e}");
            return;
        }
    }
    let system = actix_rt::System::new();
    let (plegd, raw) = system.block_on(async move {
        let s = Session::begin(Flavor::V1_7).await;
        let plegd = measure_plegd(&s, n).await;
        let raw = measure_raw(&s, n).await;
        s.cri.remove_all_pods().await;
        (plegd, raw)
    });
    let (p, r) = (Stats::of(plegd), Stats::of(raw));
    println!("containerd 1.7 exit (finished_at) -> notification, {n} containers each, ms:");
    println!("  (a) raw GetContainerEvents STOPPED: {r}");
    println!("  (b) plegd ContainerDied (stream):   {p}");
    println!(
        "  plegd's cost over containerd's floor: p50 {:+.1} ms, p99 {:+.1} ms",
        p.p50 - r.p50,
        p.p99 - r.p99
    );
}

struct Stats {
    min: f64,
    p50: f64,
    p99: f64,
    max: f64,
}

impl Stats {
    fn of(mut ms: Vec<f64>) -> Stats {
        assert!(!ms.is_empty());
        ms.sort_by(f64::total_cmp);
        let pct = |p: f64| ms[((ms.len() as f64 - 1.0) * p).round() as usize];
        Stats {
            min: ms[0],
            p50: pct(0.5),
            p99: pct(0.99),
            max: ms[ms.len() - 1],
        }
    }
}

impl std::fmt::Display for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "min {:.1}, p50 {:.1}, p99 {:.1}, max {:.1}",
            self.min, self.p50, self.p99, self.max
        )
    }
}

/// Blocks (off the runtime's thread) until the subscriber gets `kind` for `id`; returns
/// the receipt time (ns since the epoch) and the delivery.
async fn delivered(sub: &Arc<Subscription>, kind: EventKind, id: &str) -> (i64, Delivery) {
    let sub = sub.clone();
    let id = id.to_string();
    tokio::task::spawn_blocking(move || loop {
        match sub.recv_timeout(Duration::from_secs(30)) {
            Ok(d) if d.event.kind == kind && d.event.container_id == id => return (now_ns(), d),
            Ok(_) => {}
            Err(e) => panic!("no {kind} for {id} within 30 s: {e}"),
        }
    })
    .await
    .expect("receiver thread")
}

async fn measure_plegd(s: &Session, n: usize) -> Vec<f64> {
    let runtime =
        CriRuntime::new(&s.containerd.endpoint(), Duration::from_secs(10)).expect("CRI client");
    let cfg = PlegConfig {
        relist_period: Duration::from_secs(30),
        ..PlegConfig::default()
    };
    let pleg = Pleg::start(Arc::new(runtime), &cfg, Arc::new(Metrics::new()));
    let sub = Arc::new(pleg.subscribe("bench", 100_000).await.expect("subscribe"));
    while !pleg.health().ready() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let pod = s.cri.run_pod("latency-plegd").await;
    let m = pleg.metrics().clone();
    s.cri
        .make_sole_receiver(&pod, move || stream_events_received(&m))
        .await;
    // Events buffered before the stream opened arrive late: leave them out.
    let m = pleg.metrics().clone();
    let relist = m.pod_relist_histogram(RelistSource::EventedPleg);
    let stream0 = (
        m.connection_latency.get_sample_sum(),
        m.connection_latency.get_sample_count(),
    );
    let relist0 = (relist.get_sample_sum(), relist.get_sample_count());
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let c = s
            .cri
            .run_container(&pod, &format!("c{i}"), &wait_script(1))
            .await;
        pleg.request_relist(&pod.uid, RelistSource::PostAllocation);
        delivered(&sub, EventKind::ContainerStarted, &c).await;
        s.cri.trigger_exit(&c).await;
        let (at, d) = delivered(&sub, EventKind::ContainerDied, &c).await;
        assert_eq!(d.event.relist_source, RelistSource::EventedPleg, "{d:?}");
        let st = s.cri.container_status(&c).await;
        out.push((at - st.finished_at) as f64 / 1e6);
        s.cri.remove_container(&c).await;
    }
    let stream = (
        m.connection_latency.get_sample_sum() - stream0.0,
        m.connection_latency.get_sample_count() - stream0.1,
    );
    let relists = (
        relist.get_sample_sum() - relist0.0,
        relist.get_sample_count() - relist0.1,
    );
    println!(
        "plegd during (b): CRI event created_at -> plegd's receipt mean {:.2} ms ({} events); \
         targeted relist (evented_pleg) mean {:.2} ms ({} relists)",
        mean_ms(stream.0, stream.1),
        stream.1,
        mean_ms(relists.0, relists.1),
        relists.1
    );
    pleg.stop();
    s.cri.remove_pod(&pod.id).await;
    out
}

fn mean_ms(sum_s: f64, count: u64) -> f64 {
    if count == 0 {
        0.0
    } else {
        sum_s * 1e3 / count as f64
    }
}

async fn measure_raw(s: &Session, n: usize) -> Vec<f64> {
    let mut events = s.cri.raw_events();
    let pod = s.cri.run_pod("latency-raw").await;
    let count = events.count.clone();
    s.cri
        .make_sole_receiver(&pod, move || {
            count.load(std::sync::atomic::Ordering::SeqCst)
        })
        .await;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let c = s
            .cri
            .run_container(&pod, &format!("c{i}"), &wait_script(1))
            .await;
        s.cri.trigger_exit(&c).await;
        let at = events
            .wait_for(cri::ContainerEventType::ContainerStoppedEvent, &c)
            .await;
        let st = s.cri.container_status(&c).await;
        out.push((at - st.finished_at) as f64 / 1e6);
        s.cri.remove_container(&c).await;
    }
    drop(events);
    s.cri.remove_pod(&pod.id).await;
    out
}
