//! Tasks: status updates from agents, acknowledgements and retries, reconciliation, kill.

use ringmaster_proto::{
    ErrorCode, Kill, KillTask, Message, Reconcile, StatusAck, StatusUpdate, TaskState, TaskStatus,
};
use tokio::time::Duration;

use super::super::harness::{error, register, Harness, Out};
use super::{running, status, update};

#[test]
fn a_status_update_is_acked_to_the_agent_and_forwarded_to_the_framework() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    h.launch(&fw, "t1", "cpus:1;mem:128");
    h.advance(Duration::from_millis(300));
    let agent_update = h.status(agent, &fw, "t1", TaskState::TaskRunning);
    assert_eq!(
        h.messages(agent),
        vec![Message::StatusAck(StatusAck {
            task_id: "t1".into(),
            update_id: agent_update,
        })]
    );
    assert_eq!(
        h.sent(fw.conn),
        vec![update(status(
            &h,
            &fw,
            "t1",
            "a1",
            TaskState::TaskRunning,
            "",
            "",
            "0-U2"
        ))]
    );
    assert_eq!(h.task_state(&fw, "t1"), Some(TaskState::TaskRunning));
}

#[test]
fn an_unacknowledged_update_is_resent_with_a_doubling_backoff() {
    // The agent stays registered without heartbeats over these minutes.
    let mut h = Harness::configured(|c| c.master.agent_timeout = Duration::from_secs(3600));
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    h.launch(&fw, "t1", "cpus:1;mem:128");
    h.status(agent, &fw, "t1", TaskState::TaskRunning);
    let first = h.sent(fw.conn);
    assert_eq!(first.len(), 1);
    h.advance_and_tick(Duration::from_secs(2) - Duration::from_millis(1));
    h.expect_nothing(fw.conn);
    h.advance_and_tick(Duration::from_millis(1));
    // The very same update, id and timestamp included, after status_retry_interval (2 s)...
    assert_eq!(h.sent(fw.conn), first);
    // ...then after 4 s, 8 s, ... (a framework slow to read is not buried under copies).
    h.advance_and_tick(Duration::from_secs(2));
    h.expect_nothing(fw.conn);
    h.advance_and_tick(Duration::from_secs(2));
    assert_eq!(h.sent(fw.conn), first);
    h.advance_and_tick(Duration::from_secs(8) - Duration::from_millis(1));
    h.expect_nothing(fw.conn);
    h.advance_and_tick(Duration::from_millis(1));
    assert_eq!(h.sent(fw.conn), first);
    // The backoff stops growing at 32 × the interval (64 s).
    for _ in 0..6 {
        h.advance_and_tick(Duration::from_secs(64));
        assert_eq!(h.sent(fw.conn), first);
    }
    h.advance_and_tick(Duration::from_secs(64) - Duration::from_millis(1));
    h.expect_nothing(fw.conn);
    h.advance_and_tick(Duration::from_millis(1));
    assert_eq!(h.sent(fw.conn), first);
}

#[test]
fn a_resubscribed_framework_gets_its_updates_at_once_and_the_backoff_starts_over() {
    // The agent stays registered without heartbeats over these minutes.
    let mut h = Harness::configured(|c| c.master.agent_timeout = Duration::from_secs(3600));
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    h.launch(&fw, "t1", "cpus:1;mem:128");
    h.status(agent, &fw, "t1", TaskState::TaskRunning);
    let first = h.sent(fw.conn);
    for wait in [2, 4, 8] {
        h.advance_and_tick(Duration::from_secs(wait));
        assert_eq!(h.sent(fw.conn), first);
    }
    h.disconnect(fw.conn);
    let conn = h.connect(Message::Subscribe(ringmaster_proto::Subscribe {
        framework_id: fw.id.clone(),
        ..super::super::harness::subscribe("web")
    }));
    let again = h.sent(conn);
    assert_eq!(
        again.len(),
        2,
        "Subscribed and the update expected: {again:?}"
    );
    assert_eq!(again[1..], first[..]);
    h.advance_and_tick(Duration::from_secs(2));
    assert_eq!(h.sent(conn), first);
}

