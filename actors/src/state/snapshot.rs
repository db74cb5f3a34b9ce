//! A new state file's bytes: the header, then a snapshot of everything a restart goes
//! on from (the revision, each pod's record and cache entry, the tombstones, the
//! history), then its end. Commits are appended after it.

use super::codec::{self, Base, Header};
use super::frame;
use crate::cache::CacheImage;
use crate::packed::Writer;

/// The snapshot's parts, taken between two units of the dispatcher's work (so they
/// agree with one revision).
pub(crate) struct Snapshot<'a> {
    pub(crate) header: &'a Header,
    pub(crate) records: &'a crate::pleg::Records,
    pub(crate) cache: &'a CacheImage,
    /// The history's events, packed, oldest first.
    pub(crate) history: Vec<Vec<u8>>,
}

impl Snapshot<'_> {
    pub(crate) fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        frame::put(&mut out, codec::HEADER, &codec::header(self.header));
        let base = Base {
            revision: self.cache.revision,
            global: self.cache.global,
        };
        frame::put(&mut out, codec::BASE, &codec::base(&base));
        for (uid, rec) in self.records.iter() {
            frame::put(&mut out, codec::RECORD, &codec::pod_record(uid, rec));
        }
        let mut body = Vec::new();
        for (kind, items) in [
            (codec::CACHED, &self.cache.pods),
            (codec::TOMBSTONE, &self.cache.tombstones),
        ] {
            for (uid, bytes) in items {
                body.clear();
                let mut w = Writer(&mut body);
                w.str(uid);
                body.extend_from_slice(bytes);
                frame::put(&mut out, kind, &body);
            }
        }
        for ev in &self.history {
            frame::put(&mut out, codec::EVENT, ev);
        }
        frame::put(&mut out, codec::SNAPSHOT_END, &[]);
        out
    }
}
