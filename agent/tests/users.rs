//! Task users on the agent's real launch path (docs/security.md, "Task users"): a task that
//! names no user runs as the default (`nobody` for a root agent), root is refused without
//! --allow-root-tasks, unknown users fail, the sandbox is the task user's and 0700, and a task
//! cannot read a root-only file of the agent. Needs root: skipped otherwise.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::time::Duration;

use ringmaster_agent::state::{AgentState, ExitReceiver};
use ringmaster_agent::users::lookup_user;
use ringmaster_agent::AgentConfig;
use ringmaster_proto::convert::ResourcesWire;
use ringmaster_proto::resources::Resources;
use ringmaster_proto::{Attribute, Message, RunTasks, TaskInfo, TaskState, TaskStatus};
use tokio::time::timeout;

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

mod common;

fn config(work_dir: &Path, allow_root_tasks: bool) -> AgentConfig {
    AgentConfig {
        allow_root_tasks,
        ..common::config(work_dir, "users-host")
    }
}

fn task(id: &str, command: &str, user: &str) -> TaskInfo {
    TaskInfo {
        task_id: id.into(),
        name: id.into(),
        command: command.into(),
        resources: Some(Resources::parse("cpus:1").unwrap().to_wire()),
        framework_id: "fw".into(),
        user: user.into(),
        ..Default::default()
    }
}

fn run_one(state: &mut AgentState, info: TaskInfo) -> TaskStatus {
    let out = state.run_tasks(RunTasks {
        tasks: vec![info],
        leader_term: 0,
    });
    let mut statuses: Vec<TaskStatus> = out
        .iter()
        .filter_map(|m| match m {
            Message::StatusUpdate(u) => u.status.clone(),
            _ => None,
        })
        .collect();
    assert_eq!(statuses.len(), 1, "{out:?}");
    statuses.remove(0)
}

/// Runs a task to its end (waiting on the exit event) and returns its final status.
async fn run_to_end(
    state: &mut AgentState,
    exits: &mut ExitReceiver,
    info: TaskInfo,
) -> TaskStatus {
    let id = info.task_id.clone();
    let s = run_one(state, info);
    assert_eq!(s.state, TaskState::TaskRunning as i32, "{s:?}");
    let (key, outcome) = timeout(Duration::from_secs(15), exits.recv())
        .await
        .expect("the task ends in time")
        .expect("exit channel open");
    assert_eq!(key.task_id, id);
    let out = state.process_exited(key, outcome);
    let statuses: Vec<TaskStatus> = out
        .iter()
        .filter_map(|m| match m {
            Message::StatusUpdate(u) => u.status.clone(),
            _ => None,
        })
        .collect();
    statuses.last().cloned().expect("a final status")
}

fn sandbox_file(work_dir: &Path, id: &str, name: &str) -> String {
    std::fs::read_to_string(
        ringmaster_agent::sandbox::latest_run_dir(work_dir, "fw", id).join(name),
    )
    .unwrap()
}

