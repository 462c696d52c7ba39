//! Per-connection limits: a client that floods the master or stops reading is cut off with a
//! clear error, counted in `/metrics`, while a well-behaved framework on the same master keeps
//! getting offers and the master's memory stays bounded.

mod common;

use std::net::SocketAddr;

use common::*;
use ringmaster::config::Config;
use ringmaster::master::Master;
use ringmaster_proto::{ErrorCode, Message, Ping, Reconcile};

/// Fast test timers plus a `limits:` section.
fn config_with_limits(limits: &str) -> Config {
    let yaml = format!(
        "master:\n  agent_timeout: 5s\n  offer_timeout: 30s\n  allocation_interval: 5ms\n  \
         heartbeat_interval: 100ms\n  status_retry_interval: 5s\n  default_refuse: 5s\n\
         limits: {{ {limits} }}\n"
    );
    Config::from_yaml(&yaml, "test.yaml").expect("valid test config")
}

async fn start(limits: &str) -> Master {
    Master::start_with_http(
        "127.0.0.1:0",
        Some("127.0.0.1:0"),
        config_with_limits(limits),
    )
    .await
    .expect("master starts")
}

/// The value of one `/metrics` series line, e.g. `connections_limited_total{limit="message_rate"}`.
async fn metric(http: SocketAddr, series: &str) -> f64 {
    metric_value(http, series).await
}

/// The well-behaved framework gets an offer, declines it for a millisecond, and is ready for more.
async fn one_offer_round(fw: &mut Client) {
    fw.demand("cpus:1;mem:128", 1).await;
    let offer = fw.expect_offers().await.remove(0);
    fw.decline(&offer.offer_id, 0.001).await;
}

#[tokio::test]
async fn a_flooding_client_is_cut_off_and_others_keep_getting_offers() {
    let master = start("messages_per_sec: 200, burst: 400").await;
    let _agent = Client::agent(master.addr(), "steady", "cpus:4;mem:4096").await;
    let mut good = Client::framework(master.addr(), "good").await;
    one_offer_round(&mut good).await;

    let mut flooder = Client::framework(master.addr(), "flood").await;
    let flood = tokio::spawn(async move {
        // Far more than the burst, as fast as the socket takes them, without reading.
        for nonce in 0..50_000u64 {
            if flooder
                .conn
                .feed(Message::Ping(Ping { nonce }))
                .await
                .is_err()
            {
                break;
            }
            if nonce % 64 == 0 && flooder.conn.flush().await.is_err() {
                break;
            }
        }
        let _ = flooder.conn.flush().await;
        flooder.expect_closed().await
    });
    // While the flood goes on and after it, the good framework's conversation carries on.
    for _ in 0..5 {
        one_offer_round(&mut good).await;
    }
    let error = flood.await.unwrap().expect("an Error before the close");
    assert_eq!(
        error.code,
        ErrorCode::RateLimited as i32,
        "{}",
        error.message
    );
    assert!(
        error.message.contains("200 messages per second"),
        "{}",
        error.message
    );
    one_offer_round(&mut good).await;

    let http = master.http_addr().unwrap();
    assert_eq!(
        metric(http, "connections_limited_total{limit=\"message_rate\"}").await,
        1.0
    );
    assert_eq!(
        metric(http, "connections_limited_total{limit=\"outbound_queue\"}").await,
        0.0
    );
    let s = wait_for_state(&master, "flooder disconnected", |s| {
        s.frameworks
            .iter()
            .any(|f| f.name == "flood" && !f.connected)
    })
    .await;
    assert!(s.frameworks.iter().any(|f| f.name == "good" && f.connected));
}

fn vm_rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib / 1024.0
}

fn reconcile(round: usize) -> Message {
    Message::Reconcile(Reconcile {
        task_ids: (0..1000).map(|i| format!("r{round}-t{i}")).collect(),
    })
}

