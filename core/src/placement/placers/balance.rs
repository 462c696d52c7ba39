//! Balance-degree placement with dynamic weights (SPEC seed 000).
//!
//! The placer keeps each agent's per-dimension utilisation even, so more tasks fit. It needs
//! what a plain [`Placer`] does not see: which demands are pending and which dimension blocks
//! them. That lives in a [`PlacementContext`] ([`super::context`]), owned by whoever drives
//! placement ([`crate::placement::allocate_in`] builds it from the step's requests) and handed to
//! [`Placer::place`], which also keeps the weights below.
//!
//! Definitions (k balance dimensions, in the order of the configured initial weights, else the
//! cluster's dimension names sorted):
//! - weights `w_i = (w0_i + w1_i + w2_i) / 3`: `w0` configured, `w1` the [`priority_chart`] of
//!   `r_i` = pending copies that no agent can hold because of dimension i (the demand's amount of
//!   i exceeds every agent's free amount of i), `w2` the chart of cluster utilisation per
//!   dimension;
//! - balance of an agent with demand a placed: `d_i = (used_i + a_i) / total_i` over the balance
//!   dimensions the agent has, `m = mean(d)`, `y = sqrt(Σ w_i (d_i − m)²)`; smaller is better;
//! - cluster utilisation `U = mean_i(Σ used_i / Σ total_i)`; at or above the threshold: the
//!   fitting agent with the smallest y after; below: the first fitting agent whose y improves,
//!   else the smallest y after. `require_improvement`: a non-idle agent must improve.
//!
//! Weights are cached in the context and recomputed only when an input changed: a placement
//! (utilisation), a change of the pending set, or a change of some dimension's largest free
//! amount (what "blocked" is measured against).

use super::{dominant_dimension, fitting_agents, Decision, Placer, PlacerNote};
use crate::placement::{AgentEntry, AgentKey, Cluster, Resources};

// The balance placer's settings, context and explanation under their old paths
// (`placement::balance::…`); they live with the context and the trait.
pub use super::context::{
    priority_chart, priority_chart_by, BalanceSettings, BalanceSettingsError, PlacementContext,
    WEIGHT_SUM_TOLERANCE,
};
pub use super::BalanceNote;

/// `y after` must be below `y before` by more than this to count as an improvement (float noise).
pub const IMPROVEMENT_EPSILON: f64 = 1e-12;

/// Balance y of `agent` with `demand` placed on it (an empty demand gives the balance now).
/// Dimensions the agent does not have are left out of d, m and the sum.
pub fn balance_y(dims: &[String], weights: &[f64], agent: &AgentEntry, demand: &Resources) -> f64 {
    balance_before_after(dims, weights, agent, demand).1
}

/// (y before, y after) in one pass over the dimensions: each amount is looked up once.
fn balance_before_after(
    dims: &[String],
    weights: &[f64],
    agent: &AgentEntry,
    demand: &Resources,
) -> (f64, f64) {
    const INLINE: usize = 8;
    // (weight, d before, d after) per dimension the agent has; on the stack for up to 8.
    let mut inline = [(0.0, 0.0, 0.0); INLINE];
    let mut spill = Vec::new();
    let mut count = 0usize;
    let (mut sum_before, mut sum_after) = (0.0, 0.0);
    for (dim, w) in dims.iter().zip(weights) {
        let total = agent.total.milli(dim);
        if total == 0 {
            continue;
        }
        let used = total.saturating_sub(agent.free.milli(dim));
        let before = used as f64 / total as f64;
        let after = used.saturating_add(demand.milli(dim)) as f64 / total as f64;
        sum_before += before;
        sum_after += after;
        if count < INLINE {
            inline[count] = (*w, before, after);
        } else {
            spill.push((*w, before, after));
        }
        count += 1;
    }
    if count == 0 {
        return (0.0, 0.0);
    }
    let (m_before, m_after) = (sum_before / count as f64, sum_after / count as f64);
    let (mut y_before, mut y_after) = (0.0, 0.0);
    for (w, before, after) in inline[..count.min(INLINE)].iter().chain(&spill) {
        y_before += w * (before - m_before) * (before - m_before);
        y_after += w * (after - m_after) * (after - m_after);
    }
    (y_before.sqrt(), y_after.sqrt())
}

fn idle(agent: &AgentEntry) -> bool {
    agent
        .total
        .iter()
        .all(|(name, total)| agent.free.milli(name) == total)
}

/// The balance-degree placer of SPEC seed 000; see the module doc. Fitting agents are visited in
/// best-fit order of the demand's dominant dimension ([`fitting_agents`]); "first improving" is
/// the first in that order; "smallest y" ties go to the lowest key.
#[derive(Clone, Copy, Debug, Default)]
pub struct BalancePlacer;

