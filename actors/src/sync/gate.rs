//! PodSyncGate: one per pod, created on first use by the [`SyncGateRegistry`] and
//! stopped when idle. While a consumer holds the pod (a sync is in progress), the
//! pod's relists are held: requests for it are coalesced into one pending relist
//! and global relists neither read nor publish it. On release — success, error,
//! cancellation or the holder going away — the gate releases the pod and queues
//! exactly one relist (source post_sync) if one is pending or the sync succeeded
//! (KEP-3386: SyncPod suspension).
//!
//! A hold lasts at most `max_hold` (`--max-sync-hold`) from its begin or its last
//! renew: then the gate ends it as cancelled, tells the holder (which sees it as
//! [`SyncHold::expired`]), logs it with the pod's UID and counts it.
//!
//! [`SyncGateRegistry`]: crate::sync::registry::SyncGateRegistry

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use actix::prelude::*;
use opentelemetry::global::BoxedSpan;
use opentelemetry::trace::Span as _;
use opentelemetry::KeyValue;
use plegd_telemetry::Metrics;
use tokio::sync::oneshot;

use crate::event::RelistSource;
use crate::queue::RelistQueue;
use crate::spans;
use crate::sync::held::HeldPods;

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
    /// The pod is not known and the most holds of unknown pods are held.
    #[error("too many holds of pods plegd does not know ({0} at most)")]
    TooManyUnknown(usize),
    /// Renew of a hold that has ended (expired, or released).
    #[error("the hold has ended")]
    Ended,
}

/// The hold a gate keeps.
struct Holding {
    token: u64,
    /// Ends the hold at its expiry.
    expiry: SpawnHandle,
    /// Tells the holder the hold expired.
    expired: Option<oneshot::Sender<()>>,
    /// The place of a pod plegd did not know when the hold began (given back on
    /// release).
    _unknown: Option<UnknownPlace>,
}

pub struct PodSyncGate {
    uid: String,
    queue: RelistQueue,
    held: HeldPods,
    registry: Recipient<GateIdle>,
    idle_after: Duration,
    max_hold: Duration,
    metrics: Arc<Metrics>,
    hold: Option<Holding>,
    idle_timer: Option<SpawnHandle>,
    hold_span: Option<BoxedSpan>,
}

/// A gate has been idle: forget it if it is still the pod's gate. Replies whether
/// it was forgotten (the gate then stops).
#[derive(Message)]
#[rtype(result = "bool")]
pub struct GateIdle {
    pub uid: String,
    pub gate: Addr<PodSyncGate>,
}

/// A place among the holds of pods plegd does not know; given back when dropped.
pub(crate) struct UnknownPlace(Arc<AtomicUsize>);

impl UnknownPlace {
    /// The place `count` (already counted) stands for.
    pub(crate) fn new(count: Arc<AtomicUsize>) -> Self {
        UnknownPlace(count)
    }
}

