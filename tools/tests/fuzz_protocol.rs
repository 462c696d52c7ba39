//! The fuzz target, bounded for CI: the frame decoder and the master's message handlers take
//! random, mutated and wild-but-valid input without a panic, and a well-behaved framework and
//! agent on the same master keep being answered throughout.
//!
//! Longer runs: `PROPTEST_CASES=100000` for the decoder properties, `RINGMASTER_FUZZ_FRAMES`
//! (default 4,000) and `RINGMASTER_FUZZ_SEED` for the live master; the million-frame run
//! against a release master is `ringmaster-stress fuzz` (docs/reliability.md).

#[path = "../../tests/common/mod.rs"]
mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use common::*;
use proptest::prelude::*;
use prost::Message as _;
use ringmaster_proto::{Connection, Envelope, Message, Ping};
use ringmaster_tools::fuzz::{fuzz_master, FrameFuzzer, FuzzRole};
use tokio::io::AsyncWriteExt;

/// Panics anywhere in this test binary (connection tasks included, which tokio would
/// otherwise swallow).
static PANICS: AtomicU64 = AtomicU64::new(0);

fn count_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            default(info);
        }));
    });
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Feeds `bytes` as a whole stream to a `Connection` and reads until it ends or errs. Every
/// message it yields must re-encode to an envelope that decodes to the same message.
async fn decode_stream(bytes: Vec<u8>, max_frame: usize) -> usize {
    let (mut a, b) = tokio::io::duplex(bytes.len().max(1) + 16);
    a.write_all(&bytes).await.unwrap();
    drop(a);
    let mut conn = Connection::with_max_frame(b, max_frame);
    let mut messages = 0;
    loop {
        match tokio::time::timeout(Duration::from_secs(5), conn.recv())
            .await
            .expect("the decoder finishes a closed stream")
        {
            Ok(Some(message)) => {
                // Compared as bytes: NaN fields are not equal to themselves.
                let bytes = Envelope::new(message).encode_to_vec();
                let again = Envelope::decode(&bytes[..]).expect("a decoded message re-encodes");
                assert!(
                    again.encode_to_vec() == bytes,
                    "re-encoding changed a message"
                );
                messages += 1;
            }
            Ok(None) | Err(_) => return messages,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn decoder_survives_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        count_panics();
        runtime().block_on(decode_stream(bytes, 1024));
    }

    #[test]
    fn decoder_survives_fuzz_frames(seed in any::<u64>(), n in 1usize..32) {
        count_panics();
        let mut fuzzer = FrameFuzzer::new(seed);
        let stream: Vec<u8> = (0..n).flat_map(|_| fuzzer.frame(FuzzRole::Framework)).collect();
        runtime().block_on(decode_stream(stream, 64 * 1024));
    }

    #[test]
    fn valid_frames_decode_exactly(seed in any::<u64>()) {
        let mut fuzzer = FrameFuzzer::new(seed);
        let message = fuzzer.message(FuzzRole::Agent);
        let frame = FrameFuzzer::valid_frame(message.clone());
        let got = runtime().block_on(async {
            let (mut a, b) = tokio::io::duplex(frame.len() + 16);
            a.write_all(&frame).await.unwrap();
            Connection::new(b).recv().await
        });
        let got = got.expect("a valid frame decodes").expect("a message");
        // Compared as bytes: NaN fields are not equal to themselves.
        prop_assert!(
            Envelope::new(got).encode_to_vec() == Envelope::new(message).encode_to_vec(),
            "decoded message differs from the one sent"
        );
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_master_survives_fuzz_and_keeps_answering_others() {
    count_panics();
    let frames = env_u64("RINGMASTER_FUZZ_FRAMES", 4000);
    let seed = env_u64("RINGMASTER_FUZZ_SEED", 0x5eed);
    let master = start_master(test_config("  max_frame_bytes: 65536\n")).await;
    let addr = master.addr();
    let mut agent = Client::agent(addr, "steady", "cpus:4;mem:4096").await;
    let mut fw = Client::framework(addr, "steady").await;

    let fuzzers: Vec<_> = (0..8u64)
        .map(|i| {
            tokio::spawn(fuzz_master(
                addr,
                seed.wrapping_add(i),
                frames / 8,
                64,
                WAIT,
            ))
        })
        .collect();
    // Throughout the fuzzing, the bystanders are answered: pings, heartbeats, offers.
    let mut rounds = 0u64;
    while rounds < 3 || fuzzers.iter().any(|f| !f.is_finished()) {
        rounds += 1;
        agent.heartbeat().await;
        agent.send(Message::Ping(Ping { nonce: rounds })).await;
        agent
            .expect("Pong", |m| match m {
                Message::Pong(p) if p.nonce == rounds => Some(()),
                _ => None,
            })
            .await;
        fw.demand("cpus:1;mem:128", 1).await;
        let offer = fw.expect_offers().await.remove(0);
        fw.decline(&offer.offer_id, 0.001).await;
    }
    let mut total = ringmaster_tools::fuzz::FuzzStats::default();
    for f in fuzzers {
        total.add(
            &f.await
                .unwrap()
                .expect("fuzz connections were all closed or served"),
        );
    }
    assert!(total.frames >= frames - 8, "{total:?}");
    assert!(total.connections > 8, "{total:?}");
    assert_eq!(
        PANICS.load(Ordering::SeqCst),
        0,
        "a task panicked (see output)"
    );
    let s = master.snapshot().await.unwrap();
    assert!(s.agents.iter().any(|a| a.id == "steady" && a.connected));
    assert!(s.frameworks.iter().any(|f| f.id == fw.id && f.connected));
    eprintln!("fuzzed: {total:?}, bystander rounds: {rounds}");
}
