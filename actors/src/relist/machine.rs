//! The RelistDispatcher's decisions as one pure state machine (KEP-3386 "Design
//! Details"): [`Machine::step`] maps (state, input, now) to actions, with no actor,
//! runtime or clock; the actor (`dispatcher`) performs the actions and feeds back what
//! happened. It owns the requests waiting, the batch in progress, what that batch may
//! take, the pods it reads again and the global relist's schedule. The rules, each a
//! test in `machine_tests`:
//!
//! - One unit of work at a time: a global relist, or a batch of targeted relists. A
//!   due global relist goes first, unless the last unit was one and requests wait that
//!   came before it started: then they get this unit. So a storm of requests delays a
//!   global relist by at most one batch, and global relists slower than their period
//!   never starve the requests.
//! - A request waits one per pod (a newer one for a pod already waiting takes its
//!   place with the containers both asked to prefetch; the older is counted
//!   `merged`). The pending requests are bounded by the pods plegd knows plus twice the
//!   queue's capacity; one for one more pod is dropped (counted); one for a pod already
//!   waiting is always merged. API clients' requests count in neither bound (they
//!   wait under their own budget).
//! - A batch takes at most [`MAX_BATCH`] pods. While it runs it takes (admits) the
//!   requests that come, unless a global relist is due, the pod already waits, or the
//!   batch is full. A request for a pod whose read is in progress runs again once that
//!   read ends (later ones merge into it); the containers it names are read beside the
//!   batch meanwhile (as beside a global relist, below). A batch ends once every pod
//!   it took is read.
//! - While a global relist runs, the hint sources are heard (a bounded number of their
//!   items: `queue::priority`): the containers a request names are read beside it,
//!   each once per source, at most [`READ_BESIDE`] reads (the `pleg::beside` module: a
//!   death they show is published at once); then, or once a stop is asked, the hint
//!   sources wait for its end. The request waits all the same.
//! - A request enqueued before the start of a completed global relist is skipped (that
//!   relist saw the pod), unless that relist did not read the pod (a sync held it, or
//!   its read failed). A request for a pod a sync holds is coalesced into the gate's
//!   pending relist. [`Machine::settle`] takes that verdict, in one place.
//! - Stop: no global relist starts; every request accepted runs in batches; then the
//!   actor stops. A request accepted ends `done`, `skipped`, `coalesced` or `merged`.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use plegd_telemetry::RequestResult;

use super::schedule::{GlobalSchedule, Verdict};
use crate::event::RelistSource;
use crate::pleg::BesideAsk;
use crate::queue::request::{merge, Added, PodRequests, RequestRelist};

/// The most pods one batch takes.
pub const MAX_BATCH: usize = 256;

/// The most containers read beside one unit of work.
pub const READ_BESIDE: usize = 32;

/// What the machine is told at start.
#[derive(Clone, Debug)]
pub struct Rules {
    pub relist_period: Duration,
    /// The queue's capacity (with the pods known, the bound of the pending requests).
    pub queue_capacity: usize,
    /// Batches take requests while they run (on in plegd; off, every request waits for
    /// the next batch: tests of the pending requests alone).
    pub admission: bool,
}

/// What happened, as the actor saw it.
#[derive(Debug)]
pub enum Input {
    /// The actor started.
    Start,
    /// A request taken from the inbox.
    Request(RequestRelist),
    /// Time for the next unit of work ([`Action::ScheduleRun`]); the actor has taken
    /// the inbox first.
    Run,
    /// The timer of [`Action::ArmTimer`] fired (the actor has taken the inbox first).
    Tick,
    /// Bring the next global relist forward (at most once per period).
    BringForward,
    /// Stop once the unit in progress and the requests accepted are done.
    Stop,
    /// The global relist of [`Action::StartGlobal`] ended: when it started, the pods
    /// it did not read (None: its lists failed), the pods the Generic PLEG knows now.
    GlobalEnded {
        start: Instant,
        not_read: Option<HashSet<String>>,
        known_pods: usize,
    },
    /// The batch numbered `batch` has read this pod (or handed it back: held).
    PodRead { batch: u64, uid: String },
    /// The batch numbered `batch` ended; `deferred`: requests it took but did not
    /// start (a global relist came due).
    BatchEnded {
        batch: u64,
        deferred: Vec<RequestRelist>,
        known_pods: usize,
    },
    /// actix is about to stop the actor (it may go on if work is left).
    ActorStopping,
}

