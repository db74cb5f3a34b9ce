//! The relist hint sources against real containerd 1.7 and 2.1 through plegd's real
//! CRI client: a death reaches plegd through containerd's event service
//! with the CRI stream off — on 1.7 even while a second raw CRI subscriber takes its
//! share of the CRI events; on 2.1 plegd's CRI stream and a second raw subscriber both
//! see every stop; with both sources on, each death is one ContainerDied; with no
//! source, the global relist still finds it. Each test prints the per-source latency
//! (container exit → ContainerDied) over its exits: p50 and p99.
//!
//! Ignored for a plain `cargo test` (root, a real containerd); `scripts/test.sh` runs
//! them. One at a time (`Session`), as every real-containerd test.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use integration_tests::containerd::*;
use integration_tests::pleg::policy;
use integration_tests::wait::*;
use plegd_actors::Subscription;
use plegd_actors::{EventKind, HintSourceName, HintSourceState, Pleg, RelistSource};
use plegd_runtime::cri;
use plegd_telemetry::{PrefetchResult, RequestResult};

/// No periodic global relist during a test: what is found fast, a hint found.
const LONG_PERIOD: Duration = Duration::from_secs(60);
/// Exits per latency figure.
const EXITS: usize = 20;

async fn start(s: &Session, sources: &[HintSourceName], period: Duration) -> (Pleg, Subscription) {
    start_pleg(s, sources, period, policy(100, 2_000)).await
}

/// `n` running containers in one pod, seen started by plegd.
async fn running(s: &Session, pleg: &Pleg, sub: &Subscription, n: usize) -> Vec<String> {
    let pod = s.cri.run_pod("hints").await;
    let mut containers = vec![];
    for i in 0..n {
        containers.push(
            s.cri
                .run_container(&pod, &format!("c{i}"), SLEEP_SCRIPT)
                .await,
        );
    }
    pleg.request_relist(&pod.uid, RelistSource::PostAllocation);
    let mut started = std::collections::HashSet::new();
    recv_until(sub, "all started", |d| {
        if d.event.kind == EventKind::ContainerStarted {
            started.insert(d.event.container_id.clone());
        }
        containers.iter().all(|c| started.contains(c))
    })
    .await;
    containers
}

/// What the deaths gave: ContainerDied per container, per source, and the latency of
/// each (ms, exit → ContainerDied received).
#[derive(Default, Debug)]
struct Deaths {
    died: HashMap<String, u32>,
    sources: HashMap<RelistSource, u32>,
    latency_ms: Vec<f64>,
}

impl Deaths {
    fn duplicates(&self) -> u32 {
        self.died.values().map(|n| n - 1).sum()
    }

    fn percentile(&self, p: f64) -> f64 {
        let mut v = self.latency_ms.clone();
        v.sort_by(f64::total_cmp);
        let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
        v[i]
    }

    fn report(&self, what: &str) {
        eprintln!(
            "[latency] {what}: exit -> ContainerDied over {} exits: p50 {:.1} ms, p99 {:.1} ms, \
             max {:.1} ms; first by {:?}; duplicates {}",
            self.latency_ms.len(),
            self.percentile(0.5),
            self.percentile(0.99),
            self.percentile(1.0),
            self.sources,
            self.duplicates()
        );
    }
}

/// SIGKILLs each container in turn and waits for its ContainerDied.
async fn kill_each(s: &Session, sub: &Subscription, containers: &[String]) -> Deaths {
    let mut out = Deaths::default();
    for c in containers {
        s.cri.kill_container(c).await;
        let d = expect_event(sub, EventKind::ContainerDied, c).await;
        let received = SystemTime::now();
        let finished = d
            .event
            .exit
            .as_ref()
            .and_then(|x| x.finished_at)
            .expect("a death carries its finished_at");
        let ms = received
            .duration_since(finished)
            .unwrap_or_default()
            .as_secs_f64()
            * 1e3;
        out.latency_ms.push(ms);
        *out.died.entry(c.clone()).or_default() += 1;
        *out.sources.entry(d.event.relist_source).or_default() += 1;
    }
    out
}

