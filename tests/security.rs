//! TLS, authentication and authorization against a live master over loopback TCP: the
//! handshake with and without TLS, every refusal (wrong secret, unknown principal, role, user,
//! another principal's ids, another framework's offers and tasks) and the metrics counting them.

mod common;

use ringmaster_proto::convert::ResourcesWire;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{task, wait_for_state, WAIT};
use ringmaster::config::Config;
use ringmaster::master::Master;
use ringmaster_proto::resources::Resources;
use ringmaster_proto::security::{AuthRole, Credential};
use ringmaster_proto::transport::{BoxedStream, ClientSecurity, TlsClient};
use ringmaster_proto::{
    Accept, Connection, Decline, ErrorCode, Hello, HelloAck, Kill, Message, Reconcile,
    RegisterAgent, Subscribe, TaskState, PROTOCOL_VERSION,
};
use ringmaster_sdk::{Driver, FrameworkConfig, Scheduler, SdkError};

/// Certificates from `ringmaster certs` (the library function behind it) and a config using
/// them and three principals.
struct Fixture {
    _dir: tempfile::TempDir,
    certs: PathBuf,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        ringmaster::certs::write_dev_certs(&certs, &[], &["agent1".into()], false).unwrap();
        ringmaster_proto::files::write_private(&dir.path().join("rack-secret"), "rack-secret\n")
            .unwrap();
        ringmaster_proto::files::write_private(&dir.path().join("ops-secret"), "ops-secret\n")
            .unwrap();
        Fixture { _dir: dir, certs }
    }

    fn dir(&self) -> &Path {
        self._dir.path()
    }

    /// A config with `tls` on or off and `required` authentication.
    fn config(&self, tls: bool, required: bool) -> Config {
        let mut yaml =
            String::from("master:\n  allocation_interval: 5ms\n  heartbeat_interval: 100ms\n");
        if tls {
            yaml.push_str("tls:\n  cert: certs/master.pem\n  key: certs/master.key\n");
        }
        yaml.push_str(&format!(
            "auth:
  required: {required}
  principals:
    rack: {{ secret_file: rack-secret, roles: [agent] }}
    rack2: {{ secret: rack2-secret, roles: [agent] }}
    alice: {{ secret: alice-secret, roles: [framework], users: [alice] }}
    bob: {{ secret: bob-secret, roles: [framework], users: [bob, shared] }}
    ops: {{ secret_file: ops-secret, roles: [operator] }}
http:
  anonymous: [metrics]
"
        ));
        let file = self.dir().join("master.yaml");
        std::fs::write(&file, &yaml).unwrap();
        Config::load(&file).unwrap()
    }

    fn tls(&self) -> TlsClient {
        TlsClient::load(&self.certs.join("ca.pem"), None).unwrap()
    }
}

async fn start(config: Config) -> Master {
    Master::start_with_http("127.0.0.1:0", Some("127.0.0.1:0"), config)
        .await
        .expect("master starts")
}

/// `ringmaster_<name>_total{reason="<reason>"}` from /metrics.
async fn counter(master: &Master, name: &str, reason: &str) -> u64 {
    let series = format!("{name}_total{{reason=\"{reason}\"}}");
    common::metric_value(master.http_addr().unwrap(), &series).await as u64
}

/// `GET path` on a master's `--http` port: plain HTTP, or HTTPS trusting `ca` (a master with
/// `tls:` serves its HTTP API over HTTPS only). (status, body)
async fn http_get(master: &Master, path: &str, ca: Option<&Path>) -> (u16, String) {
    let http = master.http_addr().unwrap();
    let (url, tls) = match ca {
        None => (format!("http://{http}{path}"), None),
        Some(ca) => {
            let pem = std::fs::read(ca).unwrap();
            let root = ureq::tls::Certificate::from_pem(&pem).unwrap();
            let tls = ureq::tls::TlsConfig::builder()
                .unversioned_rustls_crypto_provider(std::sync::Arc::new(
                    tokio_rustls::rustls::crypto::ring::default_provider(),
                ))
                .root_certs(ureq::tls::RootCerts::new_with_certs(&[root]))
                .build();
            (format!("https://{http}{path}"), Some(tls))
        }
    };
    tokio::task::spawn_blocking(move || {
        let mut config = ureq::Agent::config_builder()
            .timeout_global(Some(WAIT))
            .http_status_as_error(false);
        if let Some(tls) = tls {
            config = config.tls_config(tls);
        }
        let agent: ureq::Agent = config.build().into();
        let mut response = agent
            .get(&url)
            .call()
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        let body = response.body_mut().read_to_string().expect("body");
        (response.status().as_u16(), body)
    })
    .await
    .unwrap()
}

