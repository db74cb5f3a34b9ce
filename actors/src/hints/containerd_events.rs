//! containerd's own event service as a hint source: task start, exit, OOM and delete
//! events of the CRI namespace (`plegd_runtime::containerd_events`). containerd gives
//! every subscriber every event (1.7 included), so plegd can use it beside any other
//! CRI event consumer. Each event names only a container (or sandbox) ID: the watcher
//! maps it to its pod through the cache, or traces it through the runtime when the
//! cache does not know it (a container born since the last global relist). Source
//! `containerd_events`.
//!
//! Each event is a [`Sign`] of a change CRI records a little later, and asks for that
//! sign's rechecks (`rechecks.rs`) unless another source already runs them: a start
//! is read at once and until CRI has the container running; an exit (or OOM) only
//! waits for the delete, which CRI does before it records the exit; the delete
//! brings the dense rechecks. A stop is announced to the CRI stream's bookkeeping
//! (`cri_stops.rs`): while that stream reports stops, the rechecks begin at its grace,
//! and none is asked once it has reported the stop.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::LocalBoxFuture;
use futures::{FutureExt as _, StreamExt as _};
use plegd_runtime::containerd_events::{self, Envelope, TaskEvent, TaskTopic};
use plegd_runtime::RuntimeClient;
use plegd_telemetry::logging::RateLimiter;
use plegd_telemetry::HintSourceName;

use crate::event::RelistSource;
use crate::hints::coverage::Coverage;
use crate::hints::cri_events::source_error;
use crate::hints::cri_stops::{CriStops, Expect};
use crate::hints::rechecks::{schedule, Awaited, Rechecks, Sign};
use crate::hints::{Hint, HintSource, ItemContext, ItemStream, SourceError};

pub struct ContainerdEvents {
    runtime: Arc<dyn RuntimeClient>,
    invalid_log: RateLimiter,
    stops: CriStops,
    rechecks: Rechecks,
    coverage: Coverage,
}

impl ContainerdEvents {
    pub fn new(
        runtime: Arc<dyn RuntimeClient>,
        stops: CriStops,
        rechecks: Rechecks,
        coverage: Coverage,
    ) -> Self {
        ContainerdEvents {
            runtime,
            invalid_log: RateLimiter::new(Duration::from_secs(30)),
            stops,
            rechecks,
            coverage,
        }
    }

