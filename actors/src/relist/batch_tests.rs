//! Component tests of the RelistDispatcher's batches of targeted relists, behind a
//! runtime whose targeted reads wait at a gate ([`Gated`]): requests that come while a
//! batch runs, storms, a slow pod, reads that fail, a stop in the middle, the pending
//! set's bound, the debug lines, deaths published before their pod's lists answer.
//! The dispatcher, its mocks and helpers are those of `tests`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use plegd_runtime::RuntimeClient;
use plegd_sim::{FakeRuntime, Intercept, Intercepted, Op};
use plegd_telemetry::RequestResult;

use super::tests::*;
use crate::event::{EventKind, RelistSource};
use crate::pleg::CacheUpdate;
use crate::queue::RequestRelist;
use crate::testing::wait_until;

/// The fake runtime, except that a targeted read (a known pod's container list) waits
/// while the gate is closed, and then fails for a sandbox given failures to make;
/// unfiltered sandbox lists (global relists, and reads of pods plegd does not know)
/// are counted.
struct Gated {
    inner: FakeRuntime,
    closed: tokio::sync::watch::Sender<bool>,
    waiting: std::sync::atomic::AtomicUsize,
    failures: std::sync::Mutex<std::collections::HashMap<String, u32>>,
    unfiltered_lists: std::sync::atomic::AtomicU64,
    /// Unfiltered sandbox lists (global relists) fail after 30 ms of the runtime's
    /// time.
    global_fails: std::sync::atomic::AtomicBool,
    /// Only this sandbox's reads wait at the gate (None: every targeted read).
    gate_only: std::sync::Mutex<Option<String>>,
}

impl Gated {
    fn new(inner: FakeRuntime) -> Arc<Intercepted<Gated>> {
        Arc::new(Intercepted(Gated {
            inner,
            closed: tokio::sync::watch::channel(false).0,
            waiting: Default::default(),
            failures: Default::default(),
            unfiltered_lists: Default::default(),
            global_fails: Default::default(),
            gate_only: Default::default(),
        }))
    }

    /// From now on only this sandbox's targeted reads wait at the gate.
    fn gate_only(&self, sandbox: &str) {
        *self.gate_only.lock().unwrap() = Some(sandbox.to_string());
    }

    fn close(&self) {
        self.closed.send_replace(true);
    }

    fn open(&self) {
        self.closed.send_replace(false);
    }

    /// Targeted reads waiting at the gate.
    fn waiting(&self) -> usize {
        self.waiting.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The next `times` reads of this sandbox's containers fail.
    fn fail(&self, sandbox: &str, times: u32) {
        self.failures
            .lock()
            .unwrap()
            .insert(sandbox.to_string(), times);
    }

    fn unfiltered_lists(&self) -> u64 {
        self.unfiltered_lists
            .load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl Intercept for Gated {
    fn inner(&self) -> &FakeRuntime {
        &self.inner
    }

    async fn list_sandboxes(
        &self,
        id: Option<&str>,
    ) -> Result<Vec<plegd_runtime::Sandbox>, plegd_runtime::RuntimeError> {
        if id.is_none() {
            self.unfiltered_lists
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if self.global_fails.load(std::sync::atomic::Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(30)).await;
                return Err(injected("ListPodSandbox"));
            }
        }
        self.inner.list_sandboxes(id).await
    }

    async fn list_containers(
        &self,
        sb: Option<&str>,
    ) -> Result<Vec<plegd_runtime::Container>, plegd_runtime::RuntimeError> {
        if let Some(sb) = sb {
            let gated = match &*self.gate_only.lock().unwrap() {
                Some(only) => only == sb,
                None => true,
            };
            if gated {
                let mut open = self.closed.subscribe();
                self.waiting
                    .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = open.wait_for(|closed| !*closed).await;
                self.waiting
                    .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            }
            let fail = match self.failures.lock().unwrap().get_mut(sb) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    true
                }
                _ => false,
            };
            if fail {
                return Err(injected("ListContainers"));
            }
        }
        self.inner.list_containers(sb).await
    }
}

/// The error an injected failure of `op` answers.
fn injected(op: &'static str) -> plegd_runtime::RuntimeError {
    plegd_runtime::RuntimeError::Rpc {
        op,
        code: tonic::Code::Unavailable,
        message: "injected".into(),
    }
}