/// [`counter`] of a master with `tls:`, whose /metrics is HTTPS trusting `ca`.
async fn tls_counter(master: &Master, ca: &Path, name: &str, reason: &str) -> u64 {
    let wanted = format!("ringmaster_{name}_total{{reason=\"{reason}\"}} ");
    let (status, body) = http_get(master, "/metrics", Some(ca)).await;
    assert_eq!(status, 200, "{body}");
    body.lines()
        .find_map(|l| l.strip_prefix(&wanted))
        .unwrap_or_else(|| panic!("no series {wanted} in\n{body}"))
        .trim()
        .parse::<f64>()
        .expect("a number") as u64
}

/// A raw protocol client over plain TCP or TLS.
struct Peer {
    conn: Connection<BoxedStream>,
    ack: HelloAck,
    id: String,
}

impl Peer {
    async fn hello(addr: SocketAddr, tls: Option<&TlsClient>) -> Peer {
        let stream = ringmaster_proto::transport::connect(&addr.to_string(), tls, WAIT)
            .await
            .expect("connect");
        let mut conn = Connection::new(stream);
        conn.send(Message::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            client: "security-test".into(),
        }))
        .await
        .unwrap();
        let ack = match tokio::time::timeout(WAIT, conn.recv()).await {
            Ok(Ok(Some(Message::HelloAck(ack)))) => ack,
            other => panic!("expected HelloAck, got {other:?}"),
        };
        Peer {
            conn,
            ack,
            id: String::new(),
        }
    }

    /// Hello, then Authenticate as `principal` with `secret` for `role`; returns the master's
    /// answer (Authenticated or Error).
    async fn authenticate(&mut self, principal: &str, secret: &str, role: AuthRole) -> Message {
        let credential = Credential::new(principal, secret.as_bytes().to_vec()).unwrap();
        let answer = credential.answer(&self.ack, role);
        self.conn.send(Message::Authenticate(answer)).await.unwrap();
        self.next().await
    }

    async fn next(&mut self) -> Message {
        match tokio::time::timeout(WAIT, self.conn.recv()).await {
            Ok(Ok(Some(message))) => message,
            other => panic!("expected a message, got {other:?}"),
        }
    }

    /// The master closes the connection (after the Error already read).
    async fn expect_eof(&mut self) {
        match tokio::time::timeout(WAIT, self.conn.recv()).await {
            Ok(Ok(None)) | Ok(Err(_)) => {}
            other => panic!("expected the connection closed, got {other:?}"),
        }
    }

    async fn send(&mut self, message: Message) {
        self.conn.send(message).await.unwrap();
    }

    /// The next message `want` picks, skipping others.
    async fn expect<T>(&mut self, what: &str, mut want: impl FnMut(&Message) -> Option<T>) -> T {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            match tokio::time::timeout(left, self.conn.recv()).await {
                Ok(Ok(Some(message))) => {
                    if let Some(t) = want(&message) {
                        return t;
                    }
                }
                other => panic!("waiting for {what}: {other:?}"),
            }
        }
    }

    /// The Error the master closes the connection with.
    async fn expect_closed_with(&mut self, code: ErrorCode) -> String {
        let mut error = None;
        loop {
            match tokio::time::timeout(WAIT, self.conn.recv()).await {
                Ok(Ok(Some(Message::Error(e)))) => error = Some(e),
                Ok(Ok(Some(_))) => {}
                Ok(Ok(None)) | Ok(Err(_)) => break,
                Err(_) => panic!("connection not closed within {WAIT:?}"),
            }
        }
        let error = error.expect("an Error before the close");
        assert_eq!(
            error.code,
            code as i32,
            "expected {code:?}, got {:?}: {}",
            ErrorCode::try_from(error.code),
            error.message
        );
        error.message
    }

    async fn subscribe(&mut self, id: &str, user: &str) {
        self.send(Message::Subscribe(Subscribe {
            framework_id: id.into(),
            name: "fw".into(),
            user: user.into(),
            failover_timeout_secs: 60.0,
            ..Default::default()
        }))
        .await;
    }

    async fn subscribed(&mut self) {
        self.id = self
            .expect("Subscribed", |m| match m {
                Message::Subscribed(s) => Some(s.framework_id.clone()),
                Message::Error(e) => panic!("subscribe refused: {}", e.message),
                _ => None,
            })
            .await;
    }

    async fn register(&mut self, id: &str) {
        self.send(Message::RegisterAgent(RegisterAgent {
            agent_id: id.into(),
            hostname: format!("host-{id}"),
            total: Some(Resources::parse("cpus:4;mem:4096").unwrap().to_wire()),
            ..Default::default()
        }))
        .await;
    }

    async fn registered(&mut self) {
        self.id = self
            .expect("AgentRegistered", |m| match m {
                Message::AgentRegistered(r) => Some(r.agent_id.clone()),
                Message::Error(e) => panic!("registration refused: {}", e.message),
                _ => None,
            })
            .await;
    }
}