#[tokio::test]
async fn tasks_run_as_the_task_user_and_root_is_refused() {
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    let nobody = lookup_user("nobody").expect("the nobody user exists");
    let dir = tempfile::tempdir().unwrap();
    // Traversable (not listable) by others, so only the file's own mode guards the secret.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    let secret = dir.path().join("secret");
    std::fs::write(&secret, "top secret\n").unwrap();
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();

    let (mut state, mut exits) = AgentState::new(config(dir.path(), false), "a1".into());

    // No user named: the agent's default, nobody.
    let end = run_to_end(
        &mut state,
        &mut exits,
        task(
            "plain",
            "id -u; echo \"$USER $LOGNAME $HOME\"; id -u > uid",
            "",
        ),
    )
    .await;
    assert_eq!(end.state, TaskState::TaskFinished as i32, "{end:?}");
    let stdout = sandbox_file(dir.path(), "plain", "stdout");
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some(nobody.uid.to_string().as_str()));
    assert_eq!(
        lines.next().unwrap(),
        format!("nobody nobody {}", nobody.home.display())
    );
    assert_eq!(
        sandbox_file(dir.path(), "plain", "uid").trim(),
        nobody.uid.to_string()
    );
    // The run directory is the task user's and 0700; above it, the agent's own (0711), so
    // the task cannot replace what the agent walks; the task created its output files itself.
    let sandbox = ringmaster_agent::sandbox::latest_run_dir(dir.path(), "fw", "plain");
    let meta = std::fs::metadata(&sandbox).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (nobody.uid, nobody.gid));
    assert_eq!(meta.permissions().mode() & 0o777, 0o700);
    let task_dir = std::fs::metadata(sandbox.parent().unwrap()).unwrap();
    assert_eq!(
        (task_dir.uid(), task_dir.permissions().mode() & 0o777),
        (0, 0o711)
    );
    let stdout = std::fs::metadata(sandbox.join("stdout")).unwrap();
    assert_eq!((stdout.uid(), stdout.gid()), (nobody.uid, nobody.gid));

    // Root is refused, with a message saying why.
    let s = run_one(&mut state, task("as-root", "id -u", "root"));
    assert_eq!(s.state, TaskState::TaskFailed as i32, "{s:?}");
    assert!(s.message.contains("root"), "{s:?}");
    assert!(s.message.contains("--allow-root-tasks"), "{s:?}");

    // An unknown user fails clearly.
    let s = run_one(&mut state, task("who", "true", "no-such-user-ringmaster"));
    assert_eq!(s.state, TaskState::TaskFailed as i32, "{s:?}");
    assert!(
        s.message.contains("unknown user no-such-user-ringmaster"),
        "{s:?}"
    );

    // A root-only file of the agent's work dir cannot be read.
    let command = format!("cat {}", secret.display());
    let end = run_to_end(&mut state, &mut exits, task("peek", &command, "")).await;
    assert_eq!(end.state, TaskState::TaskFailed as i32, "{end:?}");
    assert_eq!(sandbox_file(dir.path(), "peek", "stdout"), "");
    assert!(
        sandbox_file(dir.path(), "peek", "stderr").contains("Permission denied"),
        "{}",
        sandbox_file(dir.path(), "peek", "stderr")
    );
}

#[tokio::test]
async fn root_tasks_run_when_allowed_and_the_env_is_the_users() {
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (mut state, mut exits) = AgentState::new(config(dir.path(), true), "a1".into());
    let mut info = task("root-ok", "id -u; echo \"$USER\"", "root");
    // The task's own environment still applies.
    info.env = vec![Attribute {
        key: "EXTRA".into(),
        value: "x".into(),
    }];
    info.command.push_str("; echo \"$EXTRA\"");
    let end = run_to_end(&mut state, &mut exits, info).await;
    assert_eq!(end.state, TaskState::TaskFinished as i32, "{end:?}");
    assert_eq!(
        sandbox_file(dir.path(), "root-ok", "stdout"),
        "0\nroot\nx\n"
    );
}

/// The user the agent finally resolves is bounded by the framework's principal
/// (`TaskInfo.allowed_users`, filled by the master): the agent's own default user is refused
/// `not_authorized` when the principal may not use it, and an allowed one runs. No root needed.
#[tokio::test]
async fn the_principals_users_bound_the_resolved_user() {
    let dir = tempfile::tempdir().unwrap();
    let (mut state, mut exits) = AgentState::new(config(dir.path(), false), "a1".into());
    let default_user = state.config().task_user.clone();
    let mut info = task("bounded", "true", "");
    info.allowed_users = vec!["someone-else".into()];
    let s = run_one(&mut state, info);
    assert_eq!(s.state, TaskState::TaskFailed as i32, "{s:?}");
    assert_eq!(s.reason, "not_authorized", "{s:?}");
    assert!(s.message.contains(&default_user), "{s:?}");
    let mut info = task("allowed", "true", "");
    info.allowed_users = vec!["someone-else".into(), default_user];
    let end = run_to_end(&mut state, &mut exits, info).await;
    assert_eq!(end.state, TaskState::TaskFinished as i32, "{end:?}");
}
