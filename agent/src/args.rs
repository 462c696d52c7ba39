//! The agent's command-line flags ([`AgentArgs`]), as given: nothing checked yet.

use std::path::PathBuf;

/// The agent's command-line flags. Every flag but `--config` is also a key of the config file
/// (snake_case, [`crate::config_file`]); a flag given on the command line wins over the file.
/// Flags with a default are `Option`s here so that "not given" can be told from "given as the
/// default"; the defaults are applied after the file is merged ([`AgentArgs::load`], in
/// [`crate::config_file`]).
#[derive(Debug, Clone, Default, clap::Parser)]
#[command(
    name = "ringmaster-agent",
    version,
    about = "Ringmaster agent: registers this machine with the master and runs its tasks"
)]
pub struct AgentArgs {
    /// Read settings from this YAML file (keys as the flags, snake_case: `kill_grace: 5s`);
    /// flags given here override it. Unknown keys and bad values stop the agent with
    /// `FILE:LINE: KEY: MESSAGE`. See docs/operations.md.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address of the master, `HOST:PORT`, or of every master of a replicated cluster,
    /// `a:5050,b:5050,c:5050` (or `RINGMASTER_MASTER`, or `master:` in the config file): the
    /// agent registers with whichever leads, following `NOT_LEADER`. Required.
    #[arg(long, value_name = "ADDR", env = "RINGMASTER_MASTER")]
    pub master: Option<String>,
    /// Agent id to register with. Default: the id saved in `<work-dir>/agent_id` by an earlier
    /// run, else one assigned by the master.
    #[arg(long, value_name = "NAME")]
    pub id: Option<String>,
    /// Resources to offer, Mesos text (`cpus:4;mem:8192;disk:10240`, mem and disk in MiB).
    /// Each dimension given replaces the detected amount (`disk:0` drops disk); dimensions not
    /// given are detected (cpus, mem, free disk of the work dir, NVIDIA GPUs by nvidia-smi).
    /// GPUs as devices: `gpus:2x16384` (two 16 GiB GPUs), `gpus:2x16384@V100M16+1x32768@A100`;
    /// they replace detected GPUs (`gpus:0` drops them). See docs/devices.md.
    #[arg(long, value_name = "SPEC")]
    pub resources: Option<String>,
    /// Resource names beyond the standard ones (cpus, mem, disk, gpus, gpu_milli, gpu_mem)
    /// that `--resources` may offer, comma-separated (`--custom-resources fpgas,licenses`).
    /// Any other name in `--resources` is refused, so a typo (`cpu:4`) is not a new resource.
    #[arg(long, value_name = "NAME,NAME", value_delimiter = ',')]
    pub custom_resources: Vec<String>,
    /// How a GPU slice picks its device: `least-used` (spread) or `most-used-that-fits` (pack).
    /// Used when the master sends no binding of its own.
    /// Default: least-used.
    #[arg(long, value_name = "POLICY")]
    pub device_selection: Option<String>,
    /// Attributes of this agent, `key:value;key:value` (e.g. `partition:gpu;rack:r1`).
    #[arg(long, value_name = "SPEC")]
    pub attributes: Option<String>,
    /// Directory for task sandboxes and the saved agent id; created if missing. Default:
    /// `/var/lib/ringmaster-agent` as root, else `$XDG_STATE_HOME/ringmaster-agent`, else
    /// `$HOME/.local/state/ringmaster-agent`, else `<temp dir>/ringmaster-agent-<uid>`.
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// Hostname to report. Default: this machine's hostname.
    #[arg(long, value_name = "H")]
    pub hostname: Option<String>,
    /// Connect over TLS, trusting the master certificate's CA in this PEM file.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for a master that requires mutual TLS; needs --tls-key.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Principal to authenticate as (needs --secret-file); see docs/security.md.
    #[arg(long, value_name = "NAME")]
    pub principal: Option<String>,
    /// File holding the principal's shared secret (one trailing newline is ignored).
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// The Unix user tasks run as when they name none (`TaskInfo.user`). Default: `nobody`
    /// when the agent runs as root, else the agent's own user. See docs/security.md.
    #[arg(long, value_name = "NAME")]
    pub task_user: Option<String>,
    /// Let tasks run as root (uid 0); without it a task whose user is root fails.
    #[arg(long)]
    pub allow_root_tasks: bool,
    /// How tasks are isolated: `auto` (cgroups when the agent runs as root and the cgroup
    /// hierarchy is writable, else none with a warning), `cgroups` (each task in its own cgroup
    /// with cpu, memory and process limits; the agent does not start without them) or `none`
    /// (process groups only). Default: auto. See docs/security.md.
    #[arg(long, value_name = "LEVEL")]
    pub isolation: Option<String>,
    /// With cgroups: the most processes (and threads) one task may have at once (16 - 4194304;
    /// default 4096; held to at most --max-task-pids).
    #[arg(long, value_name = "N")]
    pub pids_per_task: Option<u64>,
    /// With cgroups: the most processes (and threads) all tasks together may have at once, the
    /// pids limit of the agent's cgroup (64 - 4194304; default: half of
    /// /proc/sys/kernel/pid_max).
    #[arg(long, value_name = "N")]
    pub max_task_pids: Option<u64>,
    /// The cpus and mem a task that names none is limited to (`cpus:0.1;mem:32`, mem in MiB;
    /// only cpus and mem, both more than 0), or `none`: tasks that omit cpus or mem are
    /// refused. Limits only: nothing is deducted from what the agent offers. Default:
    /// cpus:0.1;mem:32.
    #[arg(long, value_name = "SPEC")]
    pub default_task_resources: Option<String>,
    /// How long an ended task's sandbox is kept once its final status was acknowledged:
    /// `0s` (collect at once) - `720h` (30 days); default 1h.
    #[arg(long, value_name = "DURATION")]
    pub sandbox_gc_delay: Option<String>,
    /// Above this fraction of the work dir's file system in use, ended tasks' sandboxes are
    /// collected at once, oldest first: more than 0, at most 1; default 0.9.
    #[arg(long, value_name = "FRACTION")]
    pub disk_watermark: Option<f64>,
    /// Grace between SIGTERM and SIGKILL when a task is killed, unless the task sets its own
    /// (`TaskInfo.kill_grace_ms`): `500ms`, `3s`, `2m`, `1h` (100ms - 1 day; default 3s).
    #[arg(long, value_name = "DURATION")]
    pub kill_grace: Option<String>,
    /// How often the agent samples each running task's cpu and memory use and reports it to
    /// the master (`UsageReport`): `1s` - `1h`, default 10s. See docs/operations.md.
    #[arg(long, value_name = "DURATION")]
    pub usage_interval: Option<String>,
    /// How tasks holding part of a GPU share it: `none` (by convention, no limits) or `mps`
    /// (NVIDIA MPS: a slice gets a compute percentage and a device memory limit). Default:
    /// none. See docs/devices.md.
    #[arg(long, value_name = "MODE")]
    pub gpu_sharing: Option<String>,
    /// The MPS control daemon's pipe directory (`CUDA_MPS_PIPE_DIRECTORY`), absolute. Default:
    /// /tmp/nvidia-mps.
    #[arg(long, value_name = "DIR")]
    pub mps_pipe_dir: Option<PathBuf>,
    /// With `--gpu-sharing mps`: start `nvidia-cuda-mps-control -d` when a GPU slice task finds
    /// the daemon not running (else such a task fails).
    #[arg(long)]
    pub mps_start: bool,
}

