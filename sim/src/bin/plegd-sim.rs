//! `plegd-sim`: the simulated CRI runtime as a process of its own, so that a benchmark
//! (`plegd-bench`) measures plegd's CPU and memory apart from the runtime's. It fills
//! the node with `--pods` ready pods of `--containers` running containers each, serves
//! CRI on `--socket`, prints `ready` on stdout, and runs until SIGTERM or SIGINT. The
//! CRI lifecycle calls (StopContainer, RunPodSandbox, ...) script it from then on.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use plegd_sim::kubelet::{self, Kubelet};
use plegd_sim::{serve_unix, FakeRuntime, ListServing};

#[derive(Parser)]
#[command(
    name = "plegd-sim",
    about = "The simulated CRI runtime, serving on a unix socket"
)]
struct Args {
    /// The unix socket to serve CRI on (absolute path; its directory must exist).
    #[arg(long)]
    socket: PathBuf,
    /// Ready pods on the node at start.
    #[arg(long, default_value_t = 0)]
    pods: usize,
    /// Running containers in each of those pods (besides the sandbox).
    #[arg(long, default_value_t = 2)]
    containers: usize,
    /// The light node: short IDs, pods named `bench-N` with no labels, no
    /// annotations. Without it the node is a realistic one (plegd_sim::kubelet):
    /// containerd's 64-hex IDs, Deployment pods with kubelet's labels and annotations.
    #[arg(long)]
    light: bool,
    /// On the realistic node, every this-many-th sandbox (0: none) carries one more
    /// annotation of --heavy-bytes bytes.
    #[arg(long, default_value_t = 0)]
    heavy_every: usize,
    #[arg(long, default_value_t = 2048)]
    heavy_bytes: usize,
    /// Serve CRI's streaming list calls (StreamPodSandboxes, StreamContainers), as
    /// containerd from 2.4 does; without it they answer UNIMPLEMENTED.
    #[arg(long)]
    list_streaming: bool,
    /// Entries per streamed list message (containerd sends 5000).
    #[arg(long, default_value_t = 5000)]
    stream_batch: usize,
    /// Refuse to send a list message larger than this many bytes, as a gRPC server's
    /// send limit does (containerd's: 16777216). Default: no limit.
    #[arg(long)]
    max_send_message_size: Option<usize>,
}

/// A pod UID as Kubernetes makes them (36 characters), so that plegd's memory per pod
/// is measured with realistic key lengths.
fn uid(i: usize) -> String {
    format!("{:08x}-0000-4000-8000-{:012x}", i, i)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("plegd-sim: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    rt.block_on(async move {
        let runtime = if args.light {
            FakeRuntime::new()
        } else {
            FakeRuntime::with_kubelet(Kubelet {
                heavy_every: args.heavy_every,
                heavy_bytes: args.heavy_bytes,
            })
        };
        runtime.set_list_serving(ListServing {
            send_limit: args.max_send_message_size,
            streaming: args.list_streaming,
            stream_batch: args.stream_batch,
        });
        for i in 0..args.pods {
            let sandbox = if args.light {
                runtime.run_pod(&uid(i), &format!("bench-{i}"), "bench")
            } else {
                let (name, labels) = kubelet::deployment_pod(i);
                runtime.run_pod_with_labels(&uid(i), &name, "bench", labels)
            };
            for c in 0..args.containers {
                runtime.run_container(&sandbox, &format!("app-{c}"));
            }
        }
        let server = match serve_unix(&args.socket, runtime).await {
            Ok(s) => s,
            Err(e) => {
                eprintln!("plegd-sim: {e}");
                return ExitCode::FAILURE;
            }
        };
        println!("ready {}", server.endpoint());
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("plegd-sim: cannot handle SIGTERM: {e}");
                    return ExitCode::FAILURE;
                }
            };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        drop(server);
        ExitCode::SUCCESS
    })
}
