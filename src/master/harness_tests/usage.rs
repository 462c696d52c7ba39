//! Usage reports from agents (`UsageReport`): kept per running task, only from the agent that
//! runs it, dropped when the task ends, summed per agent in `/state`.

use ringmaster_proto::{Message, TaskState, TaskUsage, UsageReport};

use super::running;
use crate::master::harness::{Fw, Harness};
use crate::master::state::make_task_key;
use crate::master::ConnId;

const MIB: u64 = 1024 * 1024;

/// The unix ms the harness's clock shows at its start: samples are stamped from here.
const T0: u64 = Harness::UNIX_MS_AT_START;

/// An entry sampled `at_ms` after the harness's start (its peak twice its rss).
fn usage(fw: &Fw, task_id: &str, cpu_seconds: f64, rss_mib: u64, at_ms: u64) -> TaskUsage {
    TaskUsage {
        framework_id: fw.id.clone(),
        task_id: task_id.into(),
        cpu_seconds,
        mem_rss_bytes: rss_mib * MIB,
        mem_peak_bytes: (2 * MIB).saturating_mul(rss_mib),
        sampled_at_ms: T0 + at_ms,
    }
}

fn report(h: &mut Harness, agent: ConnId, tasks: Vec<TaskUsage>) {
    h.send(agent, Message::UsageReport(UsageReport { tasks }));
}

/// The `usage` of task `task_id` in `/state`.
fn task_usage(h: &Harness, task_id: &str) -> Option<crate::master::TaskUsageView> {
    let snapshot = h.snapshot();
    let task = snapshot.tasks.iter().find(|t| t.id == task_id).unwrap();
    task.usage.clone()
}

/// A master with agent `a1` running `t1` and `t2` of a framework.
fn setup() -> (Harness, ConnId, Fw) {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:8;mem:4096");
    let fw = h.framework("web");
    running(&mut h, &fw, agent, "t1", "cpus:2;mem:512");
    running(&mut h, &fw, agent, "t2", "cpus:1;mem:256");
    (h, agent, fw)
}

#[test]
fn a_report_is_stored_and_the_rate_comes_from_two_samples() {
    let (mut h, agent, fw) = setup();
    assert_eq!(task_usage(&h, "t1"), None);
    report(&mut h, agent, vec![usage(&fw, "t1", 10.0, 100, 1_000)]);
    // The master answers nothing: a report needs no acknowledgement.
    h.expect_nothing(agent);
    let first = task_usage(&h, "t1").expect("stored");
    assert_eq!(first.cpu_seconds, 10.0);
    assert_eq!(first.cpu_used, None, "one sample has no rate");
    assert_eq!(first.mem_rss_mib, 100.0);
    assert_eq!(first.mem_peak_mib, 200.0);
    assert_eq!(first.sampled_at_ms, T0 + 1_000);
    report(&mut h, agent, vec![usage(&fw, "t1", 25.0, 150, 11_000)]);
    let second = task_usage(&h, "t1").unwrap();
    assert_eq!(second.cpu_used, Some(1.5));
    assert_eq!(second.mem_rss_mib, 150.0);
    // An older sample than the one held is ignored.
    report(&mut h, agent, vec![usage(&fw, "t1", 99.0, 1, 5_000)]);
    assert_eq!(task_usage(&h, "t1"), Some(second));
    // The serialized form: absent `usage` for a task without a sample.
    let json = serde_json::to_value(h.snapshot()).unwrap();
    let tasks = json["tasks"].as_array().unwrap();
    assert_eq!(tasks[0]["usage"]["cpu_used"], 1.5);
    assert!(tasks[1].get("usage").is_none(), "{}", tasks[1]);
}