#[tokio::test]
async fn a_client_that_stops_reading_is_disconnected_and_memory_stays_bounded() {
    let master = start("outbound_queue: 4096").await;
    let _agent = Client::agent(master.addr(), "steady", "cpus:4;mem:4096").await;
    let mut good = Client::framework(master.addr(), "good").await;

    // A reader with the same traffic (1,000 updates per request) is never cut off.
    let mut reader = Client::framework(master.addr(), "reader").await;
    for round in 0..20 {
        reader.send(reconcile(round)).await;
        let mut got = 0;
        while got < 1000 {
            reader
                .expect("an Update", |m| {
                    matches!(m, Message::Update(_)).then_some(())
                })
                .await;
            got += 1;
        }
    }

    let before = vm_rss_mib();
    // The deaf one asks for 2,000 × 1,000 updates (hundreds of MB if all were kept) and
    // never reads them.
    let mut deaf = Client::framework(master.addr(), "deaf").await;
    let flood = tokio::spawn(async move {
        for round in 0..2000 {
            if deaf.conn.send(reconcile(round)).await.is_err() {
                break;
            }
        }
        deaf
    });
    wait_for_state(&master, "the deaf framework disconnected", |s| {
        s.frameworks
            .iter()
            .any(|f| f.name == "deaf" && !f.connected)
    })
    .await;
    let grown = vm_rss_mib() - before;
    let mut deaf = tokio::time::timeout(WAIT, flood)
        .await
        .expect("the deaf client's writes end once it is closed")
        .unwrap();
    // What it finds when it finally reads: what was in flight, then the close.
    let _ = deaf.expect_closed().await;
    // A figure, not a verdict (docs/reliability.md, "Limits"): the bound is the outbound queue,
    // whose overflow is checked by the metric below.
    eprintln!("master memory grew by {grown:.0} MiB for one non-reading client");

    let http = master.http_addr().unwrap();
    assert_eq!(
        metric(http, "connections_limited_total{limit=\"outbound_queue\"}").await,
        1.0
    );
    for _ in 0..3 {
        one_offer_round(&mut good).await;
    }
    reader.send(reconcile(99)).await;
    reader
        .expect("an Update after the cut", |m| {
            matches!(m, Message::Update(_)).then_some(())
        })
        .await;
}

#[tokio::test]
async fn a_client_that_stops_reading_is_cut_off_by_the_byte_bound_of_its_queue() {
    // A count bound far above what the deaf client asks for: only the byte bound can stop it.
    let master = start("outbound_queue: 1000000, outbound_queue_bytes: 65536").await;
    let _agent = Client::agent(master.addr(), "steady", "cpus:4;mem:4096").await;
    let mut good = Client::framework(master.addr(), "good").await;
    // 100 × 1,000 updates (about 10 MB encoded, more than the kernel's socket buffers hold),
    // never read.
    let mut deaf = Client::framework(master.addr(), "deaf").await;
    let flood = tokio::spawn(async move {
        for round in 0..100 {
            if deaf.conn.send(reconcile(round)).await.is_err() {
                break;
            }
        }
        deaf
    });
    wait_for_state(&master, "the deaf framework disconnected", |s| {
        s.frameworks
            .iter()
            .any(|f| f.name == "deaf" && !f.connected)
    })
    .await;
    let mut deaf = tokio::time::timeout(WAIT, flood)
        .await
        .expect("the deaf client's writes end once it is closed")
        .unwrap();
    let _ = deaf.expect_closed().await;
    let http = master.http_addr().unwrap();
    assert_eq!(
        metric(http, "connections_limited_total{limit=\"outbound_queue\"}").await,
        1.0
    );
    one_offer_round(&mut good).await;
}

/// Reads from a raw socket until the master closes it: `true` for a close (end of stream or
/// reset) with nothing sent first.
async fn closed_without_a_word(mut stream: tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncReadExt as _;
    let mut buf = [0u8; 64];
    match tokio::time::timeout(WAIT, stream.read(&mut buf)).await {
        Ok(Ok(0)) | Ok(Err(_)) => true,
        Ok(Ok(_)) => false,
        Err(_) => panic!("the connection was not closed within {WAIT:?}"),
    }
}