/// Waits until every targeted request is done or skipped, then counts the late
/// ContainerDied events (duplicates) too.
async fn settle(pleg: &Pleg, sub: &Subscription, deaths: &mut Deaths) {
    let m = pleg.metrics().clone();
    wait_until("every request settled", || {
        RelistSource::ALL.iter().all(|&s| {
            m.requests(RequestResult::Done, s)
                + m.requests(RequestResult::Skipped, s)
                + m.requests(RequestResult::Merged, s)
                >= m.requests(RequestResult::Queued, s)
        })
    })
    .await;
    for d in drain(sub) {
        if d.event.kind == EventKind::ContainerDied {
            *deaths.died.entry(d.event.container_id.clone()).or_default() += 1;
        }
    }
}

async fn wait_source(pleg: &Pleg, source: HintSourceName, state: HintSourceState) {
    let m = pleg.metrics().clone();
    wait_until(&format!("{source} {state}"), || {
        m.hint_source_state(source) == state
    })
    .await;
}

/// Every source in `sources` is connected: streaming, or for containerd-events
/// (whose stream stays pending until its first item) at least connecting.
async fn wait_sources_up(pleg: &Pleg, sources: &[HintSourceName]) {
    let m = pleg.metrics().clone();
    for &source in sources {
        wait_until(&format!("{source} up"), || {
            let state = m.hint_source_state(source);
            state == HintSourceState::Streaming
                || (source == HintSourceName::ContainerdEvents
                    && state == HintSourceState::Connecting)
        })
        .await;
    }
}

