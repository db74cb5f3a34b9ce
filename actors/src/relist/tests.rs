//! Component tests of the RelistDispatcher alone (KEP-3386 "Design Details"): the
//! fake runtime under a real GenericPleg, and [`Recorder`] mocks as the CacheOwner
//! and the EventPublisher, so each neighbour's behaviour that matters (answering
//! late, stalling) is scripted here instead of emerging from the whole system.

use std::sync::Arc;
use std::time::{Duration, Instant};

use plegd_runtime::RuntimeClient;
use plegd_sim::{FakeRuntime, Op};
use plegd_telemetry::{Metrics, RequestResult};

use super::dispatcher::{DispatcherConfig, DispatcherDeps, DispatcherHandle, RelistDispatcher};
use crate::cache::ApplyRelist;
use crate::event::{EventKind, RelistSource};
use crate::health::Health;
use crate::mock::{Recorded, Recorder, RecorderConfig};
use crate::pleg::GenericPleg;
use crate::publisher::Publish;
use crate::sync::HeldPods;
use crate::testing::wait_until;

// Nothing in production copies these messages; the Recorder hands the test copies.
// (If cache/ or publisher.rs ever derive Clone, delete these.)
impl Clone for ApplyRelist {
    fn clone(&self) -> Self {
        ApplyRelist {
            updates: self.updates.clone(),
            global_timestamp: self.global_timestamp,
            held: self.held.clone(),
            revision: self.revision,
            events: self.events.clone(),
            more: self.more,
        }
    }
}

impl Clone for Publish {
    fn clone(&self) -> Self {
        Publish(self.0.clone())
    }
}

/// A dispatcher alone, with recorders as its cache and publisher.
pub(super) struct Bench {
    pub(super) dispatcher: DispatcherHandle,
    pub(super) cache: Recorded<ApplyRelist>,
    pub(super) published: Recorded<Publish>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) health: Health,
    pub(super) held: HeldPods,
}

pub(super) struct Setup {
    pub(super) period: Duration,
    pub(super) capacity: usize,
    pub(super) health_threshold: Duration,
    pub(super) cache: RecorderConfig,
    pub(super) publisher: RecorderConfig,
    /// Batches take requests while they run (off: every request waits in the
    /// pending set, whose rules a test then sees alone).
    pub(super) admission: bool,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            // Only the first global relist runs unless a test asks for more.
            period: Duration::from_secs(3600),
            capacity: 1024,
            health_threshold: Duration::from_secs(180),
            cache: RecorderConfig::default(),
            publisher: RecorderConfig::default(),
            admission: true,
        }
    }
}

pub(super) fn start(rt: &FakeRuntime, setup: Setup) -> Bench {
    start_on(Arc::new(rt.clone()), setup)
}

pub(super) fn start_on(runtime: Arc<dyn RuntimeClient>, setup: Setup) -> Bench {
    let (cache_addr, cache) = Recorder::<ApplyRelist>::start(setup.cache);
    let (publisher_addr, published) = Recorder::<Publish>::start(setup.publisher);
    let metrics = Arc::new(Metrics::new());
    let health = Health::new(setup.health_threshold);
    let held = HeldPods::default();
    let dispatcher = RelistDispatcher::start(
        GenericPleg::new(runtime, 4),
        DispatcherConfig {
            relist_period: setup.period,
            queue_capacity: setup.capacity,
            admission: setup.admission,
        },
        DispatcherDeps {
            cache: cache_addr.recipient(),
            publisher: publisher_addr.recipient(),
            metrics: metrics.clone(),
            health: health.clone(),
            held: held.clone(),
            revisions: Default::default(),
            state: None,
        },
    );
    Bench {
        dispatcher,
        cache,
        published,
        metrics,
        health,
        held,
    }
}

impl Bench {
    /// Global relists whose lists and apply completed (the duration is observed last).
    pub(super) fn global_relists(&self) -> u64 {
        self.metrics.relist_duration.get_sample_count()
    }

    pub(super) fn requests(&self, result: RequestResult) -> u64 {
        self.metrics.requests(result, RelistSource::EventedPleg)
    }

    /// Every request accepted into the queue has been settled one way or another.
    pub(super) fn settled(&self) -> u64 {
        [
            RequestResult::Done,
            RequestResult::Skipped,
            RequestResult::Coalesced,
            RequestResult::Merged,
        ]
        .into_iter()
        .map(|r| self.requests(r))
        .sum()
    }
}

fn updates_pod(a: &ApplyRelist, uid: &str) -> bool {
    a.updates.iter().any(|u| u.uid() == uid)
}

