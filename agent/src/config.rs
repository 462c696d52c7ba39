//! The validated configuration the agent runs with, made from its flags.
//!
//! Everything a user can type is checked here, once (each value by [`crate::flag_checks`]),
//! with errors that name the flag and the offending part, so the rest of the agent only ever
//! sees valid values.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context as _};
use ringmaster_proto::devices::{parse_agent_resources, Device, DeviceSelection, DeviceState};
use ringmaster_proto::resources::Resources;
use ringmaster_proto::transport::ClientSecurity;

use crate::args::AgentArgs;
use crate::detect::{detect_gpus, detect_hostname, detect_resources};
use crate::flag_checks::{
    check_agent_id, check_custom_resources, check_default_task_resources, check_disk_watermark,
    check_kill_grace, check_max_task_pids, check_pids_per_task, check_pipe_dir,
    check_resource_names, check_sandbox_gc_delay, parse_attributes, zero_dimensions,
};
use crate::isolation_config::{
    default_max_task_pids, IsolationConfig, IsolationMode, DEFAULT_PIDS_PER_TASK,
};
use crate::mps::GpuSharing;
use crate::usage::{check_usage_interval, DEFAULT_USAGE_INTERVAL};
use crate::users::default_task_user;

/// Grace between SIGTERM and SIGKILL when a task is killed.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(3);
/// Longest wait between two attempts to reach the master.
pub const DEFAULT_RECONNECT_MAX_BACKOFF: Duration = Duration::from_secs(5);
/// The last component of the default work dir (see [`default_work_dir`]).
pub const WORK_DIR_NAME: &str = "ringmaster-agent";

/// The validated configuration of one agent.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The masters, `HOST:PORT[,HOST:PORT...]` (one, or every master of a replicated cluster;
    /// see [`ringmaster_proto::masters`]). [`AgentConfig::from_args`] normalizes the list.
    pub master: String,
    /// Id to register with (`None`: the saved id, else master-assigned).
    pub id: Option<String>,
    pub hostname: String,
    /// Total resources offered to the cluster (with the devices' `gpu_milli` / `gpu_mem` sums).
    pub resources: Resources,
    /// GPUs, each with its own share and memory (docs/devices.md).
    pub devices: Vec<Device>,
    /// How a GPU slice picks its device when the master does not bind it.
    pub device_selection: DeviceSelection,
    pub attributes: Vec<(String, String)>,
    pub work_dir: PathBuf,
    /// Grace between SIGTERM and SIGKILL of a task's process group.
    pub kill_grace: Duration,
    /// Cap of the exponential reconnect backoff (which starts at 100 ms).
    pub reconnect_max_backoff: Duration,
    /// TLS and credential for the master connection (default: plain TCP, anonymous).
    pub security: ClientSecurity,
    /// The user of tasks that name none (`--task-user`).
    pub task_user: String,
    /// Tasks may run as root (`--allow-root-tasks`).
    pub allow_root_tasks: bool,
    /// How GPU slices share a device (`--gpu-sharing`, `--mps-pipe-dir`, `--mps-start`).
    pub gpu_sharing: GpuSharing,
    /// How often running tasks' usage is sampled and reported (`--usage-interval`).
    pub usage_interval: Duration,
    /// What the agent guards beyond each task's own resources: default limits, sandbox
    /// garbage collection, the disk watermark (docs/security.md).
    pub safeguards: Safeguards,
}

/// The default of `--default-task-resources`: what a task that omits `cpus` or `mem` is held to.
pub const DEFAULT_TASK_RESOURCES: &str = "cpus:0.1;mem:32";
/// The default of `--sandbox-gc-delay`.
pub const DEFAULT_SANDBOX_GC_DELAY: Duration = Duration::from_secs(3600);
/// The default of `--disk-watermark`.
pub const DEFAULT_DISK_WATERMARK: f64 = 0.9;

/// Limits and housekeeping that hold for every task, whatever it asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct Safeguards {
    /// `--default-task-resources`: the `cpus` and `mem` a task that omits them is limited to
    /// (`None`: `none`, such tasks are refused).
    pub default_task_resources: Option<Resources>,
    /// `--sandbox-gc-delay`: how long an ended task's sandbox is kept after its terminal update
    /// was acknowledged.
    pub sandbox_gc_delay: Duration,
    /// `--disk-watermark`: above this fraction of the work dir's file system in use, ended
    /// sandboxes are collected at once, oldest first.
    pub disk_watermark: f64,
}

