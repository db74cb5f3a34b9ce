//! Conversions between CRI wire messages and plegd's runtime types, both ways:
//! the CRI client reads wire → domain; the simulated CRI server writes domain → wire.
//! A wire message without what plegd needs (a sandbox without metadata or UID) is an
//! error, never a silent default.

use std::collections::HashMap;

use crate::{cri, status_read};

use crate::{
    Container, ContainerState, ContainerStatus, PodRef, RuntimeError, Sandbox, SandboxState,
};

fn pod_ref(
    op: &'static str,
    id: &str,
    meta: Option<&cri::PodSandboxMetadata>,
) -> Result<(PodRef, u32), RuntimeError> {
    let meta = meta.ok_or_else(|| RuntimeError::Invalid {
        op,
        reason: format!("sandbox {id} has no metadata"),
    })?;
    if meta.uid.is_empty() {
        return Err(RuntimeError::Invalid {
            op,
            reason: format!("sandbox {id} has an empty pod UID"),
        });
    }
    Ok((
        PodRef {
            uid: meta.uid.clone(),
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
        },
        meta.attempt,
    ))
}

/// A PodSandboxState value CRI does not define.
pub const UNDEFINED_SANDBOX_STATE: i32 = 99;

pub fn sandbox_state_from_wire(state: i32) -> SandboxState {
    match cri::PodSandboxState::try_from(state) {
        Ok(cri::PodSandboxState::SandboxReady) => SandboxState::Ready,
        Ok(cri::PodSandboxState::SandboxNotready) => SandboxState::NotReady,
        // Not a death: kubelet maps unknown values to unknown (ContainerChanged).
        Err(_) => SandboxState::Unknown,
    }
}

