//! Bad input never takes the master down: each case gets an error and a closed connection,
//! and everyone else carries on.

mod common;

use common::*;
use ringmaster_proto::convert::ResourcesWire;
use ringmaster_proto::{Connection, ErrorCode, Hello, Message, TaskState};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A framework and an agent with a running task, to check they carry on.
struct Bystanders {
    fw: Client,
    agent: Client,
    task: ringmaster_proto::TaskInfo,
}

async fn bystanders(master: &ringmaster::master::Master) -> Bystanders {
    let mut agent = Client::agent(master.addr(), "steady", "cpus:4;mem:4096").await;
    let mut fw = Client::framework(master.addr(), "steady").await;
    fw.demand("cpus:1;mem:128", 1).await;
    let offer = fw.expect_offers().await.remove(0);
    fw.demand("cpus:1;mem:128", 0).await;
    fw.accept(
        &offer.offer_id,
        vec![task("keep", "cpus:1;mem:128", "sleep 100")],
    )
    .await;
    let task = agent.expect_run().await.remove(0);
    agent.report(&task, TaskState::TaskRunning, "k1").await;
    fw.expect_state("keep", TaskState::TaskRunning).await;
    Bystanders { fw, agent, task }
}

/// After the bad connection, the bystanders' conversation still works end to end.
async fn carry_on(master: &ringmaster::master::Master, b: &mut Bystanders, n: u32) {
    b.agent
        .report(&b.task, TaskState::TaskRunning, &format!("again-{n}"))
        .await;
    b.fw.send(Message::Reconcile(ringmaster_proto::Reconcile {
        task_ids: vec!["keep".into()],
    }))
    .await;
    let status = b.fw.expect_update("keep").await;
    assert_eq!(status.state, TaskState::TaskRunning as i32);
    let s = master.snapshot().await.unwrap();
    assert!(s.frameworks.iter().any(|f| f.id == b.fw.id && f.connected));
    assert!(s.agents.iter().any(|a| a.id == "steady" && a.connected));
    assert_eq!(s.tasks.len(), 1);
}

/// Reads until the master closes; returns the Error it sent, if any.
async fn closed_with(stream: TcpStream) -> Option<ringmaster_proto::Error> {
    let mut conn = Connection::new(stream);
    let mut error = None;
    loop {
        match tokio::time::timeout(WAIT, conn.recv()).await {
            Ok(Ok(Some(Message::Error(e)))) => error = Some(e),
            Ok(Ok(Some(_))) => {}
            Ok(_) => return error,
            Err(_) => panic!("master did not close the connection"),
        }
    }
}

async fn raw(master: &ringmaster::master::Master, bytes: &[u8]) -> Option<ringmaster_proto::Error> {
    let mut stream = TcpStream::connect(master.addr()).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    closed_with(stream).await
}

fn frame(payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(payload);
    out
}

