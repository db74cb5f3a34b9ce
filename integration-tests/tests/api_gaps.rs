//! No loss goes untold, whatever the filters: Watch streams whose clients stall (a
//! client connection with a small HTTP/2 window that stops reading backs up plegd's
//! queue for it) through the real API server on a unix socket. Each loss comes as a
//! Gap before any later event or bookmark, also when nothing matching follows it, and
//! resuming from its `after_revision` replays exactly the lost matching events.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use integration_tests::api::*;
use integration_tests::wait::{recv_until, wait_until, TIMEOUT};
use plegd_actors::{Delivery, EventKind, PlegConfig, Subscription};
use plegd_api::v1::{self, plegd_client::PlegdClient, watch_response::Kind};
use plegd_api::LabelSelector;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tonic::transport::Channel;
use tonic::Streaming;

/// One published event, as the test knows it.
#[derive(Clone, Debug)]
struct Published {
    revision: u64,
    kind: EventKind,
    uid: String,
    namespace: String,
}

fn published(got: &[Delivery]) -> Vec<Published> {
    got.iter()
        .map(|d| Published {
            revision: d.event.revision,
            kind: d.event.kind,
            uid: d.event.pod.uid.clone(),
            namespace: d.event.pod.namespace.clone(),
        })
        .collect()
}

/// A Watch stream as read, checked as it is read: positions only move forward (an
/// event, a bookmark, a gap's `after_revision` are never behind what the stream told
/// before: no bookmark passed a loss told later), `seq` jumps by `missed`, and
/// `missed` sums the gaps since the previous event.
#[derive(Debug, Default)]
struct Log {
    events: Vec<v1::Event>,
    gaps: Vec<v1::Gap>,
    bookmarks: Vec<u64>,
    /// The revision the stream told it reached.
    position: u64,
    seq: u64,
    dropped_since_event: u64,
    /// Every message kind in order (for failures).
    trail: Vec<String>,
}

impl Log {
    fn starting_at(position: u64) -> Log {
        Log {
            position,
            ..Log::default()
        }
    }

    fn take(&mut self, kind: Kind) -> Result<(), String> {
        match kind {
            Kind::Event(e) => {
                self.trail.push(format!("e{}", e.revision));
                if e.revision <= self.position {
                    return Err(format!(
                        "event {} at position {}",
                        e.revision, self.position
                    ));
                }
                if e.missed != self.dropped_since_event {
                    return Err(format!(
                        "event {} says missed {} after gaps of {}",
                        e.revision, e.missed, self.dropped_since_event
                    ));
                }
                if e.seq != self.seq + 1 + e.missed {
                    return Err(format!(
                        "event {}: seq {} after {} with missed {}",
                        e.revision, e.seq, self.seq, e.missed
                    ));
                }
                self.seq = e.seq;
                self.dropped_since_event = 0;
                self.position = e.revision;
                self.events.push(e);
            }
            Kind::Bookmark(b) => {
                self.trail.push(format!("b{}", b.revision));
                if b.revision < self.position {
                    return Err(format!("bookmark {} behind {}", b.revision, self.position));
                }
                self.position = b.revision;
                self.bookmarks.push(b.revision);
            }
            Kind::Gap(g) => {
                self.trail.push(format!(
                    "g{}-{}x{}",
                    g.after_revision, g.through_revision, g.dropped
                ));
                if g.after_revision < self.position {
                    return Err(format!(
                        "gap after {} behind the position {} already told",
                        g.after_revision, self.position
                    ));
                }
                if g.through_revision <= g.after_revision || g.dropped == 0 {
                    return Err(format!("an empty gap {g:?}"));
                }
                self.position = g.through_revision;
                self.dropped_since_event += g.dropped;
                self.gaps.push(g);
            }
            Kind::Hello(_) => return Err("a second Hello".into()),
        }
        Ok(())
    }

    /// True once the stream told it reached `revision`.
    fn covers(&self, revision: u64) -> bool {
        self.position >= revision
    }
}

/// What the stream's next message is, None once it ended with UNAVAILABLE (the
/// publisher closed); panics on anything else or after the test timeout.
async fn next_or_end(stream: &mut Streaming<v1::WatchResponse>) -> Option<Kind> {
    next_within(stream, TIMEOUT).await
}