pub fn container_state_from_wire(state: i32) -> ContainerState {
    match cri::ContainerState::try_from(state) {
        Ok(cri::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(cri::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(cri::ContainerState::ContainerExited) => ContainerState::Exited,
        _ => ContainerState::Unknown,
    }
}

pub fn sandbox_state_to_wire(state: SandboxState) -> i32 {
    match state {
        SandboxState::Ready => cri::PodSandboxState::SandboxReady as i32,
        SandboxState::NotReady => cri::PodSandboxState::SandboxNotready as i32,
        // CRI has no such value: the simulated server sends one it does not define.
        SandboxState::Unknown => UNDEFINED_SANDBOX_STATE,
    }
}

pub fn container_state_to_wire(state: ContainerState) -> i32 {
    (match state {
        ContainerState::Created => cri::ContainerState::ContainerCreated,
        ContainerState::Running => cri::ContainerState::ContainerRunning,
        ContainerState::Exited => cri::ContainerState::ContainerExited,
        ContainerState::Unknown => cri::ContainerState::ContainerUnknown,
    }) as i32
}

/// A sandbox from what ListPodSandbox and PodSandboxStatus both carry.
fn sandbox(
    op: &'static str,
    id: &str,
    meta: Option<&cri::PodSandboxMetadata>,
    state: i32,
    created_at: i64,
    labels: &HashMap<String, String>,
) -> Result<Sandbox, RuntimeError> {
    if id.is_empty() {
        return Err(RuntimeError::Invalid {
            op,
            reason: "a sandbox without id".into(),
        });
    }
    let (pod, attempt) = pod_ref(op, id, meta)?;
    Ok(Sandbox {
        id: id.to_string(),
        pod,
        attempt,
        state: sandbox_state_from_wire(state),
        created_at,
        labels: labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    })
}

pub fn sandbox_from_wire(s: &cri::PodSandbox) -> Result<Sandbox, RuntimeError> {
    sandbox(
        "ListPodSandbox",
        &s.id,
        s.metadata.as_ref(),
        s.state,
        s.created_at,
        &s.labels,
    )
}

/// [`sandbox_from_wire`] taking the listed message, so its strings are moved, not
/// copied (a global relist converts every sandbox on the node).
pub fn sandbox_from_listed(s: cri::PodSandbox) -> Result<Sandbox, RuntimeError> {
    let op = "ListPodSandbox";
    let valid = !s.id.is_empty() && s.metadata.as_ref().is_some_and(|m| !m.uid.is_empty());
    match s.metadata {
        Some(meta) if valid => Ok(Sandbox {
            id: s.id,
            pod: PodRef {
                uid: meta.uid,
                name: meta.name,
                namespace: meta.namespace,
            },
            attempt: meta.attempt,
            state: sandbox_state_from_wire(s.state),
            created_at: s.created_at,
            labels: s.labels.into_iter().collect(),
        }),
        // The same errors as the borrowing conversion.
        meta => sandbox(op, &s.id, meta.as_ref(), s.state, s.created_at, &s.labels),
    }
}

/// [`container_from_wire`] taking the listed message: its strings are moved.
pub fn container_from_listed(c: cri::Container) -> Result<Container, RuntimeError> {
    if c.id.is_empty() || c.pod_sandbox_id.is_empty() {
        return Err(RuntimeError::Invalid {
            op: "ListContainers",
            reason: format!("container {:?} without id or sandbox id", c.id),
        });
    }
    let (name, attempt) = c.metadata.map(|m| (m.name, m.attempt)).unwrap_or_default();
    Ok(Container {
        id: c.id,
        sandbox_id: c.pod_sandbox_id,
        name,
        attempt,
        state: container_state_from_wire(c.state),
        created_at: c.created_at,
    })
}

pub fn container_from_wire(c: &cri::Container) -> Result<Container, RuntimeError> {
    if c.id.is_empty() || c.pod_sandbox_id.is_empty() {
        return Err(RuntimeError::Invalid {
            op: "ListContainers",
            reason: format!("container {:?} without id or sandbox id", c.id),
        });
    }
    let (name, attempt) = c
        .metadata
        .as_ref()
        .map(|m| (m.name.clone(), m.attempt))
        .unwrap_or_default();
    Ok(Container {
        id: c.id.clone(),
        sandbox_id: c.pod_sandbox_id.clone(),
        name,
        attempt,
        state: container_state_from_wire(c.state),
        created_at: c.created_at,
    })
}

pub fn sandbox_status_from_wire(s: &cri::PodSandboxStatus) -> Result<Sandbox, RuntimeError> {
    sandbox(
        "PodSandboxStatus",
        &s.id,
        s.metadata.as_ref(),
        s.state,
        s.created_at,
        &s.labels,
    )
}

/// A status as [`crate::status_read`] reads it. ContainerStatus carries no sandbox ID
/// on the wire: it is left empty for the caller, which knows it from the list.
pub fn container_status_from_read(s: status_read::StatusRead) -> ContainerStatus {
    let (name, attempt) = s.metadata.map(|m| (m.name, m.attempt)).unwrap_or_default();
    ContainerStatus {
        id: s.id,
        sandbox_id: String::new(),
        name,
        attempt,
        state: container_state_from_wire(s.state),
        created_at: s.created_at,
        started_at: s.started_at,
        finished_at: s.finished_at,
        exit_code: s.exit_code,
        reason: s.reason,
        message: s.message,
        image: s
            .image
            .map(|i| i.image)
            .filter(|i| !i.is_empty())
            .unwrap_or(s.image_ref),
    }
}

fn pod_meta_to_wire(pod: &PodRef, attempt: u32) -> cri::PodSandboxMetadata {
    cri::PodSandboxMetadata {
        name: pod.name.clone(),
        uid: pod.uid.clone(),
        namespace: pod.namespace.clone(),
        attempt,
    }
}

pub fn sandbox_to_wire(s: &Sandbox) -> cri::PodSandbox {
    let st = sandbox_status_to_wire(s);
    cri::PodSandbox {
        id: st.id,
        metadata: st.metadata,
        state: st.state,
        created_at: st.created_at,
        labels: st.labels,
        ..Default::default()
    }
}

pub fn container_to_wire(c: &Container) -> cri::Container {
    cri::Container {
        id: c.id.clone(),
        pod_sandbox_id: c.sandbox_id.clone(),
        metadata: Some(cri::ContainerMetadata {
            name: c.name.clone(),
            attempt: c.attempt,
        }),
        state: container_state_to_wire(c.state),
        created_at: c.created_at,
        ..Default::default()
    }
}

pub fn sandbox_status_to_wire(s: &Sandbox) -> cri::PodSandboxStatus {
    cri::PodSandboxStatus {
        id: s.id.clone(),
        metadata: Some(pod_meta_to_wire(&s.pod, s.attempt)),
        state: sandbox_state_to_wire(s.state),
        created_at: s.created_at,
        labels: s
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        ..Default::default()
    }
}

pub fn container_status_to_wire(s: &ContainerStatus) -> cri::ContainerStatus {
    cri::ContainerStatus {
        id: s.id.clone(),
        metadata: Some(cri::ContainerMetadata {
            name: s.name.clone(),
            attempt: s.attempt,
        }),
        state: container_state_to_wire(s.state),
        created_at: s.created_at,
        started_at: s.started_at,
        finished_at: s.finished_at,
        exit_code: s.exit_code,
        reason: s.reason.clone(),
        message: s.message.clone(),
        image: Some(cri::ImageSpec {
            image: s.image.clone(),
            ..Default::default()
        })
        .filter(|_| !s.image.is_empty()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn sandbox_without_uid_is_invalid() {
        let s = cri::PodSandbox {
            id: "s1".into(),
            metadata: Some(cri::PodSandboxMetadata::default()),
            ..Default::default()
        };
        assert!(matches!(
            sandbox_from_wire(&s),
            Err(RuntimeError::Invalid { .. })
        ));
        let s = cri::PodSandbox {
            id: "s1".into(),
            ..Default::default()
        };
        assert!(matches!(
            sandbox_from_wire(&s),
            Err(RuntimeError::Invalid { .. })
        ));
    }

    #[test]
    fn states_round_trip() {
        for st in [
            ContainerState::Created,
            ContainerState::Running,
            ContainerState::Exited,
            ContainerState::Unknown,
        ] {
            assert_eq!(container_state_from_wire(container_state_to_wire(st)), st);
        }
        for st in [
            SandboxState::Ready,
            SandboxState::NotReady,
            SandboxState::Unknown,
        ] {
            assert_eq!(sandbox_state_from_wire(sandbox_state_to_wire(st)), st);
        }
        assert_eq!(container_state_from_wire(99), ContainerState::Unknown);
    }

    /// Regression: an unknown sandbox state value was read as NotReady (a death).
    #[test]
    fn an_undefined_sandbox_state_is_unknown_not_a_death() {
        assert_eq!(sandbox_state_from_wire(7), SandboxState::Unknown);
        assert_eq!(sandbox_state_from_wire(-1), SandboxState::Unknown);
    }

    /// Regression: a sandbox with an empty id was accepted (and gave events with an
    /// empty container_id).
    #[test]
    fn a_sandbox_without_id_is_invalid() {
        let meta = Some(cri::PodSandboxMetadata {
            uid: "u1".into(),
            ..Default::default()
        });
        let listed = cri::PodSandbox {
            metadata: meta.clone(),
            ..Default::default()
        };
        assert!(matches!(
            sandbox_from_wire(&listed),
            Err(RuntimeError::Invalid { .. })
        ));
        let status = cri::PodSandboxStatus {
            metadata: meta,
            ..Default::default()
        };
        assert!(matches!(
            sandbox_status_from_wire(&status),
            Err(RuntimeError::Invalid { .. })
        ));
    }

    /// The pod's labels (what subscribers' label selectors match) come from the
    /// sandbox's labels on both reads, and back onto the wire for the simulator.
    #[test]
    fn sandbox_labels_are_carried_from_the_list_and_the_status() {
        let labels: HashMap<String, String> = [
            ("app".to_string(), "web".to_string()),
            ("io.kubernetes.pod.name".to_string(), "web-1".to_string()),
        ]
        .into();
        let meta = Some(cri::PodSandboxMetadata {
            uid: "u1".into(),
            name: "web-1".into(),
            namespace: "ns".into(),
            attempt: 0,
        });
        let listed = sandbox_from_wire(&cri::PodSandbox {
            id: "s1".into(),
            metadata: meta.clone(),
            labels: labels.clone(),
            ..Default::default()
        })
        .unwrap();
        let status = sandbox_status_from_wire(&cri::PodSandboxStatus {
            id: "s1".into(),
            metadata: meta,
            labels: labels.clone(),
            ..Default::default()
        })
        .unwrap();
        let want: BTreeMap<String, String> = labels.clone().into_iter().collect();
        assert_eq!(listed.labels, want);
        assert_eq!(status.labels, want);
        assert_eq!(sandbox_to_wire(&listed).labels, labels);
        assert_eq!(sandbox_status_to_wire(&status).labels, labels);
        // None on the wire: an empty map.
        let bare = sandbox_from_wire(&cri::PodSandbox {
            id: "s2".into(),
            metadata: Some(cri::PodSandboxMetadata {
                uid: "u2".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .unwrap();
        assert!(bare.labels.is_empty());
    }

    /// The moving conversions of the list path agree with the borrowing ones, errors
    /// included.
    #[test]
    fn listed_conversions_move_what_the_borrowing_ones_copy() {
        let meta = |uid: &str| {
            Some(cri::PodSandboxMetadata {
                uid: uid.into(),
                name: "n".into(),
                namespace: "ns".into(),
                attempt: 2,
            })
        };
        for s in [
            cri::PodSandbox {
                id: "s1".into(),
                metadata: meta("u1"),
                state: 1,
                created_at: 5,
                ..Default::default()
            },
            cri::PodSandbox {
                id: "s1".into(),
                metadata: meta(""),
                ..Default::default()
            },
            cri::PodSandbox {
                metadata: meta("u1"),
                ..Default::default()
            },
            cri::PodSandbox {
                id: "s1".into(),
                ..Default::default()
            },
        ] {
            let (a, b) = (sandbox_from_wire(&s), sandbox_from_listed(s));
            assert_eq!(format!("{a:?}"), format!("{b:?}"));
        }
        for c in [
            cri::Container {
                id: "c1".into(),
                pod_sandbox_id: "s1".into(),
                metadata: Some(cri::ContainerMetadata {
                    name: "app".into(),
                    attempt: 3,
                }),
                state: 2,
                created_at: 7,
                ..Default::default()
            },
            cri::Container {
                id: "c1".into(),
                pod_sandbox_id: "s1".into(),
                ..Default::default()
            },
            cri::Container {
                id: "c1".into(),
                ..Default::default()
            },
        ] {
            let (a, b) = (container_from_wire(&c), container_from_listed(c));
            assert_eq!(format!("{a:?}"), format!("{b:?}"));
        }
    }
}
