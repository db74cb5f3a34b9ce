//! The state dir (`--state-dir`): what plegd keeps on disk to go on where it stopped
//! after a restart — its identity, the revision counter, each pod's record and cache
//! entry, the tombstones and the event history — so that a consumer resuming from a
//! revision gets what it missed and the transitions of the downtime, with no gap and
//! no duplicate.
//!
//! The rules:
//! - Each relist's changes are stored (one record, one `write(2)`) before the cache
//!   applies them and before any revision they carry is shown ([`crate::revision`]):
//!   nothing a consumer saw is missing after a killed process restarts.
//! - No sync per relist: the file is synced when written anew and at a clean stop. A
//!   file not stopped cleanly in an earlier boot may have lost its tail with the page
//!   cache: plegd then starts fresh (a new identity, consumers re-list), never with a
//!   silent gap.
//! - A write that fails (a full disk) leaves plegd serving from memory and marks the
//!   file behind; a new file is tried every few seconds; a restart while behind
//!   starts fresh. A damaged, foreign or newer state is set aside and plegd starts
//!   fresh, saying why once.
//!
//! `frame`: the file's records; `codec`: their bytes; `snapshot`: a new file's;
//! `load`: reading one back; `store`: the dir, its lock, the commits and the writer
//! thread of new files.

mod codec;
mod frame;
mod load;
mod snapshot;
mod store;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use actix::prelude::*;

pub(crate) use codec::{CommitRef, Header, FORMAT};
pub use load::Loaded;
pub(crate) use snapshot::Snapshot;
pub use store::{boot_id, open, OpenError, Opened, StateStore};

use crate::cache::TakeImage;
use crate::pleg::GenericPleg;
use crate::publisher::TakeHistory;

/// What the dispatcher needs to store its relists and write new state files.
#[derive(Clone)]
pub(crate) struct Persistence {
    pub(crate) store: StateStore,
    pub(crate) header: Arc<Header>,
    /// The CacheOwner's image and the publisher's history, for a new file.
    pub(crate) images: Recipient<TakeImage>,
    pub(crate) history: Recipient<TakeHistory>,
}

impl Persistence {
    /// Writes a new state file from the state between two units of work; false if
    /// it could not be written (the store says why).
    pub(crate) async fn rewrite(&self, core: &GenericPleg) -> bool {
        let (Ok(cache), Ok(history)) = (
            self.images.send(TakeImage).await,
            self.history.send(TakeHistory).await,
        ) else {
            return false;
        };
        let bytes = Snapshot {
            header: &self.header,
            records: core.records(),
            cache: &cache,
            history,
        }
        .bytes();
        self.store.rewrite(bytes).await
    }
}
