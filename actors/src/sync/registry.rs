//! SyncGateRegistry: creates a PodSyncGate on first use of a pod and forgets it when
//! the gate goes idle, so gates never accumulate. The only writer of its map.
//! [`SyncGates`] is the handle consumers use to hold pods.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use plegd_telemetry::Metrics;

use crate::relist::queue::RelistQueue;
use crate::sync::gate::{BeginSync, PodSyncGate, SyncError, SyncHold};
use crate::sync::held::HeldPods;

pub struct SyncGateRegistry {
    gates: HashMap<String, Addr<PodSyncGate>>,
    queue: RelistQueue,
    held: HeldPods,
    metrics: Arc<Metrics>,
    idle_after: Duration,
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
        }
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
            ctx.address(),
            self.idle_after,
        )
        .start();
        self.gates.insert(msg.uid, gate.clone());
        self.metrics.sync_gates.set(self.gates.len() as i64);
        MessageResult(gate)
    }
}

/// A gate has been idle: forget it if it is still the pod's gate. Replies whether
/// it was forgotten (the gate then stops).
#[derive(Message)]
#[rtype(result = "bool")]
pub struct GateIdle {
    pub uid: String,
    pub gate: Addr<PodSyncGate>,
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

/// The consumers' handle: hold a pod while syncing it.
#[derive(Clone)]
pub struct SyncGates {
    registry: Addr<SyncGateRegistry>,
}

impl SyncGates {
    pub fn new(registry: Addr<SyncGateRegistry>) -> Self {
        SyncGates { registry }
    }

    /// Holds the pod's relists until the returned hold ends or is dropped.
    pub async fn begin_sync(&self, uid: &str) -> Result<SyncHold, SyncError> {
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
            let token = NEXT_TOKEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let mut hold = SyncHold {
                gate: gate.clone(),
                token,
                ended: false,
            };
            match gate.send(BeginSync { token }).await {
                Ok(Ok(())) => return Ok(hold),
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
