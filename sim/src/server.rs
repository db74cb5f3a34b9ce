//! The CRI `RuntimeService` over a [`FakeRuntime`]: the read RPCs plegd uses are
//! answered from the runtime's state (with its scripted faults and latency), the
//! lifecycle RPCs script it, everything else is Unimplemented.

use crate::fake::FakeRuntime;
use futures::stream::BoxStream;
use futures::StreamExt;
use plegd_runtime::cri;
use plegd_runtime::cri::runtime_service_server::RuntimeService;
use plegd_runtime::now_ns;
use plegd_runtime::{RuntimeClient, RuntimeError};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::{cri_writes, filter};

/// The kubelet API version a CRI runtime reports in VersionResponse.version.
const KUBELET_API_VERSION: &str = "0.1.0";

type Reply<T> = Result<Response<T>, Status>;

/// A CRI v1 RuntimeService backed by a [`FakeRuntime`].
#[derive(Clone)]
pub struct CriServer {
    runtime: FakeRuntime,
    /// When this says `true` (or its sender is gone) open event streams end with
    /// Unavailable, as they would when a real runtime goes away; without that, tonic's
    /// graceful shutdown would wait forever for them.
    stopping: Option<watch::Receiver<bool>>,
}

impl CriServer {
    /// A server whose event streams end only when their client goes.
    pub fn new(runtime: FakeRuntime) -> Self {
        CriServer {
            runtime,
            stopping: None,
        }
    }

    /// A server whose event streams end when `stopping` turns true or its sender drops.
    pub fn with_shutdown(runtime: FakeRuntime, stopping: watch::Receiver<bool>) -> Self {
        CriServer {
            runtime,
            stopping: Some(stopping),
        }
    }
}

/// A runtime error as the gRPC status a real runtime would answer with.
pub fn to_status(e: RuntimeError) -> Status {
    Status::new(e.code(), e.to_string())
}

fn unimplemented<T>(method: &str) -> Reply<T> {
    Err(Status::unimplemented(format!(
        "plegd-sim: {method} is not simulated"
    )))
}

impl CriServer {
    /// The runtime this server answers for.
    pub(crate) fn runtime(&self) -> &FakeRuntime {
        &self.runtime
    }

    /// The sandboxes ListPodSandbox (and StreamPodSandboxes) sends for `filter`, the
    /// first one padded ([`FakeRuntime::set_list_padding`]).
    pub(crate) async fn sandboxes_listed(
        &self,
        filter: cri::PodSandboxFilter,
    ) -> Result<Vec<cri::PodSandbox>, Status> {
        let id = Some(filter.id.as_str()).filter(|id| !id.is_empty());
        let listed: Vec<_> = self
            .runtime
            .list_sandboxes(id)
            .await
            .map_err(to_status)?
            .into_iter()
            .filter(|s| filter::sandbox_matches(s, &filter))
            .collect();
        let mut items = self.runtime.sandboxes_to_wire(&listed);
        if let Some(first) = items.first_mut() {
            pad(&mut first.annotations, self.runtime.list_padding());
        }
        Ok(items)
    }

    /// The containers ListContainers (and StreamContainers) sends for `filter`, the
    /// first one padded.
    pub(crate) async fn containers_listed(
        &self,
        filter: cri::ContainerFilter,
    ) -> Result<Vec<cri::Container>, Status> {
        let sandbox = Some(filter.pod_sandbox_id.as_str()).filter(|s| !s.is_empty());
        let listed = if filter.id.is_empty() {
            self.runtime.list_containers(sandbox).await
        } else {
            let found = self.runtime.container_by_id(&filter.id).await;
            found.map(|c| c.into_iter().collect())
        };
        let mut containers = self.runtime.containers_to_wire(&listed.map_err(to_status)?);
        containers.retain(|c| filter::container_matches(c, &filter));
        if let Some(first) = containers.first_mut() {
            pad(&mut first.annotations, self.runtime.list_padding());
        }
        Ok(containers)
    }
}

/// Refuses a message over the server's send limit as grpc-go does (containerd and
/// CRI-O are grpc-go servers): ResourceExhausted, with the sizes in its words.
pub(crate) fn within_send_limit(
    message: &impl tonic_prost::prost::Message,
    limit: Option<usize>,
) -> Result<(), Status> {
    let len = message.encoded_len();
    match limit {
        Some(max) if len > max => Err(Status::resource_exhausted(format!(
            "grpc: trying to send message larger than max ({len} vs. {max})"
        ))),
        _ => Ok(()),
    }
}

/// The scripted list padding ([`FakeRuntime::set_list_padding`]) as one annotation.
fn pad(annotations: &mut std::collections::HashMap<String, String>, bytes: usize) {
    if bytes > 0 {
        annotations.insert("plegd-sim/padding".into(), "x".repeat(bytes));
    }
}

