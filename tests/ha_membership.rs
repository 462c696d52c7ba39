//! Membership changes of replicated masters (`cluster:`), in one process over loopback TCP:
//! a fourth master started with `cluster.join: true` is added through the leader's
//! `/cluster/members` (by `ringmaster cluster add`), catches up and votes; a master is removed
//! and the group still commits; a master whose work directory was wiped rejoins and catches up
//! from a snapshot of the leader's compacted log; bad membership requests are refused with
//! clear errors.

mod cluster;
mod common;

use cluster::free_ports;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use ringmaster::config::Config;
use ringmaster::master::{Master, Snapshot};
use ringmaster_proto::{ErrorCode, Message, Subscribe};

/// How long a condition may take before the test fails.
const PATIENCE: Duration = Duration::from_secs(60);

fn address(ports: &[u16], id: u64) -> String {
    format!("127.0.0.1:{}", ports[id as usize - 1])
}

/// Master `id`'s config: `peers` are masters `1..=peers` on `ports`; `extra` goes into the
/// `cluster:` section (e.g. `join: true`).
fn config(id: u64, ports: &[u16], peers: u64, extra: &str) -> Config {
    let mut yaml = String::from(
        "master:\n  agent_timeout: 30s\n  allocation_interval: 5ms\n  heartbeat_interval: 100ms\n  \
         status_retry_interval: 5s\ncluster:\n",
    );
    yaml.push_str(&format!(
        "  id: {id}\n  election_timeout: 500ms\n{extra}  peers:\n"
    ));
    for peer in 1..=peers {
        yaml.push_str(&format!("    {peer}: {}\n", address(ports, peer)));
    }
    Config::from_yaml(&yaml, "cluster.yaml").expect("valid cluster config")
}

struct Group {
    masters: BTreeMap<u64, Master>,
    ports: Vec<u16>,
    dirs: BTreeMap<u64, tempfile::TempDir>,
}

impl Group {
    /// Starts master `id` with `config` over its work dir (made when missing), HTTP on an
    /// ephemeral loopback port.
    async fn start(&mut self, id: u64, config: Config) {
        let dir = self
            .dirs
            .entry(id)
            .or_insert_with(|| tempfile::tempdir().unwrap());
        let master = Master::start_durable(
            &address(&self.ports, id),
            Some("127.0.0.1:0"),
            config,
            Some(dir.path().into()),
        )
        .await
        .expect("a replicated master starts");
        self.masters.insert(id, master);
    }

    fn work_dir(&self, id: u64) -> PathBuf {
        self.dirs[&id].path().to_path_buf()
    }

    fn http(&self, id: u64) -> SocketAddr {
        self.masters[&id].http_addr().expect("HTTP is served")
    }