#[tokio::test]
async fn every_bad_input_closes_only_its_own_connection() {
    let master = start_master(test_config("  max_frame_bytes: 65536\n")).await;
    let mut b = bystanders(&master).await;

    // Garbage bytes that decode as no protobuf.
    let e = raw(&master, &frame(&[0xff; 16])).await.expect("error sent");
    assert_eq!(e.code, ErrorCode::BadFrame as i32, "{}", e.message);
    carry_on(&master, &mut b, 1).await;

    // A frame over the limit.
    let e = raw(&master, &(10_000_000u32).to_be_bytes())
        .await
        .expect("error sent");
    assert_eq!(e.code, ErrorCode::BadFrame as i32);
    assert!(e.message.contains("65536"), "{}", e.message);
    carry_on(&master, &mut b, 2).await;

    // A truncated frame: the peer goes away mid-frame.
    {
        let mut stream = TcpStream::connect(master.addr()).await.unwrap();
        stream.write_all(&100u32.to_be_bytes()).await.unwrap();
        stream.write_all(&[1, 2, 3]).await.unwrap();
        stream.shutdown().await.unwrap();
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(WAIT, stream.read_to_end(&mut rest))
            .await
            .expect("closed");
    }
    carry_on(&master, &mut b, 3).await;

    // An unknown message (an envelope field this build does not know).
    let e = raw(&master, &frame(&[0x98, 0x06, 0x01]))
        .await
        .expect("error sent");
    assert_eq!(e.code, ErrorCode::UnknownMessage as i32);
    carry_on(&master, &mut b, 4).await;

    // A message before Hello.
    let demand = {
        use prost::Message as _;
        ringmaster_proto::Envelope::new(Message::Demand(ringmaster_proto::Demand {
            resources: None,
            count: 1,
        }))
        .encode_to_vec()
    };
    let e = raw(&master, &frame(&demand)).await.expect("error sent");
    assert_eq!(e.code, ErrorCode::NotRegistered as i32);
    assert!(e.message.contains("Hello"), "{}", e.message);
    carry_on(&master, &mut b, 5).await;

    // A message after Hello but before subscribing.
    let mut c = Client::connect(master.addr()).await;
    c.send(Message::Demand(ringmaster_proto::Demand {
        resources: None,
        count: 1,
    }))
    .await;
    let e = c.expect_closed().await.expect("error sent");
    assert_eq!(e.code, ErrorCode::NotRegistered as i32);
    carry_on(&master, &mut b, 6).await;

    // An agent message on a framework connection.
    let mut f = Client::framework(master.addr(), "confused").await;
    f.send(Message::AgentHeartbeat(
        ringmaster_proto::AgentHeartbeat::default(),
    ))
    .await;
    let e = f.expect_closed().await.expect("error sent");
    assert_eq!(e.code, ErrorCode::UnexpectedMessage as i32);
    carry_on(&master, &mut b, 7).await;

    // A framework using another's id while that one is connected.
    let mut c = Client::connect(master.addr()).await;
    c.send(Message::Subscribe(ringmaster_proto::Subscribe {
        framework_id: b.fw.id.clone(),
        name: "impostor".into(),
        user: "u".into(),
        weight: 1.0,
        failover_timeout_secs: 1.0,
        ..Default::default()
    }))
    .await;
    let e = c.expect_closed().await.expect("error sent");
    assert_eq!(e.code, ErrorCode::FrameworkConflict as i32);
    carry_on(&master, &mut b, 8).await;

    // An agent claiming a connected agent's id.
    let mut c = Client::connect(master.addr()).await;
    c.send(Message::RegisterAgent(ringmaster_proto::RegisterAgent {
        agent_id: "steady".into(),
        hostname: "evil".into(),
        total: Some(
            ringmaster_proto::resources::Resources::parse("cpus:1")
                .unwrap()
                .to_wire(),
        ),
        ..Default::default()
    }))
    .await;
    let e = c.expect_closed().await.expect("error sent");
    assert_eq!(e.code, ErrorCode::FrameworkConflict as i32);
    carry_on(&master, &mut b, 9).await;

    // Bad resources in a registration.
    let mut c = Client::connect(master.addr()).await;
    c.send(Message::RegisterAgent(ringmaster_proto::RegisterAgent {
        agent_id: String::new(),
        hostname: "dup".into(),
        total: Some(ringmaster_proto::Resources {
            scalars: vec![
                ringmaster_proto::Scalar {
                    name: "cpus".into(),
                    milli: 1,
                },
                ringmaster_proto::Scalar {
                    name: "cpus".into(),
                    milli: 2,
                },
            ],
        }),
        ..Default::default()
    }))
    .await;
    let e = c.expect_closed().await.expect("error sent");
    // Final for the agent: retrying the same registration cannot succeed.
    assert_eq!(e.code, ErrorCode::AgentRefused as i32);
    assert!(e.message.contains("more than once"), "{}", e.message);
    carry_on(&master, &mut b, 10).await;

    // A bad weight.
    let mut c = Client::connect(master.addr()).await;
    c.send(Message::Subscribe(ringmaster_proto::Subscribe {
        name: "neg".into(),
        weight: -1.0,
        ..Default::default()
    }))
    .await;
    let e = c.expect_closed().await.expect("error sent");
    assert_eq!(e.code, ErrorCode::InvalidRequest as i32);
    carry_on(&master, &mut b, 11).await;
}

#[tokio::test]
async fn version_mismatch_names_the_spoken_versions() {
    let master = start_master(test_config("")).await;
    let stream = TcpStream::connect(master.addr()).await.unwrap();
    let mut conn = Connection::new(stream);
    conn.send(Message::Hello(Hello {
        protocol_version: 42,
        client: "future".into(),
    }))
    .await
    .unwrap();
    let Ok(Ok(Some(Message::Error(e)))) = tokio::time::timeout(WAIT, conn.recv()).await else {
        panic!("expected an Error");
    };
    assert_eq!(e.code, ErrorCode::VersionMismatch as i32);
    assert_eq!(e.supported_versions, vec![1]);
    assert!(e.message.contains("42"));
    assert!(matches!(
        tokio::time::timeout(WAIT, conn.recv()).await,
        Ok(Ok(None)) | Ok(Err(_))
    ));
}
