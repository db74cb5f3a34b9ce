//! The harness's side of CRI: the simulated runtime is scripted with the same calls
//! a kubelet makes (StopContainer, RunPodSandbox, ...), each stamped when it returns
//! — the moment the runtime emitted its event.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use plegd_runtime::cri;
use plegd_runtime::cri::runtime_service_client::RuntimeServiceClient;
use plegd_runtime::PodRef;
use plegd_sim::Kubelet;
use plegd_testkit::cri::{container_config, pod_config, ContainerSpec, PodSpec, BUSYBOX};
use tonic::transport::Channel;

#[derive(Clone)]
pub struct Cri(
    RuntimeServiceClient<Channel>,
    Option<Kubelet>,
    /// Pods made by `run_pod` (which of them are heavy).
    Arc<AtomicU64>,
);

/// A pod's sandbox and containers, ordered by name (`app-0`, `app-1`, ...).
pub struct Pod {
    pub sandbox: String,
    pub containers: Vec<String>,
}

impl Cri {
    pub fn new(socket: &Path) -> Self {
        Cri(
            RuntimeServiceClient::new(plegd_runtime::unix_channel(socket))
                .max_decoding_message_size(256 << 20),
            None,
            Arc::default(),
        )
    }

    /// A client whose pods (`run_pod`) carry what kubelet gives them: the pod's and
    /// kubelet's labels and annotations (plegd_sim::kubelet), None: none.
    pub fn playing_kubelet(mut self, kubelet: Option<Kubelet>) -> Self {
        self.1 = kubelet;
        self
    }

    /// Every pod on the node with its containers.
    pub async fn pods(&self) -> Result<Vec<Pod>> {
        let list = self
            .0
            .clone()
            .list_containers(cri::ListContainersRequest::default())
            .await
            .context("ListContainers")?
            .into_inner();
        let mut by_sandbox: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
        for c in list.containers {
            let name = c.metadata.map(|m| m.name).unwrap_or_default();
            by_sandbox
                .entry(c.pod_sandbox_id)
                .or_default()
                .push((name, c.id));
        }
        Ok(by_sandbox
            .into_iter()
            .map(|(sandbox, mut cs)| {
                cs.sort();
                Pod {
                    sandbox,
                    containers: cs.into_iter().map(|(_, id)| id).collect(),
                }
            })
            .collect())
    }

    /// What a first global relist must ask the runtime at least, made by a bare tonic
    /// client: both lists, then one ContainerStatus per container with `in_flight`
    /// calls at once (plegd's `--status-concurrency`). Returns the wall time and the
    /// number of status reads: the floor plegd's first relist is measured against.
    pub async fn read_every_status(&self, in_flight: usize) -> Result<(Duration, usize)> {
        use futures::{StreamExt as _, TryStreamExt as _};
        let start = Instant::now();
        let (mut a, mut b) = (self.0.clone(), self.0.clone());
        let (sandboxes, containers) = futures::try_join!(
            async {
                a.list_pod_sandbox(cri::ListPodSandboxRequest::default())
                    .await
                    .context("ListPodSandbox")
            },
            async {
                b.list_containers(cri::ListContainersRequest::default())
                    .await
                    .context("ListContainers")
            }
        )?;
        drop(sandboxes);
        let ids: Vec<String> = containers
            .into_inner()
            .containers
            .into_iter()
            .map(|c| c.id)
            .collect();
        let reads = futures::stream::iter(ids)
            .map(|id| {
                let mut c = self.0.clone();
                async move {
                    c.container_status(cri::ContainerStatusRequest {
                        container_id: id.clone(),
                        verbose: false,
                    })
                    .await
                    .with_context(|| format!("ContainerStatus {id}"))
                }
            })
            .buffer_unordered(in_flight.max(1))
            .try_fold(0usize, |n, _| async move { Ok(n + 1) })
            .await?;
        Ok((start.elapsed(), reads))
    }

