//! The CRI event stream's pieces that any hint source reuses: the pure state machine
//! of a connection, its reconnect policy, and what one CRI event is worth. The actor
//! that runs them is `hints::watcher`.

pub(crate) mod hint;
pub(crate) mod machine;
pub(crate) mod reconnect;