async fn next_within(stream: &mut Streaming<v1::WatchResponse>, wait: Duration) -> Option<Kind> {
    match tokio::time::timeout(wait, stream.message()).await {
        Ok(Ok(Some(v1::WatchResponse { kind: Some(k) }))) => Some(k),
        Ok(Err(s)) if s.code() == tonic::Code::Unavailable => None,
        // The closing status is best effort: a full stream buffer ends it plainly.
        Ok(Ok(None)) => None,
        Ok(other) => panic!("the stream ended unexpectedly: {other:?}"),
        Err(_) => panic!("no message within {wait:?}"),
    }
}

/// Reads until the stream reached `revision`.
async fn read_until_covers(
    stream: &mut Streaming<v1::WatchResponse>,
    log: &mut Log,
    revision: u64,
) -> Result<(), String> {
    while !log.covers(revision) {
        match next_or_end(stream).await {
            Some(k) => log.take(k)?,
            None => return Err(format!("the stream ended before revision {revision}")),
        }
    }
    Ok(())
}

/// Reads until the stream ends (the publisher closed).
async fn read_to_end(
    stream: &mut Streaming<v1::WatchResponse>,
    log: &mut Log,
) -> Result<(), String> {
    while let Some(k) = next_or_end(stream).await {
        log.take(k)?;
    }
    Ok(())
}

/// The filters of a request, applied by the test to what was published.
struct Wants {
    uids: BTreeSet<String>,
    namespaces: BTreeSet<String>,
    types: BTreeSet<i32>,
    selector: LabelSelector,
}

impl Wants {
    fn of(req: &v1::WatchRequest) -> Wants {
        Wants {
            uids: req.pod_uids.iter().cloned().collect(),
            namespaces: req.namespaces.iter().cloned().collect(),
            types: req.types.iter().copied().collect(),
            selector: LabelSelector::parse(&req.label_selector).expect("a valid selector"),
        }
    }

    fn matches(&self, e: &Published, labels: &BTreeMap<String, BTreeMap<String, String>>) -> bool {
        let ty = i32::from(plegd_api::convert::event_type(e.kind));
        (self.uids.is_empty() || self.uids.contains(&e.uid))
            && (self.namespaces.is_empty() || self.namespaces.contains(&e.namespace))
            && (self.types.is_empty() || self.types.contains(&ty))
            && self
                .selector
                .matches(labels.get(&e.uid).unwrap_or(&BTreeMap::new()))
    }
}

/// Replays the gaps of `log` with Watches (same filters) read at once by their own
/// tasks until they end (the publisher closes once every resume is open): one from
/// the first gap's `after_revision`, which gives what a resume from any later gap
/// gives in that gap's range (the replay is the history's), and one from each of
/// `each` gaps (all, in the regression tests; a random one, in the randomized test).
/// Each gives the events it replayed in the ranges of the gaps it stands for.
async fn resume_gaps(
    client: &mut PlegdClient<Channel>,
    req: &v1::WatchRequest,
    log: &Log,
    each: &[usize],
) -> Vec<tokio::task::JoinHandle<Result<Vec<u64>, String>>> {
    let mut out = Vec::new();
    let Some(first) = log.gaps.first() else {
        return out;
    };
    let mut plan = vec![(first.after_revision, log.gaps.clone())];
    for &i in each {
        plan.push((log.gaps[i].after_revision, vec![log.gaps[i]]));
    }
    for (after, gaps) in plan {
        let w = watch(
            client,
            v1::WatchRequest {
                since_revision: Some(after),
                bookmark_interval_seconds: 0,
                ..req.clone()
            },
        )
        .await;
        out.push(tokio::spawn(replayed(after, gaps, w.stream)));
    }
    out
}

/// The events of a resumed stream inside the ranges of `gaps`.
async fn replayed(
    after: u64,
    gaps: Vec<v1::Gap>,
    mut stream: Streaming<v1::WatchResponse>,
) -> Result<Vec<u64>, String> {
    let mut log = Log::starting_at(after);
    let last = gaps.last().map_or(after, |g| g.through_revision);
    // Past the last range, or to the end (when nothing it wants follows: after every
    // resume is open, so the wait is longer than one message's).
    while log.position <= last {
        match next_within(&mut stream, 6 * TIMEOUT).await {
            Some(k) => log.take(k)?,
            None => break,
        }
    }
    if let Some(g) = log.gaps.iter().find(|g| g.after_revision < last) {
        return Err(format!("the replay from {after} lost events itself: {g:?}"));
    }
    Ok(log
        .events
        .iter()
        .map(|e| e.revision)
        .filter(|r| {
            gaps.iter()
                .any(|g| g.after_revision < *r && *r <= g.through_revision)
        })
        .collect())
}