/// (kind, container or sandbox id, source) of each published event, in order.
fn events(p: &Publish) -> Vec<(EventKind, String, RelistSource)> {
    p.0.iter()
        .map(|e| (e.kind, e.container_id.clone(), e.relist_source))
        .collect()
}

/// Waits for the `n`th publish, checking on every poll that no publish is visible
/// before its cache update; returns when the `n`th was first seen.
async fn nth_publish_after_its_cache_update(b: &Bench, n: usize) -> Option<Instant> {
    let mut seen = None;
    wait_until(&format!("publish number {n}"), || {
        let published = b.published.len();
        let cached = b.cache.len();
        assert!(
            cached >= published,
            "published {published} before cached {cached}"
        );
        if published == n && seen.is_none() {
            seen = Some(Instant::now());
        }
        published == n
    })
    .await;
    seen
}

#[actix_rt::test]
async fn a_slow_cache_delays_publishing_until_it_acknowledged() {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "web", "ns");
    let c = rt.run_container(&sb, "app");
    let delay = Duration::from_millis(300);
    let t0 = Instant::now();
    let b = start(
        &rt,
        Setup {
            cache: RecorderConfig {
                delay,
                ..RecorderConfig::default()
            },
            ..Setup::default()
        },
    );

    // The recorder records an update just before acknowledging it, and the dispatcher
    // publishes only after the acknowledgement: whenever a publish is visible, so is
    // the cache update before it. (Read the publisher first: both only grow.)
    let first_publish = nth_publish_after_its_cache_update(&b, 1).await;
    let published_after = first_publish.map(|t| t.duration_since(t0));
    assert!(
        published_after >= Some(delay),
        "published {published_after:?} after start, the cache answers after {delay:?}"
    );
    let cached = b.cache.all();
    assert!(cached[0].global_timestamp.is_some());
    assert!(updates_pod(&cached[0], "u1"));
    assert_eq!(
        events(&b.published.all()[0]),
        vec![
            (
                EventKind::ContainerStarted,
                sb.clone(),
                RelistSource::Global
            ),
            (EventKind::ContainerStarted, c.clone(), RelistSource::Global),
        ]
    );

    // A targeted relist keeps the same order.
    rt.exit_container(&c, 1);
    let asked = Instant::now();
    assert!(b
        .dispatcher
        .queue
        .request("u1", RelistSource::EventedPleg, None, None));
    let second_publish = nth_publish_after_its_cache_update(&b, 2).await;
    assert!(second_publish.map(|t| t.duration_since(asked)) >= Some(delay));
    let cached = b.cache.all();
    assert_eq!(cached[1].global_timestamp, None, "a targeted relist");
    assert!(updates_pod(&cached[1], "u1"));
    assert_eq!(
        events(&b.published.all()[1]),
        vec![(EventKind::ContainerDied, c, RelistSource::EventedPleg)]
    );
    assert_eq!(b.requests(RequestResult::Done), 1);
}