/// `n` pods of one container each behind a [`Gated`] runtime, their first relist
/// published; then every container exits, the gate closes and the first pod's request
/// starts a batch that waits at the gate. The dispatcher runs with `setup`.
async fn a_batch_at_the_gate(
    n: usize,
    setup: Setup,
) -> (
    Vec<(String, String, String)>,
    Arc<Intercepted<Gated>>,
    Bench,
) {
    batch_at_the_gate(n, setup, |_, _| {}).await
}

/// As [`a_batch_at_the_gate`], but only the first pod's reads wait at the gate: a
/// batch slow on that pod alone.
async fn a_slow_pod_in_a_batch(
    n: usize,
) -> (
    Vec<(String, String, String)>,
    Arc<Intercepted<Gated>>,
    Bench,
) {
    batch_at_the_gate(n, Setup::default(), |gated, sandbox| {
        gated.gate_only(sandbox)
    })
    .await
}

/// `prepare(gated, first pod's sandbox)` runs once the first relist is published,
/// before the gate closes.
async fn batch_at_the_gate(
    n: usize,
    setup: Setup,
    prepare: impl FnOnce(&Gated, &str),
) -> (
    Vec<(String, String, String)>,
    Arc<Intercepted<Gated>>,
    Bench,
) {
    let rt = FakeRuntime::new();
    let pods = pods_with_a_container(&rt, n);
    let gated = Gated::new(rt.clone());
    let b = start_on(gated.clone(), setup);
    wait_until("the first relist published", || b.published.len() == 1).await;
    prepare(&gated, &pods[0].1);
    gated.close();
    for (_, _, c) in &pods {
        rt.exit_container(c, 1);
    }
    assert!(b
        .dispatcher
        .queue
        .request(&pods[0].0, RelistSource::EventedPleg, None, None));
    wait_until("the batch waits at the gate", || gated.waiting() == 1).await;
    (pods, gated, b)
}

impl Bench {
    /// Sends `uids` in chunks that each fill the mailbox (`capacity` - 1 messages from
    /// one sender), waiting after each for the dispatcher to take them off. Panics if
    /// one is refused. Returns how many were sent.
    async fn request_in_chunks(&self, uids: &[&str], capacity: usize) -> u64 {
        for chunk in uids.chunks(capacity - 1) {
            for uid in chunk {
                assert!(
                    self.dispatcher
                        .queue
                        .request(uid, RelistSource::EventedPleg, None, None),
                    "request for {uid} refused"
                );
            }
            wait_until("the mailbox drained while the unit of work waits", || {
                self.metrics.queue_depth.get() == 0
            })
            .await;
        }
        uids.len() as u64
    }

    fn all_requests(&self, result: RequestResult) -> u64 {
        RelistSource::ALL
            .iter()
            .map(|&s| self.metrics.requests(result, s))
            .sum()
    }
}

