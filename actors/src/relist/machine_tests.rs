//! The RelistDispatcher's rules, as tests of its state machine with a fake clock
//! (`machine` module docs). Each test name is a rule. (Deaths published before a
//! pod's lists answer are the batch's business: `pleg/early_tests.rs`.)

use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use plegd_telemetry::RequestResult::{self, *};

use super::machine::{Action, Input, Machine, Rules, MAX_BATCH};
use crate::event::RelistSource;
use crate::queue::request::{ApiPlace, RequestRelist};

const PERIOD: Duration = Duration::from_secs(1);
const CAPACITY: usize = 4;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A machine whose first global relist is due at `t0`, and the pods a sync holds.
struct Spec {
    m: Machine,
    t0: Instant,
    held: RefCell<HashSet<String>>,
    /// Batches started (the number the last one got).
    batch: u64,
    /// Pods the Generic PLEG knows, as each unit reports it.
    known: usize,
}

impl Spec {
    fn new(known_pods: usize) -> Self {
        let t0 = Instant::now();
        Spec {
            m: Machine::new(
                Rules {
                    relist_period: PERIOD,
                    queue_capacity: CAPACITY,
                    admission: true,
                },
                known_pods,
                t0,
            ),
            t0,
            held: RefCell::new(HashSet::new()),
            batch: 0,
            known: known_pods,
        }
    }

    /// Steps at `t0 + at`.
    fn step(&mut self, input: Input, at: Duration) -> Vec<Action> {
        let held = self.held.borrow().clone();
        let actions = self.m.step(input, self.t0 + at, &|uid| held.contains(uid));
        for a in &actions {
            if let Action::StartBatch { batch, .. } = a {
                self.batch = *batch;
            }
        }
        actions
    }

    fn request(&mut self, uid: &str, enqueued: Duration, at: Duration) -> Vec<Action> {
        self.step(Input::Request(req(uid, self.t0 + enqueued)), at)
    }

    /// The first global relist, started at `t0` and ended (successful) at `t0 + 10ms`.
    fn after_first_global(known_pods: usize) -> Self {
        let mut s = Spec::new(known_pods);
        s.step(Input::Start, ms(0));
        s.step(Input::Tick, ms(0));
        s.global_ended(ms(0), Some(&[]), ms(10));
        s
    }

    fn global_ended(
        &mut self,
        start: Duration,
        not_read: Option<&[&str]>,
        at: Duration,
    ) -> Vec<Action> {
        let input = Input::GlobalEnded {
            start: self.t0 + start,
            not_read: not_read.map(|n| n.iter().map(|u| u.to_string()).collect()),
            known_pods: self.known,
        };
        self.step(input, at)
    }

    fn pod_read(&mut self, uid: &str, at: Duration) -> Vec<Action> {
        let batch = self.batch;
        self.step(
            Input::PodRead {
                batch,
                uid: uid.into(),
            },
            at,
        )
    }

    fn batch_ended(&mut self, deferred: Vec<RequestRelist>, at: Duration) -> Vec<Action> {
        let batch = self.batch;
        self.step(
            Input::BatchEnded {
                batch,
                deferred,
                known_pods: self.known,
            },
            at,
        )
    }

    /// A batch of `uids` started at `at` (requested then, run at once).
    fn batch_of(&mut self, uids: &[&str], at: Duration) {
        for uid in uids {
            self.request(uid, at, at);
        }
        let started = self.step(Input::Run, at);
        assert_eq!(
            batches(&started),
            vec![uids.iter().map(|u| u.to_string()).collect::<Vec<_>>()]
        );
    }
}

fn req(uid: &str, enqueued_at: Instant) -> RequestRelist {
    RequestRelist {
        uid: uid.into(),
        source: RelistSource::EventedPleg,
        enqueued_at,
        cause: None,
        prefetch: Vec::new(),
        api: None,
    }
}

/// What `f` picks of each action, in order.
fn pick<T>(actions: &[Action], f: impl Fn(&Action) -> Option<T>) -> Vec<T> {
    actions.iter().filter_map(f).collect()
}

