//! Task isolation with cgroups (`--isolation`): each task gets its own cgroup with a CPU quota,
//! a hard memory limit and a process limit from what the master allocated to it.
//!
//! Layout: `ringmaster/<agent>/<task>` in every hierarchy the agent uses (cgroup v1: the `cpu`,
//! `cpuacct`, `memory` and `pids` hierarchies; v2: the unified one), where `<agent>` is derived
//! from the agent's work dir (so agents with different work dirs on one machine never share a
//! parent, and a restarted agent finds its own) and `<task>` is `<framework>+<task id>`, both
//! escaped like sandbox names. The cgroup files themselves are handled by the `cgroups-rs`
//! crate, which detects v1 and v2; this module decides names, limits and lifetimes.
//!
//! Every task is bounded in cpu, memory and processes: a task that names no `cpus` or `mem` is
//! held to `--default-task-resources` ([`limited_resources`]), and the agent's cgroup itself is
//! capped at what the agent offers (its `cpus` and `mem`) and at `--max-task-pids` processes,
//! so all tasks together cannot take more of the machine than the agent advertised
//! ([`Isolation::setup_with_caps`]).
//!
//! A task's process joins its cgroup in the forked child before it execs (see
//! [`crate::process::launch`]), so nothing the task runs is ever outside it. The task counts as
//! ended only when its cgroup is empty; the cgroup is then removed. At startup the agent
//! re-attaches the cgroups of the tasks it recovers and removes every other cgroup an earlier
//! run left under its parent (killing what still runs there).

use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, Once};
use std::time::Duration;

use cgroups_rs::fs::cpu::CpuController;
use cgroups_rs::fs::cpuacct::CpuAcctController;
use cgroups_rs::fs::devices::{DevicePermissions, DeviceType, DevicesController};
use cgroups_rs::fs::memory::MemController;
use cgroups_rs::fs::pid::PidController;
use cgroups_rs::fs::{hierarchies, Cgroup, Controller as _, MaxValue};
use ringmaster_proto::resources::Resources;

use crate::device_rules::{self, DeviceRule};
use crate::exit_outcome::ExitOutcome;
use crate::isolation_config::DEFAULT_PIDS_PER_TASK;
use crate::sandbox::escape_component;

// The settings `Isolation::setup` takes, under the paths they have always had.
pub use crate::isolation_config::{IsolationConfig, IsolationMode};

/// The parent of every Ringmaster cgroup, in each hierarchy.
pub const CGROUP_PARENT: &str = "ringmaster";
/// CFS period of every task: 100 ms.
pub const CFS_PERIOD_US: u64 = 100_000;
/// The smallest CFS quota the kernel accepts (1 ms).
pub const MIN_CFS_QUOTA_US: u64 = 1_000;
/// The largest CFS quota the kernel accepts (its `max_cfs_runtime`, about 203 days).
const MAX_CFS_QUOTA_US: u64 = (1 << 44) - 1;
/// The name of the probe cgroup made (and removed) at startup to check the hierarchy works.
const PROBE: &str = "startup-probe";
/// How long a cgroup being emptied (stale cleanup) may take before it is given up.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// The limits of one task's cgroup, from its allocated resources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskLimits {
    /// CFS quota per [`CFS_PERIOD_US`]; `None`: no CPU limit (the task asked for no cpus).
    pub cpu_quota_us: Option<u64>,
    pub cpu_period_us: u64,
    /// Hard memory limit (memory + swap where the kernel accounts swap); `None`: no limit.
    pub memory_bytes: Option<u64>,
    /// Most processes and threads at once.
    pub pids_max: u64,
}

/// What a task may use: `cpus` becomes a CFS quota of `cpus × 100 ms` per 100 ms (at least the
/// kernel's 1 ms), `mem` (MiB) a hard memory limit, and every task gets `pids_per_task`.
/// Resources the task does not ask for are not limited.
pub fn task_limits(resources: &Resources, pids_per_task: u64) -> TaskLimits {
    // milli-cpus × period / 1000.
    let cpu_milli = u128::from(resources.milli("cpus"));
    let cpu_quota_us = (cpu_milli > 0).then(|| {
        let quota = cpu_milli * u128::from(CFS_PERIOD_US) / 1000;
        u64::try_from(quota)
            .unwrap_or(u64::MAX)
            .clamp(MIN_CFS_QUOTA_US, MAX_CFS_QUOTA_US)
    });
    // milli-MiB × 1 MiB / 1000.
    let mem_milli = u128::from(resources.milli("mem"));
    let memory_bytes = (mem_milli > 0).then(|| {
        let bytes = mem_milli * 1024 * 1024 / 1000;
        // The kernel takes an i64; anything that large is no limit in practice.
        u64::try_from(bytes)
            .unwrap_or(u64::MAX)
            .clamp(1, i64::MAX as u64)
    });
    TaskLimits {
        cpu_quota_us,
        cpu_period_us: CFS_PERIOD_US,
        memory_bytes,
        pids_max: pids_per_task,
    }
}

/// The resources a task is LIMITED to (its cgroup's cpu quota and memory limit): its own `cpus`
/// and `mem` where it names them (more than 0), the `defaults` (`--default-task-resources`)
/// where it omits them; every other dimension as the task has it. `Err` (the task is refused)
/// when it omits one and there is no default for it (`defaults` is `None`:
/// `--default-task-resources none`). The defaults are limits only: nothing is deducted for them
/// from what the agent offers.
pub fn limited_resources(
    task: &Resources,
    defaults: Option<&Resources>,
) -> Result<Resources, String> {
    let mut limited = task.clone();
    let mut missing = Vec::new();
    for name in ["cpus", "mem"] {
        if task.milli(name) > 0 {
            continue;
        }
        match defaults.map_or(0, |d| d.milli(name)) {
            0 => missing.push(name),
            milli => limited.set_milli(name, milli),
        }
    }
    if missing.is_empty() {
        return Ok(limited);
    }
    let names = missing.join(" or ");
    Err(match defaults {
        None => format!(
            "the task names no {names} and this agent gives no default \
             (--default-task-resources none)"
        ),
        Some(d) => format!(
            "the task names no {names} and this agent gives no default for it \
             (--default-task-resources {d})"
        ),
    })
}

