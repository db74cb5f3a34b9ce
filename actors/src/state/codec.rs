//! What the state file's records hold, as bytes (`packed`'s encoding: LEB128
//! integers, length-prefixed strings). Every decoder returns None on bytes it cannot
//! read: the caller treats the file as damaged.

use std::time::SystemTime;

use plegd_runtime::{ContainerStatus, PodRef};

use crate::event::{EventKind, LifecycleEvent};
use crate::packed::{source_code, source_of, PackedEvent, Reader, Writer};
use crate::packed_status::PackedStatus;
use crate::pleg::{CacheUpdate, PlegState, PodRecord, PodStatus};

/// The kinds of record. A file is a header, a snapshot (base, then pods, tombstones
/// and history, then its end), then the commits appended since, and a stop record
/// after a clean stop.
pub(crate) const HEADER: u8 = 1;
pub(crate) const BASE: u8 = 2;
pub(crate) const RECORD: u8 = 3;
pub(crate) const CACHED: u8 = 4;
pub(crate) const TOMBSTONE: u8 = 5;
pub(crate) const EVENT: u8 = 6;
pub(crate) const SNAPSHOT_END: u8 = 7;
pub(crate) const COMMIT: u8 = 8;
pub(crate) const STOP: u8 = 9;

/// The format this build writes; it reads this one and every older one. Format 1
/// packed every string of a status, a pod's reported states and an event as its
/// length and bytes (`packed::reading_format`); format 2 packs them compactly.
pub(crate) const FORMAT: u64 = 2;
const MAGIC: &str = "plegd-state";

/// Who wrote the file: the format, the instance whose revisions it holds, and the
/// boot it was written in (a file not stopped cleanly in an earlier boot may have
/// lost what the page cache held).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) format: u64,
    pub(crate) instance_id: String,
    pub(crate) boot_id: String,
}

pub(crate) fn header(h: &Header) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = Writer(&mut out);
    w.str(MAGIC);
    w.u64(h.format);
    w.str(&h.instance_id);
    w.str(&h.boot_id);
    out
}

/// The header, or why the file is not one plegd can read.
pub(crate) fn read_header(b: &[u8]) -> Result<Header, String> {
    let mut r = Reader(b);
    if r.str() != Some(MAGIC) {
        return Err("not a plegd state file".into());
    }
    let format = r.u64().ok_or("a damaged header")?;
    if format > FORMAT {
        return Err(format!(
            "written in format {format} by a newer plegd (this one reads up to {FORMAT})"
        ));
    }
    let (Some(instance_id), Some(boot_id)) = (r.string(), r.string()) else {
        return Err("a damaged header".into());
    };
    Ok(Header {
        format,
        instance_id,
        boot_id,
    })
}

/// The snapshot's first record: the revision it reflects and the last global
/// relist's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Base {
    pub(crate) revision: u64,
    pub(crate) global: Option<SystemTime>,
}

pub(crate) fn base(b: &Base) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = Writer(&mut out);
    w.u64(b.revision);
    opt_time(&mut w, b.global);
    out
}

pub(crate) fn read_base(b: &[u8]) -> Option<Base> {
    let mut r = Reader(b);
    let base = Base {
        revision: r.u64()?,
        global: read_opt_time(&mut r)?,
    };
    r.0.is_empty().then_some(base)
}

fn opt_time(w: &mut Writer<'_>, t: Option<SystemTime>) {
    match t {
        Some(t) => {
            w.u8(1);
            w.time(t);
        }
        None => w.u8(0),
    }
}

fn read_opt_time(r: &mut Reader<'_>) -> Option<Option<SystemTime>> {
    match r.u8()? {
        0 => Some(None),
        1 => Some(Some(r.time()?)),
        _ => None,
    }
}

fn state_code(s: PlegState) -> u8 {
    match s {
        PlegState::Running => 0,
        PlegState::Exited => 1,
        PlegState::Unknown => 2,
        PlegState::NonExistent => 3,
    }
}

fn state_of(code: u8) -> Option<PlegState> {
    Some(match code {
        0 => PlegState::Running,
        1 => PlegState::Exited,
        2 => PlegState::Unknown,
        3 => PlegState::NonExistent,
        _ => return None,
    })
}