/// The pods of each batch started.
fn batches(actions: &[Action]) -> Vec<Vec<String>> {
    pick(actions, |a| match a {
        Action::StartBatch { requests, .. } => {
            Some(requests.iter().map(|r| r.uid.clone()).collect())
        }
        _ => None,
    })
}

/// The pods handed to the running batch.
fn admitted(actions: &[Action]) -> Vec<String> {
    pick(actions, |a| match a {
        Action::Admit(r) => Some(r.uid.clone()),
        _ => None,
    })
}

/// The results counted.
fn counts(actions: &[Action]) -> Vec<RequestResult> {
    pick(actions, |a| match a {
        Action::Count(r, _) => Some(*r),
        _ => None,
    })
}

fn starts_global(actions: &[Action]) -> bool {
    actions.iter().any(|a| matches!(a, Action::StartGlobal))
}

fn has(actions: &[Action], f: impl Fn(&Action) -> bool) -> bool {
    actions.iter().any(f)
}

#[test]
fn the_first_global_relist_is_due_at_start_and_tells_the_hint_sources_it_runs() {
    let mut s = Spec::new(0);
    let started = s.step(Input::Start, ms(0));
    assert!(matches!(started[..], [Action::ArmTimer(t)] if t == s.t0));
    let tick = s.step(Input::Tick, ms(0));
    assert!(matches!(
        tick[..],
        [
            Action::SetPriority {
                running: true,
                hearing: true,
                ..
            },
            Action::StartGlobal
        ]
    ));
}

#[test]
fn a_global_relist_is_due_one_period_after_the_last_started_and_its_interval_observed() {
    let mut s = Spec::after_first_global(0);
    s.step(Input::Tick, PERIOD);
    let ended = s.global_ended(PERIOD, Some(&[]), PERIOD + ms(10));
    assert!(has(
        &ended,
        |a| matches!(a, Action::ObserveInterval(d) if *d == PERIOD)
    ));
    assert!(has(
        &ended,
        |a| matches!(a, Action::SetPriority { running: false, hearing: false, next_due } if *next_due == s.t0 + 2 * PERIOD)
    ));
    assert!(has(
        &ended,
        |a| matches!(a, Action::ArmTimer(t) if *t == s.t0 + 2 * PERIOD)
    ));
    // A tick before it is due re-arms the timer only.
    let early = s.step(Input::Tick, PERIOD + ms(500));
    assert!(matches!(early[..], [Action::ArmTimer(_)]));
}

#[test]
fn a_request_waits_for_the_mailbox_to_be_handled_then_runs_as_a_batch() {
    let mut s = Spec::after_first_global(1);
    let got = s.request("u1", ms(20), ms(20));
    assert!(matches!(
        got[..],
        [Action::ScheduleRun, Action::SetPending(1)]
    ));
    // A second request before the run joins the same batch, without asking again.
    let got = s.request("u2", ms(21), ms(21));
    assert!(matches!(got[..], [Action::SetPending(2)]));
    let run = s.step(Input::Run, ms(22));
    assert_eq!(
        batches(&run),
        vec![vec!["u1".to_string(), "u2".to_string()]]
    );
}

#[test]
fn two_requests_for_one_pod_wait_as_the_newer_with_both_prefetches_the_older_merged() {
    let mut s = Spec::after_first_global(1);
    let mut older = req("u1", s.t0 + ms(20));
    older.prefetch = vec!["c1".into()];
    let mut newer = req("u1", s.t0 + ms(21));
    newer.source = RelistSource::PostSync;
    newer.prefetch = vec!["c2".into()];
    s.step(Input::Request(newer), ms(22));
    let got = s.step(Input::Request(older), ms(22));
    assert!(matches!(
        got[..],
        [Action::Count(Merged, RelistSource::EventedPleg)]
    ));
    let run = s.step(Input::Run, ms(23));
    let Some(Action::StartBatch { requests, .. }) = run.first() else {
        panic!("{run:?}");
    };
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].source, RelistSource::PostSync);
    assert_eq!(requests[0].enqueued_at, s.t0 + ms(21));
    assert_eq!(requests[0].prefetch, ["c2", "c1"]);
}

