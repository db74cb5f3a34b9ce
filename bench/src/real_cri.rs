//! The harness's CRI client for a real containerd, made the way the integration tests
//! make theirs (`integration-tests/src/containerd.rs`): host-network pods (no CNI),
//! busybox containers from the local image `scripts/containerd-up.sh` imports (no
//! registry), and a raw GetContainerEvents subscriber stamping each event on receipt.
//! Every call returns an error (never panics): the runtime is outside the process.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context as _, Result};
use plegd_runtime::containerd_events::{
    self, EventsClient, SubscribeRequest, TaskEvent, TaskTopic,
};
use plegd_runtime::cri;
use plegd_runtime::cri::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

/// The busybox image `scripts/containerd-up.sh` builds and imports.
pub const BUSYBOX: &str = "localhost/pleg/busybox:1.0";
/// Label on every pod made here.
const LABEL: &str = "plegd-bench";
/// Reads of a stopped container's pod until its status says EXITED.
const VERIFY_TRIES: usize = 5;
/// Deadline of each unary call (a loaded 2-core machine).
const CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Runs until killed: the container's process is the sleep itself, so a SIGKILL of
/// it is the container's exit (nothing left behind in the pod's PID namespace).
const SLEEP_SCRIPT: &str = "exec sleep 3600";

fn req<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(CALL_TIMEOUT);
    r
}

fn host_namespaces() -> Option<cri::NamespaceOption> {
    Some(cri::NamespaceOption {
        network: cri::NamespaceMode::Node as i32,
        pid: cri::NamespaceMode::Pod as i32,
        ipc: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    })
}

/// A pod sandbox made by [`RealCri::run_pod`].
pub struct Pod {
    pub id: String,
    config: cri::PodSandboxConfig,
}

#[derive(Clone)]
pub struct RealCri {
    client: RuntimeServiceClient<Channel>,
    channel: Channel,
    logs: PathBuf,
}

impl RealCri {
    /// A client of `endpoint` (`unix:///path`); pod logs go under `logs`. Build it
    /// inside the runtime that uses it.
    pub fn new(endpoint: &str, logs: &Path) -> Result<RealCri> {
        let socket = plegd_runtime::parse_unix_endpoint(endpoint)
            .map_err(|e| anyhow!("--containerd {endpoint:?}: {e}"))?;
        let channel = plegd_runtime::unix_channel(&socket);
        Ok(RealCri {
            client: RuntimeServiceClient::new(channel.clone()),
            channel,
            logs: logs.to_path_buf(),
        })
    }

    fn c(&self) -> RuntimeServiceClient<Channel> {
        self.client.clone()
    }

    /// The runtime's name and version ("containerd", "v2.1.9").
    pub async fn version(&self) -> Result<(String, String)> {
        let mut r = tonic::Request::new(cri::VersionRequest::default());
        r.set_timeout(Duration::from_secs(5));
        let v = self
            .c()
            .version(r)
            .await
            .map_err(|s| anyhow!("{:?}: {}", s.code(), s.message()))?
            .into_inner();
        Ok((v.runtime_name, v.runtime_version))
    }