async fn framework(addr: SocketAddr, tls: Option<&TlsClient>, who: &str, user: &str) -> Peer {
    let mut peer = Peer::hello(addr, tls).await;
    let secret = format!("{who}-secret");
    let answer = peer.authenticate(who, &secret, AuthRole::Framework).await;
    assert!(matches!(answer, Message::Authenticated(_)), "{answer:?}");
    peer.subscribe("", user).await;
    peer.subscribed().await;
    peer
}

async fn agent(addr: SocketAddr, tls: Option<&TlsClient>, id: &str) -> Peer {
    let mut peer = Peer::hello(addr, tls).await;
    let answer = peer
        .authenticate("rack", "rack-secret", AuthRole::Agent)
        .await;
    assert!(matches!(answer, Message::Authenticated(_)), "{answer:?}");
    peer.register(id).await;
    peer.registered().await;
    peer
}

#[tokio::test]
async fn tls_master_serves_authenticated_agents_and_frameworks() {
    let fixture = Fixture::new();
    let master = start(fixture.config(true, true)).await;
    let tls = fixture.tls();
    let mut a = agent(master.addr(), Some(&tls), "a1").await;
    let mut fw = framework(master.addr(), Some(&tls), "alice", "alice").await;
    assert!(fw.ack.auth_required);
    assert_eq!(fw.ack.challenge.len(), 32);

    // A task runs end to end over the TLS connections.
    fw.send(Message::Demand(ringmaster_proto::Demand {
        resources: Some(Resources::parse("cpus:1;mem:128").unwrap().to_wire()),
        count: 1,
    }))
    .await;
    let offer = fw
        .expect("Offers", |m| match m {
            Message::Offers(o) => o.offers.first().cloned(),
            _ => None,
        })
        .await;
    fw.send(Message::Accept(Accept {
        offer_id: offer.offer_id.clone(),
        tasks: vec![task("t1", "cpus:1;mem:128", "true")],
    }))
    .await;
    let run = a
        .expect("RunTasks", |m| match m {
            Message::RunTasks(r) => Some(r.tasks.clone()),
            _ => None,
        })
        .await;
    assert_eq!(run[0].task_id, "t1");

    // The challenge differs on every connection.
    let other = Peer::hello(master.addr(), Some(&tls)).await;
    assert_ne!(other.ack.challenge, fw.ack.challenge);
    master.shutdown().await;
}

#[tokio::test]
async fn plain_client_against_a_tls_master_gets_tls_required() {
    let fixture = Fixture::new();
    let master = start(fixture.config(true, false)).await;
    // The master's /metrics is HTTPS, as its whole HTTP API (`tls:`).
    let ca = fixture.certs.join("ca.pem");
    let stream = tokio::net::TcpStream::connect(master.addr()).await.unwrap();
    let mut conn = Connection::new(stream);
    conn.send(Message::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        client: "plain".into(),
    }))
    .await
    .unwrap();
    match tokio::time::timeout(WAIT, conn.recv()).await {
        Ok(Ok(Some(Message::Error(e)))) => {
            assert_eq!(e.code, ErrorCode::TlsRequired as i32);
            assert!(e.message.contains("TLS"), "{}", e.message);
        }
        other => panic!("expected a TLS_REQUIRED error, got {other:?}"),
    }
    // Then the connection is closed.
    assert!(matches!(
        tokio::time::timeout(WAIT, conn.recv()).await,
        Ok(Ok(None)) | Ok(Err(_))
    ));
    assert_eq!(
        tls_counter(&master, &ca, "tls_handshake_failures", "plaintext").await,
        1
    );

    // A TLS client trusting another CA fails its handshake, and the master counts it.
    let elsewhere = tempfile::tempdir().unwrap();
    ringmaster::certs::write_dev_certs(elsewhere.path(), &[], &[], false).unwrap();
    let wrong_ca = TlsClient::load(&elsewhere.path().join("ca.pem"), None).unwrap();
    let err =
        ringmaster_proto::transport::connect(&master.addr().to_string(), Some(&wrong_ca), WAIT)
            .await
            .err()
            .expect("a certificate from another CA is refused");
    assert!(err.to_string().contains("TLS handshake"), "{err}");
    let deadline = tokio::time::Instant::now() + WAIT;
    while tls_counter(&master, &ca, "tls_handshake_failures", "handshake").await < 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "handshake failure not counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    master.shutdown().await;
}

