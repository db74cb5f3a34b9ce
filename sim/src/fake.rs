//! An in-memory container runtime for tests and the simulator: scriptable state
//! (pods, containers, their states), scriptable faults (errors, latency, per-pod
//! status failures) and an event stream shaped like containerd's.
//!
//! It is also what the simulated CRI server serves over gRPC, so component tests
//! (calling it directly) and integration tests (through the real tonic client) see
//! the same runtime.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use plegd_runtime::cri;
use tokio::sync::{broadcast, Notify};

use plegd_runtime::containerd_events::{self, Envelope, TaskEventStream};
use plegd_runtime::now_ns;

use crate::kubelet::{self, ContainerMeta, Kubelet};
use plegd_runtime::{
    Container, ContainerState, ContainerStatus, EventStream, PodRef, RuntimeClient, RuntimeError,
    RuntimeVersion, Sandbox, SandboxState,
};

/// Where the simulated images come from: container `app` runs `plegd-sim/app:1`.
pub const SIM_IMAGE_REPO: &str = "plegd-sim";

/// The runtime calls, for fault injection and call counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Version,
    ListSandboxes,
    ListContainers,
    /// ListContainers filtered by one container ID.
    FindContainer,
    SandboxStatus,
    ContainerStatus,
    Events,
    /// containerd's event service (Events/Subscribe).
    TaskEvents,
}

#[derive(Clone, Debug)]
struct InjectedFault {
    code: tonic::Code,
    /// None: until cleared.
    remaining: Option<u32>,
}

/// Decides what becomes of each event the runtime emits, in emission order: the
/// events to send instead — none (dropped: a runtime that loses events), two
/// (duplicated), a changed copy (stale, without a UID, ...). Chaos tests use it to
/// model an unreliable event stream; raw events sent with
/// [`FakeRuntime::inject_event`] bypass it. It runs under the runtime's lock, so it
/// must not call back into the [`FakeRuntime`].
pub type EventFilter =
    Arc<dyn Fn(cri::ContainerEventResponse) -> Vec<cri::ContainerEventResponse> + Send + Sync>;

/// What the fake runtime sends down its open event streams (CRI's, or containerd's
/// task events).
#[derive(Clone, Debug)]
enum StreamSignal<T = cri::ContainerEventResponse> {
    Event(Box<T>),
    /// End every open stream cleanly (EOF).
    Close,
    /// Fail every open stream with this code (then it ends).
    Fail(tonic::Code),
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) sandboxes: BTreeMap<String, Sandbox>,
    pub(crate) containers: BTreeMap<String, ContainerStatus>,
    next_id: u64,
    /// None: short IDs (`sb…`, `ctr…`) and only the labels callers give.
    kubelet: Option<Kubelet>,
    /// Sandboxes made so far (which ones are heavy, [`Kubelet::heavy_every`]).
    sandboxes_made: u64,
    /// The sandboxes' annotations (their labels are in [`Sandbox::labels`]); a
    /// sandbox without any has no entry.
    pub(crate) sandbox_annotations: HashMap<String, HashMap<String, String>>,
    /// The containers' labels, annotations and image IDs; one without has no entry.
    pub(crate) container_meta: HashMap<String, ContainerMeta>,
    failures: HashMap<Op, InjectedFault>,
    latency: HashMap<Op, Duration>,
    /// Calls of these ops wait (counted) until released.
    held: HashSet<Op>,
    failing_pods: HashSet<String>,
    /// Like containerd: GetContainerEvents answers nothing until the first event.
    quiet_until_first_event: bool,
    calls: HashMap<Op, u64>,
    /// Indexes, so that creating, listing and emitting never scan the whole node
    /// (`plegd demo --pods 20000` started in quadratic time): pod UID → its sandbox
    /// IDs, sandbox ID → its container IDs.
    pod_sandboxes: HashMap<String, BTreeSet<String>>,
    sandbox_containers: HashMap<String, BTreeSet<String>>,
    /// See [`EventFilter`]; None: every event is sent as emitted.
    event_filter: Option<EventFilter>,
    /// The filters of the last containerd event subscription.
    task_filters: Vec<String>,
    /// No task events on exits (a test sends its own with `inject_task_event`).
    no_task_events: bool,
    /// Bytes of padding the CRI server adds to the first item of each list response
    /// (0: none), to make lists larger than a client accepts.
    list_padding: usize,
    /// How the CRI server sends lists: see [`ListServing`].
    pub(crate) lists: ListServing,
    /// Streaming list calls received (served or refused).
    list_stream_calls: ListStreamCalls,
}

/// Streaming list calls the simulated CRI server received, served or refused, by
/// stream.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListStreamCalls {
    /// StreamPodSandboxes calls.
    pub sandboxes: u64,
    /// StreamContainers calls.
    pub containers: u64,
}

impl ListStreamCalls {
    /// Whether the pair was asked once, as a client asks a runtime that refuses
    /// them: each stream at most once, one at least. The client sends both at once
    /// and drops the second when the first is refused, which may be before the
    /// server has it.
    pub fn asked_once(&self) -> bool {
        self.sandboxes <= 1 && self.containers <= 1 && self.sandboxes + self.containers >= 1
    }
}