fn pod_ref(w: &mut Writer<'_>, pod: &PodRef) {
    w.str(&pod.uid);
    w.str(&pod.name);
    w.str(&pod.namespace);
}

fn read_pod_ref(r: &mut Reader<'_>) -> Option<PodRef> {
    Some(PodRef {
        uid: r.string()?,
        name: r.string()?,
        namespace: r.string()?,
    })
}

/// A pod's record (what the next relist is diffed against).
pub(crate) fn record(w: &mut Writer<'_>, rec: &PodRecord) {
    pod_ref(w, &rec.pod.to_pod_ref());
    w.u64(rec.sandboxes.len() as u64);
    for (id, state) in &rec.sandboxes {
        id.with_str(|id| w.str(id));
        w.u8(state_code(*state));
    }
    w.u64(rec.containers.len() as u64);
    for (id, (sandbox, state)) in &rec.containers {
        id.with_str(|id| w.str(id));
        sandbox.with_str(|sandbox| w.str(sandbox));
        w.u8(state_code(*state));
    }
}

pub(crate) fn read_record(r: &mut Reader<'_>) -> Option<PodRecord> {
    let pod = (&read_pod_ref(r)?).into();
    let n = r.u64()?;
    let mut sandboxes = crate::id_map::IdMap::new();
    for _ in 0..n {
        sandboxes.insert(r.string()?, state_of(r.u8()?)?);
    }
    let n = r.u64()?;
    let mut containers = crate::id_map::IdMap::new();
    for _ in 0..n {
        let id = r.string()?;
        containers.insert(id, (r.string()?.into(), state_of(r.u8()?)?));
    }
    Some(PodRecord {
        pod,
        sandboxes,
        containers,
    })
}

/// A snapshot's record of one pod.
pub(crate) fn pod_record(uid: &str, rec: &PodRecord) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = Writer(&mut out);
    w.str(uid);
    record(&mut w, rec);
    out
}

pub(crate) fn read_pod_record(b: &[u8]) -> Option<(String, PodRecord)> {
    let mut r = Reader(b);
    let uid = r.string()?;
    let rec = read_record(&mut r)?;
    r.0.is_empty().then_some((uid, rec))
}

pub(crate) fn read_event(b: &[u8]) -> Option<LifecycleEvent> {
    PackedEvent::from_bytes(b)?.unpack()
}

/// One relist's changes, as applied: the latest revision, what the cache applies (its updates, the global relist's timestamp and
/// held pods), the events, and each changed pod's record (None: gone).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Commit {
    pub(crate) revision: u64,
    pub(crate) global: Option<SystemTime>,
    pub(crate) more: bool,
    pub(crate) held: Vec<String>,
    pub(crate) updates: Vec<CacheUpdate>,
    pub(crate) events: Vec<LifecycleEvent>,
    pub(crate) records: Vec<(String, Option<PodRecord>)>,
}

const SET_OK: u8 = 0;
const SET_ERR: u8 = 1;
const DELETE: u8 = 2;
const CONTAINER: u8 = 3;

/// A commit as written: borrowed from the relist's output.
pub(crate) struct CommitRef<'a> {
    pub(crate) revision: u64,
    pub(crate) global: Option<SystemTime>,
    pub(crate) more: bool,
    pub(crate) held: &'a [String],
    pub(crate) updates: &'a [CacheUpdate],
    pub(crate) events: &'a [LifecycleEvent],
    pub(crate) records: &'a [(String, Option<PodRecord>)],
}

impl Commit {
    #[cfg(test)]
    pub(crate) fn as_ref(&self) -> CommitRef<'_> {
        CommitRef {
            revision: self.revision,
            global: self.global,
            more: self.more,
            held: &self.held,
            updates: &self.updates,
            events: &self.events,
            records: &self.records,
        }
    }
}

/// A commit's bytes; `buf` is scratch kept by the caller.
pub(crate) fn commit(c: &CommitRef<'_>, buf: &mut Vec<u8>) -> Vec<u8> {
    let mut out = Vec::new();
    let mut w = Writer(&mut out);
    w.u64(c.revision);
    opt_time(&mut w, c.global);
    w.u8(u8::from(c.more));
    w.u64(c.held.len() as u64);
    for uid in c.held {
        w.str(uid);
    }
    w.u64(c.updates.len() as u64);
    for u in c.updates {
        update(&mut w, u, buf);
    }
    w.u64(c.events.len() as u64);
    for ev in c.events {
        let packed = PackedEvent::pack(ev, buf);
        w.bytes(packed.as_bytes());
    }
    w.u64(c.records.len() as u64);
    for (uid, rec) in c.records {
        w.str(uid);
        match rec {
            Some(rec) => {
                w.u8(1);
                record(&mut w, rec);
            }
            None => w.u8(0),
        }
    }
    out
}