#[tokio::test]
async fn mutual_tls_requires_a_client_certificate() {
    let fixture = Fixture::new();
    let yaml =
        "tls:\n  cert: certs/master.pem\n  key: certs/master.key\n  client_ca: certs/ca.pem\n";
    let file = fixture.dir().join("mtls.yaml");
    std::fs::write(&file, yaml).unwrap();
    let master = start(Config::load(&file).unwrap()).await;
    let certs = &fixture.certs;
    let with_cert = TlsClient::load(
        &certs.join("ca.pem"),
        Some((
            &certs.join("client-agent1.pem"),
            &certs.join("client-agent1.key"),
        )),
    )
    .unwrap();
    let mut peer = Peer::hello(master.addr(), Some(&with_cert)).await;
    peer.register("m1").await;
    peer.registered().await;

    // Without a client certificate the handshake (or the first read) fails.
    let without = fixture.tls();
    let refused = async {
        let stream =
            ringmaster_proto::transport::connect(&master.addr().to_string(), Some(&without), WAIT)
                .await?;
        let mut conn = Connection::new(stream);
        conn.send(Message::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            client: "no-cert".into(),
        }))
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?;
        match conn.recv().await {
            Ok(Some(Message::HelloAck(_))) => Ok(()),
            other => Err(std::io::Error::other(format!("{other:?}"))),
        }
    };
    assert!(
        tokio::time::timeout(WAIT, refused).await.unwrap().is_err(),
        "a client without a certificate got through"
    );
    master.shutdown().await;
}

/// A principal's users bound its tasks' users: over real TCP, a task naming a user `alice` may
/// not use fails alone (FAILED, `not_authorized`), its sibling reaches the agent carrying
/// `allowed_users` (the framework's own claim overwritten), and the framework stays subscribed.
#[tokio::test]
async fn a_principal_bounds_the_users_its_tasks_run_as() {
    let fixture = Fixture::new();
    let master = start(fixture.config(false, true)).await;
    let mut a = agent(master.addr(), None, "a1").await;
    let mut fw = framework(master.addr(), None, "alice", "alice").await;
    let demand = |count| {
        Message::Demand(ringmaster_proto::Demand {
            resources: Some(Resources::parse("cpus:2;mem:256").unwrap().to_wire()),
            count,
        })
    };
    fw.send(demand(1)).await;
    let offer = fw
        .expect("Offers", |m| match m {
            Message::Offers(o) => o.offers.first().cloned(),
            _ => None,
        })
        .await;
    fw.send(demand(0)).await;
    let mut allowed = task("t1", "cpus:1;mem:128", "true");
    allowed.user = "alice".into();
    allowed.allowed_users = vec!["root".into()];
    let mut forbidden = task("t2", "cpus:1;mem:128", "true");
    forbidden.user = "daemon".into();
    forbidden.allowed_users = vec!["daemon".into()];
    fw.send(Message::Accept(Accept {
        offer_id: offer.offer_id.clone(),
        tasks: vec![allowed, forbidden],
    }))
    .await;
    let failed = fw
        .expect("t2 FAILED", |m| match m {
            Message::Update(u) => u.status.clone().filter(|s| s.task_id == "t2"),
            _ => None,
        })
        .await;
    assert_eq!(failed.state(), TaskState::TaskFailed);
    assert_eq!(failed.reason, "not_authorized");
    assert_eq!(
        failed.message,
        "principal \"alice\" may not run tasks as user \"daemon\" (its users: alice)"
    );
    let run = a
        .expect("RunTasks", |m| match m {
            Message::RunTasks(r) => Some(r.tasks.clone()),
            _ => None,
        })
        .await;
    assert_eq!(run.len(), 1, "{run:?}");
    assert_eq!(run[0].task_id, "t1");
    assert_eq!(run[0].user, "alice");
    assert_eq!(run[0].allowed_users, vec!["alice".to_string()]);
    // Still subscribed: its next demand is offered.
    fw.send(demand(1)).await;
    fw.expect("Offers", |m| match m {
        Message::Offers(o) => o.offers.first().cloned(),
        Message::Error(e) => panic!("{e:?}"),
        _ => None,
    })
    .await;
    let snapshot = wait_for_state(&master, "t2 failed", |s| {
        s.tasks.iter().any(|t| t.id == "t2" && t.state == "FAILED")
    })
    .await;
    assert!(snapshot.frameworks.iter().all(|f| f.connected));
    master.shutdown().await;
}