/// How the simulated CRI server sends lists, as a real runtime's gRPC server would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListServing {
    /// The largest message the server sends (None: no limit, tonic's default). A list
    /// response or streamed message over it is refused with ResourceExhausted, worded
    /// as grpc-go (containerd's and CRI-O's gRPC) words it; containerd's default is
    /// [`CONTAINERD_SEND_LIMIT`].
    pub send_limit: Option<usize>,
    /// Whether StreamPodSandboxes and StreamContainers are served (else they answer
    /// UNIMPLEMENTED, as a runtime built before them does).
    pub streaming: bool,
    /// Entries per streamed message (containerd sends 5,000).
    pub stream_batch: usize,
}

/// containerd's default gRPC send limit (`[grpc] max_send_message_size`): 16 MiB.
pub const CONTAINERD_SEND_LIMIT: usize = 16 << 20;

impl Default for ListServing {
    /// No send limit and no streaming list calls: the lists as the simulator always
    /// served them.
    fn default() -> Self {
        ListServing {
            send_limit: None,
            streaming: false,
            stream_batch: 5000,
        }
    }
}

impl State {
    fn containers_in<'a>(&'a self, sandbox_id: &str) -> impl Iterator<Item = &'a ContainerStatus> {
        self.sandbox_containers
            .get(sandbox_id)
            .into_iter()
            .flatten()
            .filter_map(|id| self.containers.get(id))
    }

    fn sandboxes_of(&self, uid: &str) -> impl Iterator<Item = &String> {
        self.pod_sandboxes.get(uid).into_iter().flatten()
    }

    fn insert_sandbox(&mut self, sb: Sandbox) {
        self.pod_sandboxes
            .entry(sb.pod.uid.clone())
            .or_default()
            .insert(sb.id.clone());
        self.sandboxes.insert(sb.id.clone(), sb);
    }

    fn remove_sandbox(&mut self, id: &str) -> Option<Sandbox> {
        let sb = self.sandboxes.remove(id)?;
        if let Some(ids) = self.pod_sandboxes.get_mut(&sb.pod.uid) {
            ids.remove(id);
            if ids.is_empty() {
                self.pod_sandboxes.remove(&sb.pod.uid);
            }
        }
        self.sandbox_containers.remove(id);
        self.sandbox_annotations.remove(id);
        Some(sb)
    }

    fn insert_container(&mut self, c: ContainerStatus) {
        self.sandbox_containers
            .entry(c.sandbox_id.clone())
            .or_default()
            .insert(c.id.clone());
        self.containers.insert(c.id.clone(), c);
    }

    fn remove_container(&mut self, id: &str) {
        if let Some(c) = self.containers.remove(id) {
            if let Some(ids) = self.sandbox_containers.get_mut(&c.sandbox_id) {
                ids.remove(id);
            }
            self.container_meta.remove(id);
        }
    }
}

/// What a new sandbox is dressed with.
enum Dress {
    /// The pod's own labels; kubelet's labels and annotations added if the runtime
    /// plays kubelet.
    Kubelet(BTreeMap<String, String>),
    /// Exactly these labels and annotations.
    Given(BTreeMap<String, String>, HashMap<String, String>),
}

/// A scriptable in-memory runtime. Cheap to clone; clones share state.
#[derive(Clone)]
pub struct FakeRuntime {
    state: Arc<Mutex<State>>,
    events: broadcast::Sender<StreamSignal>,
    /// containerd's task events (exit, OOM), to every subscriber.
    task_events: broadcast::Sender<StreamSignal<Envelope>>,
    version: RuntimeVersion,
    /// Wakes the calls [`FakeRuntime::hold`] keeps waiting.
    released: Arc<Notify>,
}

impl Default for FakeRuntime {
    fn default() -> Self {
        Self::new()
    }
}

impl FakeRuntime {
    pub fn new() -> Self {
        let (events, _) = broadcast::channel(4096);
        let (task_events, _) = broadcast::channel(4096);
        FakeRuntime {
            state: Arc::default(),
            events,
            task_events,
            released: Arc::default(),
            version: RuntimeVersion {
                runtime_name: "plegd-sim".into(),
                runtime_version: env!("CARGO_PKG_VERSION").into(),
                runtime_api_version: "v1".into(),
            },
        }
    }

