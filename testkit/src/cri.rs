//! The busybox pod every real-runtime driver makes: a host-network pod (network NODE,
//! PID and IPC namespaces of the pod: no CNI needed) whose containers run `sh -c
//! SCRIPT` in the busybox image `scripts/containerd-up.sh` imports (no registry).
//! [`pod_config`] and [`container_config`] build the CRI configs; [`Busybox`] is a
//! client that makes, reads and removes such pods, every call returning an error
//! (the runtime is outside the process) with a deadline of its own.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use plegd_runtime::cri;
use plegd_runtime::cri::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

/// The busybox image `scripts/containerd-up.sh` builds and imports.
pub const BUSYBOX: &str = "localhost/pleg/busybox:1.0";

/// Deadline of each unary call (a loaded 2-core machine).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// The pod's namespaces: the node's network, its own PID and IPC.
pub fn host_namespaces() -> cri::NamespaceOption {
    cri::NamespaceOption {
        network: cri::NamespaceMode::Node as i32,
        pid: cri::NamespaceMode::Pod as i32,
        ipc: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    }
}

/// `key=value` on everything one driver makes (to find its leftovers).
pub fn labels(label: (&str, &str)) -> HashMap<String, String> {
    [(label.0.to_string(), label.1.to_string())].into()
}

/// What names a pod.
#[derive(Clone, Debug)]
pub struct PodSpec {
    pub name: String,
    pub uid: String,
    pub namespace: String,
    pub attempt: u32,
    pub log_directory: String,
    pub labels: HashMap<String, String>,
}

/// A host-network pod's sandbox config.
pub fn pod_config(spec: PodSpec) -> cri::PodSandboxConfig {
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: spec.name,
            uid: spec.uid,
            namespace: spec.namespace,
            attempt: spec.attempt,
        }),
        log_directory: spec.log_directory,
        labels: spec.labels,
        linux: Some(cri::LinuxPodSandboxConfig {
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(host_namespaces()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// What a container runs.
#[derive(Clone, Debug)]
pub struct ContainerSpec<'a> {
    pub name: &'a str,
    pub attempt: u32,
    pub image: &'a str,
    /// Run as `sh -c SCRIPT`.
    pub script: &'a str,
    /// Relative to the pod's log directory.
    pub log_path: String,
    pub labels: HashMap<String, String>,
    /// The cgroup's memory limit, bytes.
    pub memory_limit: Option<i64>,
}

/// A container config for a pod made by [`pod_config`].
pub fn container_config(spec: ContainerSpec<'_>) -> cri::ContainerConfig {
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: spec.name.to_string(),
            attempt: spec.attempt,
        }),
        image: Some(cri::ImageSpec {
            image: spec.image.to_string(),
            ..Default::default()
        }),
        command: vec!["sh".into(), "-c".into(), spec.script.into()],
        log_path: spec.log_path,
        labels: spec.labels,
        linux: Some(cri::LinuxContainerConfig {
            security_context: Some(cri::LinuxContainerSecurityContext {
                namespace_options: Some(host_namespaces()),
                ..Default::default()
            }),
            resources: spec.memory_limit.map(|bytes| cri::LinuxContainerResources {
                memory_limit_in_bytes: bytes,
                ..Default::default()
            }),
        }),
        ..Default::default()
    }
}

/// `"pid": 1234` out of containerd's verbose container info (a JSON object); `None`
/// for none or 0.
pub fn pid_of(info: &str) -> Option<u32> {
    let at = info.find("\"pid\"")?;
    let rest = info[at + 5..].trim_start().strip_prefix(':')?.trim_start();
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok().filter(|p| *p > 0)
}

/// A CRI call that failed: which call (and on what), and the runtime's answer.
#[derive(Debug, thiserror::Error)]
#[error("{call}: {status}")]
pub struct CallError {
    pub call: String,
    pub status: tonic::Status,
}

impl CallError {
    pub fn code(&self) -> tonic::Code {
        self.status.code()
    }
}

fn failed(call: impl Into<String>) -> impl FnOnce(tonic::Status) -> CallError {
    let call = call.into();
    move |status| CallError { call, status }
}

fn req<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(CALL_TIMEOUT);
    r
}

/// Who makes the pods: their label, namespace and UID prefix.
#[derive(Clone, Copy, Debug)]
pub struct Owner {
    /// The label key (value `true`) on every pod and container.
    pub label: &'static str,
    pub namespace: &'static str,
    /// UIDs are `PREFIX-PID-N-NANOS`.
    pub uid_prefix: &'static str,
}

