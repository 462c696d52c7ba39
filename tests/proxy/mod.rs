//! A TCP proxy a test can cut and heal: the network partition of the replicated-master tests.
//!
//! Each master reaches each peer through its own proxy (`peers` in its config names the
//! proxy), so cutting every proxy into and out of one master isolates it from the group while
//! its clients can still reach it. Cutting drops every open connection through the proxy and
//! refuses new ones until healed; a refused connection is closed at once (as a dead peer looks
//! to the sender), not held open.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A proxy from an ephemeral loopback port to `target`. Dropping it stops it.
pub struct Proxy {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    /// Bumped on every cut: open connections end when it changes.
    generation: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    pub async fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a proxy");
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let (generation, _) = watch::channel(0u64);
        let task = {
            let cut = cut.clone();
            let generation = generation.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((inbound, _)) = listener.accept().await else {
                        continue;
                    };
                    if cut.load(Ordering::SeqCst) {
                        drop(inbound);
                        continue;
                    }
                    let mut ended = generation.subscribe();
                    tokio::spawn(async move {
                        let Ok(outbound) = TcpStream::connect(target).await else {
                            return;
                        };
                        let (mut inbound, mut outbound) = (inbound, outbound);
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                            _ = ended.changed() => {}
                        }
                    });
                }
            })
        };
        Proxy {
            addr,
            cut,
            generation,
            task,
        }
    }

    /// Drops every connection through the proxy and refuses new ones.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
    }

    /// Lets connections through again.
    pub fn heal(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}
