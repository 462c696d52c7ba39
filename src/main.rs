//! The `ringmaster` command: the master (`serve`), local mode (`local`), the dry-run
//! placement tool (`place`), the operator view (`status`), the trace-driven simulator
//! (`sim`), development TLS certificates (`certs`) and HTTP API tokens (`token`). Thin: parse arguments, call the library, print, set the exit code.
//!
//! Exit codes: 0 success; 1 a runtime failure; 2 bad input (arguments, config or scenario),
//! with one line on stderr naming the file, line and field.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use ringmaster::config::Config;
use ringmaster::master::http::http_address;
use ringmaster::status::StatusView;
use ringmaster_core::placement::PlacerKind;
use ringmaster_proto::resources::Resources;

/// jemalloc rather than the system allocator: glibc's malloc kept the master's RSS near its
/// peak long after a load had ended (arenas it does not trim); jemalloc gives freed memory back.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read once at its start (`_RJEM_MALLOC_CONF` in the environment still
/// overrides them): one arena, as the master's state lives on one actor thread and more arenas
/// only strand freed memory; freed pages go back to the system after 1 s instead of 10, by a
/// background thread. Measured at 10,000 agents and 100 frameworks: a peak RSS about 50 MB lower
/// and the memory back at its baseline after the load (docs/benchmarks.md, "Memory at scale").
#[used]
#[export_name = "_rjem_malloc_conf"]
static MALLOC_CONF: MallocConf =
    MallocConf(c"narenas:1,dirty_decay_ms:1000,muzzy_decay_ms:0,background_thread:true".as_ptr());

/// A C string pointer jemalloc reads as `const char *malloc_conf`.
#[repr(transparent)]
struct MallocConf(*const std::ffi::c_char);
// SAFETY: points at an immutable static byte string; nothing ever writes through it.
unsafe impl Sync for MallocConf {}

