//! `ringmaster sim --mix`: workload mixes made from a task list, run end to end on the tiny
//! trace; files per mix, the mixed task lists read back as generated, and bad mixes refused.

use std::path::{Path, PathBuf};
use std::process::Command;

use ringmaster::sim::mix::{parse_mixes, Mix};
use ringmaster::sim::trace::{load_nodes, load_tasks};
use ringmaster::sim::{parse_policies, run_mixes, Mode, SimOptions, SimResults, Ties};
use ringmaster_core::placement::RingsConfig;

fn data(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn options(mixes: &str, out: Option<PathBuf>) -> SimOptions {
    SimOptions {
        nodes: data("tests/sim_data/tiny_nodes.csv"),
        tasks: data("tests/sim_data/tiny_tasks.csv"),
        rings: RingsConfig::default(),
        ties: Ties::First,
        policies: parse_policies("ring,fgd").unwrap(),
        mode: Mode::Fill,
        seeds: 2,
        inflation_pct: 130,
        out,
        progress: false,
        mixes: parse_mixes(&[mixes.to_string()]).unwrap(),
    }
}

#[test]
fn each_mix_gets_its_directory_and_its_task_list() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let opts = options("default;sharing=60,seed=3;spec=50", Some(out.clone()));
    let all = run_mixes(&opts).unwrap();
    let names: Vec<&str> = all.iter().map(|(m, _)| m.name.as_str()).collect();
    assert_eq!(names, ["default", "sharing60-seed3", "spec50"]);
    let nodes = load_nodes(&opts.nodes).unwrap();
    let tasks = load_tasks(&opts.tasks).unwrap();
    for (mix, results) in &all {
        let sub = out.join(&mix.name);
        for file in [
            "fill_summary.csv",
            "fill_unallocated.png",
            "fill_unallocated.svg",
            "spread_100.png",
            "spread_100.svg",
        ] {
            assert!(sub.join(file).is_file(), "{}/{file}", mix.name);
        }
        let written = load_tasks(&sub.join(format!("tasks_{}.csv", mix.name))).unwrap();
        assert_eq!(written, mix.apply(&tasks, &nodes).unwrap(), "{}", mix.name);
        assert_eq!(written.len(), tasks.len());
        let SimResults::Fill { summaries, .. } = results else {
            panic!("fill mode")
        };
        assert_eq!(summaries.len(), 2);
    }
    for file in [
        "mix_summary.csv",
        "mix_spread_100.png",
        "mix_spread_100.svg",
    ] {
        assert!(out.join(file).is_file(), "{file}");
    }
    let summary = std::fs::read_to_string(out.join("mix_summary.csv")).unwrap();
    assert_eq!(summary.lines().count(), 1 + 3 * 2, "{summary}");
    // The same mix twice gives the same numbers.
    let again = run_mixes(&options("sharing=60,seed=3", None)).unwrap();
    let (SimResults::Fill { runs: a, .. }, SimResults::Fill { runs: b, .. }) =
        (&all[1].1, &again[0].1)
    else {
        panic!("fill mode")
    };
    let curves = |runs: &[ringmaster::sim::fill::FillRun]| -> Vec<_> {
        runs.iter().map(|r| r.curve.clone()).collect()
    };
    assert_eq!(curves(a), curves(b));
    assert_eq!(Mix::parse("sharing=60,seed=3").unwrap(), again[0].0);
}

#[test]
fn a_mix_the_trace_cannot_make_is_bad_input() {
    let e = run_mixes(&options("multi=10", None)).unwrap_err();
    assert!(
        e.to_string().contains("no multi-GPU tasks to draw from"),
        "{e}"
    );
}

fn sim_cli(mix: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ringmaster"))
        .args([
            "sim", "--quiet", "--seeds", "1", "--placer", "ring", "--nodes",
        ])
        .arg(data("tests/sim_data/tiny_nodes.csv"))
        .arg("--tasks")
        .arg(data("tests/sim_data/tiny_tasks.csv"))
        .args(["--mix", mix])
        .output()
        .unwrap()
}

#[test]
fn cli_runs_mixes_and_refuses_bad_ones() {
    let ok = sim_cli("default;sharing=60");
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(stdout.contains("== mix sharing60 =="), "{stdout}");
    assert!(
        stdout.contains("| policy | default | sharing60 |"),
        "{stdout}"
    );
    for (mix, says) in [
        ("gpu=3", "unknown key `gpu`"),
        ("sharing=120", "percentage 0–100"),
        ("sharing=70,cpu=40", "more than 100 %"),
        ("multi=10", "no multi-GPU tasks"),
    ] {
        let bad = sim_cli(mix);
        assert_eq!(bad.status.code(), Some(2), "{mix}");
        let stderr = String::from_utf8_lossy(&bad.stderr);
        assert!(stderr.contains(says), "{mix}: {stderr}");
    }
}