pub(crate) fn read_commit(b: &[u8]) -> Option<Commit> {
    let mut r = Reader(b);
    let revision = r.u64()?;
    let global = read_opt_time(&mut r)?;
    let more = match r.u8()? {
        0 => false,
        1 => true,
        _ => return None,
    };
    let held = (0..r.u64()?)
        .map(|_| r.string())
        .collect::<Option<Vec<_>>>()?;
    let mut updates = Vec::new();
    for _ in 0..r.u64()? {
        updates.push(read_update(&mut r)?);
    }
    let mut events = Vec::new();
    for _ in 0..r.u64()? {
        events.push(read_event(r.bytes()?)?);
    }
    let mut records = Vec::new();
    for _ in 0..r.u64()? {
        let uid = r.string()?;
        let rec = match r.u8()? {
            0 => None,
            1 => Some(read_record(&mut r)?),
            _ => return None,
        };
        records.push((uid, rec));
    }
    r.0.is_empty().then_some(Commit {
        revision,
        global,
        more,
        held,
        updates,
        events,
        records,
    })
}

fn update(w: &mut Writer<'_>, u: &CacheUpdate, buf: &mut Vec<u8>) {
    match u {
        CacheUpdate::Set {
            uid,
            status,
            read_at,
            source,
        } => {
            match status {
                Ok(_) => w.u8(SET_OK),
                Err(_) => w.u8(SET_ERR),
            }
            w.str(uid);
            w.time(*read_at);
            w.u8(source_code(*source));
            match status {
                Ok(s) => w.bytes(PackedStatus::pack(s, buf).as_bytes()),
                Err(e) => w.str(e),
            }
        }
        CacheUpdate::Delete {
            uid,
            read_at,
            source,
        } => {
            w.u8(DELETE);
            w.str(uid);
            w.time(*read_at);
            w.u8(source_code(*source));
        }
        CacheUpdate::Container {
            uid,
            status,
            read_at,
        } => {
            w.u8(CONTAINER);
            w.str(uid);
            w.time(*read_at);
            // One container's status, packed as a pod status holding only it.
            let alone = PodStatus {
                pod: PodRef {
                    uid: uid.clone(),
                    name: String::new(),
                    namespace: String::new(),
                },
                sandboxes: Vec::new(),
                containers: vec![status.clone()],
            };
            w.bytes(PackedStatus::pack(&alone, buf).as_bytes());
        }
    }
}

fn read_update(r: &mut Reader<'_>) -> Option<CacheUpdate> {
    let tag = r.u8()?;
    let uid = r.string()?;
    let read_at = r.time()?;
    Some(match tag {
        SET_OK | SET_ERR => {
            let source = source_of(r.u8()?)?;
            let status = if tag == SET_OK {
                Ok(PackedStatus::from_bytes(r.bytes()?)?.unpack()?)
            } else {
                Err(r.string()?)
            };
            CacheUpdate::Set {
                uid,
                status,
                read_at,
                source,
            }
        }
        DELETE => CacheUpdate::Delete {
            uid,
            read_at,
            source: source_of(r.u8()?)?,
        },
        CONTAINER => {
            let alone = PackedStatus::from_bytes(r.bytes()?)?.unpack()?;
            let status: ContainerStatus = alone.containers.into_iter().next()?;
            CacheUpdate::Container {
                uid,
                status,
                read_at,
            }
        }
        _ => return None,
    })
}

/// The clean stop's record: the revision the file ends at.
pub(crate) fn stop(revision: u64) -> Vec<u8> {
    let mut out = Vec::new();
    Writer(&mut out).u64(revision);
    out
}

pub(crate) fn read_stop(b: &[u8]) -> Option<u64> {
    let mut r = Reader(b);
    let revision = r.u64()?;
    r.0.is_empty().then_some(revision)
}

