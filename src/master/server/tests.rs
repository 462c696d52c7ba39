//! Connection-level tests of the server's bounds (issue 45): the shared budget for large
//! partial frames of subscribed connections, and HTTP on the protocol port only where `--http`
//! serves. (The auth-failure count of a peer that leaves after `HelloAck` is tested in
//! `task.rs`, where the handshake's end can be awaited.)

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ringmaster_proto::{Connection, Hello, Message, PROTOCOL_VERSION};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use super::limits::FrameBudget;
use super::listener::Listener;
use super::task::http_served_at;
use crate::config::Config;
use crate::master::events::Event;
use crate::master::metrics::Metrics;

const WAIT: Duration = Duration::from_secs(10);

fn config(yaml: &str) -> Arc<Config> {
    Arc::new(Config::from_yaml(yaml, "test.yaml").expect("config"))
}

/// A listener on `addr` with an actor stand-in that keeps every opened connection's outbound
/// queue (so it stays open) and counts inbound messages.
struct Served {
    addr: SocketAddr,
    inbound: watch::Receiver<usize>,
    stop: watch::Sender<bool>,
}

async fn serve(
    addr: &str,
    config: Arc<Config>,
    build: impl FnOnce(Listener) -> Listener,
) -> Served {
    let socket = TcpListener::bind(addr).await.unwrap();
    let addr = socket.local_addr().unwrap();
    let metrics = Arc::new(Metrics::new());
    let (events_tx, mut events_rx) = mpsc::channel(1024);
    let (stop, shutdown) = watch::channel(false);
    let listener = build(Listener::new(
        socket,
        None,
        events_tx,
        config,
        metrics.clone(),
        shutdown,
    ));
    tokio::spawn(listener.run());
    let (inbound_tx, inbound) = watch::channel(0usize);
    tokio::spawn(async move {
        let mut open = Vec::new();
        while let Some(event) = events_rx.recv().await {
            match event {
                Event::Opened { outbound, .. } => open.push(outbound),
                Event::Inbound { .. } => inbound_tx.send_modify(|n| *n += 1),
                _ => {}
            }
        }
    });
    Served {
        addr,
        inbound,
        stop,
    }
}

async fn hello<S>(conn: &mut Connection<S>) -> ringmaster_proto::HelloAck
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    conn.send(Message::Hello(Hello {
        protocol_version: PROTOCOL_VERSION,
        client: "bounds-test".into(),
    }))
    .await
    .unwrap();
    match tokio::time::timeout(WAIT, conn.recv()).await {
        Ok(Ok(Some(Message::HelloAck(ack)))) => ack,
        other => panic!("expected HelloAck, got {other:?}"),
    }
}

/// A message whose encoded envelope is about `bytes` long (an `Error`, valid from a framework).
fn big_message(bytes: usize) -> Vec<u8> {
    let message = Message::Error(ringmaster_proto::Error::new(
        ringmaster_proto::ErrorCode::InvalidOffer,
        "x".repeat(bytes),
    ));
    let body = prost::Message::encode_to_vec(&ringmaster_proto::Envelope::new(message));
    let mut frame = (body.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&body);
    frame
}

