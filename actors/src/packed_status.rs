//! A pod's status packed into one heap block, as the pod cache keeps it (see
//! `cache`). As structs, the status of a pod with a sandbox and two containers takes
//! ≈ 1.3 KB of heap in 14 blocks (each sandbox repeats the pod's three strings); packed
//! it takes ≈ 350 bytes on a real node: hex IDs and digests as the bytes they spell,
//! the UID as its 16 bytes, kubelet's label keys as an index, label values that
//! repeat the pod and a container's sandbox ID as a reference (`packed`'s
//! `Writer::compact`). Readers get the structs back ([`PackedStatus::unpack`]);
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
    w.compact(uid);
    w.compact(name);
    w.compact(namespace);
}

fn read_pod(r: &mut Reader<'_>) -> Option<PodRef> {
    Some(PodRef {
        uid: r.compact()?,
        name: r.compact()?,
        namespace: r.compact()?,
    })
}

/// Label keys written as their index (from 1; 0: the key follows): kubelet's own,
/// on every sandbox, and the commonest of pods' own. Part of the format: append only.
const KNOWN_KEYS: &[&str] = &[
    "io.kubernetes.pod.name",
    "io.kubernetes.pod.namespace",
    "io.kubernetes.pod.uid",
    "io.kubernetes.container.name",
    "app",
    "pod-template-hash",
    "controller-revision-hash",
    "pod-template-generation",
    "statefulset.kubernetes.io/pod-name",
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
    "k8s-app",
    "component",
    "tier",
    "name",
    "version",
    "release",
];

/// A label value that repeats its sandbox's pod (kubelet's `io.kubernetes.pod.*`
/// labels do) is written as which field it repeats; 0: the value follows.
const VALUE_UID: u64 = 1;
const VALUE_NAME: u64 = 2;
const VALUE_NAMESPACE: u64 = 3;

fn write_labels(w: &mut Writer<'_>, labels: &BTreeMap<String, String>, pod: &PodRef) {
    w.u64(labels.len() as u64);
    for (k, v) in labels {
        match KNOWN_KEYS.iter().position(|known| known == k) {
            Some(i) => w.u64(i as u64 + 1),
            None => {
                w.u64(0);
                w.compact(k);
            }
        }
        if *v == pod.uid {
            w.u64(VALUE_UID);
        } else if *v == pod.name {
            w.u64(VALUE_NAME);
        } else if *v == pod.namespace {
            w.u64(VALUE_NAMESPACE);
        } else {
            w.u64(0);
            w.compact(v);
        }
    }
}

fn read_labels(r: &mut Reader<'_>, pod: &PodRef) -> Option<BTreeMap<String, String>> {
    let n = r.u64()?;
    let mut labels = BTreeMap::new();
    if crate::packed::in_format_1_strings() {
        for _ in 0..n {
            let key = r.string()?;
            labels.insert(key, r.string()?);
        }
        return Some(labels);
    }
    for _ in 0..n {
        let key = match usize::try_from(r.u64()?).ok()? {
            0 => r.compact()?,
            i => (*KNOWN_KEYS.get(i - 1)?).to_owned(),
        };
        let value = match r.u64()? {
            0 => r.compact()?,
            VALUE_UID => pod.uid.clone(),
            VALUE_NAME => pod.name.clone(),
            VALUE_NAMESPACE => pod.namespace.clone(),
            _ => return None,
        };
        labels.insert(key, value);
    }
    Some(labels)
}

/// A sandbox's pod is written only when it differs from the status's own.
const OTHER_POD: u8 = 1;

/// A sandbox or container ID packed as the statuses hold theirs, to look for it in
/// many of them ([`PackedStatus::find_id`]) with no decoding.
pub(crate) struct IdKey(Vec<u8>);

