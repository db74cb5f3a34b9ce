//! containerd's own event service as a hint source: task exit, OOM and delete events
//! of the CRI namespace (`plegd_runtime::containerd_events`). containerd gives every
//! subscriber every event (1.7 included), so plegd can use it beside any other CRI
//! event consumer. Each event names a container (or sandbox) ID: the cache maps it to
//! its pod, and an ID the cache does not know asks for nothing (the next global
//! relist finds it). `/tasks/oom` asks too, so the next read reports `OOMKilled` as
//! early as the runtime does. Source `containerd_events`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::LocalBoxFuture;
use futures::{FutureExt as _, StreamExt as _};
use plegd_runtime::containerd_events::{self, Envelope, TaskEvent};
use plegd_runtime::RuntimeClient;
use plegd_telemetry::logging::RateLimiter;
use plegd_telemetry::HintSourceName;

use crate::event::RelistSource;
use crate::hints::cri_events::source_error;
use crate::hints::{Hint, HintSource, ItemContext, ItemStream, SourceError};

pub struct ContainerdEvents {
    runtime: Arc<dyn RuntimeClient>,
    invalid_log: RateLimiter,
}

impl ContainerdEvents {
    pub fn new(runtime: Arc<dyn RuntimeClient>) -> Self {
        ContainerdEvents {
            runtime,
            invalid_log: RateLimiter::new(Duration::from_secs(30)),
        }
    }
}

impl HintSource for ContainerdEvents {
    type Item = Envelope;

    fn name(&self) -> HintSourceName {
        HintSourceName::ContainerdEvents
    }

    fn relist_source(&self) -> RelistSource {
        RelistSource::ContainerdEvents
    }

    fn describe(&self) -> &'static str {
        "containerd event service"
    }

    fn open(
        &mut self,
        _attempt: u64,
    ) -> LocalBoxFuture<'static, Result<ItemStream<Envelope>, SourceError>> {
        let runtime = self.runtime.clone();
        async move {
            let stream = runtime.task_events().await.map_err(|e| source_error(&e))?;
            Ok(stream
                .map(|item| item.map_err(|e| source_error(&e)))
                .boxed_local())
        }
        .boxed_local()
    }

    fn hint(&mut self, env: Envelope, _: ItemContext) -> Option<Hint> {
        match containerd_events::read(&env) {
            TaskEvent::Task { container_id, .. } => Some(Hint::Container { id: container_id }),
            TaskEvent::Other => None,
            TaskEvent::Invalid { reason } => {
                if let Some(suppressed) = self.invalid_log.allow(Instant::now()) {
                    tracing::info!(
                        reason,
                        suppressed,
                        "ignoring an invalid containerd task event"
                    );
                }
                None
            }
        }
    }
}
