//! The dashboard in a real browser: headless Chromium loads `/` from a running local cluster
//! and the agents, frameworks, the "why" of a pending demand and the jobs must appear in the DOM
//! the page builds from `/state` and `/jobs`.
//!
//! Needs Debian's `chromium` (`/usr/bin/chromium`, or the path in `RINGMASTER_CHROMIUM`), so
//! both tests are ignored by `cargo test --workspace` (which must pass on a machine without a
//! browser) and run by name; without Chromium they fail, they never pass vacuously:
//! - the browser test (`.ci/run` runs it as its own step after installing Chromium):
//!   `cargo test -p ringmaster --test dashboard_browser -- --ignored in_a_browser`;
//! - `dashboard_screenshot_for_the_docs` renders a demo-like cluster into `docs/dashboard.png`:
//!   `cargo test -p ringmaster --test dashboard_browser -- --ignored screenshot`.

mod common;

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use ringmaster::local::{LocalCluster, LocalOptions};
use ringmaster::master::Master;
use ringmaster_proto::resources::Resources;
use ringmaster_proto::TaskState;

/// Chromium's own limit for one page load.
const BROWSER_TIMEOUT: Duration = Duration::from_secs(90);

/// The browser to drive; panics with how to get one when there is none.
fn chromium() -> PathBuf {
    let candidates: Vec<PathBuf> = match std::env::var_os("RINGMASTER_CHROMIUM") {
        Some(path) => vec![PathBuf::from(path)],
        None => ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
            .iter()
            .map(PathBuf::from)
            .collect(),
    };
    if let Some(found) = candidates.iter().find(|p| p.is_file()) {
        return found.clone();
    }
    panic!(
        "the dashboard test needs headless Chromium at {candidates:?} (Debian: `apt-get install \
         chromium`; or set RINGMASTER_CHROMIUM=/path/to/chromium)."
    );
}

