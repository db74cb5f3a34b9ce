//! A churn workload for `plegd demo`: a roughly constant set of pods whose containers
//! exit and restart, and which are now and then replaced or lose their sandbox — the
//! lifecycle events a busy node produces, reproducibly from a seed.
//!
//! [`Churn`] is the deterministic state machine (one [`Churn::step`] at a time, for
//! tests); [`spawn_churn`] runs it on an OS thread. A thread rather than a tokio task
//! because `FakeRuntime`'s scripting is synchronous and plegd runs on actix's
//! single-threaded runtime, which churn must not occupy.
//!
//! Churn assumes it is the only writer of its pods' sandbox states; container states
//! are read back from the runtime each step, so containers stopped by someone else
//! are restarted like any other. A pod whose sandbox was removed by someone else is
//! replaced.
//!
//! Churn acts through [`ChurnRuntime`]: [`FakeRuntime`] implements it in memory, and
//! the compose demo's workload generator (`workload/`) implements it over CRI, so the
//! demo against containerd churns pods exactly as `plegd demo` does. A failed runtime
//! call is logged and counted, never fatal: the next step reads the state again.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::fake::FakeRuntime;
use plegd_runtime::{Container, ContainerState, PodRef, RuntimeError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::SimError;

/// The namespace of every churn pod.
pub const NAMESPACE: &str = "demo";

/// Exit codes a churned container exits with: success, failure, OOM-killed/SIGKILL.
const EXIT_CODES: [i32; 3] = [0, 1, 137];

/// The runtime operations churn performs: a kubelet's share of CRI.
pub trait ChurnRuntime {
    /// RunPodSandbox for the pod: a new ready sandbox (the pod's next attempt); its ID.
    fn run_sandbox(&self, pod: &PodRef) -> Result<String, RuntimeError>;
    /// StopPodSandbox: the sandbox's running containers are killed, it turns not ready.
    fn stop_sandbox(&self, sandbox_id: &str) -> Result<(), RuntimeError>;
    /// RemovePodSandbox: the sandbox and its containers go away.
    fn remove_sandbox(&self, sandbox_id: &str) -> Result<(), RuntimeError>;
    /// The IDs of the pod's sandboxes, in any state.
    fn pod_sandboxes(&self, pod_uid: &str) -> Result<Vec<String>, RuntimeError>;
    /// The sandbox's containers, in any state.
    fn sandbox_containers(&self, sandbox_id: &str) -> Result<Vec<Container>, RuntimeError>;
    /// CreateContainer + StartContainer: the next attempt of container `name`; its ID.
    fn launch_container(
        &self,
        pod: &PodRef,
        sandbox_id: &str,
        name: &str,
    ) -> Result<String, RuntimeError>;
    /// Makes a running container exit, with `exit_code` where the runtime lets the
    /// caller choose (a real one does not: it stops the container with a signal).
    fn end_container(&self, container_id: &str, exit_code: i32) -> Result<(), RuntimeError>;
}

impl ChurnRuntime for FakeRuntime {
    fn run_sandbox(&self, pod: &PodRef) -> Result<String, RuntimeError> {
        Ok(self.run_pod(&pod.uid, &pod.name, &pod.namespace))
    }

    fn stop_sandbox(&self, sandbox_id: &str) -> Result<(), RuntimeError> {
        self.stop_pod(sandbox_id);
        Ok(())
    }

    fn remove_sandbox(&self, sandbox_id: &str) -> Result<(), RuntimeError> {
        self.remove_pod(sandbox_id);
        Ok(())
    }

    fn pod_sandboxes(&self, pod_uid: &str) -> Result<Vec<String>, RuntimeError> {
        Ok(self.sandboxes_of(pod_uid))
    }

    fn sandbox_containers(&self, sandbox_id: &str) -> Result<Vec<Container>, RuntimeError> {
        Ok(self
            .containers_of(sandbox_id)
            .into_iter()
            .map(|c| Container {
                id: c.id,
                sandbox_id: c.sandbox_id,
                name: c.name,
                attempt: c.attempt,
                state: c.state,
                created_at: c.created_at,
            })
            .collect())
    }

    fn launch_container(
        &self,
        _pod: &PodRef,
        sandbox_id: &str,
        name: &str,
    ) -> Result<String, RuntimeError> {
        let id = self
            .try_create_container(sandbox_id, name)
            .ok_or_else(|| RuntimeError::Rpc {
                op: "CreateContainer",
                code: tonic::Code::NotFound,
                message: format!("sandbox {sandbox_id} not found"),
            })?;
        self.start_container(&id);
        Ok(id)
    }

    fn end_container(&self, container_id: &str, exit_code: i32) -> Result<(), RuntimeError> {
        self.exit_container(container_id, exit_code);
        Ok(())
    }
}

/// What [`spawn_churn`] runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChurnConfig {
    /// Pods kept alive (one sandbox each, briefly two while one is being replaced).
    pub pods: usize,
    /// Time between steps.
    pub period: Duration,
    /// Seed of the step sequence.
    pub seed: u64,
}

