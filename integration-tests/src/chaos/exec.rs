//! Runs one schedule against plegd's real actors over the fault-injecting fake
//! runtime (in process, or through the simulated CRI server and plegd's tonic client),
//! records the runtime's true history as it goes, heals every fault, and checks
//! convergence, soundness, completeness and boundedness. Problems are collected, not
//! panicked on, so one failing seed reports everything that broke.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use plegd_actors::{
    Delivery, Pleg, PlegConfig, ReconnectPolicy, RelistSource, Subscription, SyncHold, SyncOutcome,
};
use plegd_runtime::{CriRuntime, RuntimeClient};
use plegd_telemetry::{Metrics, RequestResult};
use tempfile::TempDir;

use super::runtime_side::RuntimeSide;
use super::schedule::{pod_ref, HoldEnd, Schedule, Step, StormSource, StormTarget, Transport};
use super::truth::St;

/// How long plegd gets, on top of one relist period, to converge after the faults
/// stop; and to settle anything else that must happen "eventually". Generous: the
/// machines that run this are small and shared.
pub const SLACK: Duration = Duration::from_secs(10);

/// Deadline of plegd's unary CRI calls over the simulated server.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// Queue of the subscriber whose events are checked: it is drained at every step,
/// so it never fills (if it did, the check says so).
const CHECKER_CAPACITY: usize = 1 << 14;

/// What one run measured, for the summary.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub steps: usize,
    /// State changes of the runtime's sandboxes and containers.
    pub transitions: usize,
    pub events: usize,
    pub slow_subscriber_drops: u64,
    pub storm_drops: u64,
    pub global_relists: u64,
    pub reconnect_attempts: u64,
    pub list_errors: u64,
    pub status_errors: u64,
    /// From the end of the faults to cache == runtime.
    pub convergence: Duration,
    pub relist_period: Duration,
    /// plegd stopped with SIGTERM, killed with SIGKILL, and starts that failed
    /// because the runtime was down (restart suite).
    pub clean_stops: u64,
    pub kills: u64,
    pub failed_starts: u64,
}

/// The executor's state: the runtime, plegd, and what the run has seen.
struct Exec {
    schedule: Schedule,
    side: RuntimeSide,
    pleg: Pleg,
    metrics: Arc<Metrics>,
    holds: Vec<Option<SyncHold>>,
    extra_subs: Vec<Option<Subscription>>,
    extra_subs_used: bool,
    checker: Subscription,
    slow: Subscription,
    checked: Vec<Delivery>,
    slow_seen: Vec<Delivery>,
    storm_drops: u64,
    problems: Vec<String>,
}

/// Polls `cond` every few milliseconds until it holds or `timeout` passes.
pub async fn eventually(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
}

/// As [`eventually`], for a condition that must be awaited.
async fn eventually_async<F, Fut>(timeout: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if cond().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
}

fn global_relists(m: &Metrics) -> u64 {
    m.relist_duration.get_sample_count()
}

fn source_of(s: StormSource) -> RelistSource {
    match s {
        StormSource::EventedPleg => RelistSource::EventedPleg,
        StormSource::PostSync => RelistSource::PostSync,
        StormSource::PostAllocation => RelistSource::PostAllocation,
    }
}

impl Exec {
    fn problem(&mut self, p: String) {
        self.problems.push(p);
    }

    fn drain_checker(&mut self) {
        self.checked.extend(self.checker.try_iter());
    }

    async fn step(&mut self, step: &Step) {
        if self.side.apply(step).await {
            return;
        }
        match step {
            Step::BeginHold { pod, slot } => {
                if let Ok(hold) = self.pleg.gates().begin_sync(&pod_ref(*pod).uid).await {
                    self.holds[*slot] = Some(hold);
                }
            }
            Step::EndHold { slot, how } => {
                if let Some(hold) = self.holds[*slot].take() {
                    match how {
                        HoldEnd::Success => hold.end(SyncOutcome::Success),
                        HoldEnd::Error => hold.end(SyncOutcome::Error),
                        HoldEnd::Cancelled => hold.end(SyncOutcome::Cancelled),
                        HoldEnd::Dropped => drop(hold),
                    }
                }
            }
            Step::Storm { n, targets, source } => {
                let source = source_of(*source);
                for i in 0..*n as usize {
                    let uid = match targets[i % targets.len()] {
                        StormTarget::Pod(p) => pod_ref(p).uid,
                        StormTarget::Ghost => "chaos-ghost".to_string(),
                    };
                    if !self.pleg.request_relist(&uid, source) {
                        self.storm_drops += 1;
                    }
                }
            }
            Step::BringForward => self.pleg.bring_global_relist_forward(),
            Step::Subscribe { slot, capacity } => {
                self.extra_subs_used = true;
                match self.pleg.subscribe("chaos-extra", *capacity).await {
                    Ok(s) => self.extra_subs[*slot] = Some(s),
                    Err(e) => self.problem(format!("subscribe failed: {e}")),
                }
            }
            Step::Unsubscribe { slot } => self.extra_subs[*slot] = None,
            Step::ReadSlow { n } => {
                for _ in 0..*n {
                    match self.slow.try_recv() {
                        Ok(d) => self.slow_seen.push(d),
                        Err(_) => break,
                    }
                }
            }
            // The runtime side's steps were applied above; plegd's restarts belong to
            // the restart suite, whose schedules the child-process executor runs.
            _ => {}
        }
    }