#[tokio::test]
async fn plain_tcp_still_works_anonymously_when_auth_is_not_required() {
    let fixture = Fixture::new();
    let master = start(fixture.config(false, false)).await;
    // Today's client: Hello, then Subscribe, no Authenticate.
    let mut anonymous = Peer::hello(master.addr(), None).await;
    assert!(!anonymous.ack.auth_required);
    anonymous.subscribe("", "anyone").await;
    anonymous.subscribed().await;
    // A client that authenticates is still held to its grant.
    let mut alice = Peer::hello(master.addr(), None).await;
    alice
        .authenticate("alice", "alice-secret", AuthRole::Framework)
        .await;
    alice.subscribe("", "bob").await;
    alice.expect_closed_with(ErrorCode::NotAuthorized).await;
    master.shutdown().await;
}

#[tokio::test]
async fn authentication_failures_close_the_connection_and_are_counted() {
    let fixture = Fixture::new();
    let master = start(fixture.config(false, true)).await;
    let addr = master.addr();

    // No Authenticate where one is required.
    let mut p = Peer::hello(addr, None).await;
    assert!(p.ack.auth_required);
    p.register("x").await;
    let message = p
        .expect_closed_with(ErrorCode::AuthenticationRequired)
        .await;
    assert!(message.contains("--principal"), "{message}");

    // Wrong secret.
    let mut p = Peer::hello(addr, None).await;
    let answer = p.authenticate("rack", "guess", AuthRole::Agent).await;
    assert!(
        matches!(&answer, Message::Error(e) if e.code == ErrorCode::AuthenticationFailed as i32),
        "{answer:?}"
    );
    p.expect_eof().await;

    // Unknown principal: the same answer, so principals cannot be probed.
    let mut p = Peer::hello(addr, None).await;
    let answer = p.authenticate("mallory", "x", AuthRole::Agent).await;
    let Message::Error(unknown) = answer else {
        panic!("{answer:?}")
    };
    assert_eq!(unknown.code, ErrorCode::AuthenticationFailed as i32);
    assert!(unknown
        .message
        .contains("unknown principal or wrong secret"));

    // A right secret for a role the principal does not have.
    let mut p = Peer::hello(addr, None).await;
    let answer = p
        .authenticate("alice", "alice-secret", AuthRole::Agent)
        .await;
    assert!(
        matches!(&answer, Message::Error(e) if e.code == ErrorCode::NotAuthorized as i32),
        "{answer:?}"
    );

    // Authenticated as an agent, then trying to subscribe a framework.
    let mut p = Peer::hello(addr, None).await;
    p.authenticate("rack", "rack-secret", AuthRole::Agent).await;
    p.subscribe("", "alice").await;
    p.expect_closed_with(ErrorCode::NotAuthorized).await;

    // A user the framework principal may not run as.
    let mut p = Peer::hello(addr, None).await;
    p.authenticate("alice", "alice-secret", AuthRole::Framework)
        .await;
    p.subscribe("", "root").await;
    let message = p.expect_closed_with(ErrorCode::NotAuthorized).await;
    assert!(message.contains("root"), "{message}");

    // A MAC for another challenge (a replayed answer) is refused.
    let old = Peer::hello(addr, None).await;
    let mut p = Peer::hello(addr, None).await;
    let replay = Credential::new("rack", b"rack-secret".to_vec())
        .unwrap()
        .answer(&old.ack, AuthRole::Agent);
    p.send(Message::Authenticate(replay)).await;
    p.expect_closed_with(ErrorCode::AuthenticationFailed).await;

    // Something other than Authenticate or a registration, without a credential.
    let mut p = Peer::hello(addr, None).await;
    p.send(Message::Ping(ringmaster_proto::Ping { nonce: 7 }))
        .await;
    p.expect_closed_with(ErrorCode::NotRegistered).await;

    for (reason, count) in [
        ("missing", 2),
        ("bad_secret", 2),
        ("unknown_principal", 1),
        ("role_not_allowed", 2),
        ("user_not_allowed", 1),
    ] {
        assert_eq!(
            counter(&master, "auth_failures", reason).await,
            count,
            "{reason}"
        );
    }
    // Nobody got in.
    let snapshot = master.snapshot().await.unwrap();
    assert!(snapshot.agents.is_empty() && snapshot.frameworks.is_empty());
    master.shutdown().await;
}

