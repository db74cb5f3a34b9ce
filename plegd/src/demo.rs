//! `plegd demo`: the built-in simulated runtime. A real CRI gRPC server on a
//! temporary unix socket, served on its own thread, with a churn workload; plegd
//! talks to it through the same tonic client it uses for containerd.

use std::sync::Arc;

use plegd_sim::{spawn_churn, spawn_in_thread, ChurnConfig, FakeRuntime};

use crate::cli::Workload;
use crate::exit::ExitError;
use crate::output::Format;
use crate::serve::{api_socket_path, connect, control_socket_path, serve, state_dir_path, Places};
use crate::service_config::ServiceConfig;
use crate::signals::Signals;

pub async fn run(
    workload: Workload,
    config: &ServiceConfig,
    signals: &mut Signals,
) -> Result<(), ExitError> {
    let dir = tempfile::Builder::new()
        .prefix("plegd-demo-")
        .tempdir()
        .map_err(ExitError::runtime("cannot create a temporary directory"))?;
    let socket = dir.path().join("cri.sock");
    let sim = FakeRuntime::new();
    let server = spawn_in_thread(&socket, sim.clone())
        .map_err(ExitError::runtime("cannot start the simulated runtime"))?;
    let churn = spawn_churn(
        sim,
        ChurnConfig {
            pods: workload.pods.get(),
            period: workload.churn_period.0,
            seed: workload.seed,
        },
    )
    .map_err(ExitError::runtime("cannot start the churn workload"))?;
    tracing::info!(endpoint = %server.endpoint(), pods = workload.pods.0, "simulated CRI runtime is up");

    let (runtime, version) = connect(&server.endpoint(), config).await?;
    let config = &config.for_runtime(&version);
    let until = async move {
        match workload.duration {
            Some(d) => actix_rt::time::sleep(d.0).await,
            None => std::future::pending().await,
        }
    };
    let api_socket = api_socket_path(config, || dir.path().join("plegd.sock"));
    if let Some(p) = &api_socket {
        tracing::info!(socket = %p.display(), "the demo's subscriber API socket (plegd watch --api-socket {})", p.display());
    }
    if let Some(p) = control_socket_path(config, api_socket.as_deref()) {
        tracing::info!(socket = %p.display(), "the demo's API control socket (Sync, RequestRelist; plegd status --clients --api-socket {})", p.display());
    }
    let state_dir = state_dir_path(config, || dir.path().join("state"));
    let result = serve(
        Arc::new(runtime),
        config,
        signals,
        Format::Text,
        Places {
            api_socket,
            state_dir,
        },
        until,
    )
    .await;
    churn.stop();
    server.stop();
    drop(dir);
    result
}
