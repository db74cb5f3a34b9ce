//! The cache as the state dir keeps it: each pod's entry and each tombstone as bytes
//! (the packed blocks the cache holds, as they are), and the cache rebuilt from them
//! on a restart (`state`).

use std::time::SystemTime;

use actix::prelude::*;
use tokio::time::Instant;

use super::entry::ReadStamp;
use super::{CacheOwner, StoredPod};
use crate::packed::{source_code, source_of, Reader, Writer};
use crate::packed_status::{PackedReported, PackedStatus};

/// The whole cache as bytes: every entry and tombstone, the revision it reflects and
/// the last global relist's start.
pub(crate) struct CacheImage {
    pub(crate) revision: u64,
    pub(crate) global: Option<SystemTime>,
    /// (uid, entry's bytes).
    pub(crate) pods: Vec<(String, Vec<u8>)>,
    /// (uid, tombstone's bytes).
    pub(crate) tombstones: Vec<(String, Vec<u8>)>,
}

const STATUS: u8 = 1;
const ERROR: u8 = 2;

fn write_entry(w: &mut Writer<'_>, pod: &StoredPod) {
    let mut flags = 0;
    if pod.status.is_some() {
        flags |= STATUS;
    }
    if pod.error.is_some() {
        flags |= ERROR;
    }
    w.u8(flags);
    w.u64(pod.read.at);
    w.u8(source_code(pod.read.by));
    if let Some(s) = &pod.status {
        w.bytes(s.as_bytes());
    }
    if let Some(e) = &pod.error {
        w.str(e);
    }
    w.bytes(pod.reported.as_bytes());
}

fn read_entry(r: &mut Reader<'_>) -> Option<StoredPod> {
    let flags = r.u8()?;
    let read = ReadStamp {
        at: r.u64()?,
        by: source_of(r.u8()?)?,
    };
    let status = if flags & STATUS != 0 {
        Some(PackedStatus::from_bytes(r.bytes()?)?)
    } else {
        None
    };
    let error = if flags & ERROR != 0 {
        Some(Box::from(r.str()?))
    } else {
        None
    };
    let reported = PackedReported::from_bytes(r.bytes()?)?;
    Some(StoredPod {
        status,
        error,
        read,
        reported,
    })
}

impl CacheOwner {
    /// The cache as bytes (between two applies: consistent with its revision).
    pub(crate) fn image(&self) -> CacheImage {
        let pods = self
            .shared
            .pods
            .iter()
            .map(|e| {
                let mut b = Vec::new();
                write_entry(&mut Writer(&mut b), e.value());
                (e.key().to_string(), b)
            })
            .collect();
        let tombstones = self
            .shared
            .tombstones
            .iter()
            .map(|e| {
                let t = e.value();
                let mut b = Vec::new();
                let mut w = Writer(&mut b);
                write_entry(&mut w, &t.last);
                w.time(t.removed_at);
                w.u8(source_code(t.removed_by));
                (e.key().to_string(), b)
            })
            .collect();
        CacheImage {
            revision: self.revision,
            global: self.shared.changes.borrow().0,
            pods,
            tombstones,
        }
    }

    /// A stored snapshot's base: the revision it reflects, the last global relist.
    pub(crate) fn restore_base(&mut self, revision: u64, global: Option<SystemTime>) {
        self.revision = revision;
        self.shared.changes.send_modify(|(g, n)| {
            *g = global;
            *n += 1;
        });
    }

    /// A stored entry; false if its bytes do not read.
    pub(crate) fn restore_pod(&mut self, uid: String, bytes: &[u8]) -> bool {
        let mut r = Reader(bytes);
        match read_entry(&mut r) {
            Some(pod) if r.0.is_empty() => {
                self.shared.pods.insert(uid.into(), pod);
                true
            }
            _ => false,
        }
    }

    /// A stored tombstone; false if its bytes do not read.
    pub(crate) fn restore_tombstone(&mut self, uid: String, bytes: &[u8]) -> bool {
        let mut r = Reader(bytes);
        let (Some(last), Some(removed_at), Some(removed_by)) =
            (read_entry(&mut r), r.time(), r.u8().and_then(source_of))
        else {
            return false;
        };
        if !r.0.is_empty() {
            return false;
        }
        self.bury(uid, last, removed_at, removed_by);
        true
    }

    /// After a restart: each tombstone's TTL counted from when its pod was found
    /// gone (wall-clock time: the process that buried it is gone), the expired
    /// forgotten.
    pub(crate) fn settle_restored_tombstones(&mut self) {
        let now = Instant::now();
        let wall = SystemTime::now();
        let ttl = self.tombstone_ttl;
        let mut expiry: Vec<(Instant, u64, String)> = Vec::new();
        self.shared.tombstones.retain(|uid, t| {
            let age = wall.duration_since(t.removed_at).unwrap_or_default();
            let Some(left) = ttl.checked_sub(age).filter(|d| !d.is_zero()) else {
                return false;
            };
            t.expires = now + left;
            expiry.push((t.expires, t.generation, uid.clone()));
            true
        });
        expiry.sort();
        self.expiry = expiry.into();
    }
}

/// The cache as bytes ([`CacheOwner::image`]), for a new state file; asked by the
/// dispatcher between two of its units of work, so nothing is partly applied.
#[derive(Message)]
#[rtype(result = "CacheImage")]
pub(crate) struct TakeImage;

impl Handler<TakeImage> for CacheOwner {
    type Result = MessageResult<TakeImage>;

    fn handle(&mut self, _: TakeImage, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.image())
    }
}

impl super::PodCache {
    /// Pods whose last read failed (their entry holds the error): a restart
    /// reinspects them.
    pub(crate) fn pods_with_errors(&self) -> std::collections::HashSet<String> {
        self.shared
            .pods
            .iter()
            .filter(|e| e.value().error.is_some())
            .map(|e| e.key().to_string())
            .collect()
    }
}