#[test]
fn another_agents_or_unknown_task_is_ignored() {
    let mut h = Harness::new();
    let a1 = h.agent("a1", "cpus:4;mem:1024");
    let a2 = h.agent("a2", "cpus:4;mem:1024");
    let fw = h.framework("web");
    let on = h.launch(&fw, "t1", "cpus:4;mem:1024");
    let (owner, other) = if on == "a1" { (a1, a2) } else { (a2, a1) };
    h.status(owner, &fw, "t1", TaskState::TaskRunning);
    // The other agent runs no task at all: its report is beyond its bound and ignored.
    report(&mut h, other, vec![usage(&fw, "t1", 5.0, 10, 1_000)]);
    assert_eq!(task_usage(&h, "t1"), None);
    // The owner: an unknown task and another framework's id are ignored, its own is kept.
    let mut stranger = usage(&fw, "t1", 1.0, 1, 1_000);
    stranger.framework_id = "someone-else".into();
    report(
        &mut h,
        owner,
        vec![usage(&fw, "nope", 1.0, 1, 1_000), stranger],
    );
    assert_eq!(task_usage(&h, "t1"), None);
    report(&mut h, owner, vec![usage(&fw, "t1", 5.0, 10, 1_000)]);
    assert_eq!(task_usage(&h, "t1").unwrap().cpu_seconds, 5.0);
}

#[test]
fn a_report_is_bounded_by_the_tasks_the_agent_runs_and_bad_figures_are_dropped() {
    let (mut h, agent, fw) = setup();
    // Two tasks run: only the first two entries are looked at.
    let mut entries = vec![
        usage(&fw, "t1", f64::NAN, 1, 1_000),
        usage(&fw, "t2", f64::INFINITY, 1, 1_000),
    ];
    entries.extend((0..10_000).map(|_| usage(&fw, "t1", 1.0, 1, 1_000)));
    report(&mut h, agent, entries);
    assert_eq!(task_usage(&h, "t1"), None);
    assert_eq!(task_usage(&h, "t2"), None);
    assert_eq!(h.state.usage.len(), 0);
    report(
        &mut h,
        agent,
        vec![
            usage(&fw, "t1", -1.0, 1, 1_000),
            usage(&fw, "t2", 1e300, 1, 1_000),
        ],
    );
    assert_eq!(task_usage(&h, "t1"), None);
    // A huge but finite CPU figure is clamped, never a panic (memory above the agent's total
    // is refused: `bogus_samples_are_refused_and_counted`).
    let t2 = task_usage(&h, "t2").unwrap();
    assert_eq!(t2.cpu_seconds, 1e12);
    report(&mut h, agent, vec![usage(&fw, "t2", 1e300, 1, 1_001)]);
    assert_eq!(task_usage(&h, "t2").unwrap().cpu_used, Some(0.0));
}

#[test]
fn the_sample_goes_when_the_task_ends_and_a_late_report_is_ignored() {
    let (mut h, agent, fw) = setup();
    report(
        &mut h,
        agent,
        vec![
            usage(&fw, "t1", 1.0, 10, 1_000),
            usage(&fw, "t2", 1.0, 10, 1_000),
        ],
    );
    assert_eq!(h.state.usage.len(), 2);
    h.status(agent, &fw, "t1", TaskState::TaskFinished);
    assert!(h.state.usage.get(&make_task_key(&fw.id, "t1")).is_none());
    assert_eq!(h.state.usage.len(), 1);
    // A report sampled before the end, arriving after it.
    report(&mut h, agent, vec![usage(&fw, "t1", 2.0, 10, 2_000)]);
    assert_eq!(task_usage(&h, "t1"), None);
    assert_eq!(h.state.usage.len(), 1);
}

