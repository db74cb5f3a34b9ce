//! A pod's status packed into one heap block, as the pod cache keeps it (see
//! `cache`). As structs, the status of a pod with a sandbox and two containers takes
//! ≈ 1.3 KB of heap in 14 blocks (each sandbox repeats the pod's three strings); packed
//! it takes ≈ 250 bytes. Readers get the structs back ([`PackedStatus::unpack`]);
//! the IDs and container states come first, so the hint sources' lookups by container
//! ID ([`PackedStatus::find_id`], [`PackedStatus::container_state`]) read them without
//! unpacking anything.

use std::collections::BTreeMap;

use plegd_runtime::{ContainerState, ContainerStatus, PodRef, Sandbox, SandboxState};

use crate::event::EventKind;
use crate::id_map::IdMap;
use crate::packed::{kind_code, kind_of, Reader, Writer};
use crate::pleg::PodStatus;

fn container_code(s: ContainerState) -> u8 {
    match s {
        ContainerState::Created => 0,
        ContainerState::Running => 1,
        ContainerState::Exited => 2,
        ContainerState::Unknown => 3,
    }
}

fn container_state(code: u8) -> Option<ContainerState> {
    Some(match code {
        0 => ContainerState::Created,
        1 => ContainerState::Running,
        2 => ContainerState::Exited,
        3 => ContainerState::Unknown,
        _ => return None,
    })
}

fn sandbox_code(s: SandboxState) -> u8 {
    match s {
        SandboxState::Ready => 0,
        SandboxState::NotReady => 1,
        SandboxState::Unknown => 2,
    }
}

fn sandbox_state(code: u8) -> Option<SandboxState> {
    Some(match code {
        0 => SandboxState::Ready,
        1 => SandboxState::NotReady,
        2 => SandboxState::Unknown,
        _ => return None,
    })
}

fn write_pod(w: &mut Writer<'_>, pod: &PodRef) {
    let PodRef {
        uid,
        name,
        namespace,
    } = pod;
    w.str(uid);
    w.str(name);
    w.str(namespace);
}

fn read_pod(r: &mut Reader<'_>) -> Option<PodRef> {
    Some(PodRef {
        uid: r.string()?,
        name: r.string()?,
        namespace: r.string()?,
    })
}

/// A sandbox's pod is written only when it differs from the status's own.
const OTHER_POD: u8 = 1;

/// One pod's status in one block (see the module docs).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct PackedStatus(Box<[u8]>);

impl std::fmt::Debug for PackedStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("PackedStatus").field(&self.unpack()).finish()
    }
}

impl PackedStatus {
    /// Packs `status`, using `buf` as scratch (kept by the caller).
    pub(crate) fn pack(status: &PodStatus, buf: &mut Vec<u8>) -> Self {
        buf.clear();
        let mut w = Writer(buf);
        let PodStatus {
            pod,
            sandboxes,
            containers,
        } = status;
        // The IDs first (the lookups read only these).
        w.u64(sandboxes.len() as u64);
        w.u64(containers.len() as u64);
        for sb in sandboxes {
            w.str(&sb.id);
        }
        for c in containers {
            w.str(&c.id);
            w.u8(container_code(c.state));
        }
        write_pod(&mut w, pod);
        for sb in sandboxes {
            // Every field named: a field added to Sandbox must be packed too.
            let Sandbox {
                id: _,
                pod: sb_pod,
                attempt,
                state,
                created_at,
                labels,
            } = sb;
            if sb_pod == pod {
                w.u8(0);
            } else {
                w.u8(OTHER_POD);
                write_pod(&mut w, sb_pod);
            }
            w.u64(u64::from(*attempt));
            w.u8(sandbox_code(*state));
            w.i64(*created_at);
            w.u64(labels.len() as u64);
            for (k, v) in labels {
                w.str(k);
                w.str(v);
            }
        }
        for c in containers {
            let ContainerStatus {
                id: _,
                sandbox_id,
                name,
                attempt,
                state: _,
                created_at,
                started_at,
                finished_at,
                exit_code,
                reason,
                message,
                image,
            } = c;
            w.str(sandbox_id);
            w.str(name);
            w.u64(u64::from(*attempt));
            w.i64(*created_at);
            w.i64(*started_at);
            w.i64(*finished_at);
            w.i64(i64::from(*exit_code));
            w.str(reason);
            w.str(message);
            w.str(image);
        }
        PackedStatus(Box::from(&buf[..]))
    }

