//! Bad input at scale: a seeded generator of random, mutated and wild-but-valid protocol frames,
//! and a client that throws them at a live master.
//!
//! Why a library module: the same generator drives the bounded fuzz tests in `cargo test`
//! (`tools/tests/fuzz_protocol.rs`) and the million-frame run of `ringmaster-stress fuzz` against a
//! release master, so a failure found by one is reproducible by the other from its seed.
//!
//! Three shapes of frame, all correctly length-prefixed unless said otherwise:
//! - random bytes;
//! - a valid `Envelope` encoding with its bytes mutated (bit flips, overwrites, inserts, cuts,
//!   duplicated slices, varint bombs), sometimes with a lying length prefix;
//! - a valid message with wild field values: empty, huge or non-ASCII strings, NaN and
//!   infinite numbers, duplicate or overflowing resources, unknown enum values, ids of other
//!   peers, and messages of the wrong role or direction.
//!
//! Ids the master hands out (framework, agent, offer, task ids) are learned from its replies
//! and reused, so the handlers are reached with ids that exist, not only nonsense.

use std::net::SocketAddr;
use std::time::Duration;

use prost::Message as _;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use ringmaster_proto::{
    Accept, AgentHeartbeat, AgentRegistered, Attribute, Authenticate, BatchTask, Decline, Demand,
    Device, DeviceShare, Envelope, Hello, HelloAck, Kill, KillTask, Message, Offer, Offers, Ping,
    Pong, Reconcile, RegisterAgent, Rescind, Resources, Revive, RunTasks, Scalar, StatusAck,
    StatusUpdate, SubmitBatch, Subscribe, Subscribed, Suppress, TaskInfo, TaskStatus, Teardown,
    Update, PROTOCOL_VERSION,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long a garbage connection waits after each frame for the master to close it.
const GARBAGE_PACE: Duration = Duration::from_millis(2);

/// How many ids of each kind are remembered (oldest dropped).
const KNOWN_KEPT: usize = 64;

/// Ids seen in the master's replies, reused to reach deeper into the handlers.
#[derive(Debug, Default, Clone)]
pub struct KnownIds {
    pub frameworks: Vec<String>,
    pub agents: Vec<String>,
    pub offers: Vec<String>,
    pub tasks: Vec<String>,
    pub updates: Vec<String>,
}

fn remember(list: &mut Vec<String>, id: &str) {
    if id.is_empty() || list.iter().any(|k| k == id) {
        return;
    }
    if list.len() >= KNOWN_KEPT {
        list.remove(0);
    }
    list.push(id.to_string());
}

impl KnownIds {
    /// Learns the ids in a message the master sent.
    pub fn observe(&mut self, message: &Message) {
        match message {
            Message::Subscribed(s) => remember(&mut self.frameworks, &s.framework_id),
            Message::AgentRegistered(r) => remember(&mut self.agents, &r.agent_id),
            Message::Offers(o) => {
                for offer in &o.offers {
                    remember(&mut self.offers, &offer.offer_id);
                    remember(&mut self.agents, &offer.agent_id);
                    remember(&mut self.frameworks, &offer.framework_id);
                }
            }
            Message::RunTasks(r) => {
                for t in &r.tasks {
                    remember(&mut self.tasks, &t.task_id);
                    remember(&mut self.frameworks, &t.framework_id);
                }
            }
            Message::Update(u) => {
                if let Some(s) = &u.status {
                    remember(&mut self.tasks, &s.task_id);
                    remember(&mut self.updates, &s.update_id);
                }
            }
            _ => {}
        }
    }
}

/// Which conversation a fuzz connection opens with (and mostly stays in).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FuzzRole {
    Agent,
    Framework,
}

/// A seeded generator of frames and messages. Same seed, same sequence.
pub struct FrameFuzzer {
    rng: ChaCha8Rng,
    pub known: KnownIds,
}

