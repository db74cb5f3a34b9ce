//! The runtime's side of a chaos run, shared by both executors: the fake runtime
//! (and the simulated CRI server in front of it), the event filter, and the true
//! history, which each workload step records right after it changes the runtime.
//! Workload, event stream, call and runtime steps are applied here; steps that act
//! on plegd are the executors' own.

use std::path::{Path, PathBuf};
use std::time::Duration;

use plegd_runtime::cri;
use plegd_runtime::{ContainerState, PodRef};
use plegd_sim::{spawn_in_thread, FakeRuntime, ThreadedSimServer};

use super::mangle::Mangler;
use super::schedule::{pod_ref, CallOp, Injected, Schedule, Step, Transport};
use super::truth::{St, Truth};

pub struct RuntimeSide {
    pub transport: Transport,
    pub pods: usize,
    pub rt: FakeRuntime,
    pub mangler: Mangler,
    pub truth: Truth,
    /// Sandbox and container numbers → runtime IDs; the pod slot of each sandbox.
    sandbox_ids: Vec<String>,
    sandbox_pod: Vec<usize>,
    container_ids: Vec<String>,
    container_sandbox: Vec<usize>,
    pub down: bool,
    /// How many times the runtime went down so far.
    pub downs: u64,
    server: Option<ThreadedSimServer>,
    socket: Option<PathBuf>,
    pub problems: Vec<String>,
}

/// A STOPPED event whose sandbox status names `pod` (with `uid` as its UID).
fn stopped_event(container_id: &str, pod: &PodRef, uid: &str) -> cri::ContainerEventResponse {
    cri::ContainerEventResponse {
        container_id: container_id.into(),
        container_event_type: cri::ContainerEventType::ContainerStoppedEvent as i32,
        created_at: plegd_runtime::now_ns(),
        pod_sandbox_status: Some(cri::PodSandboxStatus {
            id: "sb-injected".into(),
            metadata: Some(cri::PodSandboxMetadata {
                name: pod.name.clone(),
                uid: uid.into(),
                namespace: pod.namespace.clone(),
                attempt: 0,
            }),
            ..Default::default()
        }),
        containers_statuses: vec![],
    }
}

impl RuntimeSide {
    /// The fake runtime with the seed's event filter; no server yet.
    pub fn new(schedule: &Schedule) -> Self {
        let rt = FakeRuntime::new();
        rt.set_quiet_until_first_event(schedule.config.quiet_until_first_event);
        let mangler = Mangler::new(schedule.seed);
        rt.set_event_filter(Some(mangler.filter()));
        RuntimeSide {
            transport: schedule.config.transport,
            pods: schedule.pods,
            rt,
            mangler,
            truth: Truth::default(),
            sandbox_ids: vec![],
            sandbox_pod: vec![],
            container_ids: vec![],
            container_sandbox: vec![],
            down: false,
            downs: 0,
            server: None,
            socket: None,
            problems: vec![],
        }
    }

    /// Serves the fake runtime over CRI on `socket`; returns the endpoint.
    pub fn serve(&mut self, socket: &Path) -> Result<String, String> {
        let server = spawn_in_thread(socket, self.rt.clone()).map_err(|e| e.to_string())?;
        let endpoint = server.endpoint();
        self.server = Some(server);
        self.socket = Some(socket.to_path_buf());
        Ok(endpoint)
    }

    /// Stops the server, if it runs.
    pub async fn stop_server(&mut self) {
        if let Some(server) = self.server.take() {
            let _ = tokio::task::spawn_blocking(move || server.kill()).await;
        }
    }

    pub fn problem(&mut self, p: String) {
        self.problems.push(p);
    }

    /// Records the current state of sandbox number `sb` in the true history.
    fn record_sandbox(&mut self, sb: usize) {
        let id = self.sandbox_ids[sb].clone();
        let st = St::of_sandbox(self.rt.sandbox(&id).map(|s| s.state));
        let pod = pod_ref(self.sandbox_pod[sb]);
        self.truth.observe(&id, &pod, true, st);
    }

    fn record_container(&mut self, ctr: usize) {
        let id = self.container_ids[ctr].clone();
        let st = St::of_container(self.rt.container(&id).map(|c| c.state));
        let pod = pod_ref(self.sandbox_pod[self.container_sandbox[ctr]]);
        self.truth.observe(&id, &pod, false, st);
    }

