//! The plegd.v1 service: each RPC checks its request and answers from the actors'
//! handles (the cache, the publisher, the sync gates, the relist router) — it never
//! writes state and never waits on the dispatcher.
//!
//! The same service answers on both sockets; on the read socket it refuses the calls
//! that change what other consumers see (Sync, RequestRelist) with PERMISSION_DENIED.

use std::path::PathBuf;
use std::time::Duration;

use plegd_actors::{ApiRelistOutcome, PodLookup, RelistSource};
use plegd_protocol::v1;
use plegd_telemetry::Refusal;
use tonic::{Request, Response, Status, Streaming};

use crate::convert::{self, from_unix_nanos, unix_nanos};
use crate::filter::check_uid;
use crate::sync::{self, SyncStream};
use crate::watch::{self, shutting_down, WatchContext, WatchStream};

/// GetPodStatus with newer_than waits at most this long when the call has no
/// deadline, and never longer than [`MAX_WAIT`].
pub const DEFAULT_WAIT: Duration = Duration::from_secs(30);
pub const MAX_WAIT: Duration = Duration::from_secs(300);

/// Which socket a service answers on.
#[derive(Clone, Debug)]
pub enum Socket {
    /// The read socket; the control socket's path, if plegd serves one.
    Read { control: Option<PathBuf> },
    /// The control socket: every call.
    Control,
}

pub struct PlegdService {
    pub ctx: WatchContext,
    pub socket: Socket,
}

impl PlegdService {
    fn instance_id(&self) -> String {
        self.ctx.pleg.instance_id().to_string()
    }

    /// Refuses `method` on the read socket (counted).
    fn control_only(&self, method: &str, refusal: Refusal) -> Result<(), Status> {
        let Socket::Read { control } = &self.socket else {
            return Ok(());
        };
        self.ctx.pleg.metrics().count_refused(refusal);
        Err(Status::permission_denied(refused_message(
            method,
            control.as_deref(),
        )))
    }
}

/// Why a control call is refused on the read socket, and where to make it.
fn refused_message(method: &str, control: Option<&std::path::Path>) -> String {
    match control {
        Some(path) => format!(
            "{method} is served on plegd's control socket only ({}), not on the read socket",
            path.display()
        ),
        None => format!(
            "{method} is served on plegd's control socket only, and this plegd serves none (--api-control-socket off)"
        ),
    }
}

