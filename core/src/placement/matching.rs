//! Batch placement of one-shot, deadline-bound tasks by deferred acceptance (SPEC seed 002).
//!
//! Placing a burst one task at a time lets early tasks take the agents that later, tighter tasks
//! needed. Here the whole burst is matched at once: tasks propose to agents in the order of their
//! own score, agents keep the proposals they rank highest while those fit, rejected tasks propose
//! again further down their lists. Pure and deterministic like the rest of [`crate::placement`]:
//! the master, `ringmaster place`, tests and benchmarks run exactly this code.
//!
//! Scores (see `docs/batch.md` for a worked example):
//! - task side, for every agent the task can use: `S = a·P̂ + b·L̂` where
//!   `P = w_cpu·speed·cores/max + w_mem·mem/max + net_rate/max` (agent quantities divided by
//!   their largest value in the batch's agents; `w_cpu : w_mem` is the task's share of the batch's
//!   cpu demand against its share of the memory demand, scaled to sum to 1) and `L` is the mean of
//!   the agent's idle fraction of `cpus`, `mem` and `net` (those dimensions its total has) after
//!   placing the task. Each of P and L is then divided by its largest value over the task's
//!   agents, so both lie in [0, 1] and neither unit dominates;
//! - agent side: `E = c·T + d·R + e·V` with `exec = work / cpu_speed`, `T = ln(deadline / exec)`,
//!   `R = exec · unit_cost`, `V = price / exec`.
//!
//! A task can use an agent when the agent's free resources (at the start of the batch) hold the
//! task and `exec ≤ deadline` there; other agents are never proposed to. An agent ranks held and
//! new proposals together by E, keeps them in that order while they fit (a misfit is skipped, the
//! next one still considered) and rejects the rest. The loop ends when a round has no proposal;
//! each task proposes to each agent at most once, so there are at most m·n proposals. Then every
//! task still unmatched takes, in batch order, the first agent of its list with room left
//! ("fills": no displacement, so nothing matched before moves).
//!
//! Guarantees (checked by the property tests): no agent is over-committed; every task is matched
//! or has a reason; every agent a task prefers to its match holds a task it ranks above that
//! task (the stability deferred acceptance gives when tasks have sizes — with multi-dimensional
//! sizes a matching stable in the stronger "would fit after displacing" sense need not exist);
//! no unmatched task fits the room left on any agent it can use.
//!
//! Tie rules: a task prefers the agent with the higher S, then the lower agent index; an agent
//! ranks the task with the higher E, then the lower task index. Rounds process tasks and agents
//! in index order.

use std::fmt;

use super::Resources;

/// The coefficients of the two scores.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatchingCoefficients {
    /// Weight of the performance term P in the task's score.
    pub a: f64,
    /// Weight of the load term L in the task's score.
    pub b: f64,
    /// Weight of the slack T = ln(deadline / exec) in the agent's score. Negative by default: an
    /// agent is only proposed to by tasks it can finish in time, so rewarding slack would make it
    /// prefer the tasks that have other options; c < 0 makes it prefer the urgent ones, for which
    /// it is the scarce fast option (docs/batch.md has the measurement).
    pub c: f64,
    /// Weight of the cost R = exec · unit_cost in the agent's score (negative: cost is bad).
    pub d: f64,
    /// Weight of the value V = price / exec in the agent's score.
    pub e: f64,
}

impl Default for MatchingCoefficients {
    fn default() -> Self {
        MatchingCoefficients {
            a: 0.5,
            b: 0.5,
            c: -1.0,
            d: -0.1,
            e: 1.0,
        }
    }
}

// Coefficients are checked finite where they are read (config), so equality is reflexive.
impl Eq for MatchingCoefficients {}

