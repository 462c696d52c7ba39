//! GPU sharing with NVIDIA MPS (`--gpu-sharing mps`): a task holding a slice of a GPU runs as
//! an MPS client whose compute share and device memory are capped by the MPS server.
//!
//! Two pure parts and one that touches the machine: [`mps_env`] computes the variables a slice
//! task gets (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`,
//! `CUDA_MPS_PIPE_DIRECTORY`); [`needs_mps`] says which bindings are slices; [`ensure_daemon`]
//! checks that the MPS control daemon is up (its control FIFO exists in the pipe directory) and,
//! with `mps_start`, tries once to start it. Whole-GPU tasks and tasks without GPUs never need
//! MPS. See docs/devices.md ("Sharing a GPU with MPS") and docs/security.md.

use std::fmt;
use std::os::unix::fs::FileTypeExt as _;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use ringmaster_proto::devices::DeviceBinding;

/// `CUDA_MPS_PIPE_DIRECTORY`'s default, the default of `--mps-pipe-dir`.
pub const DEFAULT_PIPE_DIR: &str = "/tmp/nvidia-mps";
/// The control daemon's FIFO inside the pipe directory.
pub const CONTROL_PIPE: &str = "control";
/// The program started by `--mps-start`.
pub const CONTROL_PROGRAM: &str = "nvidia-cuda-mps-control";
/// How long after `nvidia-cuda-mps-control -d` returned its control FIFO may take to appear.
const START_SETTLE: Duration = Duration::from_secs(2);
const START_POLL: Duration = Duration::from_millis(20);

/// A device's whole share in milli-GPU.
const WHOLE_SHARE: u32 = 1000;

/// `--gpu-sharing`: how tasks that hold part of a GPU share it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GpuSharingMode {
    /// By convention only (`CUDA_VISIBLE_DEVICES`); nothing bounds a slice.
    #[default]
    None,
    /// Slices run as MPS clients with a compute share and a device memory limit.
    Mps,
}

impl FromStr for GpuSharingMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "none" => Ok(GpuSharingMode::None),
            "mps" => Ok(GpuSharingMode::Mps),
            other => Err(format!(
                "`{other}` is not a GPU sharing mode (expected none or mps)"
            )),
        }
    }
}

impl fmt::Display for GpuSharingMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GpuSharingMode::None => "none",
            GpuSharingMode::Mps => "mps",
        })
    }
}

/// The agent's GPU sharing settings (`gpu_sharing`, `mps_pipe_dir`, `mps_start`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSharing {
    pub mode: GpuSharingMode,
    /// `CUDA_MPS_PIPE_DIRECTORY` of the MPS control daemon (absolute).
    pub pipe_dir: PathBuf,
    /// Start `nvidia-cuda-mps-control -d` when a slice task finds the daemon down.
    pub start: bool,
}

impl Default for GpuSharing {
    fn default() -> Self {
        GpuSharing {
            mode: GpuSharingMode::None,
            pipe_dir: PathBuf::from(DEFAULT_PIPE_DIR),
            start: false,
        }
    }
}

impl GpuSharing {
    /// True when `binding` must run as an MPS client under these settings.
    pub fn applies_to(&self, binding: &DeviceBinding) -> bool {
        self.mode == GpuSharingMode::Mps && needs_mps(binding)
    }
}

/// A binding is a slice, and so needs MPS, when some device is held with less than its whole
/// share (`gpu_milli` < 1000). Whole devices (and no devices) do not.
pub fn needs_mps(binding: &DeviceBinding) -> bool {
    binding.devices.iter().any(|d| d.share < WHOLE_SHARE)
}

/// The MPS variables of a slice task, set after the task's own environment:
/// `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` = ⌈share / 10⌉ (at least 1; left out when the task holds
/// no share, e.g. `gpu_mem` only: its compute is not capped),
/// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` = `0=<MiB>M` per device as the task numbers them after
/// `CUDA_VISIBLE_DEVICES` (0, 1, … in binding order; left out for devices held without memory)
/// and `CUDA_MPS_PIPE_DIRECTORY`. Empty when the binding is not a slice.
pub fn mps_env(binding: &DeviceBinding, pipe_dir: &Path) -> Vec<(String, String)> {
    if !needs_mps(binding) {
        return Vec::new();
    }
    let mut env = Vec::new();
    // One percentage applies to the whole client; a slice is one device, so take the largest.
    let share = binding.devices.iter().map(|d| d.share).max().unwrap_or(0);
    if share > 0 {
        let percent = share.div_ceil(10).clamp(1, 100);
        env.push((
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".to_string(),
            percent.to_string(),
        ));
    }
    let limits: Vec<String> = binding
        .devices
        .iter()
        .enumerate()
        .filter(|(_, d)| d.memory_mib > 0)
        .map(|(ordinal, d)| format!("{ordinal}={}M", d.memory_mib))
        .collect();
    if !limits.is_empty() {
        env.push((
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_string(),
            limits.join(","),
        ));
    }
    env.push((
        "CUDA_MPS_PIPE_DIRECTORY".to_string(),
        pipe_dir.to_string_lossy().into_owned(),
    ));
    env
}

