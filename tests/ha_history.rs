//! A history checker over a randomized fault run of replicated masters.
//!
//! Three `ringmaster serve` processes with `cluster:` configs, each reaching every other
//! master through its own cuttable TCP proxy (tests/proxy), two real agents and waves of
//! `ringmaster-exec` runs whose many short tasks each append a line (task id, a mark unique to
//! the execution) to a shared ledger. Meanwhile a seeded fault driver `kill -9`s the leader and
//! restarts it on its work dir, partitions one master from the others for a while and heals
//! it, and `kill -9`s an agent and restarts it on its work dir.
//!
//! The checker ([`check`], pure, with its own unit tests below) reads the ledger and what exec
//! reported and lists the violations: a task that ran more than once, a task reported FINISHED
//! that never ran, a task that ran whose terminal state never reached its framework (or reached
//! it as something other than FINISHED), conflicting terminal states, an exec run that exited
//! nonzero or never exited.
//!
//! `RINGMASTER_HISTORY_SECS` sets how long faults are injected (default small, for CI);
//! `RINGMASTER_HISTORY_SEED` picks the seed ([`DEFAULT_SEED`] unless set, so `cargo test` runs
//! the same schedule every time; `random` draws one; the seed is printed); `RINGMASTER_HISTORY_KEEP=1`
//! keeps the logs of a passing run (a failing run always keeps them). See docs/reliability.md,
//! "History checker".

mod processes;
mod proxy;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use processes::*;
use proxy::Proxy;

// ---------------------------------------------------------------------------------------------
// The checker
// ---------------------------------------------------------------------------------------------

/// One `ringmaster-exec` run as seen from outside: its framework name (its tasks are
/// `NAME-<i>`), how it ended and its stdout lines (`TASK <id> <STATE> ...`).
#[derive(Debug, Clone)]
pub struct ExecRun {
    pub name: String,
    /// The exit code; `None` if it did not exit (hang, killed by the test at its deadline) or
    /// died of a signal.
    pub exit: Option<i32>,
    pub lines: Vec<String>,
}

/// What the checker found wrong with a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// The ledger holds more than one execution of this task: it was launched twice.
    RanMoreThanOnce { task: String, runs: Vec<String> },
    /// Exec reported the task FINISHED but it never ran: an acknowledged status that did not
    /// happen.
    FinishedButNeverRan { task: String },
    /// The task ran, its exec run exited, and no terminal state of it ever reached the
    /// framework: a lost update.
    UpdateLost { task: String },
    /// The task ran to completion (it is in the ledger) but the framework's last word on it is
    /// another terminal state.
    RanButReported { task: String, state: String },
    /// The framework was told two different ends of one task (LOST followed by a recovery is
    /// not counted: a lost agent may come back with the task).
    ConflictingEnds { task: String, states: Vec<String> },
    /// An exec run exited nonzero (`Some(code)`) or not at all (`None`), other than with 1
    /// for launches lost before they ran (see [`lost_before_running`]).
    ExecFailed { run: String, exit: Option<i32> },
}

const TERMINAL: [&str; 4] = ["FINISHED", "FAILED", "KILLED", "LOST"];

/// The ledger's executions per task id: each line is `<task id> <mark unique to the
/// execution>`; blank lines are skipped.
pub fn ledger_runs(ledger: &str) -> BTreeMap<String, Vec<String>> {
    let mut runs: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in ledger.lines() {
        let mut words = line.split_whitespace();
        if let Some(task) = words.next() {
            let mark = words.collect::<Vec<_>>().join(" ");
            runs.entry(task.to_string()).or_default().push(mark);
        }
    }
    runs
}

/// The states exec reported per task, in order (`TASK <id> <STATE> ...` lines).
pub fn reported_states(lines: &[String]) -> BTreeMap<String, Vec<String>> {
    let mut states: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in lines.iter().filter(|l| l.starts_with("TASK ")) {
        let mut words = line.split_whitespace().skip(1);
        if let (Some(id), Some(state)) = (words.next(), words.next()) {
            states
                .entry(id.to_string())
                .or_default()
                .push(state.to_string());
        }
    }
    states
}

