//! Numbers a person reads: summaries over seeds, the terminal table, and JSON/CSV files.
//!
//! Spreads are over seeds (median, mean, standard deviation, min, max); latencies are over every
//! decision of every seed of a policy.

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::fill::FillRun;
use super::replay::{percentile, ReplayRun};

/// Placement decision latency, microseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    pub decisions: usize,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl LatencySummary {
    pub fn from_ns(mut ns: Vec<u32>) -> Self {
        ns.sort_unstable();
        let us = |v: u32| f64::from(v) / 1000.0;
        LatencySummary {
            decisions: ns.len(),
            mean_us: if ns.is_empty() {
                0.0
            } else {
                ns.iter().map(|&v| u64::from(v)).sum::<u64>() as f64 / ns.len() as f64 / 1000.0
            },
            p50_us: us(percentile(&ns, 0.5)),
            p99_us: us(percentile(&ns, 0.99)),
            max_us: us(ns.last().copied().unwrap_or(0)),
        }
    }
}

/// One value over seeds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Spread {
    pub median: f64,
    pub mean: f64,
    pub stddev: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(values: &[f64]) -> Self {
        if values.is_empty() {
            return Spread::default();
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        let mean = v.iter().sum::<f64>() / n as f64;
        let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        Spread {
            median,
            mean,
            stddev: var.sqrt(),
            min: v[0],
            max: v[n - 1],
        }
    }
}

/// The median curve of one policy at one arrived percent.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CurvePoint {
    pub arrived_pct: u32,
    pub unallocated_pct: f64,
    pub fragmented_pct: f64,
}

/// One policy in `fill` mode over all its seeds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FillSummary {
    pub policy: String,
    pub seeds: Vec<u64>,
    pub unallocated_at_100: Spread,
    pub unallocated_at_end: Spread,
    pub fragmented_at_100: Spread,
    pub fragmented_at_end: Spread,
    pub failed_tasks: Spread,
    pub latency: LatencySummary,
    /// Median over seeds at each arrived percent.
    pub curve: Vec<CurvePoint>,
}

/// Summarises the runs of each policy (runs grouped by policy name, in first-seen order).
pub fn summarise_fill(runs: &[FillRun], end_pct: u32) -> Vec<FillSummary> {
    let mut names: Vec<&str> = Vec::new();
    for r in runs {
        if !names.contains(&r.policy.as_str()) {
            names.push(&r.policy);
        }
    }
    names
        .into_iter()
        .map(|name| {
            let mine: Vec<&FillRun> = runs.iter().filter(|r| r.policy == name).collect();
            let at = |pct: u32, f: fn(&super::fill::FillPoint) -> f64| -> Vec<f64> {
                mine.iter().filter_map(|r| r.at(pct).map(f)).collect()
            };
            let points = mine.iter().map(|r| r.curve.len()).min().unwrap_or(0);
            let curve = (0..points)
                .map(|i| CurvePoint {
                    arrived_pct: i as u32,
                    unallocated_pct: Spread::of(
                        &mine
                            .iter()
                            .map(|r| r.curve[i].unallocated_pct)
                            .collect::<Vec<_>>(),
                    )
                    .median,
                    fragmented_pct: Spread::of(
                        &mine
                            .iter()
                            .map(|r| r.curve[i].fragmented_pct)
                            .collect::<Vec<_>>(),
                    )
                    .median,
                })
                .collect();
            FillSummary {
                policy: name.to_string(),
                seeds: mine.iter().map(|r| r.seed).collect(),
                unallocated_at_100: Spread::of(&at(100, |p| p.unallocated_pct)),
                unallocated_at_end: Spread::of(&at(end_pct, |p| p.unallocated_pct)),
                fragmented_at_100: Spread::of(&at(100, |p| p.fragmented_pct)),
                fragmented_at_end: Spread::of(&at(end_pct, |p| p.fragmented_pct)),
                failed_tasks: Spread::of(
                    &mine
                        .iter()
                        .map(|r| r.tasks_failed as f64)
                        .collect::<Vec<_>>(),
                ),
                latency: LatencySummary::from_ns(
                    mine.iter()
                        .flat_map(|r| r.decision_ns.iter().copied())
                        .collect(),
                ),
                curve,
            }
        })
        .collect()
}

