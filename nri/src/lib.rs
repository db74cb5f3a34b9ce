//! plegd's NRI (Node Resource Interface) plugin: observe-only, it never adjusts a
//! container. The runtime (containerd 1.7+ with NRI enabled, CRI-O) calls it
//! synchronously at container and sandbox stops and removals; each call becomes a
//! relist hint for plegd and is answered at once. NRI is one more hint source beside
//! the CRI event stream (KEP-3386: sources only ask for reads, polling stays the
//! truth) — and unlike containerd 1.7's CRI event stream, every plugin gets every call.
//!
//! Wire protocol: ttRPC over one unix socket carrying two multiplexed connections
//! ([`mux`]); the bindings are generated from the upstream `api.proto`
//! (`proto/nri/api.proto`) with ttrpc's prost backend.

pub mod api {
    //! The NRI API (`nri.pkg.api.v1alpha1`), generated from `proto/nri/api.proto`.
    #![allow(missing_docs, trivial_casts, unused_qualifications, clippy::all)]
    include!(concat!(env!("OUT_DIR"), "/nri.pkg.api.v1alpha1.rs"));
}

mod handler;
mod hint;
pub mod mux;
mod plugin;

#[cfg(feature = "mock-runtime")]
pub mod mock_runtime;

pub use handler::{event_mask, Counters, RuntimeInfo, EVENTS};
pub use hint::{Change, HintSink, NriHint, PodRef};
pub use plugin::{
    ConfigError, Established, Plugin, PluginConfig, SessionEnd, Status, DEFAULT_INDEX,
    DEFAULT_REGISTRATION_TIMEOUT, DEFAULT_SOCKET, PLUGIN_NAME,
};
