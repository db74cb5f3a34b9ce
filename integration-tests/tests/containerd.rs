//! End to end against a real containerd (1.7 from Debian trixie, and bookworm's 1.6.20
//! for the Unimplemented case) through plegd's real CRI client: the fast path, runtime
//! restarts, a runtime without the event stream, and a burst of deaths.
//!
//! containerd is started by `scripts/containerd-up.sh` (needs root; see
//! docs/containerd.md). The tests are `#[ignore]`d with that reason, so a plain
//! `cargo test` on a laptop skips them; `scripts/test.sh` (CI) runs them with
//! `--include-ignored`, and there, if containerd cannot start, they fail. They run one
//! at a time (`integration_tests::containerd::Session`): containerd 1.7 splits its
//! events between concurrent streams.

use plegd_telemetry::{RequestResult, StreamEventType};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use integration_tests::containerd::*;
use integration_tests::pleg::*;
use integration_tests::wait::*;
use plegd_actors::ReconnectPolicy;
use plegd_actors::{Delivery, Subscription};
use plegd_actors::{EventKind, RelistSource};
use plegd_actors::{Pleg, PlegConfig};
use plegd_runtime::cri;
use plegd_runtime::CriRuntime;
use plegd_telemetry::Metrics;

/// Long enough that no periodic global relist happens during a test: what is found
/// fast is found by the stream (or by a global relist brought forward).
const LONG_PERIOD: Duration = Duration::from_secs(30);

fn start_pleg(containerd: &Containerd, period: Duration, reconnect: ReconnectPolicy) -> Pleg {
    let runtime = CriRuntime::new(&containerd.endpoint(), Duration::from_secs(10))
        .expect("CRI client for containerd's socket");
    let cfg = PlegConfig {
        relist_period: period,
        reconnect,
        ..PlegConfig::default()
    };
    Pleg::start(Arc::new(runtime), &cfg, Arc::new(Metrics::new()))
}

/// plegd up, subscribed, first global relist done.
async fn pleg_with_subscriber(
    containerd: &Containerd,
    period: Duration,
    reconnect: ReconnectPolicy,
) -> (Pleg, Subscription) {
    let pleg = start_pleg(containerd, period, reconnect);
    let sub = pleg.subscribe("test", 100_000).await.expect("subscribe");
    let health = pleg.health().clone();
    wait_until("plegd's first global relist", || health.ready()).await;
    (pleg, sub)
}

/// plegd's event stream is the only receiver of containerd's events (see
/// integration_tests::containerd): generates events in `pod` until plegd has received one.
async fn make_pleg_sole_receiver(s: &Session, pleg: &Pleg, pod: &Pod) {
    let m = pleg.metrics().clone();
    s.cri
        .make_sole_receiver(pod, move || stream_events_received(&m))
        .await;
    let m = pleg.metrics().clone();
    wait_until("stream connected", || m.stream_connected.get() == 1).await;
}

/// Starts a container and waits until plegd has published it as started (a
/// post-allocation relist reads the pod), so its death is a running → exited change.
async fn run_seen(
    s: &Session,
    pleg: &Pleg,
    sub: &Subscription,
    pod: &Pod,
    name: &str,
    script: &str,
) -> String {
    let c = s.cri.run_container(pod, name, script).await;
    started_on_request(pleg, sub, &pod.uid, &c).await;
    c
}