/// Finding: the dispatcher awaits the publisher's acknowledgement (`send`) inside the
/// unit of work. A publisher that stalls therefore stalls the whole Generic PLEG: no
/// global relist starts and health goes stale. The relist queue is still drained
/// meanwhile: requests wait in the pending set, one per pod. The real
/// EventPublisher never blocks in `Publish` (subscribers' queues are `try_send`), so
/// this needs a publisher that is stuck or starved.
#[actix_rt::test]
async fn a_stalled_publisher_stalls_the_relist_schedule_until_released() {
    let rt = FakeRuntime::new();
    let b = start(
        &rt,
        Setup {
            period: Duration::from_millis(20),
            capacity: 4,
            health_threshold: Duration::from_millis(200),
            publisher: RecorderConfig {
                stalled: true,
                ..RecorderConfig::default()
            },
            ..Setup::default()
        },
    );
    // An empty node: global relists have nothing to publish, so they keep coming.
    wait_until("global relists on an empty node", || {
        b.global_relists() >= 3
    })
    .await;
    assert!(b.health.ready());

    // A pod appears: the next global relist applies it to the cache, then waits on the
    // stalled publisher.
    let sb = rt.run_pod("u1", "web", "ns");
    wait_until("the pod's update acknowledged by the cache", || {
        b.cache.all().iter().any(|a| updates_pod(a, "u1"))
    })
    .await;
    let lists = rt.calls(Op::ListSandboxes);
    let relists = b.global_relists();
    // No global relist completes for longer than the health threshold (ten periods).
    wait_until("health stale", || b.health.check().is_err()).await;
    assert_eq!(
        rt.calls(Op::ListSandboxes),
        lists,
        "no global relist started"
    );
    assert_eq!(b.global_relists(), relists);
    assert_eq!(b.published.len(), 0);

    // The queue is drained meanwhile: a burst without a pause fills the mailbox (one
    // sender handle: capacity - 1 messages, then the one that parks it), but the
    // dispatcher takes them off as soon as it runs, and more are accepted.
    let mut accepted = 0;
    for _ in 0..25 {
        for _ in 0..4 {
            assert!(b
                .dispatcher
                .queue
                .request("u1", RelistSource::EventedPleg, None, None));
            accepted += 1;
        }
        wait_until("the queue drained", || b.metrics.queue_depth.get() == 0).await;
    }
    assert_eq!(b.requests(RequestResult::Dropped), 0);
    // All for one pod: merged into one while the relist waits.
    assert_eq!(b.requests(RequestResult::Merged), accepted - 1);
    assert_eq!(b.requests(RequestResult::Done), 0);
    // A global relist cannot be brought forward (it is overdue anyway).
    b.dispatcher.queue.bring_forward();

    // Released: the stuck relist publishes, the schedule resumes, and the waiting
    // request, which came after that relist started, is covered by the global relist
    // that runs next (it is long overdue).
    b.published.release();
    wait_until("the stuck relist published", || b.published.len() >= 1).await;
    assert_eq!(
        events(&b.published.all()[0]),
        vec![(EventKind::ContainerStarted, sb, RelistSource::Global)]
    );
    wait_until("queued requests settled", || b.settled() == accepted).await;
    assert_eq!(b.requests(RequestResult::Skipped), 1);
    assert_eq!(b.requests(RequestResult::Done), 0);
    wait_until("healthy again", || b.health.check().is_ok()).await;
    let relists = b.global_relists();
    wait_until("global relists on schedule again", || {
        b.global_relists() >= relists + 3
    })
    .await;
    assert_eq!(b.metrics.queue_depth.get(), 0);
}

/// Finding, the same cause: Stop is honoured only after the unit of work in progress,
/// and that unit waits on the publisher, so a stalled publisher delays shutdown.
#[actix_rt::test]
async fn stop_waits_for_a_stalled_publisher() {
    let rt = FakeRuntime::new();
    rt.run_pod("u1", "web", "ns");
    let b = start(
        &rt,
        Setup {
            period: Duration::from_millis(20),
            health_threshold: Duration::from_millis(200),
            publisher: RecorderConfig {
                stalled: true,
                ..RecorderConfig::default()
            },
            ..Setup::default()
        },
    );
    wait_until("the first relist applied", || b.cache.len() == 1).await;
    b.dispatcher.stop.stop();
    wait_until("health stale", || b.health.check().is_err()).await;
    assert!(!b.dispatcher.stop.stopped(), "stopped while publishing");
    b.published.release();
    wait_until("stopped", || b.dispatcher.stop.stopped()).await;
    assert_eq!(
        b.published.len(),
        1,
        "the relist in progress finished first"
    );
    assert_eq!(rt.calls(Op::ListSandboxes), 1, "and nothing after it");
}

#[actix_rt::test]
async fn a_burst_beyond_the_queue_bound_is_dropped_and_counted() {
    const CAPACITY: usize = 8;
    const SENDERS: usize = 3;
    let rt = FakeRuntime::new();
    let b = start(
        &rt,
        Setup {
            capacity: CAPACITY,
            ..Setup::default()
        },
    );
    wait_until("first global relist", || b.health.ready()).await;
    // The burst runs without yielding, so the dispatcher (same thread) cannot take
    // anything meanwhile: the queue holds `CAPACITY` pods, whichever handle sent them.
    let queues: Vec<_> = (0..SENDERS).map(|_| b.dispatcher.queue.clone()).collect();
    let mut accepted = 0;
    for i in 0..300 {
        if queues[i % SENDERS].request(&format!("p{i}"), RelistSource::EventedPleg, None, None) {
            accepted += 1;
        }
    }
    assert_eq!(accepted, CAPACITY);
    assert_eq!(b.requests(RequestResult::Queued), accepted as u64);
    assert_eq!(b.requests(RequestResult::Dropped), 300 - accepted as u64);
    assert_eq!(b.metrics.queue_depth.get(), accepted as i64);
    // A full queue still takes a request for a pod it holds: merged.
    assert!(queues[0].request("p0", RelistSource::EventedPleg, None, None));
    assert_eq!(b.requests(RequestResult::Merged), 1);

    // Every accepted request is a targeted relist (after the first global relist's
    // start, no global relist due): none lost, none counted twice.
    wait_until("accepted requests done", || {
        b.requests(RequestResult::Done) == accepted as u64
    })
    .await;
    assert_eq!(b.settled(), accepted as u64 + 1);
    assert_eq!(b.metrics.queue_depth.get(), 0);
    // Drained, the queue takes requests again; the three, for one pod and sent
    // before the dispatcher takes any, are one relist.
    for q in &queues {
        assert!(q.request("p0", RelistSource::EventedPleg, None, None));
    }
    wait_until("the new requests settled", || {
        b.settled() == (accepted + 1 + SENDERS) as u64
    })
    .await;
    assert_eq!(b.requests(RequestResult::Done), accepted as u64 + 1);
    assert_eq!(b.requests(RequestResult::Merged), SENDERS as u64);
}

