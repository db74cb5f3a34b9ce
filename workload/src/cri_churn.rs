//! sim's churn acted out over CRI: [`CriChurn`] implements `plegd_sim::ChurnRuntime`
//! with the project's own CRI client (`plegd_runtime::CriRuntime` for reads, the
//! generated `RuntimeServiceClient`/`ImageServiceClient` for the rest), turning each
//! churn step into the calls a kubelet makes, and logging each one. Its pods are the
//! test kit's host-network pods (`plegd_testkit::cri`).
//!
//! Churn is synchronous (it runs on the main thread); each call here is a
//! `block_on` on the workload's tokio runtime, bounded by the request timeout.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use plegd_runtime::cri;
use plegd_runtime::cri::image_service_client::ImageServiceClient;
use plegd_runtime::cri::runtime_service_client::RuntimeServiceClient;
use plegd_runtime::{
    parse_unix_endpoint, unix_channel, Container, ContainerState, CriRuntime, PodRef,
    RuntimeClient, RuntimeError, RuntimeVersion,
};
use plegd_sim::{ChurnRuntime, KILL_EXIT_CODE};
use plegd_testkit::cri::{container_config, labels, pod_config, ContainerSpec, PodSpec};
use tokio::runtime::Handle;
use tonic::transport::Channel;

/// The label on everything this tool creates, to find leftovers of an earlier run.
pub const LABEL: (&str, &str) = ("plegd-demo", "workload");

/// What each container runs: sleeps until stopped. busybox `sh` as PID 1 ignores
/// SIGTERM unless it traps it; `wait` is interruptible, so a graceful stop exits 143.
const SLEEPER: &str = "trap 'exit 143' TERM; while true; do sleep 3600 & wait; done";

/// Grace period of a StopContainer that asks nicely (SIGTERM, trapped: exit 143).
const STOP_GRACE_SECS: i64 = 2;

/// The workload's settings that shape the CRI objects it creates.
#[derive(Debug, Clone)]
pub struct PodTemplate {
    pub image: String,
    pub log_root: String,
}

/// A CRI runtime, driven the way `plegd_sim::Churn` asks.
pub struct CriChurn {
    handle: Handle,
    endpoint: String,
    reads: CriRuntime,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    timeout: Duration,
    template: PodTemplate,
    /// Sandbox ID -> the config it was run with (CreateContainer needs it again).
    sandboxes: Mutex<HashMap<String, cri::PodSandboxConfig>>,
    /// Container ID -> "namespace/pod/container", for the log.
    containers: Mutex<HashMap<String, String>>,
}

impl CriChurn {
    /// The clients (lazy: nothing is dialled yet) on `handle`'s runtime.
    pub fn new(
        handle: Handle,
        endpoint: &str,
        timeout: Duration,
        template: PodTemplate,
    ) -> Result<Self, RuntimeError> {
        let socket = parse_unix_endpoint(endpoint)?;
        // tonic spawns each channel's worker on the current runtime.
        let _entered = handle.enter();
        Ok(CriChurn {
            reads: CriRuntime::new(endpoint, timeout)?,
            runtime: RuntimeServiceClient::new(unix_channel(&socket)),
            images: ImageServiceClient::new(unix_channel(&socket)),
            handle: handle.clone(),
            endpoint: endpoint.to_string(),
            timeout,
            template,
            sandboxes: Mutex::default(),
            containers: Mutex::default(),
        })
    }

    /// Waits until the runtime answers CRI Version (checking every second), for at
    /// most `wait`, or until `stopping()` says to give up.
    pub fn wait_for_runtime(
        &self,
        wait: Duration,
        stopping: impl Fn() -> bool,
    ) -> anyhow::Result<Option<RuntimeVersion>> {
        let deadline = Instant::now() + wait;
        let mut said = false;
        loop {
            match self.handle.block_on(self.reads.check()) {
                Ok(v) => return Ok(Some(v)),
                Err(e) if Instant::now() >= deadline => {
                    return Err(e).with_context(|| {
                        format!("the runtime did not answer within {}", pretty(wait))
                    })
                }
                Err(e) => {
                    if !said {
                        tracing::info!(endpoint = %self.endpoint, error = %e, "waiting for the runtime");
                        said = true;
                    }
                }
            }
            if stopping() {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_secs(1).min(wait));
        }
    }

