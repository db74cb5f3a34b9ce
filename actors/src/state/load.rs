//! Reading a state file back: what plegd goes on from, or why it starts fresh. Pure:
//! bytes and the current boot in, a decision out (`dir` does the files).

use std::collections::{HashMap, HashSet, VecDeque};

use super::codec::{self, Commit, Header};
use super::frame::{self, End};
use crate::cache::{ApplyRelist, CacheOwner, PodCache};
use crate::event::LifecycleEvent;
use crate::pleg::{CacheUpdate, PodRecord};

/// What a state file held, rebuilt: plegd goes on as the instance that wrote it.
pub struct Loaded {
    pub(crate) instance_id: String,
    /// The last revision stored: the next event's is the one after.
    pub(crate) revision: u64,
    pub(crate) records: HashMap<String, PodRecord>,
    /// Pods whose last status read failed (their cache entry holds the error).
    pub(crate) reinspect: HashSet<String>,
    pub(crate) cache: (CacheOwner, PodCache),
    /// The last events, oldest first, at most the history's size.
    pub(crate) history: VecDeque<LifecycleEvent>,
    /// The file ended with a clean stop.
    pub(crate) clean: bool,
}

impl Loaded {
    /// The instance that wrote the state (plegd goes on as it).
    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// The last revision stored.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The stored history, oldest first.
    pub fn history(&self) -> impl Iterator<Item = &LifecycleEvent> {
        self.history.iter()
    }

    /// Pods with a record.
    pub fn pods(&self) -> usize {
        self.records.len()
    }

    /// True if the state ended with a clean stop.
    pub fn clean(&self) -> bool {
        self.clean
    }
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded")
            .field("instance_id", &self.instance_id)
            .field("revision", &self.revision)
            .field("pods", &self.records.len())
            .field("history", &self.history.len())
            .field("clean", &self.clean)
            .finish()
    }
}

/// Reads a state file's bytes. `boot_id`: this boot's; `history`: events kept;
/// `tombstone_ttl`: the cache's. Err: why the state cannot be gone on from (plegd
/// starts fresh, with a new identity).
pub(crate) fn load(
    bytes: &[u8],
    boot_id: &str,
    history: usize,
    tombstone_ttl: std::time::Duration,
) -> Result<Loaded, String> {
    let (records, end) = frame::read(bytes);
    let mut records = records.into_iter();
    let header = match records.next() {
        Some((codec::HEADER, body)) => codec::read_header(body)?,
        _ if bytes.is_empty() => return Err("the state file is empty".into()),
        _ => return Err("the state file has no header: not a plegd state file".into()),
    };
    if let End::Corrupt(at) = end {
        return Err(format!("the state file is damaged at byte {at}"));
    }
    let mut state = Rebuild::new(&header, history, tombstone_ttl);
    let damaged = |what: &str| format!("a damaged {what} record in the state file");
    // The snapshot: complete, or the file is not one plegd wrote whole.
    let mut snapshot_ended = false;
    for (kind, body) in records.by_ref() {
        match kind {
            codec::BASE => {
                let base = codec::read_base(body).ok_or_else(|| damaged("base"))?;
                state.revision = base.revision;
                state.cache.0.restore_base(base.revision, base.global);
            }
            codec::RECORD => {
                let (uid, rec) = codec::read_pod_record(body).ok_or_else(|| damaged("pod"))?;
                state.records.insert(uid, rec);
            }
            codec::CACHED => {
                let (uid, rest) = split_uid(body).ok_or_else(|| damaged("cache"))?;
                if !state.cache.0.restore_pod(uid, rest) {
                    return Err(damaged("cache"));
                }
            }
            codec::TOMBSTONE => {
                let (uid, rest) = split_uid(body).ok_or_else(|| damaged("tombstone"))?;
                if !state.cache.0.restore_tombstone(uid, rest) {
                    return Err(damaged("tombstone"));
                }
            }
            codec::EVENT => {
                let ev = codec::read_event(body).ok_or_else(|| damaged("event"))?;
                state.remember(ev);
            }
            codec::SNAPSHOT_END => {
                snapshot_ended = true;
                break;
            }
            other => {
                return Err(format!(
                    "an unexpected record (kind {other}) in the snapshot"
                ))
            }
        }
    }
    if !snapshot_ended {
        return Err("the state file's snapshot is incomplete".into());
    }
    let mut clean = false;
    for (kind, body) in records {
        if clean {
            return Err("records after a clean stop".into());
        }
        match kind {
            codec::COMMIT => {
                let c = codec::read_commit(body).ok_or_else(|| damaged("commit"))?;
                state.replay(c);
            }
            codec::STOP => {
                let revision = codec::read_stop(body).ok_or_else(|| damaged("stop"))?;
                if revision != state.revision {
                    return Err(format!(
                        "the clean stop says revision {revision}, the commits {}",
                        state.revision
                    ));
                }
                clean = true;
            }
            other => {
                return Err(format!(
                    "an unexpected record (kind {other}) after the snapshot"
                ))
            }
        }
    }
    if !clean && header.boot_id != boot_id {
        return Err(
            "plegd did not stop cleanly before the machine restarted: what it wrote last may \
             have been lost with the page cache"
                .into(),
        );
    }
    Ok(state.finish(header.instance_id, clean))
}

/// A uid, then the rest of the record's bytes.
fn split_uid(body: &[u8]) -> Option<(String, &[u8])> {
    let mut r = crate::packed::Reader(body);
    let uid = r.string()?;
    Some((uid, r.0))
}

struct Rebuild {
    revision: u64,
    records: HashMap<String, PodRecord>,
    cache: (CacheOwner, PodCache),
    history: VecDeque<LifecycleEvent>,
    history_size: usize,
}

impl Rebuild {
    fn new(_header: &Header, history_size: usize, tombstone_ttl: std::time::Duration) -> Self {
        Rebuild {
            revision: 0,
            records: HashMap::new(),
            cache: CacheOwner::new(tombstone_ttl),
            history: VecDeque::new(),
            history_size,
        }
    }

    fn remember(&mut self, ev: LifecycleEvent) {
        if self.history_size == 0 {
            return;
        }
        if self.history.len() >= self.history_size {
            self.history.pop_front();
        }
        self.history.push_back(ev);
    }

    /// One stored relist, applied as it was the first time.
    fn replay(&mut self, c: Commit) {
        for (uid, rec) in c.records {
            match rec {
                Some(rec) => self.records.insert(uid, rec),
                None => self.records.remove(&uid),
            };
        }
        self.cache.0.apply_relist(ApplyRelist {
            updates: c.updates,
            global_timestamp: c.global,
            held: c.held,
            revision: c.revision,
            events: codec::reported_of(&c.events),
            more: c.more,
        });
        for ev in c.events {
            self.remember(ev);
        }
        self.revision = self.revision.max(c.revision);
    }

    fn finish(mut self, instance_id: String, clean: bool) -> Loaded {
        self.cache.0.settle_restored_tombstones();
        // A chunk of a global relist whose last chunk was not stored: what it applied
        // stands (as when a relist fails after some chunks).
        self.cache.0.apply_relist(ApplyRelist {
            updates: Vec::<CacheUpdate>::new(),
            global_timestamp: None,
            held: Vec::new(),
            revision: self.revision,
            events: Vec::new(),
            more: false,
        });
        let reinspect = self.cache.1.pods_with_errors();
        Loaded {
            instance_id,
            revision: self.revision,
            records: self.records,
            reinspect,
            cache: self.cache,
            history: self.history,
            clean,
        }
    }
}
