//! The operator surface over real HTTP: `/state` on a scripted cluster (exact counts and
//! buckets), "why pending" for a demand blocked by capacity, `/metrics` as valid Prometheus
//! text whose counters move with events, `/health`, and the `ringmaster status` tables.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;

use common::*;
use ringmaster::master::{Master, Snapshot};
use ringmaster_proto::TaskState;
use tokio::io::AsyncWriteExt;

async fn start_with_http() -> Master {
    Master::start_with_http("127.0.0.1:0", Some("127.0.0.1:0"), test_config(""))
        .await
        .expect("master starts")
}

/// GET over real TCP: (status, content type, body).
async fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    let url = format!("http://{addr}{path}");
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(WAIT))
            .build()
            .into();
        let mut response = agent.get(&url).call().expect("HTTP GET");
        let status = response.status().as_u16();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let body = response.body_mut().read_to_string().expect("body");
        (status, content_type, body)
    })
    .await
    .unwrap()
}

async fn state(addr: SocketAddr) -> Snapshot {
    let (status, content_type, body) = get(addr, "/state").await;
    assert_eq!(status, 200, "{body}");
    assert!(
        content_type.starts_with("application/json"),
        "{content_type}"
    );
    serde_json::from_str(&body).expect("/state is a Snapshot")
}

