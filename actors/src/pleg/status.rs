//! A pod's full status: PodSandboxStatus of each sandbox + ContainerStatus of each
//! container (containerd 1.7's PodSandboxStatus carries no container statuses).

use futures::future::try_join_all;

use super::record::PodRecord;
use plegd_runtime::{ContainerStatus, PodRef, RuntimeClient, RuntimeError, Sandbox};

/// What the cache holds for a pod: read from the runtime, never from an event payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodStatus {
    pub pod: PodRef,
    pub sandboxes: Vec<Sandbox>,
    pub containers: Vec<ContainerStatus>,
}

/// Reads every sandbox and container of the record, concurrently. Any failure fails
/// the whole read: a partial status would look like a change that did not happen.
pub async fn read_pod_status(
    runtime: &dyn RuntimeClient,
    record: &PodRecord,
) -> Result<PodStatus, RuntimeError> {
    let sandboxes = try_join_all(record.sandboxes.keys().map(|id| runtime.sandbox_status(id)));
    let containers = try_join_all(record.containers.iter().map(|(id, (sb, _))| async move {
        let mut st = runtime.container_status(id).await?;
        st.sandbox_id = sb.clone();
        Ok::<_, RuntimeError>(st)
    }));
    let (sandboxes, containers) = futures::try_join!(sandboxes, containers)?;
    Ok(PodStatus {
        pod: record.pod.clone(),
        sandboxes,
        containers,
    })
}