/// The KEP's priority rule against a storm no dispatcher can serve: requests from
/// several threads, as fast as they can send, for the node's pods and for pods that
/// do not exist, while containers exit. Global relists go on (the queue never holds
/// the dispatcher's mailbox, and a due global relist waits for one round of reads at
/// most), and every exit is published exactly once. Prints the global relist's
/// intervals (the figures in the README's bound).
#[actix_rt::test]
async fn an_unthrottled_storm_from_several_threads_leaves_global_relists_on_schedule() {
    const PODS: usize = 20;
    const THREADS: usize = 3;
    const GLOBAL_RELISTS: u64 = 20;
    let rt = FakeRuntime::new();
    let pods = pods_with_a_container(&rt, PODS);
    let b = start(
        &rt,
        Setup {
            period: Duration::from_millis(50),
            capacity: 256,
            ..Setup::default()
        },
    );
    wait_until("first global relist", || b.global_relists() >= 1).await;
    let storming = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let (queue, storming) = (b.dispatcher.queue.clone(), storming.clone());
            std::thread::spawn(move || {
                let mut sent = 0u64;
                while storming.load(std::sync::atomic::Ordering::Relaxed) {
                    let n = sent as usize * THREADS + t;
                    let uid = match n % 3 {
                        0 => format!("u{}", n % PODS),
                        _ => format!("storm-{}", n % 1000),
                    };
                    queue.request(&uid, RelistSource::EventedPleg, None, None);
                    sent += 1;
                }
                sent
            })
        })
        .collect();
    let cache_before = b.cache.len();
    let before = b.global_relists();
    for (_, _, c) in &pods {
        rt.exit_container(c, 1);
    }
    wait_until("global relists go on through the storm", || {
        b.global_relists() >= before + GLOBAL_RELISTS
    })
    .await;
    wait_until("every death published", || deaths(&b).len() == PODS).await;
    storming.store(false, std::sync::atomic::Ordering::Relaxed);
    let sent: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    wait_until("the storm settled", || {
        b.metrics.queue_depth.get() == 0 && b.metrics.relist_pending.get() == 0
    })
    .await;
    // The global relists' starts: each one's last cache update carries it.
    let starts: Vec<std::time::SystemTime> = b.cache.all()[cache_before..]
        .iter()
        .filter_map(|a| a.global_timestamp)
        .collect();
    let mut intervals: Vec<f64> = starts
        .windows(2)
        .filter_map(|w| w[1].duration_since(w[0]).ok())
        .map(|d| d.as_secs_f64() * 1e3)
        .collect();
    intervals.sort_by(f64::total_cmp);
    let at = |q: f64| intervals[((intervals.len() - 1) as f64 * q).round() as usize];
    let mean = intervals.iter().sum::<f64>() / intervals.len() as f64;
    let count = |r| b.requests(r);
    println!(
        "storm: {sent} requests sent, {} queued, {} merged, {} dropped, {} done, {} \
         skipped; {} global relist intervals (period 50 ms): p50 {:.1} ms, p99 {:.1} ms, \
         max {:.1} ms, mean {mean:.1} ms",
        count(RequestResult::Queued),
        count(RequestResult::Merged),
        count(RequestResult::Dropped),
        count(RequestResult::Done),
        count(RequestResult::Skipped),
        intervals.len(),
        at(0.5),
        at(0.99),
        at(1.0),
    );
    let deaths = deaths(&b);
    for (_, _, c) in &pods {
        assert_eq!(deaths[c].len(), 1, "{c} published once");
    }
    // Generous (the bound is one round of reads; a busy CI machine adds its own):
    // before the queue kept requests out of the mailbox, the mean was 17 periods.
    assert!(mean < 250.0, "mean interval {mean} ms for a 50 ms period");
}