/// The limits of the agent's own cgroup, the parent of every task's: the CPU quota and memory
/// limit of the resources the agent offers (`offered`: its `cpus` and `mem`; `None`, or a
/// dimension it offers none of: no such limit) and `max_task_pids` processes.
pub fn agent_limits(offered: Option<&Resources>, max_task_pids: u64) -> TaskLimits {
    let mut caps = Resources::new();
    if let Some(offered) = offered {
        for name in ["cpus", "mem"] {
            caps.set_milli(name, offered.milli(name));
        }
    }
    task_limits(&caps, max_task_pids)
}

/// `limits` held within the agent cgroup's `caps`: a task cannot use more than its parent
/// anyway, and on cgroup v1 the kernel refuses a CPU quota above the parent's.
fn within(limits: TaskLimits, caps: &TaskLimits) -> TaskLimits {
    let min = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, _) => a,
    };
    TaskLimits {
        cpu_quota_us: min(limits.cpu_quota_us, caps.cpu_quota_us),
        cpu_period_us: limits.cpu_period_us,
        memory_bytes: min(limits.memory_bytes, caps.memory_bytes),
        pids_max: limits.pids_max.min(caps.pids_max),
    }
}

/// For the startup log: `cpus 2 (quota 200000 us per 100000 us), mem 1024 MiB, 16384
/// processes`.
fn describe_limits(limits: &TaskLimits) -> String {
    let cpus = match limits.cpu_quota_us {
        Some(q) => format!(
            "cpus {} (quota {q} us per {} us)",
            ringmaster_proto::resources::format_milli(q * 1000 / limits.cpu_period_us.max(1)),
            limits.cpu_period_us
        ),
        None => "cpus unlimited".into(),
    };
    let mem = match limits.memory_bytes {
        Some(b) if b % (1024 * 1024) == 0 => format!("mem {} MiB", b / (1024 * 1024)),
        Some(b) => format!("mem {b} bytes"),
        None => "mem unlimited".into(),
    };
    format!("{cpus}, {mem}, {} processes", limits.pids_max)
}

/// Serializes making the agent's cgroup (with its caps) and a task cgroup in it against
/// removing the agent's cgroup once its last task cgroup is gone (which happens off the
/// launching thread): otherwise a task cgroup could be made in an agent cgroup re-created
/// without its caps.
static AGENT_CGROUP_LOCK: Mutex<()> = Mutex::new(());

fn agent_cgroup_lock() -> MutexGuard<'static, ()> {
    AGENT_CGROUP_LOCK
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A 64-bit FNV-1a hash: short, stable names for long paths and ids.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, &b| {
        (hash ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The agent's cgroup name under [`CGROUP_PARENT`]: the work dir's last component (letters,
/// digits, `-`, `_`, `.`; at most 40) and a hash of its full path, e.g.
/// `ringmaster-agent-work-3f2a9c0d1e2b4a59`. Stable across restarts on the same work dir.
pub fn agent_cgroup_name(work_dir: &Path) -> String {
    let full = work_dir
        .canonicalize()
        .unwrap_or_else(|_| work_dir.to_path_buf());
    let base: String = full
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    let base = base.trim_start_matches('.');
    let hash = fnv1a(full.as_os_str().as_encoded_bytes());
    if base.is_empty() {
        format!("agent-{hash:016x}")
    } else {
        format!("{base}-{hash:016x}")
    }
}

/// A task's cgroup name: `<framework>+<task>`, each escaped like a sandbox name (so `+` and `/`
/// never appear inside them, and no name is `.`, `..` or a cgroup file name); names longer than
/// 200 bytes are cut and end in a hash of the whole.
pub fn task_cgroup_name(framework_id: &str, task_id: &str) -> String {
    let name = format!(
        "{}+{}",
        escape_component(framework_id),
        escape_component(task_id)
    );
    if name.len() <= 200 {
        return name;
    }
    // Escaped names are ASCII, so any byte index is a char boundary.
    format!("{}~{:016x}", &name[..160], fnv1a(name.as_bytes()))
}

/// Prints the "running without cgroups" warning once per process (several in-process agents
/// would otherwise each say the same).
fn warn_once(message: &str) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| tracing::warn!("{message}"));
}

/// Says once per process why the NVIDIA devices rule is off.
fn devices_note_once(message: &str) {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| tracing::warn!("{message}"));
}

/// The agent's cgroup setup: disabled, or the parent under which its tasks' cgroups live.
#[derive(Debug, Clone)]
pub struct Isolation {
    root: Option<CgroupRoot>,
    pids_per_task: u64,
}

#[derive(Debug, Clone)]
struct CgroupRoot {
    /// `ringmaster/<agent>`, relative to each hierarchy's root.
    agent_path: String,
    /// The limits of the agent's cgroup: what the agent offers, `--max-task-pids`.
    caps: TaskLimits,
    /// The controllers task cgroups are made in.
    controllers: Vec<String>,
    v2: bool,
    /// With the v1 `devices` controller: task cgroups get the NVIDIA device rule
    /// ([`crate::device_rules`]); false without it (and always on v2).
    devices: bool,
}

/// What a task may open of the NVIDIA devices, for its cgroup's devices rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuAccess<'a> {
    /// The task holds these GPUs (indices; empty: none, so no NVIDIA node at all).
    Devices(&'a [u32]),
    /// No rule: the task holds GPUs the agent cannot name (a plain `gpus` scalar without a
    /// device list), so its cgroup leaves devices as they are.
    Unrestricted,
}

/// Where a task cgroup's counters are, in each hierarchy (read by [`crate::usage`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupDirs {
    pub v2: bool,
    /// v1: the `cpuacct` directory; v2: the task's unified directory.
    pub cpu: Option<PathBuf>,
    /// v1: the `memory` directory; v2: the task's unified directory.
    pub memory: Option<PathBuf>,
}

