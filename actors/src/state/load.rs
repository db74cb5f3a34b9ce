//! Reading a state file back: what plegd goes on from, or why it starts fresh. Pure:
//! bytes and the current boot in, a decision out (`dir` does the files).

use std::collections::{HashSet, VecDeque};

use super::codec::{self, Commit, Header};
use super::frame::{self, End};
use crate::cache::{ApplyRelist, CacheOwner, PodCache};
use crate::event::LifecycleEvent;
use crate::packed::PackedEvent;
use crate::pleg::CacheUpdate;

/// What a state file held, rebuilt: plegd goes on as the instance that wrote it.
pub struct Loaded {
    pub(crate) instance_id: String,
    /// The last revision stored: the next event's is the one after.
    pub(crate) revision: u64,
    pub(crate) records: crate::pleg::Records,
    /// Pods whose last status read failed (their cache entry holds the error).
    pub(crate) reinspect: HashSet<String>,
    pub(crate) cache: (CacheOwner, PodCache),
    /// The last events, oldest first, at most the history's size (packed: a
    /// history of 65,536 events as structs would take ≈ 44 MiB at start).
    pub(crate) history: VecDeque<PackedEvent>,
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
    pub fn history(&self) -> impl Iterator<Item = LifecycleEvent> + '_ {
        self.history.iter().filter_map(PackedEvent::unpack)
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
    // An older format's packed statuses, reported states and events are read as it
    // wrote them and packed anew.
    crate::packed::reading_format(header.format, || {
        rebuild(header, records, boot_id, history, tombstone_ttl)
    })
}

fn rebuild<'a>(
    header: Header,
    mut records: impl Iterator<Item = (u8, &'a [u8])>,
    boot_id: &str,
    history: usize,
    tombstone_ttl: std::time::Duration,
) -> Result<Loaded, String> {
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
    records: crate::pleg::Records,
    cache: (CacheOwner, PodCache),
    history: VecDeque<PackedEvent>,
    history_size: usize,
    buf: Vec<u8>,
}

impl Rebuild {
    fn new(_header: &Header, history_size: usize, tombstone_ttl: std::time::Duration) -> Self {
        Rebuild {
            revision: 0,
            records: Default::default(),
            cache: CacheOwner::new(tombstone_ttl),
            history: VecDeque::new(),
            history_size,
            buf: Vec::new(),
        }
    }