#[tokio::test]
async fn connections_beyond_the_cap_are_refused_and_counted() {
    let master = start("max_connections: 2").await;
    let http = master.http_addr().unwrap();
    // One registered framework and one connection still in its handshake hold both slots.
    let mut fw = Client::framework(master.addr(), "holder").await;
    let _handshaking = Client::connect(master.addr()).await;
    assert_eq!(metric(http, "connections_open").await, 2.0);
    assert_eq!(metric(http, "connections_refused_total").await, 0.0);

    let third = tokio::net::TcpStream::connect(master.addr()).await.unwrap();
    assert!(closed_without_a_word(third).await);
    assert_eq!(metric(http, "connections_refused_total").await, 1.0);
    assert_eq!(metric(http, "connections_open").await, 2.0);

    let fourth = tokio::net::TcpStream::connect(master.addr()).await.unwrap();
    assert!(closed_without_a_word(fourth).await);
    assert_eq!(metric(http, "connections_refused_total").await, 2.0);
    // The connections inside the cap are untouched.
    fw.send(Message::Ping(Ping { nonce: 7 })).await;
    fw.expect("Pong", |m| match m {
        Message::Pong(p) if p.nonce == 7 => Some(()),
        _ => None,
    })
    .await;
    master.shutdown().await;
}

#[tokio::test]
async fn a_large_frame_before_hello_is_refused_and_allowed_from_registration_on() {
    use tokio::io::AsyncWriteExt as _;
    let master = start("max_handshake_frame_bytes: 65536").await;
    let http = master.http_addr().unwrap();
    // A 1 MiB length prefix before Hello: refused at the prefix, nothing buffered.
    let mut raw = tokio::net::TcpStream::connect(master.addr()).await.unwrap();
    raw.write_all(&(1024u32 * 1024).to_be_bytes())
        .await
        .unwrap();
    let mut conn = ringmaster_proto::Connection::new(raw);
    let error = match tokio::time::timeout(WAIT, conn.recv()).await {
        Ok(Ok(Some(Message::Error(e)))) => e,
        other => panic!("expected an Error, got {other:?}"),
    };
    assert_eq!(error.code, ErrorCode::BadFrame as i32, "{}", error.message);
    assert!(error.message.contains("65536"), "{}", error.message);
    assert_eq!(
        metric(http, "frames_rejected_total{reason=\"bad_frame\"}").await,
        1.0
    );

    // The role message itself may be full-size: an agent re-registering with many tasks.
    let tasks: Vec<ringmaster_proto::TaskStatus> = (0..2_000)
        .map(|i| ringmaster_proto::TaskStatus {
            task_id: format!("old-task-{i}"),
            framework_id: "gone-framework".into(),
            agent_id: "big".into(),
            state: ringmaster_proto::TaskState::TaskRunning as i32,
            ..Default::default()
        })
        .collect();
    assert!(
        prost::Message::encoded_len(&ringmaster_proto::RegisterAgent {
            tasks: tasks.clone(),
            ..Default::default()
        }) > 65536
    );
    let _big = Client::agent_with_tasks(master.addr(), "big", "cpus:1;mem:1024", tasks).await;

    // After Subscribe the full master.max_frame_bytes applies: a ~150 KB Reconcile is fine.
    let _agent = Client::agent(master.addr(), "steady", "cpus:4;mem:4096").await;
    let mut fw = Client::framework(master.addr(), "big-frames").await;
    let big = Message::Reconcile(Reconcile {
        task_ids: (0..10_000).map(|i| format!("big-task-{i}")).collect(),
    });
    assert!(prost::Message::encoded_len(&ringmaster_proto::Envelope::new(big.clone())) > 65536);
    fw.send(big).await;
    one_offer_round(&mut fw).await;
    assert_eq!(
        metric(http, "frames_rejected_total{reason=\"bad_frame\"}").await,
        1.0
    );
    master.shutdown().await;
}

#[tokio::test]
async fn shutdown_drains_every_connection_including_handshakes() {
    let master = start("max_connections: 10").await;
    let mut fw = Client::framework(master.addr(), "registered").await;
    // Mid-handshake (Hello answered, no Subscribe yet): its 10 s handshake timeout must not
    // hold the shutdown, which waits for every connection task.
    let mut handshaking = Client::connect(master.addr()).await;
    tokio::time::timeout(WAIT / 2, master.shutdown())
        .await
        .expect("shutdown drains the connections well before the handshake timeout");
    let error = fw.expect_closed().await.expect("an Error before the close");
    assert_eq!(
        error.code,
        ErrorCode::ShuttingDown as i32,
        "{}",
        error.message
    );
    assert!(handshaking.expect_closed().await.is_none());
}
