//! The Generic PLEG's scheduling (KEP-3386 "Design Details"): the dispatcher actor
//! that runs every relist (`global` one global relist, `batch` a batch of targeted
//! relists, `apply` their output to the cache and the publisher) and the state
//! machine that decides what runs when (`machine`, with the global relist's
//! `schedule`), and the router that sends a held pod's requests to its sync gate.
//! The requests and the queue they wait in are `crate::queue`, below this module and
//! `sync`, which both write into it.

mod apply;
mod batch;
pub(crate) mod dispatcher;
mod global;
mod machine;
pub(crate) mod router;
pub(crate) mod schedule;

#[cfg(test)]
mod batch_tests;
#[cfg(test)]
mod chunk_tests;
#[cfg(test)]
mod machine_tests;
#[cfg(test)]
mod tests;