/// Regression: a batch held the mailbox, so on a busy machine a storm of
/// requests overflowed the queue while a batch ran: while a batch's reads wait, far
/// more requests than the queue holds arrive — each pod twice, one out of order — and
/// none is dropped: they wait in the pending set, one per pod, and run as the next
/// batch once the reads complete. Every death is published exactly once. (The
/// batch takes no request while it runs here: the pending set's rules alone.)
#[actix_rt::test]
async fn a_storm_while_a_batch_waits_is_taken_off_the_queue_and_none_is_dropped() {
    const PODS: usize = 100;
    const CAPACITY: usize = 8;
    // A batch of the first pod starts and waits at the gate (nothing applied since
    // the first relist).
    let (pods, gated, b) = a_batch_at_the_gate(
        PODS,
        Setup {
            capacity: CAPACITY,
            admission: false,
            ..Setup::default()
        },
    )
    .await;
    let applied = b.cache.len();
    let before_the_storm = Instant::now();
    // Every pod asked for twice meanwhile (the first pod too: its read may predate
    // the request), 200 requests through a queue of 8.
    let uids: Vec<&str> = pods.iter().map(|(u, _, _)| u.as_str()).collect();
    let mut accepted = 1;
    for _ in 0..2 {
        accepted += b.request_in_chunks(&uids, CAPACITY).await;
    }
    // One arrives out of order: older than the request waiting for its pod.
    assert!(b.dispatcher.queue.push(RequestRelist {
        uid: "u5".into(),
        source: RelistSource::PostSync,
        enqueued_at: before_the_storm,
        cause: None,
        prefetch: vec![],
        api: None,
    }));
    wait_until("the old request taken", || b.metrics.queue_depth.get() == 0).await;
    accepted += 1;
    assert_eq!(b.all_requests(RequestResult::Dropped), 0);
    assert_eq!(
        b.settled(),
        PODS as u64,
        "the second ask of each pod merged"
    );
    assert_eq!(gated.waiting(), 1, "the batch still waits");
    assert_eq!(b.metrics.relist_pending.get(), PODS as i64);

    gated.open();
    wait_until("every request settled", || {
        b.all_requests(RequestResult::Done)
            + b.all_requests(RequestResult::Merged)
            + b.all_requests(RequestResult::Skipped)
            == accepted
    })
    .await;
    // The batch that waited, then all the pending pods as one batch, each pod
    // applied as it was read.
    assert_eq!(b.cache.len(), applied + 1 + PODS);
    assert_eq!(b.requests(RequestResult::Done), 1 + PODS as u64);
    // The older request lost to the newer one, whose source the event carries.
    assert_eq!(
        b.metrics
            .requests(RequestResult::Merged, RelistSource::PostSync),
        1
    );
    assert_eq!(b.all_requests(RequestResult::Dropped), 0);
    wait_until("every death published", || deaths(&b).len() == PODS).await;
    for (_, _, c) in &pods {
        assert_eq!(deaths(&b)[c], vec![RelistSource::EventedPleg], "{c}");
    }
    assert_eq!(b.metrics.queue_depth.get(), 0);
    assert_eq!(b.metrics.relist_pending.get(), 0);
    assert_eq!(gated.unfiltered_lists(), 1, "no global relist ran");
}

/// A batch publishes each pod as soon as it is read. One pod whose
/// lists are slow holds back none of the other deaths of its batch (the batch used to
/// apply and publish once its slowest pod was read), and is published once read.
#[actix_rt::test]
async fn a_slow_pod_holds_back_no_other_pod_of_its_batch() {
    const PODS: usize = 6;
    let (pods, gated, b) = a_slow_pod_in_a_batch(PODS).await;
    for (uid, _, _) in &pods[1..] {
        assert!(b
            .dispatcher
            .queue
            .request(uid, RelistSource::EventedPleg, None, None));
    }
    wait_until("every other pod's death published", || {
        deaths(&b).len() == PODS - 1
    })
    .await;
    assert_eq!(gated.waiting(), 1, "the slow pod is still being read");
    assert!(!deaths(&b).contains_key(&pods[0].2));
    assert_eq!(b.requests(RequestResult::Done), PODS as u64 - 1);
    gated.open();
    wait_until("the slow pod's death published", || {
        deaths(&b).len() == PODS
    })
    .await;
    assert_eq!(b.requests(RequestResult::Done), PODS as u64);
    for (_, _, c) in &pods {
        assert_eq!(deaths(&b)[c], vec![RelistSource::EventedPleg], "{c}");
    }
    assert_eq!(gated.unfiltered_lists(), 1, "no global relist ran");
}

/// A request that comes while a batch runs joins it at once: its
/// pod is read and published while the batch's slow pod is still being read (it used
/// to wait for the batch to end). A request for a pod the batch has read already
/// reads it again at once; one for the pod whose read is in progress (that read may
/// predate its cause) runs once that read ends, still in the batch. Each death is
/// published once.
#[actix_rt::test]
async fn a_request_that_comes_while_a_batch_runs_joins_it() {
    let (pods, gated, b) = a_slow_pod_in_a_batch(3).await;
    let (rt, q) = (&gated.inner, &b.dispatcher.queue);
    let lists = rt.calls(Op::ListContainers);

    assert!(q.request(&pods[1].0, RelistSource::EventedPleg, None, None));
    wait_until("the second pod's death published", || {
        deaths(&b).contains_key(&pods[1].2)
    })
    .await;
    assert_eq!(gated.waiting(), 1, "the batch still runs");
    assert_eq!(b.requests(RequestResult::Done), 1);

    // The second pod again: read again at once.
    assert!(q.request(&pods[1].0, RelistSource::EventedPleg, None, None));
    wait_until("the second pod read again", || {
        b.requests(RequestResult::Done) == 2
    })
    .await;
    assert_eq!(rt.calls(Op::ListContainers) - lists, 2);
    // The slow pod again: it waits for its read in progress.
    assert!(q.request(&pods[0].0, RelistSource::EventedPleg, None, None));
    assert!(q.request(&pods[2].0, RelistSource::EventedPleg, None, None));
    wait_until("the third pod's death published", || {
        deaths(&b).contains_key(&pods[2].2)
    })
    .await;
    assert_eq!(gated.waiting(), 1, "the batch still runs");
    assert_eq!(b.requests(RequestResult::Done), 3);
    assert_eq!(
        b.metrics.relist_pending.get(),
        0,
        "nothing waits for a batch"
    );

    gated.open();
    wait_until("every request done", || {
        b.requests(RequestResult::Done) == 5
    })
    .await;
    assert_eq!(
        rt.calls(Op::ListContainers) - lists,
        5,
        "the slow pod read twice"
    );
    for (_, _, c) in &pods {
        assert_eq!(deaths(&b)[c], vec![RelistSource::EventedPleg], "{c}");
    }
    assert_eq!(gated.unfiltered_lists(), 1, "no global relist ran");
}

