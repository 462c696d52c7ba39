//! GPU devices on the agent: binding by policy, the environment a task sees, per-device
//! accounting (two half-GPU tasks share a device, a third goes to the other), checking the
//! master's binding, and refusing what no device can hold. Real processes, bounded waits.

use ringmaster_proto::convert::{BindingWire, ResourcesWire};
use std::time::Duration;

use ringmaster_agent::state::AgentState;
use ringmaster_agent::AgentConfig;
use ringmaster_proto::devices::{parse_agent_resources, DeviceBinding, DeviceSelection};
use ringmaster_proto::resources::Resources;
use ringmaster_proto::{Message, RunTasks, TaskInfo, TaskState, TaskStatus};
use tokio::time::timeout;

fn config(work_dir: &std::path::Path, spec: &str, selection: DeviceSelection) -> AgentConfig {
    let (resources, devices) = parse_agent_resources(spec).unwrap();
    AgentConfig {
        master: "127.0.0.1:1".into(),
        id: None,
        hostname: "gpu-host".into(),
        resources,
        devices,
        device_selection: selection,
        attributes: Vec::new(),
        work_dir: work_dir.to_path_buf(),
        kill_grace: Duration::from_millis(500),
        reconnect_max_backoff: Duration::from_millis(200),
        security: Default::default(),
        task_user: ringmaster_agent::users::default_task_user(),
        allow_root_tasks: false,
        gpu_sharing: Default::default(),
        usage_interval: ringmaster_agent::usage::DEFAULT_USAGE_INTERVAL,
        safeguards: Default::default(),
    }
}

fn task(id: &str, resources: &str) -> TaskInfo {
    TaskInfo {
        task_id: id.into(),
        name: id.into(),
        command: "echo \"[$CUDA_VISIBLE_DEVICES] [$RINGMASTER_DEVICES]\"".into(),
        resources: Some(Resources::parse(resources).unwrap().to_wire()),
        framework_id: "fw".into(),
        ..Default::default()
    }
}

fn statuses(out: &[Message]) -> Vec<TaskStatus> {
    out.iter()
        .filter_map(|m| match m {
            Message::StatusUpdate(u) => u.status.clone(),
            _ => None,
        })
        .collect()
}

fn run_one(state: &mut AgentState, info: TaskInfo) -> TaskStatus {
    let out = state.run_tasks(RunTasks {
        tasks: vec![info],
        leader_term: 0,
    });
    let mut s = statuses(&out);
    assert_eq!(s.len(), 1, "{out:?}");
    s.remove(0)
}

fn bound(status: &TaskStatus) -> String {
    DeviceBinding::from_wire(&status.devices)
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn half_gpu_tasks_share_a_device_and_see_it() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        "cpus:8;mem:1024;gpus:2x16384",
        DeviceSelection::MostUsedThatFits,
    );
    let (mut state, mut exits) = AgentState::new(cfg, "a1".into());
    let mut bindings = Vec::new();
    for id in ["t1", "t2", "t3"] {
        let s = run_one(&mut state, task(id, "cpus:1;gpu_milli:500"));
        assert_eq!(s.state, TaskState::TaskRunning as i32, "{s:?}");
        bindings.push(bound(&s));
    }
    assert_eq!(bindings, ["gpu:0:500:0", "gpu:0:500:0", "gpu:1:500:0"]);
    assert_eq!(state.device_state().free_share(), [0, 500]);
    assert_eq!(state.free().milli("gpu_milli"), 500_000);
    // A whole GPU no longer fits anywhere.
    let s = run_one(&mut state, task("whole", "cpus:1;gpu_milli:1000"));
    assert_eq!(s.state, TaskState::TaskFailed as i32);
    assert_eq!(s.reason, "insufficient_resources", "{s:?}");
    // A task without GPUs sees none.
    let s = run_one(&mut state, task("plain", "cpus:1"));
    assert_eq!(s.state, TaskState::TaskRunning as i32);
    assert!(s.devices.is_empty());
    let mut ended = 0;
    while ended < 4 {
        let (key, outcome) = timeout(Duration::from_secs(15), exits.recv())
            .await
            .expect("tasks end in time")
            .expect("exit channel open");
        state.process_exited(key, outcome);
        ended += 1;
    }
    let seen = |id: &str| {
        std::fs::read_to_string(
            ringmaster_agent::sandbox::latest_run_dir(dir.path(), "fw", id).join("stdout"),
        )
        .unwrap()
    };
    assert_eq!(seen("t1"), "[0] [gpu:0:500:0]\n");
    assert_eq!(seen("t3"), "[1] [gpu:1:500:0]\n");
    assert_eq!(seen("plain"), "[] []\n");
    // Everything ended: every device is whole again.
    assert_eq!(state.device_state().free_share(), [1000, 1000]);
}