impl Default for Safeguards {
    fn default() -> Self {
        Safeguards {
            default_task_resources: Some(
                Resources::parse(DEFAULT_TASK_RESOURCES).expect("a valid default"),
            ),
            sandbox_gc_delay: DEFAULT_SANDBOX_GC_DELAY,
            disk_watermark: DEFAULT_DISK_WATERMARK,
        }
    }
}

impl AgentConfig {
    /// Validates the flags (already merged with the config file, see [`AgentArgs::load`]),
    /// detecting whatever they leave out.
    pub fn from_args(args: AgentArgs) -> anyhow::Result<Self> {
        let Some(master) = args.master.clone() else {
            bail!(
                "the master's address is required: --master HOST:PORT, RINGMASTER_MASTER or                  `master:` in the --config file"
            );
        };
        let master = ringmaster_proto::masters::parse_master_list(&master)
            .map_err(|m| anyhow::anyhow!("--master `{master}`: {m}"))?
            .join(",");
        if let Some(id) = &args.id {
            check_agent_id(id).with_context(|| format!("--id `{id}`"))?;
        }
        let gpu_sharing = gpu_sharing_from_args(&args)?;
        let safeguards = safeguards_from_args(&args)?;
        let custom = check_custom_resources(&args.custom_resources)
            .map_err(|m| anyhow::anyhow!("--custom-resources: {m}"))?;
        let work_dir = match args.work_dir {
            Some(dir) => dir,
            None => {
                // SAFETY: geteuid has no preconditions and cannot fail.
                let euid = unsafe { libc::geteuid() };
                let dir =
                    default_work_dir(euid, |name| std::env::var_os(name), &std::env::temp_dir());
                tracing::info!(work_dir = %dir.display(), "no --work-dir given; using the default");
                dir
            }
        };
        let mut resources = detect_resources(&work_dir);
        let mut devices = detect_gpus();
        if let Some(spec) = &args.resources {
            let (given, given_devices) =
                parse_agent_resources(spec).with_context(|| format!("--resources `{spec}`"))?;
            let zeros = zero_dimensions(spec);
            check_resource_names(&given, &zeros, &custom)
                .map_err(anyhow::Error::msg)
                .with_context(|| format!("--resources `{spec}`"))?;
            if !given_devices.is_empty() || zeros.iter().any(|n| n == "gpus") {
                devices = given_devices;
            }
            for (name, milli) in given.iter() {
                resources.set_milli(name, milli);
            }
            // A dimension given as 0 is absent from `given`; honour it as "none of this".
            for name in zeros {
                resources.set_milli(&name, 0);
            }
        }
        let sums = DeviceState::new(devices.clone())
            .context("GPU devices")?
            .free_scalars();
        for name in [
            ringmaster_proto::devices::GPU_MILLI,
            ringmaster_proto::devices::GPU_MEM,
        ] {
            if devices.is_empty() && resources.milli(name) > 0 {
                bail!(
                    "--resources: `{name}` is derived from GPU devices; declare them as \
                     `gpus:COUNTxMEMORY` (e.g. `gpus:2x16384`)"
                );
            }
            resources.set_milli(name, sums.milli(name));
        }
        // With devices, `gpus` counts them; without, it stays the plain scalar given.
        if !devices.is_empty() {
            resources.set_milli(
                ringmaster_proto::devices::GPUS,
                sums.milli(ringmaster_proto::devices::GPUS),
            );
        }
        let selection = args.device_selection.as_deref().unwrap_or("least-used");
        let device_selection: DeviceSelection = selection
            .parse()
            .with_context(|| format!("--device-selection `{selection}`"))?;
        let attributes = match &args.attributes {
            Some(spec) => {
                parse_attributes(spec).with_context(|| format!("--attributes `{spec}`"))?
            }
            None => Vec::new(),
        };
        let hostname = match args.hostname {
            Some(h) if h.trim().is_empty() => bail!("--hostname must not be empty"),
            Some(h) => h,
            None => detect_hostname(),
        };
        let security = ClientSecurity::from_flags(
            args.tls_ca.as_deref(),
            args.tls_cert.as_deref(),
            args.tls_key.as_deref(),
            args.principal.as_deref(),
            args.secret_file.as_deref(),
        )
        .map_err(anyhow::Error::msg)?;
        let kill_grace = match &args.kill_grace {
            Some(text) => {
                check_kill_grace(text).map_err(|m| anyhow::anyhow!("--kill-grace `{text}`: {m}"))?
            }
            None => DEFAULT_KILL_GRACE,
        };
        let usage_interval = match &args.usage_interval {
            Some(text) => check_usage_interval(text)
                .map_err(|m| anyhow::anyhow!("--usage-interval `{text}`: {m}"))?,
            None => DEFAULT_USAGE_INTERVAL,
        };
        let task_user = match args.task_user {
            Some(u) if u.trim().is_empty() => bail!("--task-user must not be empty"),
            Some(u) => u,
            None => default_task_user(),
        };
        Ok(AgentConfig {
            master,
            id: args.id,
            hostname,
            resources,
            devices,
            device_selection,
            attributes,
            work_dir,
            kill_grace,
            reconnect_max_backoff: DEFAULT_RECONNECT_MAX_BACKOFF,
            security,
            task_user,
            allow_root_tasks: args.allow_root_tasks,
            gpu_sharing,
            usage_interval,
            safeguards,
        })
    }
}