/// Many subscribed connections each announce a large frame and send only part of it: the
/// bytes reserved for them never exceed the shared budget (the rest wait, unread), and once
/// the frames are completed every one is read and the budget is empty again.
#[tokio::test]
async fn subscribed_connections_partial_frames_stay_within_the_budget() {
    const CONNECTIONS: usize = 40;
    const BUDGET: usize = 256 * 1024;
    let config = config(
        "master:\n  max_frame_bytes: 65536\nlimits:\n  max_handshake_frame_bytes: 1024\n  \
         messages_per_sec: 1000\n  burst: 1000\n",
    );
    let budget = FrameBudget::new(BUDGET, 1024, 65536);
    let served = serve("127.0.0.1:0", config, |l| {
        l.with_frame_budget(budget.clone())
    })
    .await;
    let frame = big_message(60_000);
    let len = frame.len() - 4;
    let fits = BUDGET / len;
    assert!(fits < CONNECTIONS);

    let mut usage = budget.watch();
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut tcp = TcpStream::connect(served.addr).await.unwrap();
        {
            let mut conn = Connection::new(&mut tcp);
            hello(&mut conn).await;
            conn.send(Message::Subscribe(Default::default()))
                .await
                .unwrap();
        }
        // The length prefix and a first part of the body.
        tcp.write_all(&frame[..4 + 1000]).await.unwrap();
        clients.push(tcp);
    }
    let mut most = 0;
    let seen = tokio::time::timeout(
        WAIT,
        usage.wait_for(|u| {
            most = most.max(u.held);
            u.held == fits * len && u.waiting == CONNECTIONS - fits
        }),
    )
    .await
    .expect("every connection reserved or waiting")
    .map(|u| *u)
    .unwrap();
    assert!(seen.held <= BUDGET, "{seen:?}");
    assert!(budget.held() <= budget.total());

    // The rest of every frame: all are read, in turn, never beyond the budget.
    for tcp in &mut clients {
        tcp.write_all(&frame[4 + 1000..]).await.unwrap();
    }
    let mut inbound = served.inbound.clone();
    tokio::time::timeout(WAIT, inbound.wait_for(|n| *n == CONNECTIONS))
        .await
        .expect("every large frame read")
        .unwrap();
    tokio::time::timeout(
        WAIT,
        usage.wait_for(|u| {
            most = most.max(u.held);
            u.held == 0 && u.waiting == 0
        }),
    )
    .await
    .expect("the budget is empty again")
    .unwrap();
    assert!(most <= BUDGET, "held {most} of {BUDGET}");
    served.stop.send(true).unwrap();
}

#[test]
fn http_is_handed_off_only_on_addresses_the_http_server_serves() {
    let at = |s: &str| s.parse::<SocketAddr>().unwrap();
    // Not told: every address, as before.
    assert!(http_served_at(at("10.0.0.5:5050"), None));
    // One address: that IP only, whatever the ports.
    let http = Some(at("10.0.0.5:8080"));
    assert!(http_served_at(at("10.0.0.5:5050"), http));
    assert!(!http_served_at(at("192.168.1.9:5050"), http));
    assert!(!http_served_at(at("127.0.0.1:5050"), http));
    // Loopback only.
    let http = Some(at("127.0.0.1:8080"));
    assert!(http_served_at(at("127.0.0.1:5050"), http));
    assert!(!http_served_at(at("10.0.0.5:5050"), http));
    // An IPv4 client of a dual-stack protocol port is seen as ::ffff:a.b.c.d.
    assert!(http_served_at(at("[::ffff:127.0.0.1]:5050"), http));
    // Wildcards: 0.0.0.0 serves every IPv4 address; [::] every address.
    assert!(http_served_at(
        at("10.0.0.5:5050"),
        Some(at("0.0.0.0:8080"))
    ));
    assert!(!http_served_at(
        at("[fe80::1]:5050"),
        Some(at("0.0.0.0:8080"))
    ));
    assert!(http_served_at(at("10.0.0.5:5050"), Some(at("[::]:8080"))));
    assert!(http_served_at(at("[fe80::1]:5050"), Some(at("[::]:8080"))));
    assert!(!http_served_at(
        at("[fe80::1]:5050"),
        Some(at("[fe80::2]:8080"))
    ));
}

/// A protocol port on every interface with `--http` on 127.0.0.1: an HTTP request reaching
/// 127.0.0.2 is answered 404 and not handed off; one reaching 127.0.0.1 is handed off.
#[tokio::test]
async fn the_protocol_port_hands_http_off_only_where_http_is_served() {
    let (handoff, mut handed) = mpsc::channel(4);
    let served = serve("0.0.0.0:0", config(""), |l| {
        l.with_http(Some(handoff))
            .with_http_addr(Some("127.0.0.1:1".parse().unwrap()))
    })
    .await;
    let port = served.addr.port();
    let request = b"GET /state HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";

    let mut other = TcpStream::connect(("127.0.0.2", port)).await.unwrap();
    other.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(WAIT, other.read_to_end(&mut answer))
        .await
        .expect("answered and closed")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    assert!(handed.try_recv().is_err(), "not handed off");

    let mut served_here = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    served_here.write_all(request).await.unwrap();
    let (stream, _) = tokio::time::timeout(WAIT, handed.recv())
        .await
        .expect("handed off")
        .unwrap();
    assert_eq!(
        stream.local_addr().unwrap().ip(),
        "127.0.0.1".parse::<std::net::IpAddr>().unwrap()
    );
    served.stop.send(true).unwrap();
}
