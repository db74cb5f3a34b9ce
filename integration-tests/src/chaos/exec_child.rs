//! Runs one restart-suite schedule against plegd's own binary as a child process on
//! a state dir, over the simulated CRI server: the runtime side applies the workload
//! and faults as in the actors suite; plegd is stopped (SIGTERM, or SIGKILL at
//! whatever it was doing) and started again on its state, sometimes while the runtime
//! is down too. A subscriber watches plegd's API throughout and resumes by revision
//! after each restart. After the faults: plegd's ListPods converges to the runtime;
//! the subscriber's account across all restarts is exact (revisions 1..=N, each once,
//! one instance id: `resuming_watch`) and is what a correct Generic PLEG could have
//! published (`truth`, as in the actors suite); a replay of plegd's whole history
//! gives every revision the content it was first shown with (none reissued after a
//! kill); plegd stops cleanly at the end.
//!
//! The sampling check needs no change for restarts: the first relist after a restart
//! diffs the stored records against the runtime, which is one more sample of each
//! ID's history, so the states it went through while plegd was down are legitimately
//! never published (as after any gap between two relists).
//!
//! A start while the runtime is down fails plegd's start-up check (exit 1); the
//! executor then starts it again at the next step, as a supervisor would.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use plegd_actors::Delivery;
use plegd_api::v1::{self, watch_response::Kind};
use tempfile::TempDir;

use super::exec::{eventually, Stats, SLACK};
use super::plegd_child::PlegdChild;
use super::resuming_watch::{check_stream, ResumingWatch};
use super::runtime_side::RuntimeSide;
use super::schedule::{pod_ref, Schedule, Step};
use super::truth::St;

/// Lines of plegd's log shown with a problem about it.
const LOG_LINES: usize = 15;

struct ChildExec {
    schedule: Schedule,
    side: RuntimeSide,
    plegd: PlegdChild,
    watch: ResumingWatch,
    /// plegd should be running (not between a stop and a start step).
    want_running: bool,
    /// The runtime's `downs` when plegd last started, and whether it was down then:
    /// either explains a failed start.
    downs_at_start: u64,
    down_at_start: bool,
    stats: Stats,
    problems: Vec<String>,
}

/// A ListPods answer as states: pod UID → (ID → state), or why not.
type Listed = BTreeMap<String, BTreeMap<String, St>>;

fn sandbox_st(state: i32) -> St {
    match v1::SandboxState::try_from(state) {
        Ok(v1::SandboxState::SandboxReady) => St::Running,
        Ok(v1::SandboxState::SandboxNotReady) => St::Exited,
        _ => St::Unknown,
    }
}

fn container_st(state: i32) -> St {
    match v1::ContainerState::try_from(state) {
        Ok(v1::ContainerState::ContainerRunning) => St::Running,
        Ok(v1::ContainerState::ContainerExited) => St::Exited,
        _ => St::Unknown,
    }
}

/// plegd's ListPods at `socket`: its revision and the pods' states; None while it
/// does not answer. A pod whose last read failed, or that names itself wrongly, is
/// listed with no states and a marker ID, so it never equals the runtime.
async fn list(socket: &Path) -> Option<(u64, Listed)> {
    let mut client = plegd_api::connect(socket).await.ok()?;
    let resp = client
        .list_pods(v1::ListPodsRequest {})
        .await
        .ok()?
        .into_inner();
    let mut out = Listed::new();
    for pod in resp.pods {
        let mut states = BTreeMap::new();
        let named = (0..super::schedule::POD_SLOTS).map(pod_ref).any(|p| {
            p.uid == pod.pod_uid && p.name == pod.pod_name && p.namespace == pod.pod_namespace
        });
        if pod.error.is_some() || !named {
            states.insert(
                format!("<error {:?}, named {named}>", pod.error),
                St::Unknown,
            );
        }
        for sb in &pod.sandboxes {
            states.insert(sb.sandbox_id.clone(), sandbox_st(sb.state));
        }
        for c in &pod.containers {
            states.insert(c.container_id.clone(), container_st(c.state));
        }
        out.insert(pod.pod_uid, states);
    }
    Some((resp.revision, out))
}

