//! `ringmaster sim`: a trace-driven simulator that measures placement policies on real data.
//!
//! Claims such as "less fragmentation, higher utilisation" must be measured, not asserted, and
//! operators need numbers to choose a policy. The simulator drives the same allocator code as
//! the master, the core's allocation cycle ([`ringmaster_core::placement::run_cycle`]), in
//! virtual time, next to the GPU-sharing policies of the ATC'23 "Beware of Fragmentation"
//! paper, on the same input.
//!
//! Pieces, one idea per file: [`trace`] reads node and task lists; [`gpu`] is a node's per-GPU
//! state; [`policies`] the paper's policies and FGD's target workload; [`engine`] the simulated
//! cluster and one decision; [`fill`] and [`replay`] the two modes; [`report`] tables and files;
//! [`plot`] the pictures. Definitions of every metric are in `docs/simulator.md`.

pub mod engine;
pub mod fill;
pub mod gpu;
pub mod plot;
pub mod policies;
pub mod replay;
pub mod report;
pub mod trace;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub use engine::{parse_policies, SimPolicy, Ties, Workload};
use fill::{FillRun, FIRST_SEED};
use replay::ReplayRun;
use report::{FillSummary, ReplaySummary};

use ringmaster_core::placement::RingsConfig;

/// How the trace is played.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Arrivals and departures at the trace's times.
    Replay,
    /// The ATC'23 paper's protocol: fill the GPU nodes until 130 % of capacity has arrived.
    Fill,
}

/// What `ringmaster sim` was asked to do.
#[derive(Clone, Debug)]
pub struct SimOptions {
    pub nodes: PathBuf,
    pub tasks: PathBuf,
    pub rings: RingsConfig,
    /// Tie rule of the paper's policies.
    pub ties: Ties,
    pub policies: Vec<SimPolicy>,
    pub mode: Mode,
    /// `fill`: seeds 42 … 42+seeds−1.
    pub seeds: u32,
    /// `fill`: stop when this % of GPU capacity has arrived.
    pub inflation_pct: u32,
    /// Where JSON, CSV and plots go (nothing written without it).
    pub out: Option<PathBuf>,
    /// Show a progress bar (only drawn when stderr is a terminal).
    pub progress: bool,
}

/// Why a simulation did not finish: bad input (exit code 2) or a failure while running.
#[derive(Debug, thiserror::Error)]
pub enum SimFailure {
    #[error("{0}")]
    Input(String),
    #[error("{0}")]
    Run(String),
}

/// Everything a run produced.
#[derive(Debug)]
pub enum SimResults {
    Fill {
        summaries: Vec<FillSummary>,
        runs: Vec<FillRun>,
    },
    Replay {
        summaries: Vec<ReplaySummary>,
        runs: Vec<ReplayRun>,
    },
}

impl SimResults {
    /// The summary table for the terminal.
    pub fn table(&self, inflation_pct: u32) -> String {
        match self {
            SimResults::Fill { summaries, .. } => report::fill_table(summaries, inflation_pct),
            SimResults::Replay { summaries, .. } => report::replay_table(summaries),
        }
    }
}

fn progress_bar(enabled: bool, len: u64, what: &str) -> ProgressBar {
    if !enabled || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) =
        ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} ({elapsed}, eta {eta})")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

/// Loads the trace and runs every policy; writes files when `out` is set.
pub fn run(options: &SimOptions) -> Result<SimResults, SimFailure> {
    let nodes = trace::load_nodes(&options.nodes).map_err(|e| SimFailure::Input(e.to_string()))?;
    let tasks = trace::load_tasks(&options.tasks).map_err(|e| SimFailure::Input(e.to_string()))?;
    let workload = Workload::new(nodes, tasks).map_err(|e| SimFailure::Input(e.to_string()))?;
    let results = match options.mode {
        Mode::Fill => run_fill_mode(&workload, options)?,
        Mode::Replay => run_replay_mode(&workload, options)?,
    };
    if let Some(dir) = &options.out {
        write_outputs(dir, &results, options.inflation_pct)?;
    }
    Ok(results)
}

