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
//! cluster and one decision; [`cache`] the policies' score cache; [`fill`] and [`replay`] the two modes; [`mix`] variants of the task
//! list with other workload mixes; [`report`] tables and files; [`plot`] the pictures. Definitions of every metric are in `docs/simulator.md`.

pub mod cache;
pub mod engine;
pub mod fill;
pub mod gpu;
pub mod mix;
pub mod plot;
pub mod policies;
pub mod replay;
pub mod report;
pub mod trace;

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub use engine::{parse_policies, SimPolicy, Ties, Workload};
use fill::{FillRun, FIRST_SEED};
pub use mix::Mix;
use replay::ReplayRun;
use report::{FillSummary, ReplaySummary};
use trace::{Node, Task};

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
    /// Workload mixes to make from the task list and run ([`run_mixes`]); empty = the task
    /// list as it is ([`run`]).
    pub mixes: Vec<Mix>,
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

/// The tables of several mixes for the terminal: each mix's own table under its name, then
/// (fill mode) the median unallocated GPU % at 100 % arrived per policy and mix.
pub fn mixes_table(all: &[(Mix, SimResults)], inflation_pct: u32) -> String {
    let mut out = String::new();
    for (m, results) in all {
        out.push_str(&format!("\n== mix {} ==\n", m.name));
        out.push_str(&results.table(inflation_pct));
    }
    let fills: Vec<(&str, &[FillSummary])> = all
        .iter()
        .filter_map(|(m, r)| match r {
            SimResults::Fill { summaries, .. } => Some((m.name.as_str(), &summaries[..])),
            SimResults::Replay { .. } => None,
        })
        .collect();
    if !fills.is_empty() {
        out.push_str("\nunallocated GPU % at 100 % arrived, median (min–max) over seeds:\n\n");
        out.push_str(&report::mix_table(&fills));
    }
    out
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
    let (nodes, tasks) = load(options)?;
    run_on(nodes, tasks, options, options.out.as_deref())
}

fn load(options: &SimOptions) -> Result<(Vec<Node>, Vec<Task>), SimFailure> {
    let nodes = trace::load_nodes(&options.nodes).map_err(|e| SimFailure::Input(e.to_string()))?;
    let tasks = trace::load_tasks(&options.tasks).map_err(|e| SimFailure::Input(e.to_string()))?;
    Ok((nodes, tasks))
}

/// Runs every policy on one node and task list; writes files into `out` when set.
fn run_on(
    nodes: Vec<Node>,
    tasks: Vec<Task>,
    options: &SimOptions,
    out: Option<&Path>,
) -> Result<SimResults, SimFailure> {
    let workload = Workload::new(nodes, tasks).map_err(|e| SimFailure::Input(e.to_string()))?;
    let results = match options.mode {
        Mode::Fill => run_fill_mode(&workload, options)?,
        Mode::Replay => run_replay_mode(&workload, options)?,
    };
    if let Some(dir) = out {
        write_outputs(dir, &results, options.inflation_pct)?;
    }
    Ok(results)
}

/// Makes each of `options.mixes` from the task list (all before running any, so a mix that
/// cannot be made fails at once) and runs every policy on each. With `out`, each mix's files go
/// into `out/MIX/` with its task list as `tasks_MIX.csv`, and the comparison across mixes into
/// `out/mix_summary.csv` and `out/mix_spread_100.{png,svg}` (fill mode).
pub fn run_mixes(options: &SimOptions) -> Result<Vec<(Mix, SimResults)>, SimFailure> {
    let (nodes, tasks) = load(options)?;
    let made: Vec<(&Mix, Vec<Task>)> = options
        .mixes
        .iter()
        .map(|m| Ok((m, m.apply(&tasks, &nodes)?)))
        .collect::<Result<_, mix::MixError>>()
        .map_err(|e| SimFailure::Input(e.to_string()))?;
    let mut all = Vec::with_capacity(made.len());
    for (m, tasks) in made {
        let dir = options.out.as_ref().map(|d| d.join(&m.name));
        if let Some(dir) = &dir {
            std::fs::create_dir_all(dir)
                .map_err(|e| SimFailure::Run(format!("cannot create {}: {e}", dir.display())))?;
            mix::write_tasks_csv(&dir.join(format!("tasks_{}.csv", m.name)), &tasks)
                .map_err(SimFailure::Run)?;
        }
        let results = run_on(nodes.clone(), tasks, options, dir.as_deref()).map_err(|e| {
            let within = |e: String| format!("mix `{}`: {e}", m.name);
            match e {
                SimFailure::Input(e) => SimFailure::Input(within(e)),
                SimFailure::Run(e) => SimFailure::Run(within(e)),
            }
        })?;
        all.push((m.clone(), results));
    }
    if let Some(dir) = &options.out {
        let fills: Vec<(&str, &[FillSummary], &[FillRun])> = all
            .iter()
            .filter_map(|(m, r)| match r {
                SimResults::Fill { summaries, runs } => {
                    Some((m.name.as_str(), &summaries[..], &runs[..]))
                }
                SimResults::Replay { .. } => None,
            })
            .collect();
        if !fills.is_empty() {
            report::write_mix_summary(dir, &fills).map_err(|e| SimFailure::Run(e.to_string()))?;
            plot::mix_spread_plot(dir, &fills).map_err(|e| SimFailure::Run(e.to_string()))?;
        }
    }
    Ok(all)
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

fn write_outputs(dir: &Path, results: &SimResults, inflation_pct: u32) -> Result<(), SimFailure> {
    std::fs::create_dir_all(dir)
        .map_err(|e| SimFailure::Run(format!("cannot create {}: {e}", dir.display())))?;
    let run_err = |e: report::WriteError| SimFailure::Run(e.to_string());
    match results {
        SimResults::Fill { summaries, runs } => {
            report::write_fill(dir, summaries, runs).map_err(run_err)?;
            plot::fill_plots(dir, summaries, runs, inflation_pct)
                .map_err(|e| SimFailure::Run(e.to_string()))?;
        }
        SimResults::Replay { summaries, runs } => {
            report::write_replay(dir, summaries, runs).map_err(run_err)?;
            plot::replay_plots(dir, summaries, runs).map_err(|e| SimFailure::Run(e.to_string()))?;
        }
    }
    Ok(())
}
