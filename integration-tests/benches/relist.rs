//! Global relist cost against the simulated CRI server over a real unix socket,
//! through the real tonic client: the first relist of a node (every pod changed: full
//! status reads) and a steady-state relist (lists only).
//!
//! `cargo bench -p integration-tests --bench relist [-- PODS]` prints the figures.
//! Run as a test (`cargo test --all-targets`), it does one small round as a smoke test.

use std::sync::Arc;
use std::time::{Duration, Instant};

use plegd_actors::{GenericPleg, RelistScope};
use plegd_runtime::CriRuntime;
use plegd_sim::{spawn_in_thread, FakeRuntime};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let pods: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(if bench { 1000 } else { 50 });
    let rounds = if bench { 30 } else { 3 };

    let dir = tempfile::tempdir().expect("tempdir");
    let sim = FakeRuntime::new();
    for i in 0..pods {
        let sb = sim.run_pod(&format!("uid-{i}"), &format!("pod-{i}"), "bench");
        sim.run_container(&sb, "app");
        sim.run_container(&sb, "sidecar");
    }
    let server = spawn_in_thread(&dir.path().join("cri.sock"), sim.clone()).expect("sim server");

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let cri = CriRuntime::new(&server.endpoint(), Duration::from_secs(10)).expect("client");
        cri.check().await.expect("sim answers");
        for concurrency in [1usize, 8, 32] {
            let mut pleg = GenericPleg::new(Arc::new(cri.clone()), concurrency);
            let t = Instant::now();
            let out = pleg
                .relist(&RelistScope::Global, &|_| false)
                .await
                .expect("first relist");
            let first = t.elapsed();
            assert!(out.events.len() >= pods * 3, "every sandbox and container seen");
            assert_eq!(out.status_errors, 0);

            let mut steady = Vec::new();
            for _ in 0..rounds {
                let t = Instant::now();
                let out = pleg.relist(&RelistScope::Global, &|_| false).await.expect("relist");
                steady.push(t.elapsed());
                assert!(out.events.is_empty());
            }
            steady.sort();

            // One container exits per round: the relist re-reads that pod only.
            let mut one_change = Vec::new();
            for i in 0..rounds {
                let sb = sim.sandboxes_of(&format!("uid-{i}")).pop().expect("sandbox");
                let c = sim.run_container(&sb, &format!("extra-{concurrency}"));
                let _ = pleg.relist(&RelistScope::Global, &|_| false).await;
                sim.exit_container(&c, 1);
                let t = Instant::now();
                let out = pleg.relist(&RelistScope::Global, &|_| false).await.expect("relist");
                one_change.push(t.elapsed());
                assert_eq!(out.events.len(), 1);
            }
            one_change.sort();
            println!(
                "relist pods={pods} containers={} concurrency={concurrency}: first (all pods read) {:.1} ms; \
                 steady p50 {:.2} ms p99 {:.2} ms; one pod changed p50 {:.2} ms p99 {:.2} ms",
                pods * 2,
                first.as_secs_f64() * 1e3,
                percentile(&steady, 0.5).as_secs_f64() * 1e3,
                percentile(&steady, 0.99).as_secs_f64() * 1e3,
                percentile(&one_change, 0.5).as_secs_f64() * 1e3,
                percentile(&one_change, 0.99).as_secs_f64() * 1e3,
            );
        }
    });
    server.stop();
}