/// Runs headless Chromium on `url` with `extra` arguments; returns its stdout.
fn run_chromium(browser: &Path, url: &str, extra: &[&str]) -> String {
    let profile = tempfile::tempdir().expect("profile dir");
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(extra)
        .arg(url)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", browser.display()));
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        let _ = stdout.read_to_string(&mut out);
        out
    });
    let deadline = Instant::now() + BROWSER_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = reader.join().unwrap();
            assert!(status.success(), "chromium exited with {status}");
            return out;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within {BROWSER_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium: cargo test -p ringmaster --test dashboard_browser -- --ignored in_a_browser"]
async fn dashboard_shows_agents_frameworks_and_why_in_a_browser() {
    let browser = chromium();
    let options = LocalOptions {
        listen: "127.0.0.1:0".into(),
        http: Some("127.0.0.1:0".into()),
        agents: 3,
        agent_resources: Resources::parse("cpus:4;mem:8192").unwrap(),
        demo: false,
        config: test_config(""),
        work_dir: None,
    };
    let cluster = LocalCluster::start(&options).await.expect("local cluster");
    let http = cluster.master.http_addr().expect("HTTP is served");
    let mut fw = Client::framework(cluster.master.addr(), "browser-framework").await;
    fw.demand("cpus:64", 1).await;
    wait_for_state(&cluster.master, "the demand tried", |s| {
        s.pending.iter().any(|p| p.unserved_last_run)
    })
    .await;
    // A job for the Jobs section (no agent fits it, so it stays pending).
    let spec = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        spec.path(),
        "name: browser-job\ntype: service\ncount: 2\ntask:\n  command: sleep 1000\n  \
         resources: cpus:64\n",
    )
    .unwrap();
    let (master, file) = (http.to_string(), spec.path().to_string_lossy().to_string());
    tokio::task::spawn_blocking(move || {
        ringmaster::jobs::cli::run(&master, &file, false).map_err(|e| e.message)
    })
    .await
    .unwrap()
    .expect("job run");

    let url = format!("http://{http}/");
    let dom = tokio::task::spawn_blocking(move || run_chromium(&browser, &url, &["--dump-dom"]))
        .await
        .unwrap();
    for expected in [
        "local-agent-0",
        "local-agent-1",
        "local-agent-2",
        "browser-framework",
        &fw.id,
        "no agent fits cpus:64: 3 agents short of cpus",
        "class=\"ring\"",
        "ringmaster-jobs",
        "<b>browser-job</b>",
        "0 / 2",
    ] {
        assert!(
            dom.contains(expected),
            "the dashboard's DOM lacks {expected:?}:\n{dom}"
        );
    }
    // The live indicator turned green: the last fetch of /state succeeded.
    assert!(dom.contains(r#"<div class="dot" id="dot">"#), "{dom}");
    drop(fw);
    cluster.shutdown().await;
}

/// Used against allocated: an agent's usage reports show under its utilisation bars and its
/// task's resources.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium: cargo test -p ringmaster --test dashboard_browser -- --ignored in_a_browser"]
async fn dashboard_shows_usage_against_allocation_in_a_browser() {
    let browser = chromium();
    let master = Master::start_with_http("127.0.0.1:0", Some("127.0.0.1:0"), test_config(""))
        .await
        .unwrap();
    let addr = master.addr();
    let mut agents = HashMap::new();
    agents.insert(
        "a1".to_string(),
        Client::agent(addr, "a1", "cpus:4;mem:8192").await,
    );
    let mut fw = Client::framework(addr, "busy").await;
    run_tasks(&mut fw, &mut agents, "busy", "cpus:1;mem:512", 1).await;
    let sample = |cpu_seconds: f64, at_ms: u64| ringmaster_proto::TaskUsage {
        framework_id: fw.id.clone(),
        task_id: "busy-0".into(),
        cpu_seconds,
        mem_rss_bytes: 100 * 1024 * 1024,
        mem_peak_bytes: 200 * 1024 * 1024,
        sampled_at_ms: at_ms,
    };
    let agent = agents.get_mut("a1").unwrap();
    // Stamped now: the master refuses sample times more than a day from its clock.
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    for (cpu, at) in [(1.0, now_ms), (1.5, now_ms + 1_000)] {
        agent
            .send(ringmaster_proto::Message::UsageReport(
                ringmaster_proto::UsageReport {
                    tasks: vec![sample(cpu, at)],
                },
            ))
            .await;
    }
    // Both samples in (the cores in use need two): what the page is asserted to show.
    wait_for_state(&master, "the agent's usage over two samples", |s| {
        s.agents
            .iter()
            .any(|a| a.usage.as_ref().is_some_and(|u| u.cpus > 0.0))
    })
    .await;
    let url = format!("http://{}/", master.http_addr().unwrap());
    let dom = tokio::task::spawn_blocking(move || run_chromium(&browser, &url, &["--dump-dom"]))
        .await
        .unwrap();
    // The agent: 0.5 cores and 100 MiB in use of the 1 cpu and 512 MiB allocated; the task too.
    let line = "in use cpus 0.5 / 1 · mem 100 / 512 MiB";
    assert_eq!(
        dom.matches(line).count(),
        2,
        "{line:?} not twice in:\n{dom}"
    );
    drop((fw, agents));
    master.shutdown().await;
}

/// A framework on raw clients: demands `count` tasks of `shape`, accepts what fits, and has the
/// (raw) agents report each task RUNNING.
async fn run_tasks(
    fw: &mut Client,
    agents: &mut HashMap<String, Client>,
    prefix: &str,
    shape: &str,
    count: u64,
) {
    let unit = Resources::parse(shape).unwrap();
    let mut launched = 0;
    fw.demand(shape, count as u32).await;
    while launched < count {
        for offer in fw.expect_offers().await {
            let room = offered(&offer).copies_of(&unit).min(count - launched);
            if room == 0 {
                fw.decline(&offer.offer_id, 600.0).await;
                continue;
            }
            let tasks = (launched..launched + room)
                .map(|i| task(&format!("{prefix}-{i}"), shape, "sleep 600"))
                .collect();
            fw.accept(&offer.offer_id, tasks).await;
            launched += room;
            fw.demand(shape, (count - launched) as u32).await;
            let agent = agents.get_mut(&offer.agent_id).expect("known agent");
            for t in agent.expect_run().await {
                agent
                    .report(&t, TaskState::TaskRunning, &format!("u-{}", t.task_id))
                    .await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs chromium, writes docs/dashboard.png: cargo test -p ringmaster --test dashboard_browser -- --ignored screenshot"]
async fn dashboard_screenshot_for_the_docs() {
    let browser = chromium();
    let master = Master::start_with_http(
        "127.0.0.1:0",
        Some("127.0.0.1:0"),
        test_config("agent_timeout: 10m"),
    )
    .await
    .unwrap();
    let addr = master.addr();
    let mut agents = HashMap::new();
    for (id, resources) in [
        ("edge-1", "cpus:4;mem:8192"),
        ("edge-2", "cpus:4;mem:8192"),
        ("worker-1", "cpus:16;mem:65536"),
        ("worker-2", "cpus:16;mem:65536"),
        ("worker-3", "cpus:16;mem:65536"),
        ("gpu-1", "cpus:32;mem:131072;gpus:8"),
        ("gpu-2", "cpus:32;mem:131072;gpus:8"),
    ] {
        agents.insert(id.to_string(), Client::agent(addr, id, resources).await);
    }
    let mut web = Client::framework(addr, "web").await;
    run_tasks(&mut web, &mut agents, "web", "cpus:0.5;mem:512", 10).await;
    let mut batch = Client::framework_with(addr, "batch", "", 2.0, 60.0).await;
    run_tasks(&mut batch, &mut agents, "batch", "cpus:4;mem:8192", 5).await;
    let mut training = Client::framework(addr, "training").await;
    run_tasks(
        &mut training,
        &mut agents,
        "train",
        "cpus:8;mem:32768;gpus:2",
        3,
    )
    .await;
    let mut analytics = Client::framework(addr, "analytics").await;
    analytics.demand("cpus:48;mem:65536", 2).await;
    wait_for_state(&master, "analytics pending", |s| {
        s.pending.iter().any(|p| p.unserved_last_run)
    })
    .await;
    let http = master.http_addr().unwrap();
    let out = std::env::var("RINGMASTER_SCREENSHOT")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/dashboard.png"));
    let shot = format!("--screenshot={}", out.display());
    let url = format!("http://{http}/");
    tokio::task::spawn_blocking(move || {
        run_chromium(&browser, &url, &[&shot, "--window-size=1400,900"])
    })
    .await
    .unwrap();
    assert!(out.is_file(), "no screenshot at {}", out.display());
    drop((web, batch, training, analytics, agents));
    master.shutdown().await;
}
