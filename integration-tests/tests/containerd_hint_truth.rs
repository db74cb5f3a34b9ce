//! The hint sources against real containerd 1.7 and 2.1, on what they claim about
//! themselves and the containers they see:
//! - a container born after the last global relist that exits within a second is
//!   published through a hint by each source alone and by all three together (prints
//!   the exit → ContainerDied latency);
//! - on a quiet runtime every enabled source is `streaming` without any event
//!   (prints how long it took);
//! - after a containerd restart (SIGTERM, SIGKILL) NRI is back about when the CRI
//!   stream is, and never shows `unsupported` while containerd is starting (prints
//!   both times from CRI answering again);
//! - relist requests per death with all three sources (prints the figure).
//!
//! Ignored for a plain `cargo test` (root, a real containerd); `scripts/test.sh` runs
//! them. One at a time (`Session`), as every real-containerd test.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt as _;
use integration_tests::containerd::*;
use integration_tests::pleg::policy;
use integration_tests::wait::*;
use plegd_actors::{
    EventKind, HintSourceName, HintSourceState, Pleg, ReconnectPolicy, RelistSource,
};
use plegd_runtime::containerd_events::{EventsClient, SubscribeRequest, CRI_NAMESPACE};
use plegd_telemetry::{Metrics, RequestResult};

use HintSourceName::{ContainerdEvents, CriEvents, Nri};

/// No periodic global relist during a test: what is found fast, a hint found.
const LONG_PERIOD: Duration = Duration::from_secs(60);
const ALL: [HintSourceName; 3] = [CriEvents, ContainerdEvents, Nri];

async fn wait_streaming(pleg: &Pleg, sources: &[HintSourceName]) {
    let m = pleg.metrics().clone();
    for &source in sources {
        wait_until(&format!("{source} streaming"), || {
            m.hint_source_state(source) == HintSourceState::Streaming
        })
        .await;
    }
}

/// The relist source a hint of `source` gives.
fn relist_source(source: HintSourceName) -> RelistSource {
    match source {
        CriEvents => RelistSource::EventedPleg,
        ContainerdEvents => RelistSource::ContainerdEvents,
        Nri => RelistSource::Nri,
    }
}

/// Requests the hint sources made so far (queued, coalesced into a held pod's gate, or
/// dropped: every request that entered the router).
fn hint_requests(m: &Metrics) -> u64 {
    [
        RelistSource::EventedPleg,
        RelistSource::ContainerdEvents,
        RelistSource::Nri,
    ]
    .iter()
    .flat_map(|&s| {
        [
            RequestResult::Queued,
            RequestResult::Coalesced,
            RequestResult::Dropped,
        ]
        .map(|r| m.requests(r, s))
    })
    .sum()
}