/// `n` pods u0.. with one running container each: (uid, sandbox, container).
pub(super) fn pods_with_a_container(rt: &FakeRuntime, n: usize) -> Vec<(String, String, String)> {
    (0..n)
        .map(|i| {
            let uid = format!("u{i}");
            let sb = rt.run_pod(&uid, "p", "ns");
            let c = rt.run_container(&sb, "app");
            (uid, sb, c)
        })
        .collect()
}

/// Every ContainerDied published so far: container id → the sources that found it.
pub(super) fn deaths(b: &Bench) -> std::collections::HashMap<String, Vec<RelistSource>> {
    let mut out: std::collections::HashMap<String, Vec<RelistSource>> = Default::default();
    for p in b.published.all() {
        for e in p.0 {
            if e.kind == EventKind::ContainerDied {
                out.entry(e.container_id).or_default().push(e.relist_source);
            }
        }
    }
    out
}

#[actix_rt::test]
async fn covered_requests_are_skipped_and_held_pods_coalesced() {
    let rt = FakeRuntime::new();
    let sb1 = rt.run_pod("u1", "free", "ns");
    rt.run_pod("u2", "held", "ns");
    let b = start(&rt, Setup::default());
    b.held.hold("u2");
    // Queued before the dispatcher handled anything, so before the first global
    // relist started: that relist covers them all.
    for _ in 0..3 {
        assert!(b
            .dispatcher
            .queue
            .request("u1", RelistSource::EventedPleg, None, None));
    }
    for _ in 0..2 {
        assert!(b
            .dispatcher
            .queue
            .request("u2", RelistSource::EventedPleg, None, None));
    }
    wait_until("five requests settled", || b.settled() == 5).await;
    // One request per pod waits for its turn (the others merged into it).
    assert_eq!(b.requests(RequestResult::Merged), 3);
    assert_eq!(b.requests(RequestResult::Skipped), 1);
    // The global relist skipped the held pod, so it does not cover it: its request
    // becomes the gate's pending relist.
    assert_eq!(b.requests(RequestResult::Coalesced), 1);
    assert_eq!(b.requests(RequestResult::Done), 0);
    assert_eq!(b.global_relists(), 1);
    let cached = b.cache.all();
    assert_eq!(cached[0].held, vec!["u2".to_string()]);
    assert!(updates_pod(&cached[0], "u1") && !updates_pod(&cached[0], "u2"));
    assert!(b.held.release("u2"), "a relist is pending on release");
    wait_until("u1 published", || b.published.len() == 1).await;
    assert_eq!(
        events(&b.published.all()[0]),
        vec![(EventKind::ContainerStarted, sb1, RelistSource::Global)]
    );

    // Queued after that relist started: not covered, so relisted ...
    assert!(b
        .dispatcher
        .queue
        .request("u2", RelistSource::PostSync, None, None));
    wait_until("u2 relisted", || {
        b.metrics
            .requests(RequestResult::Done, RelistSource::PostSync)
            == 1
    })
    .await;
    // ... unless a sync holds the pod by the time its turn comes.
    b.held.hold("u1");
    assert!(b
        .dispatcher
        .queue
        .request("u1", RelistSource::EventedPleg, None, None));
    wait_until("u1 coalesced", || b.requests(RequestResult::Coalesced) == 2).await;
    assert!(b.held.release("u1"));
    assert_eq!(b.requests(RequestResult::Done), 0);
    assert_eq!(b.metrics.queue_depth.get(), 0);
}

#[actix_rt::test]
async fn global_relists_keep_their_period_and_observe_the_interval() {
    let rt = FakeRuntime::new();
    let period = Duration::from_millis(20);
    let b = start(
        &rt,
        Setup {
            period,
            ..Setup::default()
        },
    );
    wait_until("five global relists", || b.global_relists() >= 5).await;
    let relists = b.global_relists();
    let intervals = b.metrics.relist_interval.get_sample_count();
    // Observed once per global relist after the first, start to start.
    assert_eq!(intervals, relists - 1);
    let mean = b.metrics.relist_interval.get_sample_sum() / intervals as f64;
    assert!(mean >= period.as_secs_f64(), "mean interval {mean}s");
}

