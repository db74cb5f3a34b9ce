//! One Sync stream: the PodSyncGate hold of an external pod worker (KEP-3386 SyncPod
//! suspension). The first message names the pod; once held, plegd answers `held`;
//! the client's `end` releases the hold with its outcome. Anything else ends it as
//! cancelled — the client closing its side without `end`, disconnecting, dying, a
//! malformed message, or plegd shutting down — so a pod can never stay held. The gate
//! queues one post_sync relist on release (after success, or when relists were asked
//! for during the hold).

use plegd_actors::{Pleg, SyncError, SyncHold, SyncOutcome};
use plegd_protocol::v1;
use tokio::sync::{mpsc, watch};
use tonic::{Status, Streaming};

use crate::filter::check_uid;
use crate::request_errors::as_invalid_argument;
use crate::watch::shutting_down;

/// How long a Sync stream may stay open without its `begin`.
const BEGIN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

pub type SyncStream = tokio_stream::wrappers::ReceiverStream<Result<v1::SyncResponse, Status>>;

/// Waits for `begin`, takes the hold, and leaves the rest of the stream to a task.
pub async fn open(
    pleg: &Pleg,
    node_name: &str,
    mut shutdown: watch::Receiver<bool>,
    mut inbound: Streaming<v1::SyncRequest>,
) -> Result<SyncStream, Status> {
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
        Some(v1::sync_request::Kind::End(_) | v1::sync_request::Kind::Renew(_)) => {
            return Err(Status::invalid_argument("the first message must be begin"))
        }
        None => return Err(Status::invalid_argument("the first message must be begin")),
    };
    check_uid("begin.pod_uid", &uid)?;
    let hold = pleg.gates().begin_sync(&uid).await.map_err(|e| match e {
        SyncError::AlreadyHeld => {
            Status::already_exists(format!("pod {uid} is already held by another sync"))
        }
        SyncError::Unavailable => shutting_down(),
    })?;
    let (tx, rx) = mpsc::channel(2);
    let held = v1::SyncResponse {
        kind: Some(v1::sync_response::Kind::Held(v1::SyncHeld {
            instance_id: pleg.instance_id().to_string(),
            node_name: node_name.to_string(),
            ..Default::default()
        })),
    };
    // Room for two: cannot fail on a fresh channel.
    let _ = tx.try_send(Ok(held));
    tokio::spawn(hold_until_end(hold, inbound, tx, shutdown));
    Ok(tokio_stream::wrappers::ReceiverStream::new(rx))
}

async fn hold_until_end(
    hold: SyncHold,
    mut inbound: Streaming<v1::SyncRequest>,
    tx: mpsc::Sender<Result<v1::SyncResponse, Status>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let (outcome, answer) = tokio::select! {
        m = inbound.message() => match m {
            Ok(Some(v1::SyncRequest { kind: Some(v1::sync_request::Kind::End(end)) })) => {
                match v1::SyncOutcome::try_from(end.outcome) {
                    Ok(v1::SyncOutcome::SyncSuccess) => (SyncOutcome::Success, Ok(released())),
                    Ok(v1::SyncOutcome::SyncFailure) => (SyncOutcome::Error, Ok(released())),
                    _ => (
                        SyncOutcome::Cancelled,
                        Err(Status::invalid_argument("end.outcome must be SYNC_SUCCESS or SYNC_FAILURE; the sync is cancelled")),
                    ),
                }
            }
            Ok(Some(_)) => (
                SyncOutcome::Cancelled,
                Err(Status::invalid_argument("after begin, only end; the sync is cancelled")),
            ),
            // Closed without `end`: the worker gave up.
            Ok(None) => (SyncOutcome::Cancelled, Ok(released())),
            Err(e) => (SyncOutcome::Cancelled, Err(as_invalid_argument(e))),
        },
        // The client went away (nobody reads the answers any more).
        () = tx.closed() => (SyncOutcome::Cancelled, Err(Status::cancelled("the client went away"))),
        _ = shutdown.wait_for(|stop| *stop) => (SyncOutcome::Cancelled, Err(shutting_down())),
    };
    hold.end(outcome);
    let _ = tx.send(answer).await;
}

fn released() -> v1::SyncResponse {
    v1::SyncResponse {
        kind: Some(v1::sync_response::Kind::Released(
            v1::SyncReleased::default(),
        )),
    }
}
