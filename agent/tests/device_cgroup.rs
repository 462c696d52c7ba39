//! The NVIDIA devices rule of task cgroups (cgroup v1 `devices` controller, docs/security.md):
//! a task's `devices.list` allows only its own `/dev/nvidiaN` and the control nodes, a task
//! without GPUs no NVIDIA node at all, and the kernel enforces it (opening a denied node fails
//! with EPERM inside the task's cgroup). Needs root and the v1 devices controller: skipped,
//! saying why, otherwise.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::Duration;

use ringmaster_agent::isolation::{GpuAccess, Isolation, IsolationConfig, IsolationMode};
use ringmaster_agent::state::AgentState;
use ringmaster_agent::AgentConfig;
use ringmaster_proto::convert::{BindingWire, ResourcesWire};
use ringmaster_proto::devices::{parse_agent_resources, DeviceBinding};
use ringmaster_proto::resources::Resources;
use ringmaster_proto::{Message, RunTasks, TaskInfo, TaskState, TaskStatus};
use tokio::time::timeout;

/// Cgroup isolation with the devices rule on, or `None` (test skipped, reason printed).
fn isolation(work_dir: &Path) -> Option<Isolation> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: needs root");
        return None;
    }
    let config = IsolationConfig {
        mode: IsolationMode::Cgroups,
        pids_per_task: 256,
        ..IsolationConfig::default()
    };
    let isolation = match Isolation::setup(&config, work_dir) {
        Ok(isolation) => isolation,
        Err(e) => {
            println!("skipped: needs root and writable cgroups ({e:#})");
            return None;
        }
    };
    if !isolation.device_rules() {
        println!(
            "skipped: the devices controller is not available (cgroup v2, or v1 without a \
             usable devices hierarchy): {}",
            isolation.describe()
        );
        return None;
    }
    Some(isolation)
}

fn work_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    dir
}

fn nvidia_lines(list: &str) -> Vec<&str> {
    list.lines().filter(|l| l.starts_with("c 195:")).collect()
}

#[test]
fn task_cgroups_list_only_their_own_gpu_nodes() {
    let dir = work_dir();
    let Some(isolation) = isolation(dir.path()) else {
        return;
    };
    let r = Resources::parse("cpus:1;mem:64").unwrap();
    let gpu = isolation
        .create_task_cgroup_with_gpus("fw", "gpu", &r, GpuAccess::Devices(&[1, 3]))
        .unwrap()
        .unwrap();
    let plain = isolation
        .create_task_cgroup("fw", "plain", &r)
        .unwrap()
        .unwrap();
    let open = isolation
        .create_task_cgroup_with_gpus("fw", "scalar", &r, GpuAccess::Unrestricted)
        .unwrap()
        .unwrap();
    let gpu_list = gpu.devices_list().expect("a devices.list");
    let plain_list = plain.devices_list().expect("a devices.list");
    let open_list = open.devices_list().expect("a devices.list");
    for cgroup in [&gpu, &plain, &open] {
        cgroup.remove().unwrap();
    }
    assert_eq!(
        nvidia_lines(&gpu_list),
        ["c 195:1 rwm", "c 195:3 rwm", "c 195:255 rwm"],
        "{gpu_list}"
    );
    assert!(!gpu_list.contains("a *:*"), "deny by default: {gpu_list}");
    assert!(nvidia_lines(&plain_list).is_empty(), "{plain_list}");
    assert!(!plain_list.contains("a *:*"), "{plain_list}");
    // Everything but the NVIDIA nodes stays as the parent allows (here: all).
    let parent_allows_all = std::fs::read_to_string("/sys/fs/cgroup/devices/devices.list")
        .is_ok_and(|l| l.trim() == "a *:* rwm");
    if parent_allows_all {
        for list in [&gpu_list, &plain_list] {
            assert!(list.lines().any(|l| l == "c 1:* rwm"), "{list}");
            assert!(list.lines().any(|l| l == "b *:* rwm"), "{list}");
        }
    }
    // A plain `gpus` scalar task keeps the parent's devices.
    assert!(
        !parent_allows_all || open_list.trim() == "a *:* rwm",
        "{open_list}"
    );
}