    /// Bounds that hold at every moment.
    async fn sample_bounds(&mut self, at: usize) {
        if self.schedule.config.evented {
            if let Some(st) = self.pleg.watcher_state().await {
                if st.live_futures > 1 {
                    self.problem(format!(
                        "step {at}: the stream watcher has {} live futures ({st:?})",
                        st.live_futures
                    ));
                }
            }
        }
        // Over CRI the server notices a cancelled stream a little later; in process a
        // dropped stream is gone at once.
        if self.schedule.config.transport == Transport::Direct && self.side.rt.event_streams() > 1 {
            self.problem(format!(
                "step {at}: {} event streams open",
                self.side.rt.event_streams()
            ));
        }
    }

    /// Stops every fault, ends every hold and extra subscription.
    async fn heal(&mut self) {
        self.side.heal().await;
        for hold in self.holds.iter_mut().filter_map(Option::take) {
            hold.end(SyncOutcome::Success);
        }
        for sub in &mut self.extra_subs {
            *sub = None;
        }
    }

    /// The differences between plegd's cache and the runtime, if any.
    fn cache_diff(&self) -> Option<String> {
        let cache = self.pleg.cache();
        let wanted = self.side.wanted();
        let live = wanted.len();
        let mut diffs = Vec::new();
        for p in 0..self.schedule.pods {
            let pod = pod_ref(p);
            let entry = cache.get(&pod.uid);
            let Some(want) = wanted.get(&pod.uid) else {
                if let Some(e) = entry {
                    diffs.push(format!("{}: gone, cached {e:?}", pod.uid));
                }
                continue;
            };
            let Some(entry) = entry else {
                diffs.push(format!("{}: not cached; runtime {want:?}", pod.uid));
                continue;
            };
            let Some(status) = entry.status.as_ref().filter(|_| entry.error.is_none()) else {
                diffs.push(format!("{}: cached {entry:?}; runtime {want:?}", pod.uid));
                continue;
            };
            let mut got = BTreeMap::new();
            for sb in &status.sandboxes {
                got.insert(sb.id.clone(), St::of_sandbox(Some(sb.state)));
            }
            for c in &status.containers {
                got.insert(c.id.clone(), St::of_container(Some(c.state)));
            }
            if got != *want || status.pod != pod {
                diffs.push(format!(
                    "{}: cached {:?} {got:?}; runtime {want:?}",
                    pod.uid, status.pod
                ));
            }
        }
        if cache.len() != live {
            diffs.push(format!(
                "{} pods cached, {live} in the runtime",
                cache.len()
            ));
        }
        (!diffs.is_empty()).then(|| diffs.join("; "))
    }