/// Whether exec's exit 1 is accounted for by launches lost before they ran: every task of
/// the run ended, each either FINISHED or LOST without ever having run (not in the ledger), and
/// at least one LOST. A `RunTasks` that died with the agent or the leader that sent it ends
/// that way (docs/reliability.md, "Recovery steps"): nothing ran, and the framework was told.
/// ringmaster-exec does not launch a lost task again, so it exits 1.
fn lost_before_running(
    states: &BTreeMap<String, Vec<String>>,
    ran: &BTreeMap<String, Vec<String>>,
) -> bool {
    let last = |task: &String| states[task].last().map(String::as_str);
    let lost: Vec<&String> = states.keys().filter(|t| last(t) == Some("LOST")).collect();
    !lost.is_empty()
        && lost.iter().all(|t| !ran.contains_key(*t))
        && states
            .keys()
            .all(|t| matches!(last(t), Some("FINISHED") | Some("LOST")))
}

/// Tasks the framework was last told were LOST and that never ran: launches that did not
/// happen, and were reported as such.
pub fn lost_launches(ledger: &str, runs: &[ExecRun]) -> Vec<String> {
    let ran = ledger_runs(ledger);
    runs.iter()
        .flat_map(|run| reported_states(&run.lines))
        .filter(|(task, states)| {
            states.last().map(String::as_str) == Some("LOST") && !ran.contains_key(task)
        })
        .map(|(task, _)| task)
        .collect()
}

/// Every violation in a history: the `ledger` the tasks appended to and the exec `runs`.
pub fn check(ledger: &str, runs: &[ExecRun]) -> Vec<Violation> {
    let mut violations = Vec::new();
    let ran = ledger_runs(ledger);
    // Which run a task belongs to, and what each run reported.
    let mut reported: BTreeMap<String, (usize, Vec<String>)> = BTreeMap::new();
    for (i, run) in runs.iter().enumerate() {
        let states = reported_states(&run.lines);
        if run.exit != Some(0) && !(run.exit == Some(1) && lost_before_running(&states, &ran)) {
            violations.push(Violation::ExecFailed {
                run: run.name.clone(),
                exit: run.exit,
            });
        }
        for (task, states) in states {
            reported.insert(task, (i, states));
        }
    }
    for (task, marks) in &ran {
        if marks.len() > 1 {
            violations.push(Violation::RanMoreThanOnce {
                task: task.clone(),
                runs: marks.clone(),
            });
        }
    }
    for (task, (_, states)) in &reported {
        let ends: Vec<&String> = states
            .iter()
            .filter(|s| TERMINAL.contains(&s.as_str()))
            .collect();
        if ends.iter().any(|s| *s == "FINISHED") && !ran.contains_key(task) {
            violations.push(Violation::FinishedButNeverRan { task: task.clone() });
        }
        // Ends other than LOST: one at most, and never two different ones.
        let definite: Vec<&String> = ends.iter().copied().filter(|s| *s != "LOST").collect();
        if definite.len() > 1 {
            violations.push(Violation::ConflictingEnds {
                task: task.clone(),
                states: states.clone(),
            });
        }
    }
    for task in ran.keys() {
        // The run this task belongs to: the one that reported it, else by its name.
        let run = reported.get(task).map(|(i, _)| *i).or_else(|| {
            runs.iter()
                .position(|r| task.starts_with(&format!("{}-", r.name)))
        });
        let Some(run) = run else {
            // A task of no known run: nobody acknowledged it, and no one could lose it.
            continue;
        };
        if runs[run].exit.is_none() {
            // Still running (or hung: reported as ExecFailed): updates may yet come.
            continue;
        }
        let last_end = reported.get(task).and_then(|(_, states)| {
            states
                .iter()
                .rev()
                .find(|s| TERMINAL.contains(&s.as_str()))
                .filter(|_| {
                    // A LOST followed by a recovery (RUNNING again) is not an end.
                    let last = states.last().unwrap();
                    TERMINAL.contains(&last.as_str())
                })
        });
        match last_end {
            None => violations.push(Violation::UpdateLost { task: task.clone() }),
            Some(state) if state != "FINISHED" => violations.push(Violation::RanButReported {
                task: task.clone(),
                state: state.clone(),
            }),
            Some(_) => {}
        }
    }
    violations
}