#[derive(Debug, Parser)]
#[command(name = "ringmaster", version, about = "Ringmaster cluster manager")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the master.
    Serve {
        /// Address for agents and frameworks.
        #[arg(long, default_value = "127.0.0.1:5050")]
        listen: String,
        /// YAML config file (placer, rings, master timers).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Address for HTTP (state, metrics, dashboard), or `none`. Default: the --listen host
        /// with the port plus one.
        #[arg(long, value_name = "ADDR|none")]
        http: Option<String>,
        /// Directory of the durable registry (`registry.redb`): the master recovers its
        /// frameworks, agents and tasks from it after a restart. Without it, nothing survives
        /// a restart.
        #[arg(long, value_name = "DIR")]
        work_dir: Option<PathBuf>,
    },
    /// Run a master and N agents in one process on loopback (like mesos-local).
    Local {
        /// Number of agents.
        #[arg(long, default_value_t = 3)]
        agents: usize,
        /// Resources of each agent.
        #[arg(long, default_value = "cpus:4;mem:8192;disk:10240", value_parser = parse_resources)]
        agent_resources: Resources,
        /// Address for agents and frameworks.
        #[arg(long, default_value = "127.0.0.1:5050")]
        listen: String,
        /// Also run two example frameworks to completion and print what happened.
        #[arg(long)]
        demo: bool,
        /// With --demo: keep the cluster up after the demo (the dashboard stays open) until
        /// Ctrl-C or SIGTERM.
        #[arg(long, requires = "demo")]
        hold: bool,
        /// YAML config file (placer, rings, master timers).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Where the agents keep their sandboxes and the master its registry (`DIR/master`);
        /// default: a temporary directory and an in-memory master.
        #[arg(long, value_name = "DIR")]
        work_dir: Option<PathBuf>,
        /// Address for HTTP (state, metrics, dashboard), or `none`. Default: the --listen host
        /// with the port plus one.
        #[arg(long, value_name = "ADDR|none")]
        http: Option<String>,
    },
    /// Jobs: services and batch jobs from spec files, run by the master (docs/jobs.md).
    Job {
        #[command(subcommand)]
        command: JobCommand,
    },
    /// Replicated masters: list, add or remove masters of the group, or seed a new group from
    /// a single master's work dir (docs/operations.md).
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// Show a running master's state as tables (from its HTTP `/state`).
    Status {
        #[command(flatten)]
        master: MasterAddr,
        /// What to show.
        #[arg(value_enum, default_value_t = StatusView::Summary)]
        view: StatusView,
        /// Print JSON (the view's part of /state) instead of tables.
        #[arg(long)]
        json: bool,
    },
    /// Dry-run placement: where would a scenario's requests go? One JSON object per line.
    Place(PlaceArgs),
    /// Trace-driven simulation: compare placement policies on a real trace (see docs/simulator.md).
    Sim(SimArgs),
    /// Print a bearer token for the master's HTTP API (`Authorization: Bearer TOKEN`), made
    /// from the principal's secret; the master checks it with the same secret
    /// (docs/security.md, "HTTP API").
    Token {
        /// The principal (a name under `auth.principals` in the master's config).
        #[arg(long, value_name = "NAME")]
        principal: String,
        /// The file holding the principal's secret.
        #[arg(long, value_name = "FILE")]
        secret_file: PathBuf,
        /// How long the token is valid (`30m`, `1h`, `7d`).
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
        ttl: std::time::Duration,
    },
    /// Write a development CA, a master certificate and client certificates for TLS
    /// (see docs/security.md). Keys are written with mode 0600.
    Certs {
        /// Directory to write into (created if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// Extra name (DNS name or IP address) of the master, beyond localhost, 127.0.0.1
        /// and ::1; repeatable.
        #[arg(long, value_name = "NAME")]
        san: Vec<String>,
        /// Also write a client certificate for mutual TLS with this name; repeatable.
        #[arg(long, value_name = "NAME")]
        client: Vec<String>,
        /// Overwrite files that already exist.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Debug, Args)]
struct SimArgs {
    /// Node list (openb `sn,cpu_milli,memory_mib,gpu,model` or the generic format), CSV or YAML.
    #[arg(long, value_name = "NODES.csv")]
    nodes: PathBuf,
    /// Task list (openb pod list or the generic format), CSV or YAML.
    #[arg(long, value_name = "TASKS.csv")]
    tasks: PathBuf,
    /// Master config YAML: its rings lay out the allocator's buckets.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Policies, comma-separated, or `all`: Ringmaster's placers (ring, first-fit, …) and
    /// random, dot-product, gpu-clustering, gpu-packing, best-fit, fgd, fgd-exact.
    #[arg(long, value_name = "P[,P2,…]", default_value = "all")]
    placer: String,
    /// replay: the trace's arrivals and departures; fill: the ATC'23 paper's protocol.
    #[arg(long, value_enum, default_value_t = SimMode::Fill)]
    mode: SimMode,
    /// fill: number of seeds (42, 43, …).
    #[arg(long, default_value_t = 10)]
    seeds: u32,
    /// fill: stop when this percent of GPU capacity has arrived.
    #[arg(long, default_value_t = ringmaster::sim::fill::DEFAULT_INFLATION_PCT)]
    inflation: u32,
    /// Directory for JSON, CSV and PNG/SVG plots (created if missing).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// How the paper's policies break exact score ties: first (lowest node index, like
    /// Ringmaster's placers and the paper's simulator, which takes the smallest node name) or
    /// random (seeded, like the stock Kubernetes scheduler).
    #[arg(long, value_enum, default_value_t = SimTies::First)]
    ties: SimTies,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
    /// Run on a workload mix made from --tasks: `sharing=40`, `multi=50`, `cpu=20` (percent of
    /// tasks), `spec=33` (percent of GPU tasks given a GPU model), `seed=N`, comma-separated, or
    /// a preset: default, sharing40, sharing100, multi50, spec33. Several mixes separated by `;`
    /// or with repeated flags; each mix's files go into --out/MIX/ (see docs/simulator.md).
    #[arg(long, value_name = "SPEC")]
    mix: Vec<String>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum SimTies {
    First,
    Random,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum SimMode {
    Replay,
    Fill,
}

#[derive(Debug, Args)]
struct PlaceArgs {
    /// Scenario YAML: agents, frameworks, requests (and optionally rings).
    #[arg(long, value_name = "FILE")]
    scenario: PathBuf,
    /// Master config YAML (placer and rings); defaults apply without it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Placer overriding the config's: ring, linear-best-fit, first-fit, balance,
    /// least-requested or most-balanced.
    #[arg(long, value_name = "NAME")]
    placer: Option<PlacerKind>,
}

/// Exit code for input the user must fix (same as clap's usage errors).
const BAD_INPUT: u8 = 2;

fn parse_resources(text: &str) -> Result<Resources, String> {
    Resources::parse(text).map_err(|e| e.to_string())
}

fn load_config(path: Option<&PathBuf>) -> Result<Config, String> {
    match path {
        Some(path) => Config::load(path).map_err(|e| e.to_string()),
        None => Ok(Config::default()),
    }
}

fn init_logging(default: &str) {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // openraft repeats its complaints about an unreachable master several times a second:
    // one line per peer and call site every 30 s (ringmaster::log_limit).
    let limit = ringmaster::log_limit::RepeatLimit::new(ringmaster::log_limit::RAFT_REPEAT_EVERY);
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal())
                .with_filter(filter)
                .with_filter(limit),
        )
        .init();
}

/// `--master` of the client commands (`status`, `job`).
#[derive(Debug, Args)]
struct MasterAddr {
    /// The master's address: its protocol port (`--listen`), which serves HTTP too, or its
    /// `--http` port (the only one, HTTPS, for a master with `tls:`; give --tls-ca). With
    /// replicated masters, all of them: `a:5050,b:5050,c:5050` (asked in turn; a follower's
    /// 503 names the leader, which is asked next).
    #[arg(
        long = "master",
        value_name = "ADDR",
        env = "RINGMASTER_MASTER",
        default_value = "127.0.0.1:5050"
    )]
    addr: String,
    /// Authenticate to the master's HTTP API as this principal (with --secret-file; each
    /// request carries a short-lived token made from the secret, docs/security.md).
    #[arg(
        long,
        value_name = "NAME",
        env = "RINGMASTER_PRINCIPAL",
        requires = "secret_file"
    )]
    principal: Option<String>,
    /// The file holding the principal's secret.
    #[arg(
        long,
        value_name = "FILE",
        env = "RINGMASTER_SECRET_FILE",
        requires = "principal"
    )]
    secret_file: Option<PathBuf>,
    /// Speak HTTPS to a master with `tls:` (its --http port), trusting the CA certificate(s)
    /// in this PEM file; bare HOST:PORT entries of --master are then https://.
    #[arg(long, value_name = "FILE", env = "RINGMASTER_TLS_CA")]
    tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for a master that requires mutual TLS (`tls.client_ca`);
    /// needs --tls-key and --tls-ca.
    #[arg(
        long,
        value_name = "FILE",
        env = "RINGMASTER_TLS_CERT",
        requires = "tls_key",
        requires = "tls_ca"
    )]
    tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(
        long,
        value_name = "FILE",
        env = "RINGMASTER_TLS_KEY",
        requires = "tls_cert"
    )]
    tls_key: Option<PathBuf>,
}