impl Isolation {
    /// No cgroups: tasks run in their process group only.
    pub fn disabled() -> Self {
        Isolation {
            root: None,
            pids_per_task: DEFAULT_PIDS_PER_TASK,
        }
    }

    /// [`Isolation::setup_with_caps`] without cpu and memory caps on the agent's cgroup (its
    /// pids limit, `max_task_pids`, still holds).
    pub fn setup(config: &IsolationConfig, work_dir: &Path) -> anyhow::Result<Self> {
        Self::setup_with_caps(config, work_dir, None)
    }

    /// Prepares isolation as configured for the agent whose work dir is `work_dir`:
    /// `cgroups` fails with a clear error when cgroups are unusable; `auto` then falls back to
    /// none with one warning; `none` does nothing. With cgroups, the agent's cgroup (the parent
    /// of every task's) is capped at `offered`'s `cpus` (CFS quota) and `mem` (memory limit,
    /// no swap past it) — what the agent advertises, `None`: no such caps — and at
    /// `config.max_task_pids` processes; the caps are logged once. A per-task process limit
    /// above `max_task_pids` is held to it.
    pub fn setup_with_caps(
        config: &IsolationConfig,
        work_dir: &Path,
        offered: Option<&Resources>,
    ) -> anyhow::Result<Self> {
        let pids_per_task = config.pids_per_task.min(config.max_task_pids);
        let caps = agent_limits(offered, config.max_task_pids);
        let disabled = Isolation {
            root: None,
            pids_per_task,
        };
        let enabled = |root: CgroupRoot| {
            tracing::info!(cgroup = %root.agent_path, "all tasks together are capped at {} \
                (the agent's cgroup; each task at most {pids_per_task} processes)",
                describe_limits(&root.caps));
            Isolation {
                root: Some(root),
                pids_per_task,
            }
        };
        match config.mode {
            IsolationMode::None => Ok(disabled),
            IsolationMode::Cgroups => {
                let root = CgroupRoot::setup(work_dir, caps).map_err(|e| {
                    anyhow::anyhow!(
                        "--isolation cgroups: cgroups are not usable: {e} (run the agent as \
                         root on a host with the cpu, memory and pids controllers, or use \
                         --isolation none)"
                    )
                })?;
                Ok(enabled(root))
            }
            IsolationMode::Auto => {
                // SAFETY: geteuid has no preconditions and cannot fail.
                if unsafe { libc::geteuid() } != 0 {
                    warn_once(
                        "--isolation auto: the agent is not root, so tasks run WITHOUT cgroups \
                         (no cpu, memory or process limits; a task that escapes its process \
                         group survives a kill). Run as root or pass --isolation none to \
                         silence this.",
                    );
                    return Ok(disabled);
                }
                match CgroupRoot::setup(work_dir, caps) {
                    Ok(root) => Ok(enabled(root)),
                    Err(e) => {
                        warn_once(&format!(
                            "--isolation auto: cgroups are not usable ({e}), so tasks run \
                             WITHOUT cgroups (no cpu, memory or process limits). Fix the \
                             cgroup hierarchy or pass --isolation none to silence this."
                        ));
                        Ok(disabled)
                    }
                }
            }
        }
    }

    /// True when tasks get cgroups.
    pub fn enabled(&self) -> bool {
        self.root.is_some()
    }

    /// True when task cgroups carry the NVIDIA devices rule (cgroup v1 with `devices`).
    pub fn device_rules(&self) -> bool {
        self.root.as_ref().is_some_and(|r| r.devices)
    }

    /// For the startup log: `cgroups v1 under ringmaster/<agent>` or `none`.
    pub fn describe(&self) -> String {
        match &self.root {
            Some(root) => format!(
                "cgroups {} ({}) under {}, {} processes per task, GPU devices rule {}",
                if root.v2 { "v2" } else { "v1" },
                root.controllers.join(","),
                root.agent_path,
                self.pids_per_task,
                if root.devices { "on" } else { "off" }
            ),
            None => "none (process groups only)".into(),
        }
    }

    /// The relative path (in each hierarchy) of the agent's cgroup, `ringmaster/<agent>`;
    /// `None` when disabled.
    pub fn agent_cgroup_path(&self) -> Option<&str> {
        self.root.as_ref().map(|r| r.agent_path.as_str())
    }

    /// The agent cgroup's directory in each hierarchy (one on v2); empty when disabled.
    pub fn agent_cgroup_dirs(&self) -> Vec<PathBuf> {
        let Some(root) = &self.root else {
            return Vec::new();
        };
        controller_dirs(&root.load(&root.agent_path))
    }

    /// The limits of the agent's cgroup (what the agent offers, `--max-task-pids`); `None`
    /// when disabled.
    pub fn agent_caps(&self) -> Option<&TaskLimits> {
        self.root.as_ref().map(|r| &r.caps)
    }

    /// The relative path (in each hierarchy) of a task's cgroup; `None` when disabled.
    pub fn task_cgroup_path(&self, framework_id: &str, task_id: &str) -> Option<String> {
        let root = self.root.as_ref()?;
        Some(format!(
            "{}/{}",
            root.agent_path,
            task_cgroup_name(framework_id, task_id)
        ))
    }

    /// Creates a task's cgroup with the limits of its resources (pass what
    /// [`limited_resources`] gives, so omitted dimensions get the defaults), held within the
    /// agent cgroup's caps. The agent's cgroup is made again, with its caps, when it was
    /// removed after its last task. `Ok(None)` when isolation is off; `Err` says what failed
    /// (the task then fails; the agent goes on).
    pub fn create_task_cgroup(
        &self,
        framework_id: &str,
        task_id: &str,
        resources: &Resources,
    ) -> Result<Option<TaskCgroup>, String> {
        self.create_task_cgroup_with_gpus(framework_id, task_id, resources, GpuAccess::Devices(&[]))
    }