#[test]
fn pending_requests_are_bounded_by_the_known_pods_and_twice_the_queue_beyond_it_dropped() {
    const KNOWN: usize = 3;
    let mut s = Spec::after_first_global(KNOWN);
    s.batch_of(&["busy"], ms(20));
    let bound = KNOWN + 2 * CAPACITY;
    let mut dropped = 0;
    for i in 0..bound + 3 {
        // Due: the running batch takes nothing, everything waits.
        let got = s.request(&format!("x{i}"), PERIOD, PERIOD);
        if counts(&got) == [Dropped] {
            assert!(has(
                &got,
                |a| matches!(a, Action::PendingFull { pending } if *pending == bound)
            ));
            dropped += 1;
        }
    }
    assert_eq!(dropped, 3);
    assert_eq!(s.m.pending(), bound);
    // A request for a pod already waiting is merged, never dropped.
    assert_eq!(counts(&s.request("x0", PERIOD, PERIOD)), [Merged]);
}

#[test]
fn api_clients_requests_count_in_no_bound_of_the_pending_requests() {
    let mut s = Spec::after_first_global(0);
    s.batch_of(&["busy"], ms(20));
    let budget = Arc::new(AtomicUsize::new(0));
    for i in 0..2 * CAPACITY + 5 {
        let mut r = req(&format!("api{i}"), s.t0 + PERIOD);
        r.api = Some(Arc::new(ApiPlace(budget.clone())));
        assert!(counts(&s.step(Input::Request(r), PERIOD)).is_empty());
    }
    // The runtime's hints still have the whole bound.
    for i in 0..2 * CAPACITY {
        assert!(counts(&s.request(&format!("x{i}"), PERIOD, PERIOD)).is_empty());
    }
    assert_eq!(counts(&s.request("one-more", PERIOD, PERIOD)), [Dropped]);
}

#[test]
fn a_due_global_relist_goes_before_the_requests_waiting() {
    let mut s = Spec::after_first_global(1);
    s.request("u1", PERIOD - ms(1), PERIOD - ms(1));
    let run = s.step(Input::Run, PERIOD);
    assert!(starts_global(&run));
    assert!(batches(&run).is_empty());
}

#[test]
fn requests_waiting_since_before_a_global_relist_get_the_next_unit_though_another_is_due() {
    let mut s = Spec::after_first_global(1);
    s.batch_of(&["busy"], ms(20));
    // A global relist is due: u1 waits while the batch runs; the global relist runs
    // next.
    s.request("u1", PERIOD, PERIOD);
    s.pod_read("busy", PERIOD + ms(5));
    s.batch_ended(vec![], PERIOD + ms(5));
    assert!(starts_global(&s.step(Input::Run, PERIOD + ms(5))));
    // That global relist failed after its period: another is due, but u1 is owed
    // this unit (it waited since before that relist started).
    s.global_ended(PERIOD + ms(5), None, 2 * PERIOD + ms(10));
    let run = s.step(Input::Run, 2 * PERIOD + ms(10));
    assert_eq!(batches(&run), vec![vec!["u1".to_string()]]);
}

#[test]
fn requests_that_came_during_a_global_relist_wait_for_the_next_due_one_which_skips_them() {
    let mut s = Spec::after_first_global(1);
    s.step(Input::Tick, PERIOD);
    s.request("u1", PERIOD + ms(5), PERIOD + ms(5));
    // The relist ends after its period: the next is due and goes first.
    s.global_ended(PERIOD, Some(&[]), 2 * PERIOD + ms(1));
    assert!(starts_global(&s.step(Input::Run, 2 * PERIOD + ms(1))));
    s.global_ended(2 * PERIOD + ms(1), Some(&[]), 2 * PERIOD + ms(20));
    let run = s.step(Input::Run, 2 * PERIOD + ms(20));
    assert_eq!(counts(&run), [Skipped]);
    assert!(batches(&run).is_empty());
}

