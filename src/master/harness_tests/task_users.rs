//! A principal's `users` bound its frameworks' tasks (docs/security.md, "Task users"): a task
//! naming another user fails alone (FAILED, `not_authorized`), its siblings launch, and every
//! launched task carries the principal's users to its agent in `TaskInfo.allowed_users`,
//! whatever the framework put there.

use std::collections::{BTreeMap, BTreeSet};

use ringmaster_proto::security::AuthRole;
use ringmaster_proto::{Message, RunTasks, TaskInfo, TaskState};

use super::super::harness::{subscribe, task, Fw, Harness, Out};
use super::{status, update};
use crate::security::{AllowedUsers, AuthConfig, PrincipalGrant};

/// A framework principal allowed `users` (`["*"]`: any).
fn grant(users: &[&str]) -> PrincipalGrant {
    let users = if users == ["*"] {
        AllowedUsers::Any
    } else {
        AllowedUsers::Only(users.iter().map(|u| u.to_string()).collect())
    };
    PrincipalGrant::new(
        b"secret".to_vec(),
        BTreeSet::from([AuthRole::Framework]),
        users,
    )
}

/// A master whose `auth:` has `principals`, with agent `a1` (cpus:4;mem:1024).
fn master(principals: Vec<(&str, PrincipalGrant)>) -> (Harness, u64) {
    let mut h = Harness::configured(|c| {
        c.auth = AuthConfig {
            required: false,
            principals: principals
                .into_iter()
                .map(|(name, g)| (name.to_string(), g))
                .collect::<BTreeMap<_, _>>(),
        }
    });
    let agent = h.agent("a1", "cpus:4;mem:1024");
    (h, agent)
}

/// A task of cpus:1;mem:128 running as `user`, with what a framework might put in
/// `allowed_users` (the master overwrites it).
fn task_as(id: &str, user: &str, claimed: &[&str]) -> TaskInfo {
    TaskInfo {
        user: user.into(),
        allowed_users: claimed.iter().map(|u| u.to_string()).collect(),
        ..task(id, "cpus:1;mem:128")
    }
}

/// The task as the agent receives it: ids filled, `allowed_users` the principal's.
fn as_run(fw: &Fw, info: &TaskInfo, allowed: &[&str]) -> TaskInfo {
    TaskInfo {
        framework_id: fw.id.clone(),
        agent_id: "a1".into(),
        allowed_users: allowed.iter().map(|u| u.to_string()).collect(),
        ..info.clone()
    }
}

fn run_tasks(tasks: Vec<TaskInfo>) -> Vec<Out> {
    vec![Out::Msg(Message::RunTasks(RunTasks {
        tasks,
        leader_term: 0,
    }))]
}

/// Accepts an offer of cpus:3;mem:384 with `tasks`.
fn accept(h: &mut Harness, fw: &Fw, tasks: Vec<TaskInfo>) {
    let offer = h.offer_for(fw, "cpus:3;mem:384");
    h.demand(fw, "cpus:3;mem:384", 0);
    h.accept(fw, &offer.offer_id, tasks);
}

#[test]
fn a_task_with_an_allowed_user_launches_carrying_the_principals_users() {
    let (mut h, agent) = master(vec![("spark", grant(&["bob", "alice"]))]);
    let fw = h.framework_as(subscribe("alice"), Some("spark"));
    // The framework claims root in allowed_users: the master overwrites it.
    let t1 = task_as("t1", "alice", &["root"]);
    // No user: the agent's --task-user, which the agent checks against allowed_users.
    let t2 = task_as("t2", "", &[]);
    accept(&mut h, &fw, vec![t1.clone(), t2.clone()]);
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
                "0-U1"
            )),
            update(status(
                &h,
                &fw,
                "t2",
                "a1",
                TaskState::TaskStaging,
                "",
                "",
                "0-U2"
            )),
        ]
    );
    assert_eq!(
        h.sent(agent),
        run_tasks(vec![
            as_run(&fw, &t1, &["alice", "bob"]),
            as_run(&fw, &t2, &["alice", "bob"]),
        ])
    );
}

