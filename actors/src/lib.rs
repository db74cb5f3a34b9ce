//! plegd's actors and the runtime boundary. See DESIGN.md for the picture.
//!
//! One actor per file, its messages beside it: [`relist_dispatcher`] (the Generic
//! PLEG), [`cache_owner`], [`event_publisher`]. [`pleg`] is the relist logic without
//! actors; [`runtime`] is the CRI boundary.

pub mod cache_owner;
pub mod event_publisher;
pub mod health;
pub mod lifecycle;
pub mod pleg;
pub mod pod_sync_gate;
pub mod reconnect_backoff;
pub mod relist_dispatcher;
pub mod relist_router;
pub mod runtime;
pub mod service;
pub mod spans;
pub mod stream_watcher;
pub mod suspended;
pub mod sync_gate_registry;