/// Validates `--gpu-sharing`, `--mps-pipe-dir` and `--mps-start`.
fn gpu_sharing_from_args(args: &AgentArgs) -> anyhow::Result<GpuSharing> {
    let mut sharing = GpuSharing::default();
    if let Some(mode) = &args.gpu_sharing {
        sharing.mode = mode
            .parse()
            .map_err(|m: String| anyhow::anyhow!("--gpu-sharing: {m}"))?;
    }
    if let Some(dir) = &args.mps_pipe_dir {
        check_pipe_dir(dir).map_err(|m| anyhow::anyhow!("--mps-pipe-dir: {m}"))?;
        sharing.pipe_dir = dir.clone();
    }
    sharing.start = args.mps_start;
    Ok(sharing)
}

/// Validates `--default-task-resources`, `--sandbox-gc-delay` and `--disk-watermark`
/// (defaults: `cpus:0.1;mem:32`, 1h, 0.9).
pub fn safeguards_from_args(args: &AgentArgs) -> anyhow::Result<Safeguards> {
    let mut safeguards = Safeguards::default();
    if let Some(spec) = &args.default_task_resources {
        safeguards.default_task_resources = check_default_task_resources(spec)
            .map_err(|m| anyhow::anyhow!("--default-task-resources `{spec}`: {m}"))?;
    }
    if let Some(text) = &args.sandbox_gc_delay {
        safeguards.sandbox_gc_delay = check_sandbox_gc_delay(text)
            .map_err(|m| anyhow::anyhow!("--sandbox-gc-delay `{text}`: {m}"))?;
    }
    if let Some(fraction) = args.disk_watermark {
        safeguards.disk_watermark =
            check_disk_watermark(fraction).map_err(|m| anyhow::anyhow!("--disk-watermark {m}"))?;
    }
    Ok(safeguards)
}

/// Validates `--isolation`, `--pids-per-task` and `--max-task-pids` (defaults: auto, 4096, half
/// of the kernel's `pid_max`). A per-task limit above `--max-task-pids` is held to it.
pub fn isolation_from_args(args: &AgentArgs) -> anyhow::Result<IsolationConfig> {
    let mode: IsolationMode = match &args.isolation {
        Some(level) => level
            .parse()
            .map_err(anyhow::Error::msg)
            .with_context(|| "--isolation".to_string())?,
        None => IsolationMode::Auto,
    };
    let pids_per_task = match args.pids_per_task {
        Some(n) => check_pids_per_task(n).map_err(|m| anyhow::anyhow!("--pids-per-task {m}"))?,
        None => DEFAULT_PIDS_PER_TASK,
    };
    let max_task_pids = match args.max_task_pids {
        Some(n) => check_max_task_pids(n).map_err(|m| anyhow::anyhow!("--max-task-pids {m}"))?,
        None => default_max_task_pids(),
    };
    if args.pids_per_task.is_some() && pids_per_task > max_task_pids {
        tracing::warn!(
            "--pids-per-task {pids_per_task} is above --max-task-pids {max_task_pids}, the \
             limit of all tasks together: each task gets at most {max_task_pids}"
        );
    }
    Ok(IsolationConfig {
        mode,
        pids_per_task: pids_per_task.min(max_task_pids),
        max_task_pids,
    })
}