/// ListPods shows the runtime's state of every pod, sandbox and container. ListPods
/// shows a sandbox as its events left it (ready after its start, not ready after its
/// death; unknown only before either), and no event tells an unknown state: a
/// sandbox the runtime reports unknown may be listed in any state.
fn lists_the_runtime(listed: &Listed, wanted: &Listed, is_sandbox: impl Fn(&str) -> bool) -> bool {
    listed.len() == wanted.len()
        && listed.iter().all(|(uid, got)| {
            let Some(want) = wanted.get(uid) else {
                return false;
            };
            got.len() == want.len()
                && got.iter().all(|(id, st)| match want.get(id) {
                    Some(St::Unknown) if is_sandbox(id) => true,
                    Some(w) => w == st,
                    None => false,
                })
        })
}

/// Replays plegd's whole history (since revision 0, the first instance's id) up to
/// `upto`; the events by revision, or why not.
async fn replay(socket: &Path, instance: &str, upto: u64) -> Result<Vec<v1::Event>, String> {
    let mut client = plegd_api::connect(socket)
        .await
        .map_err(|e| e.to_string())?;
    let request = v1::WatchRequest {
        since_revision: Some(0),
        instance_id: instance.to_string(),
        ..v1::WatchRequest::default()
    };
    let mut stream = client
        .watch(request)
        .await
        .map_err(|s| format!("{:?} {}", s.code(), s.message()))?
        .into_inner();
    let mut events = Vec::new();
    while events.last().map_or(0, |e: &v1::Event| e.revision) < upto {
        let next = tokio::time::timeout(SLACK, stream.message()).await;
        match next {
            Ok(Ok(Some(msg))) => match msg.kind {
                Some(Kind::Event(e)) => events.push(e),
                Some(Kind::Gap(g)) => return Err(format!("the replay lost events: {g:?}")),
                _ => {}
            },
            Ok(Ok(None)) => return Err("the replay ended early".into()),
            Ok(Err(s)) => return Err(format!("the replay failed: {:?} {}", s.code(), s.message())),
            Err(_) => return Err(format!("the replay stalled before revision {upto}")),
        }
    }
    Ok(events)
}

/// An event as the account compares it: everything but the stream's seq and missed.
fn content(e: &v1::Event) -> v1::Event {
    v1::Event {
        seq: 0,
        missed: 0,
        ..e.clone()
    }
}

impl ChildExec {
    fn problem(&mut self, p: String) {
        self.problems.push(p);
    }

    fn start_plegd(&mut self) {
        self.downs_at_start = self.side.downs;
        self.down_at_start = self.side.down;
        if let Err(e) = self.plegd.start() {
            self.problem(format!("harness: {e}"));
        }
    }

    /// The runtime was down at some moment since plegd last started.
    fn runtime_was_down(&self) -> bool {
        self.down_at_start || self.side.down || self.side.downs != self.downs_at_start
    }

    /// plegd exited by itself: a failed start while the runtime was down is what a
    /// supervisor restarts; anything else is a problem. Either way it starts again.
    fn supervise(&mut self) {
        if !self.want_running {
            return;
        }
        let Some(status) = self.plegd.exited() else {
            return;
        };
        if status.code() == Some(1) && self.runtime_was_down() {
            self.stats.failed_starts += 1;
        } else {
            let tail = self.plegd.log_tail(LOG_LINES);
            self.problem(format!(
                "plegd (start {}) exited by itself ({status}); its log:\n    {tail}",
                self.plegd.starts
            ));
        }
        self.start_plegd();
    }

    async fn step(&mut self, step: &Step) {
        self.supervise();
        if self.side.apply(step).await {
            return;
        }
        match step {
            Step::PlegdStop { kill } => {
                // A clean stop of a plegd that serves: a SIGTERM before plegd has
                // installed its handler ends it by the signal, as for any process.
                // (A kill lands wherever plegd is, its start included.)
                let serving = *kill || self.wait_serving().await;
                self.want_running = false;
                if !self.plegd.running() {
                    // It had exited by itself (a failed start): said by supervise.
                    return;
                }
                match self.plegd.stop(*kill).await {
                    Ok(_) if *kill => self.stats.kills += 1,
                    Ok(status) if status.success() => self.stats.clean_stops += 1,
                    // It may have failed its start-up check before the signal came, or
                    // not have installed its handler yet.
                    Ok(status)
                        if !serving
                            && (status.code() == Some(1) && self.runtime_was_down()
                                || status.code().is_none()) =>
                    {
                        self.stats.failed_starts += 1;
                    }
                    Ok(status) => {
                        let tail = self.plegd.log_tail(LOG_LINES);
                        self.problem(format!(
                            "plegd (start {}) exited with {status} after SIGTERM; its log:\n    {tail}",
                            self.plegd.starts
                        ));
                    }
                    Err(e) => self.problem(format!("stopping plegd: {e}")),
                }
            }
            Step::PlegdStart => {
                self.want_running = true;
                self.start_plegd();
            }
            // The actors suite's consumer steps: not in this suite's schedules.
            _ => {}
        }
    }