impl Placer for BalancePlacer {
    fn name(&self) -> &'static str {
        "balance"
    }

    /// A default context means default settings and no pending demands.
    fn place(
        &self,
        cluster: &Cluster,
        demand: &Resources,
        eligible: &dyn Fn(AgentKey) -> bool,
        context: &mut PlacementContext,
    ) -> Option<Decision> {
        dominant_dimension(demand, cluster.total())?;
        let view = context.balance_view(cluster)?;
        let settings = view.settings;
        let at_threshold = view.utilisation >= settings.threshold();
        // (y after, key, y before) of the best so far.
        let mut best: Option<(f64, AgentKey, f64)> = None;
        let mut chosen = None;
        for (key, agent) in fitting_agents(cluster, demand, eligible) {
            let (before, after) = balance_before_after(view.dims, view.weights, agent, demand);
            let improves = after < before - IMPROVEMENT_EPSILON;
            if settings.require_improvement() && !improves && !idle(agent) {
                continue;
            }
            if improves && !at_threshold {
                chosen = Some((after, key, before));
                break;
            }
            let better =
                best.is_none_or(|(by, bk, _)| after.total_cmp(&by).then(key.cmp(&bk)).is_lt());
            if better {
                best = Some((after, key, before));
            }
        }
        chosen.or(best).map(|(y_after, agent, y_before)| Decision {
            note: PlacerNote::Balance(BalanceNote {
                weights: view.weights.to_vec(),
                y_before,
                y_after,
            }),
            ..Decision::plain(agent)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::RingsConfig;

    fn r(text: &str) -> Resources {
        Resources::parse(text).unwrap()
    }

    /// The balance placer itself, whatever the cluster's own placer.
    fn place(
        cluster: &Cluster,
        demand: &Resources,
        eligible: &dyn Fn(AgentKey) -> bool,
        context: &mut PlacementContext,
    ) -> Option<Decision> {
        BalancePlacer.place(cluster, demand, eligible, context)
    }

    fn round4(x: f64) -> f64 {
        (x * 10_000.0).round() / 10_000.0
    }

    fn equal_settings(require_improvement: bool) -> BalanceSettings {
        let w = ["cpus", "mem", "gpus"].map(|n| (n.to_string(), 1.0 / 3.0));
        BalanceSettings::new(Some(w.to_vec()), 0.5, require_improvement).unwrap()
    }

    /// SPEC seed 000, golden example, driven by hand (the dry-run test drives it end to end).
    #[test]
    fn golden_example_step_by_step() {
        let mut cluster = Cluster::new(RingsConfig::default(), Default::default());
        let a = cluster.add_agent(r("cpus:100;mem:1000;gpus:10"));
        let jobs = [
            ("job5", "cpus:20;mem:500;gpus:4"),
            ("job2", "cpus:30;mem:400;gpus:2"),
            ("job1", "cpus:40;mem:200;gpus:2"),
            ("job4", "cpus:40;mem:300;gpus:4"),
            ("job3", "cpus:30;mem:300;gpus:1"),
            ("job6", "cpus:30;mem:200;gpus:1"),
        ];
        let demands: Vec<Resources> = jobs.iter().map(|(_, d)| r(d)).collect();
        let mut context = PlacementContext::new(equal_settings(true));
        context.set_pending(demands.iter().map(|d| (d, 1)));
        let mut notes = Vec::new();
        for (i, demand) in demands.iter().enumerate() {
            let decision = place(&cluster, demand, &|_| true, &mut context);
            context.remove_pending(demand, 1);
            if let Some(d) = decision {
                cluster.take(d.agent, demand).unwrap();
                let note = d.balance().unwrap().clone();
                notes.push((
                    jobs[i].0,
                    note.weights.iter().map(|w| round4(*w)).collect::<Vec<_>>(),
                    round4(note.y_before),
                    round4(note.y_after),
                ));
            }
        }
        assert_eq!(
            notes,
            [
                ("job5", vec![0.3333, 0.3333, 0.3333], 0.0, 0.1247),
                ("job1", vec![0.2593, 0.4074, 0.3333], 0.1217, 0.0497),
                ("job4", vec![0.2963, 0.4074, 0.2963], 0.0497, 0.0),
            ]
        );
        assert!(cluster.agent(a).unwrap().free.is_empty());
        // job2's refusal, with the weights it saw (after job5).
        let mut after_job5 = Cluster::new(RingsConfig::default(), Default::default());
        let b = after_job5.add_agent(r("cpus:100;mem:1000;gpus:10"));
        after_job5.take(b, &demands[0]).unwrap();
        let mut context = PlacementContext::new(equal_settings(true));
        context.set_pending(demands[1..].iter().map(|d| (d, 1)));
        let weights: Vec<f64> = context
            .weights(&after_job5)
            .into_iter()
            .map(|(_, w)| w)
            .collect();
        let dims = ["cpus", "mem", "gpus"].map(String::from);
        let agent = after_job5.agent(b).unwrap();
        assert_eq!(
            round4(balance_y(&dims, &weights, agent, &Resources::new())),
            0.1217
        );
        assert_eq!(
            round4(balance_y(&dims, &weights, agent, &demands[1])),
            0.1757
        );
        assert_eq!(
            place(&after_job5, &demands[1], &|_| true, &mut context),
            None
        );
        // Without require_improvement job2 goes to the only agent (smallest y after).
        let mut lenient = PlacementContext::new(equal_settings(false));
        let d = place(&after_job5, &demands[1], &|_| true, &mut lenient).unwrap();
        assert_eq!(d.agent, b);
    }

    #[test]
    fn blocked_demands_raise_their_dimension() {
        let mut cluster = Cluster::new(RingsConfig::default(), Default::default());
        cluster.add_agent(r("cpus:8;mem:1000;gpus:1"));
        let big = cluster.add_agent(r("cpus:4;mem:4000"));
        let mut context = PlacementContext::new(equal_settings(false));
        let gpu_heavy = r("cpus:1;gpus:2");
        let mem_heavy = r("cpus:1;mem:5000");
        context.set_pending([(&gpu_heavy, 3), (&mem_heavy, 1)]);
        let blocked = |context: &mut PlacementContext, cluster: &Cluster| -> Vec<u64> {
            context
                .blocked_counts(cluster)
                .into_iter()
                .map(|(_, n)| n)
                .collect()
        };
        assert_eq!(blocked(&mut context, &cluster), [0, 1, 3]);
        // r = (0, 1, 3) → chart (1/9, 1/3, 5/9); utilisation all 0 → (1/3, 1/3, 1/3).
        let w: Vec<f64> = context
            .weights(&cluster)
            .into_iter()
            .map(|(_, w)| w)
            .collect();
        let third = 1.0 / 3.0;
        let want = [
            (third + 1.0 / 9.0 + third) / 3.0,
            (third + third + third) / 3.0,
            (third + 5.0 / 9.0 + third) / 3.0,
        ];
        for (got, want) in w.iter().zip(want) {
            assert!((got - want).abs() < 1e-15, "{w:?}");
        }
        // A change of the pending set adjusts the counts directly.
        context.remove_pending(&gpu_heavy, 2);
        let mid_mem = r("mem:3000");
        context.add_pending(&mid_mem, 2);
        assert_eq!(blocked(&mut context, &cluster), [0, 1, 1]);
        // The largest free mem falls from 4000 to 1000: the mid-size demands are blocked now.
        cluster.take(big, &r("mem:3500")).unwrap();
        assert_eq!(blocked(&mut context, &cluster), [0, 3, 1]);
        cluster.give_back(big, &r("mem:3500")).unwrap();
        assert_eq!(blocked(&mut context, &cluster), [0, 1, 1]);
        cluster.remove_agent(big);
        assert_eq!(blocked(&mut context, &cluster), [0, 3, 1]);
        context.remove_pending(&mid_mem, 5);
        context.remove_pending(&r("disk:1"), 1);
        assert_eq!(blocked(&mut context, &cluster), [0, 1, 1]);
    }

    #[test]
    fn threshold_decides_between_first_improving_and_smallest() {
        // Visiting order is by free cpus: agent 1 (8) before agent 0 (10).
        let mut cluster = Cluster::new(RingsConfig::default(), Default::default());
        let a = cluster.add_agent(r("cpus:10;mem:1000"));
        cluster.take(a, &r("mem:500")).unwrap();
        let b = cluster.add_agent(r("cpus:8;mem:1000"));
        cluster.take(b, &r("mem:800")).unwrap();
        let w = vec![("cpus".to_string(), 0.5), ("mem".to_string(), 0.5)];
        let context = |threshold: f64| {
            PlacementContext::new(BalanceSettings::new(Some(w.clone()), threshold, false).unwrap())
        };
        // Utilisation: cpus 0, mem 1300/2000 → U = 0.325.
        // cpus:5 improves both: agent 1 (0, 0.8) → (0.625, 0.8), y 0.4 → 0.0875;
        // agent 0 (0, 0.5) → (0.5, 0.5), y 0.25 → 0.
        let demand = r("cpus:5");
        let below = place(&cluster, &demand, &|_| true, &mut context(0.4)).unwrap();
        let note = below.balance().unwrap().clone();
        assert_eq!(
            below.agent, b,
            "below the threshold: the first that improves"
        );
        assert_eq!((round4(note.y_before), round4(note.y_after)), (0.4, 0.0875));
        let at = place(&cluster, &demand, &|_| true, &mut context(0.3)).unwrap();
        assert_eq!(at.agent, a, "at or above: the smallest y after");
        assert_eq!(at.balance().unwrap().y_after, 0.0);
        // mem:100 worsens both (agent 1: 0.4 → 0.45, agent 0: 0.25 → 0.3): smallest y after.
        let worse = place(&cluster, &r("mem:100"), &|_| true, &mut context(1.0)).unwrap();
        assert_eq!(worse.agent, a);
        assert_eq!(round4(worse.balance().unwrap().y_after), 0.3);
        // With require_improvement nothing is eligible (neither agent is idle).
        let strict = BalanceSettings::new(Some(w.clone()), 1.0, true).unwrap();
        let mut strict = PlacementContext::new(strict);
        assert_eq!(place(&cluster, &r("mem:100"), &|_| true, &mut strict), None);
        // An idle agent always is.
        let idle = cluster.add_agent(r("cpus:1;mem:1000"));
        let d = place(&cluster, &r("mem:100"), &|_| true, &mut strict).unwrap();
        assert_eq!(d.agent, idle);
    }
}