#[test]
fn a_request_enqueued_before_a_completed_global_relist_started_is_skipped_at_once() {
    let mut s = Spec::after_first_global(1);
    // Enqueued as the relist started (t0): maybe not seen, so it runs.
    assert!(counts(&s.request("u1", ms(0), ms(20))).is_empty());
    let mut s = Spec::new(1);
    s.step(Input::Start, ms(0));
    s.step(Input::Tick, ms(5));
    s.global_ended(ms(5), Some(&[]), ms(10));
    let got = s.step(Input::Request(req("u1", s.t0 + ms(1))), ms(20));
    assert_eq!(counts(&got), [Skipped]);
    assert_eq!(s.m.pending(), 0);
}

#[test]
fn unless_that_global_relist_did_not_read_the_pod() {
    let mut s = Spec::new(1);
    s.step(Input::Start, ms(0));
    s.step(Input::Tick, ms(5));
    s.global_ended(ms(5), Some(&["unread"]), ms(10));
    let got = s.step(Input::Request(req("unread", s.t0 + ms(1))), ms(20));
    assert!(counts(&got).is_empty());
    assert_eq!(
        batches(&s.step(Input::Run, ms(20))),
        vec![vec!["unread".to_string()]]
    );
}

#[test]
fn a_failed_global_relist_covers_no_request() {
    let mut s = Spec::new(1);
    s.step(Input::Start, ms(0));
    s.step(Input::Tick, ms(5));
    s.global_ended(ms(5), None, ms(10));
    let got = s.step(Input::Request(req("u1", s.t0 + ms(1))), ms(20));
    assert!(counts(&got).is_empty());
    assert_eq!(s.m.pending(), 1);
}

#[test]
fn a_request_for_a_pod_a_sync_holds_is_coalesced_when_its_turn_comes() {
    let mut s = Spec::after_first_global(1);
    s.request("u1", ms(20), ms(20));
    s.held.borrow_mut().insert("u1".into());
    let run = s.step(Input::Run, ms(21));
    assert_eq!(counts(&run), [Coalesced]);
    assert!(batches(&run).is_empty());
}

#[test]
fn a_running_batch_takes_a_request_at_once() {
    let mut s = Spec::after_first_global(2);
    s.batch_of(&["u1"], ms(20));
    let got = s.request("u2", ms(30), ms(30));
    assert_eq!(admitted(&got), ["u2"]);
    assert_eq!(s.m.pending(), 0);
}

#[test]
fn a_running_batch_takes_nothing_once_a_global_relist_is_due() {
    let mut s = Spec::after_first_global(2);
    s.batch_of(&["u1"], ms(20));
    let got = s.request("u2", PERIOD, PERIOD);
    assert!(admitted(&got).is_empty());
    assert_eq!(s.m.pending(), 1);
}

#[test]
fn a_batch_takes_at_most_max_batch_pods_the_rest_and_later_ones_wait_for_the_next() {
    let mut s = Spec::after_first_global(MAX_BATCH + 10);
    for i in 0..MAX_BATCH + 10 {
        s.request(&format!("p{i}"), ms(20), ms(20));
    }
    let run = s.step(Input::Run, ms(21));
    assert_eq!(batches(&run)[0].len(), MAX_BATCH);
    assert_eq!(s.m.pending(), 10);
    // A full batch admits no new pod (it waits) ...
    let got = s.request("new", ms(30), ms(30));
    assert!(admitted(&got).is_empty());
    assert_eq!(s.m.pending(), 11);
    // ... nor one that waits already (merged into its request) ...
    assert_eq!(counts(&s.request("p260", ms(30), ms(30))), [Merged]);
    // ... but still takes a request for a pod it reads (run again after its read).
    let got = s.request("p0", ms(31), ms(31));
    assert!(admitted(&got).is_empty() && counts(&got).is_empty());
    assert_eq!(admitted(&s.pod_read("p0", ms(40))), ["p0"]);
}

#[test]
fn a_request_for_a_pod_being_read_runs_again_once_that_read_ends() {
    let mut s = Spec::after_first_global(2);
    s.batch_of(&["u1", "u2"], ms(20));
    let got = s.request("u1", ms(25), ms(25));
    assert!(
        admitted(&got).is_empty(),
        "not while its read is in progress"
    );
    // Later ones merge into it.
    assert_eq!(counts(&s.request("u1", ms(26), ms(26))), [Merged]);
    assert_eq!(admitted(&s.pod_read("u1", ms(30))), ["u1"]);
    // Its second read ends: it leaves the batch.
    assert!(admitted(&s.pod_read("u1", ms(40))).is_empty());
}