    /// As [`Isolation::create_task_cgroup`], with the NVIDIA device rule of a task holding
    /// `gpus` when the v1 devices controller is there.
    pub fn create_task_cgroup_with_gpus(
        &self,
        framework_id: &str,
        task_id: &str,
        resources: &Resources,
        gpus: GpuAccess<'_>,
    ) -> Result<Option<TaskCgroup>, String> {
        let Some(root) = &self.root else {
            return Ok(None);
        };
        let path = format!(
            "{}/{}",
            root.agent_path,
            task_cgroup_name(framework_id, task_id)
        );
        let limits = within(task_limits(resources, self.pids_per_task), &root.caps);
        let task = TaskCgroup::new(root.load(&path), path.clone(), Some(limits))?;
        if task.exists() {
            // Left by an earlier launch of the same task id that was never cleaned up.
            task.kill_all_blocking();
            task.remove()?;
        }
        {
            let _made = agent_cgroup_lock();
            root.ensure_agent_cgroup()?;
            task.cgroup
                .create()
                .map_err(|e| format!("cannot create cgroup {path}: {e}"))?;
        }
        if let Err(e) = task.apply(&limits) {
            let _ = task.remove();
            return Err(e);
        }
        if let (true, GpuAccess::Devices(gpus)) = (root.devices, gpus) {
            if let Err(e) = task.apply_device_rules(gpus) {
                let _ = task.remove();
                return Err(e);
            }
        }
        Ok(Some(task))
    }

    /// The existing cgroup of a task (a task recovered after an agent restart); `None` when
    /// isolation is off or the task has none.
    pub fn existing_task_cgroup(
        &self,
        framework_id: &str,
        task_id: &str,
        resources: &Resources,
    ) -> Option<TaskCgroup> {
        let root = self.root.as_ref()?;
        let path = self.task_cgroup_path(framework_id, task_id)?;
        let cgroup = root.load(&path);
        if !cgroup.exists() {
            return None;
        }
        let limits = within(task_limits(resources, self.pids_per_task), &root.caps);
        TaskCgroup::new(cgroup, path, Some(limits)).ok()
    }

    /// Where the usage counters of a task's cgroup are ([`crate::usage`]); `None` when
    /// isolation is off.
    pub fn task_usage_dirs(&self, framework_id: &str, task_id: &str) -> Option<CgroupDirs> {
        let root = self.root.as_ref()?;
        let cgroup = root.load(&self.task_cgroup_path(framework_id, task_id)?);
        let cpu = if root.v2 {
            cgroup
                .controller_of::<CpuController>()
                .map(|c| c.path().to_path_buf())
        } else {
            cgroup
                .controller_of::<CpuAcctController>()
                .map(|c| c.path().to_path_buf())
        };
        let memory = cgroup
            .controller_of::<MemController>()
            .map(|c| c.path().to_path_buf());
        Some(CgroupDirs {
            v2: root.v2,
            cpu,
            memory,
        })
    }

    /// Removes the agent's own cgroup (`ringmaster/<agent>`) when no task cgroup is left in it
    /// (at shutdown); one still holding task cgroups stays. `ringmaster` itself is kept.
    pub fn remove_agent_cgroup(&self) {
        let Some(root) = &self.root else {
            return;
        };
        let _removing = agent_cgroup_lock();
        if !root.children().is_empty() {
            return;
        }
        if let Err(e) = root.load(&root.agent_path).delete() {
            tracing::debug!(cgroup = %root.agent_path, "agent cgroup not removed: {e}");
        }
    }

    /// Removes every task cgroup under the agent's parent whose name is not in `keep` (cgroups
    /// an earlier run left behind), killing the processes still in them. Blocks (up to a few
    /// seconds per cgroup whose processes do not die); returns how many were removed.
    pub fn clean_stale(&self, keep: &[String]) -> usize {
        let Some(root) = &self.root else {
            return 0;
        };
        let mut removed = 0;
        for name in root.children() {
            if keep.iter().any(|k| k == &name) {
                continue;
            }
            let path = format!("{}/{name}", root.agent_path);
            let Ok(stale) = TaskCgroup::new(root.load(&path), path.clone(), None) else {
                continue;
            };
            let procs = stale.pids().len();
            stale.kill_all_blocking();
            match stale.remove() {
                Ok(()) => {
                    tracing::info!(cgroup = %path, killed = procs,
                        "removed a cgroup left by an earlier run");
                    removed += 1;
                }
                Err(e) => tracing::warn!(cgroup = %path, "cannot remove a stale cgroup: {e}"),
            }
        }
        removed
    }
}

