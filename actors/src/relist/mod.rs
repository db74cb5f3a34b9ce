//! The Generic PLEG's scheduling (KEP-3386 "Design Details"): the dispatcher actor
//! that runs every relist, the bounded queue every request source writes into, and
//! the router that sends a held pod's requests to its sync gate instead.

pub(crate) mod dispatcher;
pub(crate) mod queue;
pub(crate) mod router;
