//! SyncPod suspension (KEP-3386): a consumer holds a pod while it syncs it; the pod's
//! relists are held meanwhile and one relist is queued on release. One gate actor per
//! held pod, a registry that creates and forgets them, and the shared set of held
//! pods that the router and the dispatcher consult.

pub(crate) mod gate;
pub(crate) mod held;
pub(crate) mod registry;

pub(crate) use held::HeldPods;
pub use registry::{KnownPod, DEFAULT_MAX_SYNC_HOLD, DEFAULT_MAX_UNKNOWN_HOLDS};

#[cfg(test)]
mod tests;
