//! The Generic PLEG's logic, free of actors: pod records, the old/new diff that
//! yields lifecycle events, and one relist (global or of one pod). The
//! RelistDispatcher actor drives it; tests can drive it directly.
//!
//! A pod on its way through a targeted relist: the caller's [`PodAsk`] → `PodPlan`
//! (what the read needs of its record) → `Work` (its lists, diffed against the
//! record; a global relist starts here) → `PodRead` (with its status) →
//! [`RelistOutput`] (cache updates and events), handed over as a [`PodStep`].

mod beside;
mod changes;
mod chunks;
mod diff;
mod early;
mod fingerprint;
mod generic;
mod output;
mod pod_read;
mod record;
mod status;

pub use beside::{BesideAsk, BesideCounts, GlobalStep};
pub use generic::{EarlyDeaths, GenericPleg, PodAsk, PodStep, RelistScope};
pub use output::{CacheUpdate, RelistOutput};
pub(crate) use record::Records;
#[cfg(not(feature = "fuzzing"))]
pub(crate) use record::{PlegState, PodRecord};
pub use status::{LastRead, LastReads, PodStatus, PrefetchCounts};

/// For fuzzing only (`crate::fuzzing`).
#[cfg(feature = "fuzzing")]
pub use {diff::pod_events, record::group, record::PlegState, record::PodRecord};

#[cfg(test)]
mod beside_tests;
#[cfg(test)]
mod chunk_tests;
#[cfg(test)]
mod early_tests;
#[cfg(test)]
mod list_tests;
#[cfg(test)]
mod prefetch_tests;
#[cfg(test)]
mod status_tests;
#[cfg(test)]
mod test_support;
#[cfg(test)]
mod tests;
