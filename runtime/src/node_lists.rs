//! The whole node's lists for a global relist, and a borrowed view of them.
//!
//! A CRI runtime hands back the two responses read as they arrived
//! ([`NodeLists::Sunk`]: [`crate::list_sink`]), or their bytes ([`NodeLists::Wire`]),
//! which the view reads in place ([`crate::list_wire`]). Either way IDs, pod identity
//! and states are borrowed, nothing allocated per entry, so the global relist can
//! compare them with its records and build owned [`Sandbox`]es and [`Container`]s
//! only for the pods that changed. Other runtimes (the simulated one) hand back
//! decoded lists ([`NodeLists::Decoded`]), viewed the same way.

use prost::bytes::Bytes;

use crate::convert::{container_state_from_wire, sandbox_state_from_wire};
use crate::list_memo::ListMemo;
use crate::list_wire;
use crate::packed_lists::{ContainerList, SandboxList};
use crate::{Container, ContainerState, PodRef, RuntimeError, Sandbox, SandboxState};

/// Every sandbox and every container of the node, as listed.
#[derive(Clone, Debug)]
pub enum NodeLists {
    Decoded {
        sandboxes: Vec<Sandbox>,
        containers: Vec<Container>,
    },
    /// The bytes of a `ListPodSandboxResponse` and of a `ListContainersResponse`,
    /// not yet checked.
    Wire { sandboxes: Bytes, containers: Bytes },
    /// The sandboxes of a `ListPodSandboxResponse` (or StreamPodSandboxes) and the
    /// containers of a `ListContainersResponse` (or StreamContainers), read as they
    /// arrived ([`crate::list_sink`]).
    Sunk {
        sandboxes: SandboxList,
        containers: ContainerList,
    },
}

/// A listed sandbox, borrowed.
#[derive(Clone, Copy, Debug)]
pub struct SandboxRef<'a> {
    pub id: &'a str,
    pub uid: &'a str,
    pub name: &'a str,
    pub namespace: &'a str,
    pub state: SandboxState,
    from: SandboxSource<'a>,
}

#[derive(Clone, Copy, Debug)]
enum SandboxSource<'a> {
    Decoded(&'a Sandbox),
    /// The entry's bytes, or its label fields alone (None: not kept), and what was
    /// read of them.
    Wire(Option<&'a [u8]>, u32, i64),
}

/// A listed container, borrowed.
#[derive(Clone, Copy, Debug)]
pub struct ContainerRef<'a> {
    pub id: &'a str,
    pub sandbox_id: &'a str,
    pub name: &'a str,
    pub attempt: u32,
    pub state: ContainerState,
    pub created_at: i64,
}

/// The node's lists, read: the sandboxes and containers plegd can attribute (the
/// same ones `list_sandboxes(None)` and `list_containers(None)` return).
#[derive(Debug, Default)]
pub struct ListView<'a> {
    pub sandboxes: Vec<SandboxRef<'a>>,
    pub containers: Vec<ContainerRef<'a>>,
}

/// The buffers of the global relist's last read kept for the next one: the packed
/// lists, ≈ 5 MB at 10,000 realistic pods that a new read would map, fault in and
/// clear anew (plegd gives freed memory back after every relist:
/// docs/architecture.md, "Performance decisions").
#[derive(Debug, Default)]
pub(crate) struct ListRoom {
    pub(crate) containers: ContainerList,
    pub(crate) sandboxes: SandboxList,
}

impl ListRoom {
    /// Keeps `lists`' packed lists, emptied, unless their room is over three times
    /// what they held (a node that shrank: the next read grows new ones).
    pub(crate) fn keep(&mut self, lists: NodeLists) {
        if let NodeLists::Sunk {
            mut sandboxes,
            mut containers,
        } = lists
        {
            if containers.fits() {
                containers.clear();
                self.containers = containers;
            }
            if sandboxes.fits() {
                sandboxes.clear();
                self.sandboxes = sandboxes;
            }
        }
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.containers.heap_bytes() + self.sandboxes.heap_bytes()
    }
}