/// The agent attributes the scores use (`--attributes cpu_speed:2;net_rate:1000;unit_cost:1.5`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AgentProfile {
    /// Work units done per second; a task's `exec = work / cpu_speed`. Default 1.
    pub cpu_speed: f64,
    /// Network rate (Mbit/s; only its ratio between agents matters). Default 1000.
    pub net_rate: f64,
    /// Cost of one second on the agent. Default 1.
    pub unit_cost: f64,
}

impl Default for AgentProfile {
    fn default() -> Self {
        AgentProfile {
            cpu_speed: 1.0,
            net_rate: 1000.0,
            unit_cost: 1.0,
        }
    }
}

/// Attribute names read by [`AgentProfile::from_attributes`].
pub const CPU_SPEED: &str = "cpu_speed";
pub const NET_RATE: &str = "net_rate";
pub const UNIT_COST: &str = "unit_cost";

impl AgentProfile {
    /// Reads the profile from agent attributes; missing ones keep their default. A value that is
    /// not a number in range is returned as an error naming it (with the profile built from the
    /// others), so the caller can warn and go on.
    pub fn from_attributes(attributes: &[(String, String)]) -> (AgentProfile, Vec<String>) {
        let mut profile = AgentProfile::default();
        let mut problems = Vec::new();
        for (key, value) in attributes {
            let (slot, positive) = match key.as_str() {
                CPU_SPEED => (&mut profile.cpu_speed, true),
                NET_RATE => (&mut profile.net_rate, false),
                UNIT_COST => (&mut profile.unit_cost, false),
                _ => continue,
            };
            match value.trim().parse::<f64>() {
                Ok(v) if v.is_finite() && (v > 0.0 || (!positive && v >= 0.0)) => *slot = v,
                _ => problems.push(format!(
                    "attribute {key}:{value} is not a {} number; using the default",
                    if positive { "positive" } else { "non-negative" }
                )),
            }
        }
        (profile, problems)
    }
}

/// One task of a batch.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchTask {
    pub id: String,
    pub resources: Resources,
    /// Seconds from submission by which the task must be done, > 0.
    pub deadline_secs: f64,
    /// Seconds the task runs on an agent of `cpu_speed` 1, > 0.
    pub work: f64,
    /// What the task is willing to pay, ≥ 0.
    pub price: f64,
}

/// One agent as the matcher sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct MatchAgent {
    pub id: String,
    pub total: Resources,
    /// What the batch may use.
    pub free: Resources,
    pub profile: AgentProfile,
}

/// Why a task was left unmatched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnmatchedReason {
    /// No agent's free resources hold the task.
    NoAgentFits,
    /// Some agents hold it, but on every one of them `work / cpu_speed > deadline`.
    DeadlineImpossible,
    /// Every agent it could use chose other tasks and has no room left for it.
    Outbid,
}

impl UnmatchedReason {
    /// The machine-readable code (wire and JSON).
    pub fn code(self) -> &'static str {
        match self {
            UnmatchedReason::NoAgentFits => "no_agent_fits",
            UnmatchedReason::DeadlineImpossible => "deadline_impossible",
            UnmatchedReason::Outbid => "outbid",
        }
    }
}

impl fmt::Display for UnmatchedReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UnmatchedReason::NoAgentFits => "no agent fits",
            UnmatchedReason::DeadlineImpossible => "deadline impossible on every agent",
            UnmatchedReason::Outbid => "outbid",
        })
    }
}

/// A task placed on an agent (indices into the inputs).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Match {
    pub task: usize,
    pub agent: usize,
    /// `work / cpu_speed` on that agent.
    pub exec_secs: f64,
}

/// The outcome of [`match_batch`].
#[derive(Clone, Debug, PartialEq)]
pub struct MatchResult {
    /// In task order.
    pub matches: Vec<Match>,
    /// In task order.
    pub unmatched: Vec<(usize, UnmatchedReason)>,
    /// Proposals made by the deferred-acceptance loop (≤ tasks × agents).
    pub proposals: u64,
    /// Rounds of that loop.
    pub rounds: u32,
    /// Unmatched tasks placed afterwards into room left on an agent.
    pub fills: u64,
}