    /// A runtime that dresses what it is scripted to make as containerd and kubelet
    /// would ([`Kubelet`]): 64-hex IDs, kubelet's labels and annotations.
    pub fn with_kubelet(kubelet: Kubelet) -> Self {
        let rt = Self::new();
        rt.lock().kubelet = Some(kubelet);
        rt
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock is a test bug; keep serving the state anyway.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn new_id(st: &mut State, prefix: &str) -> String {
        st.next_id += 1;
        match st.kubelet {
            Some(_) => kubelet::containerd_id(st.next_id),
            None => format!("{prefix}{:012x}", st.next_id),
        }
    }

    // ---- scripting the runtime's state -------------------------------------------

    /// RunPodSandbox: a new ready sandbox for the pod, without labels; returns its ID.
    pub fn run_pod(&self, uid: &str, name: &str, namespace: &str) -> String {
        self.run_pod_with_labels(uid, name, namespace, BTreeMap::new())
    }

    /// RunPodSandbox with the pod's own labels. A runtime [`Self::with_kubelet`] adds
    /// kubelet's labels and annotations.
    pub fn run_pod_with_labels(
        &self,
        uid: &str,
        name: &str,
        namespace: &str,
        labels: BTreeMap<String, String>,
    ) -> String {
        self.make_sandbox(uid, name, namespace, Dress::Kubelet(labels))
    }

    /// RunPodSandbox with exactly these labels and annotations (a CRI config's).
    pub(crate) fn run_pod_with_meta(
        &self,
        uid: &str,
        name: &str,
        namespace: &str,
        labels: BTreeMap<String, String>,
        annotations: HashMap<String, String>,
    ) -> String {
        self.make_sandbox(uid, name, namespace, Dress::Given(labels, annotations))
    }

    fn make_sandbox(&self, uid: &str, name: &str, namespace: &str, dress: Dress) -> String {
        let mut st = self.lock();
        let attempt = st.sandboxes_of(uid).count() as u32;
        let id = Self::new_id(&mut st, "sb");
        st.sandboxes_made += 1;
        let pod = PodRef {
            uid: uid.into(),
            name: name.into(),
            namespace: namespace.into(),
        };
        let created_at = now_ns();
        let (labels, annotations) = match (dress, st.kubelet) {
            (Dress::Given(labels, annotations), _) => (labels, annotations),
            (Dress::Kubelet(labels), None) => (labels, HashMap::new()),
            (Dress::Kubelet(labels), Some(k)) => (
                k.sandbox_labels(&pod, labels),
                k.sandbox_annotations(st.sandboxes_made, created_at),
            ),
        };
        if !annotations.is_empty() {
            st.sandbox_annotations.insert(id.clone(), annotations);
        }
        st.insert_sandbox(Sandbox {
            id: id.clone(),
            pod,
            attempt,
            state: SandboxState::Ready,
            created_at,
            labels,
        });
        self.emit(&st, &id, cri::ContainerEventType::ContainerCreatedEvent);
        self.emit(&st, &id, cri::ContainerEventType::ContainerStartedEvent);
        id
    }

    /// CreateContainer in a sandbox; returns its ID. Panics on an unknown sandbox: a
    /// test's scripting bug. Callers whose sandbox may vanish concurrently (the CRI
    /// server, the churn workload) use [`Self::try_create_container`].
    pub fn create_container(&self, sandbox_id: &str, name: &str) -> String {
        match self.try_create_container(sandbox_id, name) {
            Some(id) => id,
            None => panic!("no sandbox {sandbox_id}"),
        }
    }

    /// CreateContainer in a sandbox; `None` if the sandbox does not exist (checked
    /// under the same lock as the insertion, so it cannot vanish in between). A
    /// runtime [`Self::with_kubelet`] gives it kubelet's labels and annotations.
    pub fn try_create_container(&self, sandbox_id: &str, name: &str) -> Option<String> {
        self.make_container(sandbox_id, name, None)
    }

    /// CreateContainer with exactly this metadata (a CRI config's).
    pub(crate) fn create_container_with_meta(
        &self,
        sandbox_id: &str,
        name: &str,
        meta: ContainerMeta,
    ) -> Option<String> {
        self.make_container(sandbox_id, name, Some(meta))
    }

    fn make_container(
        &self,
        sandbox_id: &str,
        name: &str,
        meta: Option<ContainerMeta>,
    ) -> Option<String> {
        let mut st = self.lock();
        let pod = st.sandboxes.get(sandbox_id)?.pod.clone();
        let (mut attempt, mut others) = (0, BTreeSet::new());
        for c in st.containers_in(sandbox_id) {
            if c.name == name {
                attempt += 1;
            } else {
                others.insert(c.name.as_str());
            }
        }
        let index = others.len();
        let id = Self::new_id(&mut st, "ctr");
        let meta = match (meta, st.kubelet) {
            (Some(meta), _) => Some(meta),
            (None, Some(k)) => Some(k.container_meta(&pod, name, index, attempt)),
            (None, None) => None,
        };
        if let Some(meta) = meta.filter(|m| *m != ContainerMeta::default()) {
            st.container_meta.insert(id.clone(), meta);
        }
        st.insert_container(ContainerStatus {
            id: id.clone(),
            sandbox_id: sandbox_id.into(),
            name: name.into(),
            attempt,
            state: ContainerState::Created,
            created_at: now_ns(),
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            image: format!("{SIM_IMAGE_REPO}/{name}:1"),
        });
        self.emit(&st, &id, cri::ContainerEventType::ContainerCreatedEvent);
        Some(id)
    }

    /// StartContainer.
    pub fn start_container(&self, id: &str) {
        let mut st = self.lock();
        if let Some(c) = st.containers.get_mut(id) {
            c.state = ContainerState::Running;
            c.started_at = now_ns();
            self.emit(&st, id, cri::ContainerEventType::ContainerStartedEvent);
            if !st.no_task_events {
                self.inject_task_event(task_event(containerd_events::TOPIC_START, id));
            }
        }
    }

    /// Create + start: a running container; returns its ID.
    pub fn run_container(&self, sandbox_id: &str, name: &str) -> String {
        let id = self.create_container(sandbox_id, name);
        self.start_container(&id);
        id
    }

    /// The container's process exits with `code` (reason `Completed` or `Error`, as
    /// containerd reports them).
    pub fn exit_container(&self, id: &str, code: i32) {
        let reason = if code == 0 { "Completed" } else { "Error" };
        self.end_container(id, code, reason, "");
    }

    /// The container is killed for exceeding its memory limit: exit 137, `OOMKilled`.
    pub fn oom_kill_container(&self, id: &str) {
        self.end_container(id, 137, "OOMKilled", "memory limit exceeded");
    }

    fn end_container(&self, id: &str, code: i32, reason: &str, message: &str) {
        let mut st = self.lock();
        if let Some(c) = st.containers.get_mut(id) {
            if c.state == ContainerState::Exited {
                return;
            }
            c.state = ContainerState::Exited;
            c.finished_at = now_ns();
            c.exit_code = code;
            c.reason = reason.into();
            c.message = message.into();
            self.emit(&st, id, cri::ContainerEventType::ContainerStoppedEvent);
            // containerd's own events: an OOM first, then the task's exit and delete.
            if !st.no_task_events {
                if reason == "OOMKilled" {
                    self.inject_task_event(task_event(containerd_events::TOPIC_OOM, id));
                }
                self.inject_task_event(task_event(containerd_events::TOPIC_EXIT, id));
                self.inject_task_event(task_event(containerd_events::TOPIC_DELETE, id));
            }
        }
    }

    /// Sets a container's state directly (e.g. Unknown), with no event.
    pub fn set_container_state(&self, id: &str, state: ContainerState) {
        if let Some(c) = self.lock().containers.get_mut(id) {
            c.state = state;
        }
    }

    /// RemoveContainer.
    pub fn remove_container(&self, id: &str) {
        let mut st = self.lock();
        if st.containers.contains_key(id) {
            self.emit(&st, id, cri::ContainerEventType::ContainerDeletedEvent);
            st.remove_container(id);
        }
    }

    /// StopPodSandbox: its running containers exit (137), then the sandbox is not ready.
    pub fn stop_pod(&self, sandbox_id: &str) {
        let running: Vec<String> = self
            .lock()
            .containers_in(sandbox_id)
            .filter(|c| c.state == ContainerState::Running)
            .map(|c| c.id.clone())
            .collect();
        for id in running {
            self.exit_container(&id, 137);
        }
        let mut st = self.lock();
        if let Some(s) = st.sandboxes.get_mut(sandbox_id) {
            if s.state != SandboxState::NotReady {
                s.state = SandboxState::NotReady;
                self.emit(
                    &st,
                    sandbox_id,
                    cri::ContainerEventType::ContainerStoppedEvent,
                );
            }
        }
    }

    /// Sets a sandbox's state as the runtime would report it (no event), e.g. a state
    /// value CRI does not define.
    pub fn set_sandbox_state(&self, sandbox_id: &str, state: SandboxState) {
        if let Some(s) = self.lock().sandboxes.get_mut(sandbox_id) {
            s.state = state;
        }
    }

    /// RemovePodSandbox: the sandbox and all its containers go away.
    pub fn remove_pod(&self, sandbox_id: &str) {
        self.stop_pod(sandbox_id);
        let ids: Vec<String> = self
            .lock()
            .containers_in(sandbox_id)
            .map(|c| c.id.clone())
            .collect();
        for id in ids {
            self.remove_container(&id);
        }
        let mut st = self.lock();
        if st.remove_sandbox(sandbox_id).is_some() {
            // Like containerd: a sandbox's DELETED event has no pod_sandbox_status.
            self.send_filtered(
                &st,
                cri::ContainerEventResponse {
                    container_id: sandbox_id.into(),
                    container_event_type: cri::ContainerEventType::ContainerDeletedEvent as i32,
                    created_at: now_ns(),
                    ..Default::default()
                },
            );
        }
    }

    /// All sandbox IDs of a pod.
    pub fn sandboxes_of(&self, uid: &str) -> Vec<String> {
        self.lock().sandboxes_of(uid).cloned().collect()
    }

    /// All containers of a sandbox (any state).
    pub fn containers_of(&self, sandbox_id: &str) -> Vec<ContainerStatus> {
        self.lock().containers_in(sandbox_id).cloned().collect()
    }

    /// A container's current status, if it exists.
    pub fn container(&self, id: &str) -> Option<ContainerStatus> {
        self.lock().containers.get(id).cloned()
    }

    /// A sandbox's current status, if it exists.
    pub fn sandbox(&self, id: &str) -> Option<Sandbox> {
        self.lock().sandboxes.get(id).cloned()
    }

    /// Number of sandboxes.
    pub fn pod_count(&self) -> usize {
        self.lock().sandboxes.len()
    }

    // ---- faults --------------------------------------------------------------------

    /// Make the next `times` calls of `op` fail with `code` (None: until cleared).
    pub fn fail(&self, op: Op, code: tonic::Code, times: Option<u32>) {
        self.lock().failures.insert(
            op,
            InjectedFault {
                code,
                remaining: times,
            },
        );
    }

    /// Stop failing `op`.
    pub fn clear_failure(&self, op: Op) {
        self.lock().failures.remove(&op);
    }

    /// Delay every call of `op` by `latency` (zero: no delay).
    pub fn set_latency(&self, op: Op, latency: Duration) {
        self.lock().latency.insert(op, latency);
    }

    /// Every call of `op` from now on waits, counted in [`Self::calls`], until
    /// [`Self::release`]: a test sees what else is called while one is in flight.
    pub fn hold(&self, op: Op) {
        self.lock().held.insert(op);
    }

    /// Lets the calls of `op` held by [`Self::hold`] go on, and those to come.
    pub fn release(&self, op: Op) {
        self.lock().held.remove(&op);
        self.released.notify_waiters();
    }

    async fn wait_while_held(&self, op: Op) {
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if !self.lock().held.contains(&op) {
                return;
            }
            released.await;
        }
    }

