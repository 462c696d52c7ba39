//! The Ringmaster wire protocol.
//!
//! Every component (master, agents, frameworks) speaks the same protocol: on a byte stream
//! each frame is a 4-byte big-endian length followed by one protobuf [`Envelope`]. This crate
//! owns the messages (generated from `proto/ringmaster.proto`), the framing
//! ([`Connection`]) and the version handshake, so no other crate touches bytes on the wire.
//! [`transport`] carries the frames over plain TCP or TLS, [`security`] is the HMAC challenge
//! (and the owner-only check of secret files), [`files`] the private modes of work dirs,
//! [`yaml`] places configuration errors at `FILE:LINE: KEY`, [`masters`] parses lists of masters
//! and picks the next one to try (following `NOT_LEADER`),
//! and [`convert`] turns the core's `Resources` and device types into their wire form and back.
//!
//! Wire only: the resource and device *model* is `ringmaster-core`'s, re-exported here as
//! [`resources`] and [`devices`] so every component names it one way.

mod connection;
pub mod convert;
pub mod files;
pub mod masters;
pub mod security;
pub mod transport;
pub mod yaml;
pub mod yaml_depth;
pub mod yaml_error;

pub use connection::{
    Connection, ConnectionError, ConnectionReader, ConnectionWriter, DEFAULT_MAX_FRAME_BYTES,
};
pub use ringmaster_core::resources::ResourceError;

/// The core's resource bundles, re-exported so every component names them one way.
pub mod resources {
    pub use ringmaster_core::resources::*;
}

/// The core's device model, with the wire conversion of device lists.
pub mod devices {
    pub use crate::convert::devices_from_wire;
    pub use ringmaster_core::devices::*;
}

/// Generated protobuf messages, package `ringmaster.v1`.
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/ringmaster.v1.rs"));
}

pub use v1::envelope::Message;
pub use v1::*;

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = 1;
/// Every protocol version this build accepts in a `Hello`.
pub const SUPPORTED_VERSIONS: &[u32] = &[1];

impl Envelope {
    /// Wraps one message.
    pub fn new(message: Message) -> Self {
        Envelope {
            message: Some(message),
        }
    }
}

impl From<Message> for Envelope {
    fn from(message: Message) -> Self {
        Envelope::new(message)
    }
}

impl Message {
    /// The message's name as written in the .proto file, for logs and errors.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Hello(_) => "Hello",
            Message::HelloAck(_) => "HelloAck",
            Message::Error(_) => "Error",
            Message::Ping(_) => "Ping",
            Message::Pong(_) => "Pong",
            Message::RegisterAgent(_) => "RegisterAgent",
            Message::AgentRegistered(_) => "AgentRegistered",
            Message::AgentHeartbeat(_) => "AgentHeartbeat",
            Message::RunTasks(_) => "RunTasks",
            Message::KillTask(_) => "KillTask",
            Message::StatusUpdate(_) => "StatusUpdate",
            Message::StatusAck(_) => "StatusAck",
            Message::Subscribe(_) => "Subscribe",
            Message::Subscribed(_) => "Subscribed",
            Message::Demand(_) => "Demand",
            Message::Revive(_) => "Revive",
            Message::Suppress(_) => "Suppress",
            Message::Offers(_) => "Offers",
            Message::Rescind(_) => "Rescind",
            Message::Accept(_) => "Accept",
            Message::Decline(_) => "Decline",
            Message::Update(_) => "Update",
            Message::Kill(_) => "Kill",
            Message::Reconcile(_) => "Reconcile",
            Message::Teardown(_) => "Teardown",
            Message::SubmitBatch(_) => "SubmitBatch",
            Message::BatchResult(_) => "BatchResult",
            Message::Authenticate(_) => "Authenticate",
            Message::Authenticated(_) => "Authenticated",
            Message::ReadFile(_) => "ReadFile",
            Message::FileData(_) => "FileData",
            Message::UsageReport(_) => "UsageReport",
            Message::RaftRequest(_) => "RaftRequest",
            Message::RaftResponse(_) => "RaftResponse",
        }
    }
}

impl Error {
    /// An error message with a code.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Error {
            code: code as i32,
            message: message.into(),
            supported_versions: Vec::new(),
            leader: String::new(),
        }
    }
}

/// The reason of a `TASK_LOST` that may still be undone: the agent missed its heartbeats, and
/// if it comes back with the task the master reports `TASK_RUNNING` again (docs/protocol.md).
pub const REASON_AGENT_LOST: &str = "agent_lost";

impl TaskStatus {
    /// Whether this status is the task's last word: a terminal state other than a `TASK_LOST`
    /// with reason [`REASON_AGENT_LOST`], which the documented recovery (the agent re-registers
    /// with the task) turns back into `TASK_RUNNING`.
    pub fn is_final(&self) -> bool {
        let state = self.state();
        state.is_terminal() && !(state == TaskState::TaskLost && self.reason == REASON_AGENT_LOST)
    }
}

impl TaskState {
    /// Terminal states never change again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::TaskFinished
                | TaskState::TaskFailed
                | TaskState::TaskKilled
                | TaskState::TaskLost
        )
    }

    /// The short upper-case name used in logs and CLIs: `RUNNING`, `FINISHED`, ...
    pub fn short_name(self) -> &'static str {
        match self {
            TaskState::Unspecified => "UNSPECIFIED",
            TaskState::TaskStaging => "STAGING",
            TaskState::TaskRunning => "RUNNING",
            TaskState::TaskFinished => "FINISHED",
            TaskState::TaskFailed => "FAILED",
            TaskState::TaskKilled => "KILLED",
            TaskState::TaskLost => "LOST",
        }
    }
}

/// Answers a client's `Hello`: `Ok(HelloAck)` when its version is spoken, else the
/// `Error` to send before closing the connection.
pub fn answer_hello(hello: &Hello, master: &str) -> Result<HelloAck, Error> {
    if SUPPORTED_VERSIONS.contains(&hello.protocol_version) {
        Ok(HelloAck {
            protocol_version: hello.protocol_version,
            master: master.to_string(),
            challenge: Vec::new(),
            auth_required: false,
        })
    } else {
        let mut error = Error::new(
            ErrorCode::VersionMismatch,
            format!(
                "protocol version {} is not spoken here; this master speaks {:?}",
                hello.protocol_version, SUPPORTED_VERSIONS
            ),
        );
        error.supported_versions = SUPPORTED_VERSIONS.to_vec();
        Err(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_with_unknown_version_names_the_spoken_ones() {
        let err = answer_hello(
            &Hello {
                protocol_version: 99,
                client: "x".into(),
            },
            "m",
        )
        .unwrap_err();
        assert_eq!(err.code, ErrorCode::VersionMismatch as i32);
        assert!(err.message.contains("99"), "{}", err.message);
        assert_eq!(err.supported_versions, vec![1]);
    }

    #[test]
    fn hello_with_current_version_is_acknowledged() {
        let ack = answer_hello(
            &Hello {
                protocol_version: PROTOCOL_VERSION,
                client: "x".into(),
            },
            "m",
        )
        .unwrap();
        assert_eq!(ack.protocol_version, PROTOCOL_VERSION);
    }
}
