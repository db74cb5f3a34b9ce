//! The whole node's lists for a global relist, and a borrowed view of them.
//!
//! A CRI runtime hands back the two responses read as they arrived
//! ([`NodeLists::Sunk`]: [`crate::list_sink`]), or their bytes ([`NodeLists::Wire`]),
//! which the view reads in place ([`crate::list_wire`]). Either way IDs, pod identity
//! and states are borrowed, nothing allocated per entry, so the global relist can
//! compare them with its records and build owned [`Sandbox`]es and [`Container`]s
//! only for the pods that changed. Other runtimes (the simulated one) hand back
//! decoded lists ([`NodeLists::Decoded`]), viewed the same way.

use std::cell::OnceCell;

use either::Either;
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
///
/// Lists read as they arrived are walked in place ([`ListView::each_sandbox`],
/// [`ListView::each_container`]); their entries are gathered into slices only when
/// something asks for them ([`ListView::sandboxes`], [`ListView::containers`]): a
/// global relist that finds no change walks them at most once (not at all when the
/// list memo finds them unchanged), and at 10,000 pods the slices (≈ 2.5 MB, mapped
/// and faulted in anew each time) were ≈ 8 % of its CPU.
#[derive(Debug, Default)]
pub struct ListView<'a> {
    packed: Option<(&'a SandboxList, &'a ContainerList)>,
    sandboxes: OnceCell<Vec<SandboxRef<'a>>>,
    containers: OnceCell<Vec<ContainerRef<'a>>>,
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
        let sandboxes = sandboxes
            .iter()
            .map(|s| SandboxRef {
                id: &s.id,
                uid: &s.pod.uid,
                name: &s.pod.name,
                namespace: &s.pod.namespace,
                state: s.state,
                from: SandboxSource::Decoded(s),
            })
            .collect();
        let containers = containers
            .iter()
            .map(|c| ContainerRef {
                id: &c.id,
                sandbox_id: &c.sandbox_id,
                name: &c.name,
                attempt: c.attempt,
                state: c.state,
                created_at: c.created_at,
            })
            .collect();
        ListView::gathered(sandboxes, containers)
    }

    fn gathered(sandboxes: Vec<SandboxRef<'a>>, containers: Vec<ContainerRef<'a>>) -> Self {
        ListView {
            packed: None,
            sandboxes: OnceCell::from(sandboxes),
            containers: OnceCell::from(containers),
        }
    }

    /// The listed sandboxes, in list order.
    pub fn sandboxes(&self) -> &[SandboxRef<'a>] {
        self.sandboxes
            .get_or_init(|| self.packed_sandboxes().collect())
    }

    /// The listed containers, in list order.
    pub fn containers(&self) -> &[ContainerRef<'a>] {
        self.containers
            .get_or_init(|| self.packed_containers().collect())
    }

    /// The listed sandboxes, in list order, without gathering them (its size hint's
    /// upper bound is known).
    pub fn each_sandbox(&self) -> impl Iterator<Item = SandboxRef<'a>> + '_ {
        match self.sandboxes.get() {
            Some(gathered) => Either::Left(gathered.iter().copied()),
            None => Either::Right(self.packed_sandboxes()),
        }
    }

    /// The listed containers, in list order, without gathering them (its size hint's
    /// upper bound is known).
    pub fn each_container(&self) -> impl Iterator<Item = ContainerRef<'a>> + '_ {
        match self.containers.get() {
            Some(gathered) => Either::Left(gathered.iter().copied()),
            None => Either::Right(self.packed_containers()),
        }
    }

    fn packed_sandboxes(&self) -> impl Iterator<Item = SandboxRef<'a>> {
        let packed = self
            .packed
            .map_or(Either::Left(std::iter::empty()), |(s, _)| {
                Either::Right(s.iter())
            });
        packed.filter_map(|(f, labels)| sandbox_ref(f, labels))
    }

    fn packed_containers(&self) -> impl Iterator<Item = ContainerRef<'a>> {
        let packed = self
            .packed
            .map_or(Either::Left(std::iter::empty()), |(_, c)| {
                Either::Right(c.iter())
            });
        packed.filter_map(container_ref)
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
        match self {
            NodeLists::Decoded {
                sandboxes,
                containers,
            } => {
                // Lists the memo did not read: it cannot tell them unchanged.
                if let Some(memo) = memo {
                    memo.finish(false);
                }
                Ok(ListView::of(sandboxes, containers))
            }
            NodeLists::Wire {
                sandboxes,
                containers,
            } => {
                let read = wire_view(sandboxes, containers, memo.as_deref_mut());
                if let Some(memo) = memo {
                    memo.finish(read.is_ok());
                }
                read
            }
            NodeLists::Sunk {
                sandboxes,
                containers,
            } => {
                // Its entries were read as they arrived: the read succeeded.
                if let Some(memo) = memo {
                    memo.finish(true);
                }
                Ok(ListView {
                    packed: Some((sandboxes, containers)),
                    ..ListView::default()
                })
            }
        }
    }
}