impl IdKey {
    pub(crate) fn new(id: &str) -> Self {
        let mut b = Vec::new();
        Writer(&mut b).compact(id);
        IdKey(b)
    }
}

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
            w.compact(&sb.id);
        }
        for c in containers {
            w.compact(&c.id);
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
            write_labels(&mut w, labels, sb_pod);
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
            // Its sandbox as its index among the status's (from 1; 0: the ID follows).
            match sandboxes.iter().position(|sb| sb.id == *sandbox_id) {
                Some(i) => w.u64(i as u64 + 1),
                None => {
                    w.u64(0);
                    w.compact(sandbox_id);
                }
            }
            w.compact(name);
            w.u64(u64::from(*attempt));
            w.i64(*created_at);
            w.i64(*started_at);
            w.i64(*finished_at);
            w.i64(i64::from(*exit_code));
            w.compact(reason);
            w.compact(message);
            w.compact(image);
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
        if crate::packed::format_1() {
            let status = crate::packed::format_1_strings(|| packed.unpack())?;
            return Some(PackedStatus::pack(&status, &mut Vec::new()));
        }
        packed.unpack().map(|_| packed)
    }

    /// Bytes of heap the packed status takes.
    #[cfg(test)]
    pub(crate) fn heap_bytes(&self) -> usize {
        self.0.len()
    }

    /// Calls `each(id, container state)` for every sandbox (state None) and container
    /// ID, in order, until it returns true; returns whether one did. The IDs are given
    /// as packed (see [`IdKey`]).
    fn any_id(&self, mut each: impl FnMut(&[u8], Option<ContainerState>) -> bool) -> bool {
        let mut r = Reader(&self.0);
        let (Some(sandboxes), Some(containers)) = (r.u64(), r.u64()) else {
            return false;
        };
        for _ in 0..sandboxes {
            match r.compact_raw() {
                Some(id) if each(id, None) => return true,
                Some(_) => {}
                None => return false,
            }
        }
        for _ in 0..containers {
            let (Some(id), Some(state)) = (r.compact_raw(), r.u8().and_then(container_state))
            else {
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
    pub(crate) fn find_id(&self, id: &IdKey) -> Option<Option<ContainerState>> {
        let mut found = None;
        self.any_id(|x, state| {
            if x == id.0 {
                found = Some(state);
            }
            found.is_some()
        });
        found
    }

    /// The state of container `id` (None: not a container of this pod).
    pub(crate) fn container_state(&self, id: &IdKey) -> Option<ContainerState> {
        let mut found = None;
        self.any_id(|x, state| {
            if x == id.0 && state.is_some() {
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
            sb_ids.push(r.compact()?);
        }
        let mut c_ids = Vec::with_capacity(n_containers);
        for _ in 0..n_containers {
            c_ids.push((r.compact()?, container_state(r.u8()?)?));
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
            let labels = read_labels(&mut r, &sb_pod)?;
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
            let sandbox_id = if crate::packed::in_format_1_strings() {
                r.string()?
            } else {
                match usize::try_from(r.u64()?).ok()? {
                    0 => r.compact()?,
                    i => sandboxes.get(i - 1)?.id.clone(),
                }
            };
            containers.push(ContainerStatus {
                id,
                sandbox_id,
                name: r.compact()?,
                attempt: r.u32()?,
                state,
                created_at: r.i64()?,
                started_at: r.i64()?,
                finished_at: r.i64()?,
                exit_code: i32::try_from(r.i64()?).ok()?,
                reason: r.compact()?,
                message: r.compact()?,
                image: r.compact()?,
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
            id.with_str(|id| w.compact(id));
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
        let read = || {
            let mut r = Reader(b);
            let mut reported = IdMap::new();
            while !r.0.is_empty() {
                let id = r.compact()?;
                reported.insert(id, r.u8().and_then(kind_of)?);
            }
            Some(reported)
        };
        if crate::packed::format_1() {
            let reported = crate::packed::format_1_strings(read)?;
            return Some(PackedReported::pack(&reported, &mut Vec::new()));
        }
        read().map(|_| PackedReported(Box::from(b)))
    }

    /// The map as it was packed; what cannot be read (only a bug could write it) is
    /// left out.
    pub(crate) fn unpack(&self) -> IdMap<EventKind> {
        let mut r = Reader(&self.0);
        let mut map = IdMap::new();
        while !r.0.is_empty() {
            let (Some(id), Some(kind)) = (r.compact(), r.u8().and_then(kind_of)) else {
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
                    labels: [
                        ("app", "web"),
                        ("io.kubernetes.pod.uid", uid),
                        ("io.kubernetes.pod.name", &format!("name-{uid}")),
                        ("io.kubernetes.pod.namespace", "ns"),
                        ("example.com/not-known", "ns"),
                        ("empty", ""),
                    ]
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .into(),
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
                    // Values of the sandbox's own pod, and one of the status's.
                    labels: [
                        ("io.kubernetes.pod.name", "renamed"),
                        ("previous-name", &format!("name-{uid}")),
                    ]
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .into(),
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
                // A sandbox the status does not hold, and a digest for an image.
                ContainerStatus {
                    image: format!("sha256:{}", "0a".repeat(32)),
                    ..container(&"9f".repeat(32), "gone", ContainerState::Running)
                },
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
        assert_eq!(p.find_id(&IdKey::new(&"s".repeat(64))), Some(None));
        assert_eq!(p.find_id(&IdKey::new("old")), Some(None));
        assert_eq!(
            p.find_id(&IdKey::new("c4")),
            Some(Some(ContainerState::Unknown))
        );
        assert_eq!(
            p.find_id(&IdKey::new("c2")),
            Some(Some(ContainerState::Exited))
        );
        assert_eq!(p.find_id(&IdKey::new("c5")), None);
        assert_eq!(p.find_id(&IdKey::new("c")), None);
        // A hex ID, held as the bytes it spells, is found as it was written only.
        assert_eq!(
            p.find_id(&IdKey::new(&"9f".repeat(32))),
            Some(Some(ContainerState::Running))
        );
        assert_eq!(p.find_id(&IdKey::new(&"9F".repeat(32))), None);
        assert_eq!(p.find_id(&IdKey::new(&"9f".repeat(31))), None);
        assert_eq!(
            p.container_state(&IdKey::new("c1")),
            Some(ContainerState::Running)
        );
        assert_eq!(
            p.container_state(&IdKey::new("c2")),
            Some(ContainerState::Exited)
        );
        assert_eq!(
            p.container_state(&IdKey::new("c3")),
            Some(ContainerState::Created)
        );
        // A sandbox is not a container.
        assert_eq!(p.container_state(&IdKey::new("old")), None);
        assert_eq!(p.container_state(&IdKey::new("nope")), None);
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

    /// A pod of a real node: containerd's 64-hex IDs, kubelet's labels on the
    /// sandbox (the pod's own and its `io.kubernetes.pod.*`), an image digest.
    #[test]
    fn a_pod_of_a_real_node_comes_back_and_takes_under_400_bytes() {
        let uid = "5f0c1a9e-3b7d-4c2a-9e61-0d8f2b7c4a13";
        let pod = PodRef {
            uid: uid.into(),
            name: "service-17-7f9c6d5b8d-x2k9q".into(),
            namespace: "default".into(),
        };
        let sb_id = "3c".repeat(32);
        let st = PodStatus {
            pod: pod.clone(),
            sandboxes: vec![Sandbox {
                id: sb_id.clone(),
                pod: pod.clone(),
                attempt: 0,
                state: SandboxState::Ready,
                created_at: 1_764_000_000_123_456_789,
                labels: [
                    ("app", "service-17"),
                    ("pod-template-hash", "7f9c6d5b8d"),
                    ("io.kubernetes.pod.uid", uid),
                    ("io.kubernetes.pod.name", &pod.name),
                    ("io.kubernetes.pod.namespace", "default"),
                ]
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .into(),
            }],
            containers: ["a1", "b2"]
                .map(|c| ContainerStatus {
                    name: format!("app-{c}"),
                    image: format!("sha256:{}", "e7".repeat(32)),
                    ..container(&c.repeat(32), &sb_id, ContainerState::Running)
                })
                .into(),
        };
        let mut buf = Vec::new();
        let p = PackedStatus::pack(&st, &mut buf);
        assert_eq!(p.unpack(), Some(st));
        assert_eq!(p.find_id(&IdKey::new(&sb_id)), Some(None));
        assert_eq!(
            p.container_state(&IdKey::new(&"b2".repeat(32))),
            Some(ContainerState::Running)
        );
        // IDs 3 × 34, the pod 17 + 28 + 8, the sandbox 1 + 1 + 1 + 9 + 1 + 5 × 2 +
        // 11 + 11, each container 1 + 1 + 7 + 1 + 3 × 9 + 1 + 1 + 1 + 41.
        let n = p.heap_bytes();
        assert!(n < 400, "{n} bytes");
    }

    #[test]
    fn truncated_bytes_unpack_to_none_and_find_nothing_never_a_panic() {
        let mut buf = Vec::new();
        let bytes = PackedStatus::pack(&status(), &mut buf).0.into_vec();
        for len in 0..bytes.len() {
            let p = PackedStatus(bytes[..len].into());
            assert_eq!(p.unpack(), None, "{len}");
            // Whatever is complete is still found; nothing past the end is.
            let _ = p.find_id(&IdKey::new("c4"));
            assert_eq!(p.container_state(&IdKey::new("nope")), None);
        }
    }
}