    /// Every running master's HTTP address, for `--master a,b,c`.
    fn http_list(&self) -> String {
        self.masters
            .values()
            .map(|m| m.http_addr().unwrap().to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    async fn stop(&mut self, id: u64) {
        self.masters.remove(&id).unwrap().shutdown().await;
    }

    async fn stop_all(&mut self) {
        for (_, master) in std::mem::take(&mut self.masters) {
            master.shutdown().await;
        }
    }
}

/// Starts masters `1..=n` forming one group; `extra` goes into each `cluster:` section.
async fn start_group(n: u64, spare: usize, extra: &str) -> Group {
    let mut group = Group {
        masters: BTreeMap::new(),
        ports: free_ports(n as usize + spare),
        dirs: BTreeMap::new(),
    };
    for id in 1..=n {
        let config = config(id, &group.ports, n, extra);
        group.start(id, config).await;
    }
    group
}

/// The master that leads among the running ones (not `not`), and its state.
async fn leader(group: &Group, not: Option<u64>) -> (u64, Snapshot) {
    cluster::leader_among(&group.masters, not, PATIENCE).await
}

/// Master `id`'s own state (a follower's is empty but for its `cluster` view), once `what`
/// holds of it.
async fn wait_view(
    group: &Group,
    id: u64,
    what: &str,
    ok: impl Fn(&ringmaster::master::ops::model::ClusterView) -> bool,
) -> Snapshot {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        if let Ok(s) = group.masters[&id].snapshot().await {
            if ok(s.cluster.as_ref().expect("a cluster view")) {
                return s;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "master {id}: {what}: not in time; last view {:?}",
                s.cluster
            );
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "master {id}: {what}: no state in time"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn subscribe(id: &str) -> Message {
    Message::Subscribe(Subscribe {
        framework_id: id.into(),
        name: "f".into(),
        user: "tester".into(),
        weight: 1.0,
        failover_timeout_secs: 600.0,
        ..Default::default()
    })
}

/// Subscribes a new framework through whichever master leads (not `not`), following
/// `NOT_LEADER` as a real client does; returns the leader that took it, the framework's id and
/// that leader's applied index right after (the subscription is committed by then).
async fn subscribe_new(group: &Group, not: Option<u64>) -> (u64, String, u64) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (id, _) = leader(group, not).await;
        let mut c = Client::connect(group.masters[&id].addr()).await;
        c.send(subscribe("")).await;
        let answer = c
            .expect("the first answer", |m| match m {
                Message::Subscribed(s) => Some(Ok(s.framework_id.clone())),
                Message::Error(e) if e.code() == ErrorCode::NotLeader => Some(Err(())),
                Message::Error(e) => panic!("refused: {e:?}"),
                _ => None,
            })
            .await;
        if let Ok(framework) = answer {
            // The Subscribed left once its entry was committed and applied by this leader; the
            // leader's applied index now is at or past it. (A leader's own `/state` cluster
            // view is the one of when it took the lead: ask `/cluster/members`.)
            let applied = members(group).await.applied_index.expect("applied");
            return (id, framework, applied);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no master would take the framework"
        );
    }
}

/// One HTTP request: the status and the body as JSON (`null` when not JSON).
async fn http(method: &str, url: String, body: Option<String>) -> (u16, serde_json::Value) {
    let method = method.to_string();
    tokio::task::spawn_blocking(move || {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(90)))
            .http_status_as_error(false)
            .build()
            .into();
        let answer = match (method.as_str(), body) {
            ("GET", _) => agent.get(&url).call(),
            ("DELETE", _) => agent.delete(&url).call(),
            (_, Some(body)) => agent
                .post(&url)
                .header("content-type", "application/json")
                .send(body.as_str()),
            (_, None) => agent.post(&url).send_empty(),
        };
        let mut response = answer.unwrap_or_else(|e| panic!("{method} {url}: {e}"));
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
        )
    })
    .await
    .unwrap()
}

/// The leader's `GET /cluster/members`.
async fn members(group: &Group) -> ringmaster::master::ops::model::MembersView {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (id, _) = leader(group, None).await;
        let (status, body) = http(
            "GET",
            format!("http://{}/cluster/members", group.http(id)),
            None,
        )
        .await;
        if status == 200 {
            return serde_json::from_value(body).expect("a members answer");
        }
        // Deposed between the two questions: ask again.
        assert!(
            status == 503 && tokio::time::Instant::now() < deadline,
            "GET /cluster/members: {status} {body}"
        );
    }
}

fn voter_ids(members: &ringmaster::master::ops::model::MembersView) -> Vec<u64> {
    members.voters.iter().map(|m| m.id).collect()
}

