//! containerd's event service (`containerd.services.events.v1.Events/Subscribe`) over
//! a [`FakeRuntime`], served on the same socket as CRI, as containerd does: every
//! subscriber gets every task event the runtime emits or a test injects, with the
//! runtime's scripted faults (`Op::TaskEvents`), EOF and stream failures.

use futures::stream::BoxStream;
use futures::StreamExt as _;
use plegd_runtime::containerd_events::{Envelope, SubscribeRequest};
use plegd_runtime::RuntimeClient as _;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::fake::FakeRuntime;
use crate::server::{to_status, until_stopped};

/// The generated service (sim/proto, build.rs).
#[allow(
    clippy::all,
    unreachable_pub,
    rust_2018_idioms,
    trivial_casts,
    trivial_numeric_casts
)]
mod generated {
    tonic::include_proto!("containerd.services.events.v1");
}

use generated::events_server::Events;
pub use generated::events_server::EventsServer;

/// The event service backed by a [`FakeRuntime`].
#[derive(Clone)]
pub struct SimEvents {
    runtime: FakeRuntime,
    /// As [`crate::CriServer`]'s: open subscriptions end when it says `true`.
    stopping: Option<watch::Receiver<bool>>,
}

impl SimEvents {
    pub fn new(runtime: FakeRuntime, stopping: Option<watch::Receiver<bool>>) -> Self {
        SimEvents { runtime, stopping }
    }
}

#[tonic::async_trait]
impl Events for SimEvents {
    type SubscribeStream = BoxStream<'static, Result<Envelope, Status>>;

    async fn subscribe(
        &self,
        _: Request<SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let events = self.runtime.task_events().await.map_err(to_status)?;
        let events = events.map(|item| item.map_err(to_status)).boxed();
        Ok(Response::new(until_stopped(events, self.stopping.clone())))
    }
}
