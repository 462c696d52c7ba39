//! Jobs through the master's `/jobs` API and the `ringmaster job` client functions, with the
//! built-in jobs framework taking real offers from a scripted agent: a service's instances are
//! launched, one that fails is launched again, `job stop` kills the rest, and `job status`
//! reads it all back.

mod common;

use common::*;
use ringmaster::jobs::cli;
use ringmaster::master::Master;
use ringmaster_proto::{Message, TaskInfo, TaskState};

const WEB: &str = "name: web\ntype: service\ncount: 2\ntask:\n  command: sleep 1000\n  \
                   resources: cpus:1;mem:128\n  kill_grace: 2s\nrestart:\n  attempts: 3\n  \
                   delay: 100ms\n";

/// RunTasks until `n` tasks arrived.
async fn launched(agent: &mut Client, n: usize) -> Vec<TaskInfo> {
    let mut tasks = Vec::new();
    while tasks.len() < n {
        tasks.extend(agent.expect_run().await);
    }
    tasks
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.unwrap()
}

#[tokio::test]
async fn a_service_runs_restarts_a_failed_instance_and_stops() {
    let master = Master::start_with_http("127.0.0.1:0", Some("127.0.0.1:0"), test_config(""))
        .await
        .expect("master starts");
    master.start_jobs().await.expect("jobs start");
    let http = master.http_addr().unwrap().to_string();
    let mut agent = Client::agent(master.addr(), "a1", "cpus:4;mem:4096").await;

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.yaml");
    std::fs::write(&file, WEB).unwrap();
    let (h, f) = (http.clone(), file.to_string_lossy().to_string());
    blocking(move || cli::run(&h, &f, false).map_err(|e| e.message))
        .await
        .expect("job run");

    let mut tasks = launched(&mut agent, 2).await;
    tasks.sort_by(|a, b| a.task_id.cmp(&b.task_id));
    let ids: Vec<&str> = tasks.iter().map(|t| t.task_id.as_str()).collect();
    assert_eq!(ids, ["web.0.1-1", "web.1.1-1"]);
    assert_eq!(tasks[0].command, "sleep 1000");
    assert_eq!(tasks[0].kill_grace_ms, 2000);
    for (i, task) in tasks.iter().enumerate() {
        agent
            .report(task, TaskState::TaskRunning, &format!("r{i}"))
            .await;
    }
    agent.report(&tasks[1], TaskState::TaskFailed, "f1").await;
    // Instance 1 starts again after its delay, under a new task id.
    let again = launched(&mut agent, 1).await;
    assert_eq!(again[0].task_id, "web.1.1-2");
    agent.report(&again[0], TaskState::TaskRunning, "r2").await;

    let h = http.clone();
    let status = blocking(move || cli::status(&h, Some("web"), true).map_err(|e| e.message));
    status.await.expect("job status");

    let h = http.clone();
    blocking(move || cli::stop(&h, "web", false).map_err(|e| e.message))
        .await
        .expect("job stop");
    let mut killed = Vec::new();
    while killed.len() < 2 {
        let id = agent
            .expect("KillTask", |m| match m {
                Message::KillTask(k) => Some(k.task_id.clone()),
                _ => None,
            })
            .await;
        killed.push(id);
    }
    killed.sort();
    assert_eq!(killed, ["web.0.1-1", "web.1.1-2"]);

    // An unknown job and a bad spec are refused with the master's reason.
    let h = http.clone();
    let e = blocking(move || cli::stop(&h, "nope", false).err().unwrap().message).await;
    assert!(e.contains("no job named `nope`"), "{e}");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, WEB.replace("cpus:1", "cpu:1")).unwrap();
    let (h, f) = (http.clone(), bad.to_string_lossy().to_string());
    let e = blocking(move || cli::run(&h, &f, false).err().unwrap()).await;
    assert_eq!(e.code, 2);
    assert!(e.message.contains("did you mean `cpus`"), "{}", e.message);
    master.shutdown().await;
}