    /// The packed bytes (what the state dir stores).
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Bytes read back from the state dir: None unless they unpack.
    pub(crate) fn from_bytes(b: &[u8]) -> Option<Self> {
        let packed = PackedStatus(Box::from(b));
        packed.unpack().map(|_| packed)
    }

    /// Bytes of heap the packed status takes.
    #[cfg(test)]
    pub(crate) fn heap_bytes(&self) -> usize {
        self.0.len()
    }

    /// Calls `each(id, container state)` for every sandbox (state None) and container
    /// ID, in order, until it returns true; returns whether one did.
    fn any_id(&self, mut each: impl FnMut(&str, Option<ContainerState>) -> bool) -> bool {
        let mut r = Reader(&self.0);
        let (Some(sandboxes), Some(containers)) = (r.u64(), r.u64()) else {
            return false;
        };
        for _ in 0..sandboxes {
            match r.str() {
                Some(id) if each(id, None) => return true,
                Some(_) => {}
                None => return false,
            }
        }
        for _ in 0..containers {
            let (Some(id), Some(state)) = (r.str(), r.u8().and_then(container_state)) else {
                return false;
            };
            if each(id, Some(state)) {
                return true;
            }
        }
        false
    }

    /// If `id` is one of the pod's sandboxes or containers: its state if it is a
    /// container (None: a sandbox).
    pub(crate) fn find_id(&self, id: &str) -> Option<Option<ContainerState>> {
        let mut found = None;
        self.any_id(|x, state| {
            if x == id {
                found = Some(state);
            }
            found.is_some()
        });
        found
    }

    /// The state of container `id` (None: not a container of this pod).
    pub(crate) fn container_state(&self, id: &str) -> Option<ContainerState> {
        let mut found = None;
        self.any_id(|x, state| {
            if x == id && state.is_some() {
                found = state;
                return true;
            }
            false
        });
        found
    }

    /// The status as it was packed; None only if the bytes were not written by
    /// [`Self::pack`] (a bug).
    pub(crate) fn unpack(&self) -> Option<PodStatus> {
        let mut r = Reader(&self.0);
        let n_sandboxes = usize::try_from(r.u64()?).ok()?;
        let n_containers = usize::try_from(r.u64()?).ok()?;
        // Each entry takes at least a byte: a count beyond the block is garbage (and
        // must not size an allocation).
        if n_sandboxes.saturating_add(n_containers) > self.0.len() {
            return None;
        }
        let mut sb_ids = Vec::with_capacity(n_sandboxes);
        for _ in 0..n_sandboxes {
            sb_ids.push(r.string()?);
        }
        let mut c_ids = Vec::with_capacity(n_containers);
        for _ in 0..n_containers {
            c_ids.push((r.string()?, container_state(r.u8()?)?));
        }
        let pod = read_pod(&mut r)?;
        let mut sandboxes = Vec::with_capacity(n_sandboxes);
        for id in sb_ids {
            let sb_pod = match r.u8()? {
                0 => pod.clone(),
                OTHER_POD => read_pod(&mut r)?,
                _ => return None,
            };
            let attempt = r.u32()?;
            let state = sandbox_state(r.u8()?)?;
            let created_at = r.i64()?;
            let n_labels = usize::try_from(r.u64()?).ok()?;
            let mut labels = BTreeMap::new();
            for _ in 0..n_labels {
                let k = r.string()?;
                labels.insert(k, r.string()?);
            }
            sandboxes.push(Sandbox {
                id,
                pod: sb_pod,
                attempt,
                state,
                created_at,
                labels,
            });
        }
        let mut containers = Vec::with_capacity(n_containers);
        for (id, state) in c_ids {
            containers.push(ContainerStatus {
                id,
                sandbox_id: r.string()?,
                name: r.string()?,
                attempt: r.u32()?,
                state,
                created_at: r.i64()?,
                started_at: r.i64()?,
                finished_at: r.i64()?,
                exit_code: i32::try_from(r.i64()?).ok()?,
                reason: r.string()?,
                message: r.string()?,
                image: r.string()?,
            });
        }
        if !r.0.is_empty() {
            return None;
        }
        Some(PodStatus {
            pod,
            sandboxes,
            containers,
        })
    }
}