impl MatchResult {
    /// The agent of each task (`None`: unmatched), by task index.
    pub fn assignment(&self, tasks: usize) -> Vec<Option<usize>> {
        let mut out = vec![None; tasks];
        for m in &self.matches {
            out[m.task] = Some(m.agent);
        }
        out
    }
}

/// Everything both sides' rankings need, computed once per batch.
///
/// Resources are laid out densely over the dimensions the batch's tasks ask for (`dims`), so a
/// fit test is a few integer comparisons instead of name look-ups. Each task's usable agents sit
/// in one flat buffer with their scores; the matcher sorts them lazily, a chunk at a time, since
/// a task rarely goes far down its list.
#[derive(Clone, Debug)]
pub struct Preferences {
    dims: usize,
    /// task-major: need[t * dims + d]
    need: Vec<u64>,
    /// agent-major: free[a * dims + d]
    free: Vec<u64>,
    /// (S, agent) of every usable agent of every task; task t owns `start[t]..start[t + 1]`.
    scored: Vec<(f64, u32)>,
    start: Vec<usize>,
    /// Per task: the reason when it has no usable agent.
    empty_reason: Vec<Option<UnmatchedReason>>,
    work: Vec<f64>,
    deadline: Vec<f64>,
    price: Vec<f64>,
    speed: Vec<f64>,
    unit_cost: Vec<f64>,
    coefficients: MatchingCoefficients,
}

/// `x / max`, 0 when the max is 0.
fn ratio(x: f64, max: f64) -> f64 {
    if max > 0.0 {
        x / max
    } else {
        0.0
    }
}

/// A task's order of agents: higher S first, then lower agent index (a total order).
fn task_order(x: &(f64, u32), y: &(f64, u32)) -> std::cmp::Ordering {
    y.0.total_cmp(&x.0).then(x.1.cmp(&y.1))
}

/// How many agents of a task's list are sorted at a time.
const CHUNK: usize = 16;