/// What the actor must do, in order.
#[derive(Debug)]
pub enum Action {
    /// Run a global relist; feed [`Input::GlobalEnded`].
    StartGlobal,
    /// Run these requests as a batch; feed [`Input::PodRead`] for each pod read and
    /// [`Input::BatchEnded`] once it returns.
    StartBatch {
        batch: u64,
        requests: Vec<RequestRelist>,
    },
    /// Hand this request to the batch in progress.
    Admit(RequestRelist),
    /// The batch in progress takes nothing more: it ends once its reads have.
    CloseBatch,
    /// Feed [`Input::Run`] once the messages now in the mailbox are handled.
    ScheduleRun,
    /// Feed [`Input::Tick`] at this instant (replacing the timer armed before).
    ArmTimer(Instant),
    /// Tell the hint sources whether a global relist runs, whether it hears them,
    /// and when the next is due.
    SetPriority {
        running: bool,
        hearing: bool,
        next_due: Instant,
    },
    /// Read these containers beside the global relist in progress.
    ReadBeside(BesideAsk),
    /// Count a request's result.
    Count(RequestResult, RelistSource),
    /// The pending requests' gauge.
    SetPending(usize),
    /// The interval between two global relists' starts.
    ObserveInterval(Duration),
    /// Warn (rate-limited): a request was dropped, too many pods wait.
    PendingFull { pending: usize },
    /// Stop the actor.
    StopActor,
}

/// The unit of work in progress.
enum Unit {
    Global(Hearing),
    Batch(OpenBatch),
}

/// What a running global relist has heard.
#[derive(Default)]
struct Hearing {
    /// Containers read beside it.
    read: ReadBeside,
    /// It hears no more (the hint sources wait for its end).
    deaf: bool,
}

/// The containers read beside a unit of work, by the source that asked: a later
/// hint of another source (a CRI stop after a task exit) is read again, as the
/// first may have come before the runtime's status said it.
type ReadBeside = HashSet<(RelistSource, String)>;

/// The batch in progress: the pods it took and has not read yet, each with the
/// request to run again once its read ends.
struct OpenBatch {
    number: u64,
    pods: HashMap<String, Option<RequestRelist>>,
    /// Pods taken, for [`MAX_BATCH`].
    taken: usize,
    /// Told to take nothing more ([`Action::CloseBatch`]).
    closed: bool,
    /// Containers read beside it.
    read_beside: ReadBeside,
}

/// The containers `req` names that the unit in progress has not read beside it yet
/// for `req`'s source ([`READ_BESIDE`] in all), to read now; they are marked read.
fn beside_ask(read: &mut ReadBeside, req: &RequestRelist) -> Option<BesideAsk> {
    let mut containers = Vec::new();
    for id in &req.prefetch {
        if read.len() == READ_BESIDE {
            break;
        }
        if read.insert((req.source, id.clone())) {
            containers.push(id.clone());
        }
    }
    (!containers.is_empty()).then(|| BesideAsk {
        uid: req.uid.clone(),
        source: req.source,
        containers,
    })
}

pub struct Machine {
    rules: Rules,
    schedule: GlobalSchedule,
    /// Pods the last successful global relist did not read: it covers no request for
    /// them.
    not_read: HashSet<String>,
    /// Requests waiting for the next batch, one per pod, in arrival order.
    pending: PodRequests,
    /// Pods the Generic PLEG had a record of when the last unit ended.
    known_pods: usize,
    unit: Option<Unit>,
    /// [`Action::ScheduleRun`] is on its way.
    run_scheduled: bool,
    /// The pending requests are owed the next unit: they waited since before the
    /// global relist that just ran.
    batch_next: bool,
    stopping: bool,
    /// Batches started.
    batches: u64,
}

impl Machine {
    /// A machine whose first global relist is due at `now`.
    pub fn new(rules: Rules, known_pods: usize, now: Instant) -> Self {
        Machine {
            schedule: GlobalSchedule::new(rules.relist_period, now),
            rules: Rules {
                queue_capacity: rules.queue_capacity.max(1),
                ..rules
            },
            not_read: HashSet::new(),
            pending: PodRequests::default(),
            known_pods,
            unit: None,
            run_scheduled: false,
            batch_next: false,
            stopping: false,
            batches: 0,
        }
    }