/// True when the MPS control daemon is up: `<pipe_dir>/control` exists and is a FIFO.
pub fn daemon_running(pipe_dir: &Path) -> bool {
    std::fs::metadata(pipe_dir.join(CONTROL_PIPE)).is_ok_and(|m| m.file_type().is_fifo())
}

/// The message of a slice task refused because the daemon is down.
pub fn daemon_down_message(pipe_dir: &Path) -> String {
    format!(
        "gpu_sharing: mps but the MPS control daemon is not running (no {}); start \
         {CONTROL_PROGRAM} -d or set mps_start",
        pipe_dir.join(CONTROL_PIPE).display()
    )
}

/// Checks that the MPS control daemon is up for a slice task. When it is not: without
/// `sharing.start` the task is refused with [`daemon_down_message`]; with it, `start` is called
/// once (it runs `nvidia-cuda-mps-control -d` in the agent, see [`start_daemon`]) and the
/// control FIFO is looked for again (for up to 2 s, while the daemon creates it).
pub fn ensure_daemon(
    sharing: &GpuSharing,
    start: impl FnOnce(&Path) -> Result<(), String>,
) -> Result<(), String> {
    let dir = &sharing.pipe_dir;
    if daemon_running(dir) {
        return Ok(());
    }
    if !sharing.start {
        return Err(daemon_down_message(dir));
    }
    tracing::info!(pipe_dir = %dir.display(), "MPS control daemon not running; starting it");
    if let Err(e) = start(dir) {
        return Err(format!(
            "gpu_sharing: mps and the MPS control daemon is not running (no {}); mps_start \
             tried `{CONTROL_PROGRAM} -d` and it failed: {e}",
            dir.join(CONTROL_PIPE).display()
        ));
    }
    let deadline = Instant::now() + START_SETTLE;
    while !daemon_running(dir) {
        if Instant::now() >= deadline {
            return Err(format!(
                "gpu_sharing: mps and the MPS control daemon is not running: mps_start ran \
                 `{CONTROL_PROGRAM} -d` but {} did not appear",
                dir.join(CONTROL_PIPE).display()
            ));
        }
        std::thread::sleep(START_POLL);
    }
    Ok(())
}