#[test]
fn an_acknowledged_update_is_not_resent() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    h.launch(&fw, "t1", "cpus:1;mem:128");
    h.status(agent, &fw, "t1", TaskState::TaskRunning);
    let running = h.expect_update(&fw);
    h.ack(&fw, &running);
    h.advance_and_tick(Duration::from_secs(10));
    h.expect_nothing(fw.conn);
    assert!(h.state.frameworks[&fw.id].unacked.is_empty());
}

#[test]
fn a_terminal_status_frees_the_tasks_resources_for_the_next_offer() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    running(&mut h, &fw, agent, "t1", "cpus:4;mem:1024");
    assert_eq!(h.snapshot().free, "");
    h.send(
        agent,
        Message::StatusUpdate(StatusUpdate {
            status: Some(TaskStatus {
                task_id: "t1".into(),
                framework_id: fw.id.clone(),
                state: TaskState::TaskFailed as i32,
                reason: "command_failed".into(),
                message: "exit status 3".into(),
                exit_code: Some(3),
                update_id: "u-failed".into(),
                ..Default::default()
            }),
        }),
    );
    let mut failed = status(
        &h,
        &fw,
        "t1",
        "a1",
        TaskState::TaskFailed,
        "command_failed",
        "exit status 3",
        "0-U3",
    );
    failed.exit_code = Some(3);
    assert_eq!(h.sent(fw.conn), vec![update(failed)]);
    assert_eq!(h.snapshot().free, "cpus:4;mem:1024");
    h.demand(&fw, "cpus:2;mem:128", 1);
    h.settle();
    assert_eq!(h.expect_offers(&fw)[0].agent_id, "a1");
}

#[test]
fn a_status_for_an_unknown_task_or_from_another_agent_is_acked_and_ignored() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let other = h.agent("a2", "cpus:4;mem:1024");
    let fw = h.framework("web");
    let on = h.launch(&fw, "t1", "cpus:1;mem:128");
    assert_eq!(on, "a1");
    let ghost = h.status(agent, &fw, "ghost", TaskState::TaskRunning);
    let wrong = h.status(other, &fw, "t1", TaskState::TaskFinished);
    assert_eq!(
        h.messages(agent),
        vec![Message::StatusAck(StatusAck {
            task_id: "ghost".into(),
            update_id: ghost,
        })]
    );
    assert_eq!(
        h.messages(other),
        vec![Message::StatusAck(StatusAck {
            task_id: "t1".into(),
            update_id: wrong,
        })]
    );
    h.expect_nothing(fw.conn);
    assert_eq!(h.task_state(&fw, "t1"), Some(TaskState::TaskStaging));
}

#[test]
fn a_status_update_without_a_status_is_an_error() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    h.send(agent, Message::StatusUpdate(StatusUpdate { status: None }));
    assert_eq!(
        h.expect_error(agent),
        error(ErrorCode::InvalidRequest, "StatusUpdate without a status")
    );
}

#[test]
fn explicit_reconciliation_answers_each_task_without_update_ids() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    running(&mut h, &fw, agent, "t1", "cpus:1;mem:128");
    h.advance(Duration::from_secs(1));
    h.send(
        fw.conn,
        Message::Reconcile(Reconcile {
            task_ids: vec!["t1".into(), "ghost".into()],
        }),
    );
    let mut ghost = status(
        &h,
        &fw,
        "ghost",
        "",
        TaskState::TaskLost,
        "reconciliation",
        "the master does not know this task",
        "",
    );
    ghost.timestamp_ms = 0;
    assert_eq!(
        h.sent(fw.conn),
        vec![
            update(status(
                &h,
                &fw,
                "t1",
                "a1",
                TaskState::TaskRunning,
                "",
                "",
                ""
            )),
            update(ghost),
        ]
    );
    // Nothing to acknowledge: nothing is resent.
    assert!(h.state.frameworks[&fw.id].unacked.is_empty());
}