impl MasterAddr {
    /// Makes this process's HTTP requests authenticate as `--principal`, when given, and speak
    /// HTTPS trusting `--tls-ca`, when given (exit code 2 for a bad name or file).
    fn use_credential(&self) -> Result<(), ringmaster::jobs::cli::CliError> {
        if let Some(ca) = &self.tls_ca {
            let identity = self.tls_cert.as_deref().zip(self.tls_key.as_deref());
            ringmaster::leader_http::use_tls(ca, identity)
                .map_err(|message| ringmaster::jobs::cli::CliError { message, code: 2 })?;
        }
        match (&self.principal, &self.secret_file) {
            (Some(principal), Some(file)) => ringmaster::jobs::cli::use_credential(principal, file),
            _ => Ok(()),
        }
    }
}

/// `ringmaster cluster ...`; `--master` lists the masters, as for `ringmaster status`: the
/// request goes to the leader.
#[derive(Debug, Subcommand)]
enum ClusterCommand {
    /// Show the group's masters: voters, learners, the leader.
    Members {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        master: MasterAddr,
    },
    /// Add a master (started with `cluster.join: true`): it catches up, then votes.
    Add {
        /// The new master's id (`cluster.id` in its config).
        #[arg(long)]
        id: u64,
        /// The new master's protocol address (its `--listen`), HOST:PORT.
        #[arg(long, value_name = "HOST:PORT")]
        address: String,
        #[command(flatten)]
        master: MasterAddr,
    },
    /// Remove a master from the group (then stop it).
    Remove {
        /// The master's id.
        #[arg(long)]
        id: u64,
        #[command(flatten)]
        master: MasterAddr,
    },
    /// Offline, in place: make a stopped single master's work dir the first master's of a new
    /// group, its registry the group's first snapshot (docs/operations.md, "From one master
    /// to three").
    Init {
        /// The single master's work dir (`serve --work-dir`); no master may run on it.
        #[arg(long, value_name = "WORK_DIR")]
        from: PathBuf,
        /// The config the master on WORK_DIR will run with in the group (`cluster:` with its
        /// id and every master in `peers`).
        #[arg(long, value_name = "GROUP.yaml")]
        config: PathBuf,
    },
}