#[cfg(test)]
mod checker_tests {
    use super::*;

    fn run(name: &str, exit: Option<i32>, lines: &[&str]) -> ExecRun {
        ExecRun {
            name: name.to_string(),
            exit,
            lines: lines.iter().map(|l| l.to_string()).collect(),
        }
    }

    #[test]
    fn a_clean_history_passes() {
        let ledger = "w0-0 101\nw0-1 102\nw1-0 201\n";
        let runs = [
            run(
                "w0",
                Some(0),
                &[
                    "TASK w0-0 STAGING agent=a1",
                    "TASK w0-1 STAGING agent=a2",
                    "TASK w0-0 RUNNING agent=a1",
                    "TASK w0-1 RUNNING agent=a2",
                    "TASK w0-1 FINISHED agent=a2",
                    "TASK w0-0 FINISHED agent=a1",
                ],
            ),
            // A task lost with its agent that came back and finished is fine.
            run(
                "w1",
                Some(0),
                &[
                    "TASK w1-0 RUNNING agent=a1",
                    "TASK w1-0 LOST agent=a1 reason=agent_lost",
                    "TASK w1-0 RUNNING agent=a1 reason=agent_reregistered",
                    "TASK w1-0 FINISHED agent=a1",
                ],
            ),
        ];
        assert_eq!(check(ledger, &runs), vec![]);
    }

    #[test]
    fn a_duplicate_launch_fails() {
        let ledger = "w0-0 101\nw0-1 102\nw0-0 103\n";
        let runs = [run(
            "w0",
            Some(0),
            &["TASK w0-0 FINISHED agent=a1", "TASK w0-1 FINISHED agent=a2"],
        )];
        assert_eq!(
            check(ledger, &runs),
            vec![Violation::RanMoreThanOnce {
                task: "w0-0".into(),
                runs: vec!["101".into(), "103".into()]
            }]
        );
    }

    #[test]
    fn a_lost_update_fails() {
        // w0-1 ran, exec exited (nonzero: it never saw w0-1 end), and no end was reported.
        let ledger = "w0-0 101\nw0-1 102\n";
        let runs = [run(
            "w0",
            Some(1),
            &["TASK w0-0 FINISHED agent=a1", "TASK w0-1 RUNNING agent=a2"],
        )];
        assert_eq!(
            check(ledger, &runs),
            vec![
                Violation::ExecFailed {
                    run: "w0".into(),
                    exit: Some(1)
                },
                Violation::UpdateLost {
                    task: "w0-1".into()
                },
            ]
        );
    }

    #[test]
    fn a_finished_task_that_never_ran_fails() {
        let ledger = "w0-0 101\n";
        let runs = [run(
            "w0",
            Some(0),
            &["TASK w0-0 FINISHED agent=a1", "TASK w0-1 FINISHED agent=a2"],
        )];
        assert_eq!(
            check(ledger, &runs),
            vec![Violation::FinishedButNeverRan {
                task: "w0-1".into()
            }]
        );
    }

    #[test]
    fn a_task_that_ran_but_is_reported_lost_or_twice_ended_fails() {
        let ledger = "w0-0 101\nw0-1 102\n";
        let runs = [run(
            "w0",
            Some(1),
            &[
                "TASK w0-0 LOST agent=a1 reason=agent_reregistered",
                "TASK w0-1 FINISHED agent=a2",
                "TASK w0-1 FAILED agent=a2 reason=exit_status",
            ],
        )];
        assert_eq!(
            check(ledger, &runs),
            vec![
                Violation::ExecFailed {
                    run: "w0".into(),
                    exit: Some(1)
                },
                Violation::ConflictingEnds {
                    task: "w0-1".into(),
                    states: vec!["FINISHED".into(), "FAILED".into()]
                },
                Violation::RanButReported {
                    task: "w0-0".into(),
                    state: "LOST".into()
                },
                Violation::RanButReported {
                    task: "w0-1".into(),
                    state: "FAILED".into()
                },
            ]
        );
    }

