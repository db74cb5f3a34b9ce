//! The harness's CRI client for a real containerd: the test kit's busybox pods
//! (`plegd_testkit::cri`, as the integration tests make them), the reads of a
//! targeted relist timed, and raw event subscribers stamping each event on receipt.
//! Every call returns an error (never panics): the runtime is outside the process.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _, Result};
use plegd_runtime::containerd_events::{
    self, EventsClient, SubscribeRequest, TaskEvent, TaskTopic,
};
use plegd_runtime::cri;
use plegd_runtime::cri::runtime_service_client::RuntimeServiceClient;
use plegd_testkit::cri::{Busybox, Owner, CALL_TIMEOUT};
use tonic::transport::Channel;

pub use plegd_testkit::cri::Pod;

/// Who the benchmark's pods belong to.
const OWNER: Owner = Owner {
    label: "plegd-bench",
    namespace: "plegd-bench",
    uid_prefix: "plegd-bench",
};
/// A checking subscriber's reads of a stopped container until its status says EXITED.
const VERIFY_TRIES: usize = 5;

/// What a checking subscriber reads the moment a CONTAINER_STOPPED_EVENT arrives (and
/// again while the container's status does not say EXITED yet).
#[derive(Clone, Copy, Debug)]
pub enum Check {
    /// A targeted relist's reads, as plegd makes them: both filtered lists of the pod
    /// and the container's ContainerStatus, in flight together (a client that checks
    /// an event before it reports it).
    PodReads,
    /// The container's ContainerStatus alone (a client that only polls the status).
    Status,
}
/// Runs until killed: the container's process is the sleep itself, so a SIGKILL of
/// it is the container's exit (nothing left behind in the pod's PID namespace).
const SLEEP_SCRIPT: &str = "exec sleep 3600";

fn req<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(CALL_TIMEOUT);
    r
}

/// The test kit's busybox-pod client, with the benchmark's timed reads and raw event
/// subscribers.
#[derive(Clone)]
pub struct RealCri {
    busybox: Busybox,
}

impl RealCri {
    /// A client of `endpoint` (`unix:///path`); pod logs go under `logs`. Build it
    /// inside the runtime that uses it.
    pub fn new(endpoint: &str, logs: &Path) -> Result<RealCri> {
        let socket = plegd_runtime::parse_unix_endpoint(endpoint)
            .map_err(|e| anyhow!("--containerd {endpoint:?}: {e}"))?;
        Ok(RealCri {
            busybox: Busybox::connect(&socket, logs, OWNER),
        })
    }

    fn c(&self) -> RuntimeServiceClient<Channel> {
        self.busybox.client.clone()
    }

    /// The runtime's name and version ("containerd", "v2.1.9").
    pub async fn version(&self) -> Result<(String, String)> {
        let v = self
            .busybox
            .version()
            .await
            .map_err(|s| anyhow!("{:?}: {}", s.code(), s.message()))?;
        Ok((v.runtime_name, v.runtime_version))
    }

    /// Runs a host-network pod named `name`.
    pub async fn run_pod(&self, name: &str) -> Result<Pod> {
        Ok(self.busybox.run_pod(name).await?)
    }

    /// Creates and starts a busybox container that runs until killed; returns its ID.
    pub async fn run_container(&self, pod: &Pod, name: &str) -> Result<String> {
        Ok(self.busybox.run_container(pod, name, SLEEP_SCRIPT).await?)
    }

    /// The host PID of the container's process.
    pub async fn pid(&self, id: &str) -> Result<u32> {
        Ok(self.busybox.pid(id).await?)
    }

    /// The container's `finished_at` (ns since the epoch; 0 while it runs).
    pub async fn finished_at(&self, id: &str) -> Result<i64> {
        Ok(self.status(id).await?.finished_at)
    }

