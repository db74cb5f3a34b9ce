//! A pod's cache entry: as readers get it, and packed as the cache holds it.

use std::time::{Duration, SystemTime};

use crate::event::{EventKind, RelistSource};
use crate::id_map::IdMap;
use crate::packed_status::{PackedReported, PackedStatus};
use crate::pleg::PodStatus;

/// One pod's cache entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CachedPod {
    /// The last status read successfully (kept when a later read fails).
    pub status: Option<PodStatus>,
    /// The error of the last read, if it failed.
    pub error: Option<String>,
    /// When the last read (successful or not) began.
    pub modified: SystemTime,
    /// The relist that made that read.
    pub read_by: RelistSource,
    /// What the events published so far (up to the cache's revision) last said of
    /// each sandbox and container of the pod: `ContainerStarted` or `ContainerDied`
    /// (one removed is absent). A watch's initial events come from here, so they agree
    /// with the events exactly, even where `status` is already ahead of them (read
    /// after the list the events came from, it may show a death the next relist will
    /// publish).
    pub reported: IdMap<EventKind>,
}

/// A [`CachedPod`] as the cache holds it: the status packed into one block (see
/// `packed_status`: ≈ 350 bytes instead of ≈ 1.3 KB at a sandbox and two
/// containers). Unpacked for readers.
#[derive(Clone, Debug)]
pub(super) struct StoredPod {
    pub(super) status: Option<PackedStatus>,
    pub(super) error: Option<Box<str>>,
    pub(super) read: ReadStamp,
    pub(super) reported: PackedReported,
}

/// When a pod's last read began and which relist made it, in the 16 bytes a
/// `SystemTime` alone takes (nanoseconds since the epoch: exact on Linux, until 2554).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ReadStamp {
    pub(super) at: u64,
    pub(super) by: RelistSource,
}

impl ReadStamp {
    pub(super) const NEVER: ReadStamp = ReadStamp {
        at: 0,
        by: RelistSource::Global,
    };

    pub(super) fn new(at: SystemTime, by: RelistSource) -> Self {
        let at = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        ReadStamp { at, by }
    }

    pub(super) fn time(self) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_nanos(self.at)
    }
}

/// The relist that covered a pod last, and when it began (see [`super::PodCache::lookup_covered`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cover {
    pub by: RelistSource,
    pub at: SystemTime,
}

impl StoredPod {
    pub(super) fn unpack(&self) -> CachedPod {
        CachedPod {
            status: self.status.as_ref().and_then(|s| {
                let status = s.unpack();
                debug_assert!(status.is_some(), "a packed status that does not unpack");
                status
            }),
            error: self.error.as_deref().map(str::to_owned),
            modified: self.read.time(),
            read_by: self.read.by,
            reported: self.reported.unpack(),
        }
    }
}
#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::event::RelistSource;

    /// The read's time and relist take no more room than the time alone did.
    #[test]
    fn a_read_stamp_is_exact_and_as_small_as_a_time() {
        assert_eq!(
            std::mem::size_of::<ReadStamp>(),
            std::mem::size_of::<SystemTime>()
        );
        let t = SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 123_456_789);
        assert_eq!(ReadStamp::new(t, RelistSource::Nri).time(), t);
    }
}
