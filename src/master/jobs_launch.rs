//! Where the built-in jobs framework runs: beside a single master for its whole life, and
//! beside the leader of a replicated group for as long as it leads.
//!
//! [`JobsStarter`] starts it from the jobs records the registry holds (a single master's at its
//! start; a new leader's from the group's committed log, so the jobs framework resubscribes
//! with its framework ids and takes its instances over as they run: nothing is relaunched). It
//! talks to this master in process (no TCP, so no TLS and no certificate of its own) and, with
//! `auth.required`, authenticates like any framework. [`JobsSlot`] is what the HTTP API asks:
//! the running jobs framework's handle, or none (a follower, a master between leads).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use tokio::sync::{mpsc, watch};

use super::events::Event;
use super::jobs_store::{ActorJobsStore, JobsStore, LoadedJobs};
use crate::jobs::runner::JobsHandle;
use ringmaster_proto::transport::BoxedStream;

/// Bytes buffered each way on the jobs framework's in-process stream.
const IN_PROCESS_BUFFER: usize = 64 * 1024;

/// The running jobs framework's handle, if one runs here now.
#[derive(Default)]
pub struct JobsSlot {
    /// The handle and the number of the start that put it there.
    handle: RwLock<(u64, Option<JobsHandle>)>,
}

impl JobsSlot {
    /// The handle of the jobs framework running beside this master now.
    pub fn get(&self) -> Option<JobsHandle> {
        self.handle
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .1
            .clone()
    }

    /// Puts a new start's handle; returns the start's number.
    fn put(&self, handle: JobsHandle) -> u64 {
        let mut slot = self
            .handle
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        slot.0 += 1;
        slot.1 = Some(handle);
        slot.0
    }

    /// Empties the slot if it still holds start `number`'s handle (not a later start's).
    fn clear(&self, number: u64) {
        let mut slot = self
            .handle
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if slot.0 == number {
            slot.1 = None;
        }
    }
}

/// What starting the jobs framework beside this master needs; see the module doc.
#[derive(Clone)]
pub(crate) struct JobsStarter {
    /// The actor's events: the jobs framework's records are written in its turns.
    pub events: mpsc::Sender<Event>,
    /// Whether the master has a registry (else the jobs live in memory only).
    pub durable: bool,
    /// Streams to the protocol listener from inside this process.
    pub in_process: mpsc::Sender<BoxedStream>,
    /// The jobs framework's credential, when the master requires authentication.
    pub credential: Option<ringmaster_proto::security::Credential>,
    /// The master's protocol address (the jobs framework's name for its master in logs).
    pub addr: SocketAddr,
    /// A single master's `--work-dir`, whose `jobs.json` of an older master is imported once.
    pub work_dir: Option<PathBuf>,
    pub slot: Arc<JobsSlot>,
}

impl JobsStarter {
    /// Starts the jobs framework from `loaded` until `stop`; the slot holds its handle until
    /// then. Returns once it has subscribed its generation (written through the actor, which
    /// must be serving).
    pub async fn start(
        &self,
        mut loaded: LoadedJobs,
        stop: watch::Receiver<bool>,
    ) -> anyhow::Result<()> {
        let store: Arc<dyn JobsStore> =
            Arc::new(ActorJobsStore::new(self.events.clone(), self.durable));
        if let Some(dir) = self.work_dir.as_deref().filter(|_| store.is_durable()) {
            crate::jobs::records::import_jobs_file(dir, &mut loaded, store.as_ref()).await?;
        }
        let master = SocketAddr::new(
            if self.addr.ip().is_unspecified() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                self.addr.ip()
            },
            self.addr.port(),
        );
        let to_listener = self.in_process.clone();
        let dialer = ringmaster_proto::transport::Dialer::new(move || {
            let to_listener = to_listener.clone();
            async move {
                let (client, server) = tokio::io::duplex(IN_PROCESS_BUFFER);
                to_listener.send(Box::new(server)).await.map_err(|_| {
                    std::io::Error::new(
                        std::io::ErrorKind::ConnectionRefused,
                        "the master has stopped",
                    )
                })?;
                Ok(Box::new(client) as BoxedStream)
            }
        });
        let security = ringmaster_proto::transport::ClientSecurity {
            credential: self.credential.clone(),
            dialer: Some(dialer),
            ..Default::default()
        };
        let handle =
            crate::jobs::runner::start(master.to_string(), security, store, loaded, stop.clone())
                .await?;
        if *stop.borrow() {
            return Ok(());
        }
        let number = self.slot.put(handle);
        // The slot empties when the jobs framework stops (the lead is lost, the master stops).
        let slot = self.slot.clone();
        let mut stop = stop;
        tokio::spawn(async move {
            let _ = stop.wait_for(|stop| *stop).await;
            slot.clear(number);
        });
        Ok(())
    }
}