#[tokio::test]
async fn spread_policy_and_the_masters_binding() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        "cpus:8;gpus:2x16384@V100M16+1x32768@V100M32",
        DeviceSelection::LeastUsed,
    );
    let (mut state, _exits) = AgentState::new(cfg, "a1".into());
    // Spread: the most free share, then the most free memory, then the lowest index.
    let s = run_one(&mut state, task("a", "gpu_milli:300"));
    assert_eq!(bound(&s), "gpu:2:300:0");
    let s = run_one(&mut state, task("b", "gpu_milli:300"));
    assert_eq!(bound(&s), "gpu:0:300:0");
    // Model constraint and memory.
    let mut big = task("c", "gpu_milli:100;gpu_mem:20000");
    big.gpu_models = vec!["V100M32".into()];
    assert_eq!(bound(&run_one(&mut state, big)), "gpu:2:100:20000");
    // The master's binding is honoured when it fits ...
    let mut bound_by_master = task("d", "gpu_milli:700");
    bound_by_master.devices = DeviceBinding::parse("gpu:1:700:0").unwrap().to_wire();
    assert_eq!(bound(&run_one(&mut state, bound_by_master)), "gpu:1:700:0");
    // ... and refused when this agent's accounting says the device is full.
    let mut stale = task("e", "gpu_milli:500");
    stale.devices = DeviceBinding::parse("gpu:1:500:0").unwrap().to_wire();
    let s = run_one(&mut state, stale);
    assert_eq!(s.reason, "insufficient_resources");
    assert!(s.message.contains("gpu 1"), "{}", s.message);
    // An ambiguous request is refused as such.
    let s = run_one(&mut state, task("f", "gpu_milli:1500"));
    assert_eq!(s.reason, "launch_failed");
    assert!(
        s.message.contains("invalid device request"),
        "{}",
        s.message
    );
    // Heartbeats carry each device's free amounts.
    let Message::AgentHeartbeat(hb) = state.heartbeat() else {
        panic!("a heartbeat")
    };
    let free: Vec<(u32, u32, u64)> = hb
        .free_devices
        .iter()
        .map(|d| (d.index, d.milli, d.memory_mib))
        .collect();
    assert_eq!(free, [(0, 700, 16384), (1, 300, 16384), (2, 600, 12768)]);
    assert_eq!(state.register_message().devices.len(), 3);
}

#[tokio::test]
async fn a_task_cannot_widen_its_devices_through_its_env() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(
        dir.path(),
        "cpus:8;mem:1024;gpus:2x16384",
        DeviceSelection::LeastUsed,
    );
    let (mut state, mut exits) = AgentState::new(cfg, "a1".into());
    let mut info = task("greedy", "cpus:1;gpu_milli:500");
    info.env = ["CUDA_VISIBLE_DEVICES", "RINGMASTER_DEVICES"]
        .into_iter()
        .map(|key| ringmaster_proto::Attribute {
            key: key.into(),
            value: "0,1".into(),
        })
        .collect();
    let s = run_one(&mut state, info);
    assert_eq!(s.state, TaskState::TaskRunning as i32, "{s:?}");
    let (key, outcome) = timeout(Duration::from_secs(15), exits.recv())
        .await
        .expect("the task ends in time")
        .expect("exit channel open");
    state.process_exited(key, outcome);
    let seen = std::fs::read_to_string(
        ringmaster_agent::sandbox::latest_run_dir(dir.path(), "fw", "greedy").join("stdout"),
    )
    .unwrap();
    assert_eq!(
        seen,
        format!(
            "[{}] [{}]\n",
            bound(&s).split(':').nth(1).unwrap(),
            bound(&s)
        )
    );
}

