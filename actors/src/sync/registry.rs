//! SyncGateRegistry: creates a PodSyncGate on first use of a pod and forgets it when
//! the gate goes idle, so gates never accumulate. The only writer of its map.
//! [`SyncGates`] is the handle consumers use to hold pods; it bounds the holds of
//! pods plegd does not know (see [`DEFAULT_MAX_UNKNOWN_HOLDS`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use plegd_telemetry::Metrics;

use crate::queue::RelistQueue;
use crate::sync::gate::{
    BeginSync, GateConfig, GateIdle, PodSyncGate, SyncError, SyncHold, UnknownPlace,
};
use crate::sync::held::HeldPods;

/// The longest a hold lasts without a renew, by default: far longer than a pod
/// worker's sync (seconds), short enough that a stuck or hostile holder silences a
/// pod for minutes, not for ever.
pub const DEFAULT_MAX_SYNC_HOLD: Duration = Duration::from_secs(300);

/// Holds of pods plegd does not know, at most at once, by default. A pod worker holds
/// a pod it is about to create (post-allocation) before the runtime lists it: such a
/// hold lasts until the next relist sees the pod, and a node starts pods a few at a
/// time (kubelet's pod workers; image pulls serialize most starts). Sixteen leaves room
/// for a burst of starts while a client holding made-up UIDs can silence no more
/// than sixteen future pods at once (each for --max-sync-hold at most).
pub const DEFAULT_MAX_UNKNOWN_HOLDS: usize = 16;

pub struct SyncGateRegistry {
    gates: HashMap<String, Addr<PodSyncGate>>,
    queue: RelistQueue,
    held: HeldPods,
    metrics: Arc<Metrics>,
    idle_after: Duration,
    max_hold: Duration,
}

impl SyncGateRegistry {
    pub fn new(
        queue: RelistQueue,
        held: HeldPods,
        metrics: Arc<Metrics>,
        idle_after: Duration,
    ) -> Self {
        SyncGateRegistry {
            gates: HashMap::new(),
            queue,
            held,
            metrics,
            idle_after,
            max_hold: DEFAULT_MAX_SYNC_HOLD,
        }
    }

    /// Holds end at most `max_hold` after their begin or last renew.
    pub fn with_max_hold(self, max_hold: Duration) -> Self {
        SyncGateRegistry { max_hold, ..self }
    }
}

impl Actor for SyncGateRegistry {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(1024);
    }
}

/// The pod's gate, created if needed.
#[derive(Message)]
#[rtype(result = "Addr<PodSyncGate>")]
pub struct Acquire {
    pub uid: String,
}

impl Handler<Acquire> for SyncGateRegistry {
    type Result = MessageResult<Acquire>;

    fn handle(&mut self, msg: Acquire, ctx: &mut Self::Context) -> Self::Result {
        if let Some(gate) = self.gates.get(&msg.uid) {
            if gate.connected() {
                return MessageResult(gate.clone());
            }
        }
        let gate = PodSyncGate::new(
            msg.uid.clone(),
            self.queue.clone(),
            self.held.clone(),
            ctx.address().recipient(),
            GateConfig {
                idle_after: self.idle_after,
                max_hold: self.max_hold,
                metrics: self.metrics.clone(),
            },
        )
        .start();
        self.gates.insert(msg.uid, gate.clone());
        self.metrics.sync_gates.set(self.gates.len() as i64);
        MessageResult(gate)
    }
}

impl Handler<GateIdle> for SyncGateRegistry {
    type Result = bool;

    fn handle(&mut self, msg: GateIdle, _: &mut Self::Context) -> bool {
        let ours = self.gates.get(&msg.uid).is_some_and(|g| *g == msg.gate);
        if ours {
            self.gates.remove(&msg.uid);
            self.metrics.sync_gates.set(self.gates.len() as i64);
        }
        // A gate that is not (or no longer) registered may stop too.
        true
    }
}

static NEXT_TOKEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// Whether plegd knows a pod (lists it, or remembers its removal).
pub type KnownPod = Arc<dyn Fn(&str) -> bool + Send + Sync>;

/// The consumers' handle: hold a pod while syncing it.
#[derive(Clone)]
pub struct SyncGates {
    registry: Addr<SyncGateRegistry>,
    known: KnownPod,
    unknown: Arc<AtomicUsize>,
    max_unknown: usize,
}

impl SyncGates {
    /// Every pod counts as known until [`SyncGates::with_known`] says otherwise.
    pub fn new(registry: Addr<SyncGateRegistry>) -> Self {
        SyncGates {
            registry,
            known: Arc::new(|_| true),
            unknown: Arc::new(AtomicUsize::new(0)),
            max_unknown: DEFAULT_MAX_UNKNOWN_HOLDS,
        }
    }

    /// Holds of pods `known` denies are at most `max_unknown` at once.
    pub fn with_known(self, known: KnownPod, max_unknown: usize) -> Self {
        SyncGates {
            known,
            max_unknown,
            ..self
        }
    }

    /// Holds of pods plegd does not know, now.
    pub fn unknown_holds(&self) -> usize {
        self.unknown.load(Ordering::SeqCst)
    }

    /// A place for one more hold of an unknown pod, if there is one.
    fn unknown_place(&self) -> Result<UnknownPlace, SyncError> {
        let max = self.max_unknown;
        self.unknown
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < max).then_some(n + 1)
            })
            .map(|_| UnknownPlace::new(self.unknown.clone()))
            .map_err(|_| SyncError::TooManyUnknown(max))
    }

    /// Holds the pod's relists until the returned hold ends, expires or is dropped.
    /// A pod plegd does not know takes one of the places of unknown pods (none left:
    /// [`SyncError::TooManyUnknown`]).
    pub async fn begin_sync(&self, uid: &str) -> Result<SyncHold, SyncError> {
        let pod_known = (self.known)(uid);
        // A gate may stop between Acquire and BeginSync (it went idle): ask again.
        for _ in 0..5 {
            let gate = self
                .registry
                .send(Acquire {
                    uid: uid.to_string(),
                })
                .await
                .map_err(|_| SyncError::Unavailable)?;
            // The hold exists before BeginSync is sent: if this future is dropped
            // after the gate took the hold but before its reply arrives, dropping the
            // guard still releases it (the gate ignores a token it does not hold).
            let token = NEXT_TOKEN.fetch_add(1, Ordering::Relaxed);
            let unknown = if pod_known {
                None
            } else {
                Some(self.unknown_place()?)
            };
            let (expired_tx, expired_rx) = tokio::sync::oneshot::channel();
            let mut hold = SyncHold {
                gate: gate.clone(),
                token,
                ended: false,
                expires_at: std::time::SystemTime::now(),
                expired: Some(expired_rx),
                pod_known,
            };
            let begin = BeginSync {
                token,
                expired: expired_tx,
                unknown,
            };
            match gate.send(begin).await {
                Ok(Ok(at)) => {
                    hold.expires_at = at;
                    return Ok(hold);
                }
                Ok(Err(e)) => {
                    hold.ended = true;
                    return Err(e);
                }
                Err(_) => {
                    hold.ended = true;
                    continue;
                }
            }
        }
        Err(SyncError::Unavailable)
    }
}