#[test]
fn a_request_for_a_pod_the_batch_has_read_reads_it_again_at_once() {
    let mut s = Spec::after_first_global(2);
    s.batch_of(&["u1", "u2"], ms(20));
    s.pod_read("u1", ms(30));
    assert_eq!(admitted(&s.request("u1", ms(31), ms(31))), ["u1"]);
}

#[test]
fn a_batch_closes_once_every_pod_it_took_is_read() {
    let mut s = Spec::after_first_global(2);
    s.batch_of(&["u1", "u2"], ms(20));
    assert!(!has(&s.pod_read("u1", ms(30)), |a| matches!(
        a,
        Action::CloseBatch
    )));
    assert!(has(&s.pod_read("u2", ms(31)), |a| matches!(
        a,
        Action::CloseBatch
    )));
    // Closed, it takes nothing more: requests wait for the next batch.
    let got = s.request("u3", ms(32), ms(32));
    assert!(admitted(&got).is_empty());
    assert_eq!(s.m.pending(), 1);
    let ended = s.batch_ended(vec![], ms(33));
    assert!(matches!(ended[..], [Action::ScheduleRun]));
}

#[test]
fn requests_a_batch_did_not_start_wait_again_ahead_of_later_ones() {
    let mut s = Spec::after_first_global(4);
    s.batch_of(&["u1", "u2", "u3"], ms(20));
    // u1 read with a request to run again that the batch never got to (the report
    // comes after its end); u2 and u3 not started: a global relist came due.
    s.request("u1", ms(30), ms(30));
    s.request("late", PERIOD, PERIOD);
    let ended = s.batch_ended(
        vec![req("u2", s.t0 + ms(20)), req("u3", s.t0 + ms(20))],
        PERIOD,
    );
    assert!(has(&ended, |a| matches!(a, Action::SetPending(4))));
    // Reports of an ended batch change nothing.
    assert!(s.pod_read("u1", PERIOD).is_empty());
    assert!(starts_global(&s.step(Input::Run, PERIOD)));
    s.global_ended(PERIOD, None, PERIOD + ms(10));
    let run = s.step(Input::Run, PERIOD + ms(10));
    assert_eq!(
        batches(&run),
        vec![vec![
            "u2".to_string(),
            "u3".to_string(),
            "u1".to_string(),
            "late".to_string()
        ]]
    );
}

#[test]
fn no_unit_starts_while_another_runs_its_requests_wait_for_its_end() {
    let mut s = Spec::after_first_global(2);
    s.batch_of(&["u1"], ms(20));
    s.request("u2", PERIOD, PERIOD);
    assert!(s.step(Input::Run, PERIOD).is_empty());
    assert!(s.step(Input::Tick, PERIOD).is_empty());
    s.pod_read("u1", PERIOD + ms(1));
    s.batch_ended(vec![], PERIOD + ms(1));
    // The global relist (due) first, then u2 (it waited since before it started).
    assert!(starts_global(&s.step(Input::Run, PERIOD + ms(1))));
    s.global_ended(PERIOD + ms(1), None, PERIOD + ms(2));
    assert_eq!(
        batches(&s.step(Input::Run, PERIOD + ms(2))),
        vec![vec!["u2".to_string()]]
    );
}

#[test]
fn bring_forward_makes_the_global_relist_due_now_at_most_once_per_period() {
    let mut s = Spec::after_first_global(0);
    let got = s.step(Input::BringForward, ms(100));
    assert!(has(
        &got,
        |a| matches!(a, Action::ArmTimer(t) if *t == s.t0 + ms(100))
    ));
    assert!(starts_global(&s.step(Input::Tick, ms(100))));
    s.global_ended(ms(100), Some(&[]), ms(110));
    assert!(s.step(Input::BringForward, ms(200)).is_empty());
}

