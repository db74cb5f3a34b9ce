//! A hint source's connection: the pure state machine of it and its reconnect policy.
//! The actor that runs them is `hints::watcher`.

pub(crate) mod machine;
pub(crate) mod reconnect;
