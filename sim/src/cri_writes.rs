//! The CRI write RPCs, mapped onto `FakeRuntime`'s scripting methods, so that a CRI
//! client (crictl, a test) can drive the simulator as it would drive containerd.
//! They change state and emit the same events as scripting the runtime directly;
//! fault injection (`FakeRuntime::fail`) applies to the read RPCs only.

use crate::fake::FakeRuntime;
use crate::kubelet::ContainerMeta;
use plegd_runtime::cri;
use plegd_runtime::ContainerState;
use tonic::Status;

/// Exit code of a container stopped by StopContainer: SIGTERM, honoured.
pub const STOP_EXIT_CODE: i32 = 143;
/// Exit code of a running container removed by RemoveContainer: SIGKILL.
pub const KILL_EXIT_CODE: i32 = 137;

fn required<'a>(op: &str, field: &str, value: &'a str) -> Result<&'a str, Status> {
    if value.is_empty() {
        Err(Status::invalid_argument(format!(
            "{op}: {field} is required"
        )))
    } else {
        Ok(value)
    }
}

/// RunPodSandbox: a ready sandbox with the config's labels and annotations (as
/// given: the runtime adds none). The attempt is the runtime's count of the pod's
/// sandboxes, not `metadata.attempt`.
pub(crate) fn run_pod_sandbox(
    runtime: &FakeRuntime,
    req: cri::RunPodSandboxRequest,
) -> Result<cri::RunPodSandboxResponse, Status> {
    let config = req.config.unwrap_or_default();
    let meta = config
        .metadata
        .ok_or_else(|| Status::invalid_argument("RunPodSandbox: config.metadata is required"))?;
    let uid = required("RunPodSandbox", "config.metadata.uid", &meta.uid)?;
    Ok(cri::RunPodSandboxResponse {
        pod_sandbox_id: runtime.run_pod_with_meta(
            uid,
            &meta.name,
            &meta.namespace,
            config.labels.into_iter().collect(),
            config.annotations,
        ),
    })
}

/// CreateContainer: a created container with the config's labels and annotations,
/// and its image if that is an image ID (`sha256:...`, as kubelet gives it). The
/// attempt is the runtime's count of same-named containers in the sandbox, not
/// `metadata.attempt`.
pub(crate) fn create_container(
    runtime: &FakeRuntime,
    req: cri::CreateContainerRequest,
) -> Result<cri::CreateContainerResponse, Status> {
    let op = "CreateContainer";
    let sandbox_id = required(op, "pod_sandbox_id", &req.pod_sandbox_id)?;
    let config = req.config.unwrap_or_default();
    let name = config.metadata.map(|m| m.name).unwrap_or_default();
    let name = required(op, "config.metadata.name", &name)?;
    let meta = ContainerMeta {
        labels: config.labels,
        annotations: config.annotations,
        image_id: config
            .image
            .map(|i| i.image)
            .filter(|i| i.starts_with("sha256:"))
            .unwrap_or_default(),
        mounts: config.mounts,
        log_path: config.log_path,
        resources: config.linux.and_then(|l| l.resources),
        user: None,
    };
    runtime
        .create_container_with_meta(sandbox_id, name, meta)
        .map(|container_id| cri::CreateContainerResponse { container_id })
        .ok_or_else(|| Status::not_found(format!("{op}: sandbox {sandbox_id} not found")))
}

/// StartContainer: only a created container can start.
pub(crate) fn start_container(runtime: &FakeRuntime, id: &str) -> Result<(), Status> {
    let op = "StartContainer";
    let c = runtime
        .container(required(op, "container_id", id)?)
        .ok_or_else(|| Status::not_found(format!("{op}: container {id} not found")))?;
    if c.state != ContainerState::Created {
        return Err(Status::failed_precondition(format!(
            "{op}: container {id} is {:?}, not Created",
            c.state
        )));
    }
    runtime.start_container(id);
    Ok(())
}

/// StopContainer: the container exits with [`STOP_EXIT_CODE`]; idempotent.
pub(crate) fn stop_container(runtime: &FakeRuntime, id: &str) -> Result<(), Status> {
    let op = "StopContainer";
    let c = runtime
        .container(required(op, "container_id", id)?)
        .ok_or_else(|| Status::not_found(format!("{op}: container {id} not found")))?;
    if c.state != ContainerState::Exited {
        runtime.exit_container(id, STOP_EXIT_CODE);
    }
    Ok(())
}

/// RemoveContainer: a running container is killed first; idempotent.
pub(crate) fn remove_container(runtime: &FakeRuntime, id: &str) -> Result<(), Status> {
    let id = required("RemoveContainer", "container_id", id)?;
    if runtime
        .container(id)
        .is_some_and(|c| c.state == ContainerState::Running)
    {
        runtime.exit_container(id, KILL_EXIT_CODE);
    }
    runtime.remove_container(id);
    Ok(())
}

/// StopPodSandbox: running containers are killed, the sandbox becomes not ready;
/// idempotent (an unknown sandbox is already stopped).
pub(crate) fn stop_pod_sandbox(runtime: &FakeRuntime, id: &str) -> Result<(), Status> {
    runtime.stop_pod(required("StopPodSandbox", "pod_sandbox_id", id)?);
    Ok(())
}

/// RemovePodSandbox: the sandbox and its containers go; idempotent.
pub(crate) fn remove_pod_sandbox(runtime: &FakeRuntime, id: &str) -> Result<(), Status> {
    runtime.remove_pod(required("RemovePodSandbox", "pod_sandbox_id", id)?);
    Ok(())
}
