//! One Sync stream: the PodSyncGate hold of an external pod worker (KEP-3386 SyncPod
//! suspension). The first message names the pod; once held, plegd answers `held`
//! (with the hold's expiry); `renew` extends it by --max-sync-hold and is answered
//! with a new `held`; the client's `end` releases the hold with its outcome. A hold
//! that reaches its expiry is ended by plegd as cancelled: `released` with reason
//! EXPIRED, then the stream ends. Anything else ends it as cancelled — the client
//! closing its side without `end`, disconnecting, dying, a malformed message, or plegd
//! shutting down — so a pod can never stay held. The gate queues one post_sync relist
//! on release (after success, or when relists were asked for during the hold).
//!
//! Served on the control socket only (the service refuses it on the read socket).

use std::time::SystemTime;

use plegd_actors::{Pleg, SyncError, SyncHold, SyncOutcome};
use plegd_protocol::v1;
use plegd_telemetry::Refusal;
use tokio::sync::{mpsc, watch};
use tonic::{Status, Streaming};

use crate::clients::{Clients, HoldGuard};
use crate::convert::unix_nanos;
use crate::filter::check_uid;
use crate::request_errors::as_invalid_argument;
use crate::watch::shutting_down;

/// How long a Sync stream may stay open without its `begin`.
const BEGIN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);
/// Answers buffered for the client (held, renews' helds, released).
const ANSWERS: usize = 4;

pub type SyncStream = tokio_stream::wrappers::ReceiverStream<Result<v1::SyncResponse, Status>>;

/// What a Sync stream needs from the server.
pub struct SyncContext<'a> {
    pub pleg: &'a Pleg,
    pub node_name: &'a str,
    pub clients: &'a Clients,
    pub shutdown: watch::Receiver<bool>,
}

