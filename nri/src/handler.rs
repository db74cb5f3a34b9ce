//! plegd's side of the NRI plugin service: the calls the runtime makes. Every answer
//! is immediate — a hook only hands a hint to the [`HintSink`] — because the runtime
//! blocks the container's lifecycle on it and disconnects a plugin that misses its
//! request timeout. Nothing is ever adjusted: every response is empty.
//!
//! Runtimes built with NRI before v0.12 (containerd 1.7, 2.1) deliver pod events and
//! RemoveContainer through `StateChange`; v0.12 tries the dedicated RPC first and falls
//! back to `StateChange` only if the plugin answers Unimplemented. Both are served.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use tokio::sync::watch;
use ttrpc::r#async::TtrpcContext;

use crate::api;
use crate::hint::{Change, HintSink, NriHint};

/// The events plegd subscribes to: the stops and removals of containers and sandboxes.
/// (Synchronize needs no subscription: every plugin gets it after Configure.)
pub const EVENTS: [api::Event; 4] = [
    api::Event::StopPodSandbox,
    api::Event::RemovePodSandbox,
    api::Event::StopContainer,
    api::Event::RemoveContainer,
];

/// The NRI event mask of `events`: bit `e - 1` for each event `e`.
pub fn event_mask(events: &[api::Event]) -> i32 {
    events
        .iter()
        .filter(|e| **e != api::Event::Unknown)
        .fold(0, |mask, e| mask | 1 << (*e as i32 - 1))
}

/// What Configure told the plugin about the runtime.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeInfo {
    pub name: String,
    pub version: String,
    /// The runtime's own NRI version (empty before NRI v0.12).
    pub nri_version: String,
    /// How long the runtime waits for each answer (0: not told, before NRI v0.8).
    pub request_timeout_ms: i64,
}

/// Counts of what the runtime sent, for tests and the log.
#[derive(Debug, Default)]
pub struct Counters {
    pub hooks: AtomicU64,
    pub sync_pages: AtomicU64,
    pub syncs: AtomicU64,
}

pub(crate) struct PluginService {
    sink: Arc<dyn HintSink>,
    configured: watch::Sender<Option<RuntimeInfo>>,
    /// Pods and containers of the Synchronize pages seen so far.
    sync_pending: Mutex<(usize, usize)>,
    counters: Arc<Counters>,
}

impl PluginService {
    pub(crate) fn new(
        sink: Arc<dyn HintSink>,
        configured: watch::Sender<Option<RuntimeInfo>>,
        counters: Arc<Counters>,
    ) -> Self {
        Self {
            sink,
            configured,
            sync_pending: Mutex::new((0, 0)),
            counters,
        }
    }

    fn hook(&self, hint: Option<NriHint>) {
        self.counters.hooks.fetch_add(1, Ordering::Relaxed);
        match hint {
            Some(hint) => self.sink.hint(hint),
            None => tracing::debug!("NRI hook without a container or pod id ignored"),
        }
    }
}

#[async_trait]
impl api::Plugin for PluginService {
    async fn configure(
        &self,
        _ctx: &TtrpcContext,
        req: api::ConfigureRequest,
    ) -> ttrpc::Result<api::ConfigureResponse> {
        let info = RuntimeInfo {
            name: req.runtime_name,
            version: req.runtime_version,
            nri_version: req.nri_version,
            request_timeout_ms: req.request_timeout,
        };
        tracing::info!(
            runtime = %info.name, version = %info.version, nri_version = %info.nri_version,
            request_timeout_ms = info.request_timeout_ms,
            "NRI: configured by the runtime"
        );
        self.configured.send_replace(Some(info));
        Ok(api::ConfigureResponse {
            events: event_mask(&EVENTS),
        })
    }

