//! What the actors' unit tests share besides the mock actors (`mock.rs`).

use std::time::{Duration, Instant};

/// Generous: CI machines are slow and shared.
pub const TIMEOUT: Duration = Duration::from_secs(20);

/// Polls `cond` every millisecond until it holds; panics with `what` after
/// [`TIMEOUT`]. Tests wait on conditions, never on fixed sleeps.
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
