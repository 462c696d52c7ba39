//! An agent that stops between recording a task and starting its command, then restarts.

use std::path::Path;
use std::time::Duration;

use ringmaster_agent::state::{reason, AgentState};
use ringmaster_agent::AgentConfig;
use ringmaster_proto::convert::ResourcesWire;
use ringmaster_proto::resources::Resources;
use ringmaster_proto::{RunTasks, TaskInfo, TaskState};
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(20);

mod common;
use common::statuses;

fn config(work_dir: &Path) -> AgentConfig {
    common::config(work_dir, "restart-host")
}

/// The agent recorded the task (with its supervisor's pid) and stopped before opening the
/// launch gate: the supervisor saw the gate close, recorded that the command never ran, and
/// exited. The
/// restarted agent adopts the recorded task and must report it LOST (`not_started`: it never
/// ran, launching it again is safe), not FAILED as a task that ran and vanished. (Found by the
/// replicated-masters history test, whose checker counts a FAILED task that never ran as a
/// violation.)
#[tokio::test]
async fn a_task_whose_command_never_started_is_lost_after_a_restart_not_failed() {
    let dir = tempfile::tempdir().unwrap();
    let (mut first, mut first_exits) = AgentState::new(config(dir.path()), "a1".into());
    let out = first.run_tasks(RunTasks {
        tasks: vec![TaskInfo {
            task_id: "t1".into(),
            name: "t1".into(),
            command: "sleep 300".into(),
            resources: Some(Resources::parse("cpus:1").unwrap().to_wire()),
            framework_id: "fw".into(),
            ..Default::default()
        }],
        leader_term: 0,
    });
    assert_eq!(statuses(&out)[0].state(), TaskState::TaskRunning);
    // What the stop leaves behind: the record with the supervisor's and the task's pids, and
    // the supervisor's record that the gate closed unopened (written as a supervisor whose
    // agent died before opening it writes it).
    let run = ringmaster_agent::sandbox::latest_run(dir.path(), "fw", "t1").unwrap();
    let meta = ringmaster_agent::task_files::meta_dir(dir.path(), "fw", "t1", &run);
    let record =
        std::fs::read_to_string(meta.join(ringmaster_agent::task_files::TASK_FILE)).unwrap();
    let field = |name: &str| -> i32 {
        record
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap()
            .parse()
            .unwrap()
    };
    let (supervisor, pid) = (field("supervisor_pid="), field("pid="));
    // SAFETY: kill has no memory preconditions; -pid is the task's own process group.
    assert_eq!(unsafe { libc::kill(supervisor, libc::SIGKILL) }, 0);
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(-pid, libc::SIGKILL) }, 0);
    timeout(WAIT, first_exits.recv()).await.unwrap().unwrap();
    std::fs::write(
        meta.join(ringmaster_agent::supervisor::EXIT_FILE),
        format!("{}\n", ringmaster_agent::supervisor::NOT_STARTED),
    )
    .unwrap();
    drop(first);

    let (mut second, mut exits) = AgentState::new(config(dir.path()), "a1".into());
    assert_eq!(second.recover_tasks(), 1);
    let (key, outcome) = timeout(WAIT, exits.recv()).await.unwrap().unwrap();
    let out = second.process_exited(key, outcome);
    let s = &statuses(&out)[0];
    assert_eq!(s.state(), TaskState::TaskLost, "{s:?}");
    assert_eq!(s.reason, reason::NOT_STARTED);
    assert_eq!(
        s.message,
        "the command never ran: the agent stopped before starting it"
    );
}