impl Preferences {
    pub fn new(
        tasks: &[BatchTask],
        agents: &[MatchAgent],
        coefficients: &MatchingCoefficients,
    ) -> Preferences {
        let mut names: Vec<&str> = tasks.iter().flat_map(|t| t.resources.names()).collect();
        names.sort_unstable();
        names.dedup();
        let dims = names.len();
        let mut need = Vec::with_capacity(tasks.len() * dims);
        for t in tasks {
            need.extend(names.iter().map(|n| t.resources.milli(n)));
        }
        let mut free = Vec::with_capacity(agents.len() * dims);
        for a in agents {
            free.extend(names.iter().map(|n| a.free.milli(n)));
        }

        // Agent-only quantities, normalised by their largest value.
        let power: Vec<f64> = agents
            .iter()
            .map(|a| a.profile.cpu_speed * a.total.amount("cpus"))
            .collect();
        let mem: Vec<f64> = agents.iter().map(|a| a.total.amount("mem")).collect();
        let net: Vec<f64> = agents.iter().map(|a| a.profile.net_rate).collect();
        let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
        let (max_power, max_mem, max_net) = (max(&power), max(&mem), max(&net));
        let power: Vec<f64> = power.iter().map(|&p| ratio(p, max_power)).collect();
        let mem: Vec<f64> = mem.iter().map(|&m| ratio(m, max_mem)).collect();
        let net: Vec<f64> = net.iter().map(|&n| ratio(n, max_net)).collect();

        // Load over cpus, mem and net where the agent's total has them:
        // L = (Σ free_d / total_d − Σ need_d / total_d) / count (the task fits, so no term < 0).
        const LOAD: [&str; 3] = ["cpus", "mem", "net"];
        struct Load {
            idle_now: f64,
            inverse_total: [f64; 3],
            count: f64,
        }
        let loads: Vec<Load> = agents
            .iter()
            .map(|a| {
                let mut load = Load {
                    idle_now: 0.0,
                    inverse_total: [0.0; 3],
                    count: 0.0,
                };
                for (d, name) in LOAD.iter().enumerate() {
                    let total = a.total.milli(name);
                    if total > 0 {
                        let inverse = 1.0 / total as f64;
                        load.inverse_total[d] = inverse;
                        load.idle_now += a.free.milli(name).min(total) as f64 * inverse;
                        load.count += 1.0;
                    }
                }
                load
            })
            .collect();

        let cpu_total: f64 = tasks.iter().map(|t| t.resources.amount("cpus")).sum();
        let mem_total: f64 = tasks.iter().map(|t| t.resources.amount("mem")).sum();

        let speed: Vec<f64> = agents.iter().map(|a| a.profile.cpu_speed).collect();
        let mut scored: Vec<(f64, u32)> = Vec::new();
        let mut start = Vec::with_capacity(tasks.len() + 1);
        let mut empty_reason = Vec::with_capacity(tasks.len());
        // Reused per task: (P, L) of its usable agents, parallel to its part of `scored`.
        let mut terms: Vec<(f64, f64)> = Vec::with_capacity(agents.len());
        for (t, task) in tasks.iter().enumerate() {
            start.push(scored.len());
            let task_need = &need[t * dims..(t + 1) * dims];
            let share_cpu = ratio(task.resources.amount("cpus"), cpu_total);
            let share_mem = ratio(task.resources.amount("mem"), mem_total);
            let (w_cpu, w_mem) = if share_cpu + share_mem > 0.0 {
                let sum = share_cpu + share_mem;
                (share_cpu / sum, share_mem / sum)
            } else {
                (0.5, 0.5)
            };
            let task_load = LOAD.map(|n| task.resources.milli(n) as f64);
            terms.clear();
            let (mut any_fits, mut max_p, mut max_l) = (false, 0.0f64, 0.0f64);
            for a in 0..agents.len() {
                let agent_free = &free[a * dims..(a + 1) * dims];
                if task_need.iter().zip(agent_free).any(|(n, f)| n > f) {
                    continue;
                }
                any_fits = true;
                if task.work > task.deadline_secs * speed[a] {
                    continue;
                }
                let p = w_cpu * power[a] + w_mem * mem[a] + net[a];
                let load = &loads[a];
                let l = if load.count > 0.0 {
                    let used = task_load[0] * load.inverse_total[0]
                        + task_load[1] * load.inverse_total[1]
                        + task_load[2] * load.inverse_total[2];
                    ((load.idle_now - used) / load.count).max(0.0)
                } else {
                    0.0
                };
                max_p = max_p.max(p);
                max_l = max_l.max(l);
                terms.push((p, l));
                scored.push((0.0, a as u32));
            }
            let first = start[t];
            for (slot, &(p, l)) in scored[first..].iter_mut().zip(&terms) {
                slot.0 = coefficients.a * ratio(p, max_p) + coefficients.b * ratio(l, max_l);
            }
            empty_reason.push(match (terms.is_empty(), any_fits) {
                (false, _) => None,
                (true, true) => Some(UnmatchedReason::DeadlineImpossible),
                (true, false) => Some(UnmatchedReason::NoAgentFits),
            });
        }
        start.push(scored.len());
        Preferences {
            dims,
            need,
            free,
            scored,
            start,
            empty_reason,
            work: tasks.iter().map(|t| t.work).collect(),
            deadline: tasks.iter().map(|t| t.deadline_secs).collect(),
            price: tasks.iter().map(|t| t.price).collect(),
            speed,
            unit_cost: agents.iter().map(|a| a.profile.unit_cost).collect(),
            coefficients: *coefficients,
        }
    }

    /// The agents `task` can use, most preferred first.
    pub fn list(&self, task: usize) -> Vec<u32> {
        let mut part = self.scored[self.start[task]..self.start[task + 1]].to_vec();
        part.sort_unstable_by(task_order);
        part.into_iter().map(|(_, a)| a).collect()
    }