    fn remember(&mut self, ev: LifecycleEvent) {
        if self.history_size == 0 {
            return;
        }
        if self.history.len() >= self.history_size {
            self.history.pop_front();
        }
        self.history
            .push_back(PackedEvent::pack(&ev, &mut self.buf));
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use plegd_runtime::PodRef;

    use super::*;
    use crate::cache::{CacheImage, PodLookup};
    use crate::event::RelistSource;
    use crate::pleg::PodStatus;
    use crate::state::codec::{CommitRef, FORMAT};
    use crate::state::snapshot::Snapshot;
    use crate::testing::started_event as event;

    const TTL: Duration = Duration::from_secs(300);

    fn header(boot: &str) -> Header {
        Header {
            format: FORMAT,
            instance_id: "abc".into(),
            boot_id: boot.into(),
        }
    }

    fn empty_snapshot(boot: &str) -> Vec<u8> {
        Snapshot {
            header: &header(boot),
            records: &Default::default(),
            cache: &CacheImage {
                revision: 0,
                global: None,
                pods: Vec::new(),
                tombstones: Vec::new(),
            },
            history: Vec::new(),
        }
        .bytes()
    }

    fn pod(uid: &str) -> PodRef {
        PodRef {
            uid: uid.into(),
            name: "n".into(),
            namespace: "ns".into(),
        }
    }

    /// A commit of `updates` with one event per revision up to `revision`.
    fn commit(out: &mut Vec<u8>, from: u64, revision: u64, updates: &[CacheUpdate]) {
        let events: Vec<_> = (from..=revision)
            .map(|r| event(r, &format!("u{r}")))
            .collect();
        let body = codec::commit(
            &CommitRef {
                revision,
                global: None,
                more: false,
                held: &[],
                updates,
                events: &events,
                records: &[],
            },
            &mut Vec::new(),
        );
        frame::put(out, codec::COMMIT, &body);
    }

    fn stop(out: &mut Vec<u8>, revision: u64) {
        frame::put(out, codec::STOP, &codec::stop(revision));
    }

    fn three_commits(boot: &str) -> Vec<u8> {
        let mut f = empty_snapshot(boot);
        commit(&mut f, 1, 2, &[]);
        commit(&mut f, 3, 3, &[]);
        commit(&mut f, 4, 5, &[]);
        f
    }

    #[test]
    fn after_a_crash_in_this_boot_plegd_goes_on_from_every_commit() {
        let loaded = load(&three_commits("b1"), "b1", 100, TTL).unwrap();
        assert!(!loaded.clean);
        assert_eq!(loaded.revision, 5);
        let history: Vec<u64> = loaded.history.iter().map(|e| e.revision()).collect();
        assert_eq!(history, [1, 2, 3, 4, 5]);
        assert_eq!(loaded.instance_id, "abc");
    }

    #[test]
    fn a_commit_cut_short_is_dropped_whole() {
        let full = three_commits("b1");
        let mut two = empty_snapshot("b1");
        commit(&mut two, 1, 2, &[]);
        commit(&mut two, 3, 3, &[]);
        for cut in two.len() + 1..full.len() {
            let loaded = load(&full[..cut], "b1", 100, TTL).unwrap();
            assert_eq!(loaded.revision, 3, "cut at {cut}");
        }
    }

    #[test]
    fn an_unclean_stop_in_an_earlier_boot_starts_fresh_and_a_clean_one_goes_on() {
        let why = load(&three_commits("b1"), "b2", 100, TTL).unwrap_err();
        assert!(
            why.contains("did not stop cleanly before the machine restarted"),
            "{why}"
        );
        let mut clean = three_commits("b1");
        stop(&mut clean, 5);
        let loaded = load(&clean, "b2", 100, TTL).unwrap();
        assert!(loaded.clean);
        assert_eq!(loaded.revision, 5);
    }

    #[test]
    fn a_stop_that_disagrees_with_the_commits_or_records_after_it_are_damage() {
        let mut wrong = three_commits("b1");
        stop(&mut wrong, 4);
        assert!(load(&wrong, "b1", 100, TTL)
            .unwrap_err()
            .contains("clean stop says"));
        let mut after = three_commits("b1");
        stop(&mut after, 5);
        commit(&mut after, 6, 6, &[]);
        assert!(load(&after, "b1", 100, TTL)
            .unwrap_err()
            .contains("after a clean stop"));
    }

    #[test]
    fn a_damaged_record_or_no_header_is_refused_with_where() {
        let mut bytes = three_commits("b1");
        let last = bytes.len() - 3;
        bytes[last] ^= 1;
        assert!(load(&bytes, "b1", 100, TTL)
            .unwrap_err()
            .contains("damaged at byte"));
        assert!(load(b"", "b1", 100, TTL).unwrap_err().contains("empty"));
        let mut no_header = Vec::new();
        commit(&mut no_header, 1, 1, &[]);
        assert!(load(&no_header, "b1", 100, TTL)
            .unwrap_err()
            .contains("no header"));
    }

    #[test]
    fn the_history_keeps_its_size() {
        let loaded = load(&three_commits("b1"), "b1", 2, TTL).unwrap();
        let history: Vec<u64> = loaded.history.iter().map(|e| e.revision()).collect();
        assert_eq!(history, [4, 5]);
    }

    #[actix_rt::test]
    async fn a_tombstone_lives_out_its_ttl_from_when_the_pod_went_whatever_the_downtime() {
        let now = SystemTime::now();
        let set = |uid: &str| CacheUpdate::Set {
            uid: uid.into(),
            status: Ok(PodStatus {
                pod: pod(uid),
                sandboxes: Vec::new(),
                containers: Vec::new(),
            }),
            read_at: now - TTL * 2,
            source: RelistSource::Global,
        };
        let delete = |uid: &str, ago: Duration| CacheUpdate::Delete {
            uid: uid.into(),
            read_at: now - ago,
            source: RelistSource::Global,
        };
        let mut f = empty_snapshot("b1");
        commit(&mut f, 1, 2, &[set("old"), set("recent")]);
        commit(
            &mut f,
            3,
            3,
            &[
                delete("old", TTL + Duration::from_secs(1)),
                delete("recent", Duration::from_secs(10)),
            ],
        );
        let loaded = load(&f, "b1", 100, TTL).unwrap();
        let cache = &loaded.cache.1;
        assert!(matches!(cache.lookup("old"), PodLookup::Unknown));
        match cache.lookup("recent") {
            PodLookup::Removed { removed_at, .. } => {
                assert_eq!(removed_at, now - Duration::from_secs(10));
            }
            other => panic!("recent: {other:?}"),
        }
    }

    /// State files written by the plegd of format 1, and the events it printed: this
    /// build reads them, packs them anew, and serves them as that plegd would have.
    /// `demo`: `plegd demo --seed 7`, stopped, then `--seed 8` on the same dir (exits
    /// with codes and reasons); `kubelet`: `plegd run` on plegd-sim's realistic node of
    /// 4, then 2, then 3 pods (64-hex IDs, UUIDs, kubelet's labels). Each file holds a
    /// snapshot (the cache, tombstones, history of the runs before) and commits.
    #[test]
    fn a_state_of_format_1_is_read_and_packed_anew() {
        for (bytes, printed, instance) in [
            (
                &include_bytes!("testdata/format1-demo.state")[..],
                include_str!("testdata/format1-demo.events.tsv"),
                "549d3f5c0b7cc6c91d60e9a2a9870ca2",
            ),
            (
                &include_bytes!("testdata/format1-kubelet.state")[..],
                include_str!("testdata/format1-kubelet.events.tsv"),
                "be9bad2c7bbff8eb885619da4ae310a6",
            ),
        ] {
            format_1_state(bytes, printed, instance);
        }
    }

    fn format_1_state(bytes: &[u8], printed: &str, instance: &str) {
        use std::collections::HashSet;
        let (frames, _) = frame::read(bytes);
        assert_eq!(codec::read_header(frames[0].1).map(|h| h.format), Ok(1));
        let ttl = Duration::from_secs(10 * 365 * 86_400);
        let loaded = load(bytes, "another boot", 65_536, ttl).unwrap();
        assert!(loaded.clean());
        assert_eq!(loaded.instance_id(), instance);
        // The history: every event that plegd printed, as it printed it.
        let row = |e: &LifecycleEvent| {
            let exit = e.exit.as_ref();
            [
                e.revision.to_string(),
                e.pod.uid.clone(),
                e.kind.to_string(),
                e.container_id.clone(),
                e.container_name.clone(),
                e.image.clone().unwrap_or_default(),
                exit.map(|x| x.code.to_string()).unwrap_or_default(),
                exit.and_then(|x| x.reason.clone()).unwrap_or_default(),
            ]
            .join("\t")
        };
        let history: Vec<String> = loaded.history().map(|e| row(&e)).collect();
        let printed: Vec<&str> = printed.lines().collect();
        assert_eq!(history, printed);
        // The cache: every pod's status unpacks, and its sandboxes and containers are
        // found by ID (a lookup compares packed bytes: this build's packing).
        let cache = &loaded.cache.1;
        assert_eq!(cache.len(), loaded.records.len());
        for uid in loaded.records.keys() {
            let pod = cache.get(uid).expect("a cached pod");
            let status = pod.status.expect("a status");
            let ids = status.sandboxes.iter().map(|s| &s.id);
            for id in ids.chain(status.containers.iter().map(|c| &c.id)) {
                assert_eq!(cache.pod_of_container(id).as_deref(), Some(uid.as_str()));
            }
            assert!(!pod.reported.is_empty(), "{uid}");
        }
        // The pods the first run had and the second did not: their tombstones.
        let gone: HashSet<&str> = printed
            .iter()
            .filter_map(|l| l.split('\t').nth(1))
            .filter(|uid| !loaded.records.contains_key(*uid))
            .collect();
        assert!(!gone.is_empty());
        for uid in gone {
            let PodLookup::Removed { last, .. } = cache.lookup(uid) else {
                panic!("no tombstone of {uid}");
            };
            assert!(
                last.status.is_some_and(|s| !s.containers.is_empty()),
                "{uid}"
            );
        }
    }
}