#[tokio::test]
async fn a_principal_cannot_take_over_another_principals_framework_or_agent() {
    let fixture = Fixture::new();
    let master = start(fixture.config(false, true)).await;
    let addr = master.addr();
    let alice = framework(addr, None, "alice", "alice").await;
    let alice_id = alice.id.clone();
    drop(alice);
    wait_for_state(&master, "alice disconnected", |s| {
        s.frameworks
            .iter()
            .any(|f| f.id == alice_id && !f.connected)
    })
    .await;

    // bob names alice's framework id to fail over into it: refused.
    let mut bob = Peer::hello(addr, None).await;
    bob.authenticate("bob", "bob-secret", AuthRole::Framework)
        .await;
    bob.subscribe(&alice_id, "bob").await;
    let message = bob.expect_closed_with(ErrorCode::NotAuthorized).await;
    assert!(
        message.contains("alice") && message.contains(&alice_id),
        "{message}"
    );
    assert_eq!(counter(&master, "auth_failures", "not_owner").await, 1);

    // alice herself may fail over.
    let mut again = Peer::hello(addr, None).await;
    again
        .authenticate("alice", "alice-secret", AuthRole::Framework)
        .await;
    again.subscribe(&alice_id, "alice").await;
    again.subscribed().await;
    assert_eq!(again.id, alice_id);

    // The same for agent ids: rack registered a1; rack2 may not re-register it, rack may.
    drop(agent(addr, None, "a1").await);
    let mut intruder = Peer::hello(addr, None).await;
    intruder
        .authenticate("rack2", "rack2-secret", AuthRole::Agent)
        .await;
    intruder.register("a1").await;
    let message = intruder.expect_closed_with(ErrorCode::NotAuthorized).await;
    assert!(message.contains("agent a1"), "{message}");
    assert_eq!(counter(&master, "auth_failures", "not_owner").await, 2);
    drop(agent(addr, None, "a1").await);
    master.shutdown().await;
}

#[tokio::test]
async fn a_framework_cannot_touch_another_frameworks_offers_or_tasks() {
    let fixture = Fixture::new();
    let master = start(fixture.config(false, true)).await;
    let addr = master.addr();
    let mut a1 = agent(addr, None, "a1").await;
    let mut alice = framework(addr, None, "alice", "alice").await;
    let mut bob = framework(addr, None, "bob", "bob").await;

    alice
        .send(Message::Demand(ringmaster_proto::Demand {
            resources: Some(Resources::parse("cpus:1;mem:128").unwrap().to_wire()),
            count: 1,
        }))
        .await;
    let offer = alice
        .expect("Offers", |m| match m {
            Message::Offers(o) => o.offers.first().cloned(),
            _ => None,
        })
        .await;

    // bob accepts and declines alice's offer: both refused, nothing launched.
    bob.send(Message::Accept(Accept {
        offer_id: offer.offer_id.clone(),
        tasks: vec![task("stolen", "cpus:1;mem:128", "true")],
    }))
    .await;
    let e = bob
        .expect("Error", |m| match m {
            Message::Error(e) => Some(e.clone()),
            _ => None,
        })
        .await;
    assert_eq!(e.code, ErrorCode::InvalidOffer as i32, "{}", e.message);
    bob.send(Message::Decline(Decline {
        offer_ids: vec![offer.offer_id.clone()],
        refuse_seconds: 60.0,
    }))
    .await;
    let e = bob
        .expect("Error", |m| match m {
            Message::Error(e) => Some(e.clone()),
            _ => None,
        })
        .await;
    assert_eq!(e.code, ErrorCode::InvalidOffer as i32, "{}", e.message);

    // alice's offer is still hers: she launches on it.
    alice
        .send(Message::Accept(Accept {
            offer_id: offer.offer_id.clone(),
            tasks: vec![task("t1", "cpus:1;mem:128", "sleep 60")],
        }))
        .await;
    let run = a1
        .expect("RunTasks", |m| match m {
            Message::RunTasks(r) => Some(r.tasks.clone()),
            _ => None,
        })
        .await;
    assert_eq!(
        (run[0].task_id.as_str(), run[0].framework_id.as_str()),
        ("t1", alice.id.as_str())
    );
    a1.send(Message::StatusUpdate(ringmaster_proto::StatusUpdate {
        status: Some(ringmaster_proto::TaskStatus {
            task_id: "t1".into(),
            framework_id: alice.id.clone(),
            agent_id: a1.id.clone(),
            state: TaskState::TaskRunning as i32,
            update_id: "u1".into(),
            ..Default::default()
        }),
    }))
    .await;
    let alice_id = alice.id.clone();
    wait_for_state(&master, "t1 running", |s| {
        s.tasks
            .iter()
            .any(|t| t.id == "t1" && t.framework == alice_id && t.state == "RUNNING")
    })
    .await;

    // bob kills and reconciles "t1": he only ever reaches his own (unknown) task of that name.
    bob.send(Message::Kill(Kill {
        task_id: "t1".into(),
    }))
    .await;
    bob.send(Message::Reconcile(Reconcile {
        task_ids: vec!["t1".into()],
    }))
    .await;
    for _ in 0..2 {
        let status = bob
            .expect("Update for t1", |m| match m {
                Message::Update(u) => u.status.clone(),
                _ => None,
            })
            .await;
        assert_eq!(status.framework_id, bob.id);
        assert_eq!(status.state, TaskState::TaskLost as i32);
    }
    // The agent was never asked to kill alice's task, and it still runs.
    let ping = ringmaster_proto::Ping { nonce: 42 };
    a1.send(Message::Ping(ping)).await;
    a1.expect("Pong", |m| match m {
        Message::KillTask(k) => panic!("alice's task was killed for bob: {k:?}"),
        Message::Pong(p) if p.nonce == 42 => Some(()),
        _ => None,
    })
    .await;
    let snapshot = master.snapshot().await.unwrap();
    assert!(snapshot
        .tasks
        .iter()
        .any(|t| t.id == "t1" && t.framework == alice.id && t.state == "RUNNING"));
    master.shutdown().await;
}