/// What the events said last of each sandbox and container of a pod (the cache's
/// `reported`), packed: one block of ≈ 16 bytes an ID instead of a vector and a
/// string per ID (≈ 200 bytes for a sandbox and two containers); none when empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct PackedReported(Box<[u8]>);

impl PackedReported {
    pub(crate) fn pack(reported: &IdMap<EventKind>, buf: &mut Vec<u8>) -> Self {
        buf.clear();
        let mut w = Writer(buf);
        for (id, kind) in reported {
            w.str(id);
            w.u8(kind_code(*kind));
        }
        PackedReported(Box::from(&buf[..]))
    }

    /// The packed bytes (what the state dir stores).
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Bytes read back from the state dir: None unless every entry reads.
    pub(crate) fn from_bytes(b: &[u8]) -> Option<Self> {
        let mut r = Reader(b);
        while !r.0.is_empty() {
            r.str()?;
            r.u8().and_then(kind_of)?;
        }
        Some(PackedReported(Box::from(b)))
    }

    /// The map as it was packed; what cannot be read (only a bug could write it) is
    /// left out.
    pub(crate) fn unpack(&self) -> IdMap<EventKind> {
        let mut r = Reader(&self.0);
        let mut map = IdMap::new();
        while !r.0.is_empty() {
            let (Some(id), Some(kind)) = (r.string(), r.u8().and_then(kind_of)) else {
                debug_assert!(false, "packed reported states that do not unpack");
                break;
            };
            map.insert(id, kind);
        }
        map
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str) -> PodRef {
        PodRef {
            uid: uid.into(),
            name: format!("name-{uid}"),
            namespace: "ns".into(),
        }
    }

    fn container(id: &str, sb: &str, state: ContainerState) -> ContainerStatus {
        ContainerStatus {
            id: id.into(),
            sandbox_id: sb.into(),
            name: format!("name-{id}"),
            attempt: 2,
            state,
            created_at: 1_764_000_000_000_000_000,
            started_at: 1_764_000_001_000_000_000,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            image: "registry.example/app:1".into(),
        }
    }

    fn status() -> PodStatus {
        let uid = "0000002a-0000-4000-8000-00000000002a";
        PodStatus {
            pod: pod(uid),
            sandboxes: vec![
                Sandbox {
                    id: "s".repeat(64),
                    pod: pod(uid),
                    attempt: 1,
                    state: SandboxState::Ready,
                    created_at: 1_764_000_000_000_000_000,
                    labels: [("app".to_string(), "web".to_string())].into(),
                },
                // An older sandbox of the pod, named differently then.
                Sandbox {
                    id: "old".into(),
                    pod: PodRef {
                        name: "renamed".into(),
                        ..pod(uid)
                    },
                    attempt: 0,
                    state: SandboxState::NotReady,
                    created_at: -5,
                    labels: BTreeMap::new(),
                },
            ],
            containers: vec![
                container("c1", &"s".repeat(64), ContainerState::Running),
                ContainerStatus {
                    exit_code: -137,
                    finished_at: i64::MAX,
                    reason: "OOMKilled".into(),
                    message: "ünïcødé".into(),
                    attempt: u32::MAX,
                    ..container("c2", "old", ContainerState::Exited)
                },
                container("c3", "old", ContainerState::Created),
                container("c4", "old", ContainerState::Unknown),
            ],
        }
    }

