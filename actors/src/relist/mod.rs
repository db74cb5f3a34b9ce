//! The Generic PLEG's scheduling (KEP-3386 "Design Details"): the dispatcher actor
//! that runs every relist (`global` one global relist, `batch` a batch of targeted
//! relists, `apply` their output to the cache and the publisher), the global
//! relist's schedule and the verdict on each targeted request, the bounded queue
//! every request source writes into, and the router that sends a held pod's requests
//! to its sync gate instead.

mod apply;
mod batch;
pub(crate) mod dispatcher;
mod global;
pub(crate) mod log_budget;
mod machine;
pub(crate) mod priority;
pub(crate) mod queue;
mod request;
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