/// The `fill` table for the terminal.
pub fn fill_table(summaries: &[FillSummary], end_pct: u32) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:>22} {:>22} {:>13} {:>13} {:>9} {:>9}",
        "policy",
        "unalloc% @100 (min–max)",
        format!("unalloc% @{end_pct} (min–max)"),
        "frag% @100",
        format!("frag% @{end_pct}"),
        "p50 µs",
        "p99 µs"
    );
    for s in summaries {
        let spread = |x: &Spread| format!("{:.2} ({:.2}–{:.2})", x.median, x.min, x.max);
        let _ = writeln!(
            out,
            "{:<16} {:>22} {:>22} {:>13.2} {:>13.2} {:>9.1} {:>9.1}",
            s.policy,
            spread(&s.unallocated_at_100),
            spread(&s.unallocated_at_end),
            s.fragmented_at_100.median,
            s.fragmented_at_end.median,
            s.latency.p50_us,
            s.latency.p99_us,
        );
    }
    out
}

/// One policy in `replay` mode, without its timeline.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplaySummary {
    pub policy: String,
    pub tasks: usize,
    pub placed_at_once: usize,
    pub placed_after_wait: usize,
    pub never_placed: usize,
    pub wait_mean_s: f64,
    pub wait_p99_s: f64,
    pub mean_gpu_pct: f64,
    pub mean_fragmented_pct: f64,
    pub latency: LatencySummary,
    /// Wall time of the whole replay, seconds.
    pub wall_s: f64,
}

impl ReplaySummary {
    pub fn of(run: &ReplayRun, wall_s: f64) -> Self {
        let mean = |f: fn(&super::replay::TimelinePoint) -> f64| {
            if run.timeline.is_empty() {
                0.0
            } else {
                run.timeline.iter().map(f).sum::<f64>() / run.timeline.len() as f64
            }
        };
        ReplaySummary {
            policy: run.policy.clone(),
            tasks: run.tasks,
            placed_at_once: run.placed_at_once,
            placed_after_wait: run.placed_after_wait,
            never_placed: run.never_placed,
            wait_mean_s: run.wait_mean_s,
            wait_p99_s: run.wait_p99_s,
            mean_gpu_pct: mean(|p| p.gpu_pct),
            mean_fragmented_pct: mean(|p| p.fragmented_pct),
            latency: LatencySummary::from_ns(run.decision_ns.clone()),
            wall_s,
        }
    }
}

/// The `replay` table for the terminal.
pub fn replay_table(summaries: &[ReplaySummary]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:>7} {:>8} {:>7} {:>7} {:>10} {:>10} {:>7} {:>7} {:>8} {:>8} {:>7}",
        "policy",
        "tasks",
        "at once",
        "waited",
        "never",
        "wait mean",
        "wait p99",
        "gpu%",
        "frag%",
        "p50 µs",
        "p99 µs",
        "wall s"
    );
    for s in summaries {
        let _ = writeln!(
            out,
            "{:<16} {:>7} {:>8} {:>7} {:>7} {:>9.0}s {:>9.0}s {:>7.2} {:>7.2} {:>8.1} {:>8.1} {:>7.2}",
            s.policy,
            s.tasks,
            s.placed_at_once,
            s.placed_after_wait,
            s.never_placed,
            s.wait_mean_s,
            s.wait_p99_s,
            s.mean_gpu_pct,
            s.mean_fragmented_pct,
            s.latency.p50_us,
            s.latency.p99_us,
            s.wall_s,
        );
    }
    out
}

/// A file that could not be written, with its path.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {path}: {message}")]
pub struct WriteError {
    pub path: String,
    pub message: String,
}

fn write_error(path: &Path, e: impl std::fmt::Display) -> WriteError {
    WriteError {
        path: path.display().to_string(),
        message: e.to_string(),
    }
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), WriteError> {
    let text = serde_json::to_string_pretty(value).map_err(|e| write_error(path, e))?;
    std::fs::write(path, text + "\n").map_err(|e| write_error(path, e))
}