/// Polls `/state` over HTTP until `cond` holds.
async fn state_when(addr: SocketAddr, what: &str, cond: impl Fn(&Snapshot) -> bool) -> Snapshot {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let s = state(addr).await;
        if cond(&s) {
            return s;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}: {s:#?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Waits until the last allocation run has tried `huge` and left it pending.
async fn huge_pending(http: SocketAddr) -> Snapshot {
    state_when(http, "huge pending after a run", |s| {
        s.pending.len() == 1 && s.pending[0].unserved_last_run
    })
    .await
}

/// The scripted cluster: three agents, `web` runs one task on `small` (the best fit),
/// `huge` wants two copies of `cpus:32`, which no agent has.
struct Scripted {
    master: Master,
    http: SocketAddr,
    web: Client,
    huge: Client,
    _agents: Vec<Client>,
}

async fn scripted() -> Scripted {
    let master = start_with_http().await;
    let http = master.http_addr().expect("HTTP is served");
    let addr = master.addr();
    let medium = Client::agent(addr, "medium", "cpus:4;mem:8192").await;
    let mut small = Client::agent(addr, "small", "cpus:2;mem:2048").await;
    let big = Client::agent(addr, "big", "cpus:16;mem:32768").await;
    let mut web = Client::framework(addr, "web").await;
    web.demand("cpus:1;mem:512", 1).await;
    let offers = web.expect_offers().await;
    assert_eq!(offers[0].agent_id, "small");
    // Nothing more wanted: no further offers.
    web.demand("cpus:1;mem:512", 0).await;
    web.accept(
        &offers[0].offer_id,
        vec![task("w1", "cpus:1;mem:512", "sleep 100")],
    )
    .await;
    let run = small.expect_run().await;
    small.report(&run[0], TaskState::TaskRunning, "u1").await;
    web.expect_state("w1", TaskState::TaskRunning).await;
    let mut huge = Client::framework(addr, "huge").await;
    huge.demand("cpus:32", 2).await;
    Scripted {
        master,
        http,
        web,
        huge,
        _agents: vec![medium, small, big],
    }
}

#[tokio::test]
async fn state_shows_agents_buckets_tasks_rings_and_why_pending() {
    let c = scripted().await;
    let s = huge_pending(c.http).await;

    assert_eq!(s.placer, "ring");
    let agents: Vec<(&str, &str, &str, &str)> = s
        .agents
        .iter()
        .map(|a| {
            (
                a.id.as_str(),
                a.state.as_str(),
                a.free.as_str(),
                a.used.as_str(),
            )
        })
        .collect();
    assert_eq!(
        agents,
        [
            ("big", "connected", "cpus:16;mem:32768", ""),
            ("medium", "connected", "cpus:4;mem:8192", ""),
            ("small", "connected", "cpus:1;mem:1536", "cpus:1;mem:512"),
        ]
    );
    let buckets: Vec<BTreeMap<String, usize>> =
        s.agents.iter().map(|a| a.buckets.clone()).collect();
    let b = |cpus: usize, mem: usize| BTreeMap::from([("cpus".into(), cpus), ("mem".into(), mem)]);
    // cpus: one bucket per CPU; mem: powers of two from 256 MiB ([1024, 2048) is bucket 3).
    assert_eq!(buckets, [b(16, 8), b(4, 6), b(1, 3)]);
    assert!(s.agents.iter().all(|a| a.last_heartbeat_secs < 5.0));
    assert_eq!(s.agents[2].tasks, 1);

    // Rings: per dimension, exactly the occupied buckets.
    let occupied: Vec<(String, Vec<(usize, usize)>)> = s
        .rings
        .iter()
        .map(|r| {
            (
                r.dimension.clone(),
                r.buckets
                    .iter()
                    .filter(|b| b.agents > 0)
                    .map(|b| (b.index, b.agents))
                    .collect(),
            )
        })
        .collect();
    assert_eq!(
        occupied,
        [
            ("cpus".to_string(), vec![(1, 1), (4, 1), (16, 1)]),
            ("mem".to_string(), vec![(3, 1), (6, 1), (8, 1)]),
        ]
    );
    let cpus = &s.rings[0];
    assert_eq!(
        (cpus.buckets[1].lower, cpus.buckets[1].upper),
        (1.0, Some(2.0))
    );
    assert_eq!(cpus.buckets.last().unwrap().upper, None);

    // Frameworks and tasks.
    let web = s.frameworks.iter().find(|f| f.name == "web").unwrap();
    assert_eq!(web.id, c.web.id);
    assert_eq!(web.tasks_by_state, BTreeMap::from([("RUNNING".into(), 1)]));
    assert!((web.share - 1.0 / 22.0).abs() < 1e-9, "{}", web.share);
    assert_eq!(web.offers, 0);
    assert_eq!(s.tasks_by_state, BTreeMap::from([("RUNNING".into(), 1)]));
    assert_eq!(s.tasks.len(), 1);
    let t = &s.tasks[0];
    assert_eq!(
        (
            t.id.as_str(),
            t.agent.as_str(),
            t.resources.as_str(),
            t.state.as_str()
        ),
        ("w1", "small", "cpus:1;mem:512", "RUNNING")
    );
    // No priorities configured: every task runs at the base priority, 0.
    assert_eq!((t.priority, t.devices.len()), (Some(0), 0));
    assert!(s.offers.is_empty());
    assert_eq!(
        (
            s.total.as_str(),
            s.used.as_str(),
            s.offered.as_str(),
            s.free.as_str()
        ),
        (
            "cpus:22;mem:43008",
            "cpus:1;mem:512",
            "",
            "cpus:21;mem:42496"
        )
    );

    // Why: blocked by capacity.
    let p = &s.pending[0];
    assert_eq!(p.framework, c.huge.id);
    assert_eq!(
        (p.name.as_str(), p.demand.as_str(), p.count),
        ("huge", "cpus:32", 2)
    );
    assert!(p.unserved_last_run);
    assert_eq!(p.why, "no agent fits cpus:32: 3 agents short of cpus");
    assert_eq!(p.short, [("cpus".to_string(), 3)]);
    assert_eq!((p.agents, p.not_eligible, p.fitting), (3, 0, 0));

    let (status, _, body) = get(c.http, "/health").await;
    assert_eq!(status, 200);
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(health["status"], "ok");
    assert_eq!(health["agents_connected"], 3);
    assert_eq!(health["frameworks_connected"], 2);
    let (status, _, body) = get(c.http, "/nope").await;
    assert_eq!(status, 404);
    assert!(body.contains("/state"), "{body}");
    let (status, content_type, body) = get(c.http, "/").await;
    assert_eq!(status, 200);
    assert!(content_type.starts_with("text/html"), "{content_type}");
    assert!(body.contains("fetch(\"/state\""));
    assert!(body.contains("fetch(\"/jobs\""), "the jobs section");
    assert!(
        !body.contains("http://") && !body.contains("https://"),
        "no external resources"
    );
    c.master.shutdown().await;
}

#[tokio::test]
async fn why_names_declined_agents_as_not_eligible() {
    let master = start_with_http().await;
    let http = master.http_addr().unwrap();
    let _a = Client::agent(master.addr(), "only", "cpus:4;mem:4096").await;
    let mut fw = Client::framework(master.addr(), "picky").await;
    fw.demand("cpus:1", 1).await;
    let offers = fw.expect_offers().await;
    fw.decline(&offers[0].offer_id, 60.0).await;
    let s = state_when(http, "picky pending", |s| s.pending.len() == 1).await;
    assert_eq!(
        s.pending[0].why, "no agent fits cpus:1: 1 not eligible",
        "{:#?}",
        s.pending
    );
    assert_eq!(s.pending[0].not_eligible, 1);
    master.shutdown().await;
}

/// One parsed sample line: name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// Checks the exposition text line by line (OpenMetrics text, which Prometheus scrapes):
/// `# HELP`/`# TYPE`/`# UNIT` comments naming a declared family, samples
/// `name{label="value",...} number` whose names belong to the last declared family, and a
/// final `# EOF`. Returns the samples.
fn parse_exposition(text: &str) -> Vec<Sample> {
    let valid_name = |n: &str| {
        !n.is_empty()
            && n.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
            && !n.starts_with(|c: char| c.is_ascii_digit())
    };
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&"# EOF"), "ends with # EOF");
    let mut family = String::new();
    let mut family_type = String::new();
    let mut samples = Vec::new();
    for line in &lines[..lines.len() - 1] {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let keyword = parts.next().unwrap();
            let name = parts.next().unwrap_or_default();
            assert!(valid_name(name), "bad name in {line:?}");
            match keyword {
                "TYPE" => {
                    family = name.to_string();
                    family_type = parts.next().unwrap_or_default().to_string();
                    assert!(
                        [
                            "counter",
                            "gauge",
                            "histogram",
                            "info",
                            "summary",
                            "unknown"
                        ]
                        .contains(&family_type.as_str()),
                        "{line}"
                    );
                }
                "HELP" | "UNIT" => assert!(parts.next().is_some(), "{line}"),
                other => panic!("unknown comment {other} in {line:?}"),
            }
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("sample has a value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').expect("labels end with }");
                let mut labels = BTreeMap::new();
                for pair in body.split(',') {
                    let (k, v) = pair.split_once('=').expect("label k=v");
                    assert!(valid_name(k), "bad label name in {line:?}");
                    let v = v
                        .strip_prefix('"')
                        .and_then(|v| v.strip_suffix('"'))
                        .expect("quoted label value");
                    labels.insert(k.to_string(), v.to_string());
                }
                (name, labels)
            }
            None => (series, BTreeMap::new()),
        };
        assert!(valid_name(name), "bad sample name in {line:?}");
        let suffixes: &[&str] = match family_type.as_str() {
            "counter" => &["_total", "_created"],
            "histogram" => &["_bucket", "_sum", "_count", "_created"],
            _ => &[""],
        };
        assert!(
            suffixes.iter().any(|s| name == format!("{family}{s}")),
            "sample {name} outside its family {family} ({family_type})"
        );
        if family_type == "counter" {
            assert!(value >= 0.0, "negative counter in {line:?}");
        }
        samples.push((name.to_string(), labels, value));
    }
    samples
}

fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    let want: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    samples
        .iter()
        .find(|(n, l, _)| n == name && *l == want)
        .unwrap_or_else(|| panic!("no sample {name}{labels:?}"))
        .2
}

async fn scrape(http: SocketAddr) -> Vec<Sample> {
    let (status, content_type, body) = get(http, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );
    parse_exposition(&body)
}

#[tokio::test]
async fn metrics_parse_and_counters_move_with_events() {
    let c = scripted().await;
    huge_pending(c.http).await;
    let before = scrape(c.http).await;
    let v = |name, labels| value(&before, name, labels);
    assert_eq!(v("ringmaster_agents", &[("state", "connected")]), 3.0);
    assert_eq!(v("ringmaster_agents", &[("state", "lost")]), 0.0);
    assert_eq!(v("ringmaster_frameworks", &[("state", "connected")]), 2.0);
    assert_eq!(v("ringmaster_tasks", &[("state", "running")]), 1.0);
    assert_eq!(v("ringmaster_tasks", &[("state", "finished")]), 0.0);
    assert_eq!(v("ringmaster_offers_made_total", &[]), 1.0);
    assert_eq!(v("ringmaster_offers_accepted_total", &[]), 1.0);
    assert_eq!(v("ringmaster_offers_outstanding", &[]), 0.0);
    assert_eq!(v("ringmaster_pending_demands", &[]), 1.0);
    assert_eq!(
        v("ringmaster_placements_total", &[("phase", "bucket")]),
        0.0
    );
    let resource = |dim: &str, kind: &str| {
        value(
            &before,
            "ringmaster_resources",
            &[("dimension", dim), ("kind", kind)],
        )
    };
    assert_eq!(resource("cpus", "total"), 22.0);
    assert_eq!(resource("cpus", "used"), 1.0);
    assert_eq!(resource("mem", "free"), 42496.0);
    assert_eq!(v("ringmaster_preemptions_total", &[]), 0.0);
    assert!(v("ringmaster_allocation_runs_total", &[]) >= 1.0);
    assert!(v("ringmaster_allocation_duration_seconds_count", &[]) >= 1.0);
    let up_phase = v("ringmaster_placements_total", &[("phase", "up")]);
    assert_eq!(
        up_phase, 1.0,
        "small (2 cpus) was found one bucket up from 1"
    );
    let demands = v("ringmaster_messages_received_total", &[("kind", "Demand")]);
    assert_eq!(demands, 3.0);
    let rejected = v(
        "ringmaster_frames_rejected_total",
        &[("reason", "bad_frame")],
    );

    // Events: a new demand is offered and declined, then offered elsewhere; garbage bytes
    // are refused.
    let mut web = c.web;
    web.demand("cpus:1;mem:512", 1).await;
    let offers = web.expect_offers().await;
    web.decline(&offers[0].offer_id, 60.0).await;
    let again = web.expect_offers().await;
    assert_ne!(again[0].agent_id, offers[0].agent_id);
    let mut raw = tokio::net::TcpStream::connect(c.master.addr())
        .await
        .unwrap();
    raw.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    state_when(c.http, "decline applied", |s| {
        s.counters.offers_declined == 1
    })
    .await;
    let deadline = tokio::time::Instant::now() + WAIT;
    let after = loop {
        let after = scrape(c.http).await;
        if value(
            &after,
            "ringmaster_frames_rejected_total",
            &[("reason", "bad_frame")],
        ) > rejected
            || tokio::time::Instant::now() > deadline
        {
            break after;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    let w = |name, labels| value(&after, name, labels);
    assert_eq!(w("ringmaster_offers_made_total", &[]), 3.0);
    assert_eq!(w("ringmaster_offers_declined_total", &[]), 1.0);
    assert_eq!(w("ringmaster_offers_outstanding", &[]), 1.0);
    assert_eq!(
        w("ringmaster_messages_received_total", &[("kind", "Demand")]),
        demands + 1.0
    );
    assert_eq!(
        w("ringmaster_messages_received_total", &[("kind", "Decline")]),
        1.0
    );
    assert_eq!(
        w("ringmaster_messages_sent_total", &[("kind", "Offers")]),
        3.0
    );
    assert_eq!(
        w(
            "ringmaster_frames_rejected_total",
            &[("reason", "bad_frame")]
        ),
        rejected + 1.0
    );
    let placed: f64 = ["bucket", "up", "down", "leftover"]
        .iter()
        .map(|p| value(&after, "ringmaster_placements_total", &[("phase", p)]))
        .sum();
    assert_eq!(placed, 3.0);
    drop(c.huge);
    c.master.shutdown().await;
}

/// Runs `ringmaster status ARGS` and returns (exit code, stdout, stderr).
fn status(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ringmaster"))
        .arg("status")
        .args(args)
        .output()
        .expect("run ringmaster status");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_cli_prints_tables_of_a_known_cluster() {
    let c = scripted().await;
    huge_pending(c.http).await;
    let http = c.http.to_string();
    let run = |args: Vec<String>| {
        tokio::task::spawn_blocking(move || {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            status(&args)
        })
    };
    let args = |view: &str| vec!["--master".to_string(), http.clone(), view.to_string()];

    let (code, out, err) = run(args("tasks")).await.unwrap();
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        "FRAMEWORK  ID  NAME  AGENT  STATE    RESOURCES       REASON\n\
         web        w1  w1    small  RUNNING  cpus:1;mem:512  -\n"
    );

    let (code, out, _) = run(args("pending")).await.unwrap();
    assert_eq!(code, 0);
    let id = &c.huge.id;
    let pad = " ".repeat(id.len().saturating_sub("FRAMEWORK".len()));
    assert_eq!(
        out,
        format!(
            "FRAMEWORK{pad}  NAME  DEMAND   COUNT  WHY\n\
             {id}  huge  cpus:32      2  no agent fits cpus:32: 3 agents short of cpus\n"
        )
    );

    let (code, out, _) = run(args("rings")).await.unwrap();
    assert_eq!(code, 0);
    assert_eq!(
        out,
        "cpus: 64 buckets, search_up 2, 3 agents in 3 buckets\n\
         BUCKET  FREE RANGE  AGENTS\n     \
              1  [1, 2)           1  ████████████████████████████████████████\n     \
              4  [4, 5)           1  ████████████████████████████████████████\n    \
             16  [16, 17)         1  ████████████████████████████████████████\n\
         \n\
         mem: 14 buckets, search_up 1, 3 agents in 3 buckets\n\
         BUCKET  FREE RANGE      AGENTS\n     \
              3  [1024, 2048)         1  ████████████████████████████████████████\n     \
              6  [8192, 16384)        1  ████████████████████████████████████████\n     \
              8  [32768, 65536)       1  ████████████████████████████████████████\n"
    );

    let (code, out, _) = run(args("agents")).await.unwrap();
    assert_eq!(code, 0);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    assert_eq!(
        lines[0],
        "ID      HOSTNAME     STATE      TASKS  CPUS FREE/TOTAL  MEM FREE/TOTAL  BUCKETS        HEARTBEAT"
    );
    assert!(
        lines[3].starts_with(
            "small   host-small   connected      1              1/2       1536/2048  cpus:1 mem:3   "
        ),
        "{out}"
    );
    assert!(lines[3].ends_with("s ago"), "{out}");

    let (code, out, _) = run(args("summary")).await.unwrap();
    assert_eq!(code, 0);
    assert!(
        out.contains("Agents      3 connected, 0 disconnected, 0 lost\n"),
        "{out}"
    );
    assert!(out.contains("Tasks       RUNNING 1\n"), "{out}");
    assert!(
        out.contains(
            "DIMENSION  TOTAL  USED  OFFERED   FREE  USED%\n\
             cpus          22     1        0     21     5%\n\
             mem        43008   512        0  42496     1%\n"
        ),
        "{out}"
    );

    let (code, out, _) = run(vec![
        "--master".into(),
        format!("http://{http}/"),
        "frameworks".into(),
        "--json".into(),
    ])
    .await
    .unwrap();
    assert_eq!(code, 0);
    let json: serde_json::Value = serde_json::from_str(&out).expect("--json prints JSON");
    let names: Vec<&str> = json
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap())
        .collect();
    let mut names = names;
    names.sort();
    assert_eq!(names, ["huge", "web"]);

    // A master that is not there: exit 1 with a message naming the address.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone = closed.local_addr().unwrap().to_string();
    drop(closed);
    let (code, out, err) = run(vec!["--master".into(), gone.clone()]).await.unwrap();
    assert_eq!(code, 1);
    assert!(out.is_empty());
    assert!(
        err.starts_with(&format!(
            "error: cannot reach the master at http://{gone}/state"
        )),
        "{err}"
    );
    let (code, _, err) = run(vec!["--master".into(), http.clone(), "bogus".into()])
        .await
        .unwrap();
    assert_eq!(code, 2, "{err}");
    c.master.shutdown().await;
}

/// One address for every client: the protocol port answers HTTP too (the first bytes tell an
/// HTTP request from a protocol frame), while agents and frameworks keep using it; with
/// `RINGMASTER_MASTER` set, `ringmaster status` needs no flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_protocol_port_serves_http_too() {
    let master = start_with_http().await;
    let _agent = Client::agent(master.addr(), "a1", "cpus:2;mem:1024").await;
    let s = state_when(
        master.addr(),
        "the agent over the protocol port's HTTP",
        |s| s.agents.len() == 1,
    )
    .await;
    assert_eq!(s.agents[0].id, "a1");
    let (status_code, _, body) = get(master.addr(), "/health").await;
    assert_eq!(status_code, 200, "{body}");
    // A framework still subscribes on the same port.
    let _fw = Client::framework(master.addr(), "web").await;
    let addr = master.addr().to_string();
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        let out = Command::new(env!("CARGO_BIN_EXE_ringmaster"))
            .args(["status", "agents"])
            .env("RINGMASTER_MASTER", &addr)
            .output()
            .expect("run ringmaster status");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap();
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("a1"), "{out}");
    master.shutdown().await;
}
