//! Job constraints and partitions end to end through the real binaries (`ringmaster serve`,
//! three agents with different `--attributes`, the CLI): `job plan` and the jobs framework
//! put a job constrained to `rack = r2` only on the agent of rack r2; a job in partition
//! `gpu` runs on the gpu agent under the framework `ringmaster-jobs/gpu`; a job no agent
//! satisfies stays pending; after a `kill -9` of the master and a restart on its work dir,
//! the instances of both partitions are adopted, not launched again.

mod processes;

use std::path::Path;
use std::time::{Duration, Instant};

use processes::*;

const RACK2: &str = "name: web\ntype: service\ncount: 2\ntask:\n  command: \"exec sleep 1000\"\n  \
    resources: \"cpus:0.5;mem:64\"\n  kill_grace: 1s\nconstraints:\n  \
    - {attribute: rack, operator: \"=\", value: r2}\n";
const GPU: &str = "name: train\ntype: service\ntask:\n  command: \"exec sleep 1000\"\n  \
    resources: \"cpus:0.5;mem:64\"\n  kill_grace: 1s\npartition: gpu\n";
const NOWHERE: &str = "name: nowhere\ntype: service\ntask:\n  command: \"exec sleep 1000\"\n  \
    resources: \"cpus:0.5;mem:64\"\nconstraints:\n  - attribute: rack\n    value: r9\n";

/// (task id, agent) of the running instances, sorted.
fn running(status: &serde_json::Value) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = status["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["state"] == "running")
        .map(|i| {
            (
                i["task_id"].as_str().unwrap().to_string(),
                i["agent"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    out.sort();
    out
}

fn start(dir: &Path, port: u16, http: u16) -> (Proc, std::sync::mpsc::Receiver<String>) {
    let config = dir.join("master.yaml");
    let listen = format!("127.0.0.1:{port}");
    let http = format!("127.0.0.1:{http}");
    let work = dir.join("master");
    let (master, _addr, logs) = start_master_with(
        &config,
        &listen,
        &["--http", &http, "--work-dir", work.to_str().unwrap()],
    );
    (master, logs)
}

/// The frameworks in the master's `/state` (name, id, connected).
fn frameworks(http: &str) -> Vec<(String, String, bool)> {
    let url = format!("http://{http}/state");
    let body = ureq::get(&url)
        .call()
        .expect("GET /state")
        .body_mut()
        .read_to_string()
        .expect("body");
    let state: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    state["frameworks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["name"].as_str().unwrap_or_default().to_string(),
                f["id"].as_str().unwrap_or_default().to_string(),
                f["connected"].as_bool().unwrap_or(false),
            )
        })
        .collect()
}

fn framework_id(http: &str, name: &str) -> String {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some((_, id, _)) = frameworks(http)
            .into_iter()
            .find(|(n, _, connected)| n == name && *connected)
        {
            return id;
        }
        assert!(
            Instant::now() < deadline,
            "framework {name} never connected"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn constrained_and_partitioned_jobs_land_only_where_they_may_and_survive_a_master_restart() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("master.yaml"),
        "master:\n  allocation_interval: 5ms\n  heartbeat_interval: 200ms\n",
    )
    .unwrap();
    let (port, http_port) = (free_port(), free_port());
    let http = format!("127.0.0.1:{port}");
    let (mut master, logs) = start(dir.path(), port, http_port);
    let master_addr = format!("127.0.0.1:{port}");
    let agents: Vec<Proc> = [
        ("a1", "rack:r1"),
        ("a2", "rack:r2"),
        ("g1", "partition:gpu;rack:r2"),
    ]
    .iter()
    .map(|(id, attributes)| {
        start_agent_with(
            &master_addr,
            id,
            "cpus:4;mem:4096",
            &dir.path().join(id),
            &["--attributes", attributes],
        )
    })
    .collect();
    wait_registered(&logs, &["a1", "a2", "g1"]);

    // The plan honors the constraint (g1 has rack r2 but is in partition gpu).
    let web = dir.path().join("web.yaml");
    std::fs::write(&web, RACK2).unwrap();
    let (code, out, err) = job(&http, &["plan", web.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(out.matches("  a2\n").count(), 2, "{out}");
    assert!(!out.contains("a1") && !out.contains("g1"), "{out}");
    let nowhere = dir.path().join("nowhere.yaml");
    std::fs::write(&nowhere, NOWHERE).unwrap();
    let (code, out, _) = job(&http, &["plan", nowhere.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("no agent satisfies rack = r9"), "{out}");
    let gpu = dir.path().join("train.yaml");
    std::fs::write(&gpu, GPU).unwrap();
    let (code, out, err) = job(&http, &["plan", gpu.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("  g1\n"), "{out}");

    // Run them: web only on a2, train on g1 (its own framework), nowhere waits.
    for file in [&web, &gpu, &nowhere] {
        let (code, _, err) = job(&http, &["run", file.to_str().unwrap()]);
        assert_eq!(code, 0, "{err}");
    }
    let web_tasks = running(&status_when(&http, "web", "web running", |s| {
        running(s).len() == 2
    }));
    assert!(
        web_tasks.iter().all(|(_, agent)| agent == "a2"),
        "{web_tasks:?}"
    );
    let train_tasks = running(&status_when(&http, "train", "train running", |s| {
        running(s).len() == 1
    }));
    assert_eq!(train_tasks[0].1, "g1");
    let gpu_framework = framework_id(&http, "ringmaster-jobs/gpu");
    let default_framework = framework_id(&http, "ringmaster-jobs");
    assert_ne!(gpu_framework, default_framework);
    let status = status_json(&http, "nowhere");
    assert_eq!(status["instances"][0]["state"], "pending", "{status:#}");
    // The partition's instance's output is found through its own framework.
    let (code, _, err) = job(&http, &["logs", "train"]);
    assert_eq!(code, 0, "{err}");

    // kill -9 of the master, restart: both partitions' instances adopted, same frameworks.
    master.0.kill().unwrap();
    master.0.wait().unwrap();
    let (_master, logs) = start(dir.path(), port, http_port);
    wait_registered(&logs, &["a1", "a2", "g1"]);
    let status = status_when(&http, "web", "web adopted", |s| running(s).len() == 2);
    assert_eq!(running(&status), web_tasks, "adopted, not relaunched");
    let status = status_when(&http, "train", "train adopted", |s| running(s).len() == 1);
    assert_eq!(running(&status), train_tasks, "adopted, not relaunched");
    assert_eq!(framework_id(&http, "ringmaster-jobs/gpu"), gpu_framework);
    assert_eq!(framework_id(&http, "ringmaster-jobs"), default_framework);
    let status = status_json(&http, "nowhere");
    assert_eq!(status["instances"][0]["state"], "pending", "{status:#}");

    for name in ["web", "train", "nowhere"] {
        let (code, _, err) = job(&http, &["stop", name, "--purge"]);
        assert_eq!(code, 0, "{err}");
    }
    drop(agents);
}