/// Stop while a batch holds a request to run again for the pod it is reading: the
/// batch runs it before the dispatcher stops (a request accepted is never lost).
#[actix_rt::test]
async fn a_stop_while_a_batch_holds_a_rerun_runs_it_first() {
    let rt = FakeRuntime::new();
    let pods = pods_with_a_container(&rt, 1);
    let gated = Gated::new(rt.clone());
    let b = start_on(gated.clone(), Setup::default());
    wait_until("the first relist published", || b.published.len() == 1).await;
    gated.close();
    rt.exit_container(&pods[0].2, 1);
    let q = &b.dispatcher.queue;
    assert!(q.request(&pods[0].0, RelistSource::EventedPleg, None, None));
    wait_until("the batch waits at the gate", || gated.waiting() == 1).await;
    let lists = rt.calls(Op::ListContainers);
    assert!(q.request(&pods[0].0, RelistSource::EventedPleg, None, None));
    wait_until("the request taken", || b.metrics.queue_depth.get() == 0).await;
    b.dispatcher.stop.stop();
    gated.open();
    wait_until("stopped", || b.dispatcher.stop.stopped()).await;
    assert_eq!(b.requests(RequestResult::Done), 2);
    assert_eq!(rt.calls(Op::ListContainers) - lists, 2, "read twice");
    assert_eq!(deaths(&b)[&pods[0].2], vec![RelistSource::EventedPleg]);
}

/// The requests a running batch takes are settled as any other: one for a pod a
/// sync holds becomes the gate's pending relist (coalesced), not a read; the relist
/// the gate asks for on release (made here) joins the batch and publishes.
#[actix_rt::test]
async fn a_running_batch_leaves_a_held_pods_request_to_its_sync() {
    let (pods, gated, b) = a_slow_pod_in_a_batch(3).await;
    let q = &b.dispatcher.queue;
    b.held.hold(&pods[1].0);
    assert!(q.request(&pods[1].0, RelistSource::EventedPleg, None, None));
    assert!(q.request(&pods[2].0, RelistSource::EventedPleg, None, None));
    wait_until("the third pod's death published", || {
        deaths(&b).contains_key(&pods[2].2)
    })
    .await;
    assert_eq!(b.requests(RequestResult::Coalesced), 1);
    assert!(!deaths(&b).contains_key(&pods[1].2));
    assert_eq!(b.metrics.relist_pending.get(), 0, "nothing waits");
    assert!(b.held.release(&pods[1].0), "a relist is pending on release");
    assert!(q.request(&pods[1].0, RelistSource::PostSync, None, None));
    wait_until("the held pod's death published", || {
        deaths(&b).contains_key(&pods[1].2)
    })
    .await;
    assert_eq!(deaths(&b)[&pods[1].2], vec![RelistSource::PostSync]);
    assert_eq!(gated.waiting(), 1, "the batch still runs");
    gated.open();
    wait_until("every death published", || deaths(&b).len() == 3).await;
    for (_, _, c) in &pods {
        assert_eq!(deaths(&b)[c].len(), 1, "{c}");
    }
}

