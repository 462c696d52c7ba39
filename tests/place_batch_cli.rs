//! `ringmaster place` with a `batch:` section: matches and unmatched tasks as JSON lines.

use std::path::PathBuf;
use std::process::Command;

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

#[test]
fn batch_section_prints_matches_and_reasons() {
    let scenario =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/scenarios/batch_example.yaml");
    let (code, lines, stderr) = place(&["--scenario", &scenario.display().to_string()]);
    assert_eq!(code, 0, "{stderr}");
    let batch: Vec<&str> = lines
        .iter()
        .filter(|l| l.starts_with("{\"batch_"))
        .map(String::as_str)
        .collect();
    assert_eq!(
        batch,
        [
            r#"{"batch_match":"urgent","agent":"fast","exec_secs":1.5}"#,
            r#"{"batch_match":"cheap","agent":"slow","exec_secs":2.0}"#,
            r#"{"batch_match":"rich","agent":"fast","exec_secs":1.0}"#,
            r#"{"batch_match":"late","agent":"slow","exec_secs":2.0}"#,
            r#"{"batch_unmatched":[{"task":"huge","reason":"no_agent_fits","why":"no agent fits"},{"task":"hopeless","reason":"deadline_impossible","why":"deadline impossible on every agent"}],"proposals":6,"rounds":2,"fills":0}"#,
        ]
    );
}

#[test]
fn bad_batch_sections_are_located() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "agents:\n  - { id: a, resources: \"cpus:1\", cpu_speed: 0 }\nbatch:\n  tasks: []\n",
            "s.yaml:2: agents[0].cpu_speed: must be a number greater than 0",
        ),
        (
            "batch:\n  tasks:\n    - { id: t, resources: \"cpus:1\", deadline: 1, work: 1 }\n    - { id: t, resources: \"cpus:1\", deadline: 1, work: 1 }\n",
            "s.yaml:4: batch.tasks[1].id: duplicate task id `t`",
        ),
        (
            "batch:\n  tasks:\n    - id: t\n      resources: \"cpus:1\"\n      deadline: -1\n      work: 1\n",
            "s.yaml:5: batch.tasks[0].deadline: must be a number greater than 0",
        ),
        (
            "batch:\n  matching: { e: x }\n  tasks: []\n",
            "s.yaml:2: batch.matching.e: expected a finite number, found the string `x`",
        ),
    ];
    for (text, want) in cases {
        let path = dir.path().join("s.yaml");
        std::fs::write(&path, text).unwrap();
        let (code, _, stderr) = place(&["--scenario", &path.display().to_string()]);
        assert_ne!(code, 0);
        assert!(
            stderr.contains(want),
            "{text}\n got: {stderr}\nwant: {want}"
        );
    }
}