impl FrameFuzzer {
    pub fn new(seed: u64) -> Self {
        FrameFuzzer {
            rng: ChaCha8Rng::seed_from_u64(seed),
            known: KnownIds::default(),
        }
    }

    fn chance(&mut self, percent: u32) -> bool {
        self.rng.random_range(0..100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> Option<&'a T> {
        if items.is_empty() {
            None
        } else {
            Some(&items[self.rng.random_range(0..items.len())])
        }
    }

    /// A string that is sometimes an id the master knows and often something odd.
    pub fn wild_string(&mut self, known: &[String]) -> String {
        match self.rng.random_range(0..10) {
            0..=2 if !known.is_empty() => self.pick(known).cloned().unwrap_or_default(),
            0..=3 => String::new(),
            4 => {
                let n = self.rng.random_range(1..12);
                (0..n)
                    .map(|_| self.rng.random_range(b'a'..=b'z') as char)
                    .collect()
            }
            5 => "x".repeat(self.rng.random_range(100..5000)),
            6 => [
                "é",
                "\u{0}",
                "\u{202e}",
                "💥",
                "\n",
                "../../etc/passwd",
                " ",
            ][self.rng.random_range(0..7)]
            .repeat(self.rng.random_range(1..8)),
            7 => ["default", "gpu", "cpus", "mem", "user", "base", "*"]
                [self.rng.random_range(0..7)]
            .to_string(),
            8 => self.rng.random::<u64>().to_string(),
            _ => format!("fuzz-{}", self.rng.random_range(0..20)),
        }
    }

    fn wild_f64(&mut self) -> f64 {
        match self.rng.random_range(0..10) {
            0 => 0.0,
            1 => -1.0,
            2 => f64::NAN,
            3 => f64::INFINITY,
            4 => f64::NEG_INFINITY,
            5 => f64::MAX,
            6 => f64::MIN_POSITIVE,
            7 => 1e-12,
            _ => self.rng.random_range(0.0..100.0),
        }
    }

    fn wild_u64(&mut self) -> u64 {
        match self.rng.random_range(0..6) {
            0 => 0,
            1 => u64::MAX,
            2 => u64::MAX / 1000 + 1,
            3 => self.rng.random(),
            _ => self.rng.random_range(1..100_000),
        }
    }

    fn wild_u32(&mut self) -> u32 {
        match self.rng.random_range(0..5) {
            0 => 0,
            1 => u32::MAX,
            _ => self.rng.random_range(1..50),
        }
    }

    fn wild_enum(&mut self) -> i32 {
        match self.rng.random_range(0..5) {
            0 => -1,
            1 => 99,
            2 => i32::MAX,
            _ => self.rng.random_range(0..7),
        }
    }

    pub fn wild_resources(&mut self) -> Option<Resources> {
        if self.chance(10) {
            return None;
        }
        let n = self.rng.random_range(0..5);
        let scalars = (0..n)
            .map(|_| Scalar {
                name: if self.chance(80) {
                    ["cpus", "mem", "gpus", "disk"][self.rng.random_range(0..4)].to_string()
                } else {
                    self.wild_string(&[])
                },
                milli: if self.chance(60) {
                    self.rng.random_range(1..8000)
                } else {
                    self.wild_u64()
                },
            })
            .collect();
        Some(Resources { scalars })
    }

    fn device_class(&mut self) -> String {
        if self.chance(80) {
            "gpu".into()
        } else {
            self.wild_string(&[])
        }
    }

    fn device_index(&mut self) -> u32 {
        if self.chance(80) {
            self.rng.random_range(0..8)
        } else {
            self.wild_u32()
        }
    }

    /// Devices of an agent: duplicate indexes, zero or huge memory, odd classes now and then.
    fn devices(&mut self) -> Vec<Device> {
        let n = if self.chance(60) {
            0
        } else {
            self.rng.random_range(1..6)
        };
        (0..n)
            .map(|_| Device {
                class: self.device_class(),
                index: self.device_index(),
                model: ["V100M16", "A100", "", "💥"][self.rng.random_range(0..4)].into(),
                memory_mib: if self.chance(70) {
                    16_384
                } else {
                    self.wild_u64()
                },
            })
            .collect()
    }

    /// Device shares: over 1,000 milli, unknown indexes, more memory than any device.
    fn device_shares(&mut self) -> Vec<DeviceShare> {
        let n = if self.chance(60) {
            0
        } else {
            self.rng.random_range(1..4)
        };
        (0..n)
            .map(|_| DeviceShare {
                class: self.device_class(),
                index: self.device_index(),
                milli: if self.chance(70) {
                    self.rng.random_range(0..=1000)
                } else {
                    self.wild_u32()
                },
                memory_mib: self.wild_u64(),
            })
            .collect()
    }

    fn attributes(&mut self) -> Vec<Attribute> {
        let n = if self.chance(70) {
            0
        } else {
            self.rng.random_range(1..6)
        };
        (0..n)
            .map(|_| Attribute {
                key: if self.chance(30) {
                    "partition".into()
                } else {
                    self.wild_string(&[])
                },
                value: self.wild_string(&[]),
            })
            .collect()
    }

    fn task_info(&mut self) -> TaskInfo {
        let known = self.known.clone();
        TaskInfo {
            task_id: self.wild_string(&known.tasks),
            name: self.wild_string(&[]),
            command: if self.chance(70) {
                "true".into()
            } else {
                self.wild_string(&[])
            },
            resources: self.wild_resources(),
            framework_id: self.wild_string(&known.frameworks),
            agent_id: self.wild_string(&known.agents),
            env: self.attributes(),
            priority_class: ["", "user", "base", "weird"][self.rng.random_range(0..4)].into(),
            devices: self.device_shares(),
            gpu_models: if self.chance(80) {
                vec![]
            } else {
                vec![self.wild_string(&[])]
            },
            user: if self.chance(90) {
                String::new()
            } else {
                self.wild_string(&[])
            },
            kill_grace_ms: if self.chance(90) {
                0
            } else {
                self.rng.random()
            },
            health: self.chance(10).then(|| ringmaster_proto::v1::HealthCheck {
                command: self.wild_string(&[]),
                interval_ms: self.wild_u64(),
                timeout_ms: self.wild_u64(),
                failures: self.rng.random(),
                grace_ms: self.wild_u64(),
            }),
            // What a framework claims here the master overwrites.
            allowed_users: if self.chance(90) {
                vec![]
            } else {
                vec![self.wild_string(&[])]
            },
        }
    }

    fn task_status(&mut self) -> TaskStatus {
        let known = self.known.clone();
        TaskStatus {
            task_id: self.wild_string(&known.tasks),
            framework_id: self.wild_string(&known.frameworks),
            agent_id: self.wild_string(&known.agents),
            state: self.wild_enum(),
            reason: self.wild_string(&[]),
            message: self.wild_string(&[]),
            exit_code: self.chance(50).then(|| self.rng.random()),
            update_id: self.wild_string(&known.updates),
            timestamp_ms: self.wild_u64(),
            devices: self.device_shares(),
            health: self.wild_enum(),
        }
    }

    fn some_tasks<T>(&mut self, max: usize, mut make: impl FnMut(&mut Self) -> T) -> Vec<T> {
        let n = if self.chance(5) {
            self.rng.random_range(0..max * 20)
        } else {
            self.rng.random_range(0..max)
        };
        (0..n).map(|_| make(self)).collect()
    }

    /// A role-opening message: RegisterAgent or Subscribe, sometimes with wild fields.
    pub fn opening(&mut self, role: FuzzRole) -> Message {
        let tame = self.chance(70);
        let known = self.known.clone();
        match role {
            FuzzRole::Agent => Message::RegisterAgent(RegisterAgent {
                agent_id: if tame {
                    String::new()
                } else {
                    self.wild_string(&known.agents)
                },
                hostname: self.wild_string(&[]),
                total: if tame {
                    Some(Resources {
                        scalars: vec![
                            Scalar {
                                name: "cpus".into(),
                                milli: 8000,
                            },
                            Scalar {
                                name: "mem".into(),
                                milli: 16_384_000,
                            },
                        ],
                    })
                } else {
                    self.wild_resources()
                },
                attributes: self.attributes(),
                tasks: if tame {
                    vec![]
                } else {
                    self.some_tasks(3, Self::task_status)
                },
                devices: self.devices(),
            }),
            FuzzRole::Framework => Message::Subscribe(Subscribe {
                framework_id: if tame {
                    String::new()
                } else {
                    self.wild_string(&known.frameworks)
                },
                name: self.wild_string(&[]),
                user: self.wild_string(&[]),
                weight: if tame { 1.0 } else { self.wild_f64() },
                failover_timeout_secs: if tame { 1.0 } else { self.wild_f64() },
                partition: if tame {
                    String::new()
                } else {
                    self.wild_string(&[])
                },
            }),
        }
    }

    /// Any message at all, with wild values; `role` biases towards what that role may send.
    pub fn message(&mut self, role: FuzzRole) -> Message {
        self.message_in_role(role, 80)
    }

    /// As [`FrameFuzzer::message`], a kind `role` may send with `percent` chance.
    pub fn message_in_role(&mut self, role: FuzzRole, percent: u32) -> Message {
        let known = self.known.clone();
        let in_role = self.chance(percent);
        let kind = match (in_role, role) {
            (true, FuzzRole::Agent) => [0, 1, 12, 15, 15, 15][self.rng.random_range(0..6)],
            (true, FuzzRole::Framework) => {
                [0, 1, 22, 23, 24, 27, 27, 28, 16, 30, 31, 32, 33][self.rng.random_range(0..13)]
            }
            (false, _) => self.rng.random_range(0..35),
        };
        match kind {
            0 => Message::Ping(Ping {
                nonce: self.rng.random(),
            }),
            1 => Message::Pong(Pong {
                nonce: self.rng.random(),
            }),
            2 => Message::Hello(Hello {
                protocol_version: self.wild_u32(),
                client: self.wild_string(&[]),
            }),
            3 => Message::HelloAck(HelloAck {
                protocol_version: PROTOCOL_VERSION,
                master: self.wild_string(&[]),
                ..Default::default()
            }),
            5 => Message::Authenticate(Authenticate {
                principal: self.wild_string(&[]),
                role: ["agent", "framework", ""][self.rng.random_range(0..3)].into(),
                mac: (0..self.rng.random_range(0..40))
                    .map(|_| self.rng.random())
                    .collect(),
            }),
            4 => Message::Error(ringmaster_proto::Error {
                code: self.wild_enum(),
                message: self.wild_string(&[]),
                supported_versions: vec![self.wild_u32()],
                leader: self.wild_string(&[]),
            }),
            10 => self.opening(FuzzRole::Agent),
            11 => Message::AgentRegistered(AgentRegistered {
                agent_id: self.wild_string(&known.agents),
                heartbeat_interval_ms: self.wild_u64(),
            }),
            12 => Message::AgentHeartbeat(AgentHeartbeat {
                agent_id: self.wild_string(&known.agents),
                free: self.wild_resources(),
                tasks: self.some_tasks(4, Self::task_status),
                free_devices: self.device_shares(),
            }),
            13 => Message::RunTasks(RunTasks {
                tasks: self.some_tasks(3, Self::task_info),
                leader_term: self.wild_u64(),
            }),
            14 => Message::KillTask(KillTask {
                task_id: self.wild_string(&known.tasks),
                framework_id: self.wild_string(&known.frameworks),
                reason: self.wild_string(&[]),
                leader_term: self.wild_u64(),
            }),
            15 => Message::StatusUpdate(StatusUpdate {
                status: self.chance(95).then(|| self.task_status()),
            }),
            16 => Message::StatusAck(StatusAck {
                task_id: self.wild_string(&known.tasks),
                update_id: self.wild_string(&known.updates),
            }),
            20 => self.opening(FuzzRole::Framework),
            21 => Message::Subscribed(Subscribed {
                framework_id: self.wild_string(&known.frameworks),
                heartbeat_interval_ms: self.wild_u64(),
            }),
            22 => Message::Demand(Demand {
                resources: self.wild_resources(),
                count: self.wild_u32(),
            }),
            23 => Message::Revive(Revive {}),
            24 => Message::Suppress(Suppress {}),
            25 => Message::Offers(Offers {
                offers: vec![Offer {
                    offer_id: self.wild_string(&known.offers),
                    resources: self.wild_resources(),
                    ..Default::default()
                }],
            }),
            26 => Message::Rescind(Rescind {
                offer_id: self.wild_string(&known.offers),
                reason: self.wild_string(&[]),
            }),
            27 => Message::Accept(Accept {
                offer_id: self.wild_string(&known.offers),
                tasks: self.some_tasks(4, Self::task_info),
            }),
            28 => Message::Decline(Decline {
                offer_ids: self.some_tasks(3, |f| f.wild_string(&known.offers)),
                refuse_seconds: self.wild_f64(),
            }),
            29 => Message::Update(Update {
                status: Some(self.task_status()),
            }),
            30 => Message::Kill(Kill {
                task_id: self.wild_string(&known.tasks),
            }),
            31 => Message::Reconcile(Reconcile {
                task_ids: self.some_tasks(5, |f| f.wild_string(&known.tasks)),
            }),
            32 => Message::Teardown(Teardown {}),
            33 => Message::SubmitBatch(SubmitBatch {
                batch_id: self.wild_string(&[]),
                tasks: self.some_tasks(4, |f| BatchTask {
                    task: f.chance(90).then(|| f.task_info()),
                    deadline_secs: f.wild_f64(),
                    work: f.wild_f64(),
                    price: f.wild_f64(),
                }),
            }),
            _ => Message::Ping(Ping { nonce: 0 }),
        }
    }

    /// Mutates an encoding in place: one to four edits.
    pub fn mutate(&mut self, bytes: &mut Vec<u8>) {
        for _ in 0..self.rng.random_range(1..=4) {
            let len = bytes.len();
            match self.rng.random_range(0..7) {
                0 if len > 0 => {
                    let i = self.rng.random_range(0..len);
                    bytes[i] ^= 1 << self.rng.random_range(0..8);
                }
                1 if len > 0 => {
                    let i = self.rng.random_range(0..len);
                    bytes[i] = [0x00, 0xff, 0x7f, 0x80][self.rng.random_range(0..4)];
                }
                2 => {
                    let i = self.rng.random_range(0..=len);
                    let n = self.rng.random_range(1..16);
                    let junk: Vec<u8> = (0..n).map(|_| self.rng.random()).collect();
                    bytes.splice(i..i, junk);
                }
                3 if len > 0 => {
                    let i = self.rng.random_range(0..len);
                    let j = self.rng.random_range(i..=len);
                    bytes.drain(i..j);
                }
                4 if len > 0 => {
                    let cut = self.rng.random_range(0..len);
                    bytes.truncate(cut);
                }
                5 if len > 0 => {
                    let i = self.rng.random_range(0..len);
                    let j = self.rng.random_range(i..=len.min(i + 64));
                    let copy = bytes[i..j].to_vec();
                    bytes.extend_from_slice(&copy);
                }
                _ => {
                    // A varint that never ends, or a length field claiming too much.
                    let i = self.rng.random_range(0..=len);
                    bytes.splice(i..i, [0xffu8; 10]);
                }
            }
        }
    }

    /// One frame's payload: random bytes, a mutated encoding, or a wild valid message.
    pub fn payload(&mut self, role: FuzzRole) -> Vec<u8> {
        match self.rng.random_range(0..10) {
            0 | 1 => {
                let n = if self.chance(5) {
                    self.rng.random_range(0..70_000)
                } else {
                    self.rng.random_range(0..64)
                };
                (0..n).map(|_| self.rng.random()).collect()
            }
            2..=5 => {
                let mut bytes = Envelope::new(self.message(role)).encode_to_vec();
                self.mutate(&mut bytes);
                bytes
            }
            _ => Envelope::new(self.message(role)).encode_to_vec(),
        }
    }

    /// A whole frame: length prefix and payload; rarely a prefix that lies.
    pub fn frame(&mut self, role: FuzzRole) -> Vec<u8> {
        let payload = self.payload(role);
        let len = match self.rng.random_range(0..100) {
            0 => u32::MAX,
            1 => (payload.len() as u32).saturating_add(self.rng.random_range(1..32)),
            2 => (payload.len() as u32).saturating_sub(self.rng.random_range(1..8)),
            _ => payload.len() as u32,
        };
        let mut out = len.to_be_bytes().to_vec();
        out.extend_from_slice(&payload);
        out
    }

    /// A frame carrying `message` unchanged.
    pub fn valid_frame(message: Message) -> Vec<u8> {
        let payload = Envelope::new(message).encode_to_vec();
        let mut out = (payload.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(&payload);
        out
    }

    pub fn rng(&mut self) -> &mut ChaCha8Rng {
        &mut self.rng
    }
}

/// What one fuzz connection did.
#[derive(Debug, Default, Clone, Copy)]
pub struct FuzzStats {
    /// Frames written (fully) to the master before it was seen closing the connection.
    pub frames: u64,
    /// Connections opened.
    pub connections: u64,
    /// Connections the master closed before all their frames were written.
    pub closed_by_master: u64,
    /// Messages received back.
    pub replies: u64,
}

impl FuzzStats {
    pub fn add(&mut self, other: &FuzzStats) {
        self.frames += other.frames;
        self.connections += other.connections;
        self.closed_by_master += other.closed_by_master;
        self.replies += other.replies;
    }
}

/// Opens connections to `addr` one after another and writes fuzz frames until `frames` are
/// written. Each connection says Hello (mostly correctly), opens as an agent or a framework
/// (mostly tamely), then sends up to `per_connection` frames while a reader drains and learns
/// from the replies. Errors of the master are expected; a master that stops answering is not:
/// each connection must be closed or accept writes within `stall`.
pub async fn fuzz_master(
    addr: SocketAddr,
    seed: u64,
    frames: u64,
    per_connection: u64,
    stall: Duration,
) -> anyhow::Result<FuzzStats> {
    let mut fuzzer = FrameFuzzer::new(seed);
    let mut stats = FuzzStats::default();
    while stats.frames < frames {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        stats.connections += 1;
        let (mut read, mut write) = stream.into_split();
        let (ended_tx, mut ended) = tokio::sync::watch::channel(false);
        // The reader drains everything so the master never sees a slow consumer here, and
        // collects the ids it hands out.
        let reader = tokio::spawn(async move {
            let mut buf = Vec::new();
            let mut chunk = vec![0u8; 64 * 1024];
            let mut seen = Vec::new();
            let mut replies = 0u64;
            loop {
                match read.read(&mut chunk).await {
                    Ok(0) | Err(_) => {
                        let _ = ended_tx.send(true);
                        break;
                    }
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
                while buf.len() >= 4 {
                    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
                    if buf.len() < 4 + len {
                        break;
                    }
                    if let Ok(env) = Envelope::decode(&buf[4..4 + len]) {
                        if let Some(m) = env.message {
                            replies += 1;
                            if seen.len() < 256 {
                                seen.push(m);
                            }
                        }
                    }
                    buf.drain(..4 + len);
                }
            }
            (seen, replies)
        });
        let role = if fuzzer.chance(50) {
            FuzzRole::Agent
        } else {
            FuzzRole::Framework
        };
        let mut script = Vec::new();
        if fuzzer.chance(95) {
            script.push(FrameFuzzer::valid_frame(Message::Hello(Hello {
                protocol_version: PROTOCOL_VERSION,
                client: "fuzz".into(),
            })));
        }
        if fuzzer.chance(95) {
            let opening = fuzzer.opening(role);
            script.push(FrameFuzzer::valid_frame(opening));
        }
        let budget = per_connection.min(frames - stats.frames).max(1);
        // Most connections stay in the conversation (valid messages with wild values reach
        // the handlers); the rest throw random and mutated frames (the decoder and the
        // connection's checks).
        let garbage = fuzzer.chance(30);
        for _ in 0..budget {
            script.push(if garbage {
                fuzzer.frame(role)
            } else {
                let message = fuzzer.message_in_role(role, 97);
                FrameFuzzer::valid_frame(message)
            });
        }
        let mut closed = false;
        for frame in script {
            if *ended.borrow() {
                // The master closed the connection: the rest would never be read.
                closed = true;
                break;
            }
            match tokio::time::timeout(stall, write.write_all(&frame)).await {
                Ok(Ok(())) => {
                    stats.frames += 1;
                    if garbage {
                        // A bad frame usually ends the connection: give the master a moment
                        // to say so, so later frames are not written into a closed socket.
                        let _ = tokio::time::timeout(GARBAGE_PACE, ended.wait_for(|e| *e)).await;
                    }
                }
                Ok(Err(_)) => {
                    closed = true;
                    break;
                }
                Err(_) => anyhow::bail!(
                    "a write to the master stalled for {stall:?} (seed {seed}, frame {})",
                    stats.frames
                ),
            }
        }
        let _ = write.shutdown().await;
        // The master must end the conversation: after our half-close it sees end of stream.
        let (seen, replies) = match tokio::time::timeout(stall, reader).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => anyhow::bail!("fuzz reader failed: {e}"),
            Err(_) => anyhow::bail!(
                "the master did not close a fuzz connection within {stall:?} (seed {seed})"
            ),
        };
        stats.replies += replies;
        stats.closed_by_master += u64::from(closed);
        for m in &seen {
            fuzzer.known.observe(m);
        }
    }
    Ok(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_frames() {
        let mut a = FrameFuzzer::new(7);
        let mut b = FrameFuzzer::new(7);
        for _ in 0..200 {
            assert_eq!(a.frame(FuzzRole::Agent), b.frame(FuzzRole::Agent));
        }
    }

    #[test]
    fn frames_are_of_every_shape() {
        let mut f = FrameFuzzer::new(1);
        let (mut valid, mut invalid) = (0, 0);
        for _ in 0..2000 {
            let frame = f.frame(FuzzRole::Framework);
            let len = u32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]) as usize;
            match (len == frame.len() - 4)
                .then(|| Envelope::decode(&frame[4..]).ok())
                .flatten()
                .and_then(|e| e.message)
            {
                Some(_) => valid += 1,
                None => invalid += 1,
            }
        }
        assert!(
            valid > 500 && invalid > 300,
            "valid {valid}, invalid {invalid}"
        );
    }

    #[test]
    fn learns_ids_from_replies() {
        let mut known = KnownIds::default();
        known.observe(&Message::Subscribed(Subscribed {
            framework_id: "fw-1".into(),
            heartbeat_interval_ms: 1,
        }));
        known.observe(&Message::Offers(Offers {
            offers: vec![Offer {
                offer_id: "o-1".into(),
                agent_id: "a-1".into(),
                framework_id: "fw-1".into(),
                ..Default::default()
            }],
        }));
        assert_eq!(known.frameworks, ["fw-1"]);
        assert_eq!(known.offers, ["o-1"]);
        assert_eq!(known.agents, ["a-1"]);
    }
}
