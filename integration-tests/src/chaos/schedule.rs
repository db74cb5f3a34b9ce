//! A chaos run's whole schedule, generated up front from its seed: plegd's settings,
//! then a list of steps (workload, faults, consumers), each after a pause. Nothing
//! here looks at a clock or at plegd, so a seed always yields the same schedule; only
//! when plegd happens to look differs between two runs of a seed.
//!
//! The generator keeps a model of the runtime's state so that every step is one a
//! CRI runtime would allow (start only a created container in a ready sandbox, remove
//! only a container that is not running, ...), and so that every step changes the
//! state of at most one sandbox or container once: the executor records the runtime's
//! true history after each step, and a step with two changes to one ID would hide the
//! first from that history.

use std::time::Duration;

use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// How plegd reaches the fake runtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// The `FakeRuntime` as plegd's `RuntimeClient`, in process.
    Direct,
    /// The simulated CRI server on a unix socket, through plegd's real tonic client;
    /// a runtime restart is the server killed and started again.
    Cri,
    /// plegd's own binary as a child process on a state dir, over the simulated CRI
    /// server, checked through its API by a subscriber that resumes by revision; plegd
    /// is stopped (SIGTERM or SIGKILL) and started again on the same state.
    Process,
}

/// Which suite a schedule belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Suite {
    /// plegd's actors in the test's process (transport Direct or Cri), with the
    /// consumer steps (holds, storms, subscribers).
    Actors,
    /// plegd as a child process (transport Process) that is restarted: the consumer
    /// steps give way to plegd stops and starts, some while the runtime is down.
    Restarts,
}

/// plegd's settings and the run's shape, drawn from the seed.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub transport: Transport,
    pub relist_period: Duration,
    pub queue_capacity: usize,
    pub status_concurrency: usize,
    pub evented: bool,
    pub reconnect_base: Duration,
    pub reconnect_cap: Duration,
    pub gate_idle: Duration,
    /// The runtime sends no stream headers before its first event (containerd).
    pub quiet_until_first_event: bool,
    /// Queue of the slow subscriber, which reads rarely and so loses events.
    pub slow_capacity: usize,
}

/// The gRPC codes the faults answer with: the ones runtimes and transports really
/// produce (transport failures arrive as Unknown as often as Unavailable).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    Unavailable,
    Unknown,
    DeadlineExceeded,
    Internal,
    NotFound,
    Unimplemented,
    ResourceExhausted,
}

impl Code {
    pub fn tonic(self) -> tonic::Code {
        match self {
            Code::Unavailable => tonic::Code::Unavailable,
            Code::Unknown => tonic::Code::Unknown,
            Code::DeadlineExceeded => tonic::Code::DeadlineExceeded,
            Code::Internal => tonic::Code::Internal,
            Code::NotFound => tonic::Code::NotFound,
            Code::Unimplemented => tonic::Code::Unimplemented,
            Code::ResourceExhausted => tonic::Code::ResourceExhausted,
        }
    }
}

/// The runtime calls faults can target (the fake's `Op`, minus Version which plegd
/// does not call while running).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallOp {
    ListSandboxes,
    ListContainers,
    SandboxStatus,
    ContainerStatus,
    Events,
}

impl CallOp {
    pub const ALL: [CallOp; 5] = [
        CallOp::ListSandboxes,
        CallOp::ListContainers,
        CallOp::SandboxStatus,
        CallOp::ContainerStatus,
        CallOp::Events,
    ];

    pub fn op(self) -> plegd_sim::Op {
        match self {
            CallOp::ListSandboxes => plegd_sim::Op::ListSandboxes,
            CallOp::ListContainers => plegd_sim::Op::ListContainers,
            CallOp::SandboxStatus => plegd_sim::Op::SandboxStatus,
            CallOp::ContainerStatus => plegd_sim::Op::ContainerStatus,
            CallOp::Events => plegd_sim::Op::Events,
        }
    }
}

/// What the event filter does to each event the runtime emits, while set: each
/// probability in percent, decided per event from the seed and the event's number.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mangle {
    pub drop: u8,
    pub duplicate: u8,
    /// Held back until a [`Step::ReleaseDelayed`] (or the end).
    pub delay: u8,
    /// Sent without the pod's UID (invalid: ignored by plegd).
    pub strip_uid: u8,
    /// Sent with a created_at long past.
    pub stale: u8,
}

/// How a sync hold ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldEnd {
    Success,
    Error,
    Cancelled,
    /// The holder goes away without ending it.
    Dropped,
}