    /// Runs a host-network pod named `name`.
    pub async fn run_pod(&self, name: &str) -> Result<Pod> {
        let uid = format!(
            "plegd-bench-{}-{name}-{}",
            std::process::id(),
            plegd_runtime::now_ns() % 1_000_000_000
        );
        let log_dir = self.logs.join(&uid);
        std::fs::create_dir_all(&log_dir)
            .with_context(|| format!("creating {}", log_dir.display()))?;
        let config = cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.to_string(),
                uid,
                namespace: "plegd-bench".into(),
                attempt: 0,
            }),
            log_directory: log_dir.display().to_string(),
            labels: [(LABEL.to_string(), "true".to_string())].into(),
            linux: Some(cri::LinuxPodSandboxConfig {
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: host_namespaces(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let id = self
            .c()
            .run_pod_sandbox(req(cri::RunPodSandboxRequest {
                config: Some(config.clone()),
                ..Default::default()
            }))
            .await
            .with_context(|| format!("RunPodSandbox {name}"))?
            .into_inner()
            .pod_sandbox_id;
        Ok(Pod { id, config })
    }

    /// Creates and starts a busybox container that runs until stopped; returns its ID.
    pub async fn run_container(&self, pod: &Pod, name: &str) -> Result<String> {
        let config = cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: name.to_string(),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: BUSYBOX.to_string(),
                ..Default::default()
            }),
            command: vec!["sh".into(), "-c".into(), SLEEP_SCRIPT.into()],
            log_path: format!("{name}.log"),
            labels: [(LABEL.to_string(), "true".to_string())].into(),
            linux: Some(cri::LinuxContainerConfig {
                security_context: Some(cri::LinuxContainerSecurityContext {
                    namespace_options: host_namespaces(),
                    ..Default::default()
                }),
                resources: None,
            }),
            ..Default::default()
        };
        let id = self
            .c()
            .create_container(req(cri::CreateContainerRequest {
                pod_sandbox_id: pod.id.clone(),
                config: Some(config),
                sandbox_config: Some(pod.config.clone()),
            }))
            .await
            .with_context(|| format!("CreateContainer {name} (image {BUSYBOX}: imported by scripts/containerd-up.sh)"))?
            .into_inner()
            .container_id;
        self.c()
            .start_container(req(cri::StartContainerRequest {
                container_id: id.clone(),
            }))
            .await
            .with_context(|| format!("StartContainer {name}"))?;
        Ok(id)
    }

    /// The host PID of the container's process (verbose ContainerStatus: the JSON in
    /// info["info"] has "pid").
    pub async fn pid(&self, id: &str) -> Result<u32> {
        let resp = self
            .c()
            .container_status(req(cri::ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: true,
            }))
            .await
            .with_context(|| format!("ContainerStatus {id}"))?
            .into_inner();
        let info = resp
            .info
            .get("info")
            .with_context(|| format!("ContainerStatus {id}: no verbose info"))?;
        pid_of(info).with_context(|| format!("ContainerStatus {id}: no pid in {info}"))
    }

    /// The container's `finished_at` (ns since the epoch; 0 while it runs).
    pub async fn finished_at(&self, id: &str) -> Result<i64> {
        let st = self
            .c()
            .container_status(req(cri::ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: false,
            }))
            .await
            .with_context(|| format!("ContainerStatus {id}"))?
            .into_inner()
            .status
            .with_context(|| format!("ContainerStatus {id}: no status"))?;
        Ok(st.finished_at)
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

    /// A targeted relist's lists of `sandbox`'s pod: ListPodSandbox and ListContainers
    /// filtered by it, in flight together.
    async fn pod_lists(&self, sandbox: &str) -> Result<()> {
        let (mut a, mut b) = (self.c(), self.c());
        futures::try_join!(
            async {
                a.list_pod_sandbox(req(cri::ListPodSandboxRequest {
                    filter: Some(cri::PodSandboxFilter {
                        id: sandbox.to_string(),
                        ..Default::default()
                    }),
                }))
                .await
                .with_context(|| format!("ListPodSandbox {sandbox}"))
            },
            async {
                b.list_containers(req(cri::ListContainersRequest {
                    filter: Some(cri::ContainerFilter {
                        pod_sandbox_id: sandbox.to_string(),
                        ..Default::default()
                    }),
                }))
                .await
                .with_context(|| format!("ListContainers of {sandbox}"))
            }
        )?;
        Ok(())
    }

    /// StopPodSandbox then RemovePodSandbox (its containers go with it).
    pub async fn remove_pod(&self, id: &str) -> Result<()> {
        self.c()
            .stop_pod_sandbox(req(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            }))
            .await
            .with_context(|| format!("StopPodSandbox {id}"))?;
        self.c()
            .remove_pod_sandbox(req(cri::RemovePodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            }))
            .await
            .with_context(|| format!("RemovePodSandbox {id}"))?;
        Ok(())
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

    /// Opens a raw GetContainerEvents stream on `rt` that reads each stopped
    /// container's pod the moment its CONTAINER_STOPPED_EVENT arrives, as a client that
    /// checks an event before it reports it must, with plegd's reads: both filtered
    /// lists and the container's ContainerStatus, in flight together (again if the
    /// status does not say EXITED yet). [`RawExits::wait`] gives when those answers
    /// were all in, [`RawExits::arrived`] when the event came.
    pub fn verified_stopped_events(&self, rt: &tokio::runtime::Runtime) -> RawExits {
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
                let (reader, sink) = (reader.clone(), sink.clone());
                tokio::spawn(async move {
                    for _ in 0..VERIFY_TRIES {
                        match reader.read_pod_of(&sandbox, &ev.container_id).await {
                            Ok(true) => break,
                            Ok(false) => continue,
                            // Counted as never verified: the row shows fewer samples.
                            Err(_) => return,
                        }
                    }
                    sink.record(ev.container_id, Instant::now());
                });
            }
            Ok(())
        })
    }

    /// A targeted relist's reads of `sandbox`'s pod and `id`, all in flight together;
    /// true if ContainerStatus said EXITED.
    async fn read_pod_of(&self, sandbox: &str, id: &str) -> Result<bool> {
        let mut c = self.c();
        let (_, st) = futures::try_join!(self.pod_lists(sandbox), async {
            c.container_status(req(cri::ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: false,
            }))
            .await
            .with_context(|| format!("ContainerStatus {id}"))
        })?;
        Ok(st
            .into_inner()
            .status
            .is_some_and(|s| s.state == cri::ContainerState::ContainerExited as i32))
    }

    /// Subscribes on `rt` to containerd's own event service (the task exit, OOM and
    /// delete topics of the CRI namespace, as plegd's containerd-events source does),
    /// stamping every /tasks/exit when it arrives. containerd publishes these to every
    /// subscriber, on 1.7 as on 2.x.
    pub fn raw_task_exits(&self, rt: &tokio::runtime::Runtime) -> RawExits {
        let mut client = EventsClient::new(self.channel.clone());
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

/// `pid` of containerd's verbose container info (a JSON object).
fn pid_of(info: &str) -> Option<u32> {
    let v: serde_json::Value = serde_json::from_str(info).ok()?;
    v["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .filter(|p| *p > 0)
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
}

#[derive(Default)]
struct RawSeen {
    state: Mutex<RawState>,
    changed: Condvar,
}

impl RawSeen {
    fn lock(&self) -> std::sync::MutexGuard<'_, RawState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A verifying stream's first exit event of `id` arrived `at`.
    fn arrive(&self, id: String, at: Instant) {
        self.lock().arrived.entry(id).or_insert(at);
    }

    /// The first exit event of `id` arrived `at`.
    fn record(&self, id: String, at: Instant) {
        self.lock().stopped.entry(id).or_insert(at);
        self.changed.notify_all();
    }
}

/// A raw event subscriber (no plegd) recording when each container's exit event
/// arrived; closed on drop.
pub struct RawExits {
    seen: Arc<RawSeen>,
    task: tokio::task::JoinHandle<()>,
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
            sink.lock().ended = Some(why);
            sink.changed.notify_all();
        });
        RawExits { seen, task }
    }

    /// When a verifying stream got `id`'s exit event.
    pub fn arrived(&self, id: &str) -> Option<Instant> {
        self.seen.lock().arrived.get(id).copied()
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
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_pid_is_read_from_containerds_verbose_info() {
        use super::pid_of;
        assert_eq!(
            pid_of(r#"{"sandboxID":"ab","pid":4242,"removing":false}"#),
            Some(4242)
        );
        assert_eq!(pid_of(r#"{"pid":0}"#), None);
        assert_eq!(pid_of("{}"), None);
        assert_eq!(pid_of("not json"), None);
    }
}
