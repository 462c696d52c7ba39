//! The agent on a full disk (issue 43): a new task fails `agent_disk_full` with a message that
//! names the free space, no disk is offered until there is room, and the agent keeps working;
//! above the disk watermark, ended sandboxes are collected at once, oldest first.

mod common;

use std::cell::Cell;
use std::path::Path;
use std::time::Duration;

use ringmaster_agent::gc::DiskSpace;
use ringmaster_agent::state::{reason, AgentState};
use ringmaster_proto::convert::ResourcesWire;
use ringmaster_proto::resources::Resources;
use ringmaster_proto::{Message, RunTasks, TaskInfo, TaskState};

thread_local! {
    /// What the fake probe reports as available (of 1 GiB).
    static AVAILABLE: Cell<u64> = const { Cell::new(1 << 30) };
}

fn probe(_: &Path) -> Option<DiskSpace> {
    Some(DiskSpace {
        available: AVAILABLE.with(Cell::get),
        free: AVAILABLE.with(Cell::get),
        total: 1 << 30,
    })
}

fn task(id: &str, command: &str) -> TaskInfo {
    TaskInfo {
        task_id: id.into(),
        name: id.into(),
        command: command.into(),
        resources: Some(Resources::parse("cpus:1;mem:64;disk:10").unwrap().to_wire()),
        framework_id: "fw".into(),
        ..Default::default()
    }
}

fn free_disk(out: &[Message]) -> u64 {
    out.iter()
        .find_map(|m| match m {
            Message::AgentHeartbeat(h) => {
                Some(Resources::from_wire(h.free.as_ref()).unwrap().milli("disk"))
            }
            _ => None,
        })
        .expect("a heartbeat")
}

async fn run_to_end(
    state: &mut AgentState,
    exits: &mut ringmaster_agent::state::ExitReceiver,
    info: TaskInfo,
) -> Vec<ringmaster_proto::TaskStatus> {
    let mut seen = common::statuses(&state.run_tasks(RunTasks {
        tasks: vec![info],
        leader_term: 0,
    }));
    let (key, outcome) = tokio::time::timeout(Duration::from_secs(20), exits.recv())
        .await
        .unwrap()
        .unwrap();
    seen.extend(common::statuses(&state.process_exited(key, outcome)));
    seen
}

#[tokio::test]
async fn a_full_disk_refuses_new_tasks_and_offers_no_disk_until_there_is_room() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::config(dir.path(), "disk-host");
    config.resources = Resources::parse("cpus:8;mem:1024;disk:1000").unwrap();
    let (mut state, mut exits) = AgentState::new(config, "a1".into());
    state.set_disk_probe(probe);

    AVAILABLE.with(|a| a.set(3 << 20)); // 3 MiB
    let out = state.run_tasks(RunTasks {
        tasks: vec![task("t1", "true")],
        leader_term: 0,
    });
    let refused = &common::statuses(&out)[0];
    assert_eq!(refused.state(), TaskState::TaskFailed, "{refused:?}");
    assert_eq!(refused.reason, reason::AGENT_DISK_FULL);
    assert!(
        refused
            .message
            .starts_with("the agent's disk is full: 3.0 MiB free in "),
        "{refused:?}"
    );
    assert!(
        !ringmaster_agent::sandbox::sandbox_dir(dir.path(), "fw", "t1").exists(),
        "nothing was created"
    );
    assert_eq!(free_disk(&out), 0, "a full disk is not offered");

    // Room again: the next task runs and disk is offered again.
    AVAILABLE.with(|a| a.set(512 << 20));
    let seen = run_to_end(&mut state, &mut exits, task("t2", "echo fine")).await;
    assert_eq!(seen.last().unwrap().state(), TaskState::TaskFinished);
    assert_eq!(free_disk(&[state.heartbeat()]), 1000 * 1000);
}

#[tokio::test]
async fn above_the_watermark_ended_sandboxes_go_at_once_oldest_first() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::config(dir.path(), "gc-host");
    config.resources = Resources::parse("cpus:8;mem:1024;disk:1000").unwrap();
    config.safeguards.sandbox_gc_delay = Duration::from_secs(3600);
    config.safeguards.disk_watermark = 0.9;
    let (mut state, mut exits) = AgentState::new(config, "a1".into());
    state.set_disk_probe(probe);
    AVAILABLE.with(|a| a.set(512 << 20));
    // Acknowledged one after the other: "a-old" first, and first too when both are
    // acknowledged within the same millisecond (entries then go by path).
    for id in ["a-old", "b-new"] {
        let seen = run_to_end(&mut state, &mut exits, task(id, "echo x")).await;
        for s in &seen {
            state.acknowledged(&s.update_id);
        }
    }
    assert_eq!(state.sandboxes_waiting(), 2);
    // Within the delay and below the watermark: nothing goes.
    assert!(state
        .sandboxes_to_collect(ringmaster_agent::updates::unix_ms())
        .is_empty());
    // 95 % used: the oldest goes, then the disk is measured again on the next pass.
    AVAILABLE.with(|a| a.set((1 << 30) / 20));
    let due = state.sandboxes_to_collect(ringmaster_agent::updates::unix_ms());
    assert_eq!(due.len(), 1);
    assert_eq!(
        due[0].run_dir.parent().unwrap(),
        ringmaster_agent::sandbox::sandbox_dir(dir.path(), "fw", "a-old")
    );
    ringmaster_agent::gc::remove(&due[0]).unwrap();
    assert!(!ringmaster_agent::sandbox::sandbox_dir(dir.path(), "fw", "a-old").exists());
    assert!(ringmaster_agent::sandbox::sandbox_dir(dir.path(), "fw", "b-new").exists());
    // After the delay, the rest goes whatever the disk.
    AVAILABLE.with(|a| a.set(512 << 20));
    let later = ringmaster_agent::updates::unix_ms() + 3_600_000;
    assert_eq!(state.sandboxes_to_collect(later).len(), 1);
}
