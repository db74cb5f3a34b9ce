//! The one message that stops an actor. What stopping means is each actor's handler's
//! to say: the hint watcher cancels its connection, the dispatcher first finishes what
//! it accepted, the publisher lets its subscribers drain.

use actix::prelude::*;

/// Stop the actor that receives it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Stop;