    #[test]
    fn reported_states_come_back_as_they_were_packed() {
        let mut buf = Vec::new();
        let empty = IdMap::new();
        let packed = PackedReported::pack(&empty, &mut buf);
        assert_eq!(packed, PackedReported::default());
        assert_eq!(packed.unpack(), empty);
        let map = IdMap::from([
            ("s".repeat(64), EventKind::ContainerStarted),
            ("c1".into(), EventKind::ContainerDied),
            ("c2".into(), EventKind::ContainerRemoved),
            ("".into(), EventKind::PodSync),
            ("c3".into(), EventKind::ContainerChanged),
        ]);
        assert_eq!(PackedReported::pack(&map, &mut buf).unpack(), map);
    }

    #[test]
    fn a_status_comes_back_as_it_was_packed() {
        let mut buf = Vec::new();
        let st = status();
        assert_eq!(PackedStatus::pack(&st, &mut buf).unpack(), Some(st.clone()));
        for state in [
            SandboxState::Ready,
            SandboxState::NotReady,
            SandboxState::Unknown,
        ] {
            let mut st = st.clone();
            st.sandboxes[0].state = state;
            assert_eq!(PackedStatus::pack(&st, &mut buf).unpack(), Some(st));
        }
        let empty = PodStatus {
            pod: pod("u"),
            sandboxes: Vec::new(),
            containers: Vec::new(),
        };
        assert_eq!(PackedStatus::pack(&empty, &mut buf).unpack(), Some(empty));
    }

    #[test]
    fn ids_and_container_states_are_found_without_unpacking() {
        let mut buf = Vec::new();
        let p = PackedStatus::pack(&status(), &mut buf);
        assert_eq!(p.find_id(&"s".repeat(64)), Some(None));
        assert_eq!(p.find_id("old"), Some(None));
        assert_eq!(p.find_id("c4"), Some(Some(ContainerState::Unknown)));
        assert_eq!(p.find_id("c2"), Some(Some(ContainerState::Exited)));
        assert_eq!(p.find_id("c5"), None);
        assert_eq!(p.find_id("c"), None);
        assert_eq!(p.container_state("c1"), Some(ContainerState::Running));
        assert_eq!(p.container_state("c2"), Some(ContainerState::Exited));
        assert_eq!(p.container_state("c3"), Some(ContainerState::Created));
        // A sandbox is not a container.
        assert_eq!(p.container_state("old"), None);
        assert_eq!(p.container_state("nope"), None);
    }

    #[test]
    fn a_pod_with_a_sandbox_and_two_containers_takes_a_few_hundred_bytes() {
        let mut st = status();
        st.sandboxes.truncate(1);
        st.containers.truncate(2);
        let mut buf = Vec::new();
        let n = PackedStatus::pack(&st, &mut buf).heap_bytes();
        // 36 + 10 + 2 (pod), 64 + 3 + 8 + 9 (sandbox), 2 × (2 + 64 + 7 + 3 × 9 + 22).
        assert!(n < 420, "{n} bytes");
    }

    #[test]
    fn truncated_bytes_unpack_to_none_and_find_nothing_never_a_panic() {
        let mut buf = Vec::new();
        let bytes = PackedStatus::pack(&status(), &mut buf).0.into_vec();
        for len in 0..bytes.len() {
            let p = PackedStatus(bytes[..len].into());
            assert_eq!(p.unpack(), None, "{len}");
            // Whatever is complete is still found; nothing past the end is.
            let _ = p.find_id("c4");
            assert_eq!(p.container_state("nope"), None);
        }
    }
}