    /// Status reads (PodSandboxStatus, ContainerStatus) of this pod's sandboxes and
    /// containers fail with Unavailable while `failing` is true.
    pub fn fail_pod_status(&self, uid: &str, failing: bool) {
        let mut st = self.lock();
        if failing {
            st.failing_pods.insert(uid.into());
        } else {
            st.failing_pods.remove(uid);
        }
    }

    /// Makes GetContainerEvents behave like containerd's: the call resolves only when
    /// the first event (or a stream failure) comes, not when the stream is set up.
    pub fn set_quiet_until_first_event(&self, quiet: bool) {
        self.lock().quiet_until_first_event = quiet;
    }

    /// Passes every event the runtime emits from now on through `filter` (None: send
    /// them as emitted). See [`EventFilter`].
    pub fn set_event_filter(&self, filter: Option<EventFilter>) {
        self.lock().event_filter = filter;
    }

    /// Makes the simulated CRI server pad the first item of every ListPodSandbox and
    /// ListContainers response with `bytes` bytes (0: no padding): a list larger than
    /// the client's message limit, as on a node with very many containers, without
    /// building that node. Calls made directly on the [`FakeRuntime`] are not padded.
    pub fn set_list_padding(&self, bytes: usize) {
        self.lock().list_padding = bytes;
    }