#[test]
fn implicit_reconciliation_answers_every_live_task_in_id_order() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    running(&mut h, &fw, agent, "t2", "cpus:1;mem:128");
    h.launch(&fw, "t1", "cpus:1;mem:128");
    running(&mut h, &fw, agent, "t3", "cpus:1;mem:128");
    h.status(agent, &fw, "t3", TaskState::TaskFinished);
    let finished = h.expect_update(&fw);
    h.ack(&fw, &finished);
    h.send(fw.conn, Message::Reconcile(Reconcile { task_ids: vec![] }));
    assert_eq!(
        h.sent(fw.conn),
        vec![
            update(status(
                &h,
                &fw,
                "t1",
                "a1",
                TaskState::TaskStaging,
                "",
                "",
                ""
            )),
            update(status(
                &h,
                &fw,
                "t2",
                "a1",
                TaskState::TaskRunning,
                "",
                "",
                ""
            )),
        ]
    );
}

#[test]
fn kill_sends_kill_task_to_the_agent_and_the_killed_status_back() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    running(&mut h, &fw, agent, "t1", "cpus:1;mem:128");
    h.send(
        fw.conn,
        Message::Kill(Kill {
            task_id: "t1".into(),
        }),
    );
    assert_eq!(
        h.messages(agent),
        vec![Message::KillTask(KillTask {
            leader_term: 0,
            task_id: "t1".into(),
            framework_id: fw.id.clone(),
            reason: "killed_by_framework".into(),
        })]
    );
    h.expect_nothing(fw.conn);
    h.status(agent, &fw, "t1", TaskState::TaskKilled);
    assert_eq!(
        h.sent(fw.conn),
        vec![update(status(
            &h,
            &fw,
            "t1",
            "a1",
            TaskState::TaskKilled,
            "",
            "",
            "0-U3"
        ))]
    );
    assert_eq!(h.snapshot().free, "cpus:4;mem:1024");
}

#[test]
fn killing_an_unknown_task_answers_lost_to_be_acknowledged() {
    let mut h = Harness::new();
    let fw = h.framework("web");
    h.send(
        fw.conn,
        Message::Kill(Kill {
            task_id: "nope".into(),
        }),
    );
    let mut lost = status(
        &h,
        &fw,
        "nope",
        "",
        TaskState::TaskLost,
        "unknown_task",
        "no such task",
        "0-U1",
    );
    lost.timestamp_ms = 0;
    assert_eq!(h.sent(fw.conn), vec![update(lost.clone())]);
    // It is resent until acknowledged.
    h.advance_and_tick(Duration::from_secs(2));
    assert_eq!(h.sent(fw.conn), vec![update(lost.clone())]);
    h.ack(&fw, &lost);
    h.advance_and_tick(Duration::from_secs(2));
    h.expect_nothing(fw.conn);
}

#[test]
fn killing_an_ended_task_repeats_its_terminal_status() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    running(&mut h, &fw, agent, "t1", "cpus:1;mem:128");
    h.status(agent, &fw, "t1", TaskState::TaskFinished);
    let finished = h.expect_update(&fw);
    h.ack(&fw, &finished);
    h.sent(agent);
    h.advance(Duration::from_secs(1));
    h.send(
        fw.conn,
        Message::Kill(Kill {
            task_id: "t1".into(),
        }),
    );
    h.expect_nothing(agent);
    assert_eq!(
        h.sent(fw.conn),
        vec![update(status(
            &h,
            &fw,
            "t1",
            "a1",
            TaskState::TaskFinished,
            "",
            "",
            "0-U4"
        ))]
    );
}

