//! PodSyncGate: one per pod, created on first use by the [`SyncGateRegistry`] and
//! stopped when idle. While a consumer holds the pod (a sync is in progress), the
//! pod's relists are held: requests for it are coalesced into one pending relist
//! and global relists neither read nor publish it. On release — success, error,
//! cancellation or the holder going away — the gate releases the pod and queues
//! exactly one relist (source post_sync) if one is pending or the sync succeeded
//! (KEP-3386: SyncPod suspension).
//!
//! [`SyncGateRegistry`]: crate::sync::registry::SyncGateRegistry

use std::time::Duration;

use actix::prelude::*;
use opentelemetry::global::BoxedSpan;
use opentelemetry::trace::Span as _;
use opentelemetry::KeyValue;

use crate::event::RelistSource;
use crate::relist::queue::RelistQueue;
use crate::spans;
use crate::sync::held::HeldPods;
use crate::sync::registry::{GateIdle, SyncGateRegistry};

/// How a sync ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncOutcome {
    Success,
    Error,
    Cancelled,
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SyncError {
    #[error("the pod is already held by another sync")]
    AlreadyHeld,
    #[error("plegd is shutting down")]
    Unavailable,
}

pub struct PodSyncGate {
    uid: String,
    queue: RelistQueue,
    held: HeldPods,
    registry: Addr<SyncGateRegistry>,
    idle_after: Duration,
    hold: Option<u64>,
    idle_timer: Option<SpawnHandle>,
    hold_span: Option<BoxedSpan>,
}

impl PodSyncGate {
    pub(crate) fn new(
        uid: String,
        queue: RelistQueue,
        held: HeldPods,
        registry: Addr<SyncGateRegistry>,
        idle_after: Duration,
    ) -> Self {
        PodSyncGate {
            uid,
            queue,
            held,
            registry,
            idle_after,
            hold: None,
            idle_timer: None,
            hold_span: None,
        }
    }

    fn schedule_idle(&mut self, ctx: &mut Context<Self>) {
        if let Some(h) = self.idle_timer.take() {
            ctx.cancel_future(h);
        }
        self.idle_timer = Some(ctx.run_later(self.idle_after, |act, ctx| {
            act.idle_timer = None;
            if act.hold.is_some() {
                return;
            }
            let idle = GateIdle {
                uid: act.uid.clone(),
                gate: ctx.address(),
            };
            // Hold the mailbox until the registry has forgotten this gate, then stop:
            // a BeginSync sent meanwhile fails and its sender asks the registry again.
            ctx.wait(
                act.registry
                    .send(idle)
                    .into_actor(act)
                    .map(|removed, act, ctx| {
                        if removed.unwrap_or(true) && act.hold.is_none() {
                            ctx.stop();
                        }
                    }),
            );
        }));
    }
}

impl Actor for PodSyncGate {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.schedule_idle(ctx);
    }

    fn stopped(&mut self, _: &mut Self::Context) {
        // A gate never stops while holding; if the system goes down mid-hold, release
        // the pod anyway so nothing stays held.
        if self.hold.take().is_some() {
            self.held.release(&self.uid);
        }
        if let Some(span) = self.hold_span.take() {
            spans::end_error(span, "the gate stopped while held".into());
        }
    }
}

/// Start a sync holding `token` (chosen by the caller, unique): hold the pod's relists.
#[derive(Message)]
#[rtype(result = "Result<(), SyncError>")]
pub struct BeginSync {
    pub token: u64,
}

impl Handler<BeginSync> for PodSyncGate {
    type Result = Result<(), SyncError>;

    fn handle(&mut self, msg: BeginSync, ctx: &mut Self::Context) -> Self::Result {
        if self.hold.is_some() {
            return Err(SyncError::AlreadyHeld);
        }
        if let Some(h) = self.idle_timer.take() {
            ctx.cancel_future(h);
        }
        self.hold = Some(msg.token);
        self.held.hold(&self.uid);
        self.hold_span = Some(spans::start(
            spans::SYNC_HOLD,
            vec![KeyValue::new("pod.uid", self.uid.clone())],
            None,
        ));
        Ok(())
    }
}

/// End the sync holding `token`.
#[derive(Message)]
#[rtype(result = "()")]
pub struct EndSync {
    pub token: u64,
    pub outcome: SyncOutcome,
}

impl Handler<EndSync> for PodSyncGate {
    type Result = ();

    fn handle(&mut self, msg: EndSync, ctx: &mut Self::Context) {
        if self.hold != Some(msg.token) {
            return; // a stale or duplicate release
        }
        self.hold = None;
        let pending = self.held.release(&self.uid);
        let relist = pending || msg.outcome == SyncOutcome::Success;
        if relist {
            // A full queue drops this (counted); the next global relist covers the pod.
            self.queue
                .request(&self.uid, RelistSource::PostSync, None, None);
        }
        if let Some(mut span) = self.hold_span.take() {
            span.set_attributes([
                KeyValue::new("outcome", format!("{:?}", msg.outcome).to_lowercase()),
                KeyValue::new("coalesced", pending),
                KeyValue::new("relist_queued", relist),
            ]);
            span.end();
        }
        self.schedule_idle(ctx);
    }
}

/// A held sync. End it with [`SyncHold::end`]; dropping it counts as cancellation
/// (the holder went away), so a pod can never stay held.
pub struct SyncHold {
    pub(crate) gate: Addr<PodSyncGate>,
    pub(crate) token: u64,
    pub(crate) ended: bool,
}

impl SyncHold {
    pub fn end(mut self, outcome: SyncOutcome) {
        self.release(outcome);
    }

    fn release(&mut self, outcome: SyncOutcome) {
        if std::mem::replace(&mut self.ended, true) {
            return;
        }
        // The gate's mailbox only ever holds this holder's Begin/End: it has room.
        if let Err(e) = self.gate.try_send(EndSync {
            token: self.token,
            outcome,
        }) {
            tracing::error!(error = %e, "cannot release a sync hold");
        }
    }
}

impl Drop for SyncHold {
    fn drop(&mut self) {
        self.release(SyncOutcome::Cancelled);
    }
}
