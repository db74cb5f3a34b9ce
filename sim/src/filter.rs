//! CRI list filters applied to the simulator's state, with the same meaning as in
//! containerd except where noted.

use plegd_runtime::convert;
use plegd_runtime::cri;
use plegd_runtime::Sandbox;

/// ListPodSandbox's filter: `id` (exact; containerd also accepts a unique prefix),
/// `state`, and `label_selector` (every pair must be among the sandbox's labels).
pub(crate) fn sandbox_matches(s: &Sandbox, f: &cri::PodSandboxFilter) -> bool {
    (f.id.is_empty() || s.id == f.id)
        && f.state
            .as_ref()
            .is_none_or(|v| v.state == convert::sandbox_state_to_wire(s.state))
        && f.label_selector
            .iter()
            .all(|(k, v)| s.labels.get(k) == Some(v))
}

/// ListContainers' filter, on a listed container as sent: `id` (exact),
/// `pod_sandbox_id`, `state`, and `label_selector` (every pair must be among the
/// container's labels).
pub(crate) fn container_matches(c: &cri::Container, f: &cri::ContainerFilter) -> bool {
    (f.id.is_empty() || c.id == f.id)
        && (f.pod_sandbox_id.is_empty() || c.pod_sandbox_id == f.pod_sandbox_id)
        && f.state.as_ref().is_none_or(|v| v.state == c.state)
        && f.label_selector
            .iter()
            .all(|(k, v)| c.labels.get(k) == Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use plegd_runtime::{Container, ContainerState, PodRef, SandboxState};

    fn sandbox(id: &str, state: SandboxState) -> Sandbox {
        Sandbox {
            id: id.into(),
            pod: PodRef {
                uid: "u".into(),
                name: "n".into(),
                namespace: "ns".into(),
            },
            attempt: 0,
            state,
            created_at: 1,
            labels: [("app".to_string(), "web".to_string())].into(),
        }
    }

    #[test]
    fn sandbox_filter_fields() {
        let ready = sandbox("a", SandboxState::Ready);
        assert!(sandbox_matches(&ready, &cri::PodSandboxFilter::default()));
        let by_id = cri::PodSandboxFilter {
            id: "b".into(),
            ..Default::default()
        };
        assert!(!sandbox_matches(&ready, &by_id));
        let not_ready = cri::PodSandboxFilter {
            state: Some(cri::PodSandboxStateValue {
                state: cri::PodSandboxState::SandboxNotready as i32,
            }),
            ..Default::default()
        };
        assert!(!sandbox_matches(&ready, &not_ready));
        assert!(sandbox_matches(
            &sandbox("a", SandboxState::NotReady),
            &not_ready
        ));
        let labels = cri::PodSandboxFilter {
            label_selector: [("app".to_string(), "web".to_string())].into(),
            ..Default::default()
        };
        assert!(sandbox_matches(&ready, &labels));
        let other = cri::PodSandboxFilter {
            label_selector: [("app".to_string(), "db".to_string())].into(),
            ..Default::default()
        };
        assert!(!sandbox_matches(&ready, &other));
        let missing = cri::PodSandboxFilter {
            label_selector: [("tier".to_string(), "web".to_string())].into(),
            ..Default::default()
        };
        assert!(!sandbox_matches(&ready, &missing));
    }

    #[test]
    fn container_filter_fields() {
        let mut c = convert::container_to_wire(&Container {
            id: "c1".into(),
            sandbox_id: "s1".into(),
            name: "app".into(),
            attempt: 0,
            state: ContainerState::Running,
            created_at: 1,
        });
        assert!(container_matches(&c, &cri::ContainerFilter::default()));
        let exited = cri::ContainerFilter {
            state: Some(cri::ContainerStateValue {
                state: cri::ContainerState::ContainerExited as i32,
            }),
            ..Default::default()
        };
        assert!(!container_matches(&c, &exited));
        let other_sandbox = cri::ContainerFilter {
            pod_sandbox_id: "s2".into(),
            ..Default::default()
        };
        assert!(!container_matches(&c, &other_sandbox));
        let same = cri::ContainerFilter {
            id: "c1".into(),
            pod_sandbox_id: "s1".into(),
            ..Default::default()
        };
        assert!(container_matches(&c, &same));
        let labelled = cri::ContainerFilter {
            label_selector: [("tier".to_string(), "web".to_string())].into(),
            ..Default::default()
        };
        assert!(!container_matches(&c, &labelled));
        c.labels.insert("tier".into(), "web".into());
        assert!(container_matches(&c, &labelled));
    }
}