async fn joined(
    resumes: Vec<tokio::task::JoinHandle<Result<Vec<u64>, String>>>,
) -> Result<Vec<Vec<u64>>, String> {
    let mut out = Vec::new();
    for r in resumes {
        out.push(r.await.map_err(|e| e.to_string())??);
    }
    Ok(out)
}

/// Events received plus events replayed from the gaps, against what the filters
/// select from what was published after `from`: the same set, each once.
fn check_accounting(
    what: &str,
    log: &Log,
    replays: &[Vec<u64>],
    expected: &[u64],
) -> Result<(), String> {
    let mut got: Vec<u64> = log.events.iter().map(|e| e.revision).collect();
    for r in replays {
        got.extend(r);
    }
    got.sort_unstable();
    if got != expected {
        let g: BTreeSet<u64> = got.iter().copied().collect();
        let e: BTreeSet<u64> = expected.iter().copied().collect();
        return Err(format!(
            "{what}: {} received + replayed, {} expected; missing {:?}, extra {:?}, duplicates: {}; gaps {:?}; trail {:?}",
            got.len(),
            expected.len(),
            e.difference(&g).take(20).collect::<Vec<_>>(),
            g.difference(&e).take(20).collect::<Vec<_>>(),
            got.len() != g.len(),
            log.gaps,
            log.trail.iter().rev().take(40).rev().collect::<Vec<_>>(),
        ));
    }
    Ok(())
}

async fn direct(served: &Served) -> Subscription {
    served.pleg.subscribe("reference", 1 << 20).await.unwrap()
}

/// A container started in the marker pod, and every event up to its start.
async fn mark(served: &Served, reference: &Subscription, sandbox: &str, n: usize) -> Vec<Delivery> {
    let id = served.rt.run_container(sandbox, &format!("mark{n}"));
    recv_until(reference, "the marker", |d| {
        d.event.container_id == id && d.event.kind == EventKind::ContainerStarted
    })
    .await
}

/// Waits until the API's watchers overflowed at least once.
async fn wait_for_drops(served: &Served) {
    wait_until("a watcher's queue overflowed", || {
        served.pleg.metrics().subscriber_drops.get() > 0
    })
    .await;
}