fn write_csv<R: Serialize>(
    path: &Path,
    rows: impl IntoIterator<Item = R>,
) -> Result<(), WriteError> {
    let mut w = csv::Writer::from_path(path).map_err(|e| write_error(path, e))?;
    for row in rows {
        w.serialize(row).map_err(|e| write_error(path, e))?;
    }
    w.flush().map_err(|e| write_error(path, e))
}

/// One row of `fill_summary.csv`, and of `mix_summary.csv` with the mix first.
#[derive(Serialize)]
struct FillSummaryRow<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    mix: Option<&'a str>,
    policy: &'a str,
    seeds: usize,
    unallocated_at_100_median: f64,
    unallocated_at_100_mean: f64,
    unallocated_at_100_stddev: f64,
    unallocated_at_100_min: f64,
    unallocated_at_100_max: f64,
    unallocated_at_end_median: f64,
    unallocated_at_end_min: f64,
    unallocated_at_end_max: f64,
    fragmented_at_100_median: f64,
    fragmented_at_end_median: f64,
    failed_tasks_median: f64,
    latency_mean_us: f64,
    latency_p50_us: f64,
    latency_p99_us: f64,
    latency_max_us: f64,
}

#[derive(Serialize)]
struct FillCurveRow<'a> {
    policy: &'a str,
    seed: u64,
    arrived_pct: u32,
    allocated_pct: f64,
    unallocated_pct: f64,
    fragmented_pct: f64,
}

impl<'a> FillSummaryRow<'a> {
    fn of(mix: Option<&'a str>, s: &'a FillSummary) -> Self {
        FillSummaryRow {
            mix,
            policy: &s.policy,
            seeds: s.seeds.len(),
            unallocated_at_100_median: s.unallocated_at_100.median,
            unallocated_at_100_mean: s.unallocated_at_100.mean,
            unallocated_at_100_stddev: s.unallocated_at_100.stddev,
            unallocated_at_100_min: s.unallocated_at_100.min,
            unallocated_at_100_max: s.unallocated_at_100.max,
            unallocated_at_end_median: s.unallocated_at_end.median,
            unallocated_at_end_min: s.unallocated_at_end.min,
            unallocated_at_end_max: s.unallocated_at_end.max,
            fragmented_at_100_median: s.fragmented_at_100.median,
            fragmented_at_end_median: s.fragmented_at_end.median,
            failed_tasks_median: s.failed_tasks.median,
            latency_mean_us: s.latency.mean_us,
            latency_p50_us: s.latency.p50_us,
            latency_p99_us: s.latency.p99_us,
            latency_max_us: s.latency.max_us,
        }
    }
}

/// `fill_summary.json`, `fill_summary.csv` and `fill_curves.csv` (every seed's curve).
pub fn write_fill(
    dir: &Path,
    summaries: &[FillSummary],
    runs: &[FillRun],
) -> Result<(), WriteError> {
    write_json(&dir.join("fill_summary.json"), &summaries)?;
    write_csv(
        &dir.join("fill_summary.csv"),
        summaries.iter().map(|s| FillSummaryRow::of(None, s)),
    )?;
    write_csv(
        &dir.join("fill_curves.csv"),
        runs.iter().flat_map(|r| {
            r.curve.iter().map(move |p| FillCurveRow {
                policy: &r.policy,
                seed: r.seed,
                arrived_pct: p.arrived_pct,
                allocated_pct: p.allocated_pct,
                unallocated_pct: p.unallocated_pct,
                fragmented_pct: p.fragmented_pct,
            })
        }),
    )
}

/// `mix_summary.csv`: every mix's fill summary, one row per (mix, policy).
pub fn write_mix_summary(
    dir: &Path,
    mixes: &[(&str, &[FillSummary], &[FillRun])],
) -> Result<(), WriteError> {
    write_csv(
        &dir.join("mix_summary.csv"),
        mixes.iter().flat_map(|&(mix, summaries, _)| {
            summaries
                .iter()
                .map(move |s| FillSummaryRow::of(Some(mix), s))
        }),
    )
}