/// Runtime events until the client goes or the server stops.
pub(crate) fn until_stopped<T: Send + 'static>(
    events: BoxStream<'static, Result<T, Status>>,
    stopping: Option<watch::Receiver<bool>>,
) -> BoxStream<'static, Result<T, Status>> {
    let Some(stopping) = stopping else {
        return events.boxed();
    };
    futures::stream::unfold(Some((events, stopping)), |state| async move {
        let (mut events, mut stopping) = state?;
        let next = tokio::select! {
            biased;
            // Ok(true) or Err (sender dropped): either way the server is going.
            _ = async { drop(stopping.wait_for(|s| *s).await) } => None,
            item = events.next() => Some(item),
        };
        match next {
            None => Some((
                Err(Status::unavailable(
                    "plegd-sim: the runtime is shutting down",
                )),
                None,
            )),
            Some(item) => item.map(|item| (item, Some((events, stopping)))),
        }
    })
    .boxed()
}

#[tonic::async_trait]
impl RuntimeService for CriServer {
    async fn version(&self, _: Request<cri::VersionRequest>) -> Reply<cri::VersionResponse> {
        let v = self.runtime.version().await.map_err(to_status)?;
        Ok(Response::new(cri::VersionResponse {
            version: KUBELET_API_VERSION.into(),
            runtime_name: v.runtime_name,
            runtime_version: v.runtime_version,
            runtime_api_version: v.runtime_api_version,
        }))
    }

    async fn run_pod_sandbox(
        &self,
        req: Request<cri::RunPodSandboxRequest>,
    ) -> Reply<cri::RunPodSandboxResponse> {
        cri_writes::run_pod_sandbox(&self.runtime, req.into_inner()).map(Response::new)
    }

    async fn stop_pod_sandbox(
        &self,
        req: Request<cri::StopPodSandboxRequest>,
    ) -> Reply<cri::StopPodSandboxResponse> {
        cri_writes::stop_pod_sandbox(&self.runtime, &req.get_ref().pod_sandbox_id)
            .map(|()| Response::new(cri::StopPodSandboxResponse {}))
    }

    async fn remove_pod_sandbox(
        &self,
        req: Request<cri::RemovePodSandboxRequest>,
    ) -> Reply<cri::RemovePodSandboxResponse> {
        cri_writes::remove_pod_sandbox(&self.runtime, &req.get_ref().pod_sandbox_id)
            .map(|()| Response::new(cri::RemovePodSandboxResponse {}))
    }

    async fn pod_sandbox_status(
        &self,
        req: Request<cri::PodSandboxStatusRequest>,
    ) -> Reply<cri::PodSandboxStatusResponse> {
        let s = self
            .runtime
            .sandbox_status(&req.get_ref().pod_sandbox_id)
            .await
            .map_err(to_status)?;
        // containers_statuses stays empty, as containerd 1.7 leaves it.
        Ok(Response::new(cri::PodSandboxStatusResponse {
            status: Some(self.runtime.sandbox_status_to_wire(&s)),
            timestamp: now_ns(),
            ..Default::default()
        }))
    }

    async fn list_pod_sandbox(
        &self,
        req: Request<cri::ListPodSandboxRequest>,
    ) -> Reply<cri::ListPodSandboxResponse> {
        let filter = req.into_inner().filter.unwrap_or_default();
        let items = self.sandboxes_listed(filter).await?;
        let resp = cri::ListPodSandboxResponse { items };
        within_send_limit(&resp, self.runtime.list_serving().send_limit)?;
        Ok(Response::new(resp))
    }

    async fn create_container(
        &self,
        req: Request<cri::CreateContainerRequest>,
    ) -> Reply<cri::CreateContainerResponse> {
        cri_writes::create_container(&self.runtime, req.into_inner()).map(Response::new)
    }

    async fn start_container(
        &self,
        req: Request<cri::StartContainerRequest>,
    ) -> Reply<cri::StartContainerResponse> {
        cri_writes::start_container(&self.runtime, &req.get_ref().container_id)
            .map(|()| Response::new(cri::StartContainerResponse {}))
    }

    async fn stop_container(
        &self,
        req: Request<cri::StopContainerRequest>,
    ) -> Reply<cri::StopContainerResponse> {
        cri_writes::stop_container(&self.runtime, &req.get_ref().container_id)
            .map(|()| Response::new(cri::StopContainerResponse {}))
    }

    async fn remove_container(
        &self,
        req: Request<cri::RemoveContainerRequest>,
    ) -> Reply<cri::RemoveContainerResponse> {
        cri_writes::remove_container(&self.runtime, &req.get_ref().container_id)
            .map(|()| Response::new(cri::RemoveContainerResponse {}))
    }