    /// The padding set by [`Self::set_list_padding`].
    pub fn list_padding(&self) -> usize {
        self.lock().list_padding
    }

    /// How the simulated CRI server sends lists from now on ([`ListServing`]).
    pub fn set_list_serving(&self, serving: ListServing) {
        self.lock().lists = serving;
    }

    /// What [`Self::set_list_serving`] set.
    pub fn list_serving(&self) -> ListServing {
        self.lock().lists
    }

    /// Streaming list calls the simulated CRI server received (served or refused).
    pub fn list_stream_calls(&self) -> ListStreamCalls {
        self.lock().list_stream_calls
    }

    /// Counts a call of StreamContainers (`containers`) or StreamPodSandboxes;
    /// returns how lists are served now.
    pub(crate) fn list_stream_called(&self, containers: bool) -> ListServing {
        let mut st = self.lock();
        let calls = &mut st.list_stream_calls;
        if containers {
            calls.containers += 1;
        } else {
            calls.sandboxes += 1;
        }
        st.lists
    }

    /// How many calls of `op` were made.
    pub fn calls(&self, op: Op) -> u64 {
        self.lock().calls.get(&op).copied().unwrap_or(0)
    }

    /// Sends a raw event to every open event stream (for malformed, stale or duplicate
    /// events). Returns the number of streams it reached.
    pub fn inject_event(&self, ev: cri::ContainerEventResponse) -> usize {
        self.events
            .send(StreamSignal::Event(Box::new(ev)))
            .unwrap_or(0)
    }

    /// Ends every open event stream cleanly (EOF, no error). Returns how many.
    pub fn close_streams(&self) -> usize {
        self.events.send(StreamSignal::Close).unwrap_or(0)
    }

    /// Fails every open event stream mid-stream with `code`. Returns how many.
    pub fn fail_streams(&self, code: tonic::Code) -> usize {
        self.events.send(StreamSignal::Fail(code)).unwrap_or(0)
    }

    /// The last event the runtime emitted about `id`, rebuilt as a stale copy: the
    /// same payload with its original shape (for duplicate / stale event tests).
    pub fn event_about(
        &self,
        id: &str,
        kind: cri::ContainerEventType,
    ) -> cri::ContainerEventResponse {
        let st = self.lock();
        let sandbox_id = st
            .containers
            .get(id)
            .map(|c| c.sandbox_id.clone())
            .unwrap_or_else(|| id.to_string());
        cri::ContainerEventResponse {
            container_id: id.to_string(),
            container_event_type: kind as i32,
            created_at: now_ns(),
            pod_sandbox_status: st
                .sandboxes
                .get(&sandbox_id)
                .map(|s| st.sandbox_status_wire(s)),
            containers_statuses: st
                .containers_in(&sandbox_id)
                .map(|c| st.container_status_wire(c))
                .collect(),
        }
    }