    #[test]
    fn a_launch_lost_before_it_ran_explains_exit_1_and_nothing_else_does() {
        // w0-1's RunTasks died with its agent: LOST, never in the ledger; exec exits 1.
        let ledger = "w0-0 101\n";
        let lines = [
            "TASK w0-0 FINISHED agent=a1",
            "TASK w0-1 STAGING agent=a2",
            "TASK w0-1 LOST agent=a2 reason=agent_reregistered",
        ];
        let runs = [run("w0", Some(1), &lines)];
        assert_eq!(check(ledger, &runs), vec![]);
        assert_eq!(lost_launches(ledger, &runs), vec!["w0-1".to_string()]);
        // Any other exit code, or a task that ended otherwise, is not explained.
        let runs = [run("w0", Some(2), &lines)];
        assert_eq!(
            check(ledger, &runs),
            vec![Violation::ExecFailed {
                run: "w0".into(),
                exit: Some(2)
            }]
        );
        let runs = [run(
            "w0",
            Some(1),
            &["TASK w0-0 FINISHED agent=a1", "TASK w0-1 KILLED agent=a2"],
        )];
        assert_eq!(
            check(ledger, &runs),
            vec![Violation::ExecFailed {
                run: "w0".into(),
                exit: Some(1)
            }]
        );
    }

    #[test]
    fn a_hung_exec_fails_but_its_pending_updates_are_not_called_lost() {
        let ledger = "w0-0 101\n";
        let runs = [run("w0", None, &["TASK w0-0 RUNNING agent=a1"])];
        assert_eq!(
            check(ledger, &runs),
            vec![Violation::ExecFailed {
                run: "w0".into(),
                exit: None
            }]
        );
    }
}

// ---------------------------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------------------------

/// Seconds of faults unless `RINGMASTER_HISTORY_SECS` says otherwise (CI size).
const DEFAULT_SECS: u64 = 30;
/// The schedule `cargo test` runs: fixed, so the README's test command is deterministic in what
/// it asks of the cluster (`RINGMASTER_HISTORY_SEED=random` for a fresh one). A seed of the
/// runs in docs/reliability.md that exercised every kind of fault.
const DEFAULT_SEED: u64 = 17924579240723933554;
/// Tasks per exec wave; waves follow one another on each lane while faults go on.
const TASKS_PER_WAVE: u32 = 8;
/// Exec lanes running side by side.
const LANES: usize = 2;
/// The longest an exec run may take before it is called hung.
const EXEC_DEADLINE: Duration = Duration::from_secs(150);

/// Every master's log lines, with when they were read, shared with the reader threads.
type Logs = Arc<Mutex<Vec<(Instant, u64, String)>>>;

struct Master {
    id: u64,
    listen: String,
    config: PathBuf,
    work: PathBuf,
    proc: Option<Proc>,
    /// Bumped when the master is killed: lines of an earlier incarnation still in flight are
    /// not taken as news of the live one (they still go to its log file).
    incarnation: Arc<std::sync::atomic::AtomicU64>,
}

impl Master {
    fn start(&mut self, logs: &Logs, log_dir: &Path) {
        let (proc, _, rx) = start_master_with(
            &self.config,
            &self.listen,
            &["--http", "none", "--work-dir", self.work.to_str().unwrap()],
        );
        self.proc = Some(proc);
        let (id, logs) = (self.id, logs.clone());
        let current = self.incarnation.clone();
        let mine = current.load(Ordering::SeqCst);
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_dir.join(format!("master{id}.log")))
            .unwrap();
        std::thread::spawn(move || {
            use std::io::Write as _;
            for line in rx {
                let _ = writeln!(file, "{line}");
                let mut logs = logs.lock().unwrap();
                if current.load(Ordering::SeqCst) == mine {
                    logs.push((Instant::now(), id, line));
                }
            }
        });
    }

    fn kill(&mut self, logs: &Logs) {
        drop(self.proc.take()); // SIGKILL, then reaped
        let mut logs = logs.lock().unwrap();
        self.incarnation.fetch_add(1, Ordering::SeqCst);
        logs.push((Instant::now(), self.id, "<killed by the test>".into()));
    }
}