/// The view of [`NodeLists::Wire`] (its read not yet finished in `memo`).
fn wire_view<'a>(
    sandboxes: &'a [u8],
    containers: &'a [u8],
    mut memo: Option<&mut ListMemo>,
) -> Result<ListView<'a>, RuntimeError> {
    let mut sandbox_refs = Vec::new();
    list_wire::sandboxes_memo(sandboxes, memo.as_deref_mut(), |f, entry| {
        sandbox_refs.extend(sandbox_ref(f, Some(entry)));
    })
    .map_err(|reason| RuntimeError::Invalid {
        op: "ListPodSandbox",
        reason,
    })?;
    let mut container_refs = Vec::new();
    list_wire::containers_memo(containers, memo, |f| {
        container_refs.extend(container_ref(f));
    })
    .map_err(|reason| RuntimeError::Invalid {
        op: "ListContainers",
        reason,
    })?;
    Ok(ListView::gathered(sandbox_refs, container_refs))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::list_memo::ListMemo;

    fn sandbox(i: usize) -> Sandbox {
        Sandbox {
            id: format!("{i:064x}"),
            pod: PodRef {
                // Every seventh sandbox has no pod UID: plegd cannot attribute it.
                uid: if i % 7 == 3 {
                    String::new()
                } else {
                    format!("uid-{i}")
                },
                name: format!("pod-{i}"),
                namespace: "default".into(),
            },
            attempt: 0,
            state: SandboxState::Ready,
            created_at: i as i64,
            labels: [("app".to_string(), format!("a{i}"))].into(),
        }
    }

    fn container(i: usize) -> Container {
        Container {
            id: format!("{:064x}", 1_000 + i),
            // Every fifth container has no sandbox ID: left out too.
            sandbox_id: if i % 5 == 1 {
                String::new()
            } else {
                format!("{i:064x}")
            },
            name: "app".into(),
            attempt: 1,
            state: ContainerState::Running,
            created_at: i as i64,
        }
    }

    /// The two responses' bytes, as a CRI runtime sends them.
    fn encoded(sandboxes: &[Sandbox], containers: &[Container]) -> (Bytes, Bytes) {
        match NodeLists::encoded(sandboxes, containers) {
            NodeLists::Wire {
                sandboxes,
                containers,
            } => (sandboxes, containers),
            _ => panic!("encoded lists are bytes"),
        }
    }

    /// A view of lists read as they arrived walks them in place, and gathers them
    /// only when asked: the same entries either way, and the same as a view of the
    /// responses' bytes (those plegd cannot attribute left out by all three).
    #[test]
    fn a_view_of_sunk_lists_walks_in_place_what_it_gathers() {
        let sandboxes: Vec<Sandbox> = (0..50).map(sandbox).collect();
        let containers: Vec<Container> = (0..80).map(container).collect();
        let (s, c) = encoded(&sandboxes, &containers);
        let wire = NodeLists::Wire {
            sandboxes: s.clone(),
            containers: c.clone(),
        };
        let wire = wire.view().expect("valid lists");
        let gathered = |view: &ListView<'_>| {
            (
                view.sandboxes()
                    .iter()
                    .map(|s| s.to_sandbox().expect("labels").0)
                    .collect::<Vec<_>>(),
                view.containers()
                    .iter()
                    .map(ContainerRef::to_container)
                    .collect::<Vec<_>>(),
            )
        };
        let expected = gathered(&wire);
        assert_eq!(expected.0.len(), 50 - 7, "sandboxes without a pod UID");
        assert_eq!(expected.1.len(), 80 - 16, "containers without a sandbox ID");

        let mut memo = ListMemo::default();
        let lists = NodeLists::sunk(&s, &c, 100, &mut memo).expect("valid lists");
        let view = lists.view_memo(&mut memo).expect("valid lists");
        let walk = |view: &ListView<'_>| {
            (
                view.each_sandbox()
                    .map(|s| s.to_sandbox().expect("labels").0)
                    .collect::<Vec<_>>(),
                view.each_container()
                    .map(|c| c.to_container())
                    .collect::<Vec<_>>(),
            )
        };
        assert_eq!(walk(&view), expected, "walked in place");
        assert!(view.sandboxes.get().is_none() && view.containers.get().is_none());
        // What was listed, at most (what a table sized for the walk is sized for).
        assert_eq!(view.each_sandbox().size_hint().1, Some(50));
        assert_eq!(view.each_container().size_hint().1, Some(80));

        assert_eq!(gathered(&view), expected, "gathered");
        assert_eq!(walk(&view), expected, "walked once gathered");
        assert_eq!(view.each_sandbox().size_hint(), (43, Some(43)));
    }

    /// Lists the memo did not read (decoded by the runtime) are never "unchanged",
    /// whatever the memo's last read found.
    #[test]
    fn lists_the_memo_did_not_read_are_not_unchanged() {
        let sandboxes: Vec<Sandbox> = (0..5).map(sandbox).collect();
        let containers: Vec<Container> = (0..5).map(container).collect();
        let (s, c) = encoded(&sandboxes, &containers);
        let mut memo = ListMemo::default();
        for _ in 0..2 {
            let lists = NodeLists::sunk(&s, &c, 100, &mut memo).expect("valid lists");
            lists.view_memo(&mut memo).expect("valid lists");
        }
        assert!(memo.unchanged());
        let decoded = NodeLists::Decoded {
            sandboxes: sandboxes[1..].to_vec(),
            containers,
        };
        decoded.view_memo(&mut memo).expect("decoded lists");
        assert!(!memo.unchanged());
    }
}
