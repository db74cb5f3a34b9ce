//! `FakeRuntime` scripting made fallible for callers that act on IDs which may vanish
//! concurrently (the CRI server, the churn workload).
//!
//! `FakeRuntime::create_container` asserts that its sandbox exists: a test-bug guard
//! that would otherwise panic a server task. We check first (without counting a
//! runtime call) and contain the assertion if the sandbox goes away in between.

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::fake::FakeRuntime;

/// Creates a container, or `None` if the sandbox does not exist. With `pod_uid` the
/// existence check is done up front; without it only the assertion is contained
/// (which still prints a panic message).
pub(crate) fn create_container(
    runtime: &FakeRuntime,
    pod_uid: Option<&str>,
    sandbox_id: &str,
    name: &str,
) -> Option<String> {
    if let Some(uid) = pod_uid {
        if !runtime.sandboxes_of(uid).iter().any(|s| s == sandbox_id) {
            return None;
        }
    }
    // FakeRuntime asserts before mutating and recovers a poisoned lock, so its state is
    // consistent after an unwind.
    catch_unwind(AssertUnwindSafe(|| {
        runtime.create_container(sandbox_id, name)
    }))
    .ok()
}