    pub async fn runtime_down(&mut self) {
        self.down = true;
        self.downs += 1;
        self.mangler.set_suppress(true);
        match self.transport {
            Transport::Direct => {
                for op in CallOp::ALL {
                    self.rt.fail(op.op(), tonic::Code::Unavailable, None);
                }
                self.rt.fail_streams(tonic::Code::Unavailable);
            }
            Transport::Cri | Transport::Process => {
                if let Some(server) = self.server.take() {
                    // kill() joins the server's thread: not on the actors' thread.
                    let _ = tokio::task::spawn_blocking(move || server.kill()).await;
                }
            }
        }
    }

    pub async fn runtime_up(&mut self) {
        match self.transport {
            Transport::Direct => {
                for op in CallOp::ALL {
                    self.rt.clear_failure(op.op());
                }
            }
            Transport::Cri | Transport::Process => {
                if self.server.is_none() {
                    if let Some(path) = self.socket.clone() {
                        let rt = self.rt.clone();
                        match tokio::task::spawn_blocking(move || spawn_in_thread(&path, rt)).await
                        {
                            Ok(Ok(server)) => self.server = Some(server),
                            Ok(Err(e)) => self.problem(format!("harness: restart server: {e}")),
                            Err(e) => self.problem(format!("harness: restart server: {e}")),
                        }
                    }
                }
            }
        }
        self.down = false;
        self.mangler.set_suppress(false);
    }

    /// Applies `step` if it is a step on the runtime's side (workload, event stream,
    /// calls, the runtime's own restarts); false if it is not.
    pub async fn apply(&mut self, step: &Step) -> bool {
        match step {
            Step::RunPod { pod, sandbox } => {
                let p = pod_ref(*pod);
                let id = self.rt.run_pod(&p.uid, &p.name, &p.namespace);
                debug_assert_eq!(*sandbox, self.sandbox_ids.len());
                self.sandbox_ids.push(id);
                self.sandbox_pod.push(*pod);
                self.record_sandbox(*sandbox);
            }
            Step::CreateContainer { sandbox, ctr, name } => {
                let id = self.rt.create_container(&self.sandbox_ids[*sandbox], name);
                debug_assert_eq!(*ctr, self.container_ids.len());
                self.container_ids.push(id);
                self.container_sandbox.push(*sandbox);
                self.record_container(*ctr);
            }
            Step::StartContainer { ctr } => {
                self.rt.start_container(&self.container_ids[*ctr]);
                self.record_container(*ctr);
            }
            Step::ExitContainer { ctr, code, silent } => {
                if *silent {
                    self.mangler.set_suppress(true);
                }
                self.rt.exit_container(&self.container_ids[*ctr], *code);
                self.truth.exited(&self.container_ids[*ctr], *code);
                self.mangler.set_suppress(self.down);
                self.record_container(*ctr);
            }
            Step::ContainerUnknown { ctr } => {
                self.rt
                    .set_container_state(&self.container_ids[*ctr], ContainerState::Unknown);
                self.record_container(*ctr);
            }
            Step::RemoveContainer { ctr } => {
                self.rt.remove_container(&self.container_ids[*ctr]);
                self.record_container(*ctr);
            }
            Step::StopSandbox { sandbox } => {
                self.rt.stop_pod(&self.sandbox_ids[*sandbox]);
                self.record_sandbox(*sandbox);
            }
            Step::SandboxUnknown { sandbox } => {
                self.rt.set_sandbox_state(
                    &self.sandbox_ids[*sandbox],
                    plegd_runtime::SandboxState::Unknown,
                );
                self.record_sandbox(*sandbox);
            }
            Step::SandboxRecovered { sandbox } => {
                self.rt.set_sandbox_state(
                    &self.sandbox_ids[*sandbox],
                    plegd_runtime::SandboxState::Ready,
                );
                self.record_sandbox(*sandbox);
            }
            Step::RemoveSandbox { sandbox } => {
                self.rt.remove_pod(&self.sandbox_ids[*sandbox]);
                self.record_sandbox(*sandbox);
            }
            Step::CloseStreams => {
                self.rt.close_streams();
            }
            Step::FailStreams(code) => {
                self.rt.fail_streams(code.tonic());
            }
            Step::SetMangle(m) => self.mangler.set_mode(*m),
            Step::ReleaseDelayed { reverse } => {
                let mut held = self.mangler.take_delayed();
                if *reverse {
                    held.reverse();
                }
                for ev in held {
                    self.rt.inject_event(ev);
                }
            }
            Step::Inject(what) => {
                let ev = match *what {
                    Injected::Stale { ctr } => {
                        let mut ev = self.rt.event_about(
                            &self.container_ids[ctr],
                            cri::ContainerEventType::ContainerStoppedEvent,
                        );
                        ev.created_at = 1;
                        ev
                    }
                    Injected::NoUid => stopped_event("ctr-no-uid", &pod_ref(0), ""),
                    Injected::NoStatus => cri::ContainerEventResponse {
                        container_id: "ctr-no-status".into(),
                        container_event_type: cri::ContainerEventType::ContainerStoppedEvent as i32,
                        created_at: plegd_runtime::now_ns(),
                        ..Default::default()
                    },
                    Injected::UnknownPod => {
                        stopped_event("ctr-ghost", &pod_ref(99), "chaos-ghost-pod")
                    }
                    Injected::BogusType => {
                        let p = pod_ref(0);
                        let mut ev = stopped_event("ctr-bogus", &p, &p.uid);
                        ev.container_event_type = 99;
                        ev
                    }
                };
                self.rt.inject_event(ev);
            }
            Step::FailCalls { op, code, times } => self.rt.fail(op.op(), code.tonic(), *times),
            Step::ClearFault { op } => {
                // A down runtime stays down: its own failures are cleared by RuntimeUp.
                if !(self.down && self.transport == Transport::Direct) {
                    self.rt.clear_failure(op.op());
                }
            }
            Step::Latency { op, ms } => self.rt.set_latency(op.op(), Duration::from_millis(*ms)),
            Step::PodStatusFails { pod, failing } => {
                self.rt.fail_pod_status(&pod_ref(*pod).uid, *failing)
            }
            Step::RuntimeDown => self.runtime_down().await,
            Step::RuntimeUp => self.runtime_up().await,
            Step::OversizedLists { on } => {
                // Over the client's limit (kubelet's): those lists fail.
                let bytes = plegd_runtime::DEFAULT_MAX_MESSAGE_SIZE + (1 << 20);
                self.rt.set_list_padding(if *on { bytes } else { 0 });
            }
            _ => return false,
        }
        true
    }