/// A raw event sent to the open streams, bypassing the filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Injected {
    /// A fresh copy of a STOPPED event about a container (it may be long gone).
    Stale { ctr: usize },
    /// A STOPPED event whose sandbox status has an empty UID.
    NoUid,
    /// A STOPPED event with no sandbox status at all.
    NoStatus,
    /// A STOPPED event about a pod that never existed.
    UnknownPod,
    /// An event type CRI does not define.
    BogusType,
}

/// Who a storm of relist requests names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StormTarget {
    Pod(usize),
    /// A UID no pod ever had.
    Ghost,
}

/// One step. Sandboxes and containers are named by their index in creation order
/// (the executor maps them to the runtime's IDs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    // ---- workload: each changes at most one sandbox or container, once ----------
    /// RunPodSandbox for pod slot `pod`: sandbox number `sandbox`.
    RunPod {
        pod: usize,
        sandbox: usize,
    },
    /// CreateContainer (number `ctr`) in `sandbox`.
    CreateContainer {
        sandbox: usize,
        ctr: usize,
        name: &'static str,
    },
    StartContainer {
        ctr: usize,
    },
    /// The process exits; `silent`: the runtime sends no event for it.
    ExitContainer {
        ctr: usize,
        code: i32,
        silent: bool,
    },
    /// The runtime loses track of a container (no event).
    ContainerUnknown {
        ctr: usize,
    },
    RemoveContainer {
        ctr: usize,
    },
    /// StopPodSandbox of a sandbox with no running container left.
    StopSandbox {
        sandbox: usize,
    },
    /// The runtime reports the sandbox's state as unknown (no event).
    SandboxUnknown {
        sandbox: usize,
    },
    /// ... and ready again.
    SandboxRecovered {
        sandbox: usize,
    },
    /// RemovePodSandbox of a stopped sandbox with no container left.
    RemoveSandbox {
        sandbox: usize,
    },

    // ---- the event stream -----------------------------------------------------
    /// Every open stream ends cleanly (EOF).
    CloseStreams,
    /// Every open stream fails with `code`.
    FailStreams(Code),
    /// From now on, emitted events go through this filter (default: untouched).
    SetMangle(Mangle),
    /// Sends the held-back events, in reverse order if `reverse`.
    ReleaseDelayed {
        reverse: bool,
    },
    Inject(Injected),

    // ---- calls ----------------------------------------------------------------
    /// The next `times` calls of `op` fail (None: until [`Step::ClearFault`]).
    FailCalls {
        op: CallOp,
        code: Code,
        times: Option<u32>,
    },
    ClearFault {
        op: CallOp,
    },
    /// Every call of `op` is delayed by `ms` (0: no delay).
    Latency {
        op: CallOp,
        ms: u64,
    },
    /// Status reads of a pod fail (or stop failing).
    PodStatusFails {
        pod: usize,
        failing: bool,
    },
    /// The runtime goes down: streams fail, every call fails (Direct) or the server
    /// is killed (Cri); events emitted meanwhile are lost.
    RuntimeDown,
    RuntimeUp,
    /// List responses padded beyond the client's message limit (Cri only).
    OversizedLists {
        on: bool,
    },

    // ---- consumers ------------------------------------------------------------
    BeginHold {
        pod: usize,
        slot: usize,
    },
    EndHold {
        slot: usize,
        how: HoldEnd,
    },
    /// `n` targeted relist requests at once, round-robin over `targets`.
    Storm {
        n: u32,
        targets: Vec<StormTarget>,
        source: StormSource,
    },
    BringForward,
    /// A subscriber with a queue of `capacity` that never reads, in `slot`.
    Subscribe {
        slot: usize,
        capacity: usize,
    },
    Unsubscribe {
        slot: usize,
    },
    /// The slow subscriber reads up to `n` events.
    ReadSlow {
        n: usize,
    },

    // ---- plegd itself (Process only) -------------------------------------------
    /// plegd stops: SIGTERM and a clean exit (status 0), or SIGKILL at whatever it was
    /// doing. Its state dir stays.
    PlegdStop {
        kill: bool,
    },
    /// plegd starts again on its state dir (while the runtime is down, as a supervisor
    /// would: again until the runtime answers its start-up check).
    PlegdStart,
}

