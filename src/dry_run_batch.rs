//! The `batch:` section of a `ringmaster place` scenario: a burst matched at once (SPEC seed 002).
//!
//! After the scenario's requests are placed, the batch is matched against what the agents have
//! left, with the very matcher the master runs ([`ringmaster_core::placement::matching`]). Agents may carry
//! the attributes the scores use (`cpu_speed`, `net_rate`, `unit_cost`; defaults otherwise).
//! Output, after the request lines: one line per match, then one line with the unmatched tasks,
//! their reasons and the number of proposals.
//!
//! ```yaml
//! agents:
//!   - { id: fast, resources: "cpus:4;mem:4096", cpu_speed: 2, unit_cost: 2 }
//!   - { id: slow, resources: "cpus:4;mem:4096" }
//! batch:
//!   matching: { c: -1 }       # optional; unset ones default; without it the config's `matching:`
//!   tasks:
//!     - { id: urgent, resources: "cpus:2;mem:1024", deadline: 2, work: 3, price: 1 }
//! ```

use serde::{Deserialize, Serialize};

use crate::config::{apply_matching, ConfigError, RawMatching, Seg, YamlSource};
use ringmaster_core::placement::matching::{
    match_batch, AgentProfile, BatchTask, MatchAgent, MatchingCoefficients,
};
use ringmaster_core::placement::Resources;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBatch {
    matching: Option<RawMatching>,
    tasks: Vec<RawBatchTask>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBatchTask {
    id: String,
    resources: String,
    deadline: serde_yaml::Value,
    work: serde_yaml::Value,
    price: Option<serde_yaml::Value>,
}

/// The score attributes an agent entry may carry.
#[derive(Debug, Default, Deserialize)]
pub struct RawAgentScores {
    pub cpu_speed: Option<serde_yaml::Value>,
    pub net_rate: Option<serde_yaml::Value>,
    pub unit_cost: Option<serde_yaml::Value>,
}

/// A checked `batch:` section.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchSection {
    pub coefficients: Option<MatchingCoefficients>,
    pub tasks: Vec<BatchTask>,
}

fn number(
    source: &YamlSource,
    path: &[Seg],
    value: &serde_yaml::Value,
    positive: bool,
) -> Result<f64, ConfigError> {
    match value.as_f64() {
        Some(x) if x.is_finite() && (x > 0.0 || (!positive && x >= 0.0)) => Ok(x),
        _ => Err(source.error(
            path,
            if positive {
                "must be a number greater than 0"
            } else {
                "must be a number ≥ 0"
            },
        )),
    }
}

/// The profile of the agent at `agents[index]`.
pub fn agent_profile(
    source: &YamlSource,
    index: usize,
    raw: &RawAgentScores,
) -> Result<AgentProfile, ConfigError> {
    let mut profile = AgentProfile::default();
    let at = |field: &str| -> Vec<Seg> { vec!["agents".into(), index.into(), field.into()] };
    if let Some(v) = &raw.cpu_speed {
        profile.cpu_speed = number(source, &at("cpu_speed"), v, true)?;
    }
    if let Some(v) = &raw.net_rate {
        profile.net_rate = number(source, &at("net_rate"), v, false)?;
    }
    if let Some(v) = &raw.unit_cost {
        profile.unit_cost = number(source, &at("unit_cost"), v, false)?;
    }
    Ok(profile)
}

impl BatchSection {
    /// Checks a `batch:` section; errors name file, line and key.
    pub fn from_raw(source: &YamlSource, raw: &RawBatch) -> Result<BatchSection, ConfigError> {
        let coefficients = match &raw.matching {
            Some(m) => {
                let mut k = MatchingCoefficients::default();
                apply_matching(source, &["batch".into(), "matching".into()], m, &mut k)?;
                Some(k)
            }
            None => None,
        };
        let mut ids = std::collections::HashSet::new();
        let mut tasks = Vec::with_capacity(raw.tasks.len());
        for (i, t) in raw.tasks.iter().enumerate() {
            let at = |field: &str| -> Vec<Seg> {
                vec!["batch".into(), "tasks".into(), i.into(), field.into()]
            };
            if !ids.insert(t.id.as_str()) {
                return Err(source.error(&at("id"), format!("duplicate task id `{}`", t.id)));
            }
            let resources = Resources::parse(&t.resources)
                .map_err(|e| source.error(&at("resources"), e.to_string()))?;
            if resources.is_empty() {
                return Err(source.error(&at("resources"), "a task must ask for something"));
            }
            tasks.push(BatchTask {
                id: t.id.clone(),
                resources,
                deadline_secs: number(source, &at("deadline"), &t.deadline, true)?,
                work: number(source, &at("work"), &t.work, true)?,
                price: match &t.price {
                    Some(v) => number(source, &at("price"), v, false)?,
                    None => 1.0,
                },
            });
        }
        Ok(BatchSection {
            coefficients,
            tasks,
        })
    }
}

#[derive(Serialize)]
struct MatchLine<'a> {
    batch_match: &'a str,
    agent: &'a str,
    exec_secs: f64,
}

#[derive(Serialize)]
struct UnmatchedEntry<'a> {
    task: &'a str,
    reason: &'a str,
    why: String,
}

#[derive(Serialize)]
struct ResultLine<'a> {
    batch_unmatched: Vec<UnmatchedEntry<'a>>,
    proposals: u64,
    rounds: u32,
    fills: u64,
}

/// Matches the batch against the agents: (id, total, free, profile). Returns the output lines.
pub fn run(
    batch: &BatchSection,
    config_coefficients: &MatchingCoefficients,
    agents: &[(String, Resources, Resources, AgentProfile)],
) -> Vec<String> {
    let coefficients = batch.coefficients.unwrap_or(*config_coefficients);
    let agents: Vec<MatchAgent> = agents
        .iter()
        .map(|(id, total, free, profile)| MatchAgent {
            id: id.clone(),
            total: total.clone(),
            free: free.clone(),
            profile: *profile,
        })
        .collect();
    let result = match_batch(&batch.tasks, &agents, &coefficients);
    let json = |v: &dyn erased_json::Json| v.to_json();
    let mut lines: Vec<String> = result
        .matches
        .iter()
        .map(|m| {
            json(&MatchLine {
                batch_match: &batch.tasks[m.task].id,
                agent: &agents[m.agent].id,
                exec_secs: (m.exec_secs * 10_000.0).round() / 10_000.0,
            })
        })
        .collect();
    lines.push(json(&ResultLine {
        batch_unmatched: result
            .unmatched
            .iter()
            .map(|&(t, reason)| UnmatchedEntry {
                task: &batch.tasks[t].id,
                reason: reason.code(),
                why: reason.to_string(),
            })
            .collect(),
        proposals: result.proposals,
        rounds: result.rounds,
        fills: result.fills,
    }));
    lines
}

mod erased_json {
    /// Serializes plain data structs; they cannot fail (string keys, finite numbers).
    pub trait Json {
        fn to_json(&self) -> String;
    }
    impl<T: serde::Serialize> Json for T {
        fn to_json(&self) -> String {
            serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
        }
    }
}