/// (uid, kind) pairs a commit's events fold into the cache's reported states.
pub(crate) fn reported_of(events: &[LifecycleEvent]) -> Vec<(String, String, EventKind)> {
    events
        .iter()
        .map(|e| (e.pod.uid.clone(), e.container_id.clone(), e.kind))
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use plegd_runtime::{ContainerState, Sandbox, SandboxState};

    use super::*;
    use crate::event::{Exit, RelistSource};

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000 + s, 17)
    }

    fn pod() -> PodRef {
        PodRef {
            uid: "u1".into(),
            name: "web".into(),
            namespace: "prod".into(),
        }
    }

    fn status() -> ContainerStatus {
        ContainerStatus {
            id: "c".repeat(64),
            sandbox_id: "s".repeat(64),
            name: "app".into(),
            attempt: 2,
            state: ContainerState::Exited,
            created_at: 1,
            started_at: 2,
            finished_at: 3,
            exit_code: 137,
            reason: "OOMKilled".into(),
            message: "m".into(),
            image: "nginx".into(),
        }
    }

    fn a_commit() -> Commit {
        let rec = PodRecord {
            pod: (&pod()).into(),
            sandboxes: [("s".repeat(64), PlegState::Running)].into(),
            containers: [("c".repeat(64), ("s".repeat(64).into(), PlegState::Exited))].into(),
        };
        Commit {
            revision: 42,
            global: Some(at(3)),
            more: true,
            held: vec!["h".into()],
            updates: vec![
                CacheUpdate::Set {
                    uid: "u1".into(),
                    status: Ok(PodStatus {
                        pod: pod(),
                        sandboxes: vec![Sandbox {
                            id: "s".repeat(64),
                            pod: pod(),
                            attempt: 0,
                            state: SandboxState::Ready,
                            created_at: 5,
                            labels: [("app".to_string(), "web".to_string())].into(),
                        }],
                        containers: vec![status()],
                    }),
                    read_at: at(1),
                    source: RelistSource::Nri,
                },
                CacheUpdate::Set {
                    uid: "u2".into(),
                    status: Err("deadline exceeded".into()),
                    read_at: at(1),
                    source: RelistSource::Global,
                },
                CacheUpdate::Delete {
                    uid: "u3".into(),
                    read_at: at(2),
                    source: RelistSource::Global,
                },
                CacheUpdate::Container {
                    uid: "u1".into(),
                    status: status(),
                    read_at: at(2),
                },
            ],
            events: vec![LifecycleEvent {
                revision: 42,
                time: at(1),
                pod: pod(),
                kind: EventKind::ContainerDied,
                container_id: "c".repeat(64),
                relist_source: RelistSource::Nri,
                container_name: "app".into(),
                sandbox: false,
                attempt: Some(2),
                image: Some("nginx".into()),
                exit: Some(Exit {
                    code: 137,
                    reason: Some("OOMKilled".into()),
                    message: None,
                    started_at: Some(at(0)),
                    finished_at: Some(at(1)),
                }),
            }],
            records: vec![("u1".into(), Some(rec)), ("u3".into(), None)],
        }
    }

    #[test]
    fn a_commit_reads_back_as_written() {
        let c = a_commit();
        let bytes = commit(&c.as_ref(), &mut Vec::new());
        assert_eq!(read_commit(&bytes), Some(c));
    }

    #[test]
    fn a_cut_or_extended_commit_does_not_read() {
        let bytes = commit(&a_commit().as_ref(), &mut Vec::new());
        for cut in 0..bytes.len() {
            assert_eq!(read_commit(&bytes[..cut]), None, "cut at {cut}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert_eq!(read_commit(&longer), None);
    }

    #[test]
    fn a_header_from_a_newer_format_or_another_program_is_refused_with_why() {
        let h = Header {
            format: FORMAT,
            instance_id: "i".into(),
            boot_id: "b".into(),
        };
        assert_eq!(read_header(&header(&h)), Ok(h.clone()));
        let newer = header(&Header {
            format: FORMAT + 1,
            ..h
        });
        assert!(read_header(&newer).unwrap_err().contains("newer plegd"));
        assert!(read_header(b"\x05hello")
            .unwrap_err()
            .contains("not a plegd state file"));
    }
}