fn expected_exit(death: Death) -> i32 {
    match death {
        Death::Exit(code) => code,
        Death::Kill => 137,
        Death::Stop => 0,
    }
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn fast_path_publishes_real_exits_kills_and_stops_from_the_event_stream() {
    let s = Session::begin(Flavor::V1_7).await;
    let (pleg, sub) = pleg_with_subscriber(s.containerd, LONG_PERIOD, policy(100, 2_000)).await;
    let pod = s.cri.run_pod("fast-path").await;
    make_pleg_sole_receiver(&s, &pleg, &pod).await;

    for (i, death) in [Death::Exit(3), Death::Kill, Death::Stop]
        .into_iter()
        .enumerate()
    {
        let c = run_seen(&s, &pleg, &sub, &pod, &format!("c{i}"), &wait_script(3)).await;
        s.cri.end_container(&c, death).await;
        let d = expect_event(&sub, EventKind::ContainerDied, &c).await;
        let received = plegd_runtime::now_ns();
        let st = s.cri.container_status(&c).await;
        assert_eq!(
            d.event.relist_source,
            RelistSource::EventedPleg,
            "{death:?}: {d:?}"
        );
        assert_eq!(d.event.pod.uid, pod.uid);
        assert_eq!(d.event.pod.name, pod.name);
        assert_eq!(d.event.pod.namespace, pod.namespace);
        assert_eq!(st.state, cri::ContainerState::ContainerExited as i32);
        assert_eq!(st.exit_code, expected_exit(death), "{death:?}: {st:?}");
        // The event says how the container ended, as containerd's status does
        // (SIGKILL: 137), taken from plegd's own status read.
        let exit = d.event.exit.as_ref().expect("a death carries its exit");
        assert_eq!(exit.code, st.exit_code, "{death:?}: {d:?}");
        assert_eq!(exit.reason.as_deref().unwrap_or(""), st.reason, "{death:?}");
        assert!(
            exit.finished_at.is_some() && exit.started_at.is_some(),
            "{d:?}"
        );
        assert_eq!(d.event.container_name, format!("c{i}"));
        assert!(!d.event.sandbox && d.event.image.is_some(), "{d:?}");
        eprintln!(
            "{death:?}: exit {} ({}) -> ContainerDied via the stream, {:.0} ms after finished_at",
            st.exit_code,
            st.reason,
            (received - st.finished_at) as f64 / 1e6
        );
    }
    let m = &pleg.metrics();
    assert_eq!(
        m.events(RelistSource::Global),
        0,
        "only the first (empty) global relist ran"
    );
    assert!(m.stream_events(StreamEventType::Stopped) >= 3);
    assert!(m.connection_latency.get_sample_count() > 0);
    assert_eq!(m.connection_errors.get(), 0);
    assert!(pleg.health().check().is_ok());
    pleg.stop();
    s.cri.remove_all_pods().await;
}

/// A container over its memory limit is OOM-killed by the kernel: plegd's ContainerDied
/// says so (`OOMKilled`, 137), from its own status read — the enriched fields on a real
/// runtime (cgroup v1 memory controller here).
#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn an_oom_killed_container_is_reported_as_oomkilled() {
    let s = Session::begin(Flavor::V1_7).await;
    let (pleg, sub) = pleg_with_subscriber(s.containerd, LONG_PERIOD, policy(100, 2_000)).await;
    let pod = s.cri.run_pod("oom").await;
    let limit = 32 << 20;
    let c = s
        .cri
        .create_limited_container(&pod, "hog", &oom_script(), Some(limit))
        .await;
    s.cri.start_container(&c).await;
    pleg.request_relist(&pod.uid, RelistSource::PostAllocation);
    expect_event(&sub, EventKind::ContainerStarted, &c).await;
    s.cri.trigger_exit(&c).await;
    let st = s.cri.wait_exited(&c).await;
    // Whichever relist finds it (stream or the global one brought forward).
    pleg.bring_global_relist_forward();
    let d = expect_event(&sub, EventKind::ContainerDied, &c).await;
    let exit = d.event.exit.as_ref().expect("a death carries its exit");
    eprintln!(
        "OOM: containerd says exit {} reason {:?}; plegd says {:?}",
        st.exit_code, st.reason, exit
    );
    assert_eq!(st.reason, "OOMKilled", "containerd's own status: {st:?}");
    assert_eq!(exit.reason.as_deref(), Some("OOMKilled"), "{d:?}");
    assert_eq!(exit.code, st.exit_code, "{d:?}");
    assert_eq!(exit.code, 137, "{d:?}");
    pleg.stop();
    s.cri.remove_all_pods().await;
}