/// Where sandboxes and the saved agent id live unless `--work-dir` says otherwise, never the
/// current directory: `/var/lib/ringmaster-agent` for root (`euid` 0); else
/// `$XDG_STATE_HOME/ringmaster-agent`, else `$HOME/.local/state/ringmaster-agent` (each only
/// when set to an absolute path, as the XDG spec asks); else `<temp_dir>/ringmaster-agent-<uid>`.
/// `env` looks up an environment variable.
pub fn default_work_dir(
    euid: u32,
    env: impl Fn(&str) -> Option<OsString>,
    temp_dir: &Path,
) -> PathBuf {
    if euid == 0 {
        return Path::new("/var/lib").join(WORK_DIR_NAME);
    }
    let absolute = |name: &str| {
        env(name)
            .map(PathBuf::from)
            .filter(|path| path.is_absolute())
    };
    if let Some(state) = absolute("XDG_STATE_HOME") {
        return state.join(WORK_DIR_NAME);
    }
    if let Some(home) = absolute("HOME") {
        return home.join(".local/state").join(WORK_DIR_NAME);
    }
    temp_dir.join(format!("{WORK_DIR_NAME}-{euid}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn args(extra: &[&str]) -> AgentArgs {
        let mut argv = vec!["ringmaster-agent", "--master", "127.0.0.1:5050"];
        argv.extend_from_slice(extra);
        AgentArgs::try_parse_from(argv).unwrap()
    }

    fn error_of(extra: &[&str]) -> String {
        format!("{:#}", AgentConfig::from_args(args(extra)).unwrap_err())
    }

    #[test]
    fn explicit_resources_replace_detected_dimensions() {
        let config =
            AgentConfig::from_args(args(&["--resources", "cpus:2.5;mem:100;gpus:1;disk:0"]))
                .unwrap();
        assert_eq!(config.resources.milli("cpus"), 2500);
        assert_eq!(config.resources.milli("mem"), 100_000);
        assert_eq!(config.resources.milli("gpus"), 1000);
        assert_eq!(config.resources.milli("disk"), 0);
        assert_eq!(config.kill_grace, DEFAULT_KILL_GRACE);
        assert!(!config.hostname.is_empty());
    }

    #[test]
    fn gpu_devices_come_from_the_resources_flag() {
        let config = AgentConfig::from_args(args(&[
            "--resources",
            "cpus:2;gpus:2x16384@V100M16",
            "--device-selection",
            "most-used-that-fits",
        ]))
        .unwrap();
        assert_eq!(config.devices.len(), 2);
        assert_eq!(config.devices[1].model, "V100M16");
        assert_eq!(config.resources.milli("gpu_milli"), 2_000_000);
        assert_eq!(config.resources.milli("gpu_mem"), 32_768_000);
        assert_eq!(config.resources.milli("gpus"), 2000);
        assert_eq!(config.device_selection, DeviceSelection::MostUsedThatFits);
        let none = AgentConfig::from_args(args(&["--resources", "cpus:2;gpus:0"])).unwrap();
        assert!(none.devices.is_empty());
        assert_eq!(none.resources.milli("gpu_milli"), 0);
        let err = error_of(&["--device-selection", "random"]);
        assert!(err.contains("--device-selection `random`"), "{err}");
        let err = error_of(&["--resources", "gpu_milli:500"]);
        assert!(err.contains("declare them as"), "{err}");
        let err = error_of(&["--resources", "gpus:1;gpus:2x1"]);
        assert!(err.contains("--resources"), "{err}");
    }

    #[test]
    fn missing_resources_are_detected() {
        let config = AgentConfig::from_args(args(&[])).unwrap();
        assert!(config.resources.milli("cpus") >= 1000);
        assert!(config.resources.milli("mem") > 0);
        assert!(
            config.work_dir.is_absolute(),
            "{}",
            config.work_dir.display()
        );
        assert!(
            config.work_dir.ends_with(WORK_DIR_NAME) || {
                let last = config.work_dir.file_name().unwrap().to_string_lossy();
                last.starts_with("ringmaster-agent-")
            }
        );
        let config = AgentConfig::from_args(args(&["--work-dir", "here"])).unwrap();
        assert_eq!(config.work_dir, PathBuf::from("here"));
        assert!(
            AgentArgs::try_parse_from(["x", "--master", "h:1", "--work-dir", ""]).is_err(),
            "an empty --work-dir is refused"
        );
    }

    #[test]
    fn the_default_work_dir_is_never_the_current_directory() {
        let temp = Path::new("/tmp");
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        let all = env(&[("XDG_STATE_HOME", "/x/state"), ("HOME", "/home/ann")]);
        assert_eq!(
            default_work_dir(0, all, temp),
            PathBuf::from("/var/lib/ringmaster-agent")
        );
        assert_eq!(
            default_work_dir(1000, all, temp),
            PathBuf::from("/x/state/ringmaster-agent")
        );
        assert_eq!(
            default_work_dir(1000, env(&[("HOME", "/home/ann")]), temp),
            PathBuf::from("/home/ann/.local/state/ringmaster-agent")
        );
        // Relative or empty values are ignored, as the XDG spec asks.
        assert_eq!(
            default_work_dir(
                1000,
                env(&[("XDG_STATE_HOME", "state"), ("HOME", "/home/ann")]),
                temp
            ),
            PathBuf::from("/home/ann/.local/state/ringmaster-agent")
        );
        for vars in [
            &[][..],
            &[("XDG_STATE_HOME", ""), ("HOME", "")][..],
            &[("HOME", ".")][..],
        ] {
            assert_eq!(
                default_work_dir(1000, env(vars), temp),
                PathBuf::from("/tmp/ringmaster-agent-1000"),
                "{vars:?}"
            );
        }
    }

    #[test]
    fn unknown_resource_names_are_refused_unless_declared_custom() {
        let err = error_of(&["--resources", "cpu:4;mem:64"]);
        assert!(err.contains("--resources `cpu:4;mem:64`"), "{err}");
        assert!(
            err.contains("unknown resource `cpu` (did you mean `cpus`?)"),
            "{err}"
        );
        assert!(err.contains("--custom-resources"), "{err}");
        // A name given as zero is checked too.
        let err = error_of(&["--resources", "cpus:1;memory:0"]);
        assert!(
            err.contains("unknown resource `memory` (did you mean `mem`?)"),
            "{err}"
        );
        // Declared names are accepted, beside GPU devices.
        let config = AgentConfig::from_args(args(&[
            "--resources",
            "cpus:2;fpgas:2;licenses:10;gpus:2x16384@A100",
            "--custom-resources",
            "fpgas,licenses",
        ]))
        .unwrap();
        assert_eq!(config.resources.milli("fpgas"), 2000);
        assert_eq!(config.resources.milli("licenses"), 10_000);
        assert_eq!(config.devices.len(), 2);
        let config = AgentConfig::from_args(args(&[
            "--resources",
            "fpgas:1",
            "--custom-resources",
            "fpgas",
            "--custom-resources",
            "tpus",
        ]))
        .unwrap();
        assert_eq!(config.resources.milli("fpgas"), 1000);
        // Still refused when another custom name is declared.
        let err = error_of(&["--resources", "fpga:1", "--custom-resources", "fpgas"]);
        assert!(
            err.contains("unknown resource `fpga` (did you mean `fpgas`?)"),
            "{err}"
        );
        for (names, expected) in [
            ("9lives", "not a valid resource name"),
            ("a b", "not a valid resource name"),
            ("fpgas,", "`` is not a valid resource name"),
            ("x:1", "not a valid resource name"),
            ("cpus", "is a standard resource"),
            ("fpgas,fpgas", "appears more than once"),
        ] {
            let err = error_of(&["--custom-resources", names]);
            assert!(err.contains("--custom-resources"), "{names}: {err}");
            assert!(err.contains(expected), "{names}: {err}");
        }
    }

    #[test]
    fn bad_resources_name_the_flag_and_the_part() {
        let err = error_of(&["--resources", "cpus:4;mem:lots"]);
        assert!(err.contains("--resources `cpus:4;mem:lots`"), "{err}");
        assert!(err.contains("amount `lots`"), "{err}");
        let err = error_of(&["--resources", "cpus"]);
        assert!(err.contains("`cpus` is not `name:amount`"), "{err}");
    }

    #[test]
    fn attributes_parse_and_bad_ones_are_named() {
        let config =
            AgentConfig::from_args(args(&["--attributes", "partition:gpu; rack:r1:a"])).unwrap();
        assert_eq!(
            config.attributes,
            vec![
                ("partition".to_string(), "gpu".to_string()),
                ("rack".to_string(), "r1:a".to_string())
            ]
        );
        let cases = [
            ("partition", "`partition` is not `key:value`"),
            (":gpu", "the key is empty"),
            ("rack:", "the value is empty"),
            ("a:1;a:2", "`a` appears more than once"),
            ("ra ck:1", "not allowed in a key"),
            ("a:1;;b:2", "`` is not `key:value`"),
        ];
        for (spec, expected) in cases {
            let err = error_of(&["--attributes", spec]);
            assert!(err.contains("--attributes"), "{err}");
            assert!(err.contains(expected), "{spec}: {err}");
        }
    }

    /// The agent's default and fixed timers stay within the ranges the master's own timers are
    /// held to (docs/operations.md, "Allowed ranges").
    #[test]
    fn fixed_timers_are_in_sane_ranges() {
        let config = AgentConfig::from_args(args(&["--resources", "cpus:1;mem:64"])).unwrap();
        for (name, value) in [
            ("kill_grace", config.kill_grace),
            ("reconnect_max_backoff", config.reconnect_max_backoff),
        ] {
            assert!(
                (Duration::from_millis(100)..=Duration::from_secs(24 * 3600)).contains(&value),
                "{name} = {value:?}"
            );
        }
    }

    #[test]
    fn isolation_flags() {
        let iso = isolation_from_args(&args(&[])).unwrap();
        assert_eq!(iso, IsolationConfig::default());
        assert_eq!(iso.mode, IsolationMode::Auto);
        assert_eq!(iso.pids_per_task, 4096);
        let iso = isolation_from_args(&args(&["--isolation", "cgroups", "--pids-per-task", "16"]))
            .unwrap();
        assert_eq!(iso.mode, IsolationMode::Cgroups);
        assert_eq!(iso.pids_per_task, 16);
        let iso = isolation_from_args(&args(&["--isolation", "none"])).unwrap();
        assert_eq!(iso.mode, IsolationMode::None);
        let err = format!(
            "{:#}",
            isolation_from_args(&args(&["--isolation", "strict"])).unwrap_err()
        );
        assert!(err.contains("--isolation"), "{err}");
        assert!(err.contains("expected auto, cgroups or none"), "{err}");
        for n in ["15", "4194305"] {
            let err = format!(
                "{:#}",
                isolation_from_args(&args(&["--pids-per-task", n])).unwrap_err()
            );
            assert!(err.contains("--pids-per-task"), "{err}");
            assert!(err.contains("out of range (16 - 4194304)"), "{err}");
        }
        assert!(
            AgentArgs::try_parse_from(["x", "--master", "h:1", "--pids-per-task", "lots"]).is_err()
        );
    }

    #[test]
    fn max_task_pids_flag() {
        // Default: half of the kernel's pid_max.
        let iso = isolation_from_args(&args(&[])).unwrap();
        let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max").ok();
        assert_eq!(
            iso.max_task_pids,
            crate::isolation_config::max_task_pids_for(pid_max.as_deref())
        );
        if let Some(pid_max) = pid_max {
            let half = pid_max.trim().parse::<u64>().unwrap() / 2;
            assert_eq!(iso.max_task_pids, half.clamp(64, 4_194_304));
        }
        for (n, expected) in [("64", 64), ("4194304", 4_194_304), ("20000", 20_000)] {
            let iso = isolation_from_args(&args(&["--max-task-pids", n])).unwrap();
            assert_eq!(iso.max_task_pids, expected);
            assert_eq!(iso.pids_per_task, DEFAULT_PIDS_PER_TASK.min(expected));
        }
        // A per-task limit above the total is held to the total.
        let iso = isolation_from_args(&args(&[
            "--pids-per-task",
            "1000",
            "--max-task-pids",
            "100",
        ]))
        .unwrap();
        assert_eq!((iso.pids_per_task, iso.max_task_pids), (100, 100));
        for n in ["63", "4194305", "0"] {
            let err = format!(
                "{:#}",
                isolation_from_args(&args(&["--max-task-pids", n])).unwrap_err()
            );
            assert_eq!(
                err,
                format!("--max-task-pids {n} is out of range (64 - 4194304)")
            );
        }
        assert!(
            AgentArgs::try_parse_from(["x", "--master", "h:1", "--max-task-pids", "-1"]).is_err()
        );
    }

    #[test]
    fn safeguards_default() {
        let config = AgentConfig::from_args(args(&[])).unwrap();
        assert_eq!(config.safeguards, Safeguards::default());
        assert_eq!(
            config.safeguards.default_task_resources,
            Some(Resources::parse("cpus:0.1;mem:32").unwrap())
        );
        assert_eq!(
            config.safeguards.sandbox_gc_delay,
            Duration::from_secs(3600)
        );
        assert_eq!(config.safeguards.disk_watermark, 0.9);
    }

    #[test]
    fn default_task_resources_flag() {
        let config =
            AgentConfig::from_args(args(&["--default-task-resources", "mem:256; cpus:0.5"]))
                .unwrap();
        assert_eq!(
            config.safeguards.default_task_resources,
            Some(Resources::parse("cpus:0.5;mem:256").unwrap())
        );
        let config = AgentConfig::from_args(args(&["--default-task-resources", "none"])).unwrap();
        assert_eq!(config.safeguards.default_task_resources, None);
        const ALLOWED: &str =
            "(both cpus and mem, each more than 0, e.g. `cpus:0.1;mem:32`; or `none`)";
        for (bad, expected) in [
            (
                "cpus:1;mem:64;disk:10",
                format!("`disk` cannot be given {ALLOWED}"),
            ),
            (
                "cpus:1;mem:64;gpus:0",
                format!("`gpus` cannot be given {ALLOWED}"),
            ),
            (
                "cpus:0;mem:64",
                format!("`cpus` must be more than 0 {ALLOWED}"),
            ),
            (
                "cpus:1;mem:0.0",
                format!("`mem` must be more than 0 {ALLOWED}"),
            ),
            ("cpus:1", format!("names no `mem` {ALLOWED}")),
            ("mem:32", format!("names no `cpus` {ALLOWED}")),
            ("", format!("names no `cpus` {ALLOWED}")),
            (
                "cpus:-1;mem:32",
                "`cpus:-1`: amount `-1` is not a non-negative finite number with at most 3 \
                 decimals"
                    .to_string(),
            ),
            (
                "cpus:1;cpus:2;mem:3",
                "`cpus` appears more than once".to_string(),
            ),
            (
                "None",
                "`None` is not `name:amount` (in `None`)".to_string(),
            ),
        ] {
            assert_eq!(
                error_of(&["--default-task-resources", bad]),
                format!("--default-task-resources `{bad}`: {expected}"),
                "{bad}"
            );
        }
    }

    #[test]
    fn sandbox_gc_delay_flag() {
        for (good, expected) in [
            ("0s", Duration::ZERO),
            ("0ms", Duration::ZERO),
            ("90m", Duration::from_secs(5400)),
            ("720h", Duration::from_secs(30 * 24 * 3600)),
        ] {
            let config = AgentConfig::from_args(args(&["--sandbox-gc-delay", good])).unwrap();
            assert_eq!(config.safeguards.sandbox_gc_delay, expected, "{good}");
        }
        for (bad, expected) in [
            ("721h", "out of range (0s - 720h, i.e. 30 days)"),
            ("2592000001ms", "out of range (0s - 720h, i.e. 30 days)"),
            (
                "30d",
                "unknown unit `d` (expected ms, s, m or h, e.g. `3s`)",
            ),
            ("1", "unknown unit `` (expected ms, s, m or h, e.g. `3s`)"),
            (
                "-1s",
                "expected a whole number and a unit (ms, s, m, h), e.g. `3s`",
            ),
        ] {
            assert_eq!(
                error_of(&[&format!("--sandbox-gc-delay={bad}")]),
                format!("--sandbox-gc-delay `{bad}`: {expected}"),
                "{bad}"
            );
        }
    }

    #[test]
    fn disk_watermark_flag() {
        for (good, expected) in [("1", 1.0), ("0.5", 0.5), ("0.001", 0.001)] {
            let config = AgentConfig::from_args(args(&["--disk-watermark", good])).unwrap();
            assert_eq!(config.safeguards.disk_watermark, expected, "{good}");
        }
        for (bad, shown) in [
            ("0", "0"),
            ("1.01", "1.01"),
            ("-0.5", "-0.5"),
            ("NaN", "NaN"),
            ("inf", "inf"),
        ] {
            assert_eq!(
                error_of(&[&format!("--disk-watermark={bad}")]),
                format!("--disk-watermark {shown} is out of range (more than 0, at most 1)"),
                "{bad}"
            );
        }
        assert!(
            AgentArgs::try_parse_from(["x", "--master", "h:1", "--disk-watermark", "most"])
                .is_err()
        );
    }

    #[test]
    fn kill_grace_flag() {
        let config = AgentConfig::from_args(args(&["--kill-grace", "500ms"])).unwrap();
        assert_eq!(config.kill_grace, Duration::from_millis(500));
        let config = AgentConfig::from_args(args(&["--kill-grace", "2m"])).unwrap();
        assert_eq!(config.kill_grace, Duration::from_secs(120));
        for (bad, expected) in [
            ("50ms", "out of range (100ms - 1 day)"),
            ("2d", "unknown unit `d`"),
            ("s", "whole number"),
            ("25h", "out of range"),
            ("99999999999999999h", "too long"),
        ] {
            let err = error_of(&["--kill-grace", bad]);
            assert!(err.contains("--kill-grace"), "{err}");
            assert!(err.contains(expected), "{bad}: {err}");
        }
    }

    #[test]
    fn usage_interval_flag() {
        let config = AgentConfig::from_args(args(&[])).unwrap();
        assert_eq!(config.usage_interval, Duration::from_secs(10));
        let config = AgentConfig::from_args(args(&["--usage-interval", "1s"])).unwrap();
        assert_eq!(config.usage_interval, Duration::from_secs(1));
        let config = AgentConfig::from_args(args(&["--usage-interval", "1h"])).unwrap();
        assert_eq!(config.usage_interval, Duration::from_secs(3600));
        for (bad, expected) in [
            ("999ms", "out of range (1s - 1h)"),
            ("61m", "out of range (1s - 1h)"),
            ("10", "unknown unit"),
        ] {
            let err = error_of(&["--usage-interval", bad]);
            assert!(err.contains("--usage-interval"), "{err}");
            assert!(err.contains(expected), "{bad}: {err}");
        }
    }

    #[test]
    fn gpu_sharing_flags() {
        let config = AgentConfig::from_args(args(&[])).unwrap();
        assert_eq!(config.gpu_sharing, GpuSharing::default());
        let config = AgentConfig::from_args(args(&[
            "--gpu-sharing",
            "mps",
            "--mps-pipe-dir",
            "/run/mps",
            "--mps-start",
        ]))
        .unwrap();
        assert_eq!(config.gpu_sharing.mode, crate::mps::GpuSharingMode::Mps);
        assert_eq!(config.gpu_sharing.pipe_dir, PathBuf::from("/run/mps"));
        assert!(config.gpu_sharing.start);
        let err = error_of(&["--gpu-sharing", "mig"]);
        assert!(err.contains("--gpu-sharing"), "{err}");
        assert!(err.contains("expected none or mps"), "{err}");
        let err = error_of(&["--mps-pipe-dir", "mps"]);
        assert!(
            err.contains("--mps-pipe-dir: `mps` is not an absolute path"),
            "{err}"
        );
    }

    #[test]
    fn task_user_flags() {
        let config = AgentConfig::from_args(args(&[])).unwrap();
        assert_eq!(config.task_user, default_task_user());
        assert!(!config.allow_root_tasks);
        let config =
            AgentConfig::from_args(args(&["--task-user", "ann", "--allow-root-tasks"])).unwrap();
        assert_eq!(config.task_user, "ann");
        assert!(config.allow_root_tasks);
        let err = error_of(&["--task-user", " "]);
        assert!(err.contains("--task-user"), "{err}");
    }

    #[test]
    fn bad_master_and_id_are_refused() {
        let err = format!(
            "{:#}",
            AgentConfig::from_args(
                AgentArgs::try_parse_from(["x", "--master", "localhost"]).unwrap()
            )
            .unwrap_err()
        );
        assert!(err.contains("expected HOST:PORT"), "{err}");
        let err = format!(
            "{:#}",
            AgentConfig::from_args(
                AgentArgs::try_parse_from(["x", "--master", "h:99999"]).unwrap()
            )
            .unwrap_err()
        );
        assert!(err.contains("`99999` is not a port number"), "{err}");
        let err = format!(
            "{:#}",
            AgentConfig::from_args(
                AgentArgs::try_parse_from(["x", "--master", "a:1,b,c:1"]).unwrap()
            )
            .unwrap_err()
        );
        assert!(
            err.contains("--master `a:1,b,c:1`: entry `b`: expected HOST:PORT"),
            "{err}"
        );
        let err = error_of(&["--id", "../etc"]);
        assert!(err.contains("--id `../etc`"), "{err}");
        let err = format!(
            "{:#}",
            AgentConfig::from_args(AgentArgs::default()).unwrap_err()
        );
        assert!(err.contains("the master's address is required"), "{err}");
    }

    #[test]
    fn the_master_address_may_come_from_the_environment() {
        // The only test of this binary that reads the variable; the others pass --master.
        std::env::set_var("RINGMASTER_MASTER", "from-env:5050");
        let from_env = AgentArgs::try_parse_from(["x"]).map(|a| a.master);
        let flag_wins = AgentArgs::try_parse_from(["x", "--master", "flag:1"]).map(|a| a.master);
        std::env::set_var("RINGMASTER_MASTER", "e1:5050, e2:5050");
        let list_from_env = AgentArgs::try_parse_from(["x"]).map(|a| a.master);
        std::env::remove_var("RINGMASTER_MASTER");
        assert_eq!(from_env.unwrap().as_deref(), Some("from-env:5050"));
        assert_eq!(flag_wins.unwrap().as_deref(), Some("flag:1"));
        assert_eq!(list_from_env.unwrap().as_deref(), Some("e1:5050, e2:5050"));
    }

    #[test]
    fn a_list_of_masters_is_accepted_and_normalized() {
        let config = AgentConfig::from_args(
            AgentArgs::try_parse_from([
                "x",
                "--master",
                "a:5050, b:5050,c:5050",
                "--resources",
                "cpus:1;mem:64;disk:0",
                "--hostname",
                "h",
                "--work-dir",
                "/tmp/w",
            ])
            .unwrap(),
        )
        .unwrap();
        assert_eq!(config.master, "a:5050,b:5050,c:5050");
    }
}