fn cluster_command(command: ClusterCommand) -> ExitCode {
    use ringmaster::cluster_cli;
    let master = match &command {
        ClusterCommand::Members { master, .. }
        | ClusterCommand::Add { master, .. }
        | ClusterCommand::Remove { master, .. } => master,
        ClusterCommand::Init { from, config } => {
            return match cluster_cli::init(from, config) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {}", e.message);
                    ExitCode::from(e.code)
                }
            };
        }
    };
    if let Err(e) = master.use_credential() {
        eprintln!("error: {}", e.message);
        return ExitCode::from(e.code);
    }
    let result = match &command {
        ClusterCommand::Members { json, master } => cluster_cli::members(&master.addr, *json),
        ClusterCommand::Add {
            id,
            address,
            master,
        } => cluster_cli::add(&master.addr, *id, address),
        ClusterCommand::Remove { id, master } => cluster_cli::remove(&master.addr, *id),
        ClusterCommand::Init { .. } => unreachable!("handled above"),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", e.message);
            ExitCode::from(e.code)
        }
    }
}

/// `ringmaster job ...`; `--master` is the master's address, as for `ringmaster status`.
#[derive(Debug, Subcommand)]
enum JobCommand {
    /// Create or update a job from a spec file (an update replaces instances one at a time).
    Run {
        /// The job spec (YAML, docs/jobs.md).
        file: String,
        /// For a batch job: wait until it is done; exit 0 iff every instance succeeded.
        #[arg(long)]
        wait: bool,
        #[command(flatten)]
        master: MasterAddr,
    },
    /// Show jobs and their instances (state, agent, restarts, last exit code).
    Status {
        /// One job; default: every job.
        name: Option<String>,
        /// Print JSON instead of tables.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        master: MasterAddr,
    },
    /// Stop a job: SIGTERM to its tasks, SIGKILL after its kill grace.
    Stop {
        name: String,
        /// Also forget the job.
        #[arg(long)]
        purge: bool,
        #[command(flatten)]
        master: MasterAddr,
    },
    /// Dry run: where each instance would go now, or why it cannot be placed (nothing is
    /// launched). Exit 0 iff every instance would be placed.
    Plan {
        /// The job spec (YAML, docs/jobs.md).
        file: String,
        #[command(flatten)]
        master: MasterAddr,
    },
    /// Print an instance's stdout (or stderr) as its agent has it; --follow keeps printing
    /// what it writes until its task ends (following the instance to a new task).
    Logs {
        name: String,
        /// The instance number.
        #[arg(long, default_value_t = 0)]
        instance: u32,
        /// Print stderr instead of stdout.
        #[arg(long)]
        stderr: bool,
        /// Keep printing new output until the task has ended and all of it is printed.
        #[arg(long)]
        follow: bool,
        #[command(flatten)]
        master: MasterAddr,
    },
    /// Set a job's instance count.
    Scale {
        name: String,
        count: u32,
        #[command(flatten)]
        master: MasterAddr,
    },
}

