//! Waiting in tests: on a condition, polled with a generous timeout (never a fixed
//! sleep standing in for synchronisation), and on events from a subscription.

use std::time::{Duration, Instant};

use plegd_actors::EventKind;
use plegd_actors::{Delivery, Subscription};

/// Generous: CI machines are slow and shared.
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// Polls `cond` until it holds; panics with `what` after `TIMEOUT`.
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Receives deliveries until one matches `pred`; returns all received so far.
pub async fn recv_until(
    sub: &Subscription,
    what: &str,
    mut pred: impl FnMut(&Delivery) -> bool,
) -> Vec<Delivery> {
    let deadline = Instant::now() + TIMEOUT;
    let mut got = Vec::new();
    loop {
        while let Ok(d) = sub.try_recv() {
            let hit = pred(&d);
            got.push(d);
            if hit {
                return got;
            }
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; got {:?}",
            got.iter()
                .map(|d| (d.event.kind, d.event.container_id.clone()))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Waits for an event of `kind` about `id`.
pub async fn expect_event(sub: &Subscription, kind: EventKind, id: &str) -> Delivery {
    let got = recv_until(sub, &format!("{kind} of {id}"), |d| {
        d.event.kind == kind && d.event.container_id == id
    })
    .await;
    got.into_iter()
        .last()
        .expect("recv_until returns the match last")
}

/// Everything queued right now.
pub fn drain(sub: &Subscription) -> Vec<Delivery> {
    sub.try_iter().collect()
}
