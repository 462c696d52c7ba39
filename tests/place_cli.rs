//! `ringmaster place` end to end: the real binary on scenario files under `tests/scenarios/`.

use std::path::PathBuf;
use std::process::Command;

fn scenario(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/scenarios")
        .join(name)
}

/// Runs `ringmaster place` with extra args; returns (exit code, stdout lines, stderr).
fn place(args: &[&str]) -> (i32, Vec<String>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ringmaster"))
        .arg("place")
        .args(args)
        .output()
        .expect("run ringmaster");
    let stdout = String::from_utf8(out.stdout).unwrap();
    (
        out.status.code().unwrap_or(-1),
        stdout.lines().map(str::to_string).collect(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn path(name: &str) -> String {
    scenario(name).display().to_string()
}

#[test]
fn drf_paper_example() {
    let (code, lines, stderr) = place(&["--scenario", &path("drf_paper.yaml")]);
    assert_eq!(code, 0, "{stderr}");
    let frameworks: Vec<serde_json::Value> = lines[..5]
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["framework"].clone())
        .collect();
    assert_eq!(frameworks, ["A", "B", "A", "B", "A"]);
    assert_eq!(
        lines[0],
        r#"{"step":1,"framework":"A","agent":"a1","phase":"down","bucket":7,"resources":"cpus:1;mem:4096"}"#
    );
    assert!(lines[5]
        .starts_with(r#"{"unplaced":[{"framework":"A","resources":"cpus:1;mem:4096","count":7,"#));
    assert_eq!(
        lines[6],
        r#"{"agents":[{"id":"a1","free":"mem:4096"}],"shares":{"A":0.6667,"B":0.6667}}"#
    );
    assert_eq!(lines.len(), 7);
}

#[test]
fn seed_001_example() {
    let (code, lines, stderr) = place(&["--scenario", &path("seed_001.yaml")]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(lines.len(), 4);
    assert_eq!(lines[2], r#"{"unplaced":[]}"#);
    assert_eq!(
        lines[3],
        r#"{"agents":[{"id":"n1","free":"mem:5120"}],"shares":{"F":1.0}}"#
    );
}

#[test]
fn placer_flag_and_config_choose_the_placer() {
    let ring = place(&["--scenario", &path("best_fit.yaml")]);
    assert_eq!(ring.0, 0, "{}", ring.2);
    assert_eq!(
        ring.1[0],
        r#"{"step":1,"framework":"web","agent":"snug","phase":"bucket","bucket":2,"resources":"cpus:2;mem:1024"}"#
    );
    let first = place(&[
        "--scenario",
        &path("best_fit.yaml"),
        "--placer",
        "first-fit",
    ]);
    assert!(
        first.1[0].contains(r#""agent":"big","phase":null,"bucket":null"#),
        "{}",
        first.1[0]
    );
    let lbf = place(&[
        "--scenario",
        &path("best_fit.yaml"),
        "--placer",
        "linear-best-fit",
    ]);
    assert!(
        lbf.1[0].contains(r#""agent":"snug","phase":null"#),
        "{}",
        lbf.1[0]
    );
    // The config's placer applies without the flag; the flag wins over it.
    let config = path("config_first_fit.yaml");
    let by_config = place(&["--scenario", &path("best_fit.yaml"), "--config", &config]);
    assert!(
        by_config.1[0].contains(r#""agent":"big""#),
        "{}",
        by_config.1[0]
    );
    let flag_wins = place(&[
        "--scenario",
        &path("best_fit.yaml"),
        "--config",
        &config,
        "--placer",
        "ring",
    ]);
    assert!(
        flag_wins.1[0].contains(r#""agent":"snug""#),
        "{}",
        flag_wins.1[0]
    );
}

#[test]
fn bad_input_exits_2_with_one_located_line() {
    let cases = [
        (
            "bad_unknown_framework.yaml",
            ":7: requests[1].framework: unknown framework `C`",
        ),
        (
            "bad_resources.yaml",
            ":3: agents[0].resources: `mem:-1`: amount `-1`",
        ),
        ("bad_count.yaml", ":3: requests[0].count: -2 is negative"),
        (
            "bad_running_agent.yaml",
            ":6: running[1].agent: unknown agent `nope`",
        ),
        (
            "bad_unknown_key.yaml",
            ":4: frameworks[0]: unknown field `wieght`",
        ),
        (
            "bad_duplicate_agent.yaml",
            ":4: agents[2].id: duplicate agent id `a1` (first on line 2)",
        ),
        (
            "bad_rings.yaml",
            ":4: rings.mem.bounds: bounds must be strictly increasing (4096 after 16384)",
        ),
        ("missing.yaml", ": cannot read:"),
    ];
    for (file, expected) in cases {
        let (code, stdout, stderr) = place(&["--scenario", &path(file)]);
        assert_eq!(code, 2, "{file}: {stderr}");
        assert!(stdout.is_empty(), "{file}: {stdout:?}");
        assert_eq!(stderr.lines().count(), 1, "{file}: {stderr}");
        let want = format!("error: {}{expected}", path(file));
        assert!(
            stderr.starts_with(&want),
            "{file}\n got: {stderr}want: {want}"
        );
    }
    let (code, _, stderr) = place(&[
        "--scenario",
        &path("seed_001.yaml"),
        "--config",
        &path("bad_config.yaml"),
    ]);
    assert_eq!(code, 2);
    assert_eq!(
        stderr.trim_end(),
        format!(
            "error: {}:3: rings.cpus.step: step must be greater than 0",
            path("bad_config.yaml")
        )
    );
    let (code, _, stderr) = place(&["--scenario", &path("seed_001.yaml"), "--placer", "random"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("unknown placer `random`"), "{stderr}");
}

/// SPEC seed 000 golden example: balance places jobs 5, 1, 4 with the SPEC's weights and y
/// values; first-fit places 5 and 2 and strands `cpus:50;mem:100;gpus:4`.
#[test]
fn seed_000_balance_against_first_fit() {
    let (code, lines, stderr) =
        place(&["--scenario", &path("seed_000.yaml"), "--placer", "balance"]);
    assert_eq!(code, 0, "{stderr}");
    let line = |i: usize| serde_json::from_str::<serde_json::Value>(&lines[i]).unwrap();
    let placed: Vec<(String, &str)> = (0..3)
        .map(|i| {
            let resources = line(i)["resources"].as_str().unwrap().to_string();
            // The raw text, so the key order of the output is checked too.
            let balance = lines[i].split_once(r#""balance":"#).unwrap().1;
            (resources, balance.strip_suffix('}').unwrap())
        })
        .collect();
    let expected = [
        // job5 on the idle agent
        (
            "cpus:20;gpus:4;mem:500",
            r#"{"weights":[0.3333,0.3333,0.3333],"y_before":0.0,"y_after":0.1247}"#,
        ),
        // job2 stays pending (0.1217 → 0.1757); job1 improves the balance
        (
            "cpus:40;gpus:2;mem:200",
            r#"{"weights":[0.2593,0.4074,0.3333],"y_before":0.1217,"y_after":0.0497}"#,
        ),
        // job4 fills the agent
        (
            "cpus:40;gpus:4;mem:300",
            r#"{"weights":[0.2963,0.4074,0.2963],"y_before":0.0497,"y_after":0.0}"#,
        ),
    ];
    for ((resources, balance), (want_resources, want_balance)) in placed.iter().zip(expected) {
        assert_eq!(resources, want_resources);
        assert_eq!(*balance, want_balance);
    }
    let unplaced = line(3)["unplaced"].clone();
    let left: Vec<&str> = unplaced
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["resources"].as_str().unwrap())
        .collect();
    assert_eq!(
        left,
        [
            "cpus:30;gpus:2;mem:400",
            "cpus:30;gpus:1;mem:300",
            "cpus:30;gpus:1;mem:200"
        ]
    );
    assert_eq!(
        lines[4], r#"{"agents":[{"id":"a","free":""}],"shares":{"jobs":1.0}}"#,
        "nothing stranded"
    );
    assert_eq!(lines.len(), 5);

    let (code, lines, stderr) = place(&[
        "--scenario",
        &path("seed_000.yaml"),
        "--placer",
        "first-fit",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(lines.len(), 4);
    assert!(
        lines[0].contains(r#""resources":"cpus:20;gpus:4;mem:500"}"#),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains(r#""resources":"cpus:30;gpus:2;mem:400"}"#),
        "{}",
        lines[1]
    );
    assert!(!lines[0].contains("balance"));
    assert_eq!(
        lines[3],
        r#"{"agents":[{"id":"a","free":"cpus:50;gpus:4;mem:100"}],"shares":{"jobs":0.9}}"#
    );
}

#[test]
fn new_placer_names_are_accepted_and_bad_balance_sections_located() {
    for placer in ["least-requested", "most-balanced"] {
        let (code, lines, stderr) =
            place(&["--scenario", &path("best_fit.yaml"), "--placer", placer]);
        assert_eq!(code, 0, "{stderr}");
        // Both prefer the big idle agent for a small task (least used, and most even).
        assert!(
            lines[0].contains(r#""agent":"big""#),
            "{placer}: {}",
            lines[0]
        );
    }
    let (code, _, stderr) = place(&["--scenario", &path("bad_balance.yaml")]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("bad_balance.yaml:3: balance.initial_weights.mem: weight of `mem` must be a finite number ≥ 0, not -0.2"),
        "{stderr}"
    );
}

/// SPEC seed 003's first example (issue 44): demands are served by the priority each has when
/// it is served: t1 (user1, p30), t3 (user2, p15), then the base ones as room allows; with 8
/// GPUs t2 and t4 wait and nothing is preempted, with 16 the order is t1, t3, t2, t4.
#[test]
fn seed_003_order_of_service() {
    let (code, lines, stderr) = place(&["--scenario", &path("seed_003_order.yaml")]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        lines[..2],
        [
            r#"{"step":1,"framework":"U1","agent":"a1","phase":"up","bucket":8,"resources":"gpus:2","id":"U1/1","priority":30}"#,
            r#"{"step":2,"framework":"U2","agent":"a1","phase":"up","bucket":6,"resources":"gpus:4","id":"U2/1","priority":15}"#,
        ]
    );
    assert!(
        lines[2].starts_with(r#"{"unplaced":[{"framework":"U1","resources":"gpus:4""#),
        "{}",
        lines[2]
    );
    assert!(!lines.iter().any(|l| l.contains("preempted")), "{lines:?}");
    let (code, lines, stderr) = place(&["--scenario", &path("seed_003_order_16.yaml")]);
    assert_eq!(code, 0, "{stderr}");
    let order: Vec<&str> = lines
        .iter()
        .filter(|l| l.starts_with(r#"{"step""#))
        .filter_map(|l| l.split("\"id\":\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(order, ["U1/1", "U2/1", "U1/2", "U2/2"]);
    assert!(
        lines
            .iter()
            .any(|l| l.contains(r#""id":"U1/2","priority":0"#)),
        "{lines:?}"
    );
}

/// SPEC seed 003's GPU partition: the 4-GPU request preempts the base-priority t2 (only t2 is
/// lower) and runs; the 6-GPU request is then over quota → base priority, and waits.
///
/// As in the master, the preemptor is placed by the next allocation cycle, through the placer,
/// on the agent held for it: gpus:4 is bucket 4 of the default `gpus` ring (base 0, step 1) and
/// g1 has exactly gpus:4 free once t2 ended, so the ring search finds it in its first phase
/// (`bucket`, 4); c1 is excluded by the partition rule.
#[test]
fn seed_003_preemption_lines() {
    let (code, lines, stderr) = place(&["--scenario", &path("seed_003_gpu.yaml")]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        lines[0],
        r#"{"preempted":[{"id":"t2","agent":"g1","priority":0,"resources":"gpus:4"}],"by":"U2","priority":10}"#
    );
    assert_eq!(
        lines[1],
        r#"{"step":1,"framework":"U2","agent":"g1","phase":"bucket","bucket":4,"resources":"gpus:4","id":"U2/1","priority":10}"#
    );
    assert!(
        lines[2].contains("over priority quota in partition gpu: running gpus:4 of gpus:8, task needs gpus:6 → base priority; base-priority demands never preempt"),
        "{}",
        lines[2]
    );
    // c1 is in the default partition: never used for the gpu partition.
    assert_eq!(
        lines[3],
        r#"{"agents":[{"id":"g1","free":""},{"id":"c1","free":"gpus:8"}],"shares":{"U2":0.25}}"#
    );
    assert_eq!(lines.len(), 4);
}
