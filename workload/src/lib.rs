//! plegd-workload: the compose demo's workload generator. It plays `plegd demo`'s
//! churn (`plegd_sim::Churn`) against a real CRI runtime through [`CriChurn`], so a
//! plegd watching the same runtime has pods coming and going to report. A library
//! as well as a binary so that tests can parse the deployment files' arguments with
//! the real [`Args`].

pub mod cli;
pub mod cri_churn;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use plegd_sim::Churn;
use tokio::signal::unix::{signal, SignalKind};

pub use cli::Args;
pub use cri_churn::{CriChurn, PodTemplate};

/// Runs the workload until SIGTERM/SIGINT or `--steps`, then removes its pods.
pub fn run(args: Args) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;

    // Signals set a flag and wake the step loop; the step in progress finishes first.
    let stopping = Arc::new(AtomicBool::new(false));
    let (wake, woken) = mpsc::channel::<()>();
    let (mut term, mut int) = rt
        .block_on(async {
            Ok::<_, std::io::Error>((
                signal(SignalKind::terminate())?,
                signal(SignalKind::interrupt())?,
            ))
        })
        .context("cannot install the signal handlers")?;
    let flag = Arc::clone(&stopping);
    rt.spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!("{name}: removing the pods and stopping");
        flag.store(true, Ordering::SeqCst);
        let _ = wake.send(());
    });

    let template = PodTemplate {
        image: args.image.clone(),
        log_root: args.log_root.clone(),
    };
    let cri = CriChurn::new(
        rt.handle().clone(),
        &args.runtime_endpoint,
        args.request_timeout,
        template,
    )?;
    let Some(version) = cri.wait_for_runtime(args.wait, || stopping.load(Ordering::SeqCst))? else {
        return Ok(());
    };
    tracing::info!(
        "runtime {} {} (CRI {}) at {}",
        version.runtime_name,
        version.runtime_version,
        version.runtime_api_version,
        args.runtime_endpoint
    );
    cri.ensure_image()?;
    cri.remove_leftovers()
        .context("cannot remove the pods of an earlier run")?;

    let seed = args.seed.unwrap_or_else(clock_seed);
    tracing::info!(
        "seed {seed}, {} pods, one step every {}, image {}",
        args.pods,
        humantime::format_duration(args.period),
        args.image
    );
    let mut churn = Churn::new(cri, args.pods as usize, seed);
    let mut steps = 0u64;
    while args.steps.is_none_or(|n| steps < n) {
        match woken.recv_timeout(args.period) {
            Err(RecvTimeoutError::Timeout) => {}
            Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
        }
        let step = churn.step();
        tracing::debug!(?step, "step {steps}");
        steps += 1;
    }
    let removed = churn.remove_pods();
    tracing::info!(
        "stopped after {steps} steps ({} runtime calls failed); removed {removed} sandboxes",
        churn.stats().errors
    );
    drop(churn);
    rt.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

/// A seed from the clock, for runs that do not name one.
fn clock_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() ^ u64::from(d.subsec_nanos()))
}