impl AgentArgs {
    /// `self` (the command line) over `file`: a value given in `self` wins; a switch is on when
    /// either turns it on; a list given in `self` replaces the file's.
    pub fn over(self, file: AgentArgs) -> AgentArgs {
        AgentArgs {
            config: self.config.or(file.config),
            master: self.master.or(file.master),
            id: self.id.or(file.id),
            resources: self.resources.or(file.resources),
            custom_resources: if self.custom_resources.is_empty() {
                file.custom_resources
            } else {
                self.custom_resources
            },
            device_selection: self.device_selection.or(file.device_selection),
            attributes: self.attributes.or(file.attributes),
            work_dir: self.work_dir.or(file.work_dir),
            hostname: self.hostname.or(file.hostname),
            tls_ca: self.tls_ca.or(file.tls_ca),
            tls_cert: self.tls_cert.or(file.tls_cert),
            tls_key: self.tls_key.or(file.tls_key),
            principal: self.principal.or(file.principal),
            secret_file: self.secret_file.or(file.secret_file),
            task_user: self.task_user.or(file.task_user),
            allow_root_tasks: self.allow_root_tasks || file.allow_root_tasks,
            isolation: self.isolation.or(file.isolation),
            pids_per_task: self.pids_per_task.or(file.pids_per_task),
            max_task_pids: self.max_task_pids.or(file.max_task_pids),
            default_task_resources: self.default_task_resources.or(file.default_task_resources),
            sandbox_gc_delay: self.sandbox_gc_delay.or(file.sandbox_gc_delay),
            disk_watermark: self.disk_watermark.or(file.disk_watermark),
            kill_grace: self.kill_grace.or(file.kill_grace),
            usage_interval: self.usage_interval.or(file.usage_interval),
            gpu_sharing: self.gpu_sharing.or(file.gpu_sharing),
            mps_pipe_dir: self.mps_pipe_dir.or(file.mps_pipe_dir),
            mps_start: self.mps_start || file.mps_start,
        }
    }
}
