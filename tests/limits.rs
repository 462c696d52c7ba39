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
    assert!(
        grown < 128.0,
        "master memory grew by {grown:.0} MiB for one non-reading client"
    );

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
