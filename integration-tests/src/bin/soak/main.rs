//! `soak`: the long soak — plegd (a built binary, as its own process)
//! against the simulated CRI runtime with steady churn and periodic runtime restarts,
//! sampled into a CSV and plotted. The engine is `integration_tests::soak`, shared
//! with the two-minute CI test (`plegd/tests/soak.rs`); this adds the command line,
//! progress output, a summary and the plot.
//!
//! ```text
//! cargo build --release -p plegd -p integration-tests --bin plegd --bin soak
//! nice -n 5 target/release/soak --duration 1h --csv docs/soak.csv --plot docs/soak.png
//! target/release/soak --plot-only --csv docs/soak.csv --plot docs/soak.png
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use integration_tests::soak::{self, GrowthLimits, Sample, SoakConfig};

mod plot;

#[derive(Parser, Debug)]
#[command(about = "Soak plegd against the simulated CRI runtime; sample RSS, threads, fds, events")]
struct Cli {
    /// The plegd binary (default: `plegd` next to this executable).
    #[arg(long)]
    plegd: Option<PathBuf>,
    /// How long to run.
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Pods the churn keeps.
    #[arg(long, default_value_t = 50)]
    pods: usize,
    /// Time between churn steps.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    churn_period: Duration,
    /// Time between runtime restarts ("0s": none).
    #[arg(long, default_value = "3m", value_parser = humantime::parse_duration)]
    restart_every: Duration,
    /// How long the runtime stays down at each restart.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    restart_pause: Duration,
    /// Time between samples.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    sample_every: Duration,
    /// Seed of the churn.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the samples here as CSV (as they are taken).
    #[arg(long)]
    csv: Option<PathBuf>,
    /// Draw RSS, threads, fds and events over time into this PNG at the end.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Only draw --plot from an existing --csv; run nothing.
    #[arg(long, requires_all = ["csv", "plot"])]
    plot_only: bool,
    /// A TTF font for the plot's text (default: DejaVu Sans if installed; "none" or
    /// no font found: a plot without text).
    #[arg(long)]
    font: Option<PathBuf>,
    /// Write plegd's logs (stderr) here too.
    #[arg(long)]
    plegd_log: Option<PathBuf>,
    /// Exit 1 when the growth check (CI's, with the default limits) finds growth, or
    /// plegd did not exit 0 on SIGTERM at the end.
    #[arg(long)]
    check: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("soak: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> Result<ExitCode, Box<dyn std::error::Error>> {
    if cli.plot_only {
        if let (Some(csv), Some(png)) = (&cli.csv, &cli.plot) {
            let samples = soak::read_csv(csv)?;
            plot::draw(&samples, png, cli.font.as_deref())?;
            eprintln!(
                "soak: plotted {} samples into {}",
                samples.len(),
                png.display()
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    let plegd = match &cli.plegd {
        Some(p) => p.clone(),
        None => std::env::current_exe()?
            .parent()
            .map(|dir| dir.join("plegd"))
            .ok_or("cannot tell where this executable is; give --plegd")?,
    };
    let cfg = SoakConfig {
        plegd,
        duration: cli.duration,
        pods: cli.pods,
        churn_period: cli.churn_period,
        restart_every: (!cli.restart_every.is_zero()).then_some(cli.restart_every),
        restart_pause: cli.restart_pause,
        sample_every: cli.sample_every,
        seed: cli.seed,
        csv: cli.csv.clone(),
        plegd_args: Vec::new(),
        plegd_log: cli.plegd_log.clone(),
    };
    eprintln!("soak: {cfg:?}");
    let report = soak::run(&cfg, |s| {
        eprintln!(
            "soak: t={:>7.1}s rss={} kB threads={} fds={} events={} relists={} restarts={}",
            s.time_s,
            s.rss_kb,
            s.threads,
            s.fds,
            s.events,
            s.relists.unwrap_or(0),
            s.restarts
        );
    })?;
    summarize(&report.samples);
    eprintln!(
        "soak: {} restarts, {} stdout lines marked missed, plegd exit after SIGTERM: {}",
        report.restarts,
        report.missed_lines,
        report
            .exit
            .map_or("killed (did not stop in time)".to_string(), |s| s
                .to_string())
    );
    if let Some(png) = &cli.plot {
        plot::draw(&report.samples, png, cli.font.as_deref())?;
        eprintln!("soak: plot in {}", png.display());
    }
    let problems = soak::check_growth(&report.samples, &GrowthLimits::default());
    for p in &problems {
        eprintln!("soak: growth check: {p}");
    }
    let clean_exit = report.exit.is_some_and(|s| s.success());
    Ok(if cli.check && (!problems.is_empty() || !clean_exit) {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Start, end and maximum of the resource figures, for docs/soak.md.
fn summarize(samples: &[Sample]) {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        return;
    };
    let rss: fn(&Sample) -> u64 = |s| s.rss_kb;
    for (what, f) in [
        ("rss_kb", rss),
        ("threads", |s: &Sample| s.threads),
        ("fds", |s: &Sample| s.fds),
    ] {
        let max = samples.iter().map(f).max().unwrap_or(0);
        eprintln!("soak: {what}: start {} end {} max {max}", f(first), f(last));
    }
    eprintln!(
        "soak: {:.0} s, {} events on stdout ({:?} counted by plegd), {:?} global relists, {} churn steps",
        last.time_s, last.events, last.events_metric, last.relists, last.churn_steps
    );
}