struct NeverCalled;

#[async_trait::async_trait]
impl Scheduler for NeverCalled {
    async fn registered(&mut self, _driver: &Driver, id: &str) {
        panic!("registered as {id} with a wrong secret");
    }
    async fn offers(&mut self, _driver: &Driver, _offers: Vec<ringmaster_proto::Offer>) {}
    async fn status_update(&mut self, _driver: &Driver, _status: ringmaster_proto::TaskStatus) {}
}

#[tokio::test]
async fn sdk_with_a_wrong_secret_stops_with_a_clear_error() {
    let fixture = Fixture::new();
    let master = start(fixture.config(true, true)).await;
    let secret = fixture.dir().join("wrong");
    ringmaster_proto::files::write_private(&secret, "not-alice-secret").unwrap();
    let mut config = FrameworkConfig::new(master.addr().to_string(), "sdk");
    config.user = "alice".into();
    config.give_up_after = Some(WAIT);
    config.security = ClientSecurity {
        tls: Some(fixture.tls()),
        credential: Some(Credential::from_secret_file("alice", &secret).unwrap()),
        dialer: None,
    };
    let result = tokio::time::timeout(WAIT, ringmaster_sdk::run(config.clone(), NeverCalled))
        .await
        .expect("the SDK gives up at once");
    match result {
        Err(SdkError::Refused(message)) => {
            assert!(message.contains("AUTHENTICATION_FAILED"), "{message}")
        }
        other => panic!("expected Refused, got {:?}", other.err()),
    }
    // Without any credential against a master that requires one: refused before subscribing.
    config.security.credential = None;
    let result = tokio::time::timeout(WAIT, ringmaster_sdk::run(config, NeverCalled))
        .await
        .expect("the SDK gives up at once");
    match result {
        Err(SdkError::Refused(message)) => {
            assert!(message.contains("requires authentication"), "{message}")
        }
        other => panic!("expected Refused, got {:?}", other.err()),
    }
    master.shutdown().await;
}

/// A RegisterAgent of over 64 KiB (many task statuses): larger than the handshake frame limit.
fn big_registration(id: &str) -> Message {
    let tasks = (0..2_000)
        .map(|i| ringmaster_proto::TaskStatus {
            task_id: format!("old-task-{i}"),
            framework_id: "gone-framework".into(),
            agent_id: id.into(),
            state: TaskState::TaskRunning as i32,
            ..Default::default()
        })
        .collect();
    let message = Message::RegisterAgent(RegisterAgent {
        agent_id: id.into(),
        hostname: format!("host-{id}"),
        total: Some(Resources::parse("cpus:4;mem:4096").unwrap().to_wire()),
        tasks,
        ..Default::default()
    });
    let len = prost::Message::encoded_len(&ringmaster_proto::Envelope::new(message.clone()));
    assert!(len > 65536, "{len}");
    message
}

