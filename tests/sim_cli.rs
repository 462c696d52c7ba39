//! `ringmaster sim` as a user runs it: a small run writes its table, files and plots; bad input
//! exits with code 2 and names what is wrong.

use std::process::Command;

fn sim(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ringmaster"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("sim")
        .args(args)
        .output()
        .unwrap()
}

const TINY: [&str; 4] = [
    "--nodes",
    "tests/sim_data/tiny_nodes.csv",
    "--tasks",
    "tests/sim_data/tiny_tasks.csv",
];

#[test]
fn fill_and_replay_write_tables_files_and_plots() {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().to_str().unwrap();
    let fill = sim(&[
        &TINY[..],
        &["--placer", "all", "--seeds", "2", "--out", dir],
    ]
    .concat());
    assert!(
        fill.status.success(),
        "{}",
        String::from_utf8_lossy(&fill.stderr)
    );
    let table = String::from_utf8(fill.stdout).unwrap();
    for policy in [
        "ring",
        "ring-seed001",
        "fgd",
        "fgd-exact",
        "best-fit",
        "random",
    ] {
        assert!(
            table.lines().any(|l| l.starts_with(&format!("{policy} "))),
            "{table}"
        );
    }
    let replay = sim(&[
        &TINY[..],
        &["--placer", "ring,fgd", "--mode", "replay", "--out", dir],
    ]
    .concat());
    assert!(
        replay.status.success(),
        "{}",
        String::from_utf8_lossy(&replay.stderr)
    );
    for file in [
        "fill_summary.json",
        "fill_summary.csv",
        "fill_curves.csv",
        "fill_unallocated.png",
        "fill_unallocated.svg",
        "fill_fragmented.png",
        "fill_latency.svg",
        "replay_summary.json",
        "replay_timeline.csv",
        "replay_utilisation.png",
        "replay_latency.png",
    ] {
        let len = std::fs::metadata(out.path().join(file))
            .map(|m| m.len())
            .unwrap_or(0);
        assert!(len > 100, "{file} missing or empty");
    }
    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.path().join("fill_summary.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(summary[0]["policy"], "ring");
    assert_eq!(summary[0]["seeds"], serde_json::json!([42, 43]));
}

#[test]
fn bad_input_exits_2_with_a_clear_line() {
    let cases: [(&[&str], &str); 4] = [
        (&["--placer", "bestest"], "unknown policy `bestest`"),
        (&["--seeds", "0"], "--seeds must be at least 1"),
        (
            &["--nodes", "tests/sim_data/tiny_tasks.csv"],
            "tiny_tasks.csv:2: unknown field `gpu_milli`",
        ),
        (&["--tasks", "tests/sim_data/nope.csv"], "cannot read"),
    ];
    for (extra, expected) in cases {
        // A flag given in `extra` replaces the tiny trace's.
        let mut args: Vec<&str> = Vec::new();
        for pair in TINY.chunks(2) {
            if !extra.contains(&pair[0]) {
                args.extend_from_slice(pair);
            }
        }
        args.extend_from_slice(extra);
        let out = sim(&args);
        assert_eq!(out.status.code(), Some(2), "{extra:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert!(
            err.starts_with("error: ") && err.contains(expected),
            "{extra:?}: {err}"
        );
    }
}