    /// After the faults: convergence, then soundness and completeness of the events,
    /// the dropping subscriber's accounting, and the bounds.
    async fn check(&mut self, healed: Instant) -> Duration {
        let healed_wall = SystemTime::now();
        let period = self.schedule.config.relist_period;
        let converged = eventually(period + SLACK, || self.cache_diff().is_none()).await;
        let convergence = healed.elapsed();
        if !converged {
            let diff = self.cache_diff().unwrap_or_default();
            self.problem(format!(
                "no convergence {convergence:?} after the faults stopped: {diff}"
            ));
        }
        // A consumer waiting for news of any pod (kubelet's pod workers) is released
        // with what the runtime has.
        for p in 0..self.schedule.pods {
            let uid = pod_ref(p).uid;
            let live = !self.side.rt.sandboxes_of(&uid).is_empty();
            match self
                .pleg
                .cache()
                .wait_newer_than(&uid, healed_wall, SLACK)
                .await
            {
                Ok(entry) if entry.is_some() == live => {}
                Ok(entry) => self.problem(format!(
                    "wait_newer_than({uid}) returned {entry:?}, but the pod is {}",
                    if live { "there" } else { "gone" }
                )),
                Err(()) => self.problem(format!("wait_newer_than({uid}) timed out")),
            }
        }
        if let Err(e) = self.pleg.health().check() {
            self.problem(format!("unhealthy after the faults: {e}"));
        }
        // Every event of the relists that converged is published before the relist
        // after them completes; a relist that lists the final state publishes what is
        // still missing. Wait for two, then longer only while something is missing.
        let deadline = Instant::now() + SLACK;
        let mut problems;
        loop {
            let target = global_relists(&self.metrics) + 2;
            let m = self.metrics.clone();
            eventually(SLACK, || global_relists(&m) >= target).await;
            self.drain_checker();
            problems = self.side.truth.check_events(&self.checked, true);
            let only_incomplete = problems.iter().all(|p| p.contains("incomplete"));
            if problems.is_empty() || !only_incomplete || Instant::now() >= deadline {
                break;
            }
        }
        self.problems.extend(problems);
        self.check_subscribers();
        self.check_bounds().await;
        convergence
    }

    /// The slow subscriber saw a subsequence of the checker's events, with every gap
    /// told as `missed`; the publisher counted every drop.
    fn check_subscribers(&mut self) {
        self.slow_seen.extend(self.slow.try_iter());
        let total = self.checked.len() as u64;
        let mut prev = 0u64;
        let mut bad = Vec::new();
        for d in &self.slow_seen {
            if d.seq != prev + d.missed + 1 {
                bad.push(format!(
                    "slow subscriber: seq {} after {prev} with missed {}",
                    d.seq, d.missed
                ));
            }
            let same = usize::try_from(d.seq)
                .ok()
                .and_then(|s| self.checked.get(s.wrapping_sub(1)))
                .is_some_and(|c| Arc::ptr_eq(&c.event, &d.event));
            if !same {
                bad.push(format!(
                    "slow subscriber: seq {} is not the checker's event {}",
                    d.seq, d.seq
                ));
            }
            prev = d.seq;
        }
        let slow_drops = total.saturating_sub(self.slow_seen.len() as u64);
        let discards = self.metrics.discard_events.get();
        if discards < slow_drops || (!self.extra_subs_used && discards != slow_drops) {
            bad.push(format!(
                "discard counter {discards}, but the slow subscriber lost {slow_drops}"
            ));
        }
        if self.metrics.subscriber_drops.get() != discards {
            bad.push("subscriber_drops != discard_events".into());
        }
        let counted: u64 = RelistSource::ALL
            .iter()
            .map(|s| self.metrics.events(*s))
            .sum();
        if counted != total {
            bad.push(format!(
                "events_total says {counted}, the checker received {total}"
            ));
        }
        let dropped: u64 = RelistSource::ALL
            .iter()
            .map(|s| self.metrics.requests(RequestResult::Dropped, *s))
            .sum();
        if dropped < self.storm_drops {
            bad.push(format!(
                "{} storm requests dropped, {dropped} counted",
                self.storm_drops
            ));
        }
        self.problems.extend(bad);
    }

    async fn check_bounds(&mut self) {
        let evented = self.schedule.config.evented;
        let (rt, m, pleg) = (
            self.side.rt.clone(),
            self.metrics.clone(),
            self.pleg.clone(),
        );
        let want_streams = usize::from(evented);
        if !eventually(SLACK, || rt.event_streams() == want_streams).await {
            self.problem(format!(
                "{} event streams open after the faults (want {want_streams})",
                rt.event_streams()
            ));
        }
        if evented {
            let ok = eventually_async(SLACK, || async {
                pleg.watcher_state()
                    .await
                    .is_some_and(|s| s.live_futures == 1)
            })
            .await;
            if !ok {
                let st = pleg.watcher_state().await;
                self.problem(format!("stream watcher after the faults: {st:?}"));
            }
        }
        let settled = eventually(SLACK, || {
            m.sync_gates.get() == 0 && pleg.held_pods() == 0 && m.queue_depth.get() == 0
        })
        .await;
        if !settled {
            self.problem(format!(
                "not idle: {} sync gates, {} held pods, queue depth {}",
                m.sync_gates.get(),
                pleg.held_pods(),
                m.queue_depth.get()
            ));
        }
        if !eventually(SLACK, || m.subscribers.get() == 2).await {
            self.problem(format!("{} subscribers, 2 remain", m.subscribers.get()));
        }
    }