impl Drop for UnknownPlace {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// How a gate is made (the registry's settings).
#[derive(Clone)]
pub(crate) struct GateConfig {
    pub(crate) idle_after: Duration,
    pub(crate) max_hold: Duration,
    pub(crate) metrics: Arc<Metrics>,
}

impl PodSyncGate {
    pub(crate) fn new(
        uid: String,
        queue: RelistQueue,
        held: HeldPods,
        registry: Recipient<GateIdle>,
        cfg: GateConfig,
    ) -> Self {
        PodSyncGate {
            uid,
            queue,
            held,
            registry,
            idle_after: cfg.idle_after,
            max_hold: cfg.max_hold,
            metrics: cfg.metrics,
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

/// Start a sync holding `token` (chosen by the caller, unique): hold the pod's relists
/// until released or `max_hold` from now. Replies when the hold expires.
#[derive(Message)]
#[rtype(result = "Result<SystemTime, SyncError>")]
pub struct BeginSync {
    pub token: u64,
    /// Told when the hold expires.
    pub(crate) expired: oneshot::Sender<()>,
    /// The place of a pod plegd does not know, if it does not.
    pub(crate) unknown: Option<UnknownPlace>,
}

/// Extend the hold of `token` by `max_hold` from now. Replies the new expiry.
#[derive(Message)]
#[rtype(result = "Result<SystemTime, SyncError>")]
pub struct RenewSync {
    pub token: u64,
}

impl PodSyncGate {
    /// Arms the expiry of the hold of `token`: `max_hold` from now.
    fn arm_expiry(&mut self, token: u64, ctx: &mut Context<Self>) -> (SpawnHandle, SystemTime) {
        let handle = ctx.run_later(self.max_hold, move |act, ctx| act.expire(token, ctx));
        (handle, SystemTime::now() + self.max_hold)
    }

    /// The hold of `token` reached its expiry: end it as cancelled, tell the holder.
    fn expire(&mut self, token: u64, ctx: &mut Context<Self>) {
        if self.hold.as_ref().map(|h| h.token) != Some(token) {
            return;
        }
        tracing::warn!(
            pod.uid = %self.uid,
            max_hold_secs = self.max_hold.as_secs_f64(),
            "a sync hold reached --max-sync-hold without a renew: plegd ended it as cancelled"
        );
        self.metrics.sync_holds_expired.inc();
        if let Some(tx) = self.hold.as_mut().and_then(|h| h.expired.take()) {
            let _ = tx.send(());
        }
        self.release(SyncOutcome::Cancelled, "expired", ctx);
    }

    /// Ends the hold: releases the pod, queues its relist if one is owed.
    fn release(&mut self, outcome: SyncOutcome, label: &'static str, ctx: &mut Context<Self>) {
        if let Some(h) = self.hold.take() {
            ctx.cancel_future(h.expiry);
        }
        let pending = self.held.release(&self.uid);
        let relist = pending || outcome == SyncOutcome::Success;
        if relist {
            // A full queue drops this (counted); the next global relist covers the pod.
            self.queue
                .request(&self.uid, RelistSource::PostSync, None, None);
        }
        if let Some(mut span) = self.hold_span.take() {
            span.set_attributes([
                KeyValue::new("outcome", label),
                KeyValue::new("coalesced", pending),
                KeyValue::new("relist_queued", relist),
            ]);
            span.end();
        }
        self.schedule_idle(ctx);
    }
}

impl Handler<BeginSync> for PodSyncGate {
    type Result = Result<SystemTime, SyncError>;

    fn handle(&mut self, msg: BeginSync, ctx: &mut Self::Context) -> Self::Result {
        if self.hold.is_some() {
            return Err(SyncError::AlreadyHeld);
        }
        if let Some(h) = self.idle_timer.take() {
            ctx.cancel_future(h);
        }
        let (expiry, expires_at) = self.arm_expiry(msg.token, ctx);
        self.hold = Some(Holding {
            token: msg.token,
            expiry,
            expired: Some(msg.expired),
            _unknown: msg.unknown,
        });
        self.held.hold(&self.uid);
        self.hold_span = Some(spans::start(
            spans::SYNC_HOLD,
            vec![KeyValue::new("pod.uid", self.uid.clone())],
            None,
        ));
        Ok(expires_at)
    }
}

impl Handler<RenewSync> for PodSyncGate {
    type Result = Result<SystemTime, SyncError>;

    fn handle(&mut self, msg: RenewSync, ctx: &mut Self::Context) -> Self::Result {
        if self.hold.as_ref().map(|h| h.token) != Some(msg.token) {
            return Err(SyncError::Ended);
        }
        let (expiry, expires_at) = self.arm_expiry(msg.token, ctx);
        if let Some(h) = self.hold.as_mut() {
            let old = std::mem::replace(&mut h.expiry, expiry);
            ctx.cancel_future(old);
        }
        Ok(expires_at)
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
        if self.hold.as_ref().map(|h| h.token) != Some(msg.token) {
            return; // a stale or duplicate release
        }
        let label = match msg.outcome {
            SyncOutcome::Success => "success",
            SyncOutcome::Error => "error",
            SyncOutcome::Cancelled => "cancelled",
        };
        self.release(msg.outcome, label, ctx);
    }
}

/// A held sync. End it with [`SyncHold::end`]; dropping it counts as cancellation
/// (the holder went away), so a pod can never stay held. It expires unless renewed.
pub struct SyncHold {
    pub(crate) gate: Addr<PodSyncGate>,
    pub(crate) token: u64,
    pub(crate) ended: bool,
    pub(crate) expires_at: SystemTime,
    /// Told when the gate ended the hold at its expiry (None once told).
    pub(crate) expired: Option<oneshot::Receiver<()>>,
    pub(crate) pod_known: bool,
}

impl SyncHold {
    pub fn end(mut self, outcome: SyncOutcome) {
        self.release(outcome);
    }

    /// When the hold ends unless renewed.
    pub fn expires_at(&self) -> SystemTime {
        self.expires_at
    }

    /// Whether plegd knew the pod when the hold began.
    pub fn pod_known(&self) -> bool {
        self.pod_known
    }

    /// Extends the hold by the gate's `max_hold` from now; the new expiry.
    pub async fn renew(&mut self) -> Result<SystemTime, SyncError> {
        let at = self
            .gate
            .send(RenewSync { token: self.token })
            .await
            .map_err(|_| SyncError::Unavailable)??;
        self.expires_at = at;
        Ok(at)
    }

    /// Resolves once plegd has ended the hold at its expiry (it is then released as
    /// cancelled); never otherwise.
    pub async fn expired(&mut self) {
        if let Some(rx) = self.expired.as_mut() {
            if rx.await.is_ok() {
                self.expired = None;
                self.ended = true;
                return;
            }
            // The gate is gone without an expiry: nothing to wait for.
            self.expired = None;
        }
        std::future::pending::<()>().await
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