#[test]
fn killing_a_task_whose_agent_is_disconnected_sends_nothing() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    running(&mut h, &fw, agent, "t1", "cpus:1;mem:128");
    h.disconnect(agent);
    h.send(
        fw.conn,
        Message::Kill(Kill {
            task_id: "t1".into(),
        }),
    );
    h.expect_nothing(fw.conn);
    assert_eq!(h.task_state(&fw, "t1"), Some(TaskState::TaskRunning));
}

#[test]
fn agent_loss_reports_every_task_lost() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    running(&mut h, &fw, agent, "t1", "cpus:1;mem:128");
    running(&mut h, &fw, agent, "t2", "cpus:1;mem:128");
    // No heartbeat after the last status: lost agent_timeout later, on the actor's ticks.
    h.run_for(Duration::from_secs(16));
    let mut lost = h.expect_updates(&fw);
    lost.sort_by(|a, b| a.task_id.cmp(&b.task_id));
    let ids: Vec<(&str, TaskState, &str)> = lost
        .iter()
        .map(|s| (s.task_id.as_str(), s.state(), s.reason.as_str()))
        .collect();
    assert_eq!(
        ids,
        vec![
            ("t1", TaskState::TaskLost, "agent_lost"),
            ("t2", TaskState::TaskLost, "agent_lost"),
        ]
    );
    assert_eq!(
        h.expect_closed(agent),
        error(
            ErrorCode::NotRegistered,
            "agent a1 was declared lost; re-register"
        )
    );
    assert_eq!(h.snapshot().tasks_by_state.get("LOST"), Some(&2));
}

#[test]
fn a_task_adopted_after_agent_loss_belongs_to_its_framework_again() {
    let mut h = Harness::new();
    let old = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    running(&mut h, &fw, old, "t1", "cpus:1;mem:128");
    h.disconnect(old);
    h.advance_and_tick(Duration::from_secs(15));
    let lost = h.expect_update(&fw);
    h.ack(&fw, &lost);
    let mut again = register("a1", "cpus:4;mem:1024");
    again.tasks = vec![TaskStatus {
        task_id: "t1".into(),
        framework_id: fw.id.clone(),
        state: TaskState::TaskRunning as i32,
        ..Default::default()
    }];
    let new = h.connect(Message::RegisterAgent(again));
    h.sent(new);
    let back = h.expect_update(&fw);
    h.ack(&fw, &back);
    assert_eq!(h.snapshot().frameworks[0].tasks, 1);
    h.send(fw.conn, Message::Reconcile(Reconcile { task_ids: vec![] }));
    assert_eq!(
        h.sent(fw.conn),
        vec![update(status(
            &h,
            &fw,
            "t1",
            "a1",
            TaskState::TaskRunning,
            "agent_reregistered",
            "the agent re-registered and still runs the task",
            ""
        ))]
    );
    // Teardown must kill it on the agent.
    h.send(fw.conn, Message::Teardown(Default::default()));
    assert_eq!(
        h.sent(new),
        vec![Out::Msg(Message::KillTask(KillTask {
            leader_term: 0,
            task_id: "t1".into(),
            framework_id: fw.id.clone(),
            reason: "framework_teardown".into(),
        }))]
    );
}