impl Default for ChurnConfig {
    fn default() -> Self {
        ChurnConfig {
            pods: 10,
            period: Duration::from_millis(500),
            seed: 0,
        }
    }
}

/// What one step did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ChurnStep {
    /// Nothing to do (no pods).
    Idle,
    /// A running container exited (code 0, 1 or 137).
    ContainerExited,
    /// An exited container got a successor: same name, attempt + 1, running.
    ContainerRestarted,
    /// A pod was stopped and removed, and a new pod created in its place.
    PodReplaced,
    /// A pod's sandbox stopped (its running containers exit 137).
    SandboxStopped,
    /// A pod with a stopped sandbox got a new sandbox (attempt + 1) and fresh
    /// containers; the old sandbox was removed.
    SandboxRecreated,
}

/// Counts of steps taken, by kind.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChurnStats {
    pub steps: u64,
    pub exits: u64,
    pub restarts: u64,
    pub pods_replaced: u64,
    pub sandboxes_stopped: u64,
    pub sandboxes_recreated: u64,
    /// Runtime calls that failed (logged; the step went on without them).
    pub errors: u64,
}

impl ChurnStats {
    fn record(&mut self, step: ChurnStep) {
        self.steps += 1;
        match step {
            ChurnStep::Idle => {}
            ChurnStep::ContainerExited => self.exits += 1,
            ChurnStep::ContainerRestarted => self.restarts += 1,
            ChurnStep::PodReplaced => self.pods_replaced += 1,
            ChurnStep::SandboxStopped => self.sandboxes_stopped += 1,
            ChurnStep::SandboxRecreated => self.sandboxes_recreated += 1,
        }
    }
}

struct ChurnPod {
    pod: PodRef,
    /// Empty when RunPodSandbox failed: the next step replaces the pod.
    sandbox_id: String,
    ready: bool,
    containers: Vec<&'static str>,
}

/// The churn state machine over a runtime.
pub struct Churn<R = FakeRuntime> {
    runtime: R,
    rng: StdRng,
    pods: Vec<ChurnPod>,
    next_pod: u64,
    stats: ChurnStats,
}