#[test]
fn stop_runs_every_request_accepted_starts_no_global_relist_then_stops_the_actor() {
    let mut s = Spec::after_first_global(2);
    s.batch_of(&["u1"], ms(20));
    s.request("u2", PERIOD, PERIOD);
    // A unit runs: nothing to do until it ends.
    assert!(s.step(Input::Stop, PERIOD).is_empty());
    s.pod_read("u1", PERIOD + ms(1));
    assert!(matches!(
        s.batch_ended(vec![], PERIOD + ms(1))[..],
        [Action::ScheduleRun]
    ));
    // Though a global relist is due, the pending request runs.
    let run = s.step(Input::Run, PERIOD + ms(2));
    assert_eq!(batches(&run), vec![vec!["u2".to_string()]]);
    s.pod_read("u2", PERIOD + ms(3));
    s.batch_ended(vec![], PERIOD + ms(3));
    assert!(matches!(
        s.step(Input::Run, PERIOD + ms(4))[..],
        [Action::StopActor]
    ));
    assert!(s.m.idle());
}

#[test]
fn an_actor_about_to_stop_with_requests_waiting_runs_them_first() {
    let mut s = Spec::after_first_global(1);
    s.step(Input::Stop, ms(20));
    assert!(matches!(
        s.step(Input::Run, ms(20))[..],
        [Action::StopActor]
    ));
    // actix hands the actor its mailbox once more: a request comes.
    s.request("u1", ms(21), ms(21));
    assert!(!s.m.idle());
    s.step(Input::ActorStopping, ms(22));
    assert!(!s.m.idle(), "the actor goes on");
    assert_eq!(
        batches(&s.step(Input::Run, ms(23))),
        vec![vec!["u1".to_string()]]
    );
}

/// A request for `uid` naming `containers`, enqueued at `t0 + enqueued`.
fn naming(s: &Spec, uid: &str, containers: &[&str], enqueued: Duration) -> RequestRelist {
    RequestRelist {
        prefetch: containers.iter().map(|c| c.to_string()).collect(),
        ..req(uid, s.t0 + enqueued)
    }
}

/// The containers handed to the running global relist to read beside it.
fn read_beside(actions: &[Action]) -> Vec<(String, Vec<String>)> {
    pick(actions, |a| match a {
        Action::ReadBeside(ask) => Some((ask.uid.clone(), ask.containers.clone())),
        _ => None,
    })
}

/// What the hint sources were told last: (running, hearing).
fn told(actions: &[Action]) -> Option<(bool, bool)> {
    pick(actions, |a| match a {
        Action::SetPriority {
            running, hearing, ..
        } => Some((*running, *hearing)),
        _ => None,
    })
    .pop()
}

#[test]
fn a_running_global_relist_reads_the_containers_a_request_names_beside_it_and_the_request_still_runs(
) {
    let mut s = Spec::after_first_global(2);
    let started = s.step(Input::Tick, PERIOD);
    assert_eq!(told(&started), Some((true, true)), "hint sources heard");
    let r = naming(&s, "u1", &["c1", "c2"], PERIOD + ms(1));
    let heard = s.step(Input::Request(r), PERIOD + ms(1));
    assert_eq!(
        read_beside(&heard),
        vec![("u1".to_string(), vec!["c1".to_string(), "c2".to_string()])]
    );
    assert!(counts(&heard).is_empty(), "not settled: it waits");
    // The same container again (another hint source's), and one more.
    let r = naming(&s, "u1", &["c2", "c3"], PERIOD + ms(2));
    let again = s.step(Input::Request(r), PERIOD + ms(2));
    assert_eq!(
        read_beside(&again),
        vec![("u1".to_string(), vec!["c3".to_string()])],
        "each container once"
    );
    assert_eq!(counts(&again), vec![Merged]);
    let ended = s.global_ended(PERIOD, Some(&[]), PERIOD + ms(20));
    assert_eq!(told(&ended), Some((false, false)));
    let run = s.step(Input::Run, PERIOD + ms(20));
    assert_eq!(
        batches(&run),
        vec![vec!["u1".to_string()]],
        "its own relist runs: the global relist's lists may be older than its cause"
    );
    // Nothing is read beside a batch.
    let r = naming(&s, "u2", &["c9"], PERIOD + ms(21));
    assert!(read_beside(&s.step(Input::Request(r), PERIOD + ms(21))).is_empty());
}