impl<'a> ListView<'a> {
    /// A view of decoded lists.
    pub fn of(sandboxes: &'a [Sandbox], containers: &'a [Container]) -> Self {
        let mut view = ListView::default();
        view.sandboxes.extend(sandboxes.iter().map(|s| SandboxRef {
            id: &s.id,
            uid: &s.pod.uid,
            name: &s.pod.name,
            namespace: &s.pod.namespace,
            state: s.state,
            from: SandboxSource::Decoded(s),
        }));
        view.containers
            .extend(containers.iter().map(|c| ContainerRef {
                id: &c.id,
                sandbox_id: &c.sandbox_id,
                name: &c.name,
                attempt: c.attempt,
                state: c.state,
                created_at: c.created_at,
            }));
        view
    }
}

impl SandboxRef<'_> {
    /// Whether this sandbox names this pod.
    pub fn is_pod(&self, pod: &PodRef) -> bool {
        self.uid == pod.uid && self.name == pod.name && self.namespace == pod.namespace
    }

    /// The owned sandbox (what `list_sandboxes` would have returned for it), and
    /// whether its labels were read. They were not when the list did not keep them
    /// (an entry the list memo vouched for: [`crate::packed_lists`]); the sandbox's
    /// labels are then empty, to be taken from an earlier read of this sandbox ID or
    /// from PodSandboxStatus (a sandbox's labels never change).
    pub fn to_sandbox(&self) -> Result<(Sandbox, bool), RuntimeError> {
        match self.from {
            SandboxSource::Decoded(s) => Ok((s.clone(), true)),
            SandboxSource::Wire(labels, attempt, created_at) => {
                let sandbox = |labels| Sandbox {
                    id: self.id.to_string(),
                    pod: PodRef {
                        uid: self.uid.to_string(),
                        name: self.name.to_string(),
                        namespace: self.namespace.to_string(),
                    },
                    attempt,
                    state: self.state,
                    created_at,
                    labels,
                };
                match labels {
                    None => Ok((sandbox(Default::default()), false)),
                    Some(fields) => list_wire::sandbox_labels(fields)
                        .map(|labels| (sandbox(labels), true))
                        .map_err(|reason| RuntimeError::Invalid {
                            op: "ListPodSandbox",
                            reason,
                        }),
                }
            }
        }
    }
}

impl ContainerRef<'_> {
    /// The owned container (what `list_containers` would have returned for it).
    pub fn to_container(&self) -> Container {
        Container {
            id: self.id.to_string(),
            sandbox_id: self.sandbox_id.to_string(),
            name: self.name.to_string(),
            attempt: self.attempt,
            state: self.state,
            created_at: self.created_at,
        }
    }
}

impl NodeLists {
    /// Lists as a CRI runtime sends them: the two responses' bytes (for tests and
    /// benchmarks of the path [`crate::CriRuntime`] takes).
    pub fn encoded(sandboxes: &[Sandbox], containers: &[Container]) -> Self {
        use prost::Message;
        let sandboxes = crate::cri::ListPodSandboxResponse {
            items: sandboxes
                .iter()
                .map(crate::convert::sandbox_to_wire)
                .collect(),
        };
        let containers = crate::cri::ListContainersResponse {
            containers: containers
                .iter()
                .map(crate::convert::container_to_wire)
                .collect(),
        };
        NodeLists::Wire {
            sandboxes: sandboxes.encode_to_vec().into(),
            containers: containers.encode_to_vec().into(),
        }
    }