#[test]
fn agent_sums_are_over_its_sampled_tasks() {
    let (mut h, agent, fw) = setup();
    let agent_usage = |h: &Harness| h.snapshot().agents[0].usage.clone();
    assert_eq!(agent_usage(&h), None);
    report(
        &mut h,
        agent,
        vec![
            usage(&fw, "t1", 0.0, 100, 1_000),
            usage(&fw, "t2", 0.0, 28, 1_000),
        ],
    );
    let sums = agent_usage(&h).unwrap();
    assert_eq!((sums.cpus, sums.mem_mib), (0.0, 128.0));
    report(
        &mut h,
        agent,
        vec![
            usage(&fw, "t1", 2.0, 100, 3_000),
            usage(&fw, "t2", 1.0, 28, 3_000),
        ],
    );
    let sums = agent_usage(&h).unwrap();
    assert_eq!((sums.cpus, sums.mem_mib), (1.5, 128.0));
    let json = serde_json::to_value(h.snapshot()).unwrap();
    assert_eq!(json["agents"][0]["usage"]["cpus"], 1.5);
    assert_eq!(json["agents"][0]["used"], "cpus:3;mem:768");
    // A lost agent's tasks end, and their samples with them.
    h.disconnect(agent);
    h.advance_and_tick(h.config().master.agent_timeout + std::time::Duration::from_secs(1));
    assert_eq!(h.state.usage.len(), 0);
    assert_eq!(agent_usage(&h), None);
}

/// `ringmaster_usage_reports_refused_total{reason}` as `/metrics` shows it (0 when absent).
fn refused(h: &Harness, reason: &str) -> u64 {
    let series = format!("ringmaster_usage_reports_refused_total{{reason=\"{reason}\"}} ");
    h.state
        .metrics
        .encode()
        .lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .map_or(0, |n| n.trim().parse().unwrap())
}

/// An entry with every figure given: `at_ms` is a unix time.
fn entry(
    fw: &Fw,
    task_id: &str,
    cpu: f64,
    rss_bytes: u64,
    peak_bytes: u64,
    at_ms: u64,
) -> TaskUsage {
    TaskUsage {
        framework_id: fw.id.clone(),
        task_id: task_id.into(),
        cpu_seconds: cpu,
        mem_rss_bytes: rss_bytes,
        mem_peak_bytes: peak_bytes,
        sampled_at_ms: at_ms,
    }
}

const DAY_MS: u64 = 24 * 3600 * 1000;

/// Memory above the agent's total `mem` (4096 MiB) is dropped, entry by entry, and counted;
/// the held sample stays. Before this rule the master kept 8.8e12 MiB.
#[test]
fn memory_above_the_agents_total_is_refused() {
    let (mut h, agent, fw) = setup();
    report(&mut h, agent, vec![usage(&fw, "t1", 10.0, 100, 1_000)]);
    let held = task_usage(&h, "t1").unwrap();
    // 8.8e12 MiB of rss; the other entry of the same report is kept.
    let total = 4096 * MIB;
    let huge = 8_800_000_000_000 * MIB;
    report(
        &mut h,
        agent,
        vec![
            entry(&fw, "t1", 11.0, huge, huge, T0 + 2_000),
            usage(&fw, "t2", 1.0, 10, 2_000),
        ],
    );
    assert_eq!(task_usage(&h, "t1"), Some(held.clone()));
    assert_eq!(task_usage(&h, "t2").unwrap().mem_rss_mib, 10.0);
    assert_eq!(refused(&h, "memory_above_total"), 1);
    // A peak one byte above the total.
    report(
        &mut h,
        agent,
        vec![entry(&fw, "t1", 11.0, MIB, total + 1, T0 + 2_000)],
    );
    assert_eq!(task_usage(&h, "t1"), Some(held));
    assert_eq!(refused(&h, "memory_above_total"), 2);
    // Exactly the total is fine.
    report(
        &mut h,
        agent,
        vec![entry(&fw, "t1", 11.0, total, total, T0 + 2_000)],
    );
    assert_eq!(task_usage(&h, "t1").unwrap().mem_rss_mib, 4096.0);
    assert_eq!(refused(&h, "memory_above_total"), 2);
    assert_eq!(refused(&h, "cpu_went_backwards"), 0);
    assert_eq!(refused(&h, "time_out_of_range"), 0);
}

