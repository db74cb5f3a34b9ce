//! `plegd demo`: the built-in simulated runtime. A real CRI gRPC server on a
//! temporary unix socket, served on its own thread, with a churn workload; plegd
//! talks to it through the same tonic client it uses for containerd.

use std::sync::Arc;

use anyhow::anyhow;
use plegd_runtime::CriRuntime;
use plegd_sim::{spawn_churn, spawn_in_thread, ChurnConfig, FakeRuntime};

use crate::cli::DemoArgs;
use crate::output::Format;
use crate::serve::{log_runtime, serve, start_error};
use crate::Failure;

pub async fn run(args: DemoArgs) -> Result<(), Failure> {
    let dir = tempfile::Builder::new()
        .prefix("plegd-demo-")
        .tempdir()
        .map_err(|e| Failure::Runtime(anyhow!("cannot create a temporary directory: {e}")))?;
    let socket = dir.path().join("cri.sock");
    let sim = FakeRuntime::new();
    let server = spawn_in_thread(&socket, sim.clone())
        .map_err(|e| Failure::Runtime(anyhow!("cannot start the simulated runtime: {e}")))?;
    let churn = spawn_churn(
        sim,
        ChurnConfig {
            pods: args.pods as usize,
            period: args.churn_period,
            seed: args.seed,
        },
    )
    .map_err(|e| Failure::Runtime(anyhow!("cannot start the churn workload: {e}")))?;
    tracing::info!(endpoint = %server.endpoint(), pods = args.pods, "simulated CRI runtime is up");

    let runtime = CriRuntime::new(&server.endpoint(), args.common.runtime_request_timeout)
        .map_err(start_error)?;
    let version = runtime.check().await.map_err(start_error)?;
    log_runtime(&version);

    let until = async move {
        match args.duration {
            Some(d) => actix_rt::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    let result = serve(Arc::new(runtime), &args.common, Format::Text, until).await;
    churn.stop();
    server.stop();
    drop(dir);
    result
}
