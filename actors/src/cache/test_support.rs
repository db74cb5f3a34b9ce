//! What the cache's tests share: statuses, updates and times.

use std::time::{Duration, SystemTime};

use plegd_runtime::{ContainerStatus, PodRef};

use super::ApplyRelist;
use crate::event::RelistSource;
use crate::pleg::{CacheUpdate, PodStatus};

pub(super) const TTL: Duration = Duration::from_secs(300);

pub(super) fn status(uid: &str) -> PodStatus {
    PodStatus {
        pod: PodRef {
            uid: uid.into(),
            name: format!("name-{uid}"),
            namespace: "ns".into(),
        },
        sandboxes: Vec::new(),
        containers: Vec::new(),
    }
}

pub(super) fn set(uid: &str, read_at: SystemTime) -> CacheUpdate {
    CacheUpdate::Set {
        uid: uid.into(),
        status: Ok(status(uid)),
        read_at,
        source: RelistSource::Global,
    }
}

pub(super) fn delete(uid: &str, read_at: SystemTime) -> CacheUpdate {
    CacheUpdate::Delete {
        uid: uid.into(),
        read_at,
        source: RelistSource::Global,
    }
}

pub(super) fn relist(updates: Vec<CacheUpdate>, revision: u64) -> ApplyRelist {
    ApplyRelist {
        updates,
        global_timestamp: None,
        held: Vec::new(),
        revision,
        events: Vec::new(),
        more: false,
    }
}

pub(super) fn at(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
}

/// A container `c` of pod `a` in `state`.
pub(super) fn container(state: plegd_runtime::ContainerState, exit_code: i32) -> ContainerStatus {
    ContainerStatus {
        id: "c".into(),
        sandbox_id: "s".into(),
        name: "app".into(),
        attempt: 0,
        state,
        created_at: 1,
        started_at: 2,
        finished_at: 0,
        exit_code,
        reason: String::new(),
        message: String::new(),
        image: String::new(),
    }
}
