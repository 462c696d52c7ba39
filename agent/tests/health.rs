//! Health checks on the agent's real launch path (crate::health, docs/protocol.md): a task
//! whose check fails once a marker file appears in its sandbox is reported healthy, then
//! unhealthy (a RUNNING update), is killed and ends FAILED with reason health_check_failed.
//! Runs as root (the check then runs as the task user) and unprivileged.

use std::path::Path;
use std::time::Duration;

use ringmaster_agent::state::{reason, AgentState};
use ringmaster_agent::AgentConfig;
use ringmaster_proto::convert::ResourcesWire;
use ringmaster_proto::resources::Resources;
use ringmaster_proto::{HealthCheck, RunTasks, TaskHealth, TaskInfo, TaskState};
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(20);

mod common;
use common::statuses;

fn config(work_dir: &Path) -> AgentConfig {
    common::config(work_dir, "health-host")
}

#[tokio::test]
async fn a_failing_check_reports_unhealthy_kills_the_task_and_fails_it() {
    let dir = tempfile::tempdir().unwrap();
    let (mut state, mut exits) = AgentState::new(config(dir.path()), "a1".into());
    let mut health = state.take_health_events().unwrap();
    let info = TaskInfo {
        task_id: "t1".into(),
        name: "t1".into(),
        // The check sees the task's env and sandbox: it fails once `broken` is there.
        command: "sleep 300".into(),
        resources: Some(Resources::parse("cpus:1").unwrap().to_wire()),
        framework_id: "fw".into(),
        env: vec![ringmaster_proto::Attribute {
            key: "MARKER".into(),
            value: "broken".into(),
        }],
        health: Some(HealthCheck {
            command:
                "id -un > whoami; test ! -e \"$MARKER\" || { echo \"$MARKER is there\"; exit 1; }"
                    .into(),
            // Generous: this test is about failing checks, not slow ones. The agent caps a
            // check's timeout at its interval, so the interval is what bounds it: at 100 ms a
            // check slowed by a loaded 2-core machine (a parallel test build, run unprivileged)
            // timed out and the failure read "timed out after 100ms", not the check's output.
            interval_ms: 1_000,
            timeout_ms: 1_000,
            failures: 2,
            grace_ms: 50,
        }),
        ..Default::default()
    };
    let out = state.run_tasks(RunTasks {
        tasks: vec![info],
        leader_term: 0,
    });
    let s = &statuses(&out)[0];
    assert_eq!(s.state(), TaskState::TaskRunning, "{s:?}");
    assert_eq!(s.health(), TaskHealth::Unknown);

    let (key, event) = timeout(WAIT, health.recv()).await.unwrap().unwrap();
    let out = state.health_changed(key.clone(), event);
    let s = &statuses(&out)[0];
    assert_eq!(
        (s.state(), s.health()),
        (TaskState::TaskRunning, TaskHealth::Healthy)
    );
    // The check ran as the task's user.
    let sandbox = ringmaster_agent::sandbox::latest_run_dir(dir.path(), "fw", "t1");
    let whoami = std::fs::read_to_string(sandbox.join("whoami")).unwrap();
    let task_user =
        ringmaster_agent::users::lookup_user(&config(dir.path()).task_user).map(|u| u.name);
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        assert_eq!(Some(whoami.trim().to_string()), task_user);
    }

    std::fs::write(sandbox.join("broken"), "").unwrap();
    let (key, event) = timeout(WAIT, health.recv()).await.unwrap().unwrap();
    let out = state.health_changed(key, event);
    let s = &statuses(&out)[0];
    assert_eq!(
        (s.state(), s.health()),
        (TaskState::TaskRunning, TaskHealth::Unhealthy)
    );
    assert_eq!(s.reason, reason::HEALTH_CHECK_FAILED);
    assert_eq!(s.message, "health check failed 2 times: broken is there");

    // Killed with its grace; it ends FAILED for its health.
    let (key, outcome) = timeout(WAIT, exits.recv()).await.unwrap().unwrap();
    let out = state.process_exited(key, outcome);
    let s = &statuses(&out)[0];
    assert_eq!(s.state(), TaskState::TaskFailed, "{s:?}");
    assert_eq!(s.reason, reason::HEALTH_CHECK_FAILED);
    assert_eq!(s.message, "health check failed 2 times: broken is there");
    assert_eq!(s.health(), TaskHealth::Unhealthy);
}

#[tokio::test]
async fn an_empty_health_command_is_refused_at_launch() {
    let dir = tempfile::tempdir().unwrap();
    let (mut state, _exits) = AgentState::new(config(dir.path()), "a1".into());
    let info = TaskInfo {
        task_id: "t1".into(),
        command: "sleep 300".into(),
        resources: Some(Resources::parse("cpus:1").unwrap().to_wire()),
        framework_id: "fw".into(),
        health: Some(HealthCheck::default()),
        ..Default::default()
    };
    let out = state.run_tasks(RunTasks {
        tasks: vec![info],
        leader_term: 0,
    });
    let s = &statuses(&out)[0];
    assert_eq!(s.state(), TaskState::TaskFailed);
    assert_eq!(s.reason, reason::LAUNCH_FAILED);
    assert!(s.message.contains("health check"), "{s:?}");
}

#[tokio::test]
async fn failing_checks_of_a_task_that_ended_on_its_own_do_not_change_how_it_ended() {
    let dir = tempfile::tempdir().unwrap();
    let (mut state, mut exits) = AgentState::new(config(dir.path()), "a1".into());
    let info = TaskInfo {
        task_id: "t1".into(),
        command: "exit 3".into(),
        resources: Some(Resources::parse("cpus:1").unwrap().to_wire()),
        framework_id: "fw".into(),
        health: Some(HealthCheck {
            command: "true".into(),
            interval_ms: 1000,
            failures: 1,
            ..Default::default()
        }),
        ..Default::default()
    };
    state.run_tasks(RunTasks {
        tasks: vec![info],
        leader_term: 0,
    });
    // The process is gone, its exit not handled yet: a check's failure arrives first.
    let (key, outcome) = timeout(WAIT, exits.recv()).await.unwrap().unwrap();
    let unhealthy = ringmaster_agent::health::HealthEvent::Unhealthy {
        message: "health check failed 1 times: gone".into(),
    };
    assert!(state.health_changed(key.clone(), unhealthy).is_empty());
    let out = state.process_exited(key, outcome);
    let s = &statuses(&out)[0];
    assert_eq!(s.state(), TaskState::TaskFailed);
    assert_eq!(s.reason, reason::EXIT_STATUS);
    assert_eq!(s.exit_code, Some(3));
    assert_eq!(s.health(), TaskHealth::Unknown);
}