fn job_command(command: JobCommand) -> ExitCode {
    use ringmaster::jobs::cli;
    let (JobCommand::Run { master, .. }
    | JobCommand::Status { master, .. }
    | JobCommand::Stop { master, .. }
    | JobCommand::Plan { master, .. }
    | JobCommand::Logs { master, .. }
    | JobCommand::Scale { master, .. }) = &command;
    if let Err(e) = master.use_credential() {
        eprintln!("error: {}", e.message);
        return ExitCode::from(e.code);
    }
    let result = match &command {
        JobCommand::Run { file, wait, master } => cli::run(&master.addr, file, *wait),
        JobCommand::Status { name, json, master } => {
            cli::status(&master.addr, name.as_deref(), *json)
        }
        JobCommand::Stop {
            name,
            purge,
            master,
        } => cli::stop(&master.addr, name, *purge),
        JobCommand::Plan { file, master } => cli::plan(&master.addr, file),
        JobCommand::Logs {
            name,
            instance,
            stderr,
            follow,
            master,
        } => ringmaster::jobs::logs::logs(&master.addr, name, *instance, *stderr, *follow),
        JobCommand::Scale {
            name,
            count,
            master,
        } => cli::scale(&master.addr, name, *count),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", e.message);
            ExitCode::from(e.code)
        }
    }
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve {
            listen,
            config,
            http,
            work_dir,
        } => {
            let config = match load_config(config.as_ref()) {
                Ok(c) => c,
                Err(e) => return bad_input(&e),
            };
            let http = match http_address(&listen, http.as_deref()) {
                Ok(h) => h,
                Err(e) => return bad_input(&e),
            };
            init_logging("info");
            let result = runtime().map_err(anyhow::Error::from).and_then(|rt| {
                rt.block_on(async {
                    let master = ringmaster::master::Master::start_durable(
                        &listen,
                        http.as_deref(),
                        config,
                        work_dir.clone(),
                    )
                    .await?;
                    if let Err(e) = master.start_jobs().await {
                        tracing::warn!("{e}");
                    }
                    tokio::select! {
                        _ = shutdown_signal() => {}
                        _ = master.stopped() => {
                            master.wait().await;
                            anyhow::bail!("the master stopped on its own (see the log above)");
                        }
                    }
                    tracing::info!("shutting down");
                    master.shutdown().await;
                    Ok(())
                })
            });
            finish(result)
        }
        Command::Local {
            agents,
            agent_resources,
            listen,
            demo,
            hold,
            config,
            work_dir,
            http,
        } => {
            let config = match load_config(config.as_ref()) {
                Ok(c) => c,
                Err(e) => return bad_input(&e),
            };
            let http = match http_address(&listen, http.as_deref()) {
                Ok(h) => h,
                Err(e) => return bad_input(&e),
            };
            init_logging(if demo { "error" } else { "info" });
            let options = ringmaster::local::LocalOptions {
                listen,
                http,
                agents,
                agent_resources,
                demo,
                config,
                work_dir,
            };
            let after_demo = if hold {
                ringmaster::local::AfterDemo::Hold
            } else {
                ringmaster::local::AfterDemo::Exit
            };
            let result = runtime()
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(ringmaster::local::run(options, after_demo)));
            finish(result)
        }
        Command::Job { command } => job_command(command),
        Command::Cluster { command } => cluster_command(command),
        Command::Status {
            master: address,
            view,
            json,
        } => {
            if let Err(e) = address.use_credential() {
                eprintln!("error: {}", e.message);
                return ExitCode::from(e.code);
            }
            let master = address.addr;
            let snapshot = match ringmaster::status::fetch(&master) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("error: {e}");
                    return ExitCode::from(1);
                }
            };
            let text = if json {
                ringmaster::status::to_json(view, &snapshot) + "\n"
            } else {
                ringmaster::status::render(view, &snapshot, &master)
            };
            // stdout closed (e.g. piped into head): nothing more to say.
            let _ = std::io::stdout().lock().write_all(text.as_bytes());
            ExitCode::SUCCESS
        }
        Command::Sim(args) => sim(args),
        Command::Token {
            principal,
            secret_file,
            ttl,
        } => token(&principal, &secret_file, ttl),
        Command::Certs {
            out,
            san,
            client,
            force,
        } => match ringmaster::certs::write_dev_certs(&out, &san, &client, force) {
            Ok(written) => {
                for file in written {
                    println!("wrote {}  ({})", file.path.display(), file.what);
                }
                println!(
                    "development certificates only: use your own CA in production (docs/security.md)"
                );
                ExitCode::SUCCESS
            }
            Err(e) => bad_input(&format!("{e:#}")),
        },
        Command::Place(args) => {
            match ringmaster::dry_run::place(&args.scenario, args.config.as_deref(), args.placer) {
                Ok(lines) => {
                    let mut out = std::io::stdout().lock();
                    for line in lines {
                        if writeln!(out, "{line}").is_err() {
                            break; // stdout closed (e.g. piped into head): nothing more to say
                        }
                    }
                    ExitCode::SUCCESS
                }
                Err(err) => bad_input(&err.to_string()),
            }
        }
    }
}