fn config(work_dir: &Path) -> AgentConfig {
    let (resources, devices) = parse_agent_resources("cpus:4;mem:1024;gpus:2x16384").unwrap();
    AgentConfig {
        master: "127.0.0.1:1".into(),
        id: None,
        hostname: "gpu-host".into(),
        resources,
        devices,
        device_selection: Default::default(),
        attributes: Vec::new(),
        work_dir: work_dir.to_path_buf(),
        kill_grace: Duration::from_secs(1),
        reconnect_max_backoff: Duration::from_millis(200),
        security: Default::default(),
        task_user: ringmaster_agent::users::default_task_user(),
        allow_root_tasks: false,
        gpu_sharing: Default::default(),
        usage_interval: ringmaster_agent::usage::DEFAULT_USAGE_INTERVAL,
        safeguards: Default::default(),
    }
}

fn mknod(path: &Path, major: u32, minor: u32) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; makedev and mknod have no other preconditions.
    let rc = unsafe {
        libc::mknod(
            c.as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(major, minor),
        )
    };
    assert_eq!(
        rc,
        0,
        "mknod {}: {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666)).unwrap();
}

/// Opens each node and prints `NAME ok` or `NAME <error>`.
fn probe_command(nodes: &Path) -> String {
    format!(
        "for n in nvidia0 nvidia1 nvidiactl; do if head -c 0 {dir}/$n 2>err; then echo \"$n ok\"; \
         else echo \"$n $(cat err)\"; fi; done; head -c 0 /dev/null && echo null ok",
        dir = nodes.display()
    )
}

async fn run(
    state: &mut AgentState,
    exits: &mut ringmaster_agent::state::ExitReceiver,
    info: TaskInfo,
) -> String {
    let id = info.task_id.clone();
    let out = state.run_tasks(RunTasks {
        tasks: vec![info],
        leader_term: 0,
    });
    let started: Vec<TaskStatus> = out
        .iter()
        .filter_map(|m| match m {
            Message::StatusUpdate(u) => u.status.clone(),
            _ => None,
        })
        .collect();
    assert_eq!(
        started[0].state,
        TaskState::TaskRunning as i32,
        "{started:?}"
    );
    let (key, outcome) = timeout(Duration::from_secs(30), exits.recv())
        .await
        .expect("the task ends in time")
        .expect("exit channel open");
    state.process_exited(key, outcome);
    std::fs::read_to_string(
        ringmaster_agent::sandbox::latest_run_dir(state.config().work_dir.as_path(), "fw", &id)
            .join("stdout"),
    )
    .unwrap()
}

fn line<'a>(out: &'a str, node: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(&format!("{node} ")))
        .unwrap_or_else(|| panic!("no {node} line in {out:?}"))
}

#[tokio::test]
async fn the_kernel_denies_other_gpus_nodes_inside_the_task_cgroup() {
    let dir = work_dir();
    let Some(isolation) = isolation(dir.path()) else {
        return;
    };
    // Device nodes of a GPU machine, made by hand (no driver here: an allowed node opens with
    // ENXIO, a denied one fails with EPERM before the driver is asked).
    let nodes = dir.path().join("dev");
    std::fs::create_dir(&nodes).unwrap();
    std::fs::set_permissions(&nodes, std::fs::Permissions::from_mode(0o755)).unwrap();
    mknod(&nodes.join("nvidia0"), 195, 0);
    mknod(&nodes.join("nvidia1"), 195, 1);
    mknod(&nodes.join("nvidiactl"), 195, 255);
    let (mut state, mut exits) =
        AgentState::with_isolation(config(dir.path()), isolation, "a1".into());
    let denied = "Operation not permitted";
    let mut gpu_task = TaskInfo {
        task_id: "gpu1".into(),
        name: "gpu1".into(),
        command: probe_command(&nodes),
        resources: Some(Resources::parse("cpus:1;mem:64;gpus:1").unwrap().to_wire()),
        framework_id: "fw".into(),
        ..Default::default()
    };
    gpu_task.devices = DeviceBinding::parse("gpu:1:1000:16384").unwrap().to_wire();
    let out = run(&mut state, &mut exits, gpu_task).await;
    assert!(line(&out, "nvidia0").contains(denied), "{out}");
    assert!(!line(&out, "nvidia1").contains(denied), "{out}");
    assert!(!line(&out, "nvidiactl").contains(denied), "{out}");
    assert!(out.contains("null ok"), "{out}");
    let plain = TaskInfo {
        task_id: "plain".into(),
        name: "plain".into(),
        command: probe_command(&nodes),
        resources: Some(Resources::parse("cpus:1;mem:64").unwrap().to_wire()),
        framework_id: "fw".into(),
        ..Default::default()
    };
    let out = run(&mut state, &mut exits, plain).await;
    for node in ["nvidia0", "nvidia1", "nvidiactl"] {
        assert!(line(&out, node).contains(denied), "{out}");
    }
    assert!(out.contains("null ok"), "{out}");
}
