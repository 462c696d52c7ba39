//! Secure files by default (issue 45, docs/security.md "Files"), through the real binaries:
//! `ringmaster serve --work-dir` keeps a 0700 work dir, `ringmaster-agent --work-dir` a 0711
//! one, and everything either creates there is 0600 (files) or 0700 (directories), except the
//! agent's `sandboxes/` tree (modes of its own). A work dir an earlier version left looser is
//! tightened at start, one warning per path, and links in it are left alone. Runs as any user.

mod processes;

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;

use processes::*;

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Every entry beneath `dir` (not `dir`), not descending into links or the top-level `skip`.
fn entries(dir: &Path, skip: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if d == dir && skip.iter().any(|s| entry.file_name() == *s) {
                continue;
            }
            if entry.file_type().unwrap().is_dir() {
                todo.push(path.clone());
            }
            out.push(path);
        }
    }
    out
}

/// Files 0600 at most, directories 0700 at most: nothing for group or others (a link's own
/// mode means nothing).
fn assert_private(dir: &Path, skip: &[&str]) -> Vec<PathBuf> {
    let all = entries(dir, skip);
    for path in &all {
        if path.is_symlink() {
            continue;
        }
        let m = mode(path);
        assert_eq!(m & 0o077, 0, "{} is {m:04o}", path.display());
    }
    all
}

/// Starts `command` with its stderr (the log) piped: the process and its log lines.
fn spawn_logged(mut command: Command) -> (Proc, mpsc::Receiver<String>) {
    let mut child = Proc(
        command
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the process"),
    );
    let stderr = child.0.stderr.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    (child, lines)
}

fn master(config: &Path, work_dir: &Path) -> (Proc, String, Vec<String>) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_ringmaster"));
    command
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(config)
        .arg("--work-dir")
        .arg(work_dir)
        .env("RUST_LOG", "info");
    let (proc, lines) = spawn_logged(command);
    let mut seen = Vec::new();
    wait_line(&lines, &mut seen, "the master's address", |seen| {
        seen.last().is_some_and(|l| l.contains("addr="))
    });
    let line = seen.last().unwrap();
    let addr: String = line[line.find("addr=").unwrap() + 5..]
        .chars()
        .take_while(|c| !c.is_whitespace())
        .collect();
    // Keep the pipe drained so the master never blocks on its log.
    std::thread::spawn(move || for _ in lines {});
    (proc, addr, seen)
}

fn agent(addr: &str, id: &str, work_dir: &Path) -> (Proc, Vec<String>) {
    let mut command = Command::new(workspace_bin("ringmaster-agent"));
    command
        .args([
            "--master",
            addr,
            "--id",
            id,
            "--resources",
            "cpus:1;mem:256",
        ])
        .arg("--work-dir")
        .arg(work_dir)
        .env("RUST_LOG", "info");
    let (proc, lines) = spawn_logged(command);
    let mut seen = Vec::new();
    wait_line(&lines, &mut seen, "the agent's start", |seen| {
        seen.last().is_some_and(|l| l.contains("agent starting"))
    });
    std::thread::spawn(move || for _ in lines {});
    (proc, seen)
}

fn master_config(dir: &Path) -> PathBuf {
    let config = dir.join("master.yaml");
    std::fs::write(
        &config,
        "master:\n  allocation_interval: 5ms\n  heartbeat_interval: 200ms\n",
    )
    .unwrap();
    config
}