    /// Stops every fault of the runtime's side: the filter, failures, latency, the
    /// runtime down, padded lists; sends the held-back events.
    pub async fn heal(&mut self) {
        self.mangler.set_mode(Default::default());
        if self.down {
            self.runtime_up().await;
        }
        self.mangler.set_suppress(false);
        for op in CallOp::ALL {
            self.rt.clear_failure(op.op());
            self.rt.set_latency(op.op(), Duration::ZERO);
        }
        for p in 0..self.pods {
            self.rt.fail_pod_status(&pod_ref(p).uid, false);
        }
        self.rt.set_list_padding(0);
        for ev in self.mangler.take_delayed() {
            self.rt.inject_event(ev);
        }
    }

    /// The runtime's state of every live pod slot: pod UID → (ID → state).
    pub fn wanted(
        &self,
    ) -> std::collections::BTreeMap<String, std::collections::BTreeMap<String, St>> {
        let mut out = std::collections::BTreeMap::new();
        for p in 0..self.pods {
            let pod = pod_ref(p);
            let sandboxes = self.rt.sandboxes_of(&pod.uid);
            if sandboxes.is_empty() {
                continue;
            }
            let mut want = std::collections::BTreeMap::new();
            for sb in &sandboxes {
                let state = self.rt.sandbox(sb).map(|s| s.state);
                want.insert(sb.clone(), St::of_sandbox(state));
                for c in self.rt.containers_of(sb) {
                    want.insert(c.id.clone(), St::of_container(Some(c.state)));
                }
            }
            out.insert(pod.uid, want);
        }
        out
    }
}