#[test]
fn a_global_relist_reads_a_bounded_number_of_containers_beside_it_then_the_hint_sources_wait() {
    use super::machine::READ_BESIDE;
    let mut s = Spec::after_first_global(1000);
    s.step(Input::Tick, PERIOD);
    let mut read = 0;
    let mut deaf_after = None;
    for i in 0..READ_BESIDE + 5 {
        let c = format!("c{i}");
        let r = naming(&s, &format!("u{i}"), &[&c], PERIOD + ms(1));
        let out = s.step(Input::Request(r), PERIOD + ms(1));
        read += read_beside(&out).len();
        if told(&out) == Some((true, false)) {
            deaf_after.get_or_insert(i + 1);
        }
    }
    assert_eq!(read, READ_BESIDE);
    assert_eq!(deaf_after, Some(READ_BESIDE), "told once the last is asked");
    // The next global relist hears again.
    s.global_ended(PERIOD, Some(&[]), PERIOD + ms(20));
    s.step(Input::Run, PERIOD + ms(20));
    s.batch_ended(Vec::new(), PERIOD + ms(30));
    let next = s.step(Input::Tick, 2 * PERIOD);
    assert!(starts_global(&next));
    assert_eq!(told(&next), Some((true, true)));
}

#[test]
fn a_container_named_again_by_another_source_is_read_again() {
    let mut s = Spec::after_first_global(2);
    s.step(Input::Tick, PERIOD);
    // A task exit first (its status may still say running), then the CRI stop.
    let r = RequestRelist {
        source: RelistSource::ContainerdEvents,
        ..naming(&s, "u1", &["c1"], PERIOD + ms(1))
    };
    assert_eq!(
        read_beside(&s.step(Input::Request(r), PERIOD + ms(1))).len(),
        1
    );
    let r = naming(&s, "u1", &["c1"], PERIOD + ms(2));
    let out = s.step(Input::Request(r), PERIOD + ms(2));
    assert_eq!(
        read_beside(&out),
        vec![("u1".to_string(), vec!["c1".to_string()])]
    );
    let r = naming(&s, "u1", &["c1"], PERIOD + ms(3));
    assert!(read_beside(&s.step(Input::Request(r), PERIOD + ms(3))).is_empty());
}

#[test]
fn a_stop_asked_during_a_global_relist_has_the_hint_sources_wait_for_its_end() {
    let mut s = Spec::after_first_global(2);
    s.step(Input::Tick, PERIOD);
    let stop = s.step(Input::Stop, PERIOD + ms(1));
    assert_eq!(told(&stop), Some((true, false)));
    let r = naming(&s, "u1", &["c1"], PERIOD + ms(2));
    assert!(read_beside(&s.step(Input::Request(r), PERIOD + ms(2))).is_empty());
}

#[test]
fn a_request_for_a_pod_whose_read_is_in_progress_has_its_containers_read_beside_the_batch() {
    let mut s = Spec::after_first_global(2);
    s.batch_of(&["u1"], ms(100));
    let r = naming(&s, "u1", &["c1"], ms(101));
    let again = s.step(Input::Request(r), ms(101));
    assert_eq!(
        read_beside(&again),
        vec![("u1".to_string(), vec!["c1".to_string()])]
    );
    assert!(
        admitted(&again).is_empty(),
        "it runs again once the read ends"
    );
    let r = naming(&s, "u1", &["c1"], ms(102));
    assert!(
        read_beside(&s.step(Input::Request(r), ms(102))).is_empty(),
        "each container once"
    );
    // A pod the batch is not reading: taken into the batch, its prefetch read with
    // its lists.
    let r = naming(&s, "u2", &["c2"], ms(103));
    let taken = s.step(Input::Request(r), ms(103));
    assert_eq!(admitted(&taken), vec!["u2".to_string()]);
    assert!(read_beside(&taken).is_empty());
    // Read: the request that came meanwhile runs.
    assert_eq!(admitted(&s.pod_read("u1", ms(110))), vec!["u1".to_string()]);
}