#[test]
fn new_work_dirs_and_everything_the_binaries_create_in_them_are_private() {
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o755);
    let config = master_config(dir.path());
    let master_dir = dir.path().join("master");
    let agent_dir = dir.path().join("agent");
    let (_master, addr, _) = master(&config, &master_dir);
    let (_agent, _) = agent(&addr, "a1", &agent_dir);

    // A task run to its end: the agent has registered (saving its id), made its run's
    // directories and records, and the master has written the task to its registry. As root
    // the task runs as another user and still reaches its sandbox by its path, through the
    // agent's 0711 work dir, but cannot read the master's registry.
    let user = exec_users().remove(0);
    let registry = master_dir.join("registry.redb");
    let (code, out) = exec(
        &addr,
        &[
            "--name",
            "modes",
            "--user",
            &user,
            "--resources",
            "cpus:0.1;mem:32",
            "--",
            "cd",
            "\"$RINGMASTER_SANDBOX\"",
            "&&",
            "echo",
            "here",
            ">",
            "greeting",
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("TASK modes") && l.contains(" FINISHED")),
        "{out}"
    );
    if ringmaster_agent::users::agent_uid() == 0 {
        let (code, out) = exec(
            &addr,
            &[
                "--name",
                "snoop",
                "--user",
                &user,
                "--resources",
                "cpus:0.1;mem:32",
                "--",
                "cat",
                &registry.display().to_string(),
            ],
        );
        assert_ne!(code, 0, "{out}");
        assert!(
            out.lines()
                .any(|l| l.starts_with("TASK snoop") && l.contains(" FAILED")),
            "{out}"
        );
    }

    assert_eq!(mode(&master_dir), 0o700);
    let created = assert_private(&master_dir, &[]);
    assert!(created.contains(&registry), "{created:?}");
    assert_eq!(mode(&registry), 0o600);

    assert_eq!(mode(&agent_dir), 0o711);
    let created = assert_private(&agent_dir, &["sandboxes"]);
    for name in [ringmaster_agent::AGENT_ID_FILE, "meta"] {
        assert!(created.contains(&agent_dir.join(name)), "{created:?}");
    }
    assert_eq!(
        mode(&agent_dir.join(ringmaster_agent::AGENT_ID_FILE)),
        0o600
    );
    // The sandboxes keep their own modes (agent/src/sandbox.rs).
    assert_eq!(mode(&agent_dir.join("sandboxes")), 0o711);
}

#[test]
fn looser_work_dirs_are_tightened_at_start_and_links_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o755);
    let config = master_config(dir.path());
    let outside = dir.path().join("outside");
    std::fs::write(&outside, "not the master's").unwrap();
    chmod(&outside, 0o644);

    // As an older version left them: 0755 directories, 0644 files, and a link to a file
    // outside that must keep its mode.
    let master_dir = dir.path().join("master");
    let agent_dir = dir.path().join("agent");
    for d in [&master_dir, &agent_dir] {
        std::fs::create_dir_all(d.join("old/deeper")).unwrap();
        std::fs::write(d.join("notes"), "x").unwrap();
        std::fs::write(d.join("old/deeper/f"), "x").unwrap();
        std::os::unix::fs::symlink(&outside, d.join("link")).unwrap();
        for p in ["", "old", "old/deeper"] {
            chmod(&d.join(p), 0o755);
        }
        for p in ["notes", "old/deeper/f"] {
            chmod(&d.join(p), 0o644);
        }
    }
    std::fs::create_dir_all(agent_dir.join("sandboxes/fw")).unwrap();
    std::fs::write(agent_dir.join("sandboxes/fw/out"), "x").unwrap();
    chmod(&agent_dir.join("sandboxes/fw"), 0o755);
    chmod(&agent_dir.join("sandboxes/fw/out"), 0o644);

    let (_master, addr, master_log) = master(&config, &master_dir);
    let (_agent, agent_log) = agent(&addr, "a1", &agent_dir);

    assert_eq!(mode(&master_dir), 0o700);
    assert_eq!(mode(&agent_dir), 0o711);
    for (d, log) in [(&master_dir, &master_log), (&agent_dir, &agent_log)] {
        assert_private(d, &["sandboxes"]);
        assert_eq!(mode(&d.join("notes")), 0o600);
        assert_eq!(mode(&d.join("old")), 0o700);
        assert_eq!(mode(&d.join("old/deeper/f")), 0o600);
        // One warning per path, naming it and its old mode.
        for (p, old) in [("", "0755"), ("notes", "0644"), ("old/deeper/f", "0644")] {
            let shown = d.join(p).display().to_string();
            let shown = shown.trim_end_matches('/');
            let lines = log
                .iter()
                .filter(|l| l.contains("WARN") && l.contains(&format!("{shown} was mode {old}")))
                .count();
            assert_eq!(lines, 1, "{shown} {old}:\n{}", log.join("\n"));
        }
        let link = d.join("link").display().to_string();
        assert!(
            log.iter()
                .any(|l| l.contains(&format!("{link} is a symbolic link: left alone"))),
            "{}",
            log.join("\n")
        );
        assert!(std::fs::symlink_metadata(d.join("link"))
            .unwrap()
            .file_type()
            .is_symlink());
    }
    assert_eq!(mode(&outside), 0o644, "the link's target is not touched");
    // The agent's sandboxes are not its to tighten at start.
    assert_eq!(mode(&agent_dir.join("sandboxes/fw")), 0o755);
    assert_eq!(mode(&agent_dir.join("sandboxes/fw/out")), 0o644);
}
