//! A runtime that is the fake one except where a test says otherwise: implement
//! [`Intercept`] — `inner()` plus only the calls to change — and wrap it in
//! [`Intercepted`] to get a `RuntimeClient`. Tests that block, fail or spy on chosen
//! calls then never repeat the pass-through of the others.

use async_trait::async_trait;
use plegd_runtime::containerd_events::TaskEventStream;
use plegd_runtime::{
    Container, ContainerStatus, EventStream, RuntimeClient, RuntimeError, RuntimeVersion, Sandbox,
};

use crate::fake::FakeRuntime;

/// The calls of a `RuntimeClient`, each passed to [`Self::inner`] unless overridden.
#[async_trait]
pub trait Intercept: Send + Sync + 'static {
    /// The runtime every call not overridden goes to.
    fn inner(&self) -> &FakeRuntime;

    async fn version(&self) -> Result<RuntimeVersion, RuntimeError> {
        self.inner().version().await
    }
    async fn list_sandboxes(&self, id: Option<&str>) -> Result<Vec<Sandbox>, RuntimeError> {
        self.inner().list_sandboxes(id).await
    }
    async fn list_containers(&self, sb: Option<&str>) -> Result<Vec<Container>, RuntimeError> {
        self.inner().list_containers(sb).await
    }
    async fn sandbox_status(&self, id: &str) -> Result<Sandbox, RuntimeError> {
        self.inner().sandbox_status(id).await
    }
    async fn container_status(&self, id: &str) -> Result<ContainerStatus, RuntimeError> {
        self.inner().container_status(id).await
    }
    async fn container_events(&self) -> Result<EventStream, RuntimeError> {
        self.inner().container_events().await
    }
    async fn task_events(&self) -> Result<TaskEventStream, RuntimeError> {
        self.inner().task_events().await
    }
}

/// An [`Intercept`] as a `RuntimeClient` (and, through `Deref`, still itself).
#[derive(Clone, Default)]
pub struct Intercepted<T>(pub T);

impl<T> std::ops::Deref for Intercepted<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

#[async_trait]
impl<T: Intercept> RuntimeClient for Intercepted<T> {
    async fn version(&self) -> Result<RuntimeVersion, RuntimeError> {
        Intercept::version(&self.0).await
    }
    async fn list_sandboxes(&self, id: Option<&str>) -> Result<Vec<Sandbox>, RuntimeError> {
        Intercept::list_sandboxes(&self.0, id).await
    }
    async fn list_containers(&self, sb: Option<&str>) -> Result<Vec<Container>, RuntimeError> {
        Intercept::list_containers(&self.0, sb).await
    }
    async fn sandbox_status(&self, id: &str) -> Result<Sandbox, RuntimeError> {
        Intercept::sandbox_status(&self.0, id).await
    }
    async fn container_status(&self, id: &str) -> Result<ContainerStatus, RuntimeError> {
        Intercept::container_status(&self.0, id).await
    }
    async fn container_events(&self) -> Result<EventStream, RuntimeError> {
        Intercept::container_events(&self.0).await
    }
    async fn task_events(&self) -> Result<TaskEventStream, RuntimeError> {
        Intercept::task_events(&self.0).await
    }
}