/// containerd-events alone, while a raw CRI subscriber is attached (on 1.7 it takes a
/// share of the CRI events, which plegd does not need any more).
async fn containerd_events_alone_beside_a_cri_subscriber(flavor: Flavor) {
    let s = Session::begin(flavor).await;
    let raw = s.cri.raw_events();
    let (pleg, sub) = start(&s, &[HintSourceName::ContainerdEvents], LONG_PERIOD).await;
    let containers = running(&s, &pleg, &sub, EXITS).await;
    // The raw subscriber is attached (its stream answered with an event).
    wait_until("raw CRI subscriber attached", || raw.received() > 0).await;
    let mut deaths = kill_each(&s, &sub, &containers).await;
    settle(&pleg, &sub, &mut deaths).await;
    deaths.report(&format!(
        "containerd {} containerd-events (CRI stream off, a raw CRI subscriber attached)",
        flavor.as_str()
    ));
    assert_eq!(
        deaths.sources.get(&RelistSource::ContainerdEvents).copied(),
        Some(EXITS as u32),
        "{deaths:?}"
    );
    assert_eq!(deaths.duplicates(), 0);
    assert_eq!(
        pleg.metrics().hint_source_state(HintSourceName::CriEvents),
        HintSourceState::Off
    );
    assert_eq!(pleg.metrics().events(RelistSource::Global), 0);
    pleg.stop();
    drop(raw);
    s.cri.remove_all_pods().await;
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn containerd_1_7_deaths_reach_plegd_through_containerd_events_beside_a_cri_subscriber() {
    containerd_events_alone_beside_a_cri_subscriber(Flavor::V1_7).await;
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn containerd_2_1_deaths_reach_plegd_through_containerd_events() {
    containerd_events_alone_beside_a_cri_subscriber(Flavor::V2_1).await;
}

/// The CRI stream alone, for the comparison figure; on 2.1 with a second raw CRI
/// subscriber that must see every stop too (2.x broadcasts).
async fn cri_events_alone(flavor: Flavor) {
    let s = Session::begin(flavor).await;
    let (pleg, sub) = start(&s, &[HintSourceName::CriEvents], LONG_PERIOD).await;
    let pod = s.cri.run_pod("sole").await;
    // On 1.7 plegd's stream must be the only receiver (see Session).
    let m = pleg.metrics().clone();
    s.cri
        .make_sole_receiver(&pod, move || stream_events_received(&m))
        .await;
    let mut raw = (flavor == Flavor::V2_1).then(|| s.cri.raw_events());
    let containers = running(&s, &pleg, &sub, EXITS).await;
    if let Some(raw) = &raw {
        wait_until("raw CRI subscriber attached", || raw.received() > 0).await;
    }
    let mut deaths = kill_each(&s, &sub, &containers).await;
    settle(&pleg, &sub, &mut deaths).await;
    deaths.report(&format!("containerd {} cri-events", flavor.as_str()));
    assert_eq!(
        deaths.sources.get(&RelistSource::EventedPleg).copied(),
        Some(EXITS as u32),
        "{deaths:?}"
    );
    // A stop event's relist read the stopped container's status together with the
    // pod's lists: CRI publishes the stop once its status says so.
    let prefetches: Vec<(&str, u64)> = PrefetchResult::ALL
        .iter()
        .map(|&r| (r.as_str(), pleg.metrics().prefetches(r)))
        .collect();
    eprintln!("[{}] prefetches: {prefetches:?}", flavor.as_str());
    assert!(
        pleg.metrics().prefetches(PrefetchResult::Used) > 0,
        "{prefetches:?}"
    );
    if let Some(raw) = raw.as_mut() {
        // containerd 2.x gives every stream every event: the other subscriber saw
        // every stop plegd saw.
        for c in &containers {
            raw.wait_for(cri::ContainerEventType::ContainerStoppedEvent, c)
                .await;
        }
        eprintln!("[2.1] a raw CRI subscriber beside plegd saw all {EXITS} stops too");
    }
    pleg.stop();
    s.cri.remove_all_pods().await;
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn containerd_1_7_cri_events_latency() {
    cri_events_alone(Flavor::V1_7).await;
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn containerd_2_1_plegd_and_a_second_cri_subscriber_both_see_every_stop() {
    cri_events_alone(Flavor::V2_1).await;
}

/// Both sources: each death is one ContainerDied.
async fn both_sources_one_death_each(flavor: Flavor) {
    let s = Session::begin(flavor).await;
    let sources = [HintSourceName::CriEvents, HintSourceName::ContainerdEvents];
    let (pleg, sub) = start(&s, &sources, LONG_PERIOD).await;
    let pod = s.cri.run_pod("both").await;
    let m = pleg.metrics().clone();
    s.cri
        .make_sole_receiver(&pod, move || stream_events_received(&m))
        .await;
    wait_source(&pleg, HintSourceName::CriEvents, HintSourceState::Streaming).await;
    let containers = running(&s, &pleg, &sub, EXITS / 2).await;
    let mut deaths = kill_each(&s, &sub, &containers).await;
    settle(&pleg, &sub, &mut deaths).await;
    let m = pleg.metrics();
    let requests = |src| m.requests(RequestResult::Queued, src);
    deaths.report(&format!(
        "containerd {} cri-events + containerd-events (requests: {} + {})",
        flavor.as_str(),
        requests(RelistSource::EventedPleg),
        requests(RelistSource::ContainerdEvents)
    ));
    assert_eq!(deaths.died.len(), EXITS / 2);
    assert_eq!(deaths.duplicates(), 0, "{deaths:?}");
    // containerd's events asked for the first stops at once (until the CRI stream had
    // reported a few of them, it waits for nothing: `cri_stops.rs`); since,
    // they wait for the stream, which reports every stop here.
    assert!(requests(RelistSource::ContainerdEvents) >= 1);
    pleg.stop();
    s.cri.remove_all_pods().await;
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn containerd_1_7_both_sources_give_one_container_died_per_death() {
    both_sources_one_death_each(Flavor::V1_7).await;
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn containerd_2_1_both_sources_give_one_container_died_per_death() {
    both_sources_one_death_each(Flavor::V2_1).await;
}

/// All three sources on: each of [`EXITS`] deaths is exactly one ContainerDied, with
/// no loss and no duplicate; prints which source was first and how many requests
/// each made.
async fn all_three_sources_one_death_each(flavor: Flavor) {
    let s = Session::begin(flavor).await;
    let sources = [
        HintSourceName::CriEvents,
        HintSourceName::ContainerdEvents,
        HintSourceName::Nri,
    ];
    let (pleg, sub) = start(&s, &sources, LONG_PERIOD).await;
    let pod = s.cri.run_pod("three").await;
    let m = pleg.metrics().clone();
    s.cri
        .make_sole_receiver(&pod, move || stream_events_received(&m))
        .await;
    wait_sources_up(&pleg, &sources).await;
    let containers = running(&s, &pleg, &sub, EXITS).await;
    let mut deaths = kill_each(&s, &sub, &containers).await;
    settle(&pleg, &sub, &mut deaths).await;
    let m = pleg.metrics();
    let requests = |src| m.requests(RequestResult::Queued, src);
    deaths.report(&format!(
        "containerd {} cri-events + containerd-events + nri (requests: {} + {} + {})",
        flavor.as_str(),
        requests(RelistSource::EventedPleg),
        requests(RelistSource::ContainerdEvents),
        requests(RelistSource::Nri)
    ));
    assert_eq!(deaths.died.len(), EXITS, "a death was lost: {deaths:?}");
    assert!(containers.iter().all(|c| deaths.died.contains_key(c)));
    assert_eq!(deaths.duplicates(), 0, "{deaths:?}");
    // The early sources asked for the first stops at once (until the CRI stream had
    // reported a few of them: `cri_stops.rs`), one of them per stop (`rechecks.rs`);
    // since, they wait for the stream, which reports every stop here.
    let early = requests(RelistSource::ContainerdEvents) + requests(RelistSource::Nri);
    assert!(early >= 1, "the early sources asked for {early} relists");
    assert_eq!(pleg.metrics().events(RelistSource::Global), 0);
    pleg.stop();
    s.cri.remove_all_pods().await;
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn containerd_1_7_all_three_sources_give_one_container_died_per_death() {
    all_three_sources_one_death_each(Flavor::V1_7).await;
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn containerd_2_1_all_three_sources_give_one_container_died_per_death() {
    all_three_sources_one_death_each(Flavor::V2_1).await;
}

/// containerd 1.7 with a raw CRI subscriber attached (it takes a share of the CRI
/// events) and only containerd-events + nri as sources: plegd still publishes every
/// death at hint latency, once each.
#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn containerd_1_7_containerd_events_and_nri_beside_a_cri_subscriber_see_every_death() {
    let s = Session::begin(Flavor::V1_7).await;
    let raw = s.cri.raw_events();
    let sources = [HintSourceName::ContainerdEvents, HintSourceName::Nri];
    let (pleg, sub) = start(&s, &sources, LONG_PERIOD).await;
    wait_sources_up(&pleg, &sources).await;
    let containers = running(&s, &pleg, &sub, EXITS).await;
    wait_until("raw CRI subscriber attached", || raw.received() > 0).await;
    let mut deaths = kill_each(&s, &sub, &containers).await;
    settle(&pleg, &sub, &mut deaths).await;
    let m = pleg.metrics();
    let requests = |src| m.requests(RequestResult::Queued, src);
    deaths.report(&format!(
        "containerd 1.7 containerd-events + nri (CRI stream off, a raw CRI subscriber \
         attached; requests: {} + {})",
        requests(RelistSource::ContainerdEvents),
        requests(RelistSource::Nri)
    ));
    assert_eq!(deaths.died.len(), EXITS, "a death was lost: {deaths:?}");
    assert_eq!(deaths.duplicates(), 0, "{deaths:?}");
    let hinted = deaths
        .sources
        .iter()
        .filter(|(s, _)| matches!(s, RelistSource::ContainerdEvents | RelistSource::Nri))
        .map(|(_, n)| n)
        .sum::<u32>();
    assert_eq!(hinted, EXITS as u32, "{deaths:?}");
    assert_eq!(
        pleg.metrics().hint_source_state(HintSourceName::CriEvents),
        HintSourceState::Off
    );
    pleg.stop();
    drop(raw);
    s.cri.remove_all_pods().await;
}

/// containerd 1.7 with all three sources and a raw CRI subscriber attached,
/// which takes a share of the CRI events. Once the CRI stream has reported a few stops,
/// the early sources wait for its report (a grace learnt from its lags) — the stops it
/// misses must still be found by them, not left to the global relist. Prints the
/// latency and who found each.
#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn containerd_1_7_all_three_sources_beside_a_cri_subscriber_see_every_death() {
    let s = Session::begin(Flavor::V1_7).await;
    let sources = [
        HintSourceName::CriEvents,
        HintSourceName::ContainerdEvents,
        HintSourceName::Nri,
    ];
    let (pleg, sub) = start(&s, &sources, LONG_PERIOD).await;
    let raw = s.cri.raw_events();
    let containers = running(&s, &pleg, &sub, EXITS).await;
    wait_until("raw CRI subscriber attached", || raw.received() > 0).await;
    wait_sources_up(&pleg, &sources).await;
    let mut deaths = kill_each(&s, &sub, &containers).await;
    settle(&pleg, &sub, &mut deaths).await;
    let m = pleg.metrics();
    let requests = |src| m.requests(RequestResult::Queued, src);
    deaths.report(&format!(
        "containerd 1.7 cri-events + containerd-events + nri, a raw CRI subscriber \
         attached (requests: {} + {} + {})",
        requests(RelistSource::EventedPleg),
        requests(RelistSource::ContainerdEvents),
        requests(RelistSource::Nri)
    ));
    assert_eq!(deaths.died.len(), EXITS, "a death was lost: {deaths:?}");
    assert_eq!(deaths.duplicates(), 0, "{deaths:?}");
    assert_eq!(
        deaths.sources.get(&RelistSource::Global),
        None,
        "{deaths:?}"
    );
    pleg.stop();
    drop(raw);
    s.cri.remove_all_pods().await;
}

/// A burst: every container SIGKILLed at once, containerd-events alone. CRI records
/// the exits one `runc delete` at a time (up to a second or more on two cores), so
/// the rechecks do the work: prints how many relists that cost.
#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn containerd_1_7_a_burst_of_deaths_through_containerd_events() {
    let s = Session::begin(Flavor::V1_7).await;
    // CRI's own report of each stop, for the floor: plegd leaves the CRI stream to it.
    let mut raw = s.cri.raw_events();
    let (pleg, sub) = start(&s, &[HintSourceName::ContainerdEvents], LONG_PERIOD).await;
    let containers = running(&s, &pleg, &sub, EXITS).await;
    wait_until("raw CRI subscriber attached", || raw.received() > 0).await;
    let mut pids = vec![];
    for c in &containers {
        pids.push(s.cri.container_pid(c).await);
    }
    let t = std::time::Instant::now();
    for pid in pids {
        signal_pid(pid, "KILL");
    }
    // A fresh containerd on a loaded two-core machine took up to 8 s to report this
    // burst through CRI itself: a longer wait than other tests'.
    let mut died: HashMap<String, u32> = HashMap::new();
    let mut sources: HashMap<RelistSource, u32> = HashMap::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while died.len() < EXITS {
        for d in drain(&sub) {
            if d.event.kind == EventKind::ContainerDied {
                *died.entry(d.event.container_id.clone()).or_default() += 1;
                *sources.entry(d.event.relist_source).or_default() += 1;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {EXITS} deaths after 90 s: {sources:?}",
            died.len()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let took = t.elapsed();
    // Every STOPPED event CRI sent (containerd 1.7 may hand some to leftovers of
    // earlier tests' streams): when the last one came, after the kill.
    let mut stopped = std::collections::HashSet::new();
    let mut cri_last = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while stopped.len() < EXITS {
        match tokio::time::timeout_at(deadline, raw.rx.recv()).await {
            Ok(Some((at, ev))) => {
                let stop = cri::ContainerEventType::ContainerStoppedEvent as i32;
                if ev.container_event_type == stop && containers.contains(&ev.container_id) {
                    stopped.insert(ev.container_id);
                    cri_last = Some(at);
                }
            }
            _ => break,
        }
    }
    let since_kill_ms = |at: i64| {
        let ago = u64::try_from(plegd_runtime::now_ns() - at).unwrap_or(0);
        t.elapsed()
            .saturating_sub(Duration::from_nanos(ago))
            .as_secs_f64()
            * 1e3
    };
    let cri_took_ms = cri_last.map(since_kill_ms).unwrap_or(f64::NAN);
    let m = pleg.metrics();
    let relists = m.requests(RequestResult::Queued, RelistSource::ContainerdEvents);
    eprintln!(
        "[burst] containerd 1.7, {EXITS} SIGKILLs at once, containerd-events alone: all \
         published in {:.0} ms (CRI's own last STOPPED event, {} of {EXITS} seen: \
         {cri_took_ms:.0} ms), by {sources:?}; {relists} targeted relists ({:.1} per death)",
        took.as_secs_f64() * 1e3,
        stopped.len(),
        relists as f64 / EXITS as f64
    );
    assert_eq!(
        sources.get(&RelistSource::ContainerdEvents).copied(),
        Some(EXITS as u32)
    );
    assert!(died.values().all(|&n| n == 1), "{died:?}");
    pleg.stop();
    s.cri.remove_all_pods().await;
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn with_no_source_deaths_converge_at_the_global_relist() {
    let s = Session::begin(Flavor::V1_7).await;
    let (pleg, sub) = start(&s, &[], Duration::from_secs(1)).await;
    let containers = running(&s, &pleg, &sub, 2).await;
    let deaths = kill_each(&s, &sub, &containers).await;
    assert_eq!(
        deaths.sources.get(&RelistSource::Global).copied(),
        Some(2),
        "{deaths:?}"
    );
    deaths.report("containerd 1.7, no hint source (global relist every 1 s)");
    for source in HintSourceName::ALL {
        assert_eq!(
            pleg.metrics().hint_source_state(*source),
            HintSourceState::Off
        );
    }
    pleg.stop();
    s.cri.remove_all_pods().await;
}
