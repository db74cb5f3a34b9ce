//! The runtime's objects as the CRI messages its server sends: what
//! `plegd_runtime::convert` makes of them, plus what they carry besides (the
//! sandboxes' annotations, the containers' labels, annotations and image IDs), as
//! containerd sends them: a listed container has its config's image (the ID kubelet
//! resolved it to, and the name the user gave); a container's status has the image's
//! name and digest, and its mounts, log path, resources and user.

use plegd_runtime::{convert, cri};
use plegd_runtime::{Container, ContainerStatus, Sandbox};

use crate::fake::{FakeRuntime, State};

impl State {
    pub(crate) fn sandbox_wire(&self, s: &Sandbox) -> cri::PodSandbox {
        let mut w = convert::sandbox_to_wire(s);
        if let Some(a) = self.sandbox_annotations.get(&s.id) {
            w.annotations = a.clone();
        }
        w
    }

    pub(crate) fn sandbox_status_wire(&self, s: &Sandbox) -> cri::PodSandboxStatus {
        let mut w = convert::sandbox_status_to_wire(s);
        if let Some(a) = self.sandbox_annotations.get(&s.id) {
            w.annotations = a.clone();
        }
        w
    }

    pub(crate) fn container_wire(&self, c: &Container) -> cri::Container {
        let mut w = convert::container_to_wire(c);
        if let Some(m) = self.container_meta.get(&c.id) {
            w.labels = m.labels.clone();
            w.annotations = m.annotations.clone();
            if !m.image_id.is_empty() {
                w.image = Some(cri::ImageSpec {
                    image: m.image_id.clone(),
                    user_specified_image: self
                        .containers
                        .get(&c.id)
                        .map(|s| s.image.clone())
                        .unwrap_or_default(),
                    ..Default::default()
                });
                w.image_ref = m.image_id.clone();
            }
        }
        w
    }

    pub(crate) fn container_status_wire(&self, c: &ContainerStatus) -> cri::ContainerStatus {
        let mut w = convert::container_status_to_wire(c);
        if let Some(m) = self.container_meta.get(&c.id) {
            w.labels = m.labels.clone();
            w.annotations = m.annotations.clone();
            if !m.image_id.is_empty() {
                let repo = c.image.rsplit_once(':').map_or(c.image.as_str(), |r| r.0);
                w.image_ref = format!("{repo}@{}", m.image_id);
                w.image_id = m.image_id.clone();
            }
            w.mounts = m.mounts.clone();
            w.log_path = m.log_path.clone();
            w.resources = m.resources.clone().map(|linux| cri::ContainerResources {
                linux: Some(linux),
                windows: None,
            });
            w.user = m
                .user
                .clone()
                .map(|linux| cri::ContainerUser { linux: Some(linux) });
        }
        w
    }
}

impl FakeRuntime {
    /// Listed sandboxes as ListPodSandbox sends them.
    pub fn sandboxes_to_wire(&self, listed: &[Sandbox]) -> Vec<cri::PodSandbox> {
        let st = self.lock();
        listed.iter().map(|s| st.sandbox_wire(s)).collect()
    }

    /// Listed containers as ListContainers sends them.
    pub fn containers_to_wire(&self, listed: &[Container]) -> Vec<cri::Container> {
        let st = self.lock();
        listed.iter().map(|c| st.container_wire(c)).collect()
    }

    /// A sandbox's status as PodSandboxStatus sends it.
    pub fn sandbox_status_to_wire(&self, s: &Sandbox) -> cri::PodSandboxStatus {
        self.lock().sandbox_status_wire(s)
    }

