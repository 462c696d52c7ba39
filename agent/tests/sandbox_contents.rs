//! A property of the agent against whatever a task leaves in its sandbox (issue 43): symlinks
//! to files and directories outside it (a root-only secret among them), hard links, FIFOs,
//! huge sparse files, unreadable files, directories in place of its output files, forged
//! records under every name the agent uses or used. Whatever the contents, the agent reports
//! the exit status the task really had, never shows the secret (in the status message or a
//! log read), writes nothing outside its own work dir, and its garbage collector removes the
//! sandbox without touching anything a link points to.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use proptest::prelude::*;
use ringmaster_agent::state::AgentState;
use ringmaster_proto::convert::ResourcesWire;
use ringmaster_proto::resources::Resources;
use ringmaster_proto::{FileKind, ReadFile, RunTasks, TaskInfo, TaskState};

const NAMES: &[&str] = &[
    "stdout",
    "stderr",
    "task",
    "task.tmp",
    "exit",
    "exit.tmp",
    ".ringmaster-task",
    ".ringmaster-task.tmp",
    ".ringmaster-exit",
    ".ringmaster-exit.tmp",
];

#[derive(Debug, Clone)]
enum Kind {
    /// A symlink to the secret, to the outside directory, or to a path that does not exist.
    Symlink(u8),
    HardLink,
    Fifo,
    Huge,
    Unreadable,
    Dir,
    Text(String),
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        (0u8..3).prop_map(Kind::Symlink),
        Just(Kind::HardLink),
        Just(Kind::Fifo),
        Just(Kind::Huge),
        Just(Kind::Unreadable),
        Just(Kind::Dir),
        "[a-z0-9=\n ]{0,40}".prop_map(Kind::Text),
    ]
}

/// The shell commands that make `name` of `kind` in the task's sandbox.
fn plant(name: &str, kind: &Kind, outside: &Path) -> String {
    let secret = outside.join("secret");
    let missing = outside.join("new-file");
    let make = match kind {
        Kind::Symlink(0) => format!("ln -s '{}' {name}", secret.display()),
        Kind::Symlink(1) => format!("ln -s '{}' {name}", outside.display()),
        Kind::Symlink(_) => format!("ln -s '{}' {name}", missing.display()),
        Kind::HardLink => format!("ln '{}' {name}", secret.display()),
        Kind::Fifo => format!("mkfifo {name}"),
        Kind::Huge => format!("dd of={name} bs=1 seek=1073741824 count=0 2>/dev/null"),
        Kind::Unreadable => format!("echo x > {name}; chmod 000 {name}"),
        Kind::Dir => format!("mkdir {name}"),
        Kind::Text(text) => format!("printf '%s' '{text}' > {name}"),
    };
    format!("rm -rf {name}; {make} 2>/dev/null; ")
}

/// Every path under `dir` with its kind, size, mode, owner and (for small files) content.
fn snapshot(dir: &Path, skip: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let path = entry.path();
            if path == skip {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let content = if meta.is_file() && meta.len() < 4096 {
                std::fs::read_to_string(&path).unwrap_or_default()
            } else {
                String::new()
            };
            out.insert(
                path.clone(),
                format!(
                    "{:?} {} {:o} {} {content}",
                    meta.file_type(),
                    meta.len(),
                    meta.mode(),
                    meta.uid()
                ),
            );
            if meta.is_dir() {
                stack.push(path);
            }
        }
    }
    out
}

fn run_case(contents: &[(usize, Kind)], code: i32) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let outside = dir.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret"), "top secret\n").unwrap();
        std::fs::write(outside.join("other"), "keep me\n").unwrap();
        let work = dir.path().join("work");
        let before = snapshot(dir.path(), &work);

        let mut config = common::config(&work, "prop-host");
        config.safeguards.sandbox_gc_delay = Duration::ZERO;
        let (mut state, mut exits) = AgentState::new(config, "a1".into());
        let mut command = String::from("echo out; echo err >&2; ");
        for (name, kind) in contents {
            command.push_str(&plant(NAMES[*name], kind, &outside));
        }
        command.push_str(&format!("exit {code}"));
        let out = state.run_tasks(RunTasks {
            tasks: vec![TaskInfo {
                task_id: "t".into(),
                name: "t".into(),
                command,
                resources: Some(Resources::parse("cpus:1;mem:64").unwrap().to_wire()),
                framework_id: "fw".into(),
                ..Default::default()
            }],
            leader_term: 0,
        });
        let first = common::statuses(&out).remove(0);
        assert_eq!(first.state(), TaskState::TaskRunning, "{first:?}");
        let (key, outcome) = tokio::time::timeout(Duration::from_secs(30), exits.recv())
            .await
            .expect("the task ends")
            .unwrap();
        let out = state.process_exited(key, outcome);
        let end = common::statuses(&out).remove(0);
        if code == 0 {
            assert_eq!(end.state(), TaskState::TaskFinished, "{end:?}");
        } else {
            assert_eq!(end.state(), TaskState::TaskFailed, "{end:?}");
        }
        assert_eq!(end.exit_code, Some(code), "{end:?}");
        assert!(!end.message.contains("top secret"), "{end:?}");

        for file in [FileKind::Stdout, FileKind::Stderr] {
            let answer = ringmaster_agent::files::read(
                &work,
                &ReadFile {
                    request_id: 1,
                    framework_id: "fw".into(),
                    task_id: "t".into(),
                    file: file as i32,
                    offset: 0,
                    length: 1 << 20,
                },
            );
            let data = String::from_utf8_lossy(&answer.data);
            assert!(!data.contains("top secret"), "{answer:?}");
        }
        assert_eq!(
            snapshot(dir.path(), &work),
            before,
            "written outside the work dir"
        );

        state.acknowledged(&first.update_id);
        state.acknowledged(&end.update_id);
        let due = state.sandboxes_to_collect(u64::MAX);
        assert_eq!(due.len(), 1, "the ended run is collected");
        for entry in &due {
            ringmaster_agent::gc::remove(entry).unwrap();
        }
        assert!(!ringmaster_agent::sandbox::sandbox_dir(&work, "fw", "t").exists());
        assert_eq!(
            snapshot(dir.path(), &work),
            before,
            "collection reached outside"
        );
    });
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn whatever_a_sandbox_holds_the_agent_reads_and_writes_only_its_own(
        contents in proptest::collection::vec((0..NAMES.len(), kind()), 0..8),
        code in prop_oneof![Just(0), Just(1), Just(3), Just(125), Just(126)],
    ) {
        run_case(&contents, code);
    }
}