#[actix_rt::test]
async fn a_stalled_filtered_watcher_is_told_its_loss_before_any_later_bookmark() {
    let served = Served::start(Duration::from_millis(5), 8);
    let reference = direct(&served).await;
    let target = served.rt.run_pod("target", "t", "ns");
    let other = served.rt.run_pod("other", "o", "ns");
    let marks = served.rt.run_pod("marks", "m", "ns-marks");
    let start = mark(&served, &reference, &marks, 0).await;
    let from = start.last().unwrap().event.revision;
    let req = v1::WatchRequest {
        pod_uids: vec!["target".into()],
        bookmark_interval_seconds: 1,
        since_revision: Some(from),
        ..Default::default()
    };
    let mut stalled_client = served.client_with_small_window().await;
    let mut w = watch(&mut stalled_client, req.clone()).await;

    // Churn on both pods while the watcher reads nothing: far more matching events
    // than its queue, the stream's buffer and the HTTP/2 window hold; the last
    // changes are the other pod's only.
    let rt = served.rt.clone();
    let (t, o) = (target.clone(), other.clone());
    tokio::task::spawn_blocking(move || {
        for i in 0..800 {
            rt.run_container(&t, &format!("t{i}"));
            if i % 3 == 0 {
                rt.run_container(&o, &format!("o{i}"));
            }
            if i % 50 == 0 {
                // Pacing, not synchronisation: several relists see the churn.
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        for i in 0..50 {
            rt.run_container(&o, &format!("late{i}"));
        }
    })
    .await
    .unwrap();
    // Two marks: every change made before the first is published before the second.
    let mut all = mark(&served, &reference, &marks, 1).await;
    all.extend(mark(&served, &reference, &marks, 2).await);
    let last = all.last().unwrap().event.revision;
    wait_for_drops(&served).await;

    // The watcher reads again: until it reached the last revision, whatever the
    // messages (an idle bookmark comes within a second of the last one sent).
    let mut log = Log::starting_at(from);
    read_until_covers(&mut w.stream, &mut log, last)
        .await
        .unwrap_or_else(|e| panic!("{e}; trail {:?}", log.trail));
    assert!(
        !log.gaps.is_empty(),
        "the loss was told: {:?}",
        log.trail.iter().rev().take(20).collect::<Vec<_>>()
    );
    let expected: Vec<u64> = published(&all)
        .iter()
        .filter(|e| e.uid == "target")
        .map(|e| e.revision)
        .collect();
    let mut client = served.client().await;
    let each: Vec<usize> = (0..log.gaps.len()).collect();
    let resumes = resume_gaps(&mut client, &req, &log, &each).await;
    served.pleg.close_publisher().await;
    read_to_end(&mut w.stream, &mut log).await.unwrap();
    let replays = joined(resumes).await.unwrap();
    // Each gap's own resume gives what the first one gives in its range.
    let (whole, each) = replays.split_first().unwrap();
    assert_eq!(each.concat(), *whole);
    let replays = vec![whole.clone()];
    check_accounting("the stalled watcher", &log, &replays, &expected).unwrap();
    let told: u64 = log.gaps.iter().map(|g| g.dropped).sum();
    let lost_matching: usize = replays.iter().map(Vec::len).sum();
    assert!(lost_matching > 0, "matching events were among the lost");
    assert!(told as usize >= lost_matching);
}

#[actix_rt::test]
async fn a_watcher_that_overflowed_is_told_even_when_nothing_it_wants_follows() {
    let served = Served::start(Duration::from_millis(5), 8);
    let reference = direct(&served).await;
    let target = served.rt.run_pod("target", "t", "ns");
    let marks = served.rt.run_pod("marks", "m", "ns-marks");
    let from = mark(&served, &reference, &marks, 0)
        .await
        .last()
        .unwrap()
        .event
        .revision;
    let req = v1::WatchRequest {
        pod_uids: vec!["target".into()],
        since_revision: Some(from),
        ..Default::default()
    };
    let mut stalled_client = served.client_with_small_window().await;
    let mut w = watch(&mut stalled_client, req.clone()).await;
    let rt = served.rt.clone();
    let t = target.clone();
    tokio::task::spawn_blocking(move || {
        for i in 0..800 {
            rt.run_container(&t, &format!("t{i}"));
            if i % 50 == 0 {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    })
    .await
    .unwrap();
    // Two marks: every change made before the first is published before the second.
    let mut all = mark(&served, &reference, &marks, 1).await;
    all.extend(mark(&served, &reference, &marks, 2).await);
    let last_target = published(&all)
        .iter()
        .filter(|e| e.uid == "target")
        .map(|e| e.revision)
        .max()
        .unwrap();
    wait_for_drops(&served).await;
    // Nothing for the target after this: the watcher must learn of its loss anyway.
    let mut log = Log::starting_at(from);
    let deadline = Instant::now() + TIMEOUT;
    while log.gaps.is_empty() || !log.covers(last_target) {
        assert!(
            Instant::now() < deadline,
            "no gap told: {:?}",
            log.trail.iter().rev().take(20).collect::<Vec<_>>()
        );
        let k = next_or_end(&mut w.stream)
            .await
            .expect("the stream goes on");
        log.take(k).unwrap();
    }
    // The loop ends once the last target event was received or told lost: when it was
    // lost (as the stall usually makes it), that was told with no later event the
    // filter wants. How the stalled connection drains decides which; the publisher's
    // tests cover the loss with nothing after it deterministically.
    let gap = *log.gaps.last().unwrap();
    eprintln!(
        "last target event {last_target}: {}",
        if gap.after_revision < last_target && gap.through_revision >= last_target {
            "lost, and told with nothing after it"
        } else {
            "received after the last gap"
        }
    );
    let mut client = served.client().await;
    let each: Vec<usize> = (0..log.gaps.len()).collect();
    let resumes = resume_gaps(&mut client, &req, &log, &each).await;
    served.pleg.close_publisher().await;
    read_to_end(&mut w.stream, &mut log).await.unwrap();
    let replays = joined(resumes).await.unwrap();
    // Each gap's own resume gives what the first one gives in its range.
    let (whole, each) = replays.split_first().unwrap();
    assert_eq!(each.concat(), *whole);
    let replays = vec![whole.clone()];
    let expected: Vec<u64> = published(&all)
        .iter()
        .filter(|e| e.uid == "target")
        .map(|e| e.revision)
        .collect();
    check_accounting("the overflowed watcher", &log, &replays, &expected).unwrap();
}

// The randomized test: hundreds of watchers with random filters and stalls, churn;
// for each, events received + the gaps' replays = exactly the matching events.

const NAMESPACES: [&str; 3] = ["ns-a", "ns-b", "ns-c"];
const APPS: [&str; 3] = ["web", "db", "cache"];
const TIERS: [&str; 2] = ["front", "back"];
const TYPES: [v1::EventType; 3] = [
    v1::EventType::ContainerStarted,
    v1::EventType::ContainerDied,
    v1::EventType::ContainerRemoved,
];

/// The seeds to run: PLEGD_GAP_SEED (one), else PLEGD_GAP_SEEDS (how many, from a
/// random first one), else 2 (CI; with PLEGD_GAP_WATCHERS, 50 by default, the run
/// stays short in a debug build: every lost event is replayed by a resume).
fn seeds() -> Vec<u64> {
    if let Ok(s) = std::env::var("PLEGD_GAP_SEED") {
        return vec![s.parse().expect("PLEGD_GAP_SEED: a number")];
    }
    let n: u64 = std::env::var("PLEGD_GAP_SEEDS")
        .map(|s| s.parse().expect("PLEGD_GAP_SEEDS: a number"))
        .unwrap_or(2);
    let first: u64 = rand::random::<u32>().into();
    (first..first + n).collect()
}

fn random_request(rng: &mut ChaCha8Rng, pods: &[(String, &str)], from: u64) -> v1::WatchRequest {
    let mut req = v1::WatchRequest {
        since_revision: Some(from),
        bookmark_interval_seconds: if rng.random_bool(0.3) { 1 } else { 0 },
        ..Default::default()
    };
    if rng.random_bool(0.3) {
        let n = rng.random_range(1..=4);
        req.pod_uids = pods
            .choose_multiple(rng, n)
            .map(|(uid, _)| uid.clone())
            .collect();
    }
    if rng.random_bool(0.3) {
        let n = rng.random_range(1..=2);
        req.namespaces = NAMESPACES
            .choose_multiple(rng, n)
            .map(|s| s.to_string())
            .collect();
    }
    if rng.random_bool(0.3) {
        let n = rng.random_range(1..=2);
        req.types = TYPES.choose_multiple(rng, n).map(|t| (*t).into()).collect();
    }
    if rng.random_bool(0.3) {
        let mut terms = Vec::new();
        for _ in 0..rng.random_range(1..=2) {
            let (key, value) = if rng.random_bool(0.5) {
                ("app", *APPS.choose(rng).unwrap())
            } else {
                ("tier", *TIERS.choose(rng).unwrap())
            };
            let op = if rng.random_bool(0.7) { "=" } else { "!=" };
            terms.push(format!("{key}{op}{value}"));
        }
        req.label_selector = terms.join(",");
    }
    req
}

/// A watcher's reading plan: stalls (after how many messages, for how long).
fn random_stalls(rng: &mut ChaCha8Rng) -> Vec<(usize, Duration)> {
    if rng.random_bool(0.5) {
        return Vec::new();
    }
    let mut at = 0;
    (0..rng.random_range(1..=3))
        .map(|_| {
            at += rng.random_range(0..200);
            (at, Duration::from_millis(rng.random_range(50..800)))
        })
        .collect()
}

/// What one seed saw.
#[derive(Debug, Default)]
struct Figures {
    watchers: usize,
    events: usize,
    received: usize,
    gaps: usize,
    replayed: usize,
}

async fn run_seed(seed: u64, watchers: usize) -> Result<Figures, String> {
    let started = Instant::now();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let queue = *[2usize, 4, 8, 16].choose(&mut rng).unwrap();
    let served = Served::start_limited(
        PlegConfig {
            relist_period: Duration::from_millis(5),
            ..PlegConfig::default()
        },
        queue,
        watchers + 8,
    );
    let reference = direct(&served).await;
    let marks = served.rt.run_pod("marks", "m", "ns-marks");
    let mut pods = Vec::new();
    let mut labels = BTreeMap::new();
    let mut sandboxes = Vec::new();
    for i in 0..12 {
        let uid = format!("pod-{i}");
        let ns = NAMESPACES[i % NAMESPACES.len()];
        let mut l = BTreeMap::from([(
            "app".to_string(),
            APPS.choose(&mut rng).unwrap().to_string(),
        )]);
        if rng.random_bool(0.6) {
            l.insert("tier".into(), TIERS.choose(&mut rng).unwrap().to_string());
        }
        sandboxes.push(served.rt.run_pod_with_labels(&uid, &uid, ns, l.clone()));
        labels.insert(uid.clone(), l);
        pods.push((uid, ns));
    }
    let from = mark(&served, &reference, &marks, 0)
        .await
        .last()
        .unwrap()
        .event
        .revision;

    // Each watcher on its own small-window connection: its stalls back up plegd's
    // queue for it alone.
    let mut readers = Vec::new();
    // What was published, once the churn is over: each reader then reads until its
    // stream reached the last event its filters select.
    type Done =
        Option<std::sync::Arc<(Vec<Published>, BTreeMap<String, BTreeMap<String, String>>)>>;
    let (go, _) = tokio::sync::watch::channel::<Done>(None);
    for i in 0..watchers {
        let req = random_request(&mut rng, &pods, from);
        let stalls = random_stalls(&mut rng);
        let mut client = served.client_with_small_window().await;
        let mut w = watch(&mut client, req.clone()).await;
        let mut until = go.subscribe();
        readers.push(tokio::spawn(async move {
            let mut log = Log::starting_at(from);
            let mut stalls = stalls.into_iter().peekable();
            let mut read = 0;
            // Phase 1: read (with stalls) until told the revision to reach, then
            // until it is reached.
            loop {
                if let Some((at, pause)) = stalls.peek().copied() {
                    if read >= at {
                        stalls.next();
                        // The stall itself is what is under test.
                        tokio::time::sleep(pause).await;
                    }
                }
                let target = until.borrow().as_ref().map(|done| {
                    let wants = Wants::of(&req);
                    done.0
                        .iter()
                        .filter(|e| e.revision > from && wants.matches(e, &done.1))
                        .map(|e| e.revision)
                        .max()
                        .unwrap_or(from)
                });
                if let Some(t) = target {
                    if log.covers(t) {
                        break;
                    }
                }
                tokio::select! {
                    k = next_or_end(&mut w.stream) => match k {
                        Some(k) => { log.take(k).map_err(|e| format!("watcher {i}: {e}"))?; read += 1; }
                        None => return Err(format!("watcher {i}: the stream ended early")),
                    },
                    _ = until.changed(), if target.is_none() => {}
                }
            }
            Ok::<_, String>((i, req, log, w.stream, client))
        }));
    }
    let t_setup = started.elapsed();
    eprintln!("seed {seed}: set up at {t_setup:?}");
    // Churn: random starts, deaths and removals over the pods, in bursts.
    let rt = served.rt.clone();
    let churn_seed = rng.random();
    tokio::task::spawn_blocking(move || {
        let mut rng = ChaCha8Rng::seed_from_u64(churn_seed);
        let mut running: Vec<String> = Vec::new();
        let mut exited: Vec<String> = Vec::new();
        for burst in 0..25 {
            for n in 0..rng.random_range(1..50) {
                let roll = rng.random_range(0..10);
                if roll < 5 || running.is_empty() {
                    let sb = sandboxes.choose(&mut rng).unwrap();
                    running.push(rt.run_container(sb, &format!("c{burst}-{n}")));
                } else if roll < 8 || exited.is_empty() {
                    let i = rng.random_range(0..running.len());
                    let id = running.swap_remove(i);
                    rt.exit_container(&id, 1);
                    exited.push(id);
                } else {
                    let i = rng.random_range(0..exited.len());
                    rt.remove_container(&exited.swap_remove(i));
                }
            }
            // Pacing, not synchronisation: the bursts spread over many relists.
            std::thread::sleep(Duration::from_millis(rng.random_range(0..15)));
        }
    })
    .await
    .map_err(|e| e.to_string())?;
    // Two marks: every change made before the first is published before the second.
    let mut all = mark(&served, &reference, &marks, 1).await;
    all.extend(mark(&served, &reference, &marks, 2).await);
    let all = published(&all);
    let _ = go.send(Some(std::sync::Arc::new((all.clone(), labels.clone()))));
    let t_churn = started.elapsed();
    eprintln!("seed {seed}: churn done at {t_churn:?}");

    let mut read = Vec::new();
    for r in readers {
        read.push(r.await.map_err(|e| e.to_string())??);
    }
    // Replays of every gap told, opened before the publisher closes; then every
    // stream ends after what it still holds (a late gap included).
    let t_read = started.elapsed();
    eprintln!("seed {seed}: read at {t_read:?}");
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(served.client().await);
    }
    let mut open = Vec::new();
    for (i, req, log, stream, c) in read {
        let each: Vec<usize> = if log.gaps.len() > 1 {
            vec![rng.random_range(1..log.gaps.len())]
        } else {
            Vec::new()
        };
        let resumes = resume_gaps(&mut clients[i % 8], &req, &log, &each).await;
        open.push((i, req, log, stream, c, resumes, each));
    }
    let t_resumed = started.elapsed();
    eprintln!("seed {seed}: resumes open at {t_resumed:?}");
    served.pleg.close_publisher().await;
    let mut figures = Figures {
        watchers,
        events: all.len(),
        ..Figures::default()
    };
    let checks: Vec<_> = open
        .into_iter()
        .map(|(i, req, mut log, mut stream, c, resumes, each)| {
            let all = all.clone();
            let labels = labels.clone();
            tokio::spawn(async move {
                let _keep = c;
                let (end, replays) =
                    tokio::join!(read_to_end(&mut stream, &mut log), joined(resumes));
                end.map_err(|e| format!("watcher {i}: {e}"))?;
                let replays = replays.map_err(|e| format!("watcher {i}: {e}"))?;
                // A gap's own resume gives what the first gap's gives in its range.
                if let ([whole, one], [k]) = (replays.as_slice(), each.as_slice()) {
                    let g = log.gaps[*k];
                    let in_range: Vec<u64> = whole
                        .iter()
                        .copied()
                        .filter(|r| g.after_revision < *r && *r <= g.through_revision)
                        .collect();
                    if *one != in_range {
                        return Err(format!(
                            "watcher {i}: resuming from gap {g:?} gave {one:?}, the first gap's resume {in_range:?}"
                        ));
                    }
                }
                let replays: Vec<Vec<u64>> = replays.into_iter().take(1).collect();
                let wants = Wants::of(&req);
                let expected: Vec<u64> = all
                    .iter()
                    .filter(|e| e.revision > from && wants.matches(e, &labels))
                    .map(|e| e.revision)
                    .collect();
                check_accounting(&format!("watcher {i} ({req:?})"), &log, &replays, &expected)?;
                let replayed: usize = replays.iter().map(Vec::len).sum();
                Ok::<_, String>((log.events.len(), log.gaps.len(), replayed))
            })
        })
        .collect();
    for c in checks {
        let (received, gaps, replayed) = c.await.map_err(|e| e.to_string())??;
        figures.received += received;
        figures.gaps += gaps;
        figures.replayed += replayed;
    }
    eprintln!(
        "seed {seed}: set up in {t_setup:?}, churn done at {t_churn:?}, read at {t_read:?}, \
         resumes open at {t_resumed:?}, checked at {:?}",
        started.elapsed()
    );
    Ok(figures)
}

#[actix_rt::test]
async fn every_watcher_gets_exactly_its_events_from_what_it_received_and_the_gaps_told() {
    let watchers: usize = std::env::var("PLEGD_GAP_WATCHERS")
        .map(|s| s.parse().expect("PLEGD_GAP_WATCHERS: a number"))
        .unwrap_or(50);
    let started = Instant::now();
    let mut total = Figures::default();
    let seeds = seeds();
    for &seed in &seeds {
        let t = Instant::now();
        match run_seed(seed, watchers).await {
            Ok(f) => {
                println!("seed {seed}: {f:?} in {:?}", t.elapsed());
                total.watchers += f.watchers;
                total.events += f.events;
                total.received += f.received;
                total.gaps += f.gaps;
                total.replayed += f.replayed;
            }
            Err(e) => panic!("seed {seed} (PLEGD_GAP_SEED={seed} to replay): {e}"),
        }
    }
    println!(
        "{} seeds in {:?}: {total:?}",
        seeds.len(),
        started.elapsed()
    );
    assert!(
        total.gaps > 0,
        "no watcher overflowed: the test tested nothing"
    );
}