    /// The container's ContainerStatus.
    async fn status(&self, id: &str) -> Result<cri::ContainerStatus> {
        self.c()
            .container_status(req(cri::ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: false,
            }))
            .await
            .with_context(|| format!("ContainerStatus {id}"))?
            .into_inner()
            .status
            .with_context(|| format!("ContainerStatus {id}: no status"))
    }

    /// Times the reads of a targeted relist of this container's pod, as plegd makes
    /// them: ListPodSandbox and ListContainers filtered by its sandbox, in flight
    /// together, then the container's ContainerStatus. (The sandbox is looked up
    /// first, untimed.) Returns (both lists, ContainerStatus).
    pub async fn time_targeted_reads(&self, id: &str) -> Result<(Duration, Duration)> {
        let sandbox = self
            .c()
            .list_containers(req(cri::ListContainersRequest {
                filter: Some(cri::ContainerFilter {
                    id: id.to_string(),
                    ..Default::default()
                }),
            }))
            .await
            .with_context(|| format!("ListContainers {id}"))?
            .into_inner()
            .containers
            .into_iter()
            .next()
            .with_context(|| format!("ListContainers {id}: not listed"))?
            .pod_sandbox_id;
        let start = Instant::now();
        self.pod_lists(&sandbox).await?;
        let lists = start.elapsed();
        let start = Instant::now();
        self.finished_at(id).await?;
        Ok((lists, start.elapsed()))
    }

    /// A targeted relist's lists of `sandbox`'s pod ([`crate::cri::pod_lists`]).
    async fn pod_lists(&self, sandbox: &str) -> Result<()> {
        crate::cri::pod_lists(&self.c(), sandbox, Some(CALL_TIMEOUT)).await
    }

    /// StopPodSandbox then RemovePodSandbox (its containers go with it).
    pub async fn remove_pod(&self, id: &str) -> Result<()> {
        Ok(self.busybox.remove_pod(id).await?)
    }

    /// Opens a raw GetContainerEvents stream on `rt`, stamping every
    /// CONTAINER_STOPPED_EVENT when it arrives.
    pub fn raw_stopped_events(&self, rt: &tokio::runtime::Runtime) -> RawExits {
        let mut client = self.c();
        RawExits::spawn(rt, move |sink| async move {
            // containerd sends no headers before the first event: this resolves then.
            let mut stream = client
                .get_container_events(cri::GetEventsRequest::default())
                .await?
                .into_inner();
            while let Some(ev) = stream.message().await? {
                let at = Instant::now();
                if ev.container_event_type == cri::ContainerEventType::ContainerStoppedEvent as i32
                {
                    sink.record(ev.container_id, at);
                }
            }
            Ok(())
        })
    }

    /// Opens a raw GetContainerEvents stream on `rt` that checks each stopped container
    /// the moment its CONTAINER_STOPPED_EVENT arrives, with `check`'s reads, sent again
    /// until the container's status says EXITED. [`RawExits::wait`] gives when the
    /// answers that said so were all in, [`RawExits::arrived`] when the event came.
    /// While `quiet` is set it reads nothing: the answer is then the arrival.
    pub fn checked_stopped_events(
        &self,
        rt: &tokio::runtime::Runtime,
        check: Check,
        quiet: Arc<AtomicBool>,
    ) -> RawExits {
        let mut client = self.c();
        let reader = self.clone();
        RawExits::spawn(rt, move |sink| async move {
            let mut stream = client
                .get_container_events(cri::GetEventsRequest::default())
                .await?
                .into_inner();
            while let Some(ev) = stream.message().await? {
                let at = Instant::now();
                if ev.container_event_type != cri::ContainerEventType::ContainerStoppedEvent as i32
                {
                    continue;
                }
                let sandbox = ev.pod_sandbox_status.map(|s| s.id).unwrap_or_default();
                sink.arrive(ev.container_id.clone(), at);
                if quiet.load(Ordering::SeqCst) {
                    sink.record(ev.container_id, at);
                    continue;
                }
                let (reader, sink) = (reader.clone(), sink.clone());
                tokio::spawn(async move {
                    for _ in 0..VERIFY_TRIES {
                        match reader.check(check, &sandbox, &ev.container_id).await {
                            Ok(true) => {
                                sink.record(ev.container_id, Instant::now());
                                return;
                            }
                            Ok(false) => continue,
                            // Counted as never checked: the row shows fewer samples.
                            Err(_) => return,
                        }
                    }
                });
            }
            Ok(())
        })
    }

    /// `check`'s reads of `sandbox`'s pod and `id`, all in flight together; true if
    /// ContainerStatus said EXITED.
    async fn check(&self, check: Check, sandbox: &str, id: &str) -> Result<bool> {
        let status = match check {
            Check::PodReads => futures::try_join!(self.pod_lists(sandbox), self.status(id))?.1,
            Check::Status => self.status(id).await?,
        };
        Ok(status.state == cri::ContainerState::ContainerExited as i32)
    }

    /// Subscribes on `rt` to containerd's own event service (the task exit, OOM and
    /// delete topics of the CRI namespace, as plegd's containerd-events source does),
    /// stamping every /tasks/exit when it arrives. containerd publishes these to every
    /// subscriber, on 1.7 as on 2.x.
    pub fn raw_task_exits(&self, rt: &tokio::runtime::Runtime) -> RawExits {
        let mut client = EventsClient::new(self.busybox.channel());
        RawExits::spawn(rt, move |sink| async move {
            let mut stream = client
                .subscribe(SubscribeRequest {
                    filters: containerd_events::subscribe_filters(),
                })
                .await?
                .into_inner();
            while let Some(env) = stream.message().await? {
                let at = Instant::now();
                if let TaskEvent::Task {
                    topic: TaskTopic::Exit,
                    container_id,
                } = containerd_events::read(&env)
                {
                    sink.record(container_id, at);
                }
            }
            Ok(())
        })
    }
}

