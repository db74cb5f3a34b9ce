//! Starting plegd's core over the fake runtime the way most component tests need it,
//! and reading what it did.

use std::sync::Arc;
use std::time::Duration;

use plegd_actors::{EventKind, Pleg, PlegConfig, ReconnectPolicy, Subscription};
use plegd_sim::FakeRuntime;
use plegd_telemetry::Metrics;

use crate::wait::expect_event;

/// The Generic PLEG alone, relisting every `period`: no event stream, so every
/// targeted relist in the test is one it asked for.
pub fn start_generic(rt: &FakeRuntime, period: Duration) -> Pleg {
    start_generic_with(
        rt,
        PlegConfig {
            relist_period: period,
            ..PlegConfig::default()
        },
    )
}

/// As [`start_generic`], with the rest of `cfg` (its `evented` is forced off).
pub fn start_generic_with(rt: &FakeRuntime, cfg: PlegConfig) -> Pleg {
    let cfg = PlegConfig {
        hint_sources: vec![],
        ..cfg
    };
    Pleg::start(Arc::new(rt.clone()), &cfg, Arc::new(Metrics::new()))
}

/// Global relists completed (successful or not) so far.
pub fn global_relists(p: &Pleg) -> u64 {
    p.metrics().relist_duration.get_sample_count()
}

/// Starts pod `uid` (sandbox and a running container "app") and waits until the
/// subscriber has seen the container start. Returns the sandbox and container IDs.
pub async fn running_pod(rt: &FakeRuntime, uid: &str, sub: &Subscription) -> (String, String) {
    let sb = rt.run_pod(uid, "web", "ns");
    let c = rt.run_container(&sb, "app");
    expect_event(sub, EventKind::ContainerStarted, &c).await;
    (sb, c)
}

/// A reconnect policy of `base_ms`/`cap_ms` that resets after a healthy minute.
pub fn policy(base_ms: u64, cap_ms: u64) -> ReconnectPolicy {
    match ReconnectPolicy::new(
        Duration::from_millis(base_ms),
        Duration::from_millis(cap_ms),
        Duration::from_secs(60),
    ) {
        Ok(p) => p,
        Err(e) => panic!("test reconnect policy: {e}"),
    }
}
