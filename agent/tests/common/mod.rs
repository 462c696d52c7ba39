//! Helpers shared by the agent's state-level tests.
#![allow(dead_code)]

use std::path::Path;
use std::time::Duration;

use ringmaster_agent::users::default_task_user;
use ringmaster_agent::AgentConfig;
use ringmaster_proto::resources::Resources;
use ringmaster_proto::{Message, TaskStatus};

/// An agent of 8 cpus and 1024 MiB on `work_dir`, no master reachable, tasks as the default
/// task user, a 500 ms kill grace.
pub fn config(work_dir: &Path, hostname: &str) -> AgentConfig {
    AgentConfig {
        master: "127.0.0.1:1".into(),
        id: None,
        hostname: hostname.into(),
        resources: Resources::parse("cpus:8;mem:1024").unwrap(),
        devices: Vec::new(),
        device_selection: Default::default(),
        attributes: Vec::new(),
        work_dir: work_dir.to_path_buf(),
        kill_grace: Duration::from_millis(500),
        reconnect_max_backoff: Duration::from_millis(200),
        security: Default::default(),
        task_user: default_task_user(),
        allow_root_tasks: false,
        gpu_sharing: Default::default(),
        usage_interval: ringmaster_agent::usage::DEFAULT_USAGE_INTERVAL,
        safeguards: Default::default(),
    }
}

/// The task statuses among `out`, in order.
pub fn statuses(out: &[Message]) -> Vec<TaskStatus> {
    out.iter()
        .filter_map(|m| match m {
            Message::StatusUpdate(u) => u.status.clone(),
            _ => None,
        })
        .collect()
}
