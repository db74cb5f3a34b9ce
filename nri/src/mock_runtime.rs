//! A mock NRI runtime for tests (feature `mock-runtime`): the runtime's side of the
//! protocol as containerd/nri's `pkg/adaptation` behaves — listen on the NRI socket,
//! multiplex each plugin connection, serve `RegisterPlugin` on connection 2 (checking
//! the name and the two-digit index), then call the plugin on connection 1:
//! `Configure`, `Synchronize` in pages (a page must be answered with the same `more`
//! and no updates), and the hooks. Every call has the runtime's request timeout; a
//! plugin that misses it is disconnected, as the runtime does.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tokio::net::UnixListener;
use tokio::sync::watch;
use ttrpc::r#async::transport::{Listener, Socket};
use ttrpc::r#async::{Client, Server, TtrpcContext};

use crate::api;
use crate::mux::{multiplex, MuxEnd, MuxTask};

/// NRI's default request timeout.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum MockError {
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("ttRPC: {0}")]
    Rpc(ttrpc::Error),
    #[error("the plugin did not answer within {0:?}: disconnected")]
    Timeout(Duration),
    #[error("the plugin did not register within {0:?}")]
    NoRegistration(Duration),
    #[error("the plugin broke the protocol: {0}")]
    Protocol(String),
    #[error("the connection is closed")]
    Closed,
}

/// What the plugin sent in `RegisterPlugin`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Registration {
    pub name: String,
    pub index: String,
    pub nri_version: String,
}

/// The runtime's NRI socket.
pub struct MockRuntime {
    listener: UnixListener,
    path: PathBuf,
    request_timeout: Duration,
}