#[tokio::test]
async fn only_an_authenticated_peer_may_send_frames_beyond_the_handshake_limit() {
    let fixture = Fixture::new();
    let master = start(fixture.config(false, true)).await;
    // Not authenticated: the big frame is refused at its length prefix. Only the prefix is
    // sent, so the master has nothing unread when it closes (a reset could lose the Error).
    let big = prost::Message::encoded_len(&ringmaster_proto::Envelope::new(big_registration(
        "stranger",
    )));
    let mut tcp = tokio::net::TcpStream::connect(master.addr()).await.unwrap();
    {
        let mut conn = Connection::new(&mut tcp);
        conn.send(Message::Hello(Hello {
            protocol_version: PROTOCOL_VERSION,
            client: "security-test".into(),
        }))
        .await
        .unwrap();
        let ack = tokio::time::timeout(WAIT, conn.recv()).await;
        assert!(matches!(ack, Ok(Ok(Some(Message::HelloAck(_))))), "{ack:?}");
    }
    tokio::io::AsyncWriteExt::write_all(&mut tcp, &(big as u32).to_be_bytes())
        .await
        .unwrap();
    let mut conn = Connection::new(&mut tcp);
    let error = match tokio::time::timeout(WAIT, conn.recv()).await {
        Ok(Ok(Some(Message::Error(e)))) => e,
        other => panic!("expected an Error, got {other:?}"),
    };
    assert_eq!(error.code, ErrorCode::BadFrame as i32, "{}", error.message);
    assert!(error.message.contains("65536"), "{}", error.message);
    // Authenticated: the same size registers.
    let mut rack = Peer::hello(master.addr(), None).await;
    let answer = rack
        .authenticate("rack", "rack-secret", AuthRole::Agent)
        .await;
    assert!(matches!(answer, Message::Authenticated(_)), "{answer:?}");
    rack.send(big_registration("big")).await;
    rack.registered().await;
    master.shutdown().await;
}

/// A master that requires authentication (or serves TLS) does not serve HTTP on its protocol
/// port: an HTTP request there is a protocol error, not a way around the protocol's
/// credentials (the HTTP API checks its own, docs/security.md "HTTP API"). Its own `--http`
/// port still answers (over HTTPS with TLS).
#[tokio::test]
async fn a_master_requiring_authentication_serves_no_http_on_its_protocol_port() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let fixture = Fixture::new();
    for (tls, required) in [(false, true), (true, false)] {
        let master = start(fixture.config(tls, required)).await;
        let mut stream = tokio::net::TcpStream::connect(master.addr()).await.unwrap();
        stream
            .write_all(b"GET /state HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(common::WAIT, stream.read_to_end(&mut answer)).await;
        assert!(
            !answer.starts_with(b"HTTP/1.1 200"),
            "tls {tls}, required {required}: {}",
            String::from_utf8_lossy(&answer)
        );
        // With TLS the `--http` port speaks HTTPS only (docs/security.md, "HTTP API").
        let ca = fixture.certs.join("ca.pem");
        let (status, body) = http_get(&master, "/health", tls.then_some(ca.as_path())).await;
        assert_eq!(status, 200, "tls {tls}, required {required}: {body}");
        master.shutdown().await;
    }
}

/// The built-in jobs framework runs on a master that serves TLS and requires authentication:
/// it reaches its master through an in-process stream (no TLS client, no CA needed) and still
/// authenticates, as its own principal.
#[tokio::test]
async fn jobs_run_on_a_tls_master_that_requires_authentication() {
    let fixture = Fixture::new();
    let master = start(fixture.config(true, true)).await;
    master
        .start_jobs()
        .await
        .expect("jobs start on a TLS master");
    let tls = fixture.tls();
    let mut agent = agent(master.addr(), Some(&tls), "a1").await;
    let file = fixture.dir().join("web.yaml");
    std::fs::write(
        &file,
        "name: web\ntype: service\ncount: 1\ntask:\n  command: sleep 1000\n  \
         resources: cpus:1;mem:128\n",
    )
    .unwrap();
    // The HTTP API wants an operator (docs/security.md, "HTTP API").
    let http = master.http_addr().unwrap().to_string();
    let secret = fixture.dir().join("ops-secret");
    let ca = fixture.certs.join("ca.pem");
    let run = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_ringmaster"))
            .args(["job", "run"])
            .arg(&file)
            .args(["--master", &http, "--principal", "ops", "--secret-file"])
            .arg(&secret)
            // The HTTP API of a master with `tls:` is HTTPS.
            .arg("--tls-ca")
            .arg(&ca)
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
    let tasks = agent
        .expect("RunTasks", |m| match m {
            Message::RunTasks(r) => Some(r.tasks.clone()),
            _ => None,
        })
        .await;
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0].task_id, "web.0.1-1");
    let snapshot = wait_for_state(&master, "the jobs framework connected", |s| {
        s.frameworks
            .iter()
            .any(|f| f.name == "ringmaster-jobs" && f.connected)
    })
    .await;
    let jobs = snapshot
        .frameworks
        .iter()
        .find(|f| f.name == "ringmaster-jobs")
        .unwrap();
    assert_eq!(jobs.user, "jobs");
    master.shutdown().await;
}
