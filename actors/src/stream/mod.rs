//! The CRI event stream as a relist hint (KEP-3386): the watcher actor and its
//! reconnect policy.

pub(crate) mod reconnect;
pub(crate) mod watcher;
