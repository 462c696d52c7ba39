//! A hostile tenant against the real `ringmaster-agent` binary, run as root with its default
//! isolation (issue 43): a task that plants symlinks in its sandbox must not make the agent
//! write or read files outside it, a relaunched task id must not reuse the old sandbox, and
//! nothing a task writes (an exit status, a forged task record) becomes what the agent reports,
//! before or after an agent restart. Each of these was reproduced on the agent before the fix.
//!
//! These tests need root (the agent switches tasks to `nobody`); without root they print
//! `skipped: needs root` and pass.

mod common;
mod processes;

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use ringmaster_proto::{HealthCheck, TaskInfo, TaskState, TaskStatus};

fn is_root() -> bool {
    ringmaster_agent::users::agent_uid() == 0
}

/// The run directory of a task once the agent made it.
async fn run_of(agent_dir: &Path, framework_id: &str, task_id: &str) -> PathBuf {
    tokio::time::timeout(WAIT, async {
        loop {
            if let Some(run) =
                ringmaster_agent::sandbox::latest_run(agent_dir, framework_id, task_id)
            {
                return ringmaster_agent::sandbox::run_dir(agent_dir, framework_id, task_id, &run);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no run of {task_id}"))
}

/// Runs `tasks` on the one agent through one offer.
async fn launch(fw: &mut Client, tasks: Vec<TaskInfo>) {
    fw.demand("cpus:1;mem:64", tasks.len() as u32).await;
    let offer = fw.expect_offers().await.remove(0);
    fw.demand("cpus:1;mem:64", 0).await;
    fw.accept(&offer.offer_id, tasks).await;
}

/// The first terminal update of `id` (acknowledged).
async fn end_of(fw: &mut Client, id: &str) -> TaskStatus {
    loop {
        let status = fw.expect_update(id).await;
        if status.state().is_terminal() {
            return status;
        }
    }
}

/// A root-only file holding a secret, outside every sandbox.
fn secret(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join("secret");
    std::fs::write(&path, "top secret\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// Findings 1 and 2: a task replaces its `stdout` with a symlink to a root file and plants
/// symlinks where the agent used to write its task record; ending it and launching the same
/// task id again must leave the root file as it was (content and owner) and create nothing
/// where the links point. The second run writes into a fresh sandbox.
#[tokio::test]
async fn links_in_a_sandbox_never_redirect_the_agents_writes() {
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    let master = start_master(test_config("  agent_timeout: 30s\n")).await;
    let work = tempfile::tempdir().unwrap();
    let target = secret(work.path());
    let created = work.path().join("created-by-root");
    let _agent = processes::start_agent(
        &master.addr().to_string(),
        "a1",
        "cpus:4;mem:1024",
        &work.path().join("agent"),
    );
    wait_for_state(&master, "agent registered", |s| {
        s.agents.iter().any(|a| a.connected)
    })
    .await;
    let mut fw = Client::framework(master.addr(), "hostile").await;
    let plant = format!(
        "rm -f stdout; ln -s {t} stdout; ln -s {c} .ringmaster-task.tmp; ln -s {c} .ringmaster-task; \
         ln -s {c} .ringmaster-exit.tmp; ln -s {c} exit.tmp; ln -s {c} task.tmp; echo oops >&2; exit 1",
        t = target.display(),
        c = created.display()
    );
    launch(&mut fw, vec![task("t", "cpus:1;mem:64", &plant)]).await;
    let first = end_of(&mut fw, "t").await;
    assert_eq!(first.state(), TaskState::TaskFailed, "{first:?}");
    assert_eq!(first.exit_code, Some(1), "{first:?}");
    assert!(!created.exists(), "root wrote where a task's link pointed");
    assert!(first.message.contains("oops"), "{first:?}");

    // The same task id again: a fresh run, not the old sandbox with its links.
    launch(&mut fw, vec![task("t", "cpus:1;mem:64", "echo second run")]).await;
    let second = end_of(&mut fw, "t").await;
    assert_eq!(second.state(), TaskState::TaskFinished, "{second:?}");

    assert_eq!(std::fs::read_to_string(&target).unwrap(), "top secret\n");
    let meta = std::fs::metadata(&target).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o777), (0, 0o600), "chowned");
    assert!(!created.exists(), "root wrote where a task's link pointed");
    let run = ringmaster_agent::sandbox::latest_run_dir(&work.path().join("agent"), &fw.id, "t");
    assert_eq!(
        std::fs::read_to_string(run.join("stdout")).unwrap(),
        "second run\n"
    );
    let runs = std::fs::read_dir(run.parent().unwrap()).unwrap().count();
    assert_eq!(runs, 2, "one run directory per launch");
}

/// Findings 3 and 4: after an agent restart, the task's exit is what its supervisor recorded,
/// not what the task wrote (a `.ringmaster-exit` symlink to a root-only file, a forged task
/// record naming another tenant's process, a forged `FINISHED`); the other tenant's task keeps
/// running; and the adopted task's health check runs as the task's own user, not the user of
/// the process a forged record names.
#[tokio::test]
async fn what_a_task_writes_is_not_what_a_restarted_agent_reports() {
    if !is_root() {
        println!("skipped: needs root");
        return;
    }
    let master = start_master(test_config("  agent_timeout: 30s\n")).await;
    let addr = master.addr().to_string();
    let work = tempfile::tempdir().unwrap();
    let agent_dir = work.path().join("agent");
    let secret = secret(work.path());
    let agent = processes::start_agent(&addr, "a1", "cpus:4;mem:1024", &agent_dir);
    wait_for_state(&master, "agent registered", |s| {
        s.agents.iter().any(|a| a.connected)
    })
    .await;

    let mut other = Client::framework(master.addr(), "other-tenant").await;
    launch(
        &mut other,
        vec![task("victim", "cpus:1;mem:64", "sleep 1000")],
    )
    .await;
    let running = other.expect_state("victim", TaskState::TaskRunning).await;
    let victim: u32 = running
        .message
        .strip_prefix("pid ")
        .and_then(|p| p.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .expect("RUNNING names the pid");

    let mut fw = Client::framework(master.addr(), "hostile").await;
    // `forger` forges a record of its own end, FINISHED with exit 0, where an older agent kept
    // its record (and where this one keeps its own, in its meta directory), then exits 3.
    let forge = format!(
        "rm -f .ringmaster-task task; \
         printf 'framework_id={fw}\\ntask_id=forger\\npid=1\\nstart_ticks=0\\nresources=cpus:1\\nended_state=3\\nended_exit_code=0\\n' > .ringmaster-task; \
         cp .ringmaster-task task; \
         while [ ! -e go ]; do sleep 0.05; done; exit 3",
        fw = fw.id,
    );
    let mut forger = task("forger", "cpus:1;mem:64", &forge);
    forger.health = Some(HealthCheck {
        command: "id -u > checked-as.tmp && mv checked-as.tmp checked-as".into(),
        interval_ms: 100,
        timeout_ms: 1000,
        failures: 100,
        grace_ms: 100,
    });
    // `peeker` links its exit status to the root-only secret, and kills whatever started it
    // (an older agent's wrapper, which would have overwritten the link; the supervisor is
    // root's and out of its reach), then exits 4.
    let peek = format!(
        "ln -s {s} .ringmaster-exit; ln -s {s} exit; kill -9 $PPID; \
         while [ ! -e go ]; do sleep 0.05; done; exit 4",
        s = secret.display(),
    );
    launch(
        &mut fw,
        vec![forger, task("peeker", "cpus:1;mem:64", &peek)],
    )
    .await;
    let run = run_of(&agent_dir, &fw.id, "forger").await;
    let peeker = run_of(&agent_dir, &fw.id, "peeker").await;
    wait_for_file(&run.join("task")).await;
    wait_for_file(&run.join("checked-as")).await;
    wait_for_file(&peeker.join("exit")).await;

    drop(agent); // SIGKILL: the tasks keep running under their supervisors
    wait_for_state(&master, "agent disconnected", |s| !s.agents[0].connected).await;
    std::fs::remove_file(run.join("checked-as")).unwrap();
    let _agent = processes::start_agent(&addr, "a1", "cpus:4;mem:1024", &agent_dir);
    wait_for_state(&master, "agent back", |s| s.agents[0].connected).await;

    // The adopted task's checks run as nobody, as the task does.
    wait_for_file(&run.join("checked-as")).await;
    let nobody = ringmaster_agent::users::lookup_user("nobody").unwrap();
    assert_eq!(
        std::fs::read_to_string(run.join("checked-as"))
            .unwrap()
            .trim(),
        nobody.uid.to_string()
    );

    std::fs::write(run.join("go"), "").unwrap();
    std::fs::write(peeker.join("go"), "").unwrap();
    for (id, code) in [("forger", 3), ("peeker", 4)] {
        let ended = end_of(&mut fw, id).await;
        assert_eq!(ended.state(), TaskState::TaskFailed, "{ended:?}");
        assert_eq!(ended.exit_code, Some(code), "{ended:?}");
        assert_eq!(ended.reason, "exit_status", "{ended:?}");
        assert!(!ended.message.contains("top secret"), "{ended:?}");
    }
    assert!(ringmaster_agent::process::process_is_alive(victim));
    let s = wait_for_state(&master, "the victim still runs", |s| {
        s.tasks
            .iter()
            .any(|t| t.id == "victim" && t.state == "RUNNING")
    })
    .await;
    assert!(s
        .tasks
        .iter()
        .all(|t| t.id != "forger" || t.state != "FINISHED"));
    // Tasks outlive their agent: end the victim, or it outlives the test.
    ringmaster_agent::process::signal_group(victim, 9);
}