    async fn synchronize(
        &self,
        _ctx: &TtrpcContext,
        req: api::SynchronizeRequest,
    ) -> ttrpc::Result<api::SynchronizeResponse> {
        self.counters.sync_pages.fetch_add(1, Ordering::Relaxed);
        let done = {
            let mut pending = match self.sync_pending.lock() {
                Ok(p) => p,
                Err(poisoned) => poisoned.into_inner(),
            };
            pending.0 += req.pods.len();
            pending.1 += req.containers.len();
            (!req.more).then(|| std::mem::take(&mut *pending))
        };
        if let Some((pods, containers)) = done {
            self.counters.syncs.fetch_add(1, Ordering::Relaxed);
            self.sink.hint(NriHint::Synchronized { pods, containers });
        }
        // A page is acknowledged by echoing `more`, with no updates: the runtime drops a
        // plugin that answers a page otherwise.
        Ok(api::SynchronizeResponse {
            update: Vec::new(),
            more: req.more,
        })
    }

    async fn shutdown(&self, _ctx: &TtrpcContext, _req: api::Empty) -> ttrpc::Result<api::Empty> {
        tracing::info!("NRI: the runtime is shutting down");
        Ok(api::Empty {})
    }

    async fn stop_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::StopContainerRequest,
    ) -> ttrpc::Result<api::StopContainerResponse> {
        self.hook(NriHint::container(
            Change::Stopped,
            req.pod.as_ref(),
            req.container.as_ref(),
        ));
        Ok(api::StopContainerResponse::default())
    }

    async fn remove_container(
        &self,
        _ctx: &TtrpcContext,
        req: api::RemoveContainerRequest,
    ) -> ttrpc::Result<api::RemoveContainerResponse> {
        self.hook(NriHint::container(
            Change::Removed,
            req.pod.as_ref(),
            req.container.as_ref(),
        ));
        Ok(api::RemoveContainerResponse::default())
    }

    async fn stop_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::StopPodSandboxRequest,
    ) -> ttrpc::Result<api::StopPodSandboxResponse> {
        self.hook(NriHint::sandbox(Change::Stopped, req.pod.as_ref()));
        Ok(api::StopPodSandboxResponse::default())
    }

    async fn remove_pod_sandbox(
        &self,
        _ctx: &TtrpcContext,
        req: api::RemovePodSandboxRequest,
    ) -> ttrpc::Result<api::RemovePodSandboxResponse> {
        self.hook(NriHint::sandbox(Change::Removed, req.pod.as_ref()));
        Ok(api::RemovePodSandboxResponse::default())
    }

    async fn state_change(
        &self,
        _ctx: &TtrpcContext,
        req: api::StateChangeEvent,
    ) -> ttrpc::Result<api::Empty> {
        let pod = req.pod.as_ref();
        let ctr = req.container.as_ref();
        let hint = match api::Event::try_from(req.event) {
            Ok(api::Event::StopContainer) => NriHint::container(Change::Stopped, pod, ctr),
            Ok(api::Event::RemoveContainer) => NriHint::container(Change::Removed, pod, ctr),
            Ok(api::Event::StopPodSandbox) => NriHint::sandbox(Change::Stopped, pod),
            Ok(api::Event::RemovePodSandbox) => NriHint::sandbox(Change::Removed, pod),
            _ => {
                // Not subscribed: a runtime that sends it anyway gets an answer, no hint.
                tracing::debug!(event = req.event, "NRI state change ignored");
                self.counters.hooks.fetch_add(1, Ordering::Relaxed);
                return Ok(api::Empty {});
            }
        };
        self.hook(hint);
        Ok(api::Empty {})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mask_has_bit_e_minus_1_for_each_event() {
        // STOP_POD_SANDBOX=2, REMOVE_POD_SANDBOX=3, STOP_CONTAINER=10, REMOVE_CONTAINER=11.
        assert_eq!(event_mask(&EVENTS), 0b110_0000_0110);
        assert_eq!(event_mask(&[api::Event::RunPodSandbox]), 1);
        assert_eq!(event_mask(&[api::Event::Unknown]), 0);
    }
}