    /// Waits until plegd answers ListPods (false if it does not within the slack, or
    /// cannot now: the runtime is down, so its start fails).
    async fn wait_serving(&mut self) -> bool {
        let deadline = Instant::now() + SLACK;
        while Instant::now() < deadline {
            self.supervise();
            if list(&self.plegd.api_socket()).await.is_some() {
                return true;
            }
            if self.side.down {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        false
    }

    /// plegd's ListPods differs from the runtime: how, or None when equal.
    async fn list_diff(&mut self) -> Option<String> {
        self.supervise();
        let Some((_, listed)) = list(&self.plegd.api_socket()).await else {
            return Some("ListPods did not answer".into());
        };
        let wanted = self.side.wanted();
        let rt = &self.side.rt;
        (!lists_the_runtime(&listed, &wanted, |id| rt.sandbox(id).is_some()))
            .then(|| format!("ListPods {listed:?}; runtime {wanted:?}"))
    }

    /// The subscriber's account across every restart, checked; the account.
    fn account(&mut self, final_check: bool) -> (Vec<v1::Event>, Vec<String>) {
        let (account, mut problems) = check_stream(&self.watch.got());
        let deliveries: Vec<Delivery> = account
            .iter()
            .filter_map(|e| match plegd_api::convert::received(e) {
                Ok(r) => Some(Delivery {
                    seq: e.revision,
                    missed: 0,
                    event: Arc::new(r.event),
                }),
                Err(err) => {
                    problems.push(format!("unreadable event: {err}"));
                    None
                }
            })
            .collect();
        problems.extend(self.side.truth.check_events(&deliveries, final_check));
        (account, problems)
    }

    /// After the faults: convergence, then the account, the replay and the bounds.
    async fn check(&mut self, healed: Instant) {
        let period = self.schedule.config.relist_period;
        let deadline = healed + period + SLACK;
        let mut diff = self.list_diff().await;
        while diff.is_some() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
            diff = self.list_diff().await;
        }
        self.stats.convergence = healed.elapsed();
        if let Some(diff) = diff {
            self.problem(format!(
                "no convergence {:?} after the faults stopped: {diff}",
                self.stats.convergence
            ));
        }
        // Every revision plegd lists has reached the subscriber; a relist that lists
        // the final state publishes what is still missing. Wait for that, longer only
        // while something is missing.
        let deadline = Instant::now() + SLACK;
        let (account, problems) = loop {
            tokio::time::sleep(period * 2).await;
            self.supervise();
            let latest = list(&self.plegd.api_socket()).await.map_or(0, |(r, _)| r);
            let watch = &self.watch;
            let caught_up =
                eventually(SLACK, || watch.stopped() || watch.last_revision() >= latest).await;
            if !caught_up {
                self.problem(format!(
                    "the subscriber reached revision {}, plegd lists {latest}",
                    self.watch.last_revision()
                ));
            }
            let (account, problems) = self.account(true);
            let only_incomplete = problems.iter().all(|p| p.contains("incomplete"));
            if problems.is_empty() || !only_incomplete || Instant::now() >= deadline {
                break (account, problems);
            }
        };
        self.stats.events = account.len();
        self.problems.extend(problems);
        self.check_replay(&account).await;
        if self.schedule.config.evented {
            let rt = self.side.rt.clone();
            if !eventually(SLACK, || rt.event_streams() == 1).await {
                self.problem(format!(
                    "{} event streams open after the faults (want 1)",
                    rt.event_streams()
                ));
            }
        }
    }

    /// The history replayed from the start holds, at each revision, the event the
    /// subscriber was shown with it: no revision was issued twice with different
    /// content (as a plegd killed after showing an event it had not stored would).
    async fn check_replay(&mut self, account: &[v1::Event]) {
        let Some(last) = account.last().map(|e| e.revision) else {
            return;
        };
        let instance = self
            .watch
            .got()
            .iter()
            .find_map(|g| match g {
                super::resuming_watch::Got::Hello { instance_id, .. } => Some(instance_id.clone()),
                _ => None,
            })
            .unwrap_or_default();
        match replay(&self.plegd.api_socket(), &instance, last).await {
            Err(e) => self.problem(format!("replay of the history: {e}")),
            Ok(replayed) => {
                let by_rev: BTreeMap<u64, &v1::Event> =
                    replayed.iter().map(|e| (e.revision, e)).collect();
                let mut differ = 0;
                for e in account {
                    match by_rev.get(&e.revision) {
                        Some(r) if content(r) == content(e) => {}
                        Some(r) => {
                            differ += 1;
                            if differ <= 5 {
                                self.problems.push(format!(
                                    "revision {} was shown as {:?}, the history now holds {:?}",
                                    e.revision,
                                    content(e),
                                    content(r)
                                ));
                            }
                        }
                        None => self
                            .problems
                            .push(format!("revision {} is not in the history", e.revision)),
                    }
                }
                if differ > 5 {
                    self.problem(format!("{differ} revisions differ in all"));
                }
            }
        }
    }

    /// Stops plegd cleanly (exit 0) and the server.
    async fn teardown(&mut self) {
        self.want_running = false;
        if self.plegd.running() {
            match self.plegd.stop(false).await {
                Ok(s) if s.success() => {}
                Ok(s) => {
                    let tail = self.plegd.log_tail(LOG_LINES);
                    self.problem(format!(
                        "plegd exited with {s} at the end; its log:\n    {tail}"
                    ));
                }
                Err(e) => self.problem(format!("stopping plegd at the end: {e}")),
            }
        }
        let rt = self.side.rt.clone();
        if !eventually(SLACK, || rt.event_streams() == 0).await {
            self.problem(format!(
                "{} event streams open after plegd stopped",
                rt.event_streams()
            ));
        }
        self.side.stop_server().await;
    }
}

/// Runs `schedule` (restart suite) with plegd's binary at `plegd_binary`; returns the
/// problems and stats. Must run inside a tokio runtime.
pub async fn run(schedule: Schedule, plegd_binary: &Path) -> (Vec<String>, Stats) {
    let dir: TempDir = match tempfile::Builder::new().prefix("chaos-").tempdir() {
        Ok(d) => d,
        Err(e) => return (vec![format!("harness: tempdir: {e}")], Stats::default()),
    };
    let mut side = RuntimeSide::new(&schedule);
    let endpoint = match side.serve(&dir.path().join("cri.sock")) {
        Ok(e) => e,
        Err(e) => return (vec![format!("harness: server: {e}")], Stats::default()),
    };
    let plegd = PlegdChild::new(plegd_binary, dir.path(), &endpoint, &schedule.config);
    let socket: PathBuf = plegd.api_socket();
    let steps = schedule.steps.clone();
    let mut x = ChildExec {
        stats: Stats {
            steps: steps.len(),
            relist_period: schedule.config.relist_period,
            ..Stats::default()
        },
        schedule,
        side,
        plegd,
        watch: ResumingWatch::start(socket),
        want_running: true,
        downs_at_start: 0,
        down_at_start: false,
        problems: vec![],
    };
    x.start_plegd();
    for timed in &steps {
        if !timed.pause.is_zero() {
            tokio::time::sleep(timed.pause).await;
        }
        x.step(&timed.step).await;
    }
    x.side.heal().await;
    if !x.plegd.running() {
        x.want_running = true;
        x.start_plegd();
    }
    x.check(Instant::now()).await;
    x.teardown().await;
    x.stats.transitions = x.side.truth.transitions();
    let stats = x.stats.clone();
    let mut problems = std::mem::take(&mut x.side.problems);
    problems.append(&mut x.problems);
    if !problems.is_empty() {
        problems.push(format!(
            "plegd's warnings and errors (RUST_LOG=warn), by start:{}",
            x.plegd.logs(LOG_LINES)
        ));
    }
    drop(x);
    if !problems.is_empty() {
        // plegd's logs and its state dir (as the final clean stop left it), to look
        // into.
        problems.push(format!("kept: {}", dir.keep().display()));
    }
    (problems, stats)
}