/// The live master that most recently logged that it leads and has not since lost the lead or
/// been killed.
fn current_leader(logs: &Logs, alive: &BTreeSet<u64>) -> Option<u64> {
    let logs = logs.lock().unwrap();
    let mut leading: BTreeMap<u64, Instant> = BTreeMap::new();
    for (at, id, line) in logs.iter() {
        if line.contains("this master leads its group") {
            leading.insert(*id, *at);
        } else if line.contains("no longer leads") || line == "<killed by the test>" {
            leading.remove(id);
        }
    }
    leading
        .into_iter()
        .filter(|(id, _)| alive.contains(id))
        .max_by_key(|(_, at)| *at)
        .map(|(id, _)| id)
}

struct Agent {
    id: String,
    work: PathBuf,
    log: PathBuf,
    proc: Option<Proc>,
}

impl Agent {
    fn start(&mut self, masters: &str) {
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(workspace_bin("ringmaster-agent"))
            .args(["--master", masters, "--id", &self.id])
            .args(["--resources", "cpus:8;mem:4096", "--work-dir"])
            .arg(&self.work)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start ringmaster-agent");
        self.proc = Some(Proc(child));
    }
}

/// Runs one exec wave to its end (or its deadline): its history.
fn exec_wave(masters: &str, name: &str, command: &str, stderr: &Path) -> ExecRun {
    let stderr = OpenOptions::new()
        .create(true)
        .append(true)
        .open(stderr)
        .unwrap();
    let mut command_line = Command::new(workspace_bin("ringmaster-exec"));
    command_line
        .args(["--master", masters, "--name", name])
        .args(["--resources", "cpus:1;mem:64"])
        .args(["--instances", &TASKS_PER_WAVE.to_string()])
        .args(["--failover-timeout", "120", "--connect-timeout", "120"])
        .args(["--", command])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1");
    let mut child = command_line
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("start ringmaster-exec");
    let stdout = child.stdout.take().unwrap();
    let mut exec = Proc(child);
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + EXEC_DEADLINE;
    let mut seen = Vec::new();
    let exit = loop {
        if let Some(status) = exec.0.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() > deadline {
            break None; // dropping `exec` kills it
        }
        if let Ok(line) = lines.recv_timeout(Duration::from_millis(50)) {
            seen.push(line);
        }
    };
    drop(exec);
    // The rest of its output, up to the end of its stdout.
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(5)) {
        seen.push(line);
    }
    ExecRun {
        name: name.to_string(),
        exit,
        lines: seen,
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a whole number, not {v:?}"))
    })
}

fn pause(rng: &mut ChaCha8Rng, from_ms: u64, to_ms: u64) {
    std::thread::sleep(Duration::from_millis(rng.random_range(from_ms..=to_ms)));
}

