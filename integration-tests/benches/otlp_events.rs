//! The OTLP event export, measured: export throughput (records/s from the
//! first publication to the last record accepted by an in-process collector), and the
//! dispatcher's global relist interval (p50/p99/max) under churn with no export, with
//! a healthy collector, and with a stalled one (accepts, never answers).
//!
//! `cargo bench -p integration-tests --bench otlp_events` prints the figures. Run as a
//! test (`cargo test --all-targets`), it does one short round of each as a smoke test.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use integration_tests::otlp::{LogsReceiver, StalledCollector};
use integration_tests::pleg::start_generic;
use integration_tests::traces::identity;
use plegd_actors::Pleg;
use plegd_otlp_events::{EventLogConfig, EventLogExport};
use plegd_sim::FakeRuntime;
use plegd_telemetry::{Metrics, RelistSource};

fn published(m: &Metrics) -> u64 {
    RelistSource::ALL.iter().map(|&s| m.events(s)).sum()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn finish(pleg: &Pleg, export: Option<EventLogExport>) {
    pleg.stop();
    while !pleg.stopped() {
        actix_rt::time::sleep(Duration::from_millis(2)).await;
    }
    pleg.close_publisher().await;
    if let Some(e) = export {
        while !e.is_finished() {
            actix_rt::time::sleep(Duration::from_millis(2)).await;
        }
        e.join();
    }
}

/// `pods` × `containers` started, then all exited: one burst of events, exported
/// with a queue that holds them all.
async fn throughput(pods: usize, containers: usize) {
    let receiver = LogsReceiver::default();
    let endpoint = receiver.start();
    let rt = FakeRuntime::new();
    let pleg = start_generic(&rt, Duration::from_millis(50));
    let m = pleg.metrics().clone();
    let config = EventLogConfig {
        queue: 1 << 20,
        ..EventLogConfig::new(&endpoint, identity(), None)
    };
    let export = EventLogExport::start(
        pleg.subscribe("otlp-events", 1 << 20)
            .await
            .expect("subscribe"),
        config,
        m.clone(),
    )
    .expect("export starts");
    let mut ids = Vec::new();
    for p in 0..pods {
        let sb = rt.run_pod(&format!("u{p}"), &format!("p{p}"), "bench");
        for c in 0..containers {
            ids.push(rt.run_container(&sb, &format!("c{c}")));
        }
    }
    let total = (pods + 2 * pods * containers) as u64;
    let mut exited = false;
    let mut first = None;
    let deadline = Instant::now() + Duration::from_secs(300);
    while m.otlp_events_exported.get() + m.otlp_events_dropped.get() < total {
        assert!(Instant::now() < deadline, "the export did not finish");
        if first.is_none() && published(&m) > 0 {
            first = Some(Instant::now());
        }
        if !exited && published(&m) >= (pods * (containers + 1)) as u64 {
            for c in &ids {
                rt.exit_container(c, 1);
            }
            exited = true;
        }
        actix_rt::time::sleep(Duration::from_micros(200)).await;
    }
    let took = first.map_or(Duration::ZERO, |t| t.elapsed());
    let exported = m.otlp_events_exported.get();
    println!(
        "otlp-events throughput: {exported} records exported ({} dropped) in {:.3} s from the first \
         publication: {:.0} records/s ({} export requests)",
        m.otlp_events_dropped.get(),
        took.as_secs_f64(),
        exported as f64 / took.as_secs_f64(),
        receiver.requests(),
    );
    finish(&pleg, Some(export)).await;
}

/// Where the export goes in a relist-interval run.
enum Collector {
    None,
    Healthy,
    Stalled,
}

/// Global relists every 100 ms under churn, for `run`; the intervals between the
/// ends of successive successful global relists (kubelet_pleg_last_seen_seconds,
/// sampled every 100 µs on another thread).
async fn relist_intervals(collector: Collector, run: Duration) {
    let receiver = LogsReceiver::default();
    let stalled;
    let (label, endpoint) = match collector {
        Collector::None => ("no export", None),
        Collector::Healthy => ("healthy collector", Some(receiver.start())),
        Collector::Stalled => {
            stalled = StalledCollector::start();
            ("stalled collector", Some(stalled.endpoint().to_string()))
        }
    };
    let rt = FakeRuntime::new();
    let pleg = start_generic(&rt, Duration::from_millis(100));
    let m = pleg.metrics().clone();
    let export = match &endpoint {
        Some(ep) => Some(
            EventLogExport::start(
                pleg.subscribe("otlp-events", 16_384)
                    .await
                    .expect("subscribe"),
                EventLogConfig::new(ep, identity(), None),
                m.clone(),
            )
            .expect("export starts"),
        ),
        None => None,
    };
    let output = pleg.subscribe("output", 65_536).await.expect("subscribe");
    let mut population = Vec::new();
    for p in 0..200 {
        let sb = rt.run_pod(&format!("u{p}"), &format!("p{p}"), "bench");
        for c in 0..5 {
            population.push((sb.clone(), rt.run_container(&sb, &format!("c{c}"))));
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    // Churn: every 2 ms, 10 containers move on (running → exited → removed and
    // replaced): about 7,500 events/s.
    let churn = {
        let (rt, stop) = (rt.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0usize;
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                for _ in 0..10 {
                    let k = i % population.len();
                    let (sb, c) = population[k].clone();
                    match rt.container(&c).map(|s| s.state) {
                        Some(plegd_runtime::ContainerState::Running) => rt.exit_container(&c, 1),
                        _ => {
                            rt.remove_container(&c);
                            n += 1;
                            population[k] = (sb.clone(), rt.run_container(&sb, &format!("r{n}")));
                        }
                    }
                    i = i.wrapping_add(7);
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let sampler = {
        let (m, stop) = (m.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut ends = Vec::new();
            let mut last = m.last_seen.get();
            while !stop.load(Ordering::SeqCst) {
                let now = m.last_seen.get();
                if now != last {
                    ends.push(now);
                    last = now;
                }
                std::thread::sleep(Duration::from_micros(100));
            }
            ends
        })
    };
    let start = Instant::now();
    let mut out_events = 0u64;
    let mut out_missed = 0u64;
    while start.elapsed() < run {
        for d in output.try_iter() {
            out_events += 1;
            out_missed += d.missed;
        }
        actix_rt::time::sleep(Duration::from_millis(5)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let _ = churn.join();
    let ends = sampler.join().expect("sampler");
    let mut intervals: Vec<f64> = ends.windows(2).map(|w| (w[1] - w[0]) * 1e3).collect();
    intervals.sort_by(f64::total_cmp);
    let published_now = published(&m);
    println!(
        "relist interval ({label}, period 100 ms, {:.0} events/s published, {} intervals): \
         p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; histogram mean {:.1} ms; output got {} \
         events, missed {}; otlp exported {}, dropped {}",
        published_now as f64 / run.as_secs_f64(),
        intervals.len(),
        percentile(&intervals, 0.5),
        percentile(&intervals, 0.99),
        intervals.last().copied().unwrap_or(f64::NAN),
        m.relist_interval.get_sample_sum() / m.relist_interval.get_sample_count().max(1) as f64
            * 1e3,
        out_events,
        out_missed,
        m.otlp_events_exported.get(),
        m.otlp_events_dropped.get(),
    );
    finish(&pleg, export).await;
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let (pods, containers, run) = if bench {
        (200, 100, Duration::from_secs(20))
    } else {
        (20, 20, Duration::from_secs(1))
    };
    actix_rt::System::new().block_on(async move {
        throughput(pods, containers).await;
        for c in [Collector::None, Collector::Healthy, Collector::Stalled] {
            relist_intervals(c, run).await;
        }
    });
}