    async fn list_containers(
        &self,
        req: Request<cri::ListContainersRequest>,
    ) -> Reply<cri::ListContainersResponse> {
        let filter = req.into_inner().filter.unwrap_or_default();
        let containers = self.containers_listed(filter).await?;
        let resp = cri::ListContainersResponse { containers };
        within_send_limit(&resp, self.runtime.list_serving().send_limit)?;
        Ok(Response::new(resp))
    }

    async fn container_status(
        &self,
        req: Request<cri::ContainerStatusRequest>,
    ) -> Reply<cri::ContainerStatusResponse> {
        let s = self
            .runtime
            .container_status(&req.get_ref().container_id)
            .await
            .map_err(to_status)?;
        Ok(Response::new(cri::ContainerStatusResponse {
            status: Some(self.runtime.container_status_to_wire(&s)),
            ..Default::default()
        }))
    }

    async fn update_container_resources(
        &self,
        _: Request<cri::UpdateContainerResourcesRequest>,
    ) -> Reply<cri::UpdateContainerResourcesResponse> {
        unimplemented("UpdateContainerResources")
    }

    async fn reopen_container_log(
        &self,
        _: Request<cri::ReopenContainerLogRequest>,
    ) -> Reply<cri::ReopenContainerLogResponse> {
        unimplemented("ReopenContainerLog")
    }

    async fn exec_sync(&self, _: Request<cri::ExecSyncRequest>) -> Reply<cri::ExecSyncResponse> {
        unimplemented("ExecSync")
    }

    async fn exec(&self, _: Request<cri::ExecRequest>) -> Reply<cri::ExecResponse> {
        unimplemented("Exec")
    }

    async fn attach(&self, _: Request<cri::AttachRequest>) -> Reply<cri::AttachResponse> {
        unimplemented("Attach")
    }

    async fn port_forward(
        &self,
        _: Request<cri::PortForwardRequest>,
    ) -> Reply<cri::PortForwardResponse> {
        unimplemented("PortForward")
    }

    async fn container_stats(
        &self,
        _: Request<cri::ContainerStatsRequest>,
    ) -> Reply<cri::ContainerStatsResponse> {
        unimplemented("ContainerStats")
    }

    async fn list_container_stats(
        &self,
        _: Request<cri::ListContainerStatsRequest>,
    ) -> Reply<cri::ListContainerStatsResponse> {
        unimplemented("ListContainerStats")
    }

    async fn pod_sandbox_stats(
        &self,
        _: Request<cri::PodSandboxStatsRequest>,
    ) -> Reply<cri::PodSandboxStatsResponse> {
        unimplemented("PodSandboxStats")
    }

    async fn list_pod_sandbox_stats(
        &self,
        _: Request<cri::ListPodSandboxStatsRequest>,
    ) -> Reply<cri::ListPodSandboxStatsResponse> {
        unimplemented("ListPodSandboxStats")
    }

    async fn update_runtime_config(
        &self,
        _: Request<cri::UpdateRuntimeConfigRequest>,
    ) -> Reply<cri::UpdateRuntimeConfigResponse> {
        unimplemented("UpdateRuntimeConfig")
    }

    async fn status(&self, _: Request<cri::StatusRequest>) -> Reply<cri::StatusResponse> {
        let ready = |kind: &str| cri::RuntimeCondition {
            r#type: kind.into(),
            status: true,
            ..Default::default()
        };
        Ok(Response::new(cri::StatusResponse {
            status: Some(cri::RuntimeStatus {
                conditions: vec![ready("RuntimeReady"), ready("NetworkReady")],
            }),
            ..Default::default()
        }))
    }

    async fn checkpoint_container(
        &self,
        _: Request<cri::CheckpointContainerRequest>,
    ) -> Reply<cri::CheckpointContainerResponse> {
        unimplemented("CheckpointContainer")
    }

    type GetContainerEventsStream = BoxStream<'static, Result<cri::ContainerEventResponse, Status>>;

    async fn get_container_events(
        &self,
        _: Request<cri::GetEventsRequest>,
    ) -> Reply<Self::GetContainerEventsStream> {
        let events = self.runtime.container_events().await.map_err(to_status)?;
        let events = events.map(|item| item.map_err(to_status)).boxed();
        Ok(Response::new(until_stopped(events, self.stopping.clone())))
    }

    async fn list_metric_descriptors(
        &self,
        _: Request<cri::ListMetricDescriptorsRequest>,
    ) -> Reply<cri::ListMetricDescriptorsResponse> {
        unimplemented("ListMetricDescriptors")
    }

    async fn list_pod_sandbox_metrics(
        &self,
        _: Request<cri::ListPodSandboxMetricsRequest>,
    ) -> Reply<cri::ListPodSandboxMetricsResponse> {
        unimplemented("ListPodSandboxMetrics")
    }

    async fn runtime_config(
        &self,
        _: Request<cri::RuntimeConfigRequest>,
    ) -> Reply<cri::RuntimeConfigResponse> {
        unimplemented("RuntimeConfig")
    }
}