/// The call's deadline (the `grpc-timeout` header), if any.
fn deadline<T>(req: &Request<T>) -> Option<Duration> {
    let text = req.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = text.split_at(text.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// How long GetPodStatus may wait: a little less than the call's deadline, so that
/// the answer is ours (DEADLINE_EXCEEDED with a reason) rather than the transport's.
fn wait_budget(deadline: Option<Duration>) -> Duration {
    match deadline {
        None => DEFAULT_WAIT,
        Some(d) => {
            let margin = (d / 10).min(Duration::from_millis(50));
            d.saturating_sub(margin).min(MAX_WAIT)
        }
    }
}

#[tonic::async_trait]
impl v1::plegd_server::Plegd for PlegdService {
    type WatchStream = WatchStream;
    type SyncStream = SyncStream;

    async fn watch(
        &self,
        request: Request<v1::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        watch::open(&self.ctx, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn list_pods(
        &self,
        _: Request<v1::ListPodsRequest>,
    ) -> Result<Response<v1::ListPodsResponse>, Status> {
        let snapshot = self
            .ctx
            .pleg
            .snapshot()
            .await
            .map_err(|_| shutting_down())?;
        Ok(Response::new(v1::ListPodsResponse {
            revision: snapshot.revision,
            instance_id: self.instance_id(),
            node_name: self.ctx.node_name.clone(),
            pods: snapshot
                .pods
                .iter()
                .map(|(uid, pod)| convert::pod(uid, pod))
                .collect(),
        }))
    }

    async fn get_pod_status(
        &self,
        request: Request<v1::GetPodStatusRequest>,
    ) -> Result<Response<v1::GetPodStatusResponse>, Status> {
        let budget = wait_budget(deadline(&request));
        let req = request.into_inner();
        check_uid("pod_uid", &req.pod_uid)?;
        let newer_than = req.newer_than_unix_nano.map(from_unix_nanos);
        let mut shutdown = self.ctx.shutdown.clone();
        let (lookup, cover) = tokio::select! {
            l = self.ctx.pleg.pod_status_covered(&req.pod_uid, newer_than, budget) => l,
            _ = shutdown.wait_for(|stop| *stop) => return Err(shutting_down()),
        };
        let (pod, removed_at) = match lookup {
            PodLookup::Present(pod) => (pod, None),
            PodLookup::Removed { last, removed_at } => (last, Some(unix_nanos(removed_at))),
            PodLookup::Unknown => {
                return Err(Status::not_found(format!(
                    "pod {} is not known to this plegd (never seen, or removed longer than --tombstone-ttl ago)",
                    req.pod_uid
                )))
            }
            PodLookup::TimedOut(_) => {
                return Err(Status::deadline_exceeded(format!(
                    "no read of pod {} newer than the given time within {}ms",
                    req.pod_uid,
                    budget.as_millis()
                )))
            }
        };
        Ok(Response::new(v1::GetPodStatusResponse {
            instance_id: self.instance_id(),
            node_name: self.ctx.node_name.clone(),
            pod: Some(convert::pod(&req.pod_uid, &pod)),
            removed_at_unix_nano: removed_at,
            hint_sources: convert::hint_sources(&self.ctx.pleg),
            covered_by: cover
                .map_or(v1::RelistSource::Unspecified, |c| {
                    convert::relist_source(c.by)
                })
                .into(),
            covered_at_unix_nano: cover.map_or(0, |c| unix_nanos(c.at)),
        }))
    }

    async fn sync(
        &self,
        request: Request<Streaming<v1::SyncRequest>>,
    ) -> Result<Response<Self::SyncStream>, Status> {
        self.control_only("Sync", Refusal::SyncOnReadSocket)?;
        let ctx = sync::SyncContext {
            pleg: &self.ctx.pleg,
            node_name: &self.ctx.node_name,
            clients: &self.ctx.clients,
            shutdown: self.ctx.shutdown.clone(),
        };
        sync::open(ctx, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn request_relist(
        &self,
        request: Request<v1::RequestRelistRequest>,
    ) -> Result<Response<v1::RequestRelistResponse>, Status> {
        self.control_only("RequestRelist", Refusal::RelistOnReadSocket)?;
        let req = request.into_inner();
        check_uid("pod_uid", &req.pod_uid)?;
        let source = match v1::RelistSource::try_from(req.source) {
            Ok(v1::RelistSource::PostSync) => RelistSource::PostSync,
            Ok(v1::RelistSource::PostAllocation) => RelistSource::PostAllocation,
            _ => {
                return Err(Status::invalid_argument(format!(
                    "source: {} is not POST_SYNC or POST_ALLOCATION",
                    req.source
                )))
            }
        };
        let outcome = match self.ctx.pleg.request_relist_from_api(&req.pod_uid, source) {
            ApiRelistOutcome::Queued => v1::RelistRequestOutcome::RelistRequestQueued,
            ApiRelistOutcome::Coalesced => v1::RelistRequestOutcome::RelistRequestCoalesced,
            ApiRelistOutcome::Dropped => v1::RelistRequestOutcome::RelistRequestDropped,
            ApiRelistOutcome::Unavailable => return Err(shutting_down()),
        };
        Ok(Response::new(v1::RequestRelistResponse {
            queued: outcome != v1::RelistRequestOutcome::RelistRequestDropped,
            outcome: outcome as i32,
        }))
    }

    async fn list_clients(
        &self,
        _: Request<v1::ListClientsRequest>,
    ) -> Result<Response<v1::ListClientsResponse>, Status> {
        Ok(Response::new(self.ctx.clients.list()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_is_the_callers_deadline_less_a_margin_and_bounded() {
        let with = |t: &str| {
            let mut r = Request::new(());
            r.metadata_mut().insert("grpc-timeout", t.parse().unwrap());
            wait_budget(deadline(&r))
        };
        assert_eq!(with("1S"), Duration::from_millis(950));
        assert_eq!(with("200m"), Duration::from_millis(180));
        assert_eq!(with("2H"), MAX_WAIT);
        assert_eq!(with("bogus"), DEFAULT_WAIT);
        assert_eq!(wait_budget(None), DEFAULT_WAIT);
    }

    #[test]
    fn a_refusal_names_the_control_socket() {
        let path = std::path::Path::new("/run/plegd/plegd-control.sock");
        let text = refused_message("Sync", Some(path));
        assert!(text.contains("/run/plegd/plegd-control.sock"), "{text}");
        assert!(refused_message("RequestRelist", None).contains("--api-control-socket off"));
    }
}