/// A global relist that becomes due while a batch waits runs next, before the
/// requests that came meanwhile (KEP-3386: a due global relist has priority: the
/// batch takes none of them once it is due); it started after they were made, so
/// they are skipped, and it publishes the deaths.
#[actix_rt::test]
async fn a_global_relist_due_during_a_batch_runs_next_and_covers_the_requests_that_waited() {
    const PODS: usize = 10;
    let (pods, gated, b) = a_batch_at_the_gate(PODS, Setup::default()).await;
    b.dispatcher.queue.bring_forward();
    let uids: Vec<&str> = pods[1..].iter().map(|(u, _, _)| u.as_str()).collect();
    b.request_in_chunks(&uids, 1024).await;
    gated.open();
    wait_until("every request settled", || b.settled() == PODS as u64).await;
    assert_eq!(b.requests(RequestResult::Done), 1);
    assert_eq!(b.requests(RequestResult::Skipped), PODS as u64 - 1);
    assert_eq!(b.global_relists(), 2);
    let deaths = deaths(&b);
    assert_eq!(deaths[&pods[0].2], vec![RelistSource::EventedPleg]);
    for (_, _, c) in &pods[1..] {
        assert_eq!(deaths[c], vec![RelistSource::Global], "{c}");
    }
}

/// The KEP's priority rule, bounded: a global relist that comes due while a batch
/// runs waits only for the reads in progress (one round, the status concurrency);
/// the batch starts no other, and the requests it took but did not start wait again
/// — the global relist, which starts after them, covers them.
#[actix_rt::test]
async fn a_due_global_relist_waits_for_the_reads_in_progress_only() {
    const PODS: usize = 10;
    const CONCURRENCY: usize = 4; // `start_on`'s GenericPleg
    let (pods, gated, b) = a_batch_at_the_gate(PODS, Setup::default()).await;
    for (uid, _, _) in &pods[1..] {
        assert!(b
            .dispatcher
            .queue
            .request(uid, RelistSource::EventedPleg, None, None));
    }
    wait_until("a round of reads at the gate", || {
        gated.waiting() == CONCURRENCY
    })
    .await;
    b.dispatcher.queue.bring_forward();
    gated.open();
    wait_until("every request settled", || b.settled() == PODS as u64).await;
    assert_eq!(b.requests(RequestResult::Done), CONCURRENCY as u64);
    assert_eq!(
        b.requests(RequestResult::Skipped),
        (PODS - CONCURRENCY) as u64
    );
    assert_eq!(b.global_relists(), 2);
    let deaths = deaths(&b);
    assert_eq!(deaths.len(), PODS);
    let by = |source| deaths.values().filter(|s| **s == vec![source]).count();
    assert_eq!(by(RelistSource::EventedPleg), CONCURRENCY);
    assert_eq!(by(RelistSource::Global), PODS - CONCURRENCY);
}

/// The read of the batch in progress fails after more requests came, one of them for
/// the same pod: that pod's request runs in the next batch and publishes its death;
/// a read failing in that batch spares the other pods; nothing is lost or doubled.
#[actix_rt::test]
async fn reads_failing_mid_storm_cost_only_their_pod() {
    const PODS: usize = 12;
    let rt = FakeRuntime::new();
    let pods = pods_with_a_container(&rt, PODS);
    let gated = Gated::new(rt.clone());
    let b = start_on(gated.clone(), Setup::default());
    wait_until("the first relist published", || b.published.len() == 1).await;
    gated.close();
    for (_, _, c) in &pods {
        rt.exit_container(c, 1);
    }
    gated.fail(&pods[0].1, 1);
    gated.fail(&pods[7].1, 1);
    assert!(b
        .dispatcher
        .queue
        .request(&pods[0].0, RelistSource::EventedPleg, None, None));
    wait_until("the batch waits at the gate", || gated.waiting() == 1).await;
    let uids: Vec<&str> = pods.iter().map(|(u, _, _)| u.as_str()).collect();
    b.request_in_chunks(&uids, 1024).await;
    gated.open();
    wait_until("every request settled", || b.settled() == 1 + PODS as u64).await;
    assert_eq!(
        b.metrics.relist_errors(plegd_telemetry::RelistPhase::List),
        2
    );
    let deaths = deaths(&b);
    assert_eq!(deaths.len(), PODS - 1, "all but the pod whose read failed");
    assert!(!deaths.contains_key(&pods[7].2));
    assert_eq!(deaths[&pods[0].2], vec![RelistSource::EventedPleg]);
    // The failed pod is found by its next request.
    assert!(b
        .dispatcher
        .queue
        .request(&pods[7].0, RelistSource::EventedPleg, None, None));
    wait_until("the failed pod's death published", || {
        self::deaths(&b).len() == PODS
    })
    .await;
    assert_eq!(
        self::deaths(&b)
            .values()
            .map(|sources| sources.len())
            .sum::<usize>(),
        PODS,
        "each death once"
    );
}