/// A pod sandbox made by [`Busybox::run_pod`].
#[derive(Clone, Debug)]
pub struct Pod {
    pub id: String,
    pub uid: String,
    pub name: String,
    pub namespace: String,
    pub config: cri::PodSandboxConfig,
}

static POD_SEQ: AtomicU64 = AtomicU64::new(0);

/// A CRI v1 client for busybox pods. Build it inside the runtime that uses it (tonic
/// spawns the connection on the current runtime).
#[derive(Clone)]
pub struct Busybox {
    pub client: RuntimeServiceClient<Channel>,
    channel: Channel,
    logs: PathBuf,
    owner: Owner,
}

impl Busybox {
    /// A client of the runtime on `socket`; pod logs go under `logs`.
    pub fn connect(socket: &Path, logs: &Path, owner: Owner) -> Busybox {
        let channel = plegd_runtime::unix_channel(socket);
        Busybox {
            client: RuntimeServiceClient::new(channel.clone()),
            channel,
            logs: logs.to_path_buf(),
            owner,
        }
    }

    /// The channel (for other services on the same socket).
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    fn c(&self) -> RuntimeServiceClient<Channel> {
        self.client.clone()
    }

    /// CRI Version, with a deadline of 5 s.
    pub async fn version(&self) -> Result<cri::VersionResponse, tonic::Status> {
        let mut r = tonic::Request::new(cri::VersionRequest::default());
        r.set_timeout(Duration::from_secs(5));
        self.c().version(r).await.map(|r| r.into_inner())
    }

    /// Runs a host-network pod named `name`; its log directory is made first.
    pub async fn run_pod(&self, name: &str) -> Result<Pod, CallError> {
        let n = POD_SEQ.fetch_add(1, Ordering::Relaxed);
        let uid = format!(
            "{}-{}-{n}-{}",
            self.owner.uid_prefix,
            std::process::id(),
            plegd_runtime::now_ns() % 1_000_000_000
        );
        let log_dir = self.logs.join(&uid);
        std::fs::create_dir_all(&log_dir).map_err(|e| CallError {
            call: format!("creating {}", log_dir.display()),
            status: tonic::Status::internal(e.to_string()),
        })?;
        let namespace = self.owner.namespace.to_string();
        let config = pod_config(PodSpec {
            name: name.to_string(),
            uid: uid.clone(),
            namespace: namespace.clone(),
            attempt: 0,
            log_directory: log_dir.display().to_string(),
            labels: labels((self.owner.label, "true")),
        });
        let id = self
            .c()
            .run_pod_sandbox(req(cri::RunPodSandboxRequest {
                config: Some(config.clone()),
                ..Default::default()
            }))
            .await
            .map_err(failed(format!("RunPodSandbox {name}")))?
            .into_inner()
            .pod_sandbox_id;
        Ok(Pod {
            id,
            uid,
            name: name.to_string(),
            namespace,
            config,
        })
    }

    /// Creates a busybox container running `sh -c script` (not started), with a memory
    /// limit when `memory_limit` is given.
    pub async fn create_container(
        &self,
        pod: &Pod,
        name: &str,
        script: &str,
        memory_limit: Option<i64>,
    ) -> Result<String, CallError> {
        let config = container_config(ContainerSpec {
            name,
            attempt: 0,
            image: BUSYBOX,
            script,
            log_path: format!("{name}.log"),
            labels: labels((self.owner.label, "true")),
            memory_limit,
        });
        Ok(self
            .c()
            .create_container(req(cri::CreateContainerRequest {
                pod_sandbox_id: pod.id.clone(),
                config: Some(config),
                sandbox_config: Some(pod.config.clone()),
            }))
            .await
            .map_err(failed(format!(
                "CreateContainer {name} (image {BUSYBOX}: imported by scripts/containerd-up.sh)"
            )))?
            .into_inner()
            .container_id)
    }

    pub async fn start_container(&self, id: &str) -> Result<(), CallError> {
        self.c()
            .start_container(req(cri::StartContainerRequest {
                container_id: id.to_string(),
            }))
            .await
            .map_err(failed(format!("StartContainer {id}")))?;
        Ok(())
    }

    /// Creates and starts a container; returns its ID.
    pub async fn run_container(
        &self,
        pod: &Pod,
        name: &str,
        script: &str,
    ) -> Result<String, CallError> {
        let id = self.create_container(pod, name, script, None).await?;
        self.start_container(&id).await?;
        Ok(id)
    }