    /// The position of `agent` in `task`'s list (`None`: the task cannot use it).
    pub fn rank(&self, task: usize, agent: usize) -> Option<usize> {
        self.list(task).iter().position(|&a| a as usize == agent)
    }

    /// The task's score of an agent it can use (`None` otherwise).
    pub fn task_score(&self, task: usize, agent: usize) -> Option<f64> {
        self.scored[self.start[task]..self.start[task + 1]]
            .iter()
            .find(|s| s.1 as usize == agent)
            .map(|s| s.0)
    }

    /// `work / cpu_speed` of the task on the agent.
    pub fn exec_secs(&self, agent: usize, task: usize) -> f64 {
        self.work[task] / self.speed[agent]
    }

    /// The agent's score of a task, `E = c·T + d·R + e·V`.
    pub fn agent_score(&self, agent: usize, task: usize) -> f64 {
        let exec = self.exec_secs(agent, task);
        let k = &self.coefficients;
        k.c * (self.deadline[task] / exec).ln()
            + k.d * exec * self.unit_cost[agent]
            + k.e * self.price[task] / exec
    }

    /// True when the agent ranks task `x` above task `y`.
    pub fn agent_prefers(&self, agent: usize, x: usize, y: usize) -> bool {
        let (ex, ey) = (self.agent_score(agent, x), self.agent_score(agent, y));
        ex.total_cmp(&ey).then(y.cmp(&x)).is_gt()
    }

    fn fits(&self, task: usize, room: &[u64]) -> bool {
        self.need[task * self.dims..(task + 1) * self.dims]
            .iter()
            .zip(room)
            .all(|(n, r)| n <= r)
    }

    fn take(&self, task: usize, room: &mut [u64]) {
        for (r, n) in room
            .iter_mut()
            .zip(&self.need[task * self.dims..(task + 1) * self.dims])
        {
            *r -= n;
        }
    }

    /// The `i`-th agent of the task's list, sorting the next chunk when `i` reaches it.
    /// `sorted` is how far the task's part is sorted (relative to its start).
    fn nth_choice(&mut self, task: usize, i: usize, sorted: &mut usize) -> Option<u32> {
        let part = &mut self.scored[self.start[task]..self.start[task + 1]];
        if i >= part.len() {
            return None;
        }
        if i >= *sorted {
            let rest = &mut part[*sorted..];
            let k = CHUNK.min(rest.len());
            if k < rest.len() {
                rest.select_nth_unstable_by(k - 1, task_order);
            }
            rest[..k].sort_unstable_by(task_order);
            *sorted += k;
        }
        Some(part[i].1)
    }
}

/// Matches a batch of tasks to agents by deferred acceptance; see the module doc.
pub fn match_batch(
    tasks: &[BatchTask],
    agents: &[MatchAgent],
    coefficients: &MatchingCoefficients,
) -> MatchResult {
    let mut prefs = Preferences::new(tasks, agents, coefficients);
    match_with(&mut prefs, tasks.len(), agents.len())
}