#[test]
fn a_newer_update_supersedes_the_unacknowledged_one() {
    // The agent stays registered without heartbeats over these seconds.
    let mut h = Harness::configured(|c| c.master.agent_timeout = Duration::from_secs(3600));
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    h.launch(&fw, "t1", "cpus:1;mem:128");
    h.status(agent, &fw, "t1", TaskState::TaskRunning);
    let running = h.expect_update(&fw);
    h.status(agent, &fw, "t1", TaskState::TaskFinished);
    let finished = h.expect_update(&fw);
    assert_eq!(finished.state, TaskState::TaskFinished as i32);
    // One update held per task: the newest.
    assert_eq!(h.state.frameworks[&fw.id].unacked.len(), 1);
    h.advance_and_tick(Duration::from_secs(2));
    assert_eq!(
        h.sent(fw.conn),
        vec![update(finished.clone())],
        "only the newest update is resent, the same as first sent"
    );
    // Acknowledging the superseded update changes nothing...
    h.ack(&fw, &running);
    assert_eq!(h.state.frameworks[&fw.id].unacked.len(), 1);
    assert!(h.state.tasks[&crate::master::state::make_task_key(&fw.id, "t1")].terminal_unacked);
    // ...the newest completes the task.
    h.ack(&fw, &finished);
    assert!(h.state.frameworks[&fw.id].unacked.is_empty());
    let task = &h.state.tasks[&crate::master::state::make_task_key(&fw.id, "t1")];
    assert!(!task.terminal_unacked);
    assert_eq!(task.pending_update, None);
    h.advance_and_tick(Duration::from_secs(10));
    h.expect_nothing(fw.conn);
}

#[test]
fn an_update_about_an_unknown_task_is_held_whole_and_resent_unchanged() {
    let mut h = Harness::configured(|c| c.master.agent_timeout = Duration::from_secs(3600));
    let fw = h.framework("web");
    h.send(
        fw.conn,
        Message::Kill(Kill {
            task_id: "nope".into(),
        }),
    );
    let lost = h.expect_update(&fw);
    assert_eq!(lost.reason, "unknown_task");
    h.advance_and_tick(Duration::from_secs(2));
    assert_eq!(h.sent(fw.conn), vec![update(lost.clone())]);
    h.ack(&fw, &lost);
    assert!(h.state.frameworks[&fw.id].unacked.is_empty());
}

#[test]
fn an_update_id_of_another_master_incarnation_is_not_an_acknowledgement() {
    let mut h = Harness::configured(|c| c.master.agent_timeout = Duration::from_secs(3600));
    let agent = h.agent("a1", "cpus:4;mem:1024");
    let fw = h.framework("web");
    h.launch(&fw, "t1", "cpus:1;mem:128");
    h.status(agent, &fw, "t1", TaskState::TaskRunning);
    let running = h.expect_update(&fw);
    let seq = running.update_id.rsplit_once("-U").unwrap().1.to_string();
    for forged in [
        format!("ffff-U{seq}"),
        format!("0-U0{seq}"),
        format!("0-U+{seq}"),
    ] {
        h.ack(
            &fw,
            &TaskStatus {
                update_id: forged,
                ..running.clone()
            },
        );
        assert_eq!(h.state.frameworks[&fw.id].unacked.len(), 1);
    }
    h.ack(&fw, &running);
    assert!(h.state.frameworks[&fw.id].unacked.is_empty());
}

#[test]
fn tasks_of_a_framework_with_equal_resources_share_one_bundle() {
    let mut h = Harness::new();
    h.agent("a1", "cpus:8;mem:4096");
    let fw = h.framework("web");
    let other = h.framework("batch");
    h.launch(&fw, "t1", "cpus:1;mem:128");
    h.launch(&fw, "t2", "cpus:1;mem:128");
    h.launch(&fw, "t3", "cpus:2;mem:128");
    h.launch(&other, "t1", "cpus:1;mem:128");
    let bundle = |h: &Harness, fw: &super::super::harness::Fw, id: &str| {
        h.task_resources(fw, id).expect("known task")
    };
    let (t1, t2, t3) = (
        bundle(&h, &fw, "t1"),
        bundle(&h, &fw, "t2"),
        bundle(&h, &fw, "t3"),
    );
    assert!(
        std::sync::Arc::ptr_eq(&t1, &t2),
        "equal resources, one bundle"
    );
    assert!(!std::sync::Arc::ptr_eq(&t2, &t3));
    assert_eq!(t3.to_string(), "cpus:2;mem:128");
    // Another framework has its own.
    assert!(!std::sync::Arc::ptr_eq(&t1, &bundle(&h, &other, "t1")));
    assert_eq!(*t1, *bundle(&h, &other, "t1"));
}