impl CgroupRoot {
    /// Creates `ringmaster/<agent>` with its `caps` and checks, with a probe cgroup, that task
    /// cgroups can be made and limited there.
    fn setup(work_dir: &Path, caps: TaskLimits) -> Result<CgroupRoot, String> {
        let hier = hierarchies::auto();
        let v2 = hier.v2();
        let available: Vec<String> = hier
            .subsystems()
            .iter()
            .map(|s| s.controller_name())
            .collect();
        let wanted: &[&str] = if v2 {
            &["cpu", "memory", "pids"]
        } else {
            &["cpu", "cpuacct", "memory", "pids"]
        };
        for required in ["cpu", "memory", "pids"] {
            if !available.iter().any(|a| a == required) {
                return Err(format!(
                    "the {required} controller is not available (cgroup {}; found: {})",
                    if v2 { "v2" } else { "v1" },
                    if available.is_empty() {
                        "none".to_string()
                    } else {
                        available.join(", ")
                    }
                ));
            }
        }
        let mut controllers: Vec<String> = wanted
            .iter()
            .filter(|w| available.iter().any(|a| a == *w))
            .map(|w| w.to_string())
            .collect();
        let devices = if v2 {
            devices_note_once(
                "cgroup v2: the NVIDIA devices rule is not enforced (v2 controls devices with \
                 eBPF programs, which the agent does not install); a task can open any GPU its \
                 user may (docs/security.md)",
            );
            false
        } else if available.iter().any(|a| a == "devices") {
            controllers.push("devices".into());
            true
        } else {
            devices_note_once(
                "cgroup v1 without the devices controller: the NVIDIA devices rule is not \
                 enforced (docs/security.md)",
            );
            false
        };
        let mut root = CgroupRoot {
            agent_path: format!("{CGROUP_PARENT}/{}", agent_cgroup_name(work_dir)),
            caps,
            controllers,
            v2,
            devices,
        };
        let agent = root.load(&root.agent_path);
        agent
            .create()
            .map_err(|e| format!("cannot create cgroup {}: {e}", root.agent_path))?;
        if let Err(e) = root.apply_caps() {
            // Task cgroups of an earlier run may be in the way (on v1 a parent's CPU quota
            // cannot go below a child's, a memory limit below what is in use): the agent goes
            // on, and the caps are set again when the agent's cgroup is next made.
            if root.children().is_empty() {
                return Err(e);
            }
            tracing::warn!(cgroup = %root.agent_path, "the agent's cgroup keeps its earlier \
                limits while cgroups of an earlier run are in it: {e}");
        }
        let probe_path = format!("{}/{PROBE}", root.agent_path);
        let probe = root.load(&probe_path);
        probe
            .create()
            .map_err(|e| format!("cannot create cgroup {probe_path}: {e}"))?;
        let probe = TaskCgroup::new(probe, probe_path.clone(), None)?;
        let checked = probe.apply(&TaskLimits {
            cpu_quota_us: None,
            cpu_period_us: CFS_PERIOD_US,
            memory_bytes: None,
            pids_max: DEFAULT_PIDS_PER_TASK,
        });
        let devices_checked = if root.devices && checked.is_ok() {
            probe.apply_device_rules(&[])
        } else {
            Ok(())
        };
        // The probe only: the agent's cgroup stays, with its caps.
        let removed = probe
            .cgroup
            .delete()
            .map_err(|e| format!("cannot remove cgroup {probe_path}: {e}"));
        checked?;
        removed?;
        if let Err(e) = devices_checked {
            devices_note_once(&format!(
                "the devices controller is not usable ({e}); the NVIDIA devices rule is not \
                 enforced"
            ));
            root.devices = false;
            root.controllers.retain(|c| c != "devices");
        }
        Ok(root)
    }

    /// Sets the agent cgroup's caps: its memory limit (no swap past it), CPU quota and pids
    /// limit; `None` for memory or cpu lifts that limit (a cap of an earlier run goes away).
    fn apply_caps(&self) -> Result<(), String> {
        let agent = self.load(&self.agent_path);
        set_limits(&agent, &self.agent_path, &self.caps, self.v2)
    }

    /// Makes the agent's cgroup again, with its caps, when it is missing from a hierarchy (it
    /// is removed once its last task cgroup goes). Called with [`agent_cgroup_lock`] held.
    fn ensure_agent_cgroup(&self) -> Result<(), String> {
        let agent = self.load(&self.agent_path);
        if agent
            .subsystems()
            .iter()
            .all(|s| s.to_controller().exists())
        {
            return Ok(());
        }
        agent
            .create()
            .map_err(|e| format!("cannot create cgroup {}: {e}", self.agent_path))?;
        self.apply_caps()
    }

    fn load(&self, path: &str) -> Cgroup {
        Cgroup::load_with_specified_controllers(hierarchies::auto(), path, self.controllers.clone())
    }

    /// Names of the cgroups under the agent's parent, in any hierarchy.
    fn children(&self) -> Vec<String> {
        let agent = self.load(&self.agent_path);
        let mut names: Vec<String> = agent
            .subsystems()
            .iter()
            .filter_map(|s| std::fs::read_dir(s.to_controller().path()).ok())
            .flat_map(|dir| dir.flatten())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().to_str().map(str::to_string))
            .collect();
        names.sort();
        names.dedup();
        names
    }
}

/// One task's cgroup.
#[derive(Debug)]
pub struct TaskCgroup {
    cgroup: Cgroup,
    path: String,
    /// `cgroup.procs` of the cgroup in each hierarchy, ready for the forked child to write.
    procs_files: Vec<CString>,
    limits: Option<TaskLimits>,
}