    /// Stops plegd and the server; checks that nothing is left open.
    async fn teardown(&mut self) {
        for hold in self.holds.iter_mut().filter_map(Option::take) {
            drop(hold);
        }
        self.pleg.stop();
        let pleg = self.pleg.clone();
        if !eventually(SLACK, || pleg.stopped()).await {
            self.problem("plegd did not stop".into());
        }
        if self.schedule.config.evented {
            let rt = self.side.rt.clone();
            if !eventually(SLACK, || rt.event_streams() == 0).await {
                self.problem(format!(
                    "{} event streams open after stop",
                    rt.event_streams()
                ));
            }
        }
        self.pleg.close_publisher().await;
        self.side.stop_server().await;
    }
}

/// Runs `schedule` inside the current actix System; returns the problems and stats.
pub async fn run(schedule: Schedule) -> (Vec<String>, Stats) {
    let cfg = schedule.config.clone();
    let mut side = RuntimeSide::new(&schedule);
    let mut dir: Option<TempDir> = None;
    let client: Arc<dyn RuntimeClient> = match cfg.transport {
        Transport::Direct => Arc::new(side.rt.clone()),
        Transport::Cri | Transport::Process => {
            let d = match tempfile::tempdir() {
                Ok(d) => d,
                Err(e) => return (vec![format!("harness: tempdir: {e}")], Stats::default()),
            };
            let endpoint = match side.serve(&d.path().join("cri.sock")) {
                Ok(s) => s,
                Err(e) => return (vec![format!("harness: server: {e}")], Stats::default()),
            };
            let client = match CriRuntime::new(&endpoint, REQUEST_TIMEOUT) {
                Ok(c) => c,
                Err(e) => return (vec![format!("harness: client: {e}")], Stats::default()),
            };
            dir = Some(d);
            Arc::new(client)
        }
    };
    let reconnect = match ReconnectPolicy::new(
        cfg.reconnect_base,
        cfg.reconnect_cap,
        Duration::from_secs(1),
    ) {
        Ok(p) => p,
        Err(e) => return (vec![format!("harness: policy: {e}")], Stats::default()),
    };
    let metrics = Arc::new(Metrics::new());
    let pleg = Pleg::start(
        client,
        &PlegConfig {
            relist_period: cfg.relist_period,
            queue_capacity: cfg.queue_capacity,
            status_concurrency: cfg.status_concurrency,
            hint_sources: if cfg.evented {
                vec![plegd_actors::HintSourceName::CriEvents]
            } else {
                vec![]
            },
            reconnect,
            gate_idle: cfg.gate_idle,
            ..PlegConfig::default()
        },
        metrics.clone(),
    );
    let (checker, slow) = match (
        pleg.subscribe("chaos-check", CHECKER_CAPACITY).await,
        pleg.subscribe("chaos-slow", cfg.slow_capacity).await,
    ) {
        (Ok(c), Ok(s)) => (c, s),
        _ => return (vec!["harness: subscribe failed".into()], Stats::default()),
    };
    let steps = schedule.steps.clone();
    let mut x = Exec {
        holds: (0..schedule.hold_slots).map(|_| None).collect(),
        extra_subs: (0..schedule.sub_slots).map(|_| None).collect(),
        schedule,
        side,
        pleg,
        metrics: metrics.clone(),
        extra_subs_used: false,
        checker,
        slow,
        checked: vec![],
        slow_seen: vec![],
        storm_drops: 0,
        problems: vec![],
    };
    for (i, timed) in steps.iter().enumerate() {
        if !timed.pause.is_zero() {
            tokio::time::sleep(timed.pause).await;
        }
        x.drain_checker();
        x.step(&timed.step).await;
        x.sample_bounds(i).await;
    }
    x.heal().await;
    let convergence = x.check(Instant::now()).await;
    x.teardown().await;
    let stats = Stats {
        steps: steps.len(),
        transitions: x.side.truth.transitions(),
        events: x.checked.len(),
        slow_subscriber_drops: (x.checked.len() - x.slow_seen.len().min(x.checked.len())) as u64,
        storm_drops: x.storm_drops,
        global_relists: global_relists(&metrics),
        reconnect_attempts: metrics.reconnect_attempts.get(),
        list_errors: metrics.relist_errors(plegd_telemetry::RelistPhase::List),
        status_errors: metrics.relist_errors(plegd_telemetry::RelistPhase::Status),
        convergence,
        relist_period: x.schedule.config.relist_period,
        ..Stats::default()
    };
    let mut problems = std::mem::take(&mut x.side.problems);
    problems.append(&mut x.problems);
    drop(x);
    drop(dir);
    (problems, stats)
}