    /// Reads the lists. Bytes that prost would not decode fail the whole read
    /// ([`RuntimeError::Invalid`]), as a decode error fails the list call; an entry
    /// plegd cannot attribute (a sandbox without metadata or pod UID, a container
    /// without its sandbox's ID) is left out, as the list calls leave it out.
    pub fn view(&self) -> Result<ListView<'_>, RuntimeError> {
        self.read(None)
    }

    /// [`NodeLists::view`] for the global relist: the entries whose bytes `memo`
    /// vouches for (fully checked in its last good read) are read without checking
    /// the fields plegd does not read ([`crate::list_memo`]); the same view otherwise.
    /// The memo then holds this read's entries if it succeeded, and is left as it was
    /// if it failed.
    pub fn view_memo(&self, memo: &mut ListMemo) -> Result<ListView<'_>, RuntimeError> {
        self.read(Some(memo))
    }

    fn read(&self, mut memo: Option<&mut ListMemo>) -> Result<ListView<'_>, RuntimeError> {
        let mut view = ListView::default();
        match self {
            NodeLists::Decoded {
                sandboxes,
                containers,
            } => Ok(ListView::of(sandboxes, containers)),
            NodeLists::Wire {
                sandboxes,
                containers,
            } => {
                let read = wire_view(view, sandboxes, containers, memo.as_deref_mut());
                if let Some(memo) = memo {
                    memo.finish(read.is_ok());
                }
                read
            }
            NodeLists::Sunk {
                sandboxes,
                containers,
            } => {
                view.sandboxes.reserve_exact(sandboxes.len());
                view.sandboxes.extend(
                    sandboxes
                        .iter()
                        .filter_map(|(f, labels)| sandbox_ref(f, labels)),
                );
                view.containers.reserve_exact(containers.len());
                view.containers
                    .extend(containers.iter().filter_map(container_ref));
                // Its entries were read as they arrived: the read succeeded.
                if let Some(memo) = memo {
                    memo.finish(true);
                }
                Ok(view)
            }
        }
    }
}

/// The view of [`NodeLists::Wire`] (its read not yet finished in `memo`).
fn wire_view<'a>(
    mut view: ListView<'a>,
    sandboxes: &'a [u8],
    containers: &'a [u8],
    mut memo: Option<&mut ListMemo>,
) -> Result<ListView<'a>, RuntimeError> {
    add_sandboxes(&mut view, sandboxes, memo.as_deref_mut())?;
    list_wire::containers_memo(containers, memo, |f| {
        view.containers.extend(container_ref(f));
    })
    .map_err(|reason| RuntimeError::Invalid {
        op: "ListContainers",
        reason,
    })?;
    Ok(view)
}

/// Adds the sandboxes of a `ListPodSandboxResponse`'s bytes to `view`.
fn add_sandboxes<'a>(
    view: &mut ListView<'a>,
    sandboxes: &'a [u8],
    memo: Option<&mut ListMemo>,
) -> Result<(), RuntimeError> {
    list_wire::sandboxes_memo(sandboxes, memo, |f, entry| {
        view.sandboxes.extend(sandbox_ref(f, Some(entry)));
    })
    .map_err(|reason| RuntimeError::Invalid {
        op: "ListPodSandbox",
        reason,
    })
}

/// A listed sandbox as the view holds it (`labels`: its entry's bytes or its label
/// fields, if kept); None (logged) for one plegd cannot attribute.
fn sandbox_ref<'a>(
    f: list_wire::SandboxFields<'a>,
    labels: Option<&'a [u8]>,
) -> Option<SandboxRef<'a>> {
    if f.id.is_empty() || !f.has_metadata || f.uid.is_empty() {
        tracing::debug!(
            id = f.id,
            "ignoring a listed sandbox without id, metadata or pod UID"
        );
        return None;
    }
    Some(SandboxRef {
        id: f.id,
        uid: f.uid,
        name: f.name,
        namespace: f.namespace,
        state: sandbox_state_from_wire(f.state),
        from: SandboxSource::Wire(labels, f.attempt, f.created_at),
    })
}

/// A listed container as the view holds it; None (logged) for one plegd cannot
/// attribute.
fn container_ref(f: list_wire::ContainerFields<'_>) -> Option<ContainerRef<'_>> {
    if f.id.is_empty() || f.sandbox_id.is_empty() {
        tracing::debug!(
            id = f.id,
            "ignoring a listed container without id or sandbox id"
        );
        return None;
    }
    Some(ContainerRef {
        id: f.id,
        sandbox_id: f.sandbox_id,
        name: f.name,
        attempt: f.attempt,
        state: container_state_from_wire(f.state),
        created_at: f.created_at,
    })
}
