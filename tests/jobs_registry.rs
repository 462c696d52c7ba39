//! The jobs framework keeps its jobs in the master's registry: a `jobs.json` left by an older
//! master is imported once (and renamed), the jobs, the batch outcomes and the framework's id
//! survive a master restart from the registry alone, and no `jobs.json` is written again.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use ringmaster::jobs::spec::parse_job_spec;
use ringmaster::master::registry::Registry;
use ringmaster::master::Master;
use ringmaster_proto::TaskState;

const WEB: &str = "name: web\ntype: service\ncount: 1\ntask:\n  command: sleep 1000\n  \
                   resources: cpus:1;mem:128\n";
const ONCE: &str = "name: once\ntype: batch\ncount: 2\ntask:\n  command: \"true\"\n  \
                    resources: cpus:0.1\n";

async fn start(dir: &Path) -> Master {
    let master = Master::start_durable(
        "127.0.0.1:0",
        Some("127.0.0.1:0"),
        test_config(""),
        Some(dir.to_path_buf()),
    )
    .await
    .expect("master starts");
    master.start_jobs().await.expect("jobs start");
    master
}

async fn get_json(master: &Master, path: &str) -> serde_json::Value {
    get_json_as(master, path, None).await
}

/// `GET path` with an `Authorization` header when given.
async fn get_json_as(
    master: &Master,
    path: &str,
    authorization: Option<String>,
) -> serde_json::Value {
    let url = format!("http://{}{path}", master.http_addr().unwrap());
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(WAIT))
            .build()
            .into();
        let mut request = agent.get(&url);
        if let Some(value) = &authorization {
            request = request.header("Authorization", value);
        }
        let body = request
            .call()
            .expect("GET")
            .body_mut()
            .read_to_string()
            .expect("body");
        serde_json::from_str(&body).expect("JSON")
    })
    .await
    .unwrap()
}

/// Job name -> the states of its instances, from `GET /jobs`.
async fn job_states(master: &Master) -> Vec<(String, Vec<String>)> {
    job_states_as(master, None).await
}

async fn job_states_as(
    master: &Master,
    authorization: Option<String>,
) -> Vec<(String, Vec<String>)> {
    let jobs = get_json_as(master, "/jobs", authorization).await;
    let mut out: Vec<(String, Vec<String>)> = jobs
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            let states = j["instances"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["state"].as_str().unwrap().to_string())
                .collect();
            (j["spec"]["name"].as_str().unwrap().to_string(), states)
        })
        .collect();
    out.sort();
    out
}

/// Waits until the jobs framework subscribed; returns its framework id.
async fn jobs_framework(master: &Master) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        let snapshot = master.snapshot().await.unwrap();
        if let Some(f) = snapshot
            .frameworks
            .iter()
            .find(|f| f.name == "ringmaster-jobs" && f.connected)
        {
            return f.id.clone();
        }
        assert!(
            Instant::now() < deadline,
            "the jobs framework never subscribed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_jobs_file_is_imported_once_and_jobs_survive_restarts_from_the_registry() {
    let dir = tempfile::tempdir().unwrap();
    let web = parse_job_spec(WEB, "web.yaml").unwrap();
    let once = parse_job_spec(ONCE, "once.yaml").unwrap();
    // What an older master left next to its registry.
    let old = serde_json::json!({
        "framework_id": null,
        "generation": 4,
        "jobs": [web, once],
        "outcomes": {"once": [
            {"index": 0, "succeeded": true, "exit_code": 0},
            {"index": 1, "succeeded": false, "exit_code": 3},
        ]},
    });
    std::fs::write(dir.path().join("jobs.json"), old.to_string()).unwrap();

    let master = start(dir.path()).await;
    assert!(!dir.path().join("jobs.json").exists());
    assert!(dir.path().join("jobs.json.imported").exists());
    let expected = vec![
        (
            "once".to_string(),
            vec!["succeeded".to_string(), "failed".to_string()],
        ),
        ("web".to_string(), vec!["pending".to_string()]),
    ];
    assert_eq!(job_states(&master).await, expected);
    let framework_id = jobs_framework(&master).await;
    master.shutdown().await;

    // What the registry holds: both jobs (with the outcomes) and the framework's record.
    let recovered = Registry::open(dir.path()).unwrap().load().unwrap();
    let names: Vec<&str> = recovered.jobs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["once", "web"]);
    let meta = recovered.jobs_meta.expect("the jobs framework's record");
    assert_eq!(meta.generation, 5, "imported 4, then one start");
    assert_eq!(meta.framework_id.as_deref(), Some(framework_id.as_str()));

    // A restart: everything back from the registry, under the same framework id; a jobs.json
    // put back is not imported over the registry.
    std::fs::write(dir.path().join("jobs.json"), "{\"jobs\": []}").unwrap();
    let master = start(dir.path()).await;
    assert_eq!(job_states(&master).await, expected);
    assert_eq!(jobs_framework(&master).await, framework_id);
    assert!(dir.path().join("jobs.json").exists(), "left alone");
    std::fs::remove_file(dir.path().join("jobs.json")).unwrap();

    // A change is committed before it is answered: job run, then purge.
    let http = master.http_addr().unwrap().to_string();
    let file = dir.path().join("extra.yaml");
    std::fs::write(&file, WEB.replace("name: web", "name: extra")).unwrap();
    let (h, f) = (http.clone(), file.to_string_lossy().to_string());
    tokio::task::spawn_blocking(move || {
        ringmaster::jobs::cli::run(&h, &f, false).map_err(|e| e.message)?;
        ringmaster::jobs::cli::stop(&h, "once", true).map_err(|e| e.message)
    })
    .await
    .unwrap()
    .expect("job run, job stop --purge");
    master.shutdown().await;
    let recovered = Registry::open(dir.path()).unwrap().load().unwrap();
    let names: Vec<&str> = recovered.jobs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["extra", "web"]);
    assert_eq!(recovered.jobs_meta.unwrap().generation, 6);
    assert!(
        !dir.path().join("jobs.json").exists(),
        "no jobs file is written"
    );
}

