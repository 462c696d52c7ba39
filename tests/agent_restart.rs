//! Agent-side durability with the real `ringmaster-agent` binary: killed with `kill -9` and
//! restarted on the same work dir, it adopts the task that still runs (nothing is launched
//! twice, and the adopted task can still be killed) and reports the real exit status of the
//! task that ended while it was down.

mod common;
mod processes;

use common::*;
use ringmaster_proto::{Kill, Message, TaskState};

#[tokio::test]
async fn a_restarted_agent_adopts_running_tasks_and_reports_ended_ones() {
    let master = start_master(test_config("  agent_timeout: 30s\n")).await;
    let addr = master.addr().to_string();
    let work = tempfile::tempdir().unwrap();
    let go = work.path().join("go");
    let agent = processes::start_agent(&addr, "a1", "cpus:4;mem:1024", work.path());
    wait_for_state(&master, "agent registered", |s| {
        s.agents.iter().any(|a| a.connected)
    })
    .await;

    let mut fw = Client::framework(master.addr(), "f").await;
    fw.demand("cpus:2;mem:256", 1).await;
    let offer = fw.expect_offers().await.remove(0);
    fw.demand("cpus:1;mem:128", 0).await;
    let waiter = format!(
        "while [ ! -e '{}' ]; do sleep 0.05; done; exit 3",
        go.display()
    );
    fw.accept(
        &offer.offer_id,
        vec![
            task("long", "cpus:1;mem:128", "sleep 100"),
            task("ends", "cpus:1;mem:128", &waiter),
        ],
    )
    .await;
    for id in ["long", "ends"] {
        let running = fw.expect_state(id, TaskState::TaskRunning).await;
        fw.ack(&running).await;
    }
    // The agent's own record of each run, outside every sandbox.
    let meta = |id: &str| {
        let run = ringmaster_agent::sandbox::latest_run(work.path(), &fw.id, id).unwrap();
        ringmaster_agent::task_files::meta_dir(work.path(), &fw.id, id, &run)
    };
    let long_file = std::fs::read_to_string(meta("long").join("task")).unwrap();
    let long_pid: u32 = long_file
        .lines()
        .find_map(|l| l.strip_prefix("pid="))
        .unwrap()
        .parse()
        .unwrap();

    // Crash the agent; its tasks keep running in their own process groups.
    drop(agent); // SIGKILL
    wait_for_state(&master, "agent disconnected", |s| !s.agents[0].connected).await;
    assert!(ringmaster_agent::process::process_is_alive(long_pid));
    // One task ends while no agent watches it.
    std::fs::write(&go, b"").unwrap();
    wait_for_file(&meta("ends").join(ringmaster_agent::supervisor::EXIT_FILE)).await;

    let _agent = processes::start_agent(&addr, "a1", "cpus:4;mem:1024", work.path());
    let ended = fw.expect_state("ends", TaskState::TaskFailed).await;
    assert_eq!(ended.exit_code, Some(3), "{ended:?}");
    assert_eq!(ended.reason, "exit_status");
    fw.ack(&ended).await;
    let s = wait_for_state(&master, "the agent is back with one running task", |s| {
        s.agents[0].connected && s.agents[0].tasks == 1
    })
    .await;
    assert_eq!(s.counters.tasks_launched, 2, "nothing was launched again");
    let long = s.tasks.iter().find(|t| t.id == "long").unwrap();
    assert_eq!(long.state, "RUNNING");
    assert!(ringmaster_agent::process::process_is_alive(long_pid));

    // The adopted task is still under the agent's control.
    fw.send(Message::Kill(Kill {
        task_id: "long".into(),
    }))
    .await;
    let killed = fw.expect_state("long", TaskState::TaskKilled).await;
    assert_eq!(killed.reason, "killed_by_framework");
    assert!(!ringmaster_agent::process::process_is_alive(long_pid));
    assert!(!ringmaster_agent::process::group_has_live_members(long_pid));
}

/// A restarted agent keeps checking the health of a task it adopts: the check, failing after
/// the restart, gets the task killed and reported FAILED with `health_check_failed` (before,
/// an adopted task was never checked again).
#[tokio::test]
async fn a_restarted_agent_keeps_checking_an_adopted_tasks_health() {
    let master = start_master(test_config("  agent_timeout: 30s\n")).await;
    let addr = master.addr().to_string();
    let work = tempfile::tempdir().unwrap();
    let agent = processes::start_agent(&addr, "a1", "cpus:4;mem:1024", work.path());
    wait_for_state(&master, "agent registered", |s| {
        s.agents.iter().any(|a| a.connected)
    })
    .await;
    let mut fw = Client::framework(master.addr(), "f").await;
    fw.demand("cpus:1;mem:128", 1).await;
    let offer = fw.expect_offers().await.remove(0);
    fw.demand("cpus:1;mem:128", 0).await;
    let mut checked = task("checked", "cpus:1;mem:128", "touch ok; sleep 1000");
    checked.health = Some(ringmaster_proto::HealthCheck {
        command: "test -f ok".into(),
        interval_ms: 100,
        timeout_ms: 1000,
        failures: 2,
        grace_ms: 100,
    });
    fw.accept(&offer.offer_id, vec![checked]).await;
    let running = fw.expect_state("checked", TaskState::TaskRunning).await;
    fw.ack(&running).await;
    wait_for_state(&master, "the task reported healthy", |s| {
        s.tasks
            .iter()
            .any(|t| t.id == "checked" && t.healthy == Some(true))
    })
    .await;

    drop(agent); // SIGKILL; the task keeps running
    wait_for_state(&master, "agent disconnected", |s| !s.agents[0].connected).await;
    let sandbox = ringmaster_agent::sandbox::latest_run_dir(work.path(), &fw.id, "checked");
    std::fs::remove_file(sandbox.join("ok")).unwrap();
    let _agent = processes::start_agent(&addr, "a1", "cpus:4;mem:1024", work.path());
    let failed = fw.expect_state("checked", TaskState::TaskFailed).await;
    assert_eq!(failed.reason, "health_check_failed", "{failed:?}");
}