fn run_fill_mode(workload: &Workload, options: &SimOptions) -> Result<SimResults, SimFailure> {
    if options.seeds == 0 {
        return Err(SimFailure::Input("--seeds must be at least 1".into()));
    }
    if !(1..=1000).contains(&options.inflation_pct) {
        return Err(SimFailure::Input(
            "the inflation must be 1 to 1000 percent".into(),
        ));
    }
    let gpu_nodes = fill::gpu_nodes(workload);
    if gpu_nodes.is_empty() {
        return Err(SimFailure::Input(format!(
            "{}: fill mode needs nodes with GPUs; this node list has none",
            options.nodes.display()
        )));
    }
    if workload.tasks.iter().all(|t| t.num_gpu == 0) {
        return Err(SimFailure::Input(format!(
            "{}: fill mode needs tasks that ask for GPUs; this task list has none",
            options.tasks.display()
        )));
    }
    let target = workload.target();
    let jobs: Vec<(SimPolicy, u64)> = options
        .policies
        .iter()
        .flat_map(|&p| (0..u64::from(options.seeds)).map(move |i| (p, FIRST_SEED + i)))
        .collect();
    let setup = fill::FillSetup {
        workload,
        target: &target,
        nodes: &gpu_nodes,
        rings: &options.rings,
        ties: options.ties,
        inflation_pct: options.inflation_pct,
    };
    let bar = progress_bar(options.progress, jobs.len() as u64, "fill");
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<Option<Result<FillRun, String>>>> =
        Mutex::new(jobs.iter().map(|_| None).collect());
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(jobs.len());
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(policy, seed)) = jobs.get(i) else {
                    break;
                };
                let run = fill::run_fill(&setup, policy, seed)
                    .map_err(|e| format!("{policy}, seed {seed}: {e}"));
                if let Ok(mut done) = done.lock() {
                    done[i] = Some(run);
                }
                bar.inc(1);
            });
        }
    });
    bar.finish_and_clear();
    let done = done
        .into_inner()
        .map_err(|_| SimFailure::Run("a simulation thread panicked".into()))?;
    let mut runs = Vec::with_capacity(done.len());
    for run in done {
        match run {
            Some(Ok(r)) => runs.push(r),
            Some(Err(e)) => return Err(SimFailure::Run(e)),
            None => return Err(SimFailure::Run("a simulation thread stopped early".into())),
        }
    }
    let summaries = report::summarise_fill(&runs, options.inflation_pct);
    Ok(SimResults::Fill { summaries, runs })
}

fn run_replay_mode(workload: &Workload, options: &SimOptions) -> Result<SimResults, SimFailure> {
    let target = workload.target();
    let bar = progress_bar(options.progress, options.policies.len() as u64, "replay");
    let mut runs = Vec::new();
    let mut summaries = Vec::new();
    for &policy in &options.policies {
        bar.set_message(format!("replay {policy}"));
        let start = Instant::now();
        let run = replay::run_replay(workload, &target, policy, &options.rings, options.ties)
            .map_err(|e| SimFailure::Run(format!("{policy}: {e}")))?;
        summaries.push(ReplaySummary::of(&run, start.elapsed().as_secs_f64()));
        runs.push(run);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(SimResults::Replay { summaries, runs })
}

fn write_outputs(
    dir: &PathBuf,
    results: &SimResults,
    inflation_pct: u32,
) -> Result<(), SimFailure> {
    std::fs::create_dir_all(dir)
        .map_err(|e| SimFailure::Run(format!("cannot create {}: {e}", dir.display())))?;
    let run_err = |e: report::WriteError| SimFailure::Run(e.to_string());
    match results {
        SimResults::Fill { summaries, runs } => {
            report::write_fill(dir, summaries, runs).map_err(run_err)?;
            plot::fill_plots(dir, summaries, inflation_pct)
                .map_err(|e| SimFailure::Run(e.to_string()))?;
        }
        SimResults::Replay { summaries, runs } => {
            report::write_replay(dir, summaries, runs).map_err(run_err)?;
            plot::replay_plots(dir, summaries, runs).map_err(|e| SimFailure::Run(e.to_string()))?;
        }
    }
    Ok(())
}