/// Median unallocated GPU % at 100 % arrived (min–max over seeds), one row per policy and one
/// column per mix, as a Markdown table; the least median of each mix in bold.
pub fn mix_table(mixes: &[(&str, &[FillSummary])]) -> String {
    let mut policies: Vec<&str> = Vec::new();
    for (_, summaries) in mixes {
        for s in summaries.iter() {
            if !policies.contains(&s.policy.as_str()) {
                policies.push(&s.policy);
            }
        }
    }
    let mut out = String::new();
    let _ = write!(out, "| policy |");
    for (mix, _) in mixes {
        let _ = write!(out, " {mix} |");
    }
    let _ = write!(out, "\n| --- |");
    for _ in mixes {
        let _ = write!(out, " --- |");
    }
    out.push('\n');
    for p in policies {
        let _ = write!(out, "| `{p}` |");
        for (_, summaries) in mixes {
            let best = summaries
                .iter()
                .map(|s| s.unallocated_at_100.median)
                .fold(f64::INFINITY, f64::min);
            match summaries.iter().find(|s| s.policy == p) {
                Some(s) => {
                    let u = &s.unallocated_at_100;
                    let median = format!("{:.2}", u.median);
                    let median = if u.median <= best {
                        format!("**{median}**")
                    } else {
                        median
                    };
                    let _ = write!(out, " {median} ({:.2}–{:.2}) |", u.min, u.max);
                }
                None => {
                    let _ = write!(out, " — |");
                }
            }
        }
        out.push('\n');
    }
    out
}

#[derive(Serialize)]
struct TimelineRow<'a> {
    policy: &'a str,
    time: u64,
    cpu_pct: f64,
    memory_pct: f64,
    gpu_pct: f64,
    fragmented_pct: f64,
    pending: usize,
}

#[derive(Serialize)]
struct ReplaySummaryRow<'a> {
    policy: &'a str,
    tasks: usize,
    placed_at_once: usize,
    placed_after_wait: usize,
    never_placed: usize,
    wait_mean_s: f64,
    wait_p99_s: f64,
    mean_gpu_pct: f64,
    mean_fragmented_pct: f64,
    latency_p50_us: f64,
    latency_p99_us: f64,
    wall_s: f64,
}

/// `replay_summary.json`, `replay_summary.csv` and `replay_timeline.csv`.
pub fn write_replay(
    dir: &Path,
    summaries: &[ReplaySummary],
    runs: &[ReplayRun],
) -> Result<(), WriteError> {
    write_json(&dir.join("replay_summary.json"), &summaries)?;
    write_csv(
        &dir.join("replay_summary.csv"),
        summaries.iter().map(|s| ReplaySummaryRow {
            policy: &s.policy,
            tasks: s.tasks,
            placed_at_once: s.placed_at_once,
            placed_after_wait: s.placed_after_wait,
            never_placed: s.never_placed,
            wait_mean_s: s.wait_mean_s,
            wait_p99_s: s.wait_p99_s,
            mean_gpu_pct: s.mean_gpu_pct,
            mean_fragmented_pct: s.mean_fragmented_pct,
            latency_p50_us: s.latency.p50_us,
            latency_p99_us: s.latency.p99_us,
            wall_s: s.wall_s,
        }),
    )?;
    write_csv(
        &dir.join("replay_timeline.csv"),
        runs.iter().flat_map(|r| {
            r.timeline.iter().map(move |p| TimelineRow {
                policy: &r.policy,
                time: p.time,
                cpu_pct: p.cpu_pct,
                memory_pct: p.memory_pct,
                gpu_pct: p.gpu_pct,
                fragmented_pct: p.fragmented_pct,
                pending: p.pending,
            })
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spread_and_latency() {
        let s = Spread::of(&[3.0, 1.0, 2.0, 10.0]);
        assert_eq!((s.median, s.mean, s.min, s.max), (2.5, 4.0, 1.0, 10.0));
        assert_eq!(Spread::of(&[5.0]).median, 5.0);
        let l = LatencySummary::from_ns(vec![1000, 3000, 2000, 100_000]);
        assert_eq!((l.p50_us, l.p99_us, l.max_us), (2.0, 100.0, 100.0));
        assert_eq!(LatencySummary::from_ns(vec![]).decisions, 0);
    }
}