/// Stop in the middle of a batch (defined in the dispatcher's docs): the queue refuses
/// from then on (dropped, counted); the batch finishes and publishes; every request
/// accepted before the stop is relisted and published; no global relist starts,
/// though one is due; then the dispatcher stops.
#[actix_rt::test]
async fn a_stop_during_a_batch_relists_every_request_accepted_before_it() {
    const PODS: usize = 20;
    let (pods, gated, b) = a_batch_at_the_gate(PODS, Setup::default()).await;
    let uids: Vec<&str> = pods[1..].iter().map(|(u, _, _)| u.as_str()).collect();
    b.request_in_chunks(&uids, 1024).await;
    b.dispatcher.queue.bring_forward();
    b.dispatcher.stop.stop();
    assert!(!b
        .dispatcher
        .queue
        .request(&pods[0].0, RelistSource::EventedPleg, None, None));
    assert_eq!(b.requests(RequestResult::Dropped), 1);
    assert_eq!(b.requests(RequestResult::Queued), PODS as u64);
    tokio::task::yield_now().await;
    assert!(!b.dispatcher.stop.stopped(), "stopped with a batch waiting");
    gated.open();
    wait_until("stopped", || b.dispatcher.stop.stopped()).await;
    assert_eq!(b.settled(), PODS as u64, "every accepted request settled");
    assert_eq!(b.requests(RequestResult::Done), PODS as u64);
    let deaths = deaths(&b);
    assert_eq!(deaths.len(), PODS, "every death published: {deaths:?}");
    assert_eq!(
        gated.unfiltered_lists(),
        1,
        "no global relist after the stop"
    );
    assert_eq!(b.metrics.queue_depth.get(), 0);
}

/// The pending set holds as many pods as plegd knows and twice the queue's capacity
/// more: requests for UIDs that are not pods (the API takes any) beyond that are
/// dropped and counted; one for a pod already waiting is always merged.
#[actix_rt::test]
async fn the_pending_set_is_bounded_by_the_known_pods_and_the_queue_capacity() {
    const KNOWN: usize = 3;
    const CAPACITY: usize = 4;
    const UNKNOWN: usize = 20;
    let rt = FakeRuntime::new();
    let pods = pods_with_a_container(&rt, KNOWN);
    let gated = Gated::new(rt.clone());
    let b = start_on(
        gated.clone(),
        Setup {
            capacity: CAPACITY,
            admission: false,
            ..Setup::default()
        },
    );
    wait_until("the first relist published", || b.published.len() == 1).await;
    gated.close();
    assert!(b
        .dispatcher
        .queue
        .request(&pods[0].0, RelistSource::EventedPleg, None, None));
    wait_until("the batch waits at the gate", || gated.waiting() == 1).await;
    let unknown: Vec<String> = (0..UNKNOWN).map(|i| format!("x{i}")).collect();
    let uids: Vec<&str> = unknown.iter().map(String::as_str).collect();
    let mut accepted = 1 + b.request_in_chunks(&uids, CAPACITY).await;
    let bound = KNOWN + 2 * CAPACITY;
    let dropped = (UNKNOWN - bound) as u64;
    assert_eq!(b.requests(RequestResult::Dropped), dropped);
    // Those already waiting are merged, never dropped.
    accepted += b.request_in_chunks(&uids[..bound], CAPACITY).await;
    assert_eq!(b.requests(RequestResult::Dropped), dropped);
    assert_eq!(b.requests(RequestResult::Merged), bound as u64);
    gated.open();
    wait_until("every request kept is settled", || {
        b.settled() + b.requests(RequestResult::Dropped) == accepted
    })
    .await;
    assert_eq!(b.requests(RequestResult::Done), 1 + bound as u64);
}