impl Step {
    /// Every kind of step, for coverage checks of a seed list.
    pub const KINDS: &'static [&'static str] = &[
        "RunPod",
        "CreateContainer",
        "StartContainer",
        "ExitContainer",
        "SilentExit",
        "ContainerUnknown",
        "RemoveContainer",
        "StopSandbox",
        "SandboxUnknown",
        "SandboxRecovered",
        "RemoveSandbox",
        "CloseStreams",
        "FailStreams",
        "SetMangle",
        "ReleaseDelayed",
        "Inject",
        "FailCalls",
        "EventsUnimplemented",
        "SandboxNotFound",
        "ClearFault",
        "Latency",
        "PodStatusFails",
        "RuntimeDown",
        "RuntimeUp",
        "OversizedLists",
        "BeginHold",
        "EndHold",
        "DropHold",
        "Storm",
        "BringForward",
        "Subscribe",
        "Unsubscribe",
        "ReadSlow",
    ];

    /// The kinds of the restart suite's own steps.
    pub const RESTART_KINDS: &'static [&'static str] = &["PlegdStop", "PlegdKill", "PlegdStart"];

    /// This step's kind (one of [`Self::KINDS`]); a few variants are split where the
    /// difference matters to plegd (a silent exit, a dropped hold, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            Step::RunPod { .. } => "RunPod",
            Step::CreateContainer { .. } => "CreateContainer",
            Step::StartContainer { .. } => "StartContainer",
            Step::ExitContainer { silent: true, .. } => "SilentExit",
            Step::ExitContainer { .. } => "ExitContainer",
            Step::ContainerUnknown { .. } => "ContainerUnknown",
            Step::RemoveContainer { .. } => "RemoveContainer",
            Step::StopSandbox { .. } => "StopSandbox",
            Step::SandboxUnknown { .. } => "SandboxUnknown",
            Step::SandboxRecovered { .. } => "SandboxRecovered",
            Step::RemoveSandbox { .. } => "RemoveSandbox",
            Step::CloseStreams => "CloseStreams",
            Step::FailStreams(_) => "FailStreams",
            Step::SetMangle(_) => "SetMangle",
            Step::ReleaseDelayed { .. } => "ReleaseDelayed",
            Step::Inject(_) => "Inject",
            Step::FailCalls {
                code: Code::Unimplemented,
                ..
            } => "EventsUnimplemented",
            Step::FailCalls {
                code: Code::NotFound,
                ..
            } => "SandboxNotFound",
            Step::FailCalls { .. } => "FailCalls",
            Step::ClearFault { .. } => "ClearFault",
            Step::Latency { .. } => "Latency",
            Step::PodStatusFails { .. } => "PodStatusFails",
            Step::RuntimeDown => "RuntimeDown",
            Step::RuntimeUp => "RuntimeUp",
            Step::OversizedLists { .. } => "OversizedLists",
            Step::BeginHold { .. } => "BeginHold",
            Step::EndHold {
                how: HoldEnd::Dropped,
                ..
            } => "DropHold",
            Step::EndHold { .. } => "EndHold",
            Step::Storm { .. } => "Storm",
            Step::BringForward => "BringForward",
            Step::Subscribe { .. } => "Subscribe",
            Step::Unsubscribe { .. } => "Unsubscribe",
            Step::ReadSlow { .. } => "ReadSlow",
            Step::PlegdStop { kill: false } => "PlegdStop",
            Step::PlegdStop { kill: true } => "PlegdKill",
            Step::PlegdStart => "PlegdStart",
        }
    }
}

/// The `relist_source` a storm's requests claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StormSource {
    EventedPleg,
    PostSync,
    PostAllocation,
}

/// A step and the pause before it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timed {
    pub pause: Duration,
    pub step: Step,
}

/// Everything a seed decides.
#[derive(Clone, Debug)]
pub struct Schedule {
    pub seed: u64,
    pub suite: Suite,
    pub config: RunConfig,
    pub pods: usize,
    pub steps: Vec<Timed>,
    /// Hold slots and extra subscriber slots the steps use.
    pub hold_slots: usize,
    pub sub_slots: usize,
}

pub const POD_SLOTS: usize = 8;
const HOLD_SLOTS: usize = 3;
const SUB_SLOTS: usize = 2;
const CONTAINER_NAMES: [&str; 3] = ["app", "sidecar", "init"];

