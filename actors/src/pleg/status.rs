//! A pod's full status: PodSandboxStatus of each sandbox + ContainerStatus of each
//! container (containerd 1.7's PodSandboxStatus carries no container statuses).

use futures::future::try_join_all;
use tokio::sync::Semaphore;

use super::record::PodRecord;
use plegd_runtime::{ContainerStatus, PodRef, RuntimeClient, RuntimeError, Sandbox};

/// What the cache holds for a pod: read from the runtime, never from an event payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodStatus {
    pub pod: PodRef,
    pub sandboxes: Vec<Sandbox>,
    pub containers: Vec<ContainerStatus>,
}

/// Reads every sandbox and container of the record, concurrently within `calls` (the
/// relist's bound on calls in flight). A container that answers NotFound is gone (it
/// went away after the list) and is left out, as kubelet does; any other failure fails
/// the whole read: a partial status would look like a change that did not happen.
pub async fn read_pod_status(
    runtime: &dyn RuntimeClient,
    record: &PodRecord,
    calls: &Semaphore,
) -> Result<PodStatus, RuntimeError> {
    let sandboxes = try_join_all(record.sandboxes.keys().map(|id| async move {
        let _permit = calls.acquire().await;
        runtime.sandbox_status(id).await
    }));
    let containers = try_join_all(record.containers.iter().map(|(id, (sb, _))| async move {
        let _permit = calls.acquire().await;
        match runtime.container_status(id).await {
            Ok(mut st) => {
                st.sandbox_id = sb.clone();
                Ok(Some(st))
            }
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }));
    let (sandboxes, containers) = futures::try_join!(sandboxes, containers)?;
    Ok(PodStatus {
        pod: record.pod.clone(),
        sandboxes,
        containers: containers.into_iter().flatten().collect(),
    })
}