/// CPU seconds below the previous sample's are dropped and counted; the held sample (and the
/// base of the next rate) stays. Before this rule the master kept the lower figure.
#[test]
fn cpu_seconds_going_backwards_are_refused() {
    let (mut h, agent, fw) = setup();
    report(&mut h, agent, vec![usage(&fw, "t1", 10.0, 100, 1_000)]);
    let held = task_usage(&h, "t1").unwrap();
    report(&mut h, agent, vec![usage(&fw, "t1", 9.5, 100, 11_000)]);
    assert_eq!(task_usage(&h, "t1"), Some(held));
    assert_eq!(refused(&h, "cpu_went_backwards"), 1);
    // The same figure is no step back; the rate is over the held sample.
    report(&mut h, agent, vec![usage(&fw, "t1", 10.0, 100, 11_000)]);
    assert_eq!(task_usage(&h, "t1").unwrap().cpu_used, Some(0.0));
    report(&mut h, agent, vec![usage(&fw, "t1", 30.0, 100, 21_000)]);
    assert_eq!(task_usage(&h, "t1").unwrap().cpu_used, Some(2.0));
    assert_eq!(refused(&h, "cpu_went_backwards"), 1);
    assert_eq!(refused(&h, "memory_above_total"), 0);
    assert_eq!(refused(&h, "time_out_of_range"), 0);
}

/// A sample time more than a day from the master's clock (its `now`, not the agent's) is
/// dropped and counted. Before this rule the master kept u64::MAX as a time.
#[test]
fn sample_times_a_day_off_the_masters_clock_are_refused() {
    let (mut h, agent, fw) = setup();
    let now = h.unix_ms();
    for at in [u64::MAX, 0, now + DAY_MS + 1, now - DAY_MS - 1] {
        report(&mut h, agent, vec![entry(&fw, "t1", 1.0, MIB, MIB, at)]);
        assert_eq!(task_usage(&h, "t1"), None, "sampled at {at}");
    }
    assert_eq!(refused(&h, "time_out_of_range"), 4);
    // A day before, then a day ahead, are fine.
    report(
        &mut h,
        agent,
        vec![entry(&fw, "t1", 1.0, MIB, MIB, now - DAY_MS)],
    );
    assert_eq!(task_usage(&h, "t1").unwrap().sampled_at_ms, now - DAY_MS);
    report(
        &mut h,
        agent,
        vec![entry(&fw, "t1", 2.0, MIB, MIB, now + DAY_MS)],
    );
    assert_eq!(task_usage(&h, "t1").unwrap().sampled_at_ms, now + DAY_MS);
    // The master's clock is what counts: two days on, a sample stamped at its start is old.
    report(&mut h, agent, vec![usage(&fw, "t2", 1.0, 10, 0)]);
    h.advance(std::time::Duration::from_millis(2 * DAY_MS));
    report(&mut h, agent, vec![usage(&fw, "t2", 2.0, 10, 1_000)]);
    assert_eq!(task_usage(&h, "t2").unwrap().cpu_seconds, 1.0);
    assert_eq!(refused(&h, "time_out_of_range"), 5);
    assert_eq!(refused(&h, "memory_above_total"), 0);
    assert_eq!(refused(&h, "cpu_went_backwards"), 0);
}

/// An agent without a `mem` resource reports memory all the same: no total bounds it.
#[test]
fn without_a_mem_total_memory_is_not_bounded() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4");
    let fw = h.framework("web");
    running(&mut h, &fw, agent, "t1", "cpus:1");
    report(&mut h, agent, vec![usage(&fw, "t1", 1.0, 512, 1_000)]);
    assert_eq!(task_usage(&h, "t1").unwrap().mem_rss_mib, 512.0);
    assert_eq!(refused(&h, "memory_above_total"), 0);
}