fn sim(args: SimArgs) -> ExitCode {
    use ringmaster::sim::{self, Mode, SimFailure, SimOptions};
    let config = match load_config(args.config.as_ref()) {
        Ok(c) => c,
        Err(e) => return bad_input(&e),
    };
    let policies = match sim::parse_policies(&args.placer) {
        Ok(p) => p,
        Err(e) => return bad_input(&e.to_string()),
    };
    let mixes = match sim::mix::parse_mixes(&args.mix) {
        Ok(m) => m,
        Err(e) => return bad_input(&e.to_string()),
    };
    let options = SimOptions {
        mixes,
        nodes: args.nodes,
        tasks: args.tasks,
        rings: config.rings,
        ties: match args.ties {
            SimTies::First => sim::Ties::First,
            SimTies::Random => sim::Ties::Random,
        },
        policies,
        mode: match args.mode {
            SimMode::Replay => Mode::Replay,
            SimMode::Fill => Mode::Fill,
        },
        seeds: args.seeds,
        inflation_pct: args.inflation,
        out: args.out,
        progress: !args.quiet,
    };
    let outcome = if options.mixes.is_empty() {
        sim::run(&options).map(|r| print!("{}", r.table(options.inflation_pct)))
    } else {
        sim::run_mixes(&options)
            .map(|all| print!("{}", sim::mixes_table(&all, options.inflation_pct)))
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(SimFailure::Input(e)) => bad_input(&e),
        Err(SimFailure::Run(e)) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// `ringmaster token`: prints a bearer token valid for `ttl` from now.
fn token(principal: &str, secret_file: &std::path::Path, ttl: std::time::Duration) -> ExitCode {
    if let Err(e) = ringmaster_proto::security::check_principal(principal) {
        return bad_input(&format!("--principal: {e}"));
    }
    if ttl.is_zero() {
        return bad_input("--ttl: a token valid for 0 s is expired at once");
    }
    let secret = match ringmaster_proto::security::read_secret_file(secret_file) {
        Ok(secret) => secret,
        Err(e) => return bad_input(&format!("--secret-file: {e}")),
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let expiry = now.saturating_add(ttl.as_secs().max(1));
    println!(
        "{}",
        ringmaster::security::http_token(principal, &secret, expiry)
    );
    ExitCode::SUCCESS
}

fn bad_input(message: &str) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::from(BAD_INPUT)
}

fn finish(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