/// One debug line per global relist, per batch and per pod relisted
/// (source, how long its request waited, the batch's time, events), each kind under a
/// budget, so a storm cannot flood the log; the next line let through counts the
/// lines suppressed.
#[actix_rt::test]
async fn each_relist_writes_a_debug_line_under_a_budget() {
    use crate::testing::capture::Captured;
    use plegd_telemetry::logging::EVENT_LINES_PER_SECOND as LINES_PER_WINDOW;
    let log = Captured::default();
    let _guard = log.install();
    const PODS: usize = 200;
    let rt = FakeRuntime::new();
    let pods = pods_with_a_container(&rt, PODS);
    let b = start(&rt, Setup::default());
    wait_until("the first relist published", || b.published.len() == 1).await;
    let global = log.matching(&["global relist", "pods_inspected=200", "events=400"]);
    assert_eq!(global.len(), 1, "{:?}", log.lines());

    rt.exit_container(&pods[0].2, 1);
    assert!(b
        .dispatcher
        .queue
        .request("u0", RelistSource::PostSync, None, None));
    wait_until("the relist's line", || {
        !log.matching(&["targeted relist batch"]).is_empty()
    })
    .await;
    let line = log.matching(&["targeted relist ", "pod=u0"]);
    assert_eq!(line.len(), 1, "{:?}", log.lines());
    for field in ["source=post_sync", "waited_ms=", "took_ms=", "events=1"] {
        assert!(line[0].contains(field), "{field} in {}", line[0]);
    }

    // A storm: one batch of 200 pods, at most the budget of per-pod lines.
    for (uid, _, _) in &pods {
        assert!(b
            .dispatcher
            .queue
            .request(uid, RelistSource::EventedPleg, None, None));
    }
    wait_until("the storm done", || {
        b.requests(RequestResult::Done) == PODS as u64
    })
    .await;
    let per_pod = log.matching(&["targeted relist ", "pod="]).len();
    assert!(
        per_pod <= LINES_PER_WINDOW as usize,
        "{per_pod} per-pod lines"
    );
    assert!(per_pod < PODS);
    // Once the window has passed, the next line says how many were suppressed.
    wait_until("a line counting the suppressed ones", || {
        if log
            .matching(&["targeted relist ", "pod=u1 ", "suppressed="])
            .iter()
            .any(|l| !l.contains("suppressed=0"))
        {
            return true;
        }
        b.dispatcher
            .queue
            .request("u1", RelistSource::EventedPleg, None, None);
        false
    })
    .await;
}

/// Global relists slower than their period (here: failing after 30 ms, period 20 ms)
/// never starve the requests that waited since before one started: they get the next
/// unit although another global relist is due by then.
#[actix_rt::test]
async fn requests_waiting_before_a_slow_failing_global_relist_run_next() {
    const PODS: usize = 5;
    let setup = Setup {
        period: Duration::from_millis(20),
        ..Setup::default()
    };
    let (pods, gated, b) = batch_at_the_gate(PODS, setup, |gated, _| {
        gated
            .global_fails
            .store(true, std::sync::atomic::Ordering::SeqCst)
    })
    .await;
    let lists = gated.unfiltered_lists();
    // Due now (if the period has not passed yet), so it runs once the batch ends
    // (and the batch takes none of the requests that follow).
    b.dispatcher.queue.bring_forward();
    let uids: Vec<&str> = pods[1..].iter().map(|(u, _, _)| u.as_str()).collect();
    b.request_in_chunks(&uids, 1024).await;
    gated.open();
    wait_until("every request done", || {
        b.requests(RequestResult::Done) == PODS as u64
    })
    .await;
    assert!(
        gated.unfiltered_lists() > lists,
        "a global relist ran (and failed) in between"
    );
    assert!(b.metrics.relist_errors(plegd_telemetry::RelistPhase::List) >= 1);
    wait_until("every death published", || deaths(&b).len() == PODS).await;
}