#[test]
fn a_randomized_fault_run_keeps_a_clean_history() {
    let secs = env_u64("RINGMASTER_HISTORY_SECS").unwrap_or(DEFAULT_SECS);
    let seed = match std::env::var("RINGMASTER_HISTORY_SEED").ok().as_deref() {
        Some("random") => rand::random(),
        _ => env_u64("RINGMASTER_HISTORY_SEED").unwrap_or(DEFAULT_SEED),
    };
    println!(
        "history run: seed {seed} ({secs} s of faults); replay with \
         RINGMASTER_HISTORY_SEED={seed} RINGMASTER_HISTORY_SECS={secs}"
    );
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let logs_dir = dir.path().join("logs");
    std::fs::create_dir(&logs_dir).unwrap();

    // Proxies: proxies[(from, to)] is how master `from` reaches master `to`.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let ports: BTreeMap<u64, u16> = (1..=3).map(|id| (id, free_port())).collect();
    let addr = |id: u64| format!("127.0.0.1:{}", ports[&id]);
    let mut proxies: BTreeMap<(u64, u64), Proxy> = BTreeMap::new();
    for from in 1..=3u64 {
        for to in (1..=3u64).filter(|to| *to != from) {
            let target: SocketAddr = addr(to).parse().unwrap();
            proxies.insert((from, to), runtime.block_on(Proxy::start(target)));
        }
    }
    let masters_list = (1..=3).map(addr).collect::<Vec<_>>().join(",");

    let logs: Logs = Arc::default();
    let mut masters: BTreeMap<u64, Master> = BTreeMap::new();
    for id in 1..=3u64 {
        let config = dir.path().join(format!("master{id}.yaml"));
        let mut yaml = String::from(
            "master:\n  allocation_interval: 5ms\n  heartbeat_interval: 200ms\n  \
             agent_reregister_timeout: 30s\ncluster:\n",
        );
        yaml.push_str(&format!(
            "  id: {id}\n  election_timeout: 400ms\n  peers:\n"
        ));
        for peer in 1..=3u64 {
            let address = if peer == id {
                addr(id)
            } else {
                proxies[&(id, peer)].addr.to_string()
            };
            yaml.push_str(&format!("    {peer}: {address}\n"));
        }
        std::fs::write(&config, yaml).unwrap();
        let mut master = Master {
            id,
            listen: addr(id),
            config,
            work: dir.path().join(format!("master{id}")),
            proc: None,
            incarnation: Arc::default(),
        };
        master.start(&logs, &logs_dir);
        masters.insert(id, master);
    }
    let mut agents: Vec<Agent> = ["a1", "a2"]
        .iter()
        .map(|id| Agent {
            id: id.to_string(),
            work: dir.path().join(id),
            log: logs_dir.join(format!("{id}.log")),
            proc: None,
        })
        .collect();
    for agent in &mut agents {
        agent.start(&masters_list);
    }

    // Every task appends `<task id> <its shell's pid>-<nanoseconds>` to the ledger.
    let shared = dir.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let ledger = shared.join("ledger");
    let command = format!(
        "sleep 0.2; echo \"$RINGMASTER_TASK_ID $$-$(date +%s%N)\" >> '{}'; sleep 0.3",
        ledger.display()
    );

    // Exec lanes: wave after wave until the faults stop.
    let faults_over = Arc::new(AtomicBool::new(false));
    let lanes: Vec<_> = (0..LANES)
        .map(|lane| {
            let (masters, command, faults_over) =
                (masters_list.clone(), command.clone(), faults_over.clone());
            let stderr = logs_dir.join(format!("exec-lane{lane}.log"));
            std::thread::spawn(move || {
                let mut runs = Vec::new();
                for wave in 0.. {
                    if wave > 0 && faults_over.load(Ordering::SeqCst) {
                        break;
                    }
                    let name = format!("l{lane}w{wave}");
                    let run = exec_wave(&masters, &name, &command, &stderr);
                    println!(
                        "  exec {name}: exit {:?}, {} FINISHED",
                        run.exit,
                        count_state(&run.lines, "FINISHED")
                    );
                    runs.push(run);
                }
                runs
            })
        })
        .collect();

    // The fault driver.
    let end = Instant::now() + Duration::from_secs(secs);
    let mut faults: BTreeMap<&str, usize> = BTreeMap::new();
    while Instant::now() < end {
        pause(&mut rng, 500, 2500);
        let alive: BTreeSet<u64> = masters.keys().copied().collect();
        match rng.random_range(0..10) {
            0..=3 => {
                // kill -9 the leader (a random master if none is known yet), restart it.
                let leader = wait_for_leader(&logs, &alive, Duration::from_secs(10))
                    .unwrap_or_else(|| rng.random_range(1..=3));
                println!("fault: kill -9 master {leader} (leader), restart it");
                masters.get_mut(&leader).unwrap().kill(&logs);
                pause(&mut rng, 100, 1500);
                masters.get_mut(&leader).unwrap().start(&logs, &logs_dir);
                *faults.entry("leader kills").or_default() += 1;
            }
            4..=6 => {
                // Partition one master (the leader half the time) from the others.
                let victim = match rng.random_bool(0.5) {
                    true => current_leader(&logs, &alive),
                    false => None,
                }
                .unwrap_or_else(|| rng.random_range(1..=3));
                let held = rng.random_range(500..=3000);
                println!("fault: partition master {victim} for {held} ms");
                let around = |p: &(u64, u64)| p.0 == victim || p.1 == victim;
                for proxy in proxies.iter().filter(|(k, _)| around(k)).map(|(_, p)| p) {
                    proxy.cut();
                }
                std::thread::sleep(Duration::from_millis(held));
                for proxy in proxies.iter().filter(|(k, _)| around(k)).map(|(_, p)| p) {
                    proxy.heal();
                }
                *faults.entry("partitions").or_default() += 1;
            }
            _ => {
                let agent = &mut agents[rng.random_range(0..2)];
                println!("fault: kill -9 agent {}, restart it", agent.id);
                drop(agent.proc.take());
                pause(&mut rng, 100, 1500);
                agent.start(&masters_list);
                *faults.entry("agent kills").or_default() += 1;
            }
        }
    }
    faults_over.store(true, Ordering::SeqCst);
    println!("faults over: {faults:?}; waiting for the exec runs to end");
    let runs: Vec<ExecRun> = lanes
        .into_iter()
        .flat_map(|lane| lane.join().expect("an exec lane"))
        .collect();

    for run in &runs {
        let out = logs_dir.join(format!("exec-{}.out", run.name));
        std::fs::write(out, run.lines.join("\n")).unwrap();
    }
    let ledger_text = std::fs::read_to_string(&ledger).unwrap_or_default();
    let violations = check(&ledger_text, &runs);
    let tasks = ledger_runs(&ledger_text).len();
    let finished: usize = runs.iter().map(|r| count_state(&r.lines, "FINISHED")).sum();
    let lost = lost_launches(&ledger_text, &runs);
    // Why they were lost: the reason of each one's last LOST line.
    let mut lost_why: BTreeMap<String, usize> = BTreeMap::new();
    for task in &lost {
        let prefix = format!("TASK {task} LOST ");
        let line = runs
            .iter()
            .flat_map(|r| r.lines.iter())
            .rfind(|l| l.starts_with(&prefix));
        let reason = line
            .and_then(|l| l.split_whitespace().find(|w| w.starts_with("reason=")))
            .unwrap_or("reason=?");
        *lost_why.entry(reason.to_string()).or_default() += 1;
    }
    let leads = logs
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, _, l)| l.contains("this master leads its group"))
        .count();
    println!(
        "history: seed {seed}, {} exec runs, {tasks} tasks ran, {finished} FINISHED reported, \
         {} launches LOST before they ran {lost_why:?}, faults {faults:?}, {leads} times a \
         master took the lead, violations {}",
        runs.len(),
        lost.len(),
        violations.len()
    );
    if std::env::var_os("RINGMASTER_HISTORY_KEEP").is_some() && violations.is_empty() {
        println!("logs kept in {}", dir.keep().join("logs").display());
        return;
    }
    if !violations.is_empty() {
        let kept = dir.keep();
        let mut report = format!(
            "seed {seed} ({secs} s): {} violations; logs kept in {}\n",
            violations.len(),
            kept.join("logs").display()
        );
        for v in &violations {
            report.push_str(&format!("  {v:?}\n"));
        }
        // The runs and ledger lines concerned, in full.
        let named = |v: &Violation| match v {
            Violation::RanMoreThanOnce { task, .. }
            | Violation::FinishedButNeverRan { task }
            | Violation::UpdateLost { task }
            | Violation::RanButReported { task, .. }
            | Violation::ConflictingEnds { task, .. } => task.clone(),
            Violation::ExecFailed { run, .. } => format!("{run}-"),
        };
        let concerned: Vec<String> = violations.iter().map(named).collect();
        for run in &runs {
            let prefix = format!("{}-", run.name);
            if concerned.iter().any(|c| c.starts_with(&prefix)) {
                report.push_str(&format!(
                    "exec {} exit {:?}:\n  {}\n",
                    run.name,
                    run.exit,
                    run.lines.join("\n  ")
                ));
            }
        }
        report.push_str("ledger lines concerned:\n");
        for line in ledger_text.lines() {
            let task = line.split_whitespace().next().unwrap_or_default();
            if concerned.iter().any(|c| task.starts_with(c.as_str())) {
                report.push_str(&format!("  {line}\n"));
            }
        }
        panic!("{report}");
    }
    assert!(tasks > 0, "no task ran at all");
}

/// Waits (up to `patience`) until some live master leads.
fn wait_for_leader(logs: &Logs, alive: &BTreeSet<u64>, patience: Duration) -> Option<u64> {
    let deadline = Instant::now() + patience;
    loop {
        if let Some(leader) = current_leader(logs, alive) {
            return Some(leader);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