    /// Number of open event streams.
    pub fn event_streams(&self) -> usize {
        self.events.receiver_count()
    }

    /// Sends a raw envelope to every containerd event subscriber (garbage, other
    /// namespaces, duplicates). Returns how many it reached.
    pub fn inject_task_event(&self, env: Envelope) -> usize {
        self.task_events
            .send(StreamSignal::Event(Box::new(env)))
            .unwrap_or(0)
    }

    /// Ends every containerd event subscription cleanly (EOF). Returns how many.
    pub fn close_task_streams(&self) -> usize {
        self.task_events.send(StreamSignal::Close).unwrap_or(0)
    }

    /// Fails every containerd event subscription with `code`. Returns how many.
    pub fn fail_task_streams(&self, code: tonic::Code) -> usize {
        self.task_events.send(StreamSignal::Fail(code)).unwrap_or(0)
    }

    /// Number of open containerd event subscriptions.
    pub fn task_event_streams(&self) -> usize {
        self.task_events.receiver_count()
    }

    /// Stops (or resumes) the task events of exits, so a test can send its own at the
    /// moment it chooses (real containerd publishes a task's exit before CRI records
    /// it). CRI events are unaffected.
    pub fn set_task_events(&self, on: bool) {
        self.lock().no_task_events = !on;
    }

    /// The filters of the last containerd event subscription.
    pub fn task_filters(&self) -> Vec<String> {
        self.lock().task_filters.clone()
    }

    /// A CRI event about `id` (a container or a sandbox) in the shape containerd sends.
    fn emit(&self, st: &State, id: &str, kind: cri::ContainerEventType) {
        let sandbox_id = match st.containers.get(id) {
            Some(c) => c.sandbox_id.clone(),
            None => id.to_string(),
        };
        let Some(sandbox) = st.sandboxes.get(&sandbox_id) else {
            return;
        };
        let containers_statuses = st
            .containers_in(&sandbox_id)
            .map(|c| st.container_status_wire(c))
            .collect();
        self.send_filtered(
            st,
            cri::ContainerEventResponse {
                container_id: id.to_string(),
                container_event_type: kind as i32,
                created_at: now_ns(),
                pod_sandbox_status: Some(st.sandbox_status_wire(sandbox)),
                containers_statuses,
            },
        );
    }

    /// Sends an emitted event through the [`EventFilter`], if any.
    fn send_filtered(&self, st: &State, ev: cri::ContainerEventResponse) {
        let out = match &st.event_filter {
            Some(filter) => filter(ev),
            None => vec![ev],
        };
        for ev in out {
            let _ = self.events.send(StreamSignal::Event(Box::new(ev)));
        }
    }

    /// Counts the call, waits while the op is held, applies latency, then the scripted
    /// failure if any.
    async fn enter(&self, op: Op, pod_uid: Option<&str>) -> Result<(), RuntimeError> {
        let latency = {
            let mut st = self.lock();
            *st.calls.entry(op).or_default() += 1;
            st.latency.get(&op).copied().unwrap_or_default()
        };
        self.wait_while_held(op).await;
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        let mut st = self.lock();
        if let Some(uid) = pod_uid {
            if st.failing_pods.contains(uid) {
                return Err(RuntimeError::Rpc {
                    op: op_name(op),
                    code: tonic::Code::Unavailable,
                    message: format!("injected status failure for pod {uid}"),
                });
            }
        }
        if let Some(f) = st.failures.get_mut(&op) {
            let code = f.code;
            match &mut f.remaining {
                Some(0) => {
                    st.failures.remove(&op);
                }
                Some(n) => {
                    *n -= 1;
                    if *n == 0 {
                        st.failures.remove(&op);
                    }
                    return Err(injected(op, code));
                }
                None => return Err(injected(op, code)),
            }
        }
        Ok(())
    }
}

fn op_name(op: Op) -> &'static str {
    match op {
        Op::Version => "Version",
        Op::ListSandboxes => "ListPodSandbox",
        Op::ListContainers | Op::FindContainer => "ListContainers",
        Op::SandboxStatus => "PodSandboxStatus",
        Op::ContainerStatus => "ContainerStatus",
        Op::Events => "GetContainerEvents",
        Op::TaskEvents => "Events/Subscribe",
    }
}

/// A container as ListContainers has it.
fn listed_container(c: &ContainerStatus) -> Container {
    Container {
        id: c.id.clone(),
        sandbox_id: c.sandbox_id.clone(),
        name: c.name.clone(),
        attempt: c.attempt,
        state: c.state,
        created_at: c.created_at,
    }
}