    /// The runtime's CRI event stream, as the IDs of the containers it says stopped;
    /// subscribed when this returns. Ends at the stream's first error.
    pub async fn stopped_containers(&self) -> Result<futures::stream::BoxStream<'static, String>> {
        use futures::StreamExt as _;
        let events = self
            .0
            .clone()
            .get_container_events(cri::GetEventsRequest::default())
            .await
            .context("GetContainerEvents")?
            .into_inner();
        let stopped = cri::ContainerEventType::ContainerStoppedEvent as i32;
        Ok(
            futures::stream::unfold(events, move |mut events| async move {
                loop {
                    match events.message().await {
                        Ok(Some(ev)) if ev.container_event_type == stopped => {
                            return Some((ev.container_id, events))
                        }
                        Ok(Some(_)) => continue,
                        Ok(None) | Err(_) => return None,
                    }
                }
            })
            .boxed(),
        )
    }

    /// Whether ContainerStatus says `id` has exited.
    pub async fn exited(&self, id: &str) -> Result<bool> {
        let status = self
            .0
            .clone()
            .container_status(cri::ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: false,
            })
            .await
            .with_context(|| format!("ContainerStatus {id}"))?
            .into_inner()
            .status;
        Ok(status.is_some_and(|s| s.state == cri::ContainerState::ContainerExited as i32))
    }

    /// A targeted relist's reads of `id` in `sandbox`'s pod (the pod's two lists and
    /// the container's status, in flight together); whether the status says EXITED.
    pub async fn pod_reads_exited(&self, sandbox: &str, id: &str) -> Result<bool> {
        Ok(futures::try_join!(pod_lists(&self.0, sandbox, None), self.exited(id))?.1)
    }

    /// StopContainer; returns when the runtime has stopped it (and sent its event).
    pub async fn stop(&self, id: &str) -> Result<Instant> {
        self.0
            .clone()
            .stop_container(cri::StopContainerRequest {
                container_id: id.to_string(),
                timeout: 0,
            })
            .await
            .with_context(|| format!("StopContainer {id}"))?;
        Ok(Instant::now())
    }

    /// A pod with one running container; returns its sandbox. The configs are the
    /// test kit's busybox pod's (the simulator runs no image and keeps no logs),
    /// with kubelet's labels and annotations if this client plays kubelet.
    pub async fn run_pod(&self, uid: &str) -> Result<String> {
        let mut c = self.0.clone();
        let pod = PodRef {
            uid: uid.to_string(),
            name: format!("churn-{uid}"),
            namespace: "churn".into(),
        };
        let mut config = pod_config(PodSpec {
            name: pod.name.clone(),
            uid: pod.uid.clone(),
            namespace: pod.namespace.clone(),
            attempt: 0,
            log_directory: String::new(),
            labels: Default::default(),
        });
        let mut container = container_config(ContainerSpec {
            name: "app",
            attempt: 0,
            image: BUSYBOX,
            script: "sleep 3600",
            log_path: String::new(),
            labels: Default::default(),
            memory_limit: None,
        });
        if let Some(k) = &self.1 {
            config.labels = k
                .sandbox_labels(&pod, Default::default())
                .into_iter()
                .collect();
            let n = self.2.fetch_add(1, Ordering::Relaxed) + 1;
            config.annotations = k.sandbox_annotations(n, plegd_runtime::now_ns());
            let meta = k.container_meta(&pod, "app", 0, 0);
            container.labels = meta.labels;
            container.annotations = meta.annotations;
            if let Some(image) = container.image.as_mut() {
                image.user_specified_image = std::mem::take(&mut image.image);
                image.image = meta.image_id;
            }
        }
        let sandbox = c
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config.clone()),
                ..Default::default()
            })
            .await
            .context("RunPodSandbox")?
            .into_inner()
            .pod_sandbox_id;
        let container = c
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: sandbox.clone(),
                config: Some(container),
                sandbox_config: Some(config),
            })
            .await
            .context("CreateContainer")?
            .into_inner()
            .container_id;
        c.start_container(cri::StartContainerRequest {
            container_id: container,
        })
        .await
        .context("StartContainer")?;
        Ok(sandbox)
    }

    /// StopPodSandbox then RemovePodSandbox (its containers go with it).
    pub async fn remove_pod(&self, sandbox: &str) -> Result<()> {
        let mut c = self.0.clone();
        c.stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: sandbox.to_string(),
        })
        .await
        .context("StopPodSandbox")?;
        c.remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: sandbox.to_string(),
        })
        .await
        .context("RemovePodSandbox")?;
        Ok(())
    }
}

/// A targeted relist's lists of `sandbox`'s pod: ListPodSandbox and ListContainers
/// filtered by it, in flight together, each within `timeout` if given.
pub async fn pod_lists(
    client: &RuntimeServiceClient<Channel>,
    sandbox: &str,
    timeout: Option<Duration>,
) -> Result<()> {
    fn req<T>(msg: T, timeout: Option<Duration>) -> tonic::Request<T> {
        let mut r = tonic::Request::new(msg);
        if let Some(t) = timeout {
            r.set_timeout(t);
        }
        r
    }
    let (mut a, mut b) = (client.clone(), client.clone());
    futures::try_join!(
        async {
            let filter = cri::PodSandboxFilter {
                id: sandbox.to_string(),
                ..Default::default()
            };
            a.list_pod_sandbox(req(
                cri::ListPodSandboxRequest {
                    filter: Some(filter),
                },
                timeout,
            ))
            .await
            .with_context(|| format!("ListPodSandbox {sandbox}"))
        },
        async {
            let filter = cri::ContainerFilter {
                pod_sandbox_id: sandbox.to_string(),
                ..Default::default()
            };
            b.list_containers(req(
                cri::ListContainersRequest {
                    filter: Some(filter),
                },
                timeout,
            ))
            .await
            .with_context(|| format!("ListContainers of {sandbox}"))
        }
    )?;
    Ok(())
}