    /// Pulls the containers' image unless the runtime has it. A runtime without an
    /// image service (plegd's simulator) is told nothing and used as it is.
    pub fn ensure_image(&self) -> anyhow::Result<()> {
        let image = self.template.image.clone();
        let spec = Some(cri::ImageSpec {
            image: image.clone(),
            ..Default::default()
        });
        let mut images = self.images.clone();
        let status = self.call("ImageStatus", self.timeout, async {
            images
                .image_status(cri::ImageStatusRequest {
                    image: spec.clone(),
                    verbose: false,
                })
                .await
        });
        match status {
            Ok(s) if s.image.is_some() => return Ok(()),
            Ok(_) => {}
            Err(e) if e.code() == tonic::Code::Unimplemented => {
                tracing::warn!(endpoint = %self.endpoint, "the runtime has no CRI image service: not pulling {image}");
                return Ok(());
            }
            Err(e) => return Err(e).context(format!("cannot look up image {image}")),
        }
        tracing::info!("pulling {image}");
        let mut images = self.images.clone();
        let pulled = self
            .call("PullImage", self.timeout * 10, async {
                images
                    .pull_image(cri::PullImageRequest {
                        image: spec.clone(),
                        ..Default::default()
                    })
                    .await
            })
            .with_context(|| format!("cannot pull image {image}"))?;
        tracing::info!("pulled {image} ({})", pulled.image_ref);
        Ok(())
    }

    /// Stops and removes the sandboxes labelled as this tool's (an earlier run's).
    pub fn remove_leftovers(&self) -> anyhow::Result<usize> {
        let mut runtime = self.runtime.clone();
        let filter = cri::PodSandboxFilter {
            label_selector: labels(LABEL),
            ..Default::default()
        };
        let listed = self.call("ListPodSandbox", self.timeout, async {
            runtime
                .list_pod_sandbox(cri::ListPodSandboxRequest {
                    filter: Some(filter),
                })
                .await
        })?;
        for s in &listed.items {
            let name = s
                .metadata
                .as_ref()
                .map(|m| format!("{}/{}", m.namespace, m.name))
                .unwrap_or_default();
            tracing::info!("removing pod {name} (sandbox {}): left over", short(&s.id));
            self.stop_sandbox(&s.id)?;
            self.remove_sandbox(&s.id)?;
        }
        Ok(listed.items.len())
    }

    /// Runs one CRI call on the runtime, bounded by `timeout`.
    fn call<T>(
        &self,
        op: &'static str,
        timeout: Duration,
        call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, RuntimeError> {
        match self
            .handle
            .block_on(async { tokio::time::timeout(timeout, call).await })
        {
            Err(_) => Err(RuntimeError::Timeout { op, timeout }),
            Ok(Err(status)) => Err(RuntimeError::Rpc {
                op,
                code: status.code(),
                message: status.message().to_string(),
            }),
            Ok(Ok(response)) => Ok(response.into_inner()),
        }
    }

    fn sandbox_config(&self, pod: &PodRef, attempt: u32) -> cri::PodSandboxConfig {
        pod_config(PodSpec {
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            namespace: pod.namespace.clone(),
            attempt,
            log_directory: format!(
                "{}/{}_{}_{}",
                self.template.log_root, pod.namespace, pod.name, pod.uid
            ),
            labels: labels(LABEL),
        })
    }

    fn container_config(&self, name: &str, attempt: u32) -> cri::ContainerConfig {
        container_config(ContainerSpec {
            name,
            attempt,
            image: &self.template.image,
            script: SLEEPER,
            log_path: format!("{name}/{attempt}.log"),
            labels: labels(LABEL),
            memory_limit: None,
        })
    }

    fn remove_container(&self, id: &str) -> Result<(), RuntimeError> {
        let mut runtime = self.runtime.clone();
        let request = cri::RemoveContainerRequest {
            container_id: id.into(),
        };
        self.call("RemoveContainer", self.timeout, async {
            runtime.remove_container(request).await
        })?;
        lock(&self.containers).remove(id);
        Ok(())
    }

    /// "namespace/name (sandbox ID)" of a sandbox this run made, else its ID.
    fn describe_sandbox(&self, sandbox_id: &str) -> String {
        match lock(&self.sandboxes)
            .get(sandbox_id)
            .and_then(|c| c.metadata.as_ref())
        {
            Some(m) => format!("{}/{} (sandbox {})", m.namespace, m.name, short(sandbox_id)),
            None => format!("sandbox {}", short(sandbox_id)),
        }
    }

    fn describe(&self, container_id: &str) -> String {
        lock(&self.containers)
            .get(container_id)
            .cloned()
            .unwrap_or_else(|| short(container_id).to_string())
    }
}

impl ChurnRuntime for CriChurn {
    fn run_sandbox(&self, pod: &PodRef) -> Result<String, RuntimeError> {
        // A new attempt each time: the runtime reserves (name, namespace, uid, attempt).
        let attempt = self
            .handle
            .block_on(self.reads.list_sandboxes(None))?
            .iter()
            .filter(|s| s.pod.uid == pod.uid)
            .map(|s| s.attempt + 1)
            .max()
            .unwrap_or(0);
        let config = self.sandbox_config(pod, attempt);
        let mut runtime = self.runtime.clone();
        let request = cri::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        };
        let id = self
            .call("RunPodSandbox", self.timeout, async {
                runtime.run_pod_sandbox(request).await
            })?
            .pod_sandbox_id;
        tracing::info!(
            "pod {}/{} (uid {}): sandbox {} running, attempt {attempt}",
            pod.namespace,
            pod.name,
            pod.uid,
            short(&id)
        );
        lock(&self.sandboxes).insert(id.clone(), config);
        Ok(id)
    }