/// A task event of the CRI namespace, as containerd sends it.
fn task_event(topic: &str, container_id: &str) -> Envelope {
    let mut env =
        containerd_events::envelope(containerd_events::CRI_NAMESPACE, topic, container_id);
    let now = now_ns();
    env.timestamp = Some(prost_types::Timestamp {
        seconds: now / 1_000_000_000,
        nanos: (now % 1_000_000_000) as i32,
    });
    env
}

/// The items of one event subscription, from `rx`: quiet (like containerd) until the
/// first event when `quiet`; a `Close` ends it, a `Fail` fails it.
async fn subscription<T: Clone + Send + 'static>(
    mut rx: broadcast::Receiver<StreamSignal<T>>,
    quiet: bool,
    op: Op,
) -> Result<futures::stream::BoxStream<'static, Result<T, RuntimeError>>, RuntimeError> {
    let mut first = None;
    if quiet {
        loop {
            match rx.recv().await {
                Ok(StreamSignal::Event(ev)) => {
                    first = Some(Ok(*ev));
                    break;
                }
                Ok(StreamSignal::Close) | Err(broadcast::error::RecvError::Closed) => {
                    return Ok(futures::stream::empty().boxed())
                }
                Ok(StreamSignal::Fail(code)) => return Err(injected(op, code)),
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
            }
        }
    }
    let rest = futures::stream::unfold(Some(rx), move |rx| async move {
        let mut rx = rx?;
        loop {
            match rx.recv().await {
                Ok(StreamSignal::Event(ev)) => return Some((Ok(*ev), Some(rx))),
                Ok(StreamSignal::Close) => return None,
                Ok(StreamSignal::Fail(code)) => {
                    return Some((Err(injected(op, code)), None));
                }
                // A slow reader loses events, as with a real runtime's buffer.
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    Ok(futures::stream::iter(first).chain(rest).boxed())
}

fn injected(op: Op, code: tonic::Code) -> RuntimeError {
    RuntimeError::Rpc {
        op: op_name(op),
        code,
        message: "injected failure".into(),
    }
}

fn not_found(op: Op, id: &str) -> RuntimeError {
    RuntimeError::Rpc {
        op: op_name(op),
        code: tonic::Code::NotFound,
        message: format!("{id} not found"),
    }
}

#[async_trait]
impl RuntimeClient for FakeRuntime {
    async fn version(&self) -> Result<RuntimeVersion, RuntimeError> {
        self.enter(Op::Version, None).await?;
        Ok(self.version.clone())
    }

    async fn list_sandboxes(&self, id: Option<&str>) -> Result<Vec<Sandbox>, RuntimeError> {
        self.enter(Op::ListSandboxes, None).await?;
        let st = self.lock();
        Ok(match id {
            Some(id) => st.sandboxes.get(id).cloned().into_iter().collect(),
            None => st.sandboxes.values().cloned().collect(),
        })
    }

    async fn list_containers(
        &self,
        sandbox_id: Option<&str>,
    ) -> Result<Vec<Container>, RuntimeError> {
        self.enter(Op::ListContainers, None).await?;
        let st = self.lock();
        let listed: Box<dyn Iterator<Item = &ContainerStatus>> = match sandbox_id {
            Some(id) => Box::new(st.containers_in(id)),
            None => Box::new(st.containers.values()),
        };
        Ok(listed.map(listed_container).collect())
    }

    async fn container_by_id(&self, id: &str) -> Result<Option<Container>, RuntimeError> {
        self.enter(Op::FindContainer, None).await?;
        Ok(self.lock().containers.get(id).map(listed_container))
    }

    async fn sandbox_status(&self, sandbox_id: &str) -> Result<Sandbox, RuntimeError> {
        let uid = self
            .lock()
            .sandboxes
            .get(sandbox_id)
            .map(|s| s.pod.uid.clone());
        self.enter(Op::SandboxStatus, uid.as_deref()).await?;
        self.lock()
            .sandboxes
            .get(sandbox_id)
            .cloned()
            .ok_or_else(|| not_found(Op::SandboxStatus, sandbox_id))
    }

    async fn container_status(&self, container_id: &str) -> Result<ContainerStatus, RuntimeError> {
        let uid = {
            let st = self.lock();
            st.containers
                .get(container_id)
                .and_then(|c| st.sandboxes.get(&c.sandbox_id))
                .map(|s| s.pod.uid.clone())
        };
        self.enter(Op::ContainerStatus, uid.as_deref()).await?;
        self.lock()
            .containers
            .get(container_id)
            .cloned()
            .ok_or_else(|| not_found(Op::ContainerStatus, container_id))
    }

    async fn container_events(&self) -> Result<EventStream, RuntimeError> {
        self.enter(Op::Events, None).await?;
        let rx = self.events.subscribe();
        let quiet = self.lock().quiet_until_first_event;
        subscription(rx, quiet, Op::Events).await
    }

    /// Every subscriber gets every task event (containerd's event service), whatever
    /// its filters (recorded: [`FakeRuntime::task_filters`]).
    async fn task_events(&self) -> Result<TaskEventStream, RuntimeError> {
        self.enter(Op::TaskEvents, None).await?;
        let rx = self.task_events.subscribe();
        let quiet = {
            let mut st = self.lock();
            st.task_filters = containerd_events::subscribe_filters();
            st.quiet_until_first_event
        };
        subscription(rx, quiet, Op::TaskEvents).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Regression: every create scanned every object, so `plegd demo --pods 20000`
    /// took 29 s to start (60,000: not up after 40 s). Linear, 60,000 pods with two
    /// containers each take about a second here; the bound is only there to fail a
    /// quadratic runtime, which needs minutes.
    #[test]
    fn a_large_node_is_built_in_linear_time() {
        let rt = FakeRuntime::new();
        let start = std::time::Instant::now();
        for i in 0..60_000 {
            let sb = rt.run_pod(&format!("u{i}"), "web", "ns");
            rt.run_container(&sb, "app");
            rt.run_container(&sb, "sidecar");
        }
        let took = start.elapsed();
        println!("60,000 pods in {took:?}");
        assert_eq!(rt.pod_count(), 60_000);
        assert!(took < Duration::from_secs(60), "{took:?}");
        let sb = &rt.sandboxes_of("u59999")[0];
        assert_eq!(rt.containers_of(sb).len(), 2);
        rt.remove_pod(sb);
        assert!(rt.sandboxes_of("u59999").is_empty());
        assert_eq!(rt.pod_count(), 59_999);
    }

    #[tokio::test]
    async fn the_event_filter_drops_duplicates_and_changes_events() {
        let rt = FakeRuntime::new();
        let mut events = rt.container_events().await.unwrap();
        // Drop CREATED events, send STARTED twice, strip the UID of the rest.
        rt.set_event_filter(Some(Arc::new(|mut ev: cri::ContainerEventResponse| {
            use cri::ContainerEventType::*;
            match cri::ContainerEventType::try_from(ev.container_event_type) {
                Ok(ContainerCreatedEvent) => vec![],
                Ok(ContainerStartedEvent) => vec![ev.clone(), ev],
                _ => {
                    if let Some(m) = ev
                        .pod_sandbox_status
                        .as_mut()
                        .and_then(|s| s.metadata.as_mut())
                    {
                        m.uid.clear();
                    }
                    vec![ev]
                }
            }
        })));
        let sb = rt.run_pod("u1", "p1", "ns");
        assert_eq!(rt.sandbox(&sb).unwrap().state, SandboxState::Ready);
        rt.stop_pod(&sb);
        assert_eq!(rt.sandbox(&sb).unwrap().state, SandboxState::NotReady);
        // Injected events bypass the filter.
        let raw = rt.event_about(&sb, cri::ContainerEventType::ContainerCreatedEvent);
        rt.inject_event(raw);
        let mut got = vec![];
        for _ in 0..4 {
            let ev = events.next().await.unwrap().unwrap();
            let uid = ev
                .pod_sandbox_status
                .and_then(|s| s.metadata)
                .map(|m| m.uid);
            got.push((ev.container_event_type, uid));
        }
        use cri::ContainerEventType::*;
        let u1 = Some("u1".to_string());
        assert_eq!(
            got,
            vec![
                (ContainerStartedEvent as i32, u1.clone()),
                (ContainerStartedEvent as i32, u1.clone()),
                (ContainerStoppedEvent as i32, Some(String::new())),
                (ContainerCreatedEvent as i32, u1),
            ]
        );
        rt.set_event_filter(None);
        assert!(rt.sandbox("nope").is_none());
    }

    #[tokio::test]
    async fn scripted_failures_count_down() {
        let rt = FakeRuntime::new();
        rt.fail(Op::ListSandboxes, tonic::Code::Unavailable, Some(2));
        assert!(rt.list_sandboxes(None).await.is_err());
        assert!(rt.list_sandboxes(None).await.is_err());
        assert!(rt.list_sandboxes(None).await.is_ok());
        assert_eq!(rt.calls(Op::ListSandboxes), 3);
    }

    #[tokio::test]
    async fn pod_lifecycle_is_visible_in_lists_and_events() {
        let rt = FakeRuntime::new();
        let mut events = rt.container_events().await.unwrap();
        let sb = rt.run_pod("u1", "p1", "ns");
        let c = rt.run_container(&sb, "app");
        rt.exit_container(&c, 3);
        let cs = rt.list_containers(Some(&sb)).await.unwrap();
        assert_eq!(cs.len(), 1);
        assert_eq!(cs[0].state, ContainerState::Exited);
        let mut kinds = vec![];
        for _ in 0..5 {
            let ev = events.next().await.unwrap().unwrap();
            kinds.push(ev.container_event_type);
        }
        use cri::ContainerEventType::*;
        assert_eq!(
            kinds,
            vec![
                ContainerCreatedEvent as i32,
                ContainerStartedEvent as i32,
                ContainerCreatedEvent as i32,
                ContainerStartedEvent as i32,
                ContainerStoppedEvent as i32
            ]
        );
        rt.remove_pod(&sb);
        assert_eq!(rt.pod_count(), 0);
        assert!(rt.container_status(&c).await.unwrap_err().is_not_found());
    }
}
