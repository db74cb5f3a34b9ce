//! Starting plegd's core over the fake runtime the way most component tests need it,
//! and reading what it did.

use std::sync::Arc;
use std::time::Duration;

use plegd_actors::Subscription;
use plegd_actors::{Delivery, EventKind, Pleg, PlegConfig, ReconnectPolicy, RelistSource};
use plegd_sim::FakeRuntime;
use plegd_telemetry::{Metrics, RequestResult};

use crate::wait::{expect_event, recv_until, wait_until};

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

/// Asks for a post-allocation relist of `uid` and waits until the subscriber has seen
/// container `id` start and the request has reached an end. A CRI event or a global
/// relist may publish the start first; a request still queued then would read the pod
/// later and claim the next change (an exit the test expects from another source).
/// Returns every delivery received on the way, the start last.
pub async fn started_on_request(
    p: &Pleg,
    sub: &Subscription,
    uid: &str,
    id: &str,
) -> Vec<Delivery> {
    let m = p.metrics().clone();
    let before = post_allocation_settled(&m);
    p.request_relist(uid, RelistSource::PostAllocation);
    let got = recv_until(sub, &format!("ContainerStarted of {id}"), |d| {
        d.event.kind == EventKind::ContainerStarted && d.event.container_id == id
    })
    .await;
    wait_until("post-allocation request settled", || {
        post_allocation_settled(&m) > before
    })
    .await;
    got
}

/// Post-allocation requests that reached an end: done, skipped, coalesced, merged or
/// dropped.
pub fn post_allocation_settled(m: &Metrics) -> u64 {
    [
        RequestResult::Done,
        RequestResult::Skipped,
        RequestResult::Coalesced,
        RequestResult::Merged,
        RequestResult::Dropped,
    ]
    .into_iter()
    .map(|r| m.requests(r, RelistSource::PostAllocation))
    .sum()
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
