//! The CRI event stream as a relist hint (KEP-3386): the watcher actor, the pure
//! state machine of its connection, its reconnect policy, and what one event is worth.

pub(crate) mod hint;
pub(crate) mod machine;
pub(crate) mod reconnect;
#[cfg(test)]
mod tests;
pub(crate) mod watcher;