impl<R> std::fmt::Debug for Churn<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Churn")
            .field("pods", &self.pods.len())
            .field("next_pod", &self.next_pod)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl<R: ChurnRuntime> Churn<R> {
    /// Creates `pods` pods, each with one or two running containers.
    pub fn new(runtime: R, pods: usize, seed: u64) -> Self {
        let mut churn = Churn {
            runtime,
            rng: StdRng::seed_from_u64(seed),
            pods: Vec::with_capacity(pods),
            next_pod: 0,
            stats: ChurnStats::default(),
        };
        for _ in 0..pods {
            let pod = churn.new_pod();
            churn.pods.push(pod);
        }
        churn
    }

    /// Steps taken so far, by kind.
    pub fn stats(&self) -> &ChurnStats {
        &self.stats
    }

    /// The UIDs of the pods churn currently keeps.
    pub fn pod_uids(&self) -> Vec<String> {
        self.pods.iter().map(|p| p.pod.uid.clone()).collect()
    }

    /// The runtime churn acts on.
    pub fn runtime(&self) -> &R {
        &self.runtime
    }

    /// Takes one random step.
    pub fn step(&mut self) -> ChurnStep {
        let step = self.pick_and_take();
        self.stats.record(step);
        step
    }

    /// Stops and removes every sandbox of churn's pods (older attempts included);
    /// churn keeps no pods afterwards. Returns how many sandboxes it removed.
    pub fn remove_pods(&mut self) -> usize {
        let mut removed = 0;
        for pod in std::mem::take(&mut self.pods) {
            let mut sandboxes = self.ok(self.runtime.pod_sandboxes(&pod.pod.uid), "list sandboxes");
            let sandboxes = sandboxes.get_or_insert_with(|| vec![pod.sandbox_id.clone()]);
            for id in sandboxes.iter().filter(|id| !id.is_empty()) {
                let stopped = self.runtime.stop_sandbox(id);
                if self.ok(stopped, "stop a sandbox").is_some() {
                    let gone = self.runtime.remove_sandbox(id);
                    removed += usize::from(self.ok(gone, "remove a sandbox").is_some());
                }
            }
        }
        removed
    }

    /// The value, or `None` after logging and counting the error.
    fn ok<T>(&mut self, result: Result<T, RuntimeError>, what: &str) -> Option<T> {
        match result {
            Ok(v) => Some(v),
            Err(error) => {
                self.stats.errors += 1;
                tracing::warn!(%error, "churn: cannot {what}");
                None
            }
        }
    }

    fn pick_and_take(&mut self) -> ChurnStep {
        if self.pods.is_empty() {
            return ChurnStep::Idle;
        }
        // Repair first: a sandbox removed behind our back can take no containers.
        if let Some(i) = (0..self.pods.len()).find(|&i| !self.sandbox_exists(i)) {
            self.replace_pod(i);
            return ChurnStep::PodReplaced;
        }
        let mut running = Vec::new();
        let mut exited = Vec::new();
        for i in 0..self.pods.len() {
            if !self.pods[i].ready {
                continue;
            }
            let listed = self.runtime.sandbox_containers(&self.pods[i].sandbox_id);
            let Some(statuses) = self.ok(listed, "list containers") else {
                continue;
            };
            for name in &self.pods[i].containers {
                // The newest attempt is the container kubelet would look at.
                let latest = statuses
                    .iter()
                    .filter(|c| c.name == *name)
                    .max_by_key(|c| c.attempt);
                match latest {
                    Some(c) if c.state == ContainerState::Running => running.push(c.id.clone()),
                    // None: its creation failed; start it like an exited one.
                    Some(c) if c.state != ContainerState::Exited => {}
                    _ => exited.push((i, *name)),
                }
            }
        }
        let ready = self.pods.iter().filter(|p| p.ready).count();
        let not_ready: Vec<usize> = (0..self.pods.len())
            .filter(|&i| !self.pods[i].ready)
            .collect();
        // Weights: exits slightly outpace restarts (some containers stay down a
        // while, as in back-off); a stopped sandbox is recreated soon.
        let choices = [
            (ChurnStep::ContainerExited, 40, !running.is_empty()),
            (ChurnStep::ContainerRestarted, 30, !exited.is_empty()),
            (ChurnStep::PodReplaced, 10, true),
            (ChurnStep::SandboxStopped, 5, ready > 0),
            (ChurnStep::SandboxRecreated, 30, !not_ready.is_empty()),
        ];
        let total: u32 = choices.iter().filter(|c| c.2).map(|c| c.1).sum();
        let mut roll = self.rng.random_range(0..total);
        let mut pick = ChurnStep::PodReplaced;
        for (step, weight, applicable) in choices {
            if !applicable {
                continue;
            }
            if roll < weight {
                pick = step;
                break;
            }
            roll -= weight;
        }
        match pick {
            ChurnStep::ContainerExited => {
                let id = &running[self.rng.random_range(0..running.len())];
                let code = EXIT_CODES[self.rng.random_range(0..EXIT_CODES.len())];
                let ended = self.runtime.end_container(id, code);
                self.ok(ended, "end a container");
            }
            ChurnStep::ContainerRestarted => {
                let (i, name) = exited[self.rng.random_range(0..exited.len())];
                let sandbox_id = self.pods[i].sandbox_id.clone();
                let pod = self.pods[i].pod.clone();
                self.start_container(&pod, &sandbox_id, name);
            }
            ChurnStep::SandboxStopped => {
                let ready: Vec<usize> = (0..self.pods.len())
                    .filter(|&i| self.pods[i].ready)
                    .collect();
                let i = ready[self.rng.random_range(0..ready.len())];
                let stopped = self.runtime.stop_sandbox(&self.pods[i].sandbox_id);
                self.ok(stopped, "stop a sandbox");
                self.pods[i].ready = false;
            }
            ChurnStep::SandboxRecreated => {
                let i = not_ready[self.rng.random_range(0..not_ready.len())];
                self.recreate_sandbox(i);
            }
            ChurnStep::PodReplaced | ChurnStep::Idle => {
                let i = self.rng.random_range(0..self.pods.len());
                self.replace_pod(i);
            }
        }
        pick
    }

    /// Whether pod `i`'s sandbox exists; `true` when the runtime cannot tell (no
    /// repair on a failed read).
    fn sandbox_exists(&mut self, i: usize) -> bool {
        if self.pods[i].sandbox_id.is_empty() {
            return false;
        }
        let listed = self.runtime.pod_sandboxes(&self.pods[i].pod.uid);
        self.ok(listed, "list sandboxes")
            .is_none_or(|ids| ids.contains(&self.pods[i].sandbox_id))
    }

    /// Create + start; a sandbox that vanished meanwhile is caught by the next step.
    fn start_container(&mut self, pod: &PodRef, sandbox_id: &str, name: &str) {
        let launched = self.runtime.launch_container(pod, sandbox_id, name);
        self.ok(launched, "start a container");
    }

    /// A new sandbox for the pod, with all its containers started; empty when
    /// RunPodSandbox failed.
    fn run_sandbox(&mut self, pod: &PodRef, containers: &[&'static str]) -> String {
        let ran = self.runtime.run_sandbox(pod);
        let Some(sandbox_id) = self.ok(ran, "run a sandbox") else {
            return String::new();
        };
        for c in containers {
            self.start_container(pod, &sandbox_id, c);
        }
        sandbox_id
    }

    fn new_pod(&mut self) -> ChurnPod {
        let n = self.next_pod;
        self.next_pod += 1;
        let containers = if self.rng.random_bool(0.5) {
            vec!["app", "sidecar"]
        } else {
            vec!["app"]
        };
        let pod = PodRef {
            uid: format!("sim-pod-{n}"),
            name: format!("web-{n}"),
            namespace: NAMESPACE.into(),
        };
        let sandbox_id = self.run_sandbox(&pod, &containers);
        ChurnPod {
            pod,
            sandbox_id,
            ready: true,
            containers,
        }
    }

    fn replace_pod(&mut self, i: usize) {
        let old = self.pods[i].sandbox_id.clone();
        if !old.is_empty() {
            let stopped = self.runtime.stop_sandbox(&old);
            self.ok(stopped, "stop a sandbox");
            let removed = self.runtime.remove_sandbox(&old);
            self.ok(removed, "remove a sandbox");
        }
        self.pods[i] = self.new_pod();
    }

    fn recreate_sandbox(&mut self, i: usize) {
        let old = self.pods[i].sandbox_id.clone();
        let pod = self.pods[i].pod.clone();
        let containers = self.pods[i].containers.clone();
        let sandbox_id = self.run_sandbox(&pod, &containers);
        if !old.is_empty() {
            let removed = self.runtime.remove_sandbox(&old);
            self.ok(removed, "remove a sandbox");
        }
        let pod = &mut self.pods[i];
        pod.sandbox_id = sandbox_id;
        pod.ready = true;
    }
}

/// A running churn thread; [`stop`](Self::stop) or dropping it stops and joins it
/// (within one step). The pods it made stay in the runtime.
pub struct ChurnHandle {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    stats: Arc<Mutex<ChurnStats>>,
}

/// Creates the pods (before returning), then takes one step every `cfg.period` on a
/// thread of its own.
pub fn spawn_churn<R>(runtime: R, cfg: ChurnConfig) -> Result<ChurnHandle, SimError>
where
    R: ChurnRuntime + Send + 'static,
{
    let mut churn = Churn::new(runtime, cfg.pods, cfg.seed);
    let stats = Arc::new(Mutex::new(ChurnStats::default()));
    let shared = Arc::clone(&stats);
    let (stop, stopped) = mpsc::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("plegd-sim-churn".into())
        .spawn(move || {
            // A message or a dropped sender both mean stop.
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(cfg.period) {
                let step = churn.step();
                tracing::trace!(?step, "churn");
                *shared.lock().unwrap_or_else(PoisonError::into_inner) = churn.stats().clone();
            }
        })
        .map_err(|source| SimError::Thread { source })?;
    Ok(ChurnHandle {
        stop: Some(stop),
        thread: Some(thread),
        stats,
    })
}

impl ChurnHandle {
    /// Steps taken so far, by kind.
    pub fn stats(&self) -> ChurnStats {
        self.stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Stops the churn and waits for its thread.
    pub fn stop(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::warn!("plegd-sim churn thread panicked");
            }
        }
    }
}

impl Drop for ChurnHandle {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}