#[tokio::test]
async fn without_a_work_dir_jobs_live_in_memory() {
    let master = Master::start_with_http("127.0.0.1:0", Some("127.0.0.1:0"), test_config(""))
        .await
        .expect("master starts");
    master.start_jobs().await.expect("jobs start");
    let http = master.http_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.yaml");
    std::fs::write(&file, WEB).unwrap();
    let f = file.to_string_lossy().to_string();
    tokio::task::spawn_blocking(move || {
        ringmaster::jobs::cli::run(&http, &f, false).map_err(|e| e.message)
    })
    .await
    .unwrap()
    .expect("job run");
    assert_eq!(
        job_states(&master).await,
        vec![("web".to_string(), vec!["pending".to_string()])]
    );
    master.shutdown().await;
}

#[tokio::test]
async fn the_jobs_framework_runs_on_a_master_that_requires_authentication() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config("");
    config.auth.required = true;
    // The HTTP API requires a principal too: an operator's, which `job run` sends.
    let secret = dir.path().join("ops.secret");
    ringmaster_proto::files::write_private(&secret, b"ops-secret\n").unwrap();
    config.auth.principals.insert(
        "ops".into(),
        ringmaster::security::PrincipalGrant::new(
            b"ops-secret".to_vec(),
            Default::default(),
            ringmaster::security::AllowedUsers::Only(Default::default()),
        )
        .with_http_roles([ringmaster::security::HttpRole::Operator].into()),
    );
    let master = Master::start_durable(
        "127.0.0.1:0",
        Some("127.0.0.1:0"),
        config,
        Some(dir.path().to_path_buf()),
    )
    .await
    .expect("master starts");
    master
        .start_jobs()
        .await
        .expect("jobs start with auth required");
    jobs_framework(&master).await;
    let http = master.http_addr().unwrap().to_string();
    let file = dir.path().join("web.yaml");
    std::fs::write(&file, WEB).unwrap();
    let run = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_ringmaster"))
            .args(["job", "run"])
            .arg(&file)
            .args(["--master", &http])
            .env("RINGMASTER_PRINCIPAL", "ops")
            .env("RINGMASTER_SECRET_FILE", &secret)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        run.status.success(),
        "job run: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    // HTTP Basic: base64("ops:ops-secret").
    let basic = Some("Basic b3BzOm9wcy1zZWNyZXQ=".to_string());
    assert_eq!(
        job_states_as(&master, basic).await,
        vec![("web".to_string(), vec!["pending".to_string()])]
    );
    // It subscribed with its own credential (an anonymous client is refused here).
    let snapshot = master.snapshot().await.unwrap();
    assert!(snapshot
        .frameworks
        .iter()
        .any(|f| f.name == "ringmaster-jobs" && f.connected));
    master.shutdown().await;
}