    /// What a task event of `id` asks for (see the module docs). Whether `id` is a
    /// sandbox's is not known here: a stop waits for a container's exit, which a
    /// sandbox's task shows the same way in the cache's sandbox list.
    fn task(&self, topic: TaskTopic, id: &str, now: Instant) -> Vec<Hint> {
        let sign = match topic {
            TaskTopic::Start => Sign::Starting,
            TaskTopic::Exit | TaskTopic::Oom => Sign::Exited,
            TaskTopic::Delete => Sign::Imminent,
        };
        let awaited = sign.awaited(false);
        let expect = match awaited {
            Awaited::Started => Expect::Unknown,
            _ => {
                self.coverage
                    .reported(HintSourceName::ContainerdEvents, id, now);
                self.stops.announce(id, now)
            }
        };
        if expect == Expect::Reported || !self.rechecks.claim(id, awaited, sign, now) {
            return Vec::new();
        }
        schedule(id, None, sign, awaited, expect)
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

    fn hint(&mut self, env: Envelope, _: ItemContext) -> Vec<Hint> {
        match containerd_events::read(&env) {
            TaskEvent::Task {
                topic,
                container_id,
            } => {
                tracing::debug!(container = %container_id, ?topic, "containerd task event");
                self.task(topic, &container_id, Instant::now())
            }
            TaskEvent::Other => vec![],
            TaskEvent::Invalid { reason } => {
                if let Some(suppressed) = self.invalid_log.allow(Instant::now()) {
                    tracing::info!(
                        reason,
                        suppressed,
                        "ignoring an invalid containerd task event"
                    );
                }
                vec![]
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plegd_runtime::containerd_events::{
        envelope, CRI_NAMESPACE, TOPIC_DELETE, TOPIC_EXIT, TOPIC_OOM, TOPIC_START,
    };

    fn source_with(stops: CriStops) -> ContainerdEvents {
        ContainerdEvents::new(
            Arc::new(plegd_sim::FakeRuntime::new()),
            stops,
            Rechecks::default(),
            Coverage::default(),
        )
    }

    fn source() -> ContainerdEvents {
        source_with(CriStops::default())
    }

    fn ctx() -> ItemContext {
        ItemContext {
            attempt_started: None,
        }
    }

    fn rechecks(id: &str, sign: Sign, awaited: Awaited, expect: Expect) -> Vec<Hint> {
        schedule(id, None, sign, awaited, expect)
    }

    #[test]
    fn each_task_event_asks_for_its_signs_rechecks() {
        let mut s = source();
        let start = s.hint(envelope(CRI_NAMESPACE, TOPIC_START, "c1"), ctx());
        assert_eq!(
            start,
            rechecks("c1", Sign::Starting, Awaited::Started, Expect::Unknown)
        );
        let exit = s.hint(envelope(CRI_NAMESPACE, TOPIC_EXIT, "c1"), ctx());
        assert_eq!(
            exit,
            rechecks("c1", Sign::Exited, Awaited::Exited, Expect::Unknown)
        );
        // The exit asks for no read at once: CRI records it only after the delete.
        assert!(exit.iter().all(|h| matches!(h, Hint::After { .. })));
        let delete = s.hint(envelope(CRI_NAMESPACE, TOPIC_DELETE, "c1"), ctx());
        assert_eq!(
            delete,
            rechecks("c1", Sign::Imminent, Awaited::Exited, Expect::Unknown)
        );
        // An OOM after the exit of the same task: already being rechecked.
        assert_eq!(
            s.hint(envelope(CRI_NAMESPACE, TOPIC_OOM, "c1"), ctx()),
            vec![]
        );
        let oom = s.hint(envelope(CRI_NAMESPACE, TOPIC_OOM, "c2"), ctx());
        assert_eq!(
            oom,
            rechecks("c2", Sign::Exited, Awaited::Exited, Expect::Unknown)
        );
    }

    /// A stop another source already rechecks at the same or a later sign costs
    /// nothing more.
    #[test]
    fn a_stop_claimed_by_another_source_asks_for_nothing() {
        let rechecks_shared = Rechecks::default();
        let mut s = ContainerdEvents::new(
            Arc::new(plegd_sim::FakeRuntime::new()),
            CriStops::default(),
            rechecks_shared.clone(),
            Coverage::default(),
        );
        // NRI's stop hook came first.
        assert!(rechecks_shared.claim("c1", Awaited::Exited, Sign::Imminent, Instant::now()));
        for topic in [TOPIC_EXIT, TOPIC_DELETE] {
            assert_eq!(s.hint(envelope(CRI_NAMESPACE, topic, "c1"), ctx()), vec![]);
        }
    }

    /// A CRI stream that is up and reported `MIN_LAGS` stops 40 ms after an early
    /// source announced them: the grace is 40 ms.
    fn reporting_stream() -> CriStops {
        crate::hints::cri_stops::reporting_stream(Duration::from_millis(40))
    }

    /// While the CRI stream reports the stops, a delete's rechecks begin at the
    /// stream's grace (reads before it could only find the container running), and a
    /// stop the stream has reported asks for nothing.
    #[test]
    fn while_the_cri_stream_reports_stops_a_stop_waits_for_its_grace() {
        let stops = reporting_stream();
        let grace = stops.grace().expect("a grace");
        let mut s = source_with(stops.clone());
        let hints = s.hint(envelope(CRI_NAMESPACE, TOPIC_DELETE, "c1"), ctx());
        assert_eq!(
            hints,
            rechecks("c1", Sign::Imminent, Awaited::Exited, Expect::Within(grace))
        );
        assert!(matches!(&hints[0], Hint::After { delay, .. } if *delay == grace));
        // The stream reports the next stop first: its task events ask for nothing.
        stops.reported("c2", Instant::now());
        for topic in [TOPIC_EXIT, TOPIC_DELETE] {
            assert_eq!(s.hint(envelope(CRI_NAMESPACE, topic, "c2"), ctx()), vec![]);
        }
        // The stream down: the rechecks from the sign on again.
        stops.set_streaming(false);
        let hints = s.hint(envelope(CRI_NAMESPACE, TOPIC_DELETE, "c3"), ctx());
        assert_eq!(
            hints,
            rechecks("c3", Sign::Imminent, Awaited::Exited, Expect::Unknown)
        );
    }

    #[test]
    fn garbage_other_namespaces_and_topics_ask_for_nothing() {
        let mut s = source();
        let mut no_payload = envelope(CRI_NAMESPACE, TOPIC_EXIT, "c1");
        no_payload.event = None;
        let mut garbage = envelope(CRI_NAMESPACE, TOPIC_EXIT, "c1");
        if let Some(any) = garbage.event.as_mut() {
            any.value = vec![0xff; 9];
        }
        for env in [
            no_payload,
            garbage,
            envelope(CRI_NAMESPACE, TOPIC_EXIT, ""),
            envelope("moby", TOPIC_EXIT, "c1"),
            envelope(CRI_NAMESPACE, "/tasks/create", "c1"),
            Envelope::default(),
        ] {
            assert_eq!(s.hint(env.clone(), ctx()), vec![], "{env:?}");
        }
    }
}