    /// A container's status as ContainerStatus sends it.
    pub fn container_status_to_wire(&self, c: &ContainerStatus) -> cri::ContainerStatus {
        self.lock().container_status_wire(c)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use plegd_runtime::cri::runtime_service_server::RuntimeService as _;
    use plegd_testkit::cri::{container_config, pod_config, ContainerSpec, PodSpec};
    use tonic::Request;

    use crate::kubelet::{self, Kubelet};
    use crate::{CriServer, FakeRuntime};

    use super::*;

    fn ok<T>(reply: Result<tonic::Response<T>, tonic::Status>) -> T {
        reply.expect("the call answers").into_inner()
    }

    /// A runtime playing kubelet serves its labels and annotations in both lists,
    /// both statuses and its events, with containerd's IDs.
    #[tokio::test]
    async fn the_realistic_node_is_served_with_kubelets_metadata() {
        let rt = FakeRuntime::with_kubelet(Kubelet {
            heavy_every: 1,
            heavy_bytes: 2048,
        });
        let (name, labels) = kubelet::deployment_pod(7);
        let sb = rt.run_pod_with_labels("uid-7", &name, "shop", labels);
        let c = rt.run_container(&sb, "app-0");
        assert_eq!((sb.len(), c.len()), (64, 64));
        let server = CriServer::new(rt.clone());

        let listed = server
            .list_pod_sandbox(Request::new(Default::default()))
            .await
            .map(tonic::Response::into_inner)
            .expect("the call answers")
            .items;
        let s = &listed[0];
        assert_eq!(s.labels[kubelet::POD_UID], "uid-7");
        assert_eq!(s.labels["app"], "service-0");
        assert_eq!(s.annotations[kubelet::CONFIG_SOURCE], "api");
        assert_eq!(s.annotations[kubelet::HEAVY].len(), 2048);
        let req = cri::PodSandboxStatusRequest {
            pod_sandbox_id: sb.clone(),
            verbose: false,
        };
        let status = ok(server.pod_sandbox_status(Request::new(req)).await).status;
        let status = status.expect("a status");
        assert_eq!(status.labels, s.labels);
        assert_eq!(status.annotations, s.annotations);

        let listed = server
            .list_containers(Request::new(Default::default()))
            .await
            .map(tonic::Response::into_inner)
            .expect("the call answers")
            .containers;
        let lc = &listed[0];
        assert_eq!(lc.labels[kubelet::CONTAINER_NAME], "app-0");
        assert_eq!(lc.annotations[kubelet::RESTART_COUNT], "0");
        assert!(lc.annotations[kubelet::CONTAINER_PORTS].starts_with("[{"));
        assert_eq!(lc.image_ref, kubelet::image_id("app-0"));
        let by_label = server
            .list_containers(Request::new(cri::ListContainersRequest {
                filter: Some(cri::ContainerFilter {
                    label_selector: [(kubelet::POD_UID.to_string(), "uid-7".to_string())].into(),
                    ..Default::default()
                }),
            }))
            .await
            .map(tonic::Response::into_inner)
            .expect("the call answers")
            .containers;
        assert_eq!(by_label.len(), 1);
        let req = cri::ContainerStatusRequest {
            container_id: c.clone(),
            verbose: false,
        };
        let status = ok(server.container_status(Request::new(req)).await).status;
        let status = status.expect("a status");
        assert_eq!(status.labels, lc.labels);
        assert_eq!(status.annotations, lc.annotations);
        assert_eq!(status.image_id, kubelet::image_id("app-0"));
        // What containerd reports of the container's spec: kubelet's three mounts,
        // the log under the pod's directory, resources and user.
        let paths: Vec<_> = status
            .mounts
            .iter()
            .map(|m| m.container_path.as_str())
            .collect();
        assert_eq!(
            paths,
            [
                "/var/run/secrets/kubernetes.io/serviceaccount",
                "/etc/hosts",
                "/dev/termination-log"
            ]
        );
        assert!(status.mounts[0]
            .host_path
            .starts_with("/var/lib/kubelet/pods/uid-7/"));
        assert_eq!(
            status.log_path,
            format!("/var/log/pods/shop_{name}_uid-7/app-0/0.log")
        );
        let linux = status.resources.and_then(|r| r.linux).expect("resources");
        assert_eq!(
            (linux.cpu_shares, linux.memory_limit_in_bytes),
            (102, 256 << 20)
        );
        assert!(status.user.and_then(|u| u.linux).is_some());

        let ev = rt.event_about(&c, cri::ContainerEventType::ContainerStartedEvent);
        assert_eq!(ev.containers_statuses[0].annotations, lc.annotations);
        let pod = ev.pod_sandbox_status.unwrap();
        assert_eq!(pod.annotations, s.annotations);
    }

    /// The light runtime (the tests') adds nothing; CRI writes store what their
    /// configs carry, on either.
    #[tokio::test]
    async fn cri_configs_are_stored_as_given() {
        let rt = FakeRuntime::new();
        let sb = rt.run_pod_with_labels("u", "p", "ns", BTreeMap::new());
        assert!(sb.starts_with("sb"));
        let listed = rt.sandboxes_to_wire(&[rt.sandbox(&sb).unwrap()]);
        assert!(listed[0].labels.is_empty() && listed[0].annotations.is_empty());

        let server = CriServer::new(rt.clone());
        let annotations: std::collections::HashMap<String, String> =
            [("a".to_string(), "1".to_string())].into();
        let mut config = pod_config(PodSpec {
            name: "p2".into(),
            uid: "u2".into(),
            namespace: "ns".into(),
            attempt: 0,
            log_directory: String::new(),
            labels: Default::default(),
        });
        config.annotations = annotations.clone();
        let req = cri::RunPodSandboxRequest {
            config: Some(config),
            ..Default::default()
        };
        let sb = ok(server.run_pod_sandbox(Request::new(req)).await).pod_sandbox_id;
        let mut config = container_config(ContainerSpec {
            name: "app",
            attempt: 0,
            image: "sha256:abc",
            script: "true",
            log_path: "app/0.log".into(),
            labels: annotations.clone(),
            memory_limit: Some(64 << 20),
        });
        config.annotations = annotations.clone();
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: sb.clone(),
            config: Some(config),
            ..Default::default()
        };
        let c = ok(server.create_container(Request::new(req)).await).container_id;
        let s = rt.sandbox_status_to_wire(&rt.sandbox(&sb).unwrap());
        assert_eq!(s.annotations, annotations);
        let status = rt.container_status_to_wire(&rt.container(&c).unwrap());
        assert_eq!(status.labels, annotations);
        assert_eq!(status.annotations, annotations);
        assert_eq!(status.image_id, "sha256:abc");
        assert_eq!(status.log_path, "app/0.log");
        let linux = status.resources.and_then(|r| r.linux).expect("resources");
        assert_eq!(linux.memory_limit_in_bytes, 64 << 20);
    }
}
