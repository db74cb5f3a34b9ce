//! What the plugin tells plegd: a hint that one pod changed, or that the runtime just
//! (re)synchronized the plugin. A hint is never state: plegd answers it with a relist
//! (KEP-3386: every event source only asks for a fresh read).

use crate::api;

/// The pod a hint is about, as the runtime's NRI request names it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodRef {
    /// The pod's UID (Kubernetes `metadata.uid`), the key plegd relists by.
    pub uid: String,
    pub name: String,
    pub namespace: String,
    /// The pod sandbox's id.
    pub sandbox_id: String,
}

impl PodRef {
    fn from_api(pod: Option<&api::PodSandbox>) -> Option<Self> {
        pod.map(|p| Self {
            uid: p.uid.clone(),
            name: p.name.clone(),
            namespace: p.namespace.clone(),
            sandbox_id: p.id.clone(),
        })
    }
}

/// What happened to a container or sandbox.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Change {
    Stopped,
    Removed,
}

/// One hint from the runtime.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NriHint {
    /// A container stopped or was removed. `pod` is the request's pod; a runtime that
    /// leaves it out leaves plegd to map `container_id` itself.
    Container {
        change: Change,
        pod: Option<PodRef>,
        container_id: String,
    },
    /// A pod sandbox stopped or was removed.
    Sandbox { change: Change, pod: PodRef },
    /// The runtime sent its whole state (every page of a Synchronize): it follows a
    /// (re)connection, so anything may have happened meanwhile — re-read everything.
    Synchronized { pods: usize, containers: usize },
}

impl NriHint {
    pub(crate) fn container(
        change: Change,
        pod: Option<&api::PodSandbox>,
        ctr: Option<&api::Container>,
    ) -> Option<Self> {
        let container_id = ctr.map(|c| c.id.clone()).filter(|id| !id.is_empty())?;
        Some(Self::Container {
            change,
            pod: PodRef::from_api(pod),
            container_id,
        })
    }

    pub(crate) fn sandbox(change: Change, pod: Option<&api::PodSandbox>) -> Option<Self> {
        let pod =
            PodRef::from_api(pod).filter(|p| !p.uid.is_empty() || !p.sandbox_id.is_empty())?;
        Some(Self::Sandbox { change, pod })
    }

    /// The pod UID the hint names, if any.
    pub fn pod_uid(&self) -> Option<&str> {
        let uid = match self {
            Self::Container { pod, .. } => pod.as_ref().map(|p| p.uid.as_str()),
            Self::Sandbox { pod, .. } => Some(pod.uid.as_str()),
            Self::Synchronized { .. } => None,
        };
        uid.filter(|u| !u.is_empty())
    }
}

/// Where the plugin delivers hints. Called from the runtime's hook, before the hook is
/// answered: it must return at once (enqueue, never wait). A runtime disconnects a
/// plugin that misses its request timeout (2 s by default) even once.
pub trait HintSink: Send + Sync + 'static {
    fn hint(&self, hint: NriHint);
}

impl<F: Fn(NriHint) + Send + Sync + 'static> HintSink for F {
    fn hint(&self, hint: NriHint) {
        self(hint)
    }
}