#[tokio::test]
async fn the_jobs_principal_is_reserved() {
    use std::collections::BTreeSet;
    let mut config = test_config("");
    config.auth.required = true;
    config.auth.principals.insert(
        ringmaster::master::JOBS_PRINCIPAL.to_string(),
        ringmaster::security::PrincipalGrant::new(
            b"operator secret".to_vec(),
            BTreeSet::from([ringmaster_proto::security::AuthRole::Framework]),
            ringmaster::security::AllowedUsers::Any,
        ),
    );
    let error = Master::start("127.0.0.1:0", config)
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(error.contains("reserved"), "{error}");
}

/// `job run` of the spec text `text` (written to `dir/NAME.yaml`) against `master`.
async fn run_job(master: &Master, dir: &Path, name: &str, text: &str) {
    let http = master.http_addr().unwrap().to_string();
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(&file, text).unwrap();
    let f = file.to_string_lossy().to_string();
    tokio::task::spawn_blocking(move || {
        ringmaster::jobs::cli::run(&http, &f, false).map_err(|e| e.message)
    })
    .await
    .unwrap()
    .expect("job run");
}

/// The job `name` from `GET /jobs`.
async fn job_json(master: &Master, name: &str) -> serde_json::Value {
    get_json(master, "/jobs")
        .await
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["spec"]["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no job {name}"))
}

#[tokio::test]
async fn a_service_that_gave_up_stays_failed_after_a_restart() {
    const FLAKY: &str = "name: flaky\ntype: service\ntask:\n  command: x\n  \
                         resources: cpus:1\nrestart:\n  attempts: 1\n  delay: 10ms\n  \
                         interval: 1h\n";
    let dir = tempfile::tempdir().unwrap();
    let master = start(dir.path()).await;
    let mut agent = Client::agent(master.addr(), "a1", "cpus:4;mem:1024").await;
    run_job(&master, dir.path(), "flaky", FLAKY).await;
    // Launched, fails; restarted once, fails again: more than 1 restart within 1h.
    for attempt in 1..=2 {
        let tasks = agent.expect_run().await;
        assert_eq!(tasks.len(), 1);
        assert!(tasks[0].task_id.starts_with("flaky.0."), "{tasks:?}");
        agent
            .report(&tasks[0], TaskState::TaskRunning, &format!("r{attempt}"))
            .await;
        agent
            .report(&tasks[0], TaskState::TaskFailed, &format!("f{attempt}"))
            .await;
    }
    let deadline = Instant::now() + WAIT;
    let failed = loop {
        let job = job_json(&master, "flaky").await;
        if !job["failed"].is_null() {
            break job;
        }
        assert!(
            Instant::now() < deadline,
            "the service never gave up: {job:#}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let why = failed["failed"].as_str().unwrap().to_string();
    assert!(why.contains("more than 1 restarts"), "{why}");
    master.shutdown().await;
    drop(agent);

    // On disk with the job.
    let recovered = Registry::open(dir.path()).unwrap().load().unwrap();
    let (_, record) = recovered
        .jobs
        .iter()
        .find(|(n, _)| n == "flaky")
        .expect("the job's record");
    assert_eq!(record["failed"], why.as_str(), "{record}");

    // After a restart: still failed, and not launched again, while another job is.
    let master = start(dir.path()).await;
    let mut agent = Client::agent(master.addr(), "a1", "cpus:4;mem:1024").await;
    let job = job_json(&master, "flaky").await;
    assert_eq!(job["failed"], why.as_str(), "{job:#}");
    assert_eq!(job["done"], true, "{job:#}");
    assert_eq!(job["instances"][0]["state"], "failed", "{job:#}");
    run_job(
        &master,
        dir.path(),
        "probe",
        WEB.replace("name: web", "name: probe").as_str(),
    )
    .await;
    let tasks = agent.expect_run().await;
    let ids: Vec<&str> = tasks.iter().map(|t| t.task_id.as_str()).collect();
    assert!(ids.iter().all(|id| id.starts_with("probe.")), "{ids:?}");
    let job = job_json(&master, "flaky").await;
    assert_eq!(job["failed"], why.as_str(), "{job:#}");
    assert_eq!(job["instances"][0]["state"], "failed", "{job:#}");
    // Run again: tried again.
    run_job(&master, dir.path(), "flaky", FLAKY).await;
    let tasks = agent.expect_run().await;
    assert!(tasks[0].task_id.starts_with("flaky.0."), "{tasks:?}");
    assert!(job_json(&master, "flaky").await["failed"].is_null());
    master.shutdown().await;
}