fn percentile(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

/// Containers born after the last global relist, each in a new pod, killed about 300 ms
/// after they start: each death is published by a hint of `sources`.
async fn newborn_deaths(flavor: Flavor, sources: &[HintSourceName]) {
    const BORN: usize = 5;
    let s = Session::begin(flavor).await;
    let (pleg, sub) = start_pleg(&s, sources, LONG_PERIOD, policy(100, 2_000)).await;
    if sources.contains(&CriEvents) {
        // On 1.7 plegd's stream must be the only receiver (see Session).
        let pod = s.cri.run_pod("sole").await;
        let m = pleg.metrics().clone();
        s.cri
            .make_sole_receiver(&pod, move || stream_events_received(&m))
            .await;
    }
    wait_streaming(&pleg, sources).await;
    let allowed: HashSet<RelistSource> = sources.iter().map(|&s| relist_source(s)).collect();
    let mut latency_ms = Vec::new();
    let mut by = Vec::new();
    for i in 0..BORN {
        let pod = s.cri.run_pod(&format!("newborn-{i}")).await;
        let id = s.cri.run_container(&pod, "crash", SLEEP_SCRIPT).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        s.cri.kill_container(&id).await;
        let d = expect_event(&sub, EventKind::ContainerDied, &id).await;
        let received = SystemTime::now();
        let finished = d.event.exit.as_ref().and_then(|x| x.finished_at);
        let finished = finished.expect("a death carries its finished_at");
        latency_ms.push(
            received
                .duration_since(finished)
                .unwrap_or_default()
                .as_secs_f64()
                * 1e3,
        );
        by.push(d.event.relist_source);
        assert!(
            allowed.contains(&d.event.relist_source),
            "container {i} of {sources:?} published by {:?}",
            d.event.relist_source
        );
    }
    eprintln!(
        "[newborn] containerd {} {}: exit -> ContainerDied of a container born after the \
         last relist, over {BORN}: p50 {:.1} ms, max {:.1} ms; each (ms, by): {:?}",
        flavor.as_str(),
        sources
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(" + "),
        percentile(&latency_ms, 0.5),
        percentile(&latency_ms, 1.0),
        latency_ms
            .iter()
            .map(|ms| ms.round() as u64)
            .zip(&by)
            .collect::<Vec<_>>(),
    );
    assert_eq!(pleg.metrics().events(RelistSource::Global), 0);
    pleg.stop();
    s.cri.remove_all_pods().await;
}

macro_rules! newborn_tests {
    ($($name:ident: $flavor:expr, $sources:expr;)+) => {$(
        #[actix_rt::test]
        #[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
        async fn $name() {
            newborn_deaths($flavor, &$sources).await;
        }
    )+};
}

newborn_tests! {
    containerd_1_7_cri_events_alone_publishes_a_newborn_containers_death: Flavor::V1_7, [CriEvents];
    containerd_1_7_containerd_events_alone_publishes_a_newborn_containers_death: Flavor::V1_7, [ContainerdEvents];
    containerd_1_7_nri_alone_publishes_a_newborn_containers_death: Flavor::V1_7, [Nri];
    containerd_1_7_all_sources_publish_a_newborn_containers_death: Flavor::V1_7, ALL;
    containerd_2_1_cri_events_alone_publishes_a_newborn_containers_death: Flavor::V2_1, [CriEvents];
    containerd_2_1_containerd_events_alone_publishes_a_newborn_containers_death: Flavor::V2_1, [ContainerdEvents];
    containerd_2_1_nri_alone_publishes_a_newborn_containers_death: Flavor::V2_1, [Nri];
    containerd_2_1_all_sources_publish_a_newborn_containers_death: Flavor::V2_1, ALL;
}

/// A quiet runtime (containerd sends response headers only with its first event):
/// every source is streaming anyway. containerd's event service keeps nothing for a
/// later subscriber, so a raw subscriber that saw no event proves that
/// `containerd-events` streamed without one (the CRI stream may get events containerd
/// buffered before plegd started).
async fn quiet_runtime_streams(flavor: Flavor) {
    let s = Session::begin(flavor).await;
    let seen = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = seen.clone();
    let mut events = EventsClient::new(plegd_runtime::unix_channel(&s.containerd.socket));
    let raw = actix_rt::spawn(async move {
        let filters = vec![format!("namespace=={CRI_NAMESPACE}")];
        if let Ok(resp) = events.subscribe(SubscribeRequest { filters }).await {
            let mut stream = resp.into_inner();
            while let Some(Ok(_)) = stream.next().await {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    });
    // The raw subscription in place before plegd's.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let began = Instant::now();
    let (pleg, _sub) = start_pleg(&s, &ALL, LONG_PERIOD, policy(100, 2_000)).await;
    wait_streaming(&pleg, &ALL).await;
    let took = began.elapsed();
    eprintln!(
        "[quiet] containerd {}: every source streaming {:.0} ms after start",
        flavor.as_str(),
        took.as_secs_f64() * 1e3
    );
    assert_eq!(
        seen.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "containerd published events: the runtime was not quiet"
    );
    raw.abort();
    pleg.stop();
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn containerd_1_7_every_source_streams_on_a_quiet_runtime() {
    quiet_runtime_streams(Flavor::V1_7).await;
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn containerd_2_1_every_source_streams_on_a_quiet_runtime() {
    quiet_runtime_streams(Flavor::V2_1).await;
}

/// containerd restarted (stopped with `signal`): NRI is back about when the CRI stream
/// is — before, its first reconnect met the socket missing or refusing while
/// containerd started, it went `unsupported` and waited the whole reconnect cap (60 s)
/// — and it never shows `unsupported` meanwhile.
async fn nri_back_after_a_restart(flavor: Flavor, signal: &str) {
    let s = Session::begin(flavor).await;
    let sources = [CriEvents, Nri];
    // The default reconnect policy (500 ms, capped at 60 s), a relist every second.
    let (pleg, _sub) = start_pleg(
        &s,
        &sources,
        Duration::from_secs(1),
        ReconnectPolicy::default(),
    )
    .await;
    wait_streaming(&pleg, &sources).await;
    let pid = s.containerd.pid().expect("containerd's pid");
    signal_pid(pid, signal);
    wait_pid_gone(pid, "containerd").await;
    let m = pleg.metrics().clone();
    wait_until("NRI down", || {
        m.hint_source_state(Nri) != HintSourceState::Streaming
    })
    .await;
    s.containerd.up().await.expect("containerd restarted");
    s.cri.wait_ready(Duration::from_secs(30)).await;
    let answered = Instant::now();
    let (mut cri_back, mut nri_back) = (None, None);
    let mut seen = HashSet::new();
    let deadline = answered + Duration::from_secs(40);
    while cri_back.is_none() || nri_back.is_none() {
        let (cri, nri) = (m.hint_source_state(CriEvents), m.hint_source_state(Nri));
        seen.insert(nri);
        if cri == HintSourceState::Streaming && cri_back.is_none() {
            cri_back = Some(answered.elapsed());
        }
        if nri == HintSourceState::Streaming && nri_back.is_none() {
            nri_back = Some(answered.elapsed());
        }
        assert!(
            Instant::now() < deadline,
            "40 s after containerd answered: cri-events {cri}, nri {nri}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (cri_back, nri_back) = (cri_back.unwrap_or_default(), nri_back.unwrap_or_default());
    eprintln!(
        "[restart] containerd {} SIG{signal}: after CRI answered again, the CRI stream \
         streamed in {:.1} s, NRI in {:.1} s",
        flavor.as_str(),
        cri_back.as_secs_f64(),
        nri_back.as_secs_f64()
    );
    assert!(
        !seen.contains(&HintSourceState::Unsupported),
        "NRI showed unsupported while containerd started: {seen:?}"
    );
    // Both reconnect on the same backoff: NRI within a few of its steps of the CRI
    // stream, far from the 60 s cap.
    assert!(
        nri_back <= cri_back + Duration::from_secs(15),
        "NRI back {nri_back:?} after CRI answered, the CRI stream {cri_back:?}"
    );
    pleg.stop();
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn containerd_1_7_nri_is_back_with_the_cri_stream_after_sigterm() {
    nri_back_after_a_restart(Flavor::V1_7, "TERM").await;
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn containerd_1_7_nri_is_back_with_the_cri_stream_after_sigkill() {
    nri_back_after_a_restart(Flavor::V1_7, "KILL").await;
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn containerd_2_1_nri_is_back_with_the_cri_stream_after_sigterm() {
    nri_back_after_a_restart(Flavor::V2_1, "TERM").await;
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn containerd_2_1_nri_is_back_with_the_cri_stream_after_sigkill() {
    nri_back_after_a_restart(Flavor::V2_1, "KILL").await;
}

/// With all three sources, `deaths` SIGKILLs one at a time (each waited for): the
/// relist requests the hint sources made for them, per death, and the latency. With
/// `raw` a second CRI subscriber takes a share of containerd 1.7's CRI events.
async fn requests_per_death(flavor: Flavor, raw: bool) {
    const DEATHS: usize = 20;
    let s = Session::begin(flavor).await;
    let (pleg, sub) = start_pleg(&s, &ALL, LONG_PERIOD, policy(100, 2_000)).await;
    let pod = s.cri.run_pod("per-death").await;
    if !raw {
        let m = pleg.metrics().clone();
        s.cri
            .make_sole_receiver(&pod, move || stream_events_received(&m))
            .await;
    }
    let raw = raw.then(|| s.cri.raw_events());
    wait_streaming(&pleg, &ALL).await;
    let mut containers = Vec::new();
    for i in 0..DEATHS {
        containers.push(
            s.cri
                .run_container(&pod, &format!("c{i}"), SLEEP_SCRIPT)
                .await,
        );
    }
    let mut started = HashSet::new();
    recv_until(&sub, "all started", |d| {
        if d.event.kind == EventKind::ContainerStarted {
            started.insert(d.event.container_id.clone());
        }
        containers.iter().all(|c| started.contains(c))
    })
    .await;
    if let Some(raw) = &raw {
        wait_until("raw CRI subscriber attached", || raw.received() > 0).await;
    }
    // Let the starts' rechecks run out.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let m = pleg.metrics().clone();
    let before = hint_requests(&m);
    let mut latency_ms = Vec::new();
    let mut by = std::collections::HashMap::<RelistSource, u32>::new();
    for c in &containers {
        s.cri.kill_container(c).await;
        let d = expect_event(&sub, EventKind::ContainerDied, c).await;
        let finished = d.event.exit.as_ref().and_then(|x| x.finished_at);
        let finished = finished.expect("a death carries its finished_at");
        let ms = SystemTime::now()
            .duration_since(finished)
            .unwrap_or_default()
            .as_secs_f64()
            * 1e3;
        latency_ms.push(ms);
        *by.entry(d.event.relist_source).or_default() += 1;
    }
    // The rechecks of the last deaths run out (the longest schedule is 5 s).
    tokio::time::sleep(Duration::from_secs(6)).await;
    let requests = hint_requests(&m) - before;
    let missed: Vec<(HintSourceName, (u64, u64))> = ALL
        .iter()
        .map(|&s| (s, pleg.hint_source_stops(s)))
        .collect();
    eprintln!(
        "[requests] containerd {}{}: all three sources, {DEATHS} deaths: {requests} relist \
         requests, {:.2} per death; exit -> ContainerDied p50 {:.1} ms, p99 {:.1} ms; first \
         by {by:?}; stops (judged, missed): {missed:?}",
        flavor.as_str(),
        if raw.is_some() {
            " beside a raw CRI subscriber"
        } else {
            ""
        },
        requests as f64 / DEATHS as f64,
        percentile(&latency_ms, 0.5),
        percentile(&latency_ms, 0.99),
    );
    for d in drain(&sub) {
        assert!(
            d.event.kind != EventKind::ContainerDied,
            "a second ContainerDied: {d:?}"
        );
    }
    assert_eq!(by.get(&RelistSource::Global), None, "{by:?}");
    let (judged, cri_missed) = pleg.hint_source_stops(CriEvents);
    assert!(judged >= DEATHS as u64, "{missed:?}");
    if raw.is_some() {
        // containerd 1.7 gives each CRI event to one subscriber: plegd's stream misses
        // some, and says so.
        assert!(cri_missed > 0, "{missed:?}");
    } else {
        assert_eq!(cri_missed, 0, "{missed:?}");
    }
    pleg.stop();
    drop(raw);
    s.cri.remove_all_pods().await;
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn containerd_1_7_relist_requests_per_death_with_all_sources() {
    requests_per_death(Flavor::V1_7, false).await;
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn containerd_1_7_relist_requests_per_death_with_all_sources_beside_a_cri_subscriber() {
    requests_per_death(Flavor::V1_7, true).await;
}

#[actix_rt::test]
#[ignore = "needs root and a real containerd: scripts/test.sh runs it"]
async fn containerd_2_1_relist_requests_per_death_with_all_sources() {
    requests_per_death(Flavor::V2_1, false).await;
}