fn mps_config(work_dir: &std::path::Path, pipe_dir: &std::path::Path) -> AgentConfig {
    let mut cfg = config(
        work_dir,
        "cpus:8;mem:1024;gpus:2x16384",
        DeviceSelection::MostUsedThatFits,
    );
    cfg.gpu_sharing = ringmaster_agent::mps::GpuSharing {
        mode: ringmaster_agent::mps::GpuSharingMode::Mps,
        pipe_dir: pipe_dir.to_path_buf(),
        start: false,
    };
    cfg
}

fn mps_task(id: &str, resources: &str) -> TaskInfo {
    let mut t = task(id, resources);
    t.command = "echo \"[$CUDA_VISIBLE_DEVICES] [${CUDA_MPS_ACTIVE_THREAD_PERCENTAGE-}] \
                 [${CUDA_MPS_PINNED_DEVICE_MEM_LIMIT-}] [${CUDA_MPS_PIPE_DIRECTORY-}]\""
        .into();
    // The task tries to lift its limits; the agent's values win.
    t.env = vec![ringmaster_proto::Attribute {
        key: "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(),
        value: "100".into(),
    }];
    t
}

#[tokio::test]
async fn with_mps_a_slice_fails_while_the_daemon_is_down_and_whole_gpus_run() {
    let dir = tempfile::tempdir().unwrap();
    let pipes = tempfile::tempdir().unwrap();
    let (mut state, mut exits) = AgentState::new(mps_config(dir.path(), pipes.path()), "a1".into());
    let s = run_one(
        &mut state,
        mps_task("slice", "cpus:1;gpu_milli:250;gpu_mem:4096"),
    );
    assert_eq!(s.state, TaskState::TaskFailed as i32, "{s:?}");
    assert_eq!(s.reason, "launch_failed");
    assert_eq!(
        s.message,
        format!(
            "gpu_sharing: mps but the MPS control daemon is not running (no {}/control); start \
             nvidia-cuda-mps-control -d or set mps_start",
            pipes.path().display()
        )
    );
    // The refused slice holds nothing.
    assert_eq!(state.device_state().free_share(), [1000, 1000]);
    // A whole GPU needs no MPS and gets no MPS variables.
    let s = run_one(&mut state, mps_task("whole", "cpus:1;gpus:1"));
    assert_eq!(s.state, TaskState::TaskRunning as i32, "{s:?}");
    let (key, outcome) = timeout(Duration::from_secs(15), exits.recv())
        .await
        .expect("the task ends in time")
        .expect("exit channel open");
    state.process_exited(key, outcome);
    let out = std::fs::read_to_string(
        ringmaster_agent::sandbox::latest_run_dir(dir.path(), "fw", "whole").join("stdout"),
    )
    .unwrap();
    // Its own (task env) percentage stays: MPS does not apply to it.
    assert_eq!(out, "[0] [100] [] []\n");
}

#[tokio::test]
async fn with_mps_a_slice_runs_as_a_limited_mps_client() {
    let dir = tempfile::tempdir().unwrap();
    let pipes = tempfile::tempdir().unwrap();
    let control = std::ffi::CString::new(
        pipes
            .path()
            .join("control")
            .into_os_string()
            .into_encoded_bytes(),
    )
    .unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(control.as_ptr(), 0o600) }, 0);
    let (mut state, mut exits) = AgentState::new(mps_config(dir.path(), pipes.path()), "a1".into());
    let mut bound_by_master = mps_task("slice", "cpus:1;gpu_milli:250;gpu_mem:4096");
    bound_by_master.devices = DeviceBinding::parse("gpu:1:250:4096").unwrap().to_wire();
    let s = run_one(&mut state, bound_by_master);
    assert_eq!(s.state, TaskState::TaskRunning as i32, "{s:?}");
    let (key, outcome) = timeout(Duration::from_secs(15), exits.recv())
        .await
        .expect("the task ends in time")
        .expect("exit channel open");
    state.process_exited(key, outcome);
    let out = std::fs::read_to_string(
        ringmaster_agent::sandbox::latest_run_dir(dir.path(), "fw", "slice").join("stdout"),
    )
    .unwrap();
    // Device 1 on the host is device 0 for the task: the memory limit names ordinal 0.
    assert_eq!(
        out,
        format!("[1] [25] [0=4096M] [{}]\n", pipes.path().display())
    );
}
