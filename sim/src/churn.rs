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

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::fake::FakeRuntime;
use plegd_runtime::ContainerState;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::SimError;

/// The namespace of every churn pod.
pub const NAMESPACE: &str = "demo";

/// Exit codes a churned container exits with: success, failure, OOM-killed/SIGKILL.
const EXIT_CODES: [i32; 3] = [0, 1, 137];

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
    uid: String,
    name: String,
    sandbox_id: String,
    ready: bool,
    containers: Vec<&'static str>,
}

/// The churn state machine over a runtime.
pub struct Churn {
    runtime: FakeRuntime,
    rng: StdRng,
    pods: Vec<ChurnPod>,
    next_pod: u64,
    stats: ChurnStats,
}

impl Churn {
    /// Creates `pods` pods, each with one or two running containers.
    pub fn new(runtime: FakeRuntime, pods: usize, seed: u64) -> Self {
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
        self.pods.iter().map(|p| p.uid.clone()).collect()
    }

    /// Takes one random step.
    pub fn step(&mut self) -> ChurnStep {
        let step = self.pick_and_take();
        self.stats.record(step);
        step
    }

    fn pick_and_take(&mut self) -> ChurnStep {
        if self.pods.is_empty() {
            return ChurnStep::Idle;
        }
        // Repair first: a sandbox removed behind our back can take no containers.
        if let Some(i) = self.pods.iter().position(|p| !self.sandbox_exists(p)) {
            self.replace_pod(i);
            return ChurnStep::PodReplaced;
        }
        let mut running = Vec::new();
        let mut exited = Vec::new();
        for (i, pod) in self.pods.iter().enumerate().filter(|(_, p)| p.ready) {
            let statuses = self.runtime.containers_of(&pod.sandbox_id);
            for name in &pod.containers {
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
                self.runtime.exit_container(id, code);
            }
            ChurnStep::ContainerRestarted => {
                let (i, name) = exited[self.rng.random_range(0..exited.len())];
                let pod = &self.pods[i];
                self.start_container(&pod.sandbox_id, name);
            }
            ChurnStep::SandboxStopped => {
                let ready: Vec<usize> = (0..self.pods.len())
                    .filter(|&i| self.pods[i].ready)
                    .collect();
                let i = ready[self.rng.random_range(0..ready.len())];
                self.runtime.stop_pod(&self.pods[i].sandbox_id);
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

    fn sandbox_exists(&self, pod: &ChurnPod) -> bool {
        self.runtime
            .sandboxes_of(&pod.uid)
            .contains(&pod.sandbox_id)
    }

    /// Create + start; a sandbox that vanished meanwhile is caught by the next step.
    fn start_container(&self, sandbox_id: &str, name: &str) {
        if let Some(id) = self.runtime.try_create_container(sandbox_id, name) {
            self.runtime.start_container(&id);
        }
    }

    fn new_pod(&mut self) -> ChurnPod {
        let n = self.next_pod;
        self.next_pod += 1;
        let containers = if self.rng.random_bool(0.5) {
            vec!["app", "sidecar"]
        } else {
            vec!["app"]
        };
        let uid = format!("sim-pod-{n}");
        let name = format!("web-{n}");
        let sandbox_id = self.runtime.run_pod(&uid, &name, NAMESPACE);
        for c in &containers {
            self.start_container(&sandbox_id, c);
        }
        ChurnPod {
            uid,
            name,
            sandbox_id,
            ready: true,
            containers,
        }
    }

    fn replace_pod(&mut self, i: usize) {
        let old = self.pods[i].sandbox_id.clone();
        self.runtime.stop_pod(&old);
        self.runtime.remove_pod(&old);
        self.pods[i] = self.new_pod();
    }

    fn recreate_sandbox(&mut self, i: usize) {
        let pod = &self.pods[i];
        let old = pod.sandbox_id.clone();
        let sandbox_id = self.runtime.run_pod(&pod.uid, &pod.name, NAMESPACE);
        for c in &pod.containers {
            self.start_container(&sandbox_id, c);
        }
        self.runtime.remove_pod(&old);
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
pub fn spawn_churn(runtime: FakeRuntime, cfg: ChurnConfig) -> Result<ChurnHandle, SimError> {
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