    fn stop_sandbox(&self, sandbox_id: &str) -> Result<(), RuntimeError> {
        let mut runtime = self.runtime.clone();
        let request = cri::StopPodSandboxRequest {
            pod_sandbox_id: sandbox_id.into(),
        };
        self.call("StopPodSandbox", self.timeout, async {
            runtime.stop_pod_sandbox(request).await
        })?;
        tracing::info!("pod {} stopped", self.describe_sandbox(sandbox_id));
        Ok(())
    }

    fn remove_sandbox(&self, sandbox_id: &str) -> Result<(), RuntimeError> {
        let mut runtime = self.runtime.clone();
        let request = cri::RemovePodSandboxRequest {
            pod_sandbox_id: sandbox_id.into(),
        };
        self.call("RemovePodSandbox", self.timeout, async {
            runtime.remove_pod_sandbox(request).await
        })?;
        tracing::info!("pod {} removed", self.describe_sandbox(sandbox_id));
        lock(&self.sandboxes).remove(sandbox_id);
        Ok(())
    }

    fn pod_sandboxes(&self, pod_uid: &str) -> Result<Vec<String>, RuntimeError> {
        Ok(self
            .handle
            .block_on(self.reads.list_sandboxes(None))?
            .into_iter()
            .filter(|s| s.pod.uid == pod_uid)
            .map(|s| s.id)
            .collect())
    }

    fn sandbox_containers(&self, sandbox_id: &str) -> Result<Vec<Container>, RuntimeError> {
        self.handle
            .block_on(self.reads.list_containers(Some(sandbox_id)))
    }

    fn launch_container(
        &self,
        pod: &PodRef,
        sandbox_id: &str,
        name: &str,
    ) -> Result<String, RuntimeError> {
        let sandbox_config = lock(&self.sandboxes)
            .get(sandbox_id)
            .cloned()
            .ok_or_else(|| RuntimeError::Invalid {
                op: "CreateContainer",
                reason: format!("sandbox {sandbox_id} was not run by this workload"),
            })?;
        // The next attempt; earlier exited attempts but the newest go, as kubelet's
        // garbage collection would remove them.
        let mut earlier: Vec<Container> = self
            .sandbox_containers(sandbox_id)?
            .into_iter()
            .filter(|c| c.name == name)
            .collect();
        earlier.sort_by_key(|c| c.attempt);
        let attempt = earlier.last().map_or(0, |c| c.attempt + 1);
        for old in earlier.iter().rev().skip(1) {
            if old.state == ContainerState::Exited {
                self.remove_container(&old.id)?;
            }
        }
        let mut runtime = self.runtime.clone();
        let request = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.into(),
            config: Some(self.container_config(name, attempt)),
            sandbox_config: Some(sandbox_config),
        };
        let id = self
            .call("CreateContainer", self.timeout, async {
                runtime.create_container(request).await
            })?
            .container_id;
        let what = format!("{}/{}/{name}", pod.namespace, pod.name);
        let mut runtime = self.runtime.clone();
        let request = cri::StartContainerRequest {
            container_id: id.clone(),
        };
        if let Err(e) = self.call("StartContainer", self.timeout, async {
            runtime.start_container(request).await
        }) {
            // A created container that never starts would block the next attempt.
            if let Err(e) = self.remove_container(&id) {
                tracing::warn!(error = %e, "cannot remove container {} after a failed start", short(&id));
            }
            return Err(e);
        }
        tracing::info!(
            "container {what} started: {}, attempt {attempt}",
            short(&id)
        );
        lock(&self.containers).insert(id.clone(), what);
        Ok(id)
    }

    /// A real runtime picks the exit code: SIGKILL at once for 137 (exit 137), else
    /// SIGTERM, which the container traps (exit 143).
    fn end_container(&self, container_id: &str, exit_code: i32) -> Result<(), RuntimeError> {
        let grace = if exit_code == KILL_EXIT_CODE {
            0
        } else {
            STOP_GRACE_SECS
        };
        let mut runtime = self.runtime.clone();
        let request = cri::StopContainerRequest {
            container_id: container_id.into(),
            timeout: grace,
        };
        self.call(
            "StopContainer",
            self.timeout + Duration::from_secs(grace.unsigned_abs()),
            async { runtime.stop_container(request).await },
        )?;
        let how = if grace == 0 { "SIGKILL" } else { "SIGTERM" };
        tracing::info!("container {} stopped ({how})", self.describe(container_id));
        Ok(())
    }
}

/// A runtime's 64-digit ID cut to 13 characters, as crictl shows them.
fn short(id: &str) -> &str {
    if id.len() > 32 {
        id.get(..13).unwrap_or(id)
    } else {
        id
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn pretty(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}
