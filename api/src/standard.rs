//! The standard gRPC services next to plegd.v1 on the API socket, so stock probes
//! and tools work: `grpc.health.v1.Health` (grpc_health_probe, Kubernetes' gRPC
//! probes) and server reflection (grpcurl, grpc_cli), v1 and v1alpha.
//!
//! Health answers SERVING, for the whole server ("") and for `plegd.v1.Plegd`, while
//! plegd is both ready and healthy (what `/readyz` and `/healthz` say together);
//! NOT_SERVING before the first global relist, while the Generic PLEG is stale, and
//! once the server stops.

use std::time::Duration;

use plegd_actors::Health;
use plegd_protocol::v1::plegd_server::PlegdServer;
use tokio::sync::watch;
use tonic::server::NamedService;
use tonic::transport::server::Router;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::service::PlegdService;

/// How often the health status follows plegd's own.
const HEALTH_POLL: Duration = Duration::from_secs(1);

/// The health status for plegd's readiness and liveness.
pub(crate) fn serving_status(ready: bool, healthy: bool) -> ServingStatus {
    if ready && healthy {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    }
}

/// The names health answers for: the whole server, and plegd.v1's service.
const HEALTH_NAMES: [&str; 2] = ["", PlegdServer::<PlegdService>::NAME];

/// Adds the health and reflection services to `router`, and spawns the task that
/// keeps the health status current until `stopped`.
pub(crate) fn add<L>(
    router: Router<L>,
    health: Health,
    stopped: watch::Receiver<bool>,
) -> Result<Router<L>, tonic_reflection::server::Error> {
    let (reporter, health_service) = tonic_health::server::health_reporter();
    let descriptors = [
        plegd_protocol::FILE_DESCRIPTOR_SET,
        tonic_health::pb::FILE_DESCRIPTOR_SET,
    ];
    let mut v1 = tonic_reflection::server::Builder::configure();
    let mut v1alpha = tonic_reflection::server::Builder::configure();
    for set in descriptors {
        v1 = v1.register_encoded_file_descriptor_set(set);
        v1alpha = v1alpha.register_encoded_file_descriptor_set(set);
    }
    tokio::spawn(follow_health(reporter, health, stopped));
    Ok(router
        .add_service(health_service)
        .add_service(v1.build_v1()?)
        .add_service(v1alpha.build_v1alpha()?))
}

async fn follow_health(
    reporter: HealthReporter,
    health: Health,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
        let stop = *stopped.borrow();
        let status = if stop {
            ServingStatus::NotServing
        } else {
            serving_status(health.ready(), health.check().is_ok())
        };
        for name in HEALTH_NAMES {
            reporter.set_service_status(name, status).await;
        }
        if stop {
            return;
        }
        tokio::select! {
            _ = stopped.wait_for(|stop| *stop) => {}
            () = tokio::time::sleep(HEALTH_POLL) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serving_only_when_ready_and_healthy() {
        assert_eq!(serving_status(true, true), ServingStatus::Serving);
        assert_eq!(serving_status(false, true), ServingStatus::NotServing);
        assert_eq!(serving_status(true, false), ServingStatus::NotServing);
        assert_eq!(serving_status(false, false), ServingStatus::NotServing);
    }
}