    /// CRI StopContainer (SIGTERM, SIGKILL after `timeout_s`).
    pub async fn stop_container(&self, id: &str, timeout_s: i64) -> Result<(), CallError> {
        self.c()
            .stop_container(req(cri::StopContainerRequest {
                container_id: id.to_string(),
                timeout: timeout_s,
            }))
            .await
            .map_err(failed(format!("StopContainer {id}")))?;
        Ok(())
    }

    /// RemoveContainer; one already gone is not an error.
    pub async fn remove_container(&self, id: &str) -> Result<(), CallError> {
        let removed = self
            .c()
            .remove_container(req(cri::RemoveContainerRequest {
                container_id: id.to_string(),
            }))
            .await;
        gone_is_fine(removed, format!("RemoveContainer {id}"))
    }

    pub async fn status(
        &self,
        id: &str,
        verbose: bool,
    ) -> Result<cri::ContainerStatusResponse, CallError> {
        Ok(self
            .c()
            .container_status(req(cri::ContainerStatusRequest {
                container_id: id.to_string(),
                verbose,
            }))
            .await
            .map_err(failed(format!("ContainerStatus {id}")))?
            .into_inner())
    }

    /// The container's status (an answer without one is an error).
    pub async fn container_status(&self, id: &str) -> Result<cri::ContainerStatus, CallError> {
        self.status(id, false)
            .await?
            .status
            .ok_or_else(|| CallError {
                call: format!("ContainerStatus {id}"),
                status: tonic::Status::internal("no status in the answer"),
            })
    }

    /// The host PID of the container's process (verbose ContainerStatus: the JSON in
    /// info["info"] has "pid").
    pub async fn pid(&self, id: &str) -> Result<u32, CallError> {
        let resp = self.status(id, true).await?;
        let pid = resp.info.get("info").and_then(|info| pid_of(info));
        pid.ok_or_else(|| CallError {
            call: format!("ContainerStatus {id}"),
            status: tonic::Status::internal(format!("no pid in the verbose info {:?}", resp.info)),
        })
    }

    /// Every pod sandbox on the node.
    pub async fn pods(&self) -> Result<Vec<cri::PodSandbox>, CallError> {
        Ok(self
            .c()
            .list_pod_sandbox(req(cri::ListPodSandboxRequest::default()))
            .await
            .map_err(failed("ListPodSandbox"))?
            .into_inner()
            .items)
    }

    /// StopPodSandbox then RemovePodSandbox (its containers go with it); a pod already
    /// gone is not an error.
    pub async fn remove_pod(&self, id: &str) -> Result<(), CallError> {
        let stopped = self
            .c()
            .stop_pod_sandbox(req(cri::StopPodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            }))
            .await;
        gone_is_fine(stopped, format!("StopPodSandbox {id}"))?;
        let removed = self
            .c()
            .remove_pod_sandbox(req(cri::RemovePodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            }))
            .await;
        gone_is_fine(removed, format!("RemovePodSandbox {id}"))
    }
}

fn gone_is_fine<T>(answer: Result<T, tonic::Status>, call: String) -> Result<(), CallError> {
    match answer {
        Err(status) if status.code() != tonic::Code::NotFound => Err(CallError { call, status }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pid_is_read_from_containerds_verbose_info() {
        assert_eq!(
            pid_of(r#"{"sandboxID":"ab","pid":4242,"removing":false}"#),
            Some(4242)
        );
        assert_eq!(pid_of(r#"{"pid" : 7}"#), Some(7));
        assert_eq!(pid_of(r#"{"pid":0}"#), None);
        assert_eq!(pid_of("{}"), None);
        assert_eq!(pid_of("not json"), None);
    }

    #[test]
    fn the_pod_shares_the_nodes_network_only() {
        let config = pod_config(PodSpec {
            name: "p".into(),
            uid: "u".into(),
            namespace: "ns".into(),
            attempt: 2,
            log_directory: "/logs/u".into(),
            labels: labels(("owner", "true")),
        });
        let ns = config
            .linux
            .and_then(|l| l.security_context)
            .and_then(|s| s.namespace_options);
        assert_eq!(ns, Some(host_namespaces()));
        assert_eq!(host_namespaces().network, cri::NamespaceMode::Node as i32);
        assert_eq!(host_namespaces().pid, cri::NamespaceMode::Pod as i32);
        assert_eq!(config.metadata.map(|m| m.attempt), Some(2));
    }
}