/// Runs `ringmaster ARGS…`; returns whether it succeeded, its stdout and its stderr.
async fn cli(args: Vec<String>) -> (bool, String, String) {
    tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ringmaster"))
            .args(&args)
            .env_remove("RINGMASTER_MASTER")
            .output()
            .expect("run ringmaster");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_is_added_and_another_removed_while_the_group_commits() {
    let mut group = start_group(3, 1, "").await;
    let (_, before, before_index) = subscribe_new(&group, None).await;

    // A fourth master joins: it proposes nothing and waits for the leader.
    let config4 = config(4, &group.ports, 4, "  join: true\n");
    group.start(4, config4).await;
    let new = address(&group.ports, 4);
    let masters = group.http_list();
    let (ok, out, err) = cli(args(&[
        "cluster",
        "add",
        "--id",
        "4",
        "--address",
        &new,
        "--master",
        &masters,
    ]))
    .await;
    assert!(ok, "cluster add failed: {out}{err}");
    assert!(out.contains("master 4 at"), "{out}");

    // The leader lists it as a voter, with its address.
    let listed = members(&group).await;
    assert_eq!(voter_ids(&listed), vec![1, 2, 3, 4], "{listed:?}");
    assert_eq!(listed.voters[3].address, new);
    // So does the CLI.
    let (ok, out, err) = cli(args(&["cluster", "members", "--master", &masters])).await;
    assert!(ok, "cluster members failed: {err}");
    assert!(
        out.lines().any(|l| l.starts_with("4 ") && l.contains(&new)),
        "{out}"
    );

    // Its own view: a voting follower that knows every address and applied what was
    // committed before it joined (the framework subscribed then).
    let s = wait_view(&group, 4, "a voter that caught up", |c| {
        c.voters.contains(&4) && c.applied_index >= Some(before_index)
    })
    .await;
    let view = s.cluster.unwrap();
    assert_eq!(view.peers.get(&4), Some(&new), "{view:?}");
    assert_eq!(view.peers.len(), 4, "{view:?}");

    // A follower of the original three learned the new master's address from the membership,
    // and a follower's HTTP API sends clients to the leader.
    let (leading, _) = leader(&group, None).await;
    let follower = (1..=3).find(|id| *id != leading).unwrap();
    wait_view(&group, follower, "knows master 4", |c| {
        c.peers.get(&4) == Some(&new)
    })
    .await;
    let (status, body) = http(
        "GET",
        format!("http://{}/cluster/members", group.http(follower)),
        None,
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert!(body["leader"].is_string(), "{body}");

    // Remove a master of the original three that does not lead (and not the new one).
    let (leading, _) = leader(&group, None).await;
    let gone = (1..=3).find(|id| *id != leading).unwrap();
    let (ok, out, err) = cli(args(&[
        "cluster",
        "remove",
        "--id",
        &gone.to_string(),
        "--master",
        &group.http_list(),
    ]))
    .await;
    assert!(ok, "cluster remove failed: {out}{err}");
    group.stop(gone).await;
    let listed = members(&group).await;
    assert!(!voter_ids(&listed).contains(&gone), "{listed:?}");
    assert_eq!(listed.voters.len(), 3, "{listed:?}");

    // The group still commits: another framework is subscribed, and the new master applies it.
    let (leading, after, after_index) = subscribe_new(&group, None).await;
    wait_view(&group, 4, "applied the second subscription", |c| {
        c.applied_index >= Some(after_index)
    })
    .await;

    // Without the leader, the two masters left (of three voters) elect one, which knows both
    // frameworks.
    group.stop(leading).await;
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let (next, state) = leader(&group, Some(leading)).await;
        let ids: Vec<&str> = state.frameworks.iter().map(|f| f.id.as_str()).collect();
        if ids.contains(&before.as_str()) && ids.contains(&after.as_str()) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the new leader {next} does not know both frameworks: {ids:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    group.stop_all().await;
}

/// Deletes everything in `dir` (the master's registry and Raft log), keeping the directory.
fn wipe(dir: &Path) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            std::fs::remove_dir_all(&path).unwrap();
        } else {
            std::fs::remove_file(&path).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_master_rejoins_from_a_snapshot() {
    let extra = "  snapshot_threshold: 16\n";
    let mut group = start_group(3, 0, extra).await;
    // Enough committed turns that the leader snapshots and compacts its log.
    let mut frameworks = Vec::new();
    for _ in 0..60 {
        let (_, id, _) = subscribe_new(&group, None).await;
        frameworks.push(id);
    }
    let deadline = tokio::time::Instant::now() + PATIENCE;
    let compacted = loop {
        let listed = members(&group).await;
        if let Some(purged) = listed.purged_index.filter(|p| *p > 0) {
            break purged;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the leader never compacted its log: {listed:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    // A follower loses its disk: stopped, its work dir emptied, started again on the same
    // address with `join: true`.
    let (leading, _) = leader(&group, None).await;
    let wiped = (1..=3).find(|id| *id != leading).unwrap();
    group.stop(wiped).await;
    wipe(&group.work_dir(wiped));
    let config = config(wiped, &group.ports, 3, &format!("{extra}  join: true\n"));
    group.start(wiped, config).await;

    // The entries before `compacted` are gone from the leader's log: the wiped master can
    // only get them from a snapshot. It installs one and catches up with the leader.
    let listed = members(&group).await;
    let target = listed.applied_index.expect("the leader applied entries");
    assert!(target >= compacted);
    let s = wait_view(&group, wiped, "a follower caught up from a snapshot", |c| {
        c.snapshots_installed >= 1 && c.applied_index >= Some(target) && c.role == "follower"
    })
    .await;
    let view = s.cluster.unwrap();
    assert!(view.snapshot_index >= Some(compacted), "{view:?}");
    assert_eq!(view.voters, vec![1, 2, 3], "{view:?}");

    // The leader sees it hold the log, and the group goes on committing with it.
    let (_, last, last_index) = subscribe_new(&group, None).await;
    assert!(!frameworks.contains(&last));
    wait_view(&group, wiped, "applied a new subscription", |c| {
        c.applied_index >= Some(last_index)
    })
    .await;
    group.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_membership_requests_are_refused_with_clear_errors() {
    // A group of one: its only voter cannot be removed.
    let mut group = start_group(1, 0, "").await;
    leader(&group, None).await;
    let base = format!("http://{}/cluster/members", group.http(1));
    let own = address(&group.ports, 1);
    let cases: Vec<(&str, String, Option<String>, u16, &str)> = vec![
        (
            "POST",
            base.clone(),
            Some("not json".into()),
            400,
            "expected {\"id\": N",
        ),
        (
            "POST",
            base.clone(),
            Some(r#"{"id": 2}"#.into()),
            400,
            "missing field `address`",
        ),
        (
            "POST",
            base.clone(),
            Some(r#"{"id": 0, "address": "a:1"}"#.into()),
            400,
            "master ids start at 1",
        ),
        (
            "POST",
            base.clone(),
            Some(r#"{"id": 2, "address": "nowhere"}"#.into()),
            400,
            "`nowhere` is not host:port",
        ),
        (
            "POST",
            base.clone(),
            Some(format!(r#"{{"id": 2, "address": "{own}"}}"#)),
            400,
            "is master 1's address",
        ),
        (
            "POST",
            base.clone(),
            Some(r#"{"id": 1, "address": "127.0.0.1:9"}"#.into()),
            400,
            "master 1 is a voter at",
        ),
        (
            "DELETE",
            format!("{base}/x"),
            None,
            400,
            "`x` is not a master id",
        ),
        (
            "DELETE",
            format!("{base}/0"),
            None,
            400,
            "`0` is not a master id",
        ),
        (
            "DELETE",
            format!("{base}/9"),
            None,
            404,
            "master 9 is not a member",
        ),
        ("DELETE", format!("{base}/1"), None, 400, "only voter"),
    ];
    for (method, url, body, status, says) in cases {
        let (got, answer) = http(method, url.clone(), body.clone()).await;
        assert_eq!(got, status, "{method} {url} {body:?}: {answer}");
        let error = answer["error"].as_str().unwrap_or_default();
        assert!(error.contains(says), "{method} {url} {body:?}: {answer}");
    }
    // Re-adding a voter at its address changes nothing.
    let (got, answer) = http(
        "POST",
        base.clone(),
        Some(format!(r#"{{"id": 1, "address": "{own}"}}"#)),
    )
    .await;
    assert_eq!(got, 200, "{answer}");
    assert_eq!(answer["added"], false, "{answer}");
    // The CLI says what the master refused and fails.
    let (ok, _, err) = cli(args(&[
        "cluster",
        "remove",
        "--id",
        "1",
        "--master",
        &group.http(1).to_string(),
    ]))
    .await;
    assert!(!ok);
    assert!(err.contains("only voter"), "{err}");
    let (ok, _, err) = cli(args(&[
        "cluster",
        "add",
        "--id",
        "2",
        "--address",
        "nowhere",
        "--master",
        "127.0.0.1:9",
    ]))
    .await;
    assert!(!ok);
    assert!(
        err.contains("--address: `nowhere` is not host:port"),
        "{err}"
    );
    group.stop_all().await;
}