/// Found by the one-hour soak ("relist requested while another is in progress"): when
/// two units of work started in one poll (the relist timer and a message), the second
/// found the core taken and its request was lost. A request whose turn comes while a
/// unit runs now waits for it (the machine starts no unit while one runs: see
/// `machine_tests`).
#[actix_rt::test]
async fn a_request_whose_turn_comes_while_a_relist_runs_is_not_lost() {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "web", "ns");
    let c = rt.run_container(&sb, "app");
    let b = start(
        &rt,
        Setup {
            admission: false,
            ..Setup::default()
        },
    );
    wait_until("first global relist", || b.global_relists() == 1).await;
    rt.set_latency(Op::ListContainers, Duration::from_millis(50));
    rt.exit_container(&c, 1);
    let q = &b.dispatcher.queue;
    assert!(q.request("u1", RelistSource::EventedPleg, None, None));
    wait_until("u1's batch runs", || rt.calls(Op::ListContainers) > 0).await;
    assert!(q.request("u2", RelistSource::EventedPleg, None, None));
    wait_until("both requests done", || {
        b.requests(RequestResult::Done) == 2
    })
    .await;
    assert!(b
        .published
        .all()
        .iter()
        .flat_map(|p| p.0.iter())
        .any(|e| e.kind == EventKind::ContainerDied && e.container_id == c));
}

/// The dispatcher numbers each relist's events before applying its cache
/// updates, and the CacheOwner gets the last number with them, so the cache and the
/// revision it reflects change together; a relist without events issues none.
#[actix_rt::test]
async fn each_relist_numbers_its_events_and_applies_the_last_revision_with_the_cache() {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "web", "ns");
    let c = rt.run_container(&sb, "app");
    let b = start(&rt, Setup::default());
    wait_until("the first global relist published", || {
        b.published.len() == 1
    })
    .await;
    rt.exit_container(&c, 1);
    assert!(b
        .dispatcher
        .queue
        .request("u1", RelistSource::EventedPleg, None, None));
    wait_until("the targeted relist published", || b.published.len() == 2).await;
    // Nothing changed: applied, with the same revision, and nothing published.
    assert!(b
        .dispatcher
        .queue
        .request("u1", RelistSource::EventedPleg, None, None));
    wait_until("the empty relist applied", || b.cache.len() == 3).await;

    let published = b.published.all();
    let revisions: Vec<Vec<u64>> = published
        .iter()
        .map(|p| p.0.iter().map(|e| e.revision).collect())
        .collect();
    assert_eq!(revisions, vec![vec![1, 2], vec![3]]);
    let applied: Vec<u64> = b.cache.all().iter().map(|a| a.revision).collect();
    assert_eq!(applied, [2, 3, 3]);
    assert_eq!(b.published.len(), 2);
}

/// Requests that wait together run as one batch — their pods read at once,
/// each pod's cache update applied and its events published as soon as it is read —
/// each pod's events with its request's source; a pod whose lists fail in the batch
/// changes nothing (nothing applied), is counted, and does not stop the others.
#[actix_rt::test]
async fn waiting_requests_run_as_one_batch_and_one_failure_spares_the_rest() {
    const PODS: usize = 20;
    let rt = FakeRuntime::new();
    let containers: Vec<(String, String)> = pods_with_a_container(&rt, PODS)
        .into_iter()
        .map(|(uid, _, c)| (uid, c))
        .collect();
    let b = start(&rt, Setup::default());
    wait_until("first global relist", || b.global_relists() == 1).await;
    let applied = b.cache.len();
    wait_until("the first relist published", || b.published.len() == 1).await;
    for (_, c) in &containers {
        rt.exit_container(c, 1);
    }
    // The first pod's lists fail once.
    rt.fail(Op::ListContainers, tonic::Code::Unavailable, Some(1));
    // Sent without yielding: the dispatcher sees them all in one drain.
    for (i, (uid, _)) in containers.iter().enumerate() {
        let source = if i % 2 == 0 {
            RelistSource::EventedPleg
        } else {
            RelistSource::PostSync
        };
        assert!(b.dispatcher.queue.request(uid, source, None, None));
    }
    wait_until("every request done", || {
        b.metrics
            .requests(RequestResult::Done, RelistSource::EventedPleg)
            + b.metrics
                .requests(RequestResult::Done, RelistSource::PostSync)
            == PODS as u64
    })
    .await;
    assert_eq!(
        b.cache.len(),
        applied + PODS - 1,
        "one cache update for each pod read"
    );
    wait_until("published", || b.published.len() == PODS).await;
    let published: Vec<_> = b.published.all()[1..].iter().flat_map(events).collect();
    assert_eq!(
        published.len(),
        PODS - 1,
        "every pod but the failed one: {published:?}"
    );
    let mut failed = Vec::new();
    for (i, (uid, c)) in containers.iter().enumerate() {
        let source = if i % 2 == 0 {
            RelistSource::EventedPleg
        } else {
            RelistSource::PostSync
        };
        if !published.contains(&(EventKind::ContainerDied, c.clone(), source)) {
            failed.push((uid.clone(), c.clone()));
        }
    }
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(
        b.metrics.relist_errors(plegd_telemetry::RelistPhase::List),
        1
    );
    // The failed pod is found by the next relist of it.
    assert!(b
        .dispatcher
        .queue
        .request(&failed[0].0, RelistSource::EventedPleg, None, None));
    wait_until("the failed pod's exit published", || {
        b.published.len() == PODS + 1
    })
    .await;
    assert_eq!(
        events(&b.published.all()[PODS]),
        vec![(
            EventKind::ContainerDied,
            failed[0].1.clone(),
            RelistSource::EventedPleg
        )]
    );
}