/// [`match_batch`] on rankings already computed (the lists' internal order changes, not their
/// content).
pub fn match_with(prefs: &mut Preferences, tasks: usize, agents: usize) -> MatchResult {
    let dims = prefs.dims;
    let mut next = vec![0usize; tasks];
    let mut sorted = vec![0usize; tasks];
    // Per agent: held tasks as (E, task).
    let mut held: Vec<Vec<(f64, u32)>> = vec![Vec::new(); agents];
    let mut inbox: Vec<Vec<u32>> = vec![Vec::new(); agents];
    let mut assigned: Vec<Option<u32>> = vec![None; tasks];
    let mut proposing: Vec<u32> = (0..tasks as u32)
        .filter(|&t| prefs.empty_reason[t as usize].is_none())
        .collect();
    let mut touched: Vec<u32> = Vec::new();
    let mut room = vec![0u64; dims];
    let mut candidates: Vec<(f64, u32)> = Vec::new();
    let mut proposals = 0u64;
    let mut rounds = 0u32;

    loop {
        touched.clear();
        for &t in &proposing {
            let t = t as usize;
            if let Some(a) = prefs.nth_choice(t, next[t], &mut sorted[t]) {
                next[t] += 1;
                proposals += 1;
                if inbox[a as usize].is_empty() {
                    touched.push(a);
                }
                inbox[a as usize].push(t as u32);
            }
        }
        proposing.clear();
        if touched.is_empty() {
            break;
        }
        rounds += 1;
        touched.sort_unstable();
        for &a in &touched {
            let a = a as usize;
            candidates.clear();
            candidates.append(&mut held[a]);
            candidates.extend(
                inbox[a]
                    .drain(..)
                    .map(|t| (prefs.agent_score(a, t as usize), t)),
            );
            // Higher E first, then lower task index.
            candidates.sort_unstable_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)));
            room.copy_from_slice(&prefs.free[a * dims..(a + 1) * dims]);
            for &(e, t) in &candidates {
                if prefs.fits(t as usize, &room) {
                    prefs.take(t as usize, &mut room);
                    held[a].push((e, t));
                    assigned[t as usize] = Some(a as u32);
                } else {
                    assigned[t as usize] = None;
                    proposing.push(t);
                }
            }
        }
        proposing.sort_unstable();
    }

    // Fill: unmatched tasks, in batch order, into room left (no displacement).
    let mut rooms: Vec<u64> = prefs.free.clone();
    for (a, tasks_held) in held.iter().enumerate() {
        for &(_, t) in tasks_held {
            prefs.take(t as usize, &mut rooms[a * dims..(a + 1) * dims]);
        }
    }
    let mut fills = 0u64;
    for t in 0..tasks {
        if assigned[t].is_some() || prefs.empty_reason[t].is_some() {
            continue;
        }
        let mut i = 0;
        while let Some(a) = prefs.nth_choice(t, i, &mut sorted[t]) {
            i += 1;
            let agent_room = &mut rooms[a as usize * dims..(a as usize + 1) * dims];
            if prefs.fits(t, agent_room) {
                prefs.take(t, agent_room);
                assigned[t] = Some(a);
                fills += 1;
                break;
            }
        }
    }

    let mut matches = Vec::new();
    let mut unmatched = Vec::new();
    for (t, slot) in assigned.iter().enumerate() {
        match slot {
            Some(a) => matches.push(Match {
                task: t,
                agent: *a as usize,
                exec_secs: prefs.exec_secs(*a as usize, t),
            }),
            None => unmatched.push((t, prefs.empty_reason[t].unwrap_or(UnmatchedReason::Outbid))),
        }
    }
    MatchResult {
        matches,
        unmatched,
        proposals,
        rounds,
        fills,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(text: &str) -> Resources {
        Resources::parse(text).unwrap()
    }

    fn agent(id: &str, res: &str, speed: f64, cost: f64) -> MatchAgent {
        MatchAgent {
            id: id.into(),
            total: r(res),
            free: r(res),
            profile: AgentProfile {
                cpu_speed: speed,
                net_rate: 1000.0,
                unit_cost: cost,
            },
        }
    }

    fn task(id: &str, res: &str, deadline: f64, work: f64, price: f64) -> BatchTask {
        BatchTask {
            id: id.into(),
            resources: r(res),
            deadline_secs: deadline,
            work,
            price,
        }
    }

    #[test]
    fn attributes_make_a_profile_and_bad_ones_are_named() {
        let attrs = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let (p, problems) = AgentProfile::from_attributes(&attrs(&[
            ("cpu_speed", "2.5"),
            ("rack", "r1"),
            ("unit_cost", "0"),
        ]));
        assert_eq!(
            p,
            AgentProfile {
                cpu_speed: 2.5,
                net_rate: 1000.0,
                unit_cost: 0.0
            }
        );
        assert!(problems.is_empty());
        let (p, problems) =
            AgentProfile::from_attributes(&attrs(&[("cpu_speed", "0"), ("net_rate", "fast")]));
        assert_eq!(p, AgentProfile::default());
        assert_eq!(
            problems,
            [
                "attribute cpu_speed:0 is not a positive number; using the default",
                "attribute net_rate:fast is not a non-negative number; using the default"
            ]
        );
    }

    /// The example of docs/batch.md, worked by hand there.
    ///
    /// fast: cpus:4;mem:4096, speed 2, cost 2. slow: cpus:4;mem:4096, speed 1, cost 1.
    /// Every task asks cpus:2;mem:1024, so both agents hold two tasks each.
    /// - urgent (deadline 2, work 3): exec 1.5 on fast, 3 on slow → only fast is usable.
    /// - cheap (deadline 10, work 2, price 1), rich (deadline 10, work 2, price 4),
    ///   late (deadline 10, work 2, price 0.5): usable on both.
    ///
    /// P: equal cpu/mem weights (0.5/0.5), power fast 8 vs slow 4 → 1 and 0.5, mem 1 and 1,
    /// net 1 and 1: P fast = 2, slow = 1.75 → P̂ 1 and 0.875. L (mean of 2/4 and 3072/4096 idle
    /// after) is 0.625 on both → L̂ = 1. S fast = 1, slow = 0.9375: every task proposes to fast
    /// first.
    ///
    /// fast's E (exec 1.5 for urgent, 1 for the others; c=−1, d=−0.1, e=1):
    /// urgent −ln(2/1.5) − 0.1·1.5·2 + 1/1.5 = −0.2877 − 0.3 + 0.6667 = 0.0790;
    /// cheap −ln 10 − 0.2 + 1 = −1.5026; rich −2.3026 − 0.2 + 4 = 1.4974; late −2.0026.
    /// Round 1: fast keeps rich and urgent (two fit), rejects cheap and late.
    /// Round 2: cheap and late propose to slow, which holds both. Six proposals, all matched.
    #[test]
    fn hand_worked_example() {
        let agents = [
            agent("fast", "cpus:4;mem:4096", 2.0, 2.0),
            agent("slow", "cpus:4;mem:4096", 1.0, 1.0),
        ];
        let unit = "cpus:2;mem:1024";
        let tasks = [
            task("urgent", unit, 2.0, 3.0, 1.0),
            task("cheap", unit, 10.0, 2.0, 1.0),
            task("rich", unit, 10.0, 2.0, 4.0),
            task("late", unit, 10.0, 2.0, 0.5),
        ];
        let k = MatchingCoefficients::default();
        let prefs = Preferences::new(&tasks, &agents, &k);
        assert_eq!(prefs.list(0), [0]);
        for t in 1..4 {
            assert_eq!(prefs.list(t), [0, 1], "task {t}");
        }
        let e = |a: usize, t: usize| (prefs.agent_score(a, t) * 10_000.0).round() / 10_000.0;
        assert_eq!(
            [e(0, 0), e(0, 1), e(0, 2), e(0, 3)],
            [0.079, -1.5026, 1.4974, -2.0026]
        );

        let result = match_batch(&tasks, &agents, &k);
        let pairs: Vec<(&str, &str)> = result
            .matches
            .iter()
            .map(|m| (tasks[m.task].id.as_str(), agents[m.agent].id.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("urgent", "fast"),
                ("cheap", "slow"),
                ("rich", "fast"),
                ("late", "slow")
            ]
        );
        assert!(result.unmatched.is_empty());
        assert_eq!((result.proposals, result.rounds, result.fills), (6, 2, 0));
        assert_eq!(result.matches[0].exec_secs, 1.5);
        assert_eq!(result.matches[1].exec_secs, 2.0);
    }

    #[test]
    fn reasons_distinguish_fit_deadline_and_outbid() {
        let agents = [agent("a", "cpus:2;mem:1024", 1.0, 1.0)];
        let tasks = [
            task("huge", "cpus:4", 10.0, 1.0, 1.0),
            task("slow", "cpus:1", 1.0, 5.0, 1.0),
            task("ok", "cpus:2", 10.0, 1.0, 2.0),
            task("loser", "cpus:2", 10.0, 1.0, 1.0),
            task("gpu", "gpus:1", 10.0, 1.0, 1.0),
        ];
        let result = match_batch(&tasks, &agents, &MatchingCoefficients::default());
        assert_eq!(result.assignment(5), [None, None, Some(0), None, None]);
        assert_eq!(
            result.unmatched,
            [
                (0, UnmatchedReason::NoAgentFits),
                (1, UnmatchedReason::DeadlineImpossible),
                (3, UnmatchedReason::Outbid),
                (4, UnmatchedReason::NoAgentFits),
            ]
        );
        assert_eq!(
            UnmatchedReason::DeadlineImpossible.to_string(),
            "deadline impossible on every agent"
        );
    }

    #[test]
    fn a_misfit_is_skipped_and_smaller_tasks_still_fit() {
        // The agent ranks big (price 9) first, then medium (does not fit beside big), then
        // small (fits): skip-misfit keeps big and small.
        let agents = [agent("a", "cpus:4", 1.0, 1.0)];
        let tasks = [
            task("big", "cpus:3", 10.0, 1.0, 9.0),
            task("medium", "cpus:2", 10.0, 1.0, 5.0),
            task("small", "cpus:1", 10.0, 1.0, 1.0),
        ];
        let result = match_batch(&tasks, &agents, &MatchingCoefficients::default());
        assert_eq!(result.assignment(3), [Some(0), None, Some(0)]);
        assert_eq!(result.unmatched, [(1, UnmatchedReason::Outbid)]);
    }

    #[test]
    fn unmatched_tasks_fill_room_freed_by_displacement() {
        // Scores on performance only, so every task prefers the faster agent B when it fits.
        // Round 1: A keeps x (8 cpus) and rejects t (5 cpus, mem: only A has mem); B keeps z and
        // rejects y. Round 2: y goes to A and displaces x; t has no agent left. A now has 5 cpus
        // free that t fits: the fill places it; x (fits only A) stays outbid.
        let k = MatchingCoefficients {
            a: 1.0,
            b: 0.0,
            ..MatchingCoefficients::default()
        };
        let agents = [
            agent("A", "cpus:10;mem:10", 1.0, 1.0),
            agent("B", "cpus:5", 4.0, 1.0),
        ];
        let tasks = [
            task("x", "cpus:8", 10.0, 1.0, 5.0),
            task("t", "cpus:5;mem:1", 10.0, 1.0, 3.0),
            task("y", "cpus:5", 10.0, 1.0, 9.0),
            task("z", "cpus:5", 10.0, 1.0, 10.0),
        ];
        let result = match_batch(&tasks, &agents, &k);
        assert_eq!(result.assignment(4), [None, Some(0), Some(0), Some(1)]);
        assert_eq!(result.unmatched, [(0, UnmatchedReason::Outbid)]);
        assert_eq!((result.proposals, result.rounds, result.fills), (5, 2, 1));
    }

    #[test]
    fn empty_inputs() {
        let k = MatchingCoefficients::default();
        let result = match_batch(&[], &[], &k);
        assert!(result.matches.is_empty() && result.unmatched.is_empty());
        let tasks = [task("t", "cpus:1", 1.0, 1.0, 1.0)];
        let result = match_batch(&tasks, &[], &k);
        assert_eq!(result.unmatched, [(0, UnmatchedReason::NoAgentFits)]);
        assert_eq!(result.proposals, 0);
    }
}