impl TaskCgroup {
    fn new(cgroup: Cgroup, path: String, limits: Option<TaskLimits>) -> Result<Self, String> {
        let dirs = controller_dirs(&cgroup);
        let procs_files = dirs
            .iter()
            .map(|dir| {
                CString::new(
                    dir.join("cgroup.procs")
                        .into_os_string()
                        .into_encoded_bytes(),
                )
                .map_err(|_| format!("cgroup path {} holds a NUL byte", dir.display()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        if procs_files.is_empty() {
            return Err(format!("cgroup {path} has no controller directories"));
        }
        Ok(TaskCgroup {
            cgroup,
            path,
            procs_files,
            limits,
        })
    }

    /// Relative path in each hierarchy, `ringmaster/<agent>/<task>`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The limits it was created with (`None` for one found at startup and being removed).
    pub fn limits(&self) -> Option<&TaskLimits> {
        self.limits.as_ref()
    }

    /// The `cgroup.procs` files a process writes `0` into to join the cgroup in every
    /// hierarchy (computed before fork: the child must not allocate).
    pub fn procs_files(&self) -> &[CString] {
        &self.procs_files
    }

    fn apply(&self, limits: &TaskLimits) -> Result<(), String> {
        set_limits(&self.cgroup, &self.path, limits, self.cgroup.v2())
    }

    /// Switches the cgroup's devices controller to deny-by-default and allows what
    /// [`device_rules::task_device_rules`] computes from the parent's `devices.list` for a task
    /// holding `gpus`.
    fn apply_device_rules(&self, gpus: &[u32]) -> Result<(), String> {
        let path = &self.path;
        let devices: &DevicesController = self
            .cgroup
            .controller_of()
            .ok_or_else(|| format!("cgroup {path} has no devices controller"))?;
        let parent_list = devices
            .path()
            .parent()
            .map(|p| p.join("devices.list"))
            .ok_or_else(|| format!("cgroup {path} has no parent in the devices hierarchy"))?;
        let parent = std::fs::read_to_string(&parent_list)
            .map_err(|e| format!("cannot read {}: {e}", parent_list.display()))?;
        // Read at every task start: a driver loaded since (nvidia-uvm) counts.
        let proc_devices = std::fs::read_to_string("/proc/devices")
            .map_err(|e| format!("cannot read /proc/devices: {e}"))?;
        let rules = device_rules::task_device_rules(
            &device_rules::parse_list(&parent),
            gpus,
            &proc_devices,
        );
        devices
            .deny_device(DeviceType::All, -1, -1, &DevicePermissions::all())
            .map_err(|e| format!("cannot set the devices rule of cgroup {path}: {e}"))?;
        for rule in &rules {
            allow(devices, rule)
                .map_err(|e| format!("cannot allow `{rule}` in cgroup {path}: {e}"))?;
        }
        Ok(())
    }

    /// The cgroup's `devices.list` (v1 with the devices controller), else `None`.
    pub fn devices_list(&self) -> Option<String> {
        let devices: &DevicesController = self.cgroup.controller_of()?;
        std::fs::read_to_string(devices.path().join("devices.list")).ok()
    }

    /// The processes in the cgroup (any hierarchy).
    pub fn pids(&self) -> Vec<u32> {
        self.cgroup
            .procs()
            .into_iter()
            .filter_map(|p| u32::try_from(p.pid).ok())
            .filter(|&p| p > 0)
            .collect()
    }

    /// True when no process is left in it (or it is gone).
    pub fn is_empty(&self) -> bool {
        self.pids().is_empty()
    }

    /// Sends `signal` to every process in the cgroup, including ones that left the task's
    /// process group (`setsid`). SIGKILL on v2 uses `cgroup.kill` where the kernel has it.
    pub fn signal_all(&self, signal: libc::c_int) {
        if signal == libc::SIGKILL && self.cgroup.v2() && self.cgroup.kill().is_ok() {
            return;
        }
        for pid in self.pids() {
            let Ok(pid) = libc::pid_t::try_from(pid) else {
                continue;
            };
            if pid <= 1 {
                continue;
            }
            // SAFETY: kill has no memory-safety preconditions.
            unsafe { libc::kill(pid, signal) };
        }
    }

    /// SIGKILLs everything in the cgroup until it is empty (up to a few seconds). For startup
    /// cleanup, outside the async runtime's hot path.
    fn kill_all_blocking(&self) {
        let deadline = std::time::Instant::now() + DRAIN_TIMEOUT;
        while !self.is_empty() && std::time::Instant::now() < deadline {
            self.signal_all(libc::SIGKILL);
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Removes the (empty) cgroup from every hierarchy; a cgroup already gone is fine. The
    /// agent's cgroup is removed too once it holds no other task (it is made again with the
    /// next task), so an agent that stops abruptly leaves at most the cgroups of running tasks.
    pub fn remove(&self) -> Result<(), String> {
        if !self.cgroup.exists() {
            return Ok(());
        }
        self.cgroup
            .delete()
            .map_err(|e| format!("cannot remove cgroup {}: {e}", self.path))?;
        let _removing = agent_cgroup_lock();
        for sub in self.cgroup.subsystems() {
            if let Some(agent_dir) = sub.to_controller().path().parent() {
                // Fails (ENOTEMPTY/EBUSY) while other tasks' cgroups are there: fine.
                let _ = std::fs::remove_dir(agent_dir);
            }
        }
        Ok(())
    }

    /// True while the cgroup directory exists in some hierarchy.
    pub fn exists(&self) -> bool {
        self.cgroup.exists()
    }

    /// CPU time used by the cgroup's processes so far (v1: `cpuacct.usage`; v2: `usage_usec`
    /// of `cpu.stat`).
    pub fn cpu_usage(&self) -> Option<Duration> {
        if let Some(acct) = self.cgroup.controller_of::<CpuAcctController>() {
            return Some(Duration::from_nanos(acct.cpuacct().usage));
        }
        let cpu: &CpuController = self.cgroup.controller_of()?;
        cpu.cpu()
            .stat
            .lines()
            .find_map(|l| l.strip_prefix("usage_usec "))
            .and_then(|v| v.trim().parse().ok())
            .map(Duration::from_micros)
    }

    /// How many processes the kernel's OOM killer killed in the cgroup (v2: `oom_kill` of
    /// `memory.events`; v1: `oom_kill` of `memory.oom_control`, on kernels that count it).
    pub fn oom_kills(&self) -> u64 {
        let Some(mem) = self.cgroup.controller_of::<MemController>() else {
            return 0;
        };
        if self.cgroup.v2() {
            return std::fs::read_to_string(mem.path().join("memory.events"))
                .ok()
                .and_then(|text| {
                    text.lines()
                        .find_map(|l| l.strip_prefix("oom_kill "))
                        .and_then(|v| v.trim().parse().ok())
                })
                .unwrap_or(0);
        }
        mem.memory_stat().oom_control.oom_kill
    }

    /// Whether the task ended because it hit its memory limit: it did not exit 0, and the
    /// kernel OOM-killed a process in its cgroup (or, on v1 kernels that do not count OOM
    /// kills, the limit was hit and the task died of SIGKILL, which the agent did not send).
    pub fn hit_memory_limit(&self, outcome: &ExitOutcome) -> bool {
        if self.limits.and_then(|l| l.memory_bytes).is_none() {
            return false;
        }
        if matches!(outcome, ExitOutcome::Code(0)) {
            return false;
        }
        if self.oom_kills() > 0 {
            return true;
        }
        !self.cgroup.v2()
            && matches!(outcome, ExitOutcome::Signal(libc::SIGKILL))
            && self
                .cgroup
                .controller_of::<MemController>()
                .is_some_and(|m| m.memory_stat().fail_cnt > 0)
    }
}

/// Writes one rule to `devices.allow`.
fn allow(devices: &DevicesController, rule: &DeviceRule) -> cgroups_rs::fs::error::Result<()> {
    let kind = match rule.kind {
        'b' => DeviceType::Block,
        'c' => DeviceType::Char,
        _ => DeviceType::All,
    };
    let number = |n: Option<u32>| n.map_or(-1, i64::from);
    let access: Vec<DevicePermissions> = rule
        .access
        .chars()
        .filter_map(DevicePermissions::from_char)
        .collect();
    devices.allow_device(kind, number(rule.major), number(rule.minor), &access)
}

/// A cgroup's directory in each hierarchy it is in (one on v2), sorted, without repeats
/// (v1 mounts `cpu,cpuacct` as one).
fn controller_dirs(cgroup: &Cgroup) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = cgroup
        .subsystems()
        .iter()
        .map(|s| s.to_controller().path().to_path_buf())
        .collect();
    dirs.sort();
    dirs.dedup();
    dirs
}

/// Sets a cgroup's memory limit (no swap past it: memory+swap at the limit on v1, where swap
/// is accounted; no swap on v2), CPU quota and pids limit; `None` for memory or cpu lifts that
/// limit (an earlier one goes away). Kernels without swap accounting lack the swap file: fine.
fn set_limits(cgroup: &Cgroup, path: &str, limits: &TaskLimits, v2: bool) -> Result<(), String> {
    let mem: &MemController = cgroup
        .controller_of()
        .ok_or_else(|| format!("cgroup {path} has no memory controller"))?;
    let cpu: &CpuController = cgroup
        .controller_of()
        .ok_or_else(|| format!("cgroup {path} has no cpu controller"))?;
    let pids: &PidController = cgroup
        .controller_of()
        .ok_or_else(|| format!("cgroup {path} has no pids controller"))?;
    let memory = limits
        .memory_bytes
        .map_or(-1, |b| i64::try_from(b).unwrap_or(i64::MAX));
    if !v2 {
        // v1 keeps memory+swap >= memory: lift it first so the memory limit may rise.
        let _ = mem.set_memswap_limit(-1);
    }
    mem.set_limit(memory)
        .map_err(|e| format!("cannot set the memory limit of cgroup {path}: {e}"))?;
    let swap = match (limits.memory_bytes, v2) {
        (None, true) => Some(-1),
        (None, false) => None,
        (Some(_), true) => Some(0),
        (Some(_), false) => Some(memory),
    };
    if let Some(swap) = swap {
        if let Err(e) = mem.set_memswap_limit(swap) {
            tracing::debug!(cgroup = %path, "swap limit not set (no swap accounting?): {e}");
        }
    }
    let quota = limits
        .cpu_quota_us
        .map_or(-1, |q| i64::try_from(q).unwrap_or(i64::MAX));
    cpu.set_cfs_quota_and_period(Some(quota), Some(limits.cpu_period_us))
        .map_err(|e| format!("cannot set the cpu quota of cgroup {path}: {e}"))?;
    let max = i64::try_from(limits.pids_max).unwrap_or(i64::MAX);
    pids.set_pid_max(MaxValue::Value(max))
        .map_err(|e| format!("cannot set the process limit of cgroup {path}: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::isolation_config::PIDS_PER_TASK_RANGE;

    fn limits(spec: &str) -> TaskLimits {
        task_limits(&Resources::parse(spec).unwrap(), DEFAULT_PIDS_PER_TASK)
    }

    #[test]
    fn cpus_become_a_cfs_quota_per_100ms() {
        assert_eq!(limits("cpus:0.5").cpu_quota_us, Some(50_000));
        assert_eq!(limits("cpus:1").cpu_quota_us, Some(100_000));
        assert_eq!(limits("cpus:2.25").cpu_quota_us, Some(225_000));
        assert_eq!(limits("cpus:0.5").cpu_period_us, 100_000);
        // Below the kernel's minimum of 1 ms: floored there.
        assert_eq!(limits("cpus:0.001").cpu_quota_us, Some(MIN_CFS_QUOTA_US));
        assert_eq!(limits("cpus:0.01").cpu_quota_us, Some(1_000));
        // No cpus asked: no quota.
        assert_eq!(limits("mem:64").cpu_quota_us, None);
        // Absurd amounts stay within what the kernel takes.
        let huge = Resources::parse("cpus:18000000000000").unwrap();
        assert_eq!(
            task_limits(&huge, 16).cpu_quota_us,
            Some(MAX_CFS_QUOTA_US),
            "{huge}"
        );
    }

    #[test]
    fn mem_becomes_a_hard_limit_in_bytes() {
        assert_eq!(limits("mem:32").memory_bytes, Some(32 * 1024 * 1024));
        assert_eq!(limits("mem:0.5").memory_bytes, Some(512 * 1024));
        assert_eq!(limits("cpus:1").memory_bytes, None);
        assert_eq!(limits("cpus:1;mem:0").memory_bytes, None);
    }

    #[test]
    fn every_task_gets_the_pids_limit() {
        assert_eq!(limits("cpus:1").pids_max, DEFAULT_PIDS_PER_TASK);
        assert_eq!(
            task_limits(&Resources::parse("").unwrap(), 64),
            TaskLimits {
                cpu_quota_us: None,
                cpu_period_us: CFS_PERIOD_US,
                memory_bytes: None,
                pids_max: 64
            }
        );
        assert!(PIDS_PER_TASK_RANGE.contains(&DEFAULT_PIDS_PER_TASK));
    }

    fn res(spec: &str) -> Resources {
        Resources::parse(spec).unwrap()
    }

    #[test]
    fn omitted_cpus_and_mem_are_limited_to_the_defaults() {
        let defaults = res("cpus:0.1;mem:32");
        let limited = |spec: &str| limited_resources(&res(spec), Some(&defaults));
        // Named dimensions are the task's own; omitted ones the defaults; others untouched.
        assert_eq!(limited("cpus:2;mem:512"), Ok(res("cpus:2;mem:512")));
        assert_eq!(limited("disk:1"), Ok(res("cpus:0.1;mem:32;disk:1")));
        assert_eq!(limited(""), Ok(res("cpus:0.1;mem:32")));
        assert_eq!(limited("cpus:4;gpus:1"), Ok(res("cpus:4;mem:32;gpus:1")));
        assert_eq!(limited("mem:1024"), Ok(res("cpus:0.1;mem:1024")));
        // Named as 0: the same as omitted.
        assert_eq!(
            limited("cpus:0;mem:0;disk:5"),
            Ok(res("cpus:0.1;mem:32;disk:5"))
        );
        // Their cgroup limits: a 32 MiB memory limit and a 10 ms per 100 ms quota.
        let limits = task_limits(&limited("disk:1").unwrap(), DEFAULT_PIDS_PER_TASK);
        assert_eq!(limits.memory_bytes, Some(32 * 1024 * 1024));
        assert_eq!(limits.cpu_quota_us, Some(10_000));
    }

    #[test]
    fn without_defaults_a_task_that_omits_cpus_or_mem_is_refused() {
        assert_eq!(
            limited_resources(&res("cpus:1;disk:1"), None),
            Err("the task names no mem and this agent gives no default \
                 (--default-task-resources none)"
                .to_string())
        );
        assert_eq!(
            limited_resources(&res("mem:64"), None),
            Err("the task names no cpus and this agent gives no default \
                 (--default-task-resources none)"
                .to_string())
        );
        assert_eq!(
            limited_resources(&res("disk:1"), None),
            Err(
                "the task names no cpus or mem and this agent gives no default \
                 (--default-task-resources none)"
                    .to_string()
            )
        );
        assert_eq!(
            limited_resources(&res("cpus:1;mem:64"), None),
            Ok(res("cpus:1;mem:64"))
        );
        // Defaults that lack a dimension (the flag refuses those; a caller may build them).
        assert_eq!(
            limited_resources(&res("cpus:1"), Some(&res("cpus:0.1"))),
            Err(
                "the task names no mem and this agent gives no default for it \
                 (--default-task-resources cpus:0.1)"
                    .to_string()
            )
        );
    }

    #[test]
    fn the_agent_cgroup_is_limited_to_what_the_agent_offers() {
        let caps = agent_limits(Some(&res("cpus:2.5;mem:1024;disk:100;gpus:1")), 500);
        assert_eq!(
            caps,
            TaskLimits {
                cpu_quota_us: Some(250_000),
                cpu_period_us: CFS_PERIOD_US,
                memory_bytes: Some(1024 * 1024 * 1024),
                pids_max: 500,
            }
        );
        // Nothing offered of a dimension (or no caps at all): no limit there; pids always.
        assert_eq!(
            agent_limits(Some(&res("mem:64")), 64),
            TaskLimits {
                cpu_quota_us: None,
                cpu_period_us: CFS_PERIOD_US,
                memory_bytes: Some(64 * 1024 * 1024),
                pids_max: 64,
            }
        );
        assert_eq!(agent_limits(None, 100), task_limits(&Resources::new(), 100));
        assert_eq!(
            describe_limits(&caps),
            "cpus 2.5 (quota 250000 us per 100000 us), mem 1024 MiB, 500 processes"
        );
        assert_eq!(
            describe_limits(&agent_limits(None, 100)),
            "cpus unlimited, mem unlimited, 100 processes"
        );
    }

    #[test]
    fn task_limits_stay_within_the_agent_caps() {
        let caps = agent_limits(Some(&res("cpus:1;mem:100")), 1000);
        let big = task_limits(&res("cpus:4;mem:4096"), 4096);
        assert_eq!(
            within(big, &caps),
            TaskLimits {
                cpu_quota_us: Some(100_000),
                cpu_period_us: CFS_PERIOD_US,
                memory_bytes: Some(100 * 1024 * 1024),
                pids_max: 1000,
            }
        );
        let small = task_limits(&res("cpus:0.5;mem:32"), 16);
        assert_eq!(within(small, &caps), small);
        // No limit of the task's own stays none (the parent bounds it).
        let none = task_limits(&Resources::new(), 16);
        assert_eq!(within(none, &caps), none);
        assert_eq!(within(big, &agent_limits(None, 8192)), big);
    }

    #[test]
    fn task_cgroup_names_are_single_safe_components() {
        assert_eq!(task_cgroup_name("fw", "t1"), "fw+t1");
        assert_eq!(task_cgroup_name("a/b", ".."), "a%2Fb+%2E.");
        // `+` inside an id is escaped, so the split is unambiguous.
        assert_ne!(task_cgroup_name("a+b", "c"), task_cgroup_name("a", "b+c"));
        for name in [
            task_cgroup_name("", ""),
            task_cgroup_name("fw", "tasks"),
            task_cgroup_name("cgroup.procs", "x"),
        ] {
            assert!(name.contains('+') && !name.contains('/'), "{name}");
            assert!(!name.starts_with('.'), "{name}");
        }
        let long = "x".repeat(500);
        let a = task_cgroup_name("fw", &long);
        let b = task_cgroup_name("fw", &format!("{long}y"));
        assert!(a.len() <= 200, "{}", a.len());
        assert_ne!(a, b);
    }

    #[test]
    fn agent_cgroup_names_follow_the_work_dir() {
        let a = agent_cgroup_name(Path::new("/var/lib/ringmaster agent"));
        assert!(a.starts_with("ringmaster_agent-"), "{a}");
        assert_eq!(a, agent_cgroup_name(Path::new("/var/lib/ringmaster agent")));
        assert_ne!(a, agent_cgroup_name(Path::new("/srv/ringmaster agent")));
        let hidden = agent_cgroup_name(Path::new("/x/.work"));
        assert!(hidden.starts_with("work-"), "{hidden}");
        assert!(agent_cgroup_name(Path::new("/")).starts_with("agent-"));
    }

    #[test]
    fn disabled_isolation_makes_no_cgroups() {
        let iso = Isolation::disabled();
        assert!(!iso.enabled());
        let r = Resources::parse("cpus:1;mem:64").unwrap();
        assert!(iso.create_task_cgroup("fw", "t", &r).unwrap().is_none());
        assert!(iso.existing_task_cgroup("fw", "t", &r).is_none());
        assert_eq!(iso.clean_stale(&[]), 0);
        let none = Isolation::setup(
            &IsolationConfig {
                mode: IsolationMode::None,
                pids_per_task: 64,
                max_task_pids: 64,
            },
            Path::new("/nonexistent"),
        )
        .unwrap();
        assert!(!none.enabled());
        assert_eq!(none.describe(), "none (process groups only)");
    }
}