/// SIGKILLs `pids` with one `kill` (one process sends every signal, so a burst's
/// processes die within microseconds of each other); returns when it was started.
pub fn kill(pids: &[u32]) -> Result<Instant> {
    let at = Instant::now();
    let status = std::process::Command::new("kill")
        .arg("-KILL")
        .args(pids.iter().map(|p| p.to_string()))
        .status()
        .context("running kill")?;
    if !status.success() {
        return Err(anyhow!("kill -KILL {pids:?}: {status}"));
    }
    Ok(at)
}

#[derive(Default)]
struct RawState {
    stopped: HashMap<String, Instant>,
    /// A verifying stream's event arrivals (`stopped` then holds the reads' end).
    arrived: HashMap<String, Instant>,
    ended: Option<String>,
    /// Also tell each arrival, record and the end on stdout, as they happen (a poller
    /// in a process of its own: `poller_process`).
    echo: bool,
    /// Called with the container of each first arrival, as it is stamped.
    on_arrival: Option<OnArrival>,
}

type OnArrival = Arc<dyn Fn(&str) + Send + Sync>;

#[derive(Default)]
pub(crate) struct RawSeen {
    state: Mutex<RawState>,
    changed: Condvar,
}

impl RawSeen {
    fn lock(&self) -> std::sync::MutexGuard<'_, RawState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Calls `hook` with the container of each first arrival, from now on.
    pub(crate) fn on_arrival(&self, hook: impl Fn(&str) + Send + Sync + 'static) {
        self.lock().on_arrival = Some(Arc::new(hook));
    }

    /// A verifying stream's first exit event of `id` arrived `at`.
    pub(crate) fn arrive(&self, id: String, at: Instant) {
        let mut s = self.lock();
        if s.echo {
            crate::poller_process::tell(crate::poller_process::ARRIVED, &id);
        }
        let hook = match s.on_arrival.clone() {
            Some(hook) if !s.arrived.contains_key(&id) => Some((hook, id.clone())),
            _ => None,
        };
        s.arrived.entry(id).or_insert(at);
        drop(s);
        if let Some((hook, id)) = hook {
            hook(&id);
        }
    }

    /// The first exit event of `id` arrived `at`.
    pub(crate) fn record(&self, id: String, at: Instant) {
        let mut s = self.lock();
        if s.echo {
            crate::poller_process::tell(crate::poller_process::RECORDED, &id);
        }
        s.stopped.entry(id).or_insert(at);
        self.changed.notify_all();
    }

    /// The stream is over, for `why`.
    pub(crate) fn end(&self, why: String) {
        let mut s = self.lock();
        if s.echo {
            crate::poller_process::tell(crate::poller_process::ENDED, &why);
        }
        s.ended = Some(why);
        self.changed.notify_all();
    }

    /// When the first exit event of `id` arrived.
    pub(crate) fn arrived(&self, id: &str) -> Option<Instant> {
        self.lock().arrived.get(id).copied()
    }

    /// When `id` was first recorded.
    #[cfg(test)]
    pub(crate) fn recorded(&self, id: &str) -> Option<Instant> {
        self.lock().stopped.get(id).copied()
    }
}