/// Waits for `begin`, takes the hold, and leaves the rest of the stream to a task.
pub async fn open(
    ctx: SyncContext<'_>,
    mut inbound: Streaming<v1::SyncRequest>,
) -> Result<SyncStream, Status> {
    let mut shutdown = ctx.shutdown;
    let first = tokio::select! {
        m = tokio::time::timeout(BEGIN_WAIT, inbound.message()) => match m {
            Ok(m) => m.map_err(as_invalid_argument)?,
            Err(_) => return Err(Status::invalid_argument(format!(
                "no begin within {}s of opening the stream", BEGIN_WAIT.as_secs()
            ))),
        },
        _ = shutdown.wait_for(|stop| *stop) => return Err(shutting_down()),
    };
    let uid = match first.and_then(|m| m.kind) {
        Some(v1::sync_request::Kind::Begin(b)) => b.pod_uid,
        Some(v1::sync_request::Kind::End(_) | v1::sync_request::Kind::Renew(_)) | None => {
            return Err(Status::invalid_argument("the first message must be begin"))
        }
    };
    check_uid("begin.pod_uid", &uid)?;
    let pleg = ctx.pleg;
    let hold = pleg.gates().begin_sync(&uid).await.map_err(|e| match e {
        SyncError::AlreadyHeld => {
            Status::already_exists(format!("pod {uid} is already held by another sync"))
        }
        SyncError::TooManyUnknown(max) => {
            pleg.metrics().count_refused(Refusal::UnknownPodHolds);
            Status::resource_exhausted(format!(
                "pod {uid} is not known to this plegd and {max} holds of unknown pods are held already"
            ))
        }
        SyncError::Unavailable | SyncError::Ended => shutting_down(),
    })?;
    let (tx, rx) = mpsc::channel(ANSWERS);
    let identity = (pleg.instance_id().to_string(), ctx.node_name.to_string());
    // Room on a fresh channel: cannot fail.
    let _ = tx.try_send(Ok(held(&identity, hold.expires_at())));
    let entry = ctx.clients.hold(&uid, hold.expires_at(), hold.pod_known());
    tokio::spawn(hold_until_end(
        Holding {
            hold,
            entry,
            identity,
        },
        inbound,
        tx,
        shutdown,
    ));
    Ok(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// A hold and what its stream tells about it.
struct Holding {
    hold: SyncHold,
    /// Its entry in ListClients.
    entry: HoldGuard,
    /// Instance id and node name, in every `held`.
    identity: (String, String),
}

/// What ends a hold: its outcome and the last answer.
type Ending = (SyncOutcome, Result<v1::SyncResponse, Status>);

async fn hold_until_end(
    mut h: Holding,
    mut inbound: Streaming<v1::SyncRequest>,
    tx: mpsc::Sender<Result<v1::SyncResponse, Status>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let ending: Option<Ending> = loop {
        let step = tokio::select! {
            m = inbound.message() => message(m),
            // plegd ended the hold: it is released already.
            () = h.hold.expired() => break None,
            // The client went away (nobody reads the answers any more).
            () = tx.closed() => Step::End((SyncOutcome::Cancelled, Err(Status::cancelled("the client went away")))),
            _ = shutdown.wait_for(|stop| *stop) => Step::End((SyncOutcome::Cancelled, Err(shutting_down()))),
        };
        match step {
            Step::End(ending) => break Some(ending),
            Step::Renew => match h.hold.renew().await {
                Ok(at) => {
                    h.entry.renewed(at);
                    if tx.send(Ok(held(&h.identity, at))).await.is_err() {
                        break Some((
                            SyncOutcome::Cancelled,
                            Err(Status::cancelled("the client went away")),
                        ));
                    }
                }
                // Expired meanwhile: the next turn sees it.
                Err(SyncError::Ended) => {}
                Err(_) => break Some((SyncOutcome::Cancelled, Err(shutting_down()))),
            },
        }
    };
    let answer = match ending {
        Some((outcome, answer)) => {
            h.hold.end(outcome);
            answer
        }
        None => Ok(released(v1::SyncEndReason::Expired)),
    };
    drop(h.entry);
    let _ = tx.send(answer).await;
}

/// What a client's message asks.
enum Step {
    Renew,
    End(Ending),
}

fn message(m: Result<Option<v1::SyncRequest>, Status>) -> Step {
    let kind = match m {
        Ok(Some(v1::SyncRequest { kind })) => kind,
        // Closed without `end`: the worker gave up.
        Ok(None) => {
            return Step::End((
                SyncOutcome::Cancelled,
                Ok(released(v1::SyncEndReason::Ended)),
            ))
        }
        Err(e) => return Step::End((SyncOutcome::Cancelled, Err(as_invalid_argument(e)))),
    };
    match kind {
        Some(v1::sync_request::Kind::Renew(_)) => Step::Renew,
        Some(v1::sync_request::Kind::End(end)) => match v1::SyncOutcome::try_from(end.outcome) {
            Ok(v1::SyncOutcome::SyncSuccess) => {
                Step::End((SyncOutcome::Success, Ok(released(v1::SyncEndReason::Ended))))
            }
            Ok(v1::SyncOutcome::SyncFailure) => {
                Step::End((SyncOutcome::Error, Ok(released(v1::SyncEndReason::Ended))))
            }
            _ => Step::End((
                SyncOutcome::Cancelled,
                Err(Status::invalid_argument(
                    "end.outcome must be SYNC_SUCCESS or SYNC_FAILURE; the sync is cancelled",
                )),
            )),
        },
        Some(v1::sync_request::Kind::Begin(_)) | None => Step::End((
            SyncOutcome::Cancelled,
            Err(Status::invalid_argument(
                "after begin, only renew or end; the sync is cancelled",
            )),
        )),
    }
}

fn held((instance_id, node_name): &(String, String), expires_at: SystemTime) -> v1::SyncResponse {
    v1::SyncResponse {
        kind: Some(v1::sync_response::Kind::Held(v1::SyncHeld {
            instance_id: instance_id.clone(),
            node_name: node_name.clone(),
            expires_at_unix_nano: unix_nanos(expires_at),
        })),
    }
}

fn released(reason: v1::SyncEndReason) -> v1::SyncResponse {
    v1::SyncResponse {
        kind: Some(v1::sync_response::Kind::Released(v1::SyncReleased {
            reason: reason as i32,
        })),
    }
}