/// Runs `nvidia-cuda-mps-control -d` with `CUDA_MPS_PIPE_DIRECTORY=pipe_dir` (it forks the
/// daemon and returns).
pub fn start_daemon(pipe_dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(pipe_dir)
        .map_err(|e| format!("cannot create {}: {e}", pipe_dir.display()))?;
    let status = std::process::Command::new(CONTROL_PROGRAM)
        .arg("-d")
        .env("CUDA_MPS_PIPE_DIRECTORY", pipe_dir)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("cannot run {CONTROL_PROGRAM}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{CONTROL_PROGRAM} -d {status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn binding(text: &str) -> DeviceBinding {
        DeviceBinding::parse(text).unwrap()
    }

    fn get<'a>(env: &'a [(String, String)], name: &str) -> Option<&'a str> {
        env.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    fn mkfifo(path: &Path) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    }

    fn mps(dir: &Path, start: bool) -> GpuSharing {
        GpuSharing {
            mode: GpuSharingMode::Mps,
            pipe_dir: dir.to_path_buf(),
            start,
        }
    }

    #[test]
    fn a_slice_gets_its_share_memory_and_pipe_dir() {
        let env = mps_env(&binding("gpu:3:250:8192"), Path::new("/tmp/nvidia-mps"));
        assert_eq!(get(&env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), Some("25"));
        // Ordinal 0: the task sees its one device as device 0 after CUDA_VISIBLE_DEVICES=3.
        assert_eq!(
            get(&env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
            Some("0=8192M")
        );
        assert_eq!(
            get(&env, "CUDA_MPS_PIPE_DIRECTORY"),
            Some("/tmp/nvidia-mps")
        );
        assert_eq!(env.len(), 3);
    }

    #[test]
    fn the_percentage_is_rounded_up_and_never_zero() {
        for (share, percent) in [
            (1, "1"),
            (9, "1"),
            (10, "1"),
            (11, "2"),
            (500, "50"),
            (999, "100"),
        ] {
            let env = mps_env(&binding(&format!("gpu:0:{share}:0")), Path::new("/p"));
            assert_eq!(
                get(&env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
                Some(percent),
                "{share}"
            );
            // No memory held: no memory limit.
            assert_eq!(get(&env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"), None);
        }
        // Memory only (no share): memory capped, compute not.
        let env = mps_env(&binding("gpu:1:0:4096"), Path::new("/p"));
        assert_eq!(get(&env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"), None);
        assert_eq!(
            get(&env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
            Some("0=4096M")
        );
    }

    #[test]
    fn whole_gpus_and_no_gpus_need_no_mps() {
        for text in ["gpu:0:1000:16384", "gpu:0:1000:16384,gpu:1:1000:16384", ""] {
            let b = binding(text);
            assert!(!needs_mps(&b), "{text}");
            assert!(mps_env(&b, Path::new("/p")).is_empty(), "{text}");
            assert!(!mps(Path::new("/p"), false).applies_to(&b));
        }
        assert!(needs_mps(&binding("gpu:0:500:0")));
        assert!(mps(Path::new("/p"), false).applies_to(&binding("gpu:0:500:0")));
        assert!(!GpuSharing::default().applies_to(&binding("gpu:0:500:0")));
    }

    #[test]
    fn sharing_modes_parse() {
        assert_eq!("mps".parse(), Ok(GpuSharingMode::Mps));
        assert_eq!("none".parse(), Ok(GpuSharingMode::None));
        let err = "mig".parse::<GpuSharingMode>().unwrap_err();
        assert!(err.contains("expected none or mps"), "{err}");
        assert_eq!(GpuSharing::default().pipe_dir, Path::new(DEFAULT_PIPE_DIR));
    }

    #[test]
    fn the_daemon_is_up_only_with_a_control_fifo() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!daemon_running(dir.path()));
        // A plain file named `control` is not the daemon.
        std::fs::write(dir.path().join(CONTROL_PIPE), "").unwrap();
        assert!(!daemon_running(dir.path()));
        std::fs::remove_file(dir.path().join(CONTROL_PIPE)).unwrap();
        mkfifo(&dir.path().join(CONTROL_PIPE));
        assert!(daemon_running(dir.path()));
        let never = |_: &Path| -> Result<(), String> { panic!("not started when up") };
        assert_eq!(ensure_daemon(&mps(dir.path(), true), never), Ok(()));
    }

    #[test]
    fn a_down_daemon_refuses_slices_unless_mps_start() {
        let dir = tempfile::tempdir().unwrap();
        let tried = Cell::new(0);
        let err = ensure_daemon(&mps(dir.path(), false), |_| {
            tried.set(tried.get() + 1);
            Ok(())
        })
        .unwrap_err();
        assert_eq!(tried.get(), 0);
        assert_eq!(
            err,
            format!(
                "gpu_sharing: mps but the MPS control daemon is not running (no {}/control); \
                 start nvidia-cuda-mps-control -d or set mps_start",
                dir.path().display()
            )
        );
        // mps_start: one start, then the FIFO it made is found.
        let result = ensure_daemon(&mps(dir.path(), true), |d| {
            tried.set(tried.get() + 1);
            mkfifo(&d.join(CONTROL_PIPE));
            Ok(())
        });
        assert_eq!(result, Ok(()));
        assert_eq!(tried.get(), 1);
    }

    #[test]
    fn a_failed_start_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = ensure_daemon(&mps(dir.path(), true), |_| {
            Err("cannot run nvidia-cuda-mps-control: No such file or directory".into())
        })
        .unwrap_err();
        assert!(err.contains("mps_start tried"), "{err}");
        assert!(err.contains("No such file or directory"), "{err}");
        // The real starter on a host without the program fails cleanly, no panic.
        if !Path::new("/usr/bin/nvidia-cuda-mps-control").exists() {
            let err = start_daemon(&dir.path().join("pipes")).unwrap_err();
            assert!(err.contains(CONTROL_PROGRAM), "{err}");
        }
    }
}