/// Requests for one pod merged while a batch runs keep the containers each asked to
/// prefetch, at most [`MAX_PREFETCH`]: the pod's relist prefetches
/// them and reads each of its containers once, every death with its exit. A request
/// without a container adds no call.
#[actix_rt::test]
async fn merged_requests_prefetch_their_containers_up_to_the_bound() {
    use crate::queue::request::MAX_PREFETCH;
    use plegd_telemetry::PrefetchResult::*;
    const CONTAINERS: usize = 6;
    let rt = FakeRuntime::new();
    let sb = rt.run_pod("u0", "p", "ns");
    let cs: Vec<String> = (0..CONTAINERS)
        .map(|i| rt.run_container(&sb, &format!("c{i}")))
        .collect();
    let other = rt.run_pod("u1", "p", "ns");
    rt.run_container(&other, "app");
    let gated = Gated::new(rt.clone());
    let b = start_on(
        gated.clone(),
        Setup {
            admission: false,
            ..Setup::default()
        },
    );
    wait_until("the first relist published", || b.published.len() == 1).await;
    gated.close();
    let (q, source) = (&b.dispatcher.queue, RelistSource::EventedPleg);
    assert!(q.request("u1", source, None, None));
    wait_until("the batch waits at the gate", || gated.waiting() == 1).await;
    for c in &cs {
        rt.exit_container(c, 1);
    }
    assert!(q.request("u0", source, None, Some(&cs[0])));
    assert!(q.request("u0", source, None, None));
    for c in &cs {
        assert!(q.request("u0", source, None, Some(c)));
    }
    wait_until("u0's requests merged", || {
        b.requests(RequestResult::Merged) == CONTAINERS as u64 + 1
    })
    .await;
    let statuses = rt.calls(Op::ContainerStatus);
    gated.open();
    wait_until("every request settled", || {
        b.settled() == CONTAINERS as u64 + 3
    })
    .await;
    // u1's container, then each of u0's once.
    assert_eq!(
        rt.calls(Op::ContainerStatus),
        statuses + 1 + CONTAINERS as u64
    );
    let prefetches = |r| b.metrics.prefetches(r);
    assert_eq!(prefetches(Used), MAX_PREFETCH as u64);
    assert_eq!(
        (
            prefetches(ReadAgain),
            prefetches(Failed),
            prefetches(Unused)
        ),
        (0, 0, 0)
    );
    let exits: Vec<_> = b
        .published
        .all()
        .into_iter()
        .flat_map(|p| p.0)
        .filter(|e| e.kind == EventKind::ContainerDied)
        .map(|e| (e.container_id, e.exit.map(|x| x.code)))
        .collect();
    assert_eq!(exits.len(), CONTAINERS, "{exits:?}");
    assert!(exits
        .iter()
        .all(|(c, code)| cs.contains(c) && *code == Some(1)));

    // Without a container: each container read once, nothing prefetched.
    let statuses = rt.calls(Op::ContainerStatus);
    assert!(q.request("u0", source, None, None));
    wait_until("the request settled", || {
        b.settled() == CONTAINERS as u64 + 4
    })
    .await;
    assert_eq!(rt.calls(Op::ContainerStatus), statuses + CONTAINERS as u64);
    assert_eq!(prefetches(Used), MAX_PREFETCH as u64);
}

/// A request that names its container (a CRI event's) publishes the
/// death as soon as the container's status read says so, while the pod's lists are
/// still being read; its cache update first; and only once, whatever the lists and the
/// next global relist say.
#[actix_rt::test]
async fn a_death_named_by_its_event_is_published_while_its_pods_lists_are_read() {
    let rt = FakeRuntime::new();
    let pods = pods_with_a_container(&rt, 2);
    let gated = Gated::new(rt.clone());
    let b = start_on(gated.clone(), Setup::default());
    wait_until("the first relist published", || b.published.len() == 1).await;
    gated.close();
    let (uid, _, c) = &pods[0];
    rt.exit_container(c, 1);
    assert!(b
        .dispatcher
        .queue
        .request(uid, RelistSource::EventedPleg, None, Some(c)));
    wait_until("the death published", || deaths(&b).contains_key(c)).await;
    assert_eq!(gated.waiting(), 1, "the pod's lists are still being read");
    let patched = b.cache.all().iter().any(|a| {
        a.updates.iter().any(|u| {
            matches!(u, CacheUpdate::Container { uid: u, status, .. }
                if u == uid && status.id == *c
                    && status.state == plegd_runtime::ContainerState::Exited)
        }) && a.events == vec![(uid.clone(), c.clone(), EventKind::ContainerDied)]
    });
    assert!(patched, "the cache had the death with its revision first");
    gated.open();
    wait_until("the pod's read done", || {
        b.requests(RequestResult::Done) == 1
    })
    .await;
    b.dispatcher.queue.bring_forward();
    wait_until("a global relist", || b.global_relists() == 2).await;
    assert_eq!(
        deaths(&b)[c],
        vec![RelistSource::EventedPleg],
        "published once"
    );
    assert_eq!(deaths(&b).len(), 1, "the other pod's container still runs");
}