/// API clients' requests have their own budget: a flood of 20,000 from two threads,
/// random UIDs (no such pods), never makes a runtime hint drop — the inbox of 16 is
/// the hints' alone — and every request the answer called queued or coalesced is
/// settled by a read that began after it was accepted (`done`), a global relist that
/// began after it (`skipped`), or the request it joined (`merged`).
#[actix_rt::test]
async fn a_flood_of_api_requests_never_crowds_out_the_runtimes_hints() {
    use crate::queue::ApiRelistOutcome;
    const PODS: usize = 10;
    const BUDGET: usize = 32;
    const FLOOD: usize = 20_000;
    let rt = FakeRuntime::new();
    let pods = pods_with_a_container(&rt, PODS);
    let b = start(
        &rt,
        Setup {
            period: Duration::from_millis(50),
            capacity: 16,
            ..Setup::default()
        },
    );
    wait_until("first global relist", || b.global_relists() >= 1).await;
    let api = b.dispatcher.queue.clone().with_api_budget(BUDGET);
    let flooders: Vec<_> = (0..2)
        .map(|t| {
            let api = api.clone();
            std::thread::spawn(move || {
                let mut answers = [0u64; 4];
                for i in 0..FLOOD / 2 {
                    let uid = format!("{:032x}", rand_uid(t, i));
                    let i = match api.request_api(&uid, RelistSource::PostAllocation) {
                        ApiRelistOutcome::Queued => 0,
                        ApiRelistOutcome::Coalesced => 1,
                        ApiRelistOutcome::Dropped => 2,
                        ApiRelistOutcome::Unavailable => 3,
                    };
                    answers[i] += 1;
                    assert!(api.api_waiting() <= BUDGET);
                }
                answers
            })
        })
        .collect();
    // Meanwhile the runtime's hints: every pod, again and again, as its containers
    // exit (each round fits the hints' inbox).
    let mut hints = 0u64;
    for (round, (_, _, c)) in pods.iter().cycle().take(PODS * 50).enumerate() {
        if round < PODS {
            rt.exit_container(c, 1);
        }
        for (uid, _, _) in &pods {
            assert!(
                b.dispatcher
                    .queue
                    .request(uid, RelistSource::EventedPleg, None, None),
                "a runtime hint was dropped"
            );
            hints += 1;
        }
        tokio::task::yield_now().await;
    }
    let mut answers = [0u64; 4];
    for f in flooders {
        for (a, n) in answers.iter_mut().zip(f.join().unwrap()) {
            *a += n;
        }
    }
    let [queued, coalesced, dropped, unavailable] = answers;
    assert_eq!(queued + coalesced + dropped, FLOOD as u64);
    assert_eq!(unavailable, 0);
    assert!(queued > 0, "some API requests were queued");
    let api_count = |r| b.metrics.requests(r, RelistSource::PostAllocation);
    assert_eq!(
        b.requests(RequestResult::Dropped),
        0,
        "no runtime hint dropped"
    );
    assert_eq!(b.requests(RequestResult::Queued), hints);
    assert_eq!(api_count(RequestResult::Dropped), dropped);
    assert_eq!(api_count(RequestResult::Queued), queued + coalesced);
    assert_eq!(
        b.metrics.refused(plegd_telemetry::Refusal::RelistBudget),
        dropped
    );
    let settled = |count: &dyn Fn(RequestResult) -> u64| {
        [
            RequestResult::Done,
            RequestResult::Skipped,
            RequestResult::Coalesced,
            RequestResult::Merged,
        ]
        .into_iter()
        .map(count)
        .sum::<u64>()
    };
    wait_until("every accepted API request settled", || {
        settled(&api_count) == queued + coalesced
    })
    .await;
    wait_until("every hint settled", || b.settled() == hints).await;
    wait_until("the budget given back", || api.api_waiting() == 0).await;
    wait_until("every death published", || deaths(&b).len() == PODS).await;
}