/// What ends a raw subscriber when its [`RawExits`] is dropped.
enum Subscriber {
    /// A task on the harness's runtime.
    Task(tokio::task::JoinHandle<()>),
    /// A process of its own (`poller_process`).
    Process(crate::poller_process::Child),
}

/// A raw event subscriber (no plegd) recording when each container's exit event
/// arrived; closed on drop.
pub struct RawExits {
    seen: Arc<RawSeen>,
    subscriber: Subscriber,
}

impl RawExits {
    /// Runs `stream` (which records into the sink it is given) on `rt`; its end or
    /// error is kept and reported by [`Self::wait`].
    fn spawn<F, Fut>(rt: &tokio::runtime::Runtime, stream: F) -> RawExits
    where
        F: FnOnce(Arc<RawSeen>) -> Fut,
        Fut: std::future::Future<Output = Result<(), tonic::Status>> + Send + 'static,
    {
        let seen = Arc::new(RawSeen::default());
        let (sink, fut) = (seen.clone(), stream(seen.clone()));
        let task = rt.spawn(async move {
            let why = match fut.await {
                Ok(()) => "the stream ended".to_string(),
                Err(e) => format!("{:?}: {}", e.code(), e.message()),
            };
            sink.end(why);
        });
        RawExits {
            seen,
            subscriber: Subscriber::Task(task),
        }
    }

    /// A subscriber in `child`, which tells what it sees into `seen`.
    pub(crate) fn in_process(seen: Arc<RawSeen>, child: crate::poller_process::Child) -> RawExits {
        RawExits {
            seen,
            subscriber: Subscriber::Process(child),
        }
    }

    /// Tells each arrival, record and the end on stdout from now on (the end at once
    /// if it came already).
    pub(crate) fn echo(&self) {
        let mut s = self.seen.lock();
        s.echo = true;
        if let Some(why) = &s.ended {
            crate::poller_process::tell(crate::poller_process::ENDED, why);
        }
    }

    /// Quiets a subscriber in a process of its own as `quiet` says, once it has
    /// taken it (one on the harness's runtime reads the shared flag itself).
    pub fn set_quiet(&self, quiet: bool) -> Result<()> {
        match &self.subscriber {
            Subscriber::Task(_) => Ok(()),
            Subscriber::Process(child) => child.set_quiet(quiet),
        }
    }

    /// Calls `hook` with the container of each exit event's first arrival, from now
    /// on, as it is stamped (on the subscriber's runtime: keep it short).
    pub fn on_arrival(&self, hook: impl Fn(&str) + Send + Sync + 'static) {
        self.seen.on_arrival(hook);
    }

    /// When a verifying stream got `id`'s exit event.
    pub fn arrived(&self, id: &str) -> Option<Instant> {
        self.seen.arrived(id)
    }

    /// Waits for the CONTAINER_STOPPED_EVENT of each of `ids` (or `patience`); returns
    /// when each arrived, in the order of `ids`.
    pub fn wait(&self, ids: &[String], patience: Duration) -> Result<Vec<Option<Instant>>> {
        let deadline = Instant::now() + patience;
        let mut s = self.seen.lock();
        loop {
            if let Some(why) = &s.ended {
                return Err(anyhow!("a raw event stream failed: {why}"));
            }
            let now = Instant::now();
            if ids.iter().all(|id| s.stopped.contains_key(id)) || now >= deadline {
                return Ok(ids.iter().map(|id| s.stopped.get(id).copied()).collect());
            }
            s = self
                .seen
                .changed
                .wait_timeout(s, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }
}

impl Drop for RawExits {
    fn drop(&mut self) {
        if let Subscriber::Task(task) = &self.subscriber {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::RawSeen;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    #[test]
    fn the_arrival_hook_hears_each_container_once_after_its_stamp() {
        let seen = Arc::new(RawSeen::default());
        seen.arrive("before".into(), Instant::now());
        let heard = Arc::new(Mutex::new(Vec::new()));
        let (h, s) = (heard.clone(), seen.clone());
        seen.on_arrival(move |id| {
            // Stamped already, and the lock is free.
            assert!(s.arrived(id).is_some());
            h.lock().unwrap().push(id.to_string());
        });
        for id in ["a", "b", "a", "before"] {
            seen.arrive(id.into(), Instant::now());
        }
        assert_eq!(*heard.lock().unwrap(), ["a", "b"]);
    }
}