    /// When the next global relist is due.
    pub fn next_due(&self) -> Instant {
        self.schedule.next_due()
    }

    /// Requests waiting for a batch.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    pub fn stopping(&self) -> bool {
        self.stopping
    }

    /// No unit of work in progress and no request waiting.
    pub fn idle(&self) -> bool {
        self.unit.is_none() && self.pending.is_empty()
    }

    /// The one transition function. `held(uid)`: whether a sync holds the pod (asking
    /// marks its gate's pending relist: the verdict `coalesced` relies on it).
    pub fn step(&mut self, input: Input, now: Instant, held: &dyn Fn(&str) -> bool) -> Vec<Action> {
        let mut out = Vec::new();
        let pending = self.pending.len();
        match input {
            Input::Start => out.push(Action::ArmTimer(self.next_due())),
            Input::Request(req) => self.accept(req, now, held, &mut out),
            Input::Run => {
                self.run_scheduled = false;
                self.run(now, held, &mut out);
            }
            Input::Tick => {
                if !self.wind_down(&mut out) {
                    if self.schedule.due(now) {
                        self.run(now, held, &mut out);
                    } else {
                        out.push(Action::ArmTimer(self.next_due()));
                    }
                }
            }
            Input::BringForward => {
                if !self.wind_down(&mut out) && self.schedule.bring_forward(now) {
                    out.push(self.priority());
                    out.push(Action::ArmTimer(self.next_due()));
                }
            }
            Input::Stop => {
                self.stopping = true;
                self.deafen(&mut out);
                self.wind_down(&mut out);
            }
            Input::GlobalEnded {
                start,
                not_read,
                known_pods,
            } => self.global_ended(start, not_read, known_pods, &mut out),
            Input::PodRead { batch, uid } => self.pod_read(batch, &uid, &mut out),
            Input::BatchEnded {
                batch,
                deferred,
                known_pods,
            } => self.batch_ended(batch, deferred, known_pods, &mut out),
            Input::ActorStopping => {
                if self.unit.is_none() && !self.pending.is_empty() {
                    self.schedule_run(&mut out);
                }
            }
        }
        if self.pending.len() != pending {
            out.push(Action::SetPending(self.pending.len()));
        }
        out
    }

    /// A request from the inbox: the batch in progress takes it at once if it may
    /// (its verdict taken now: no global relist completes while a batch runs); one a
    /// completed global relist already covers is settled at once; any other waits for
    /// the next batch.
    fn accept(
        &mut self,
        req: RequestRelist,
        now: Instant,
        held: &dyn Fn(&str) -> bool,
        out: &mut Vec<Action>,
    ) {
        self.hear(&req, out);
        let waits = if self.admissible(&req, now) {
            self.settle(req, held, out)
                .and_then(|req| self.admit(req, out))
        } else if self.schedule.covers(req.enqueued_at) {
            self.settle(req, held, out)
        } else {
            Some(req)
        };
        if let Some(req) = waits {
            self.enqueue(req, out);
            if self.unit.is_none() {
                self.schedule_run(out);
            }
        }
    }

    /// A request taken while a global relist runs and hears: the containers it names
    /// that are not read beside it yet are, up to [`READ_BESIDE`] in all; once that
    /// many are, the hint sources wait.
    fn hear(&mut self, req: &RequestRelist, out: &mut Vec<Action>) {
        let Some(Unit::Global(hearing)) = &mut self.unit else {
            return;
        };
        if hearing.deaf {
            return;
        }
        if let Some(ask) = beside_ask(&mut hearing.read, req) {
            out.push(Action::ReadBeside(ask));
        }
        if hearing.read.len() >= READ_BESIDE {
            self.deafen(out);
        }
    }

    /// The running global relist hears no more: the hint sources wait for its end.
    fn deafen(&mut self, out: &mut Vec<Action>) {
        if let Some(Unit::Global(hearing)) = &mut self.unit {
            if !hearing.deaf {
                hearing.deaf = true;
                out.push(self.priority());
            }
        }
    }

    /// What the hint sources are told: whether a global relist runs and hears them,
    /// and when the next is due.
    fn priority(&self) -> Action {
        let (running, hearing) = match &self.unit {
            Some(Unit::Global(h)) => (true, !h.deaf),
            _ => (false, false),
        };
        Action::SetPriority {
            running,
            hearing,
            next_due: self.next_due(),
        }
    }

    /// Whether the batch in progress may take this request: no global relist is due
    /// (that runs next, and covers it), the pod is not waiting for the next batch, and
    /// the batch has room or is reading the pod already.
    fn admissible(&self, req: &RequestRelist, now: Instant) -> bool {
        let Some(Unit::Batch(open)) = &self.unit else {
            return false;
        };
        self.rules.admission
            && !open.closed
            && !self.schedule.due(now)
            && !self.pending.contains(&req.uid)
            && (open.taken < MAX_BATCH || open.pods.contains_key(&req.uid))
    }

    /// Hands a request that must run to the batch in progress. One for a pod whose
    /// read is in progress (it may have begun before the request's cause) runs again
    /// once that read ends, merged with any other that comes meanwhile; the containers
    /// it names are read beside the batch at once.
    fn admit(&mut self, req: RequestRelist, out: &mut Vec<Action>) -> Option<RequestRelist> {
        let Some(Unit::Batch(open)) = &mut self.unit else {
            return Some(req);
        };
        if let Some(again) = open.pods.get_mut(&req.uid) {
            if let Some(ask) = beside_ask(&mut open.read_beside, &req) {
                out.push(Action::ReadBeside(ask));
            }
            match again {
                Some(kept) => {
                    let merged = merge(kept, req);
                    out.push(Action::Count(RequestResult::Merged, merged));
                }
                None => *again = Some(req),
            }
            return None;
        }
        open.pods.insert(req.uid.clone(), None);
        open.taken += 1;
        out.push(Action::Admit(req));
        None
    }

    /// The one place a request's verdict is taken: counted if it needs no relist
    /// (skipped: covered; coalesced: held), returned if it must run.
    fn settle(
        &self,
        req: RequestRelist,
        held: &dyn Fn(&str) -> bool,
        out: &mut Vec<Action>,
    ) -> Option<RequestRelist> {
        let verdict = match self.schedule.verdict(req.enqueued_at, held(&req.uid)) {
            // The covering relist did not read this pod: the request's cause is unseen.
            Verdict::Skip if self.not_read.contains(&req.uid) => Verdict::Run,
            v => v,
        };
        let result = match verdict {
            Verdict::Run => return Some(req),
            Verdict::Skip => RequestResult::Skipped,
            Verdict::Coalesce => RequestResult::Coalesced,
        };
        out.push(Action::Count(result, req.source));
        None
    }

    /// How many pods may wait: every pod plegd knows, and twice as many more as the
    /// queue holds (pods not listed yet: created since the last global relist, or
    /// garbage). Twice: an idle dispatcher must never drop what its queue accepted.
    fn pending_bound(&self) -> usize {
        self.known_pods
            .saturating_add(self.rules.queue_capacity.saturating_mul(2))
    }

    /// A request that must wait for its turn: one per pod; one for one more pod than
    /// [`Self::pending_bound`] is dropped.
    fn enqueue(&mut self, req: RequestRelist, out: &mut Vec<Action>) {
        match self.pending.add(req, self.pending_bound()) {
            Added::New => {}
            Added::Merged(source) => out.push(Action::Count(RequestResult::Merged, source)),
            Added::Refused(req) => {
                out.push(Action::Count(RequestResult::Dropped, req.source));
                out.push(Action::PendingFull {
                    pending: self.pending.len(),
                });
            }
        }
    }

    fn schedule_run(&mut self, out: &mut Vec<Action>) {
        if !self.run_scheduled {
            self.run_scheduled = true;
            out.push(Action::ScheduleRun);
        }
    }

    /// True once a stop is asked; then, with no unit in progress, the next run stops
    /// the actor or runs what is pending.
    fn wind_down(&mut self, out: &mut Vec<Action>) -> bool {
        if !self.stopping {
            return false;
        }
        if self.unit.is_none() {
            self.schedule_run(out);
        }
        true
    }

    /// One unit of work: a due global relist (unless the pending requests are owed
    /// this one), else a batch of the pending requests. Nothing starts while a unit
    /// runs (its end looks again). Once a stop is asked, only batches start.
    fn run(&mut self, now: Instant, held: &dyn Fn(&str) -> bool, out: &mut Vec<Action>) {
        if self.unit.is_some() {
            return;
        }
        if self.stopping && self.pending.is_empty() {
            out.push(Action::StopActor);
            return;
        }
        let owed = self.batch_next && !self.pending.is_empty();
        self.batch_next = false;
        if !self.stopping && !owed && self.schedule.due(now) {
            self.unit = Some(Unit::Global(Hearing::default()));
            out.push(self.priority());
            out.push(Action::StartGlobal);
        } else if !self.pending.is_empty() {
            self.batch(held, out);
        } else {
            out.push(Action::ArmTimer(self.next_due()));
        }
    }

    /// A batch of the pending requests: each settled first, in arrival order (a
    /// global relist may have covered it since it came), until [`MAX_BATCH`] must run.
    fn batch(&mut self, held: &dyn Fn(&str) -> bool, out: &mut Vec<Action>) {
        let mut requests = Vec::with_capacity(MAX_BATCH.min(self.pending.len()));
        let mut pending = self.pending.take().into_iter();
        for req in pending.by_ref() {
            if let Some(req) = self.settle(req, held, out) {
                requests.push(req);
                if requests.len() == MAX_BATCH {
                    break;
                }
            }
        }
        self.pending.put_back(pending);
        if requests.is_empty() {
            return self.unit_done(out);
        }
        self.batches += 1;
        self.unit = Some(Unit::Batch(OpenBatch {
            number: self.batches,
            pods: requests.iter().map(|r| (r.uid.clone(), None)).collect(),
            taken: requests.len(),
            closed: false,
            read_beside: ReadBeside::new(),
        }));
        out.push(Action::StartBatch {
            batch: self.batches,
            requests,
        });
    }

    /// A unit ended: run the pending requests once the mailbox is handled, else wait
    /// for the next due global relist (or stop, if asked).
    fn unit_done(&mut self, out: &mut Vec<Action>) {
        if self.wind_down(out) {
            return;
        }
        if self.pending.is_empty() {
            out.push(Action::ArmTimer(self.next_due()));
        } else {
            self.schedule_run(out);
        }
    }

    fn global_ended(
        &mut self,
        start: Instant,
        not_read: Option<HashSet<String>>,
        known_pods: usize,
        out: &mut Vec<Action>,
    ) {
        if !matches!(self.unit, Some(Unit::Global(_))) {
            return;
        }
        self.unit = None;
        self.known_pods = known_pods;
        if let Some(interval) = self.schedule.completed(start, not_read.is_some()) {
            out.push(Action::ObserveInterval(interval));
        }
        out.push(self.priority());
        if let Some(not_read) = not_read {
            self.not_read = not_read;
        }
        // Requests that waited since before this relist started are owed the next
        // unit, even if another global relist is due by then (those this one covers
        // are skipped then). Those that came during it wait for a due global relist,
        // which covers them.
        self.batch_next = self.pending.iter().any(|r| r.enqueued_at < start);
        self.unit_done(out);
    }

    /// A pod of the batch was read: it runs again if a request came meanwhile, else it
    /// leaves the batch; the batch closes once it has no pod left.
    fn pod_read(&mut self, batch: u64, uid: &str, out: &mut Vec<Action>) {
        let Some(Unit::Batch(open)) = &mut self.unit else {
            return;
        };
        if open.number != batch {
            return;
        }
        match open.pods.get_mut(uid).map(Option::take) {
            Some(Some(again)) => out.push(Action::Admit(again)),
            Some(None) => {
                open.pods.remove(uid);
                if open.pods.is_empty() && !open.closed {
                    open.closed = true;
                    out.push(Action::CloseBatch);
                }
            }
            None => {}
        }
    }

    /// The batch ended. What it took and did not start (a global relist came due),
    /// and the requests it held to run again for pods it did not get back to, wait
    /// again ahead of those that came after them.
    fn batch_ended(
        &mut self,
        batch: u64,
        deferred: Vec<RequestRelist>,
        known_pods: usize,
        out: &mut Vec<Action>,
    ) {
        let open = match self.unit.take() {
            Some(Unit::Batch(open)) if open.number == batch => open,
            unit => {
                self.unit = unit;
                return;
            }
        };
        self.known_pods = known_pods;
        let mut first = deferred;
        first.extend(open.pods.into_values().flatten());
        if !first.is_empty() {
            let later = self.pending.take();
            for req in first.into_iter().chain(later) {
                // Never refused: each was accepted already.
                if let Added::Merged(source) = self.pending.add(req, usize::MAX) {
                    out.push(Action::Count(RequestResult::Merged, source));
                }
            }
        }
        self.unit_done(out);
    }
}