/// The uid, name and namespace of pod slot `i`.
pub fn pod_ref(i: usize) -> plegd_runtime::PodRef {
    plegd_runtime::PodRef {
        uid: format!("chaos-uid-{i}"),
        name: format!("web-{i}"),
        namespace: "chaos".into(),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SbState {
    Ready,
    NotReady,
    Unknown,
    Removed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CtrState {
    Created,
    Running,
    Exited,
    Unknown,
    Removed,
}

struct MSandbox {
    state: SbState,
    containers: Vec<usize>,
}

struct MContainer {
    sandbox: usize,
    name: &'static str,
    state: CtrState,
}

/// The generator's model of the runtime, updated by every workload step exactly as
/// the fake runtime will be.
#[derive(Default)]
struct Model {
    sandboxes: Vec<MSandbox>,
    containers: Vec<MContainer>,
    /// Pod slot → its sandboxes.
    pods: Vec<Vec<usize>>,
    holds: Vec<bool>,
    subs: Vec<bool>,
    down: bool,
    oversized: bool,
    plegd_down: bool,
}

impl Model {
    fn apply(&mut self, step: &Step) {
        match *step {
            Step::RunPod { pod, sandbox } => {
                debug_assert_eq!(sandbox, self.sandboxes.len());
                self.sandboxes.push(MSandbox {
                    state: SbState::Ready,
                    containers: vec![],
                });
                self.pods[pod].push(sandbox);
            }
            Step::CreateContainer { sandbox, ctr, name } => {
                debug_assert_eq!(ctr, self.containers.len());
                self.containers.push(MContainer {
                    sandbox,
                    name,
                    state: CtrState::Created,
                });
                self.sandboxes[sandbox].containers.push(ctr);
            }
            Step::StartContainer { ctr } => self.containers[ctr].state = CtrState::Running,
            Step::ExitContainer { ctr, .. } => self.containers[ctr].state = CtrState::Exited,
            Step::ContainerUnknown { ctr } => self.containers[ctr].state = CtrState::Unknown,
            Step::RemoveContainer { ctr } => self.containers[ctr].state = CtrState::Removed,
            Step::StopSandbox { sandbox } => self.sandboxes[sandbox].state = SbState::NotReady,
            Step::SandboxUnknown { sandbox } => self.sandboxes[sandbox].state = SbState::Unknown,
            Step::SandboxRecovered { sandbox } => self.sandboxes[sandbox].state = SbState::Ready,
            Step::RemoveSandbox { sandbox } => self.sandboxes[sandbox].state = SbState::Removed,
            Step::BeginHold { slot, .. } => self.holds[slot] = true,
            Step::EndHold { slot, .. } => self.holds[slot] = false,
            Step::Subscribe { slot, .. } => self.subs[slot] = true,
            Step::Unsubscribe { slot } => self.subs[slot] = false,
            Step::RuntimeDown => self.down = true,
            Step::RuntimeUp => self.down = false,
            Step::OversizedLists { on } => self.oversized = on,
            Step::PlegdStop { .. } => self.plegd_down = true,
            Step::PlegdStart => self.plegd_down = false,
            _ => {}
        }
    }

    /// A pod may get a new sandbox when it has none that runs (first start, or a
    /// recreation after its sandbox stopped), and not too many left over.
    fn may_run(&self, pod: usize) -> bool {
        let kept: Vec<SbState> = self.pods[pod]
            .iter()
            .map(|&s| self.sandboxes[s].state)
            .filter(|s| *s != SbState::Removed)
            .collect();
        kept.len() < 2 && kept.iter().all(|s| *s == SbState::NotReady)
    }

    fn sandboxes_in(&self, states: &[SbState]) -> Vec<usize> {
        (0..self.sandboxes.len())
            .filter(|&s| states.contains(&self.sandboxes[s].state))
            .collect()
    }

    fn containers_in(&self, states: &[CtrState]) -> Vec<usize> {
        (0..self.containers.len())
            .filter(|&c| states.contains(&self.containers[c].state))
            .collect()
    }

    fn running_in(&self, sandbox: usize) -> Vec<usize> {
        self.sandboxes[sandbox]
            .containers
            .iter()
            .copied()
            .filter(|&c| self.containers[c].state == CtrState::Running)
            .collect()
    }
}

struct Gen {
    rng: ChaCha8Rng,
    model: Model,
    steps: Vec<Timed>,
    transport: Transport,
    /// Steps that close a window, and the step count at which they are due.
    closes: Vec<(usize, Step)>,
}

impl Gen {
    fn pause(&mut self) -> Duration {
        // Mostly short pauses, so several changes fall between two relists; a few long
        // ones, so the runtime sometimes stays put for a whole period.
        let ms = match self.rng.random_range(0..100) {
            0..=39 => 0,
            40..=89 => self.rng.random_range(1..15),
            _ => self.rng.random_range(15..80),
        };
        Duration::from_millis(ms)
    }

    fn push(&mut self, step: Step) {
        let pause = self.pause();
        self.push_after(pause, step);
    }

    fn push_after(&mut self, pause: Duration, step: Step) {
        self.model.apply(&step);
        self.steps.push(Timed { pause, step });
    }

    /// Schedules `step` to close a window `1..=within` steps from now.
    fn close_later(&mut self, within: usize, step: Step) {
        let at = self.steps.len() + self.rng.random_range(1..=within);
        self.closes.push((at, step));
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> Option<T> {
        from.choose(&mut self.rng).copied()
    }

    fn percent(&mut self, p: u32) -> bool {
        self.rng.random_range(0..100) < p
    }

    fn code(&mut self) -> Code {
        *[
            Code::Unavailable,
            Code::Unknown,
            Code::DeadlineExceeded,
            Code::Internal,
            Code::ResourceExhausted,
        ]
        .choose(&mut self.rng)
        .unwrap_or(&Code::Unavailable)
    }

    /// One workload change; false if none was possible this time.
    fn workload(&mut self) -> bool {
        match self.rng.random_range(0..100) {
            // A pod starts (first time, or again after its sandbox stopped).
            0..=15 => {
                let free: Vec<usize> = (0..POD_SLOTS).filter(|&p| self.model.may_run(p)).collect();
                let Some(pod) = self.pick(&free) else {
                    return false;
                };
                let sandbox = self.model.sandboxes.len();
                self.push(Step::RunPod { pod, sandbox });
                // Most pods get running containers at once.
                let n = self.rng.random_range(0..=3);
                for _ in 0..n {
                    let ctr = self.model.containers.len();
                    let name = self.pick(&CONTAINER_NAMES).unwrap_or("app");
                    self.push(Step::CreateContainer { sandbox, ctr, name });
                    if self.percent(85) {
                        self.push(Step::StartContainer { ctr });
                    }
                }
                true
            }
            // A container is created (and usually started).
            16..=33 => {
                let ready: Vec<usize> = self
                    .model
                    .sandboxes_in(&[SbState::Ready])
                    .into_iter()
                    .filter(|&s| self.model.sandboxes[s].containers.len() < 6)
                    .collect();
                let Some(sandbox) = self.pick(&ready) else {
                    return false;
                };
                let ctr = self.model.containers.len();
                let name = self.pick(&CONTAINER_NAMES).unwrap_or("app");
                self.push(Step::CreateContainer { sandbox, ctr, name });
                if self.percent(80) {
                    self.push(Step::StartContainer { ctr });
                }
                true
            }
            34..=38 => {
                let created: Vec<usize> = self
                    .model
                    .containers_in(&[CtrState::Created, CtrState::Unknown])
                    .into_iter()
                    .filter(|&c| {
                        let sb = self.model.containers[c].sandbox;
                        self.model.sandboxes[sb].state == SbState::Ready
                    })
                    .collect();
                let Some(ctr) = self.pick(&created) else {
                    return false;
                };
                self.push(Step::StartContainer { ctr });
                true
            }
            // A container exits; often it is restarted, which in CRI is a new
            // container of the same name (the next attempt).
            39..=60 => {
                let live = self
                    .model
                    .containers_in(&[CtrState::Running, CtrState::Unknown]);
                let Some(ctr) = self.pick(&live) else {
                    return false;
                };
                let code = *[0, 1, 2, 137, 143, 255].choose(&mut self.rng).unwrap_or(&1);
                let silent = self.percent(10);
                self.push(Step::ExitContainer { ctr, code, silent });
                let sandbox = self.model.containers[ctr].sandbox;
                if self.model.sandboxes[sandbox].state == SbState::Ready && self.percent(60) {
                    let name = self.model.containers[ctr].name;
                    let next = self.model.containers.len();
                    self.push(Step::CreateContainer {
                        sandbox,
                        ctr: next,
                        name,
                    });
                    self.push(Step::StartContainer { ctr: next });
                    if self.percent(70) {
                        self.push(Step::RemoveContainer { ctr });
                    }
                }
                true
            }
            61..=63 => {
                let live = self
                    .model
                    .containers_in(&[CtrState::Created, CtrState::Running]);
                let Some(ctr) = self.pick(&live) else {
                    return false;
                };
                self.push(Step::ContainerUnknown { ctr });
                true
            }
            64..=74 => {
                let dead = self.model.containers_in(&[
                    CtrState::Exited,
                    CtrState::Created,
                    CtrState::Unknown,
                ]);
                let Some(ctr) = self.pick(&dead) else {
                    return false;
                };
                self.push(Step::RemoveContainer { ctr });
                true
            }
            // A pod stops: its running containers exit, then its sandbox.
            75..=82 => {
                let live = self.model.sandboxes_in(&[SbState::Ready, SbState::Unknown]);
                let Some(sandbox) = self.pick(&live) else {
                    return false;
                };
                self.stop_sandbox(sandbox);
                true
            }
            83..=85 => {
                if self.percent(50) {
                    let ready = self.model.sandboxes_in(&[SbState::Ready]);
                    let Some(sandbox) = self.pick(&ready) else {
                        return false;
                    };
                    self.push(Step::SandboxUnknown { sandbox });
                } else {
                    let unknown = self.model.sandboxes_in(&[SbState::Unknown]);
                    let Some(sandbox) = self.pick(&unknown) else {
                        return false;
                    };
                    self.push(Step::SandboxRecovered { sandbox });
                }
                true
            }
            // A pod is removed: stopped, its containers removed, then its sandbox.
            _ => {
                // Mostly sandboxes already stopped, as kubelet removes them.
                let stopped = self.model.sandboxes_in(&[SbState::NotReady]);
                let any =
                    self.model
                        .sandboxes_in(&[SbState::Ready, SbState::NotReady, SbState::Unknown]);
                let from = if !stopped.is_empty() && self.percent(75) {
                    stopped
                } else {
                    any
                };
                let Some(sandbox) = self.pick(&from) else {
                    return false;
                };
                if self.model.sandboxes[sandbox].state != SbState::NotReady {
                    self.stop_sandbox(sandbox);
                }
                let left: Vec<usize> = self.model.sandboxes[sandbox]
                    .containers
                    .iter()
                    .copied()
                    .filter(|&c| self.model.containers[c].state != CtrState::Removed)
                    .collect();
                for ctr in left {
                    if self.model.containers[ctr].state == CtrState::Running {
                        self.push(Step::ExitContainer {
                            ctr,
                            code: 137,
                            silent: false,
                        });
                    }
                    let pause = Duration::from_millis(self.rng.random_range(0..3));
                    self.push_after(pause, Step::RemoveContainer { ctr });
                }
                self.push(Step::RemoveSandbox { sandbox });
                true
            }
        }
    }

    /// StopPodSandbox as the runtime does it: each running container exits (137),
    /// one change per step, then the sandbox.
    fn stop_sandbox(&mut self, sandbox: usize) {
        for ctr in self.model.running_in(sandbox) {
            let pause = Duration::from_millis(self.rng.random_range(0..3));
            self.push_after(
                pause,
                Step::ExitContainer {
                    ctr,
                    code: 137,
                    silent: false,
                },
            );
        }
        self.push(Step::StopSandbox { sandbox });
    }

    /// One fault; false if none was possible this time.
    fn fault(&mut self) -> bool {
        match self.rng.random_range(0..100) {
            0..=9 => self.push(Step::CloseStreams),
            10..=19 => {
                let code = self.code();
                self.push(Step::FailStreams(code));
            }
            // The runtime answers GetContainerEvents with Unimplemented for a while.
            20..=25 => {
                self.push(Step::FailCalls {
                    op: CallOp::Events,
                    code: Code::Unimplemented,
                    times: None,
                });
                self.push(Step::CloseStreams);
                self.close_later(15, Step::ClearFault { op: CallOp::Events });
            }
            26..=37 => {
                let mangle = Mangle {
                    drop: self.rng.random_range(0..60),
                    duplicate: self.rng.random_range(0..40),
                    delay: self.rng.random_range(0..40),
                    strip_uid: self.rng.random_range(0..30),
                    stale: self.rng.random_range(0..30),
                };
                self.push(Step::SetMangle(mangle));
                self.close_later(20, Step::SetMangle(Mangle::default()));
            }
            38..=42 => {
                let reverse = self.percent(70);
                self.push(Step::ReleaseDelayed { reverse });
            }
            43..=50 => {
                let injected = match self.rng.random_range(0..5) {
                    0 if !self.model.containers.is_empty() => Injected::Stale {
                        ctr: self.rng.random_range(0..self.model.containers.len()),
                    },
                    0 | 1 => Injected::NoUid,
                    2 => Injected::NoStatus,
                    3 => Injected::UnknownPod,
                    _ => Injected::BogusType,
                };
                self.push(Step::Inject(injected));
            }
            // A few failed calls, or a window of failures.
            51..=66 => {
                let op = self
                    .pick(&CallOp::ALL[..4])
                    .unwrap_or(CallOp::ListSandboxes);
                // A sandbox that is not found fails the pod's read; a container that is
                // not found is gone (plegd leaves it out), which a runtime says only of
                // a container that is gone: that one comes from real races.
                let code = if op == CallOp::SandboxStatus && self.percent(30) {
                    Code::NotFound
                } else {
                    self.code()
                };
                if self.percent(60) {
                    let times = Some(self.rng.random_range(1..=6));
                    self.push(Step::FailCalls { op, code, times });
                } else {
                    self.push(Step::FailCalls {
                        op,
                        code,
                        times: None,
                    });
                    self.close_later(12, Step::ClearFault { op });
                }
            }
            67..=74 => {
                let op = self
                    .pick(&CallOp::ALL[..4])
                    .unwrap_or(CallOp::SandboxStatus);
                let ms = self.rng.random_range(5..120);
                self.push(Step::Latency { op, ms });
                self.close_later(15, Step::Latency { op, ms: 0 });
            }
            75..=84 => {
                let pod = self.rng.random_range(0..POD_SLOTS);
                self.push(Step::PodStatusFails { pod, failing: true });
                self.close_later(
                    15,
                    Step::PodStatusFails {
                        pod,
                        failing: false,
                    },
                );
            }
            85..=92 => {
                if self.model.down {
                    return false;
                }
                self.push(Step::RuntimeDown);
                self.close_later(10, Step::RuntimeUp);
            }
            _ => {
                let over_cri = matches!(self.transport, Transport::Cri | Transport::Process);
                if !over_cri || self.model.oversized {
                    return false;
                }
                self.push(Step::OversizedLists { on: true });
                self.close_later(8, Step::OversizedLists { on: false });
            }
        }
        true
    }

    /// One consumer action; false if none was possible this time.
    fn consumer(&mut self) -> bool {
        match self.rng.random_range(0..100) {
            0..=29 => {
                let free: Vec<usize> = (0..HOLD_SLOTS).filter(|&s| !self.model.holds[s]).collect();
                let Some(slot) = self.pick(&free) else {
                    return false;
                };
                let pod = self.rng.random_range(0..POD_SLOTS);
                self.push(Step::BeginHold { pod, slot });
                let how = *[
                    HoldEnd::Success,
                    HoldEnd::Success,
                    HoldEnd::Error,
                    HoldEnd::Cancelled,
                    HoldEnd::Dropped,
                ]
                .choose(&mut self.rng)
                .unwrap_or(&HoldEnd::Success);
                self.close_later(12, Step::EndHold { slot, how });
            }
            30..=49 => {
                let n = self.rng.random_range(5..400);
                let k = self.rng.random_range(1..5);
                let targets = (0..k)
                    .map(|_| {
                        if self.percent(15) {
                            StormTarget::Ghost
                        } else {
                            StormTarget::Pod(self.rng.random_range(0..POD_SLOTS))
                        }
                    })
                    .collect();
                let source = *[
                    StormSource::EventedPleg,
                    StormSource::PostSync,
                    StormSource::PostAllocation,
                ]
                .choose(&mut self.rng)
                .unwrap_or(&StormSource::EventedPleg);
                self.push(Step::Storm { n, targets, source });
            }
            50..=59 => self.push(Step::BringForward),
            60..=74 => {
                let free: Vec<usize> = (0..SUB_SLOTS).filter(|&s| !self.model.subs[s]).collect();
                let Some(slot) = self.pick(&free) else {
                    return false;
                };
                let capacity = self.rng.random_range(1..4);
                self.push(Step::Subscribe { slot, capacity });
                self.close_later(25, Step::Unsubscribe { slot });
            }
            _ => {
                let n = self.rng.random_range(1..4);
                self.push(Step::ReadSlow { n });
            }
        }
        true
    }

    /// plegd stops (cleanly or killed) and starts again a few steps later; the
    /// runtime sometimes goes down with it, and comes up before or after plegd is
    /// started again. false if plegd is already down.
    fn restart(&mut self) -> bool {
        if self.model.plegd_down {
            return false;
        }
        let kill = self.percent(50);
        let with_runtime = !self.model.down && self.percent(35);
        if with_runtime && self.percent(50) {
            self.push(Step::RuntimeDown);
            self.push(Step::PlegdStop { kill });
        } else {
            self.push(Step::PlegdStop { kill });
            if with_runtime {
                self.push(Step::RuntimeDown);
            }
        }
        self.close_later(8, Step::PlegdStart);
        if with_runtime {
            self.close_later(8, Step::RuntimeUp);
        }
        true
    }

    /// Emits the window closes that are due.
    fn close_due(&mut self) {
        let now = self.steps.len();
        let (due, later): (Vec<_>, Vec<_>) = self.closes.drain(..).partition(|(at, _)| *at <= now);
        self.closes = later;
        for (_, step) in due {
            self.push(step);
        }
    }
}

/// The schedule of `seed` in the actors suite.
pub fn generate(seed: u64) -> Schedule {
    generate_in(Suite::Actors, seed)
}

/// The schedule of `seed` in `suite`. The actors suite's schedules are the same as
/// before the restart suite existed; the restart suite's differ from them from the
/// first step on.
pub fn generate_in(suite: Suite, seed: u64) -> Schedule {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let transport = if rng.random_range(0..100) < 30 {
        Transport::Cri
    } else {
        Transport::Direct
    };
    let transport = match suite {
        Suite::Actors => transport,
        Suite::Restarts => Transport::Process,
    };
    let cap_ms = rng.random_range(40..200);
    let config = RunConfig {
        transport,
        relist_period: Duration::from_millis(rng.random_range(40..150)),
        queue_capacity: *[1, 2, 4, 16, 1024].choose(&mut rng).unwrap_or(&16),
        status_concurrency: rng.random_range(1..=8),
        evented: rng.random_range(0..100) < 90,
        reconnect_base: Duration::from_millis(rng.random_range(2..20)),
        reconnect_cap: Duration::from_millis(cap_ms),
        gate_idle: Duration::from_millis(rng.random_range(30..200)),
        quiet_until_first_event: rng.random_range(0..100) < 40,
        slow_capacity: rng.random_range(1..6),
    };
    let mut g = Gen {
        rng,
        model: Model {
            pods: vec![vec![]; POD_SLOTS],
            holds: vec![false; HOLD_SLOTS],
            subs: vec![false; SUB_SLOTS],
            ..Model::default()
        },
        steps: Vec::new(),
        transport,
        closes: Vec::new(),
    };
    let rounds = g.rng.random_range(60..140);
    for _ in 0..rounds {
        g.close_due();
        // A few tries, so a round rarely passes for want of a candidate.
        for _ in 0..4 {
            let done = match g.rng.random_range(0..100) {
                0..=59 => g.workload(),
                60..=84 => g.fault(),
                // A plegd restart in about one round of twelve.
                _ if suite == Suite::Restarts => g.rng.random_range(0..100) < 55 && g.restart(),
                _ => g.consumer(),
            };
            if done {
                break;
            }
        }
    }
    // Windows still open close now; the executor's heal then clears everything else.
    let rest: Vec<Step> = g.closes.drain(..).map(|(_, s)| s).collect();
    for step in rest {
        g.push(step);
    }
    Schedule {
        seed,
        suite,
        config,
        pods: POD_SLOTS,
        steps: g.steps,
        hold_slots: HOLD_SLOTS,
        sub_slots: SUB_SLOTS,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_always_yields_the_same_schedule() {
        for seed in [0, 1, 42, u64::MAX] {
            let (a, b) = (generate(seed), generate(seed));
            assert_eq!(a.steps, b.steps);
            assert_eq!(format!("{:?}", a.config), format!("{:?}", b.config));
        }
        assert_ne!(generate(1).steps, generate(2).steps);
        let (a, b) = (
            generate_in(Suite::Restarts, 7),
            generate_in(Suite::Restarts, 7),
        );
        assert_eq!(a.steps, b.steps);
    }

    /// Every stop is followed by a start, no start comes without a stop, and the
    /// runtime is up at the end: the executor's heal has only faults to clear.
    #[test]
    fn restart_schedules_pair_every_stop_with_a_start() {
        for seed in 0..200 {
            let s = generate_in(Suite::Restarts, seed);
            assert_eq!(s.config.transport, Transport::Process);
            let mut down = false;
            for t in &s.steps {
                match t.step {
                    Step::PlegdStop { .. } => {
                        assert!(!down, "seed {seed}: stopped twice");
                        down = true;
                    }
                    Step::PlegdStart => {
                        assert!(down, "seed {seed}: started while running");
                        down = false;
                    }
                    _ => {}
                }
                let consumer = matches!(
                    t.step,
                    Step::BeginHold { .. }
                        | Step::EndHold { .. }
                        | Step::Storm { .. }
                        | Step::BringForward
                        | Step::Subscribe { .. }
                        | Step::Unsubscribe { .. }
                        | Step::ReadSlow { .. }
                );
                assert!(!consumer, "seed {seed}: {:?} in the restart suite", t.step);
            }
            assert!(!down, "seed {seed}: plegd left stopped");
        }
    }
}