impl MockRuntime {
    pub fn bind(path: &Path, request_timeout: Duration) -> io::Result<Self> {
        Ok(Self {
            listener: UnixListener::bind(path)?,
            path: path.to_owned(),
            request_timeout,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accepts the next plugin connection and waits for its registration.
    pub async fn accept(&self) -> Result<PluginConn, MockError> {
        let (trunk, _) = self.listener.accept().await?;
        let mux = multiplex(trunk);
        let (registered_tx, mut registered_rx) = watch::channel(None);
        let incoming = futures::stream::iter([Ok::<_, io::Error>(mux.runtime_service)]);
        let mut server = Server::new()
            .add_listener(Listener::new(incoming))
            .register_service(api::create_runtime(Arc::new(RuntimeService {
                registered_tx,
            })));
        server.start().await.map_err(MockError::Rpc)?;
        let client = api::PluginClient::new(Client::new(Socket::new(mux.plugin_service)));
        let mut mux_task = mux.task;
        let registration = tokio::select! {
            r = tokio::time::timeout(REGISTRATION_TIMEOUT, registered_rx.wait_for(Option::is_some)) => match r {
                Ok(Ok(reg)) => reg.clone().unwrap_or_default(),
                _ => return Err(MockError::NoRegistration(REGISTRATION_TIMEOUT)),
            },
            _ = mux_task.ended() => return Err(MockError::Closed),
        };
        Ok(PluginConn {
            registration,
            client,
            mux_task: Mutex::new(Some(mux_task)),
            _server: server,
            request_timeout: self.request_timeout,
        })
    }
}

struct RuntimeService {
    registered_tx: watch::Sender<Option<Registration>>,
}

#[async_trait]
impl api::Runtime for RuntimeService {
    async fn register_plugin(
        &self,
        _ctx: &TtrpcContext,
        req: api::RegisterPluginRequest,
    ) -> ttrpc::Result<api::Empty> {
        let index_ok =
            req.plugin_idx.len() == 2 && req.plugin_idx.bytes().all(|b| b.is_ascii_digit());
        if req.plugin_name.is_empty() || !index_ok {
            return Err(ttrpc::Error::RpcStatus(ttrpc::get_status(
                ttrpc::Code::INVALID_ARGUMENT,
                format!(
                    "invalid plugin name {:?} or index {:?}",
                    req.plugin_name, req.plugin_idx
                ),
            )));
        }
        self.registered_tx.send_replace(Some(Registration {
            name: req.plugin_name,
            index: req.plugin_idx,
            nri_version: req.nri_version,
        }));
        Ok(api::Empty {})
    }
}

/// One registered plugin, seen from the runtime.
pub struct PluginConn {
    pub registration: Registration,
    client: api::PluginClient,
    mux_task: Mutex<Option<MuxTask>>,
    _server: Server,
    request_timeout: Duration,
}

impl PluginConn {
    /// Calls the plugin with the runtime's timeout; a miss disconnects it. Returns the
    /// answer and how long it took.
    async fn call<T, F>(&self, call: F) -> Result<(T, Duration), MockError>
    where
        F: std::future::Future<Output = ttrpc::Result<T>>,
    {
        let start = Instant::now();
        match tokio::time::timeout(self.request_timeout, call).await {
            Ok(Ok(answer)) => Ok((answer, start.elapsed())),
            // The ttRPC client's own deadline (the same timeout, sent on the wire).
            Ok(Err(_)) if start.elapsed() >= self.request_timeout => {
                self.disconnect();
                Err(MockError::Timeout(self.request_timeout))
            }
            Ok(Err(e)) => Err(MockError::Rpc(e)),
            Err(_) => {
                self.disconnect();
                Err(MockError::Timeout(self.request_timeout))
            }
        }
    }

    fn ctx(&self) -> ttrpc::context::Context {
        ttrpc::context::with_duration(self.request_timeout)
    }

    /// Closes the connection, as the runtime does to a plugin that timed out or when
    /// it stops.
    pub fn disconnect(&self) {
        let task = match self.mux_task.lock() {
            Ok(mut t) => t.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        drop(task);
    }

    /// Waits until the plugin closes the connection.
    pub async fn closed(&self) -> MuxEnd {
        let task = match self.mux_task.lock() {
            Ok(mut t) => t.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        match task {
            Some(mut task) => task.ended().await,
            None => MuxEnd::LocalClosed,
        }
    }

    /// `Configure`; returns the plugin's event mask.
    pub async fn configure(&self) -> Result<i32, MockError> {
        let req = api::ConfigureRequest {
            config: String::new(),
            runtime_name: "mock-nri-runtime".into(),
            runtime_version: "0.0.0".into(),
            registration_timeout: REGISTRATION_TIMEOUT.as_millis() as i64,
            request_timeout: self.request_timeout.as_millis() as i64,
            nri_version: "v0.12.2".into(),
        };
        let (rpl, _) = self.call(self.client.configure(self.ctx(), &req)).await?;
        Ok(rpl.events)
    }

    /// `Synchronize` in pages of at most `page` pods and `page` containers; returns the
    /// number of pages. Checks each answer as the runtime does.
    pub async fn synchronize(
        &self,
        pods: &[api::PodSandbox],
        containers: &[api::Container],
        page: usize,
    ) -> Result<usize, MockError> {
        let page = page.max(1);
        let (mut pods, mut containers) = (pods, containers);
        let mut pages = 0;
        loop {
            let (p, rest_p) = pods.split_at(page.min(pods.len()));
            let (c, rest_c) = containers.split_at(page.min(containers.len()));
            let more = !rest_p.is_empty() || !rest_c.is_empty();
            let req = api::SynchronizeRequest {
                pods: p.to_vec(),
                containers: c.to_vec(),
                more,
            };
            let (rpl, _) = self.call(self.client.synchronize(self.ctx(), &req)).await?;
            pages += 1;
            if more && (rpl.more != more || !rpl.update.is_empty()) {
                self.disconnect();
                return Err(MockError::Protocol(
                    "plugin does not handle split sync requests".into(),
                ));
            }
            if !rpl.update.is_empty() {
                return Err(MockError::Protocol(
                    "an observe-only plugin asked for updates".into(),
                ));
            }
            if !more {
                return Ok(pages);
            }
            (pods, containers) = (rest_p, rest_c);
        }
    }

    pub async fn stop_container(
        &self,
        pod: &api::PodSandbox,
        ctr: &api::Container,
    ) -> Result<Duration, MockError> {
        let req = api::StopContainerRequest {
            pod: Some(pod.clone()),
            container: Some(ctr.clone()),
        };
        let (rpl, took) = self
            .call(self.client.stop_container(self.ctx(), &req))
            .await?;
        if !rpl.update.is_empty() {
            return Err(MockError::Protocol(
                "an observe-only plugin asked for updates".into(),
            ));
        }
        Ok(took)
    }

    pub async fn remove_container(
        &self,
        pod: &api::PodSandbox,
        ctr: &api::Container,
    ) -> Result<Duration, MockError> {
        let req = api::RemoveContainerRequest {
            pod: Some(pod.clone()),
            container: Some(ctr.clone()),
        };
        Ok(self
            .call(self.client.remove_container(self.ctx(), &req))
            .await?
            .1)
    }

    pub async fn stop_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<Duration, MockError> {
        let req = api::StopPodSandboxRequest {
            pod: Some(pod.clone()),
        };
        Ok(self
            .call(self.client.stop_pod_sandbox(self.ctx(), &req))
            .await?
            .1)
    }

    pub async fn remove_pod_sandbox(&self, pod: &api::PodSandbox) -> Result<Duration, MockError> {
        let req = api::RemovePodSandboxRequest {
            pod: Some(pod.clone()),
        };
        Ok(self
            .call(self.client.remove_pod_sandbox(self.ctx(), &req))
            .await?
            .1)
    }

    /// The pre-v0.12 delivery of an event: `StateChange`.
    pub async fn state_change(
        &self,
        event: api::Event,
        pod: &api::PodSandbox,
        ctr: Option<&api::Container>,
    ) -> Result<Duration, MockError> {
        let req = api::StateChangeEvent {
            event: event as i32,
            pod: Some(pod.clone()),
            container: ctr.cloned(),
        };
        Ok(self
            .call(self.client.state_change(self.ctx(), &req))
            .await?
            .1)
    }
}

/// A pod as the runtime describes it.
pub fn pod(uid: &str, name: &str, namespace: &str, sandbox_id: &str) -> api::PodSandbox {
    api::PodSandbox {
        id: sandbox_id.into(),
        name: name.into(),
        uid: uid.into(),
        namespace: namespace.into(),
        ..Default::default()
    }
}

/// A container of the sandbox `sandbox_id`.
pub fn container(id: &str, sandbox_id: &str, name: &str) -> api::Container {
    api::Container {
        id: id.into(),
        pod_sandbox_id: sandbox_id.into(),
        name: name.into(),
        state: api::ContainerState::ContainerStopped as i32,
        ..Default::default()
    }
}