/// containerd is killed with `signal` while plegd's stream is open and stays down
/// while a container exits; then it is restarted with the up script.
async fn survives_a_runtime_restart(signal: &str) {
    let s = Session::begin(Flavor::V1_7).await;
    let t0 = Instant::now();
    let (pleg, sub) = pleg_with_subscriber(s.containerd, LONG_PERIOD, policy(100, 1_000)).await;
    let m = pleg.metrics().clone();
    // Different pods, different shims.
    let doomed_pod = s.cri.run_pod("exits-while-down").await;
    let pod = s.cri.run_pod("survives").await;
    make_pleg_sole_receiver(&s, &pleg, &pod).await;
    let doomed = run_seen(&s, &pleg, &sub, &doomed_pod, "doomed", &wait_script(5)).await;
    let survivor = run_seen(&s, &pleg, &sub, &pod, "survivor", &wait_script(7)).await;
    let doomed_pid = s.cri.container_pid(&doomed).await;
    let errors = m.connection_errors.get();
    let opened = m.connection_successes.get();
    assert_eq!(opened, 1);

    let pid = s.containerd.pid().expect("containerd.pid");
    signal_pid(pid, signal);
    wait_until("plegd saw the stream fail", || {
        m.connection_errors.get() > errors && m.stream_connected.get() == 0
    })
    .await;
    wait_pid_gone(pid, "containerd").await;
    // While containerd is down, a container exits by itself: no runtime sees it.
    integration_tests::containerd::trigger_exit_pid(doomed_pid);
    wait_pid_gone(doomed_pid, "the doomed container").await;
    // Part of the scenario: the runtime stays down a few seconds; plegd keeps retrying.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        m.connection_errors.get() >= errors + 2,
        "reconnects were attempted while down"
    );
    assert!(
        pleg.health().check().is_ok(),
        "the stream never affects health"
    );

    s.containerd.up().await.expect("containerd restarts");
    s.cri.wait_ready(Duration::from_secs(30)).await;
    // containerd's stream sends no headers before its first event: make one.
    let canary = s.cri.create_container(&pod, "canary", "exit 0").await;
    wait_until("the stream reopened", || {
        m.connection_successes.get() > opened && m.stream_connected.get() == 1
    })
    .await;
    // No event can report the exit: the global relist brought forward after the
    // reconnect finds it (the periodic one is LONG_PERIOD after plegd's start).
    let d = expect_event(&sub, EventKind::ContainerDied, &doomed).await;
    assert_eq!(d.event.relist_source, RelistSource::Global, "{d:?}");
    assert!(
        t0.elapsed() < LONG_PERIOD,
        "found by the periodic relist, not by one brought forward"
    );
    let st = s.cri.container_status(&doomed).await;
    assert_eq!(st.state, cri::ContainerState::ContainerExited as i32);
    eprintln!(
        "SIG{signal}: the container that exited while containerd was down reads exit {} ({:?})",
        st.exit_code, st.reason
    );

    // The container that kept running across the restart, and the fast path again.
    assert_eq!(
        s.cri.container_status(&survivor).await.state,
        cri::ContainerState::ContainerRunning as i32
    );
    s.cri.trigger_exit(&survivor).await;
    let d = expect_event(&sub, EventKind::ContainerDied, &survivor).await;
    assert_eq!(d.event.relist_source, RelistSource::EventedPleg, "{d:?}");
    assert_eq!(s.cri.container_status(&survivor).await.exit_code, 7);
    assert!(pleg.health().check().is_ok());
    assert!(m.reconnect_attempts.get() >= 2);
    s.cri.remove_container(&canary).await;
    pleg.stop();
    s.cri.remove_all_pods().await;
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn survives_containerd_sigterm_and_finds_the_exit_it_missed() {
    survives_a_runtime_restart("TERM").await;
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn survives_containerd_sigkill_and_finds_the_exit_it_missed() {
    survives_a_runtime_restart("KILL").await;
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn containerd_1_6_without_the_event_stream_is_relisted_and_healthy() {
    let s = Session::begin(Flavor::V1_6).await;
    let v = s.cri.version().await.expect("Version");
    assert!(
        v.runtime_version.starts_with("1.6."),
        "{}",
        v.runtime_version
    );
    let start = Instant::now();
    let cap = Duration::from_secs(1);
    let (pleg, sub) =
        pleg_with_subscriber(s.containerd, Duration::from_secs(1), policy(100, 1_000)).await;
    let m = pleg.metrics().clone();
    wait_until("GetContainerEvents refused twice", || {
        m.connection_errors.get() >= 2
    })
    .await;

    // Generic relisting (period 1 s) sees a container start and exit.
    let pod = s.cri.run_pod("no-stream").await;
    let c = s.cri.run_container(&pod, "app", &wait_script(4)).await;
    let d = expect_event(&sub, EventKind::ContainerStarted, &c).await;
    assert_eq!(d.event.relist_source, RelistSource::Global);
    s.cri.trigger_exit(&c).await;
    let d = expect_event(&sub, EventKind::ContainerDied, &c).await;
    assert_eq!(d.event.relist_source, RelistSource::Global);
    assert_eq!(s.cri.container_status(&c).await.exit_code, 4);

    // Still retrying, at the cap: no tight loop, never connected, always healthy.
    let errors = m.connection_errors.get();
    wait_until("another retry", || m.connection_errors.get() > errors).await;
    let errors = m.connection_errors.get();
    let allowed = start.elapsed().as_secs_f64() / cap.as_secs_f64() + 2.0;
    assert!(
        (errors as f64) <= allowed,
        "{errors} failed attempts in {:?}: not waiting the cap",
        start.elapsed()
    );
    assert_eq!(m.connection_successes.get(), 0);
    assert_eq!(m.stream_connected.get(), 0);
    assert_eq!(stream_events_received(&m), 0);
    let st = pleg.watcher_state().await.expect("watcher alive");
    assert!(matches!(st.state, "waiting" | "connecting"), "{st:?}");
    assert!(st.attempts >= 3);
    // Unimplemented: every retry waits the cap.
    assert_eq!(st.last_delay, Some(cap), "{st:?}");
    assert!(pleg.health().check().is_ok());
    pleg.stop();
    s.cri.remove_all_pods().await;
}

/// ContainerDied events per container and per relist source.
#[derive(Default)]
struct Tally {
    died: HashMap<String, u32>,
    sources: HashMap<RelistSource, u32>,
}

impl Tally {
    fn count(&mut self, d: &Delivery) {
        if d.event.kind == EventKind::ContainerDied {
            *self.died.entry(d.event.container_id.clone()).or_default() += 1;
            *self.sources.entry(d.event.relist_source).or_default() += 1;
        }
    }
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn a_burst_of_deaths_is_published_once_each() {
    const PODS: usize = 8;
    const PER_POD: usize = 3;
    let s = Session::begin(Flavor::V1_7).await;
    let (pleg, sub) = pleg_with_subscriber(s.containerd, LONG_PERIOD, policy(100, 2_000)).await;
    let m = pleg.metrics().clone();
    let t = Instant::now();
    let pods: Vec<Pod> = futures::future::join_all((0..PODS).map(|i| {
        let cri = s.cri.clone();
        async move { cri.run_pod(&format!("burst-{i}")).await }
    }))
    .await;
    make_pleg_sole_receiver(&s, &pleg, &pods[0]).await;
    let mut containers = Vec::new();
    for pod in &pods {
        for j in 0..PER_POD {
            let c = s
                .cri
                .run_container(pod, &format!("c{j}"), SLEEP_SCRIPT)
                .await;
            containers.push(c);
        }
        pleg.request_relist(&pod.uid, RelistSource::PostAllocation);
    }
    let mut started = std::collections::HashSet::new();
    recv_until(&sub, "all started", |d| {
        if d.event.kind == EventKind::ContainerStarted {
            started.insert(d.event.container_id.clone());
        }
        containers.iter().all(|c| started.contains(c))
    })
    .await;
    eprintln!(
        "{} containers in {PODS} pods running and seen in {:.1} s",
        containers.len(),
        t.elapsed().as_secs_f64()
    );

    // Half are stopped through CRI, half crash (SIGKILL), all at once.
    let deaths: Vec<(String, Death)> = containers
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let death = if i % 2 == 0 { Death::Stop } else { Death::Kill };
            (c.clone(), death)
        })
        .collect();
    let mut pids = Vec::new();
    for (c, death) in &deaths {
        if *death == Death::Kill {
            pids.push(s.cri.container_pid(c).await);
        }
    }
    let t = Instant::now();
    let stops = futures::future::join_all(
        deaths
            .iter()
            .filter(|(_, d)| *d == Death::Stop)
            .map(|(c, _)| s.cri.stop_container(c, 10)),
    );
    for pid in &pids {
        signal_pid(*pid, "KILL");
    }
    stops.await;

    let mut tally = Tally::default();
    recv_until(&sub, "every death", |d| {
        tally.count(d);
        containers.iter().all(|c| tally.died.contains_key(c))
    })
    .await;
    let burst = t.elapsed();
    // Then a global relist, and everything queued settled: nothing more to publish.
    let relists = m.relist_duration.get_sample_count();
    pleg.bring_global_relist_forward();
    wait_until("a global relist after the burst", || {
        m.relist_duration.get_sample_count() > relists && m.queue_depth.get() == 0
    })
    .await;
    for d in drain(&sub) {
        tally.count(&d);
    }
    let Tally { died, sources } = tally;
    for (c, death) in &deaths {
        assert_eq!(
            died.get(c),
            Some(&1),
            "{c} ({death:?}) died {:?} times",
            died.get(c)
        );
        let st = s.cri.container_status(c).await;
        assert_eq!(st.exit_code, expected_exit(*death), "{c}: {st:?}");
    }
    eprintln!(
        "{} deaths published once each within {:.2} s; by source: {sources:?}",
        deaths.len(),
        burst.as_secs_f64()
    );
    assert_eq!(
        sources.get(&RelistSource::EventedPleg).copied(),
        Some(deaths.len() as u32),
        "every death found through the stream"
    );
    assert_eq!(
        m.requests(RequestResult::Dropped, RelistSource::EventedPleg),
        0
    );
    assert!(pleg.health().check().is_ok());
    pleg.stop();
    s.cri.remove_all_pods().await;
}