#[test]
fn a_task_with_a_forbidden_user_fails_alone_and_its_siblings_launch() {
    let (mut h, agent) = master(vec![("spark", grant(&["nobody"]))]);
    let fw = h.framework_as(subscribe("nobody"), Some("spark"));
    let t1 = task_as("t1", "nobody", &[]);
    let t2 = task_as("t2", "daemon", &["daemon"]);
    let t3 = task_as("t3", "", &[]);
    accept(&mut h, &fw, vec![t1.clone(), t2, t3.clone()]);
    assert_eq!(
        h.sent(fw.conn),
        vec![
            update(status(
                &h,
                &fw,
                "t2",
                "a1",
                TaskState::TaskFailed,
                "not_authorized",
                "principal \"spark\" may not run tasks as user \"daemon\" (its users: nobody)",
                "0-U1"
            )),
            update(status(
                &h,
                &fw,
                "t1",
                "a1",
                TaskState::TaskStaging,
                "",
                "",
                "0-U2"
            )),
            update(status(
                &h,
                &fw,
                "t3",
                "a1",
                TaskState::TaskStaging,
                "",
                "",
                "0-U3"
            )),
        ]
    );
    assert_eq!(
        h.sent(agent),
        run_tasks(vec![
            as_run(&fw, &t1, &["nobody"]),
            as_run(&fw, &t3, &["nobody"])
        ])
    );
    // The refused task is an ended task like any other: shown, holding nothing.
    assert_eq!(h.task_state(&fw, "t2"), Some(TaskState::TaskFailed));
    let snapshot = h.snapshot();
    let t2 = snapshot.tasks.iter().find(|t| t.id == "t2").unwrap();
    assert_eq!(t2.reason, "not_authorized");
    assert_eq!(snapshot.agents[0].used, "cpus:2;mem:256");
    // The framework stays subscribed: its next demand is offered what t2 did not take.
    assert!(h.snapshot().frameworks[0].connected);
    let offer = h.offer_for(&fw, "cpus:2;mem:768");
    assert_eq!(offer.agent_id, "a1");
    // A reused id of the refused task launches once its user is allowed.
    h.demand(&fw, "cpus:2;mem:768", 0);
    h.accept(&fw, &offer.offer_id, vec![task_as("t2", "nobody", &[])]);
    let staging = h.expect_update(&fw);
    assert_eq!(
        (staging.task_id.as_str(), staging.state()),
        ("t2", TaskState::TaskStaging)
    );
}

#[test]
fn without_a_principal_or_with_any_user_nothing_is_bounded() {
    // No auth at all, and an anonymous framework where principals exist: any user, and what
    // a framework claims in allowed_users is cleared (empty = any).
    for principals in [vec![], vec![("spark", grant(&["alice"]))]] {
        let (mut h, agent) = master(principals);
        let fw = h.framework("web");
        let t1 = task_as("t1", "daemon", &["daemon"]);
        accept(&mut h, &fw, vec![t1.clone()]);
        let staging = h.expect_update(&fw);
        assert_eq!(staging.state(), TaskState::TaskStaging);
        assert_eq!(h.sent(agent), run_tasks(vec![as_run(&fw, &t1, &[])]));
    }
    // users: ["*"], and the jobs framework's grant (subscribes as jobs, tasks as any user).
    let jobs = grant(&["jobs"]).with_task_users(AllowedUsers::Any);
    let (mut h, agent) = master(vec![("ops", grant(&["*"])), ("jobs", jobs)]);
    for (name, principal) in [("ops", "ops"), ("jobs", "jobs")] {
        let fw = h.framework_as(subscribe(name), Some(principal));
        let t = task_as(&format!("{name}-1"), "daemon", &["x"]);
        accept(&mut h, &fw, vec![t.clone()]);
        assert_eq!(h.expect_update(&fw).state(), TaskState::TaskStaging);
        assert_eq!(h.sent(agent), run_tasks(vec![as_run(&fw, &t, &[])]));
    }
}

/// A principal the configuration grants nothing (removed while its framework's record
/// stayed) may run tasks as no user, not even the agent's default.
#[test]
fn a_principal_without_a_grant_runs_no_task() {
    let (mut h, agent) = master(vec![("spark", grant(&["alice"]))]);
    let fw = h.framework_as(subscribe("alice"), Some("gone"));
    accept(&mut h, &fw, vec![task_as("t1", "", &[])]);
    assert_eq!(
        h.sent(fw.conn),
        vec![update(status(
            &h,
            &fw,
            "t1",
            "a1",
            TaskState::TaskFailed,
            "not_authorized",
            "principal \"gone\" may not run tasks as any user",
            "0-U1"
        ))]
    );
    h.expect_nothing(agent);
}