/// A UID-like number, different for every (thread, index): no two requests of the
/// flood name one pod unless by chance of the hash.
fn rand_uid(thread: usize, i: usize) -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_usize(thread);
    h.write_usize(i);
    (u128::from(h.finish()) << 64) | (thread as u128) << 32 | i as u128
}

/// The whole way: a hint that comes while a global relist waits for its lists has
/// its container read beside it, the death is published (cache first) before the
/// lists answer, with the hint's source, and once only; the request still runs its
/// own relist after the global one (which may have listed before the exit).
#[actix_rt::test]
async fn a_hinted_death_is_published_while_a_global_relist_waits_for_its_lists() {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "web", "ns");
    let c = rt.run_container(&sb, "app");
    let b = start(&rt, Setup::default());
    let q = &b.dispatcher.queue;
    wait_until("first global relist", || b.global_relists() == 1).await;
    rt.hold(Op::ListContainers);
    let lists = rt.calls(Op::ListContainers);
    q.bring_forward();
    wait_until("the next global relist lists", || {
        rt.calls(Op::ListContainers) > lists
    })
    .await;
    assert!(
        !q.priority().first(Instant::now()),
        "it hears the hint sources"
    );
    rt.exit_container(&c, 7);
    let before = b.published.len();
    assert!(q.request("u1", RelistSource::EventedPleg, None, Some(&c)));
    nth_publish_after_its_cache_update(&b, before + 1).await;
    assert_eq!(
        rt.calls(Op::ListContainers),
        lists + 1,
        "before the lists answered"
    );
    let first = &b.published.all()[before].0;
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].kind, EventKind::ContainerDied);
    assert_eq!(first[0].container_id, c);
    assert_eq!(first[0].relist_source, RelistSource::EventedPleg);
    assert_eq!(first[0].exit.as_ref().map(|e| e.code), Some(7));
    assert_eq!(b.global_relists(), 1, "the global relist still waits");
    rt.release(Op::ListContainers);
    wait_until("the request's own relist", || {
        b.requests(RequestResult::Done) == 1
    })
    .await;
    assert_eq!(b.global_relists(), 2);
    assert_eq!(
        deaths(&b),
        [(c.clone(), vec![RelistSource::EventedPleg])].into(),
        "published once"
    );
}

/// As beside a global relist: a hint naming a container of a pod whose targeted read
/// waits for its lists has that container read at once, and the death is published
/// before those lists answer, once.
#[actix_rt::test]
async fn a_hinted_death_is_published_while_its_pods_read_waits_for_its_lists() {
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u1", "web", "ns");
    let c = rt.run_container(&sb, "app");
    let b = start(&rt, Setup::default());
    let q = &b.dispatcher.queue;
    wait_until("first global relist", || b.global_relists() == 1).await;
    rt.hold(Op::ListContainers);
    let lists = rt.calls(Op::ListContainers);
    // A hint that names no container (a sandbox's): the pod's read waits for its lists.
    assert!(q.request("u1", RelistSource::Nri, None, None));
    wait_until("u1's read lists", || rt.calls(Op::ListContainers) > lists).await;
    rt.exit_container(&c, 4);
    let before = b.published.len();
    assert!(q.request("u1", RelistSource::EventedPleg, None, Some(&c)));
    nth_publish_after_its_cache_update(&b, before + 1).await;
    assert_eq!(
        rt.calls(Op::ListContainers),
        lists + 1,
        "its lists still wait"
    );
    let first = &b.published.all()[before].0;
    assert_eq!(
        (first.len(), first[0].kind, first[0].relist_source),
        (1, EventKind::ContainerDied, RelistSource::EventedPleg)
    );
    rt.release(Op::ListContainers);
    wait_until("both requests done", || {
        b.metrics.requests(RequestResult::Done, RelistSource::Nri) == 1
            && b.requests(RequestResult::Done) == 1
    })
    .await;
    assert_eq!(
        deaths(&b),
        [(c.clone(), vec![RelistSource::EventedPleg])].into(),
        "published once"
    );
}
