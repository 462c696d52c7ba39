//! `ringmaster place`: run the placement library over a scenario file, with no master.
//!
//! It answers "where would these requests go, and why do some not fit?" with the very code the
//! master runs: the scenario's requests are allocated as if each placed task were launched at once
//! ([`Grant::Demand`]), frameworks served in DRF order, until everything is placed or nothing more
//! fits. The output is one JSON object per line (placements, then the unplaced, then final state).
//!
//! Requests are tried in file order within a framework. With the balance placer each placement
//! line also says why (`"balance":{"weights":[…],"y_before":…,"y_after":…}`, weights in balance
//! dimension order).
//!
//! ```yaml
//! balance:                    # optional, on top of the config's (see src/config.rs)
//!   initial_weights: { cpus: 0.3333, mem: 0.3333, gpus: 0.3333 }
//!   require_improvement: true
//! rings:                      # optional, per dimension, on top of the config's
//!   cpus: { base: 0, step: 1, buckets: 16, search_up: 2 }
//! agents:
//!   - { id: a1, resources: "cpus:9;mem:18432" }
//! frameworks:
//!   - { name: A, weight: 1 }  # weight optional, default 1
//! requests:
//!   - { framework: A, resources: "cpus:1;mem:4096", count: 10 }
//! ```

use std::collections::HashMap;
use std::path::Path;

use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};

use crate::config::{
    apply_balance, apply_rings, whole_number, ConfigError, RawBalance, RawRings, Seg, YamlSource,
};
use crate::placement::{
    allocate_in, BalanceSettings, Cluster, DrfSorter, Grant, PlacementContext, PlacerKind, Request,
    Resources, RingsConfig,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    rings: Option<RawRings>,
    balance: Option<RawBalance>,
    #[serde(default)]
    agents: Vec<RawAgent>,
    #[serde(default)]
    frameworks: Vec<RawFramework>,
    #[serde(default)]
    requests: Vec<RawRequest>,
    batch: Option<crate::dry_run_batch::RawBatch>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAgent {
    id: String,
    resources: String,
    // Batch matching scores (see dry_run_batch).
    cpu_speed: Option<serde_yaml::Value>,
    net_rate: Option<serde_yaml::Value>,
    unit_cost: Option<serde_yaml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFramework {
    name: String,
    weight: Option<serde_yaml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRequest {
    framework: String,
    resources: String,
    count: Option<serde_yaml::Value>,
}

/// A checked scenario.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub rings: RingsConfig,
    pub balance: BalanceSettings,
    /// (id, total resources), in file order.
    pub agents: Vec<(String, Resources)>,
    /// (name, weight), in file order.
    pub frameworks: Vec<(String, f64)>,
    /// (index into `frameworks`, demand, count), in file order.
    pub requests: Vec<(usize, Resources, u32)>,
    /// The `batch:` section and every agent's matching profile (in `agents` order).
    pub batch: Option<(
        crate::dry_run_batch::BatchSection,
        Vec<crate::placement::matching::AgentProfile>,
    )>,
}

impl Scenario {
    /// Reads a scenario; its `rings` and `balance` apply on top of the given ones.
    pub fn load(
        path: &Path,
        rings: RingsConfig,
        balance: BalanceSettings,
    ) -> Result<Scenario, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            line: None,
            key: String::new(),
            message: format!("cannot read: {e}"),
        })?;
        Scenario::from_yaml(&text, &file, rings, balance)
    }

    pub fn from_yaml(
        text: &str,
        file: &str,
        mut rings: RingsConfig,
        mut balance: BalanceSettings,
    ) -> Result<Scenario, ConfigError> {
        let source = YamlSource { text, file };
        let raw: RawScenario = source.parse()?;
        if let Some(raw_rings) = &raw.rings {
            apply_rings(&source, &["rings".into()], raw_rings, &mut rings)?;
        }
        if let Some(raw_balance) = &raw.balance {
            apply_balance(&source, &["balance".into()], raw_balance, &mut balance)?;
        }
        let at = |list: &str, i: usize, field: &str| -> Vec<Seg> {
            vec![list.into(), i.into(), field.into()]
        };
        let resources = |path: &[Seg], text: &str| -> Result<Resources, ConfigError> {
            Resources::parse(text).map_err(|e| source.error(path, e.to_string()))
        };

        let mut agents = Vec::with_capacity(raw.agents.len());
        let mut agent_ids: HashMap<&str, usize> = HashMap::new();
        for (i, a) in raw.agents.iter().enumerate() {
            if let Some(first) = agent_ids.insert(&a.id, i) {
                let line = crate::config::locate(text, &at("agents", first, "id"))
                    .map_or(String::new(), |l| format!(" (first on line {l})"));
                return Err(source.error(
                    &at("agents", i, "id"),
                    format!("duplicate agent id `{}`{line}", a.id),
                ));
            }
            agents.push((
                a.id.clone(),
                resources(&at("agents", i, "resources"), &a.resources)?,
            ));
        }

        let mut frameworks = Vec::with_capacity(raw.frameworks.len());
        let mut names: HashMap<&str, usize> = HashMap::new();
        for (i, f) in raw.frameworks.iter().enumerate() {
            if names.insert(&f.name, i).is_some() {
                return Err(source.error(
                    &at("frameworks", i, "name"),
                    format!("duplicate framework `{}`", f.name),
                ));
            }
            let weight = match &f.weight {
                None => 1.0,
                Some(v) => match v.as_f64() {
                    Some(w) if w.is_finite() && w > 0.0 => w,
                    _ => {
                        return Err(source.error(
                            &at("frameworks", i, "weight"),
                            "weight must be a number greater than 0",
                        ))
                    }
                },
            };
            frameworks.push((f.name.clone(), weight));
        }

        let mut requests = Vec::with_capacity(raw.requests.len());
        for (i, r) in raw.requests.iter().enumerate() {
            let Some(&fw) = names.get(r.framework.as_str()) else {
                return Err(source.error(
                    &at("requests", i, "framework"),
                    format!(
                        "unknown framework `{}` (not under `frameworks`)",
                        r.framework
                    ),
                ));
            };
            let demand = resources(&at("requests", i, "resources"), &r.resources)?;
            if demand.is_empty() {
                return Err(source.error(
                    &at("requests", i, "resources"),
                    "a request must ask for something",
                ));
            }
            let count = match &r.count {
                None => 1,
                Some(v) => {
                    let path = at("requests", i, "count");
                    let n = whole_number(v).map_err(|e| source.error(&path, e))?;
                    u32::try_from(n).map_err(|_| {
                        source.error(&path, format!("{n} is more than {}", u32::MAX))
                    })?
                }
            };
            requests.push((fw, demand, count));
        }
        let batch = match &raw.batch {
            Some(b) => {
                let mut profiles = Vec::with_capacity(raw.agents.len());
                for (i, a) in raw.agents.iter().enumerate() {
                    let scores = crate::dry_run_batch::RawAgentScores {
                        cpu_speed: a.cpu_speed.clone(),
                        net_rate: a.net_rate.clone(),
                        unit_cost: a.unit_cost.clone(),
                    };
                    profiles.push(crate::dry_run_batch::agent_profile(&source, i, &scores)?);
                }
                Some((
                    crate::dry_run_batch::BatchSection::from_raw(&source, b)?,
                    profiles,
                ))
            }
            None => None,
        };
        Ok(Scenario {
            rings,
            balance,
            agents,
            frameworks,
            requests,
            batch,
        })
    }
}

/// One placement line.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Placed {
    pub step: usize,
    pub framework: String,
    pub agent: String,
    pub phase: Option<String>,
    pub bucket: Option<usize>,
    pub resources: String,
    /// Only for the balance placer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balance: Option<BalanceLine>,
}

/// A balance decision's explanation, rounded to 4 decimals.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BalanceLine {
    pub weights: Vec<f64>,
    pub y_before: f64,
    pub y_after: f64,
}

/// A request left with copies unplaced.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Unplaced {
    pub framework: String,
    pub resources: String,
    pub count: u32,
    pub why: String,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AgentFree {
    pub id: String,
    pub free: String,
}

/// Shares in the scenario's framework order, rounded to 4 decimals.
#[derive(Clone, Debug, PartialEq)]
pub struct Shares(pub Vec<(String, f64)>);

impl Serialize for Shares {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (name, share) in &self.0 {
            map.serialize_entry(name, share)?;
        }
        map.end()
    }
}

/// The outcome of a dry run.
#[derive(Clone, Debug, PartialEq)]
pub struct DryRun {
    pub placed: Vec<Placed>,
    pub unplaced: Vec<Unplaced>,
    pub agents: Vec<AgentFree>,
    pub shares: Shares,
}

impl DryRun {
    /// The output, one JSON object per line.
    pub fn json_lines(&self) -> Vec<String> {
        #[derive(Serialize)]
        struct UnplacedLine<'a> {
            unplaced: &'a [Unplaced],
        }
        #[derive(Serialize)]
        struct FinalLine<'a> {
            agents: &'a [AgentFree],
            shares: &'a Shares,
        }
        let json = |v: &dyn erased::Json| v.to_json();
        let mut lines: Vec<String> = self.placed.iter().map(|p| json(p)).collect();
        lines.push(json(&UnplacedLine {
            unplaced: &self.unplaced,
        }));
        lines.push(json(&FinalLine {
            agents: &self.agents,
            shares: &self.shares,
        }));
        lines
    }
}

mod erased {
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

fn four_decimals(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

/// Places the scenario's requests with `placer`.
pub fn run(scenario: &Scenario, placer: PlacerKind) -> DryRun {
    let mut cluster = Cluster::new(scenario.rings.clone(), placer);
    let mut agent_ids: HashMap<usize, &str> = HashMap::new();
    for (id, total) in &scenario.agents {
        agent_ids.insert(cluster.add_agent(total.clone()), id);
    }
    let mut drf = DrfSorter::new();
    for (fw, (_, weight)) in scenario.frameworks.iter().enumerate() {
        drf.add(fw, *weight);
    }
    let mut requests: Vec<Request> = scenario
        .requests
        .iter()
        .map(|(fw, demand, count)| Request {
            framework: *fw,
            demand: demand.clone(),
            count: *count,
        })
        .collect();
    let mut context = PlacementContext::new(scenario.balance.clone());
    let allocations = allocate_in(
        &mut cluster,
        &mut drf,
        &mut requests,
        Grant::Demand,
        &|_, _| true,
        &mut context,
    );
    let name = |fw: usize| scenario.frameworks[fw].0.clone();
    let placed = allocations
        .iter()
        .enumerate()
        .map(|(i, a)| Placed {
            step: i + 1,
            framework: name(a.framework),
            agent: agent_ids.get(&a.agent).copied().unwrap_or("?").to_string(),
            phase: a.decision.phase.map(|p| p.to_string()),
            bucket: a.decision.bucket,
            resources: a.resources.to_string(),
            balance: a.decision.balance.as_ref().map(|note| BalanceLine {
                weights: note.weights.iter().copied().map(four_decimals).collect(),
                y_before: four_decimals(note.y_before),
                y_after: four_decimals(note.y_after),
            }),
        })
        .collect();
    let unplaced = requests
        .iter()
        .filter(|r| r.count > 0)
        .map(|r| Unplaced {
            framework: name(r.framework),
            resources: r.demand.to_string(),
            count: r.count,
            why: cluster.why_unplaced(&r.demand, &|_| true).to_string(),
        })
        .collect();
    let agents = cluster
        .agents()
        .map(|(key, a)| AgentFree {
            id: agent_ids.get(&key).copied().unwrap_or("?").to_string(),
            free: a.free.to_string(),
        })
        .collect();
    let total = cluster.total().clone();
    let shares = Shares(
        scenario
            .frameworks
            .iter()
            .enumerate()
            .map(|(fw, (name, _))| (name.clone(), four_decimals(drf.share(fw, &total))))
            .collect(),
    );
    DryRun {
        placed,
        unplaced,
        agents,
        shares,
    }
}

/// `ringmaster place`: config (optional), scenario, placer override → output lines.
pub fn place(
    scenario: &Path,
    config: Option<&Path>,
    placer: Option<PlacerKind>,
) -> Result<Vec<String>, ConfigError> {
    let config = match config {
        Some(path) => crate::config::Config::load(path)?,
        None => crate::config::Config::default(),
    };
    let scenario = Scenario::load(scenario, config.rings, config.balance)?;
    let outcome = run(&scenario, placer.unwrap_or(config.placer));
    let mut lines = outcome.json_lines();
    if let Some((batch, profiles)) = &scenario.batch {
        // Matched against what the requests left.
        let agents: Vec<_> = scenario
            .agents
            .iter()
            .zip(&outcome.agents)
            .zip(profiles)
            .map(|(((id, total), left), profile)| {
                let free = Resources::parse(&left.free).unwrap_or_else(|_| total.clone());
                (id.clone(), total.clone(), free, *profile)
            })
            .collect();
        lines.extend(crate::dry_run_batch::run(batch, &config.matching, &agents));
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DRF_PAPER: &str = "\
agents:
  - { id: a1, resources: \"cpus:9;mem:18432\" }
frameworks:
  - { name: A, weight: 1 }
  - { name: B }
requests:
  - { framework: A, resources: \"cpus:1;mem:4096\", count: 10 }
  - { framework: B, resources: \"cpus:3;mem:1024\", count: 10 }
";

    #[test]
    fn drf_paper_example_lines() {
        let scenario = Scenario::from_yaml(
            DRF_PAPER,
            "s.yaml",
            RingsConfig::default(),
            BalanceSettings::default(),
        )
        .unwrap();
        let lines = run(&scenario, PlacerKind::Ring).json_lines();
        assert_eq!(
            lines,
            [
                r#"{"step":1,"framework":"A","agent":"a1","phase":"down","bucket":7,"resources":"cpus:1;mem:4096"}"#,
                r#"{"step":2,"framework":"B","agent":"a1","phase":"down","bucket":8,"resources":"cpus:3;mem:1024"}"#,
                r#"{"step":3,"framework":"A","agent":"a1","phase":"up","bucket":6,"resources":"cpus:1;mem:4096"}"#,
                r#"{"step":4,"framework":"B","agent":"a1","phase":"up","bucket":4,"resources":"cpus:3;mem:1024"}"#,
                r#"{"step":5,"framework":"A","agent":"a1","phase":"up","bucket":6,"resources":"cpus:1;mem:4096"}"#,
                r#"{"unplaced":[{"framework":"A","resources":"cpus:1;mem:4096","count":7,"why":"no agent fits cpus:1;mem:4096: 1 agent short of cpus"},{"framework":"B","resources":"cpus:3;mem:1024","count":8,"why":"no agent fits cpus:3;mem:1024: 1 agent short of cpus"}]}"#,
                r#"{"agents":[{"id":"a1","free":"mem:4096"}],"shares":{"A":0.6667,"B":0.6667}}"#,
            ]
        );
        let lines = run(&scenario, PlacerKind::FirstFit).json_lines();
        assert_eq!(
            lines[0],
            r#"{"step":1,"framework":"A","agent":"a1","phase":null,"bucket":null,"resources":"cpus:1;mem:4096"}"#
        );
    }

    #[test]
    fn bad_scenarios_are_located() {
        let cases = [
            (
                "agents:\n  - { id: a1, resources: \"cpus:1\" }\n  - { id: a1, resources: \"cpus:2\" }\n",
                "s.yaml:3: agents[1].id: duplicate agent id `a1` (first on line 2)",
            ),
            (
                "agents:\n  - id: a1\n    resources: \"cpus:x\"\n",
                "s.yaml:3: agents[0].resources: `cpus:x`: amount `x` is not",
            ),
            (
                "frameworks: [{ name: A }]\nrequests:\n  - { framework: C, resources: \"cpus:1\" }\n",
                "s.yaml:3: requests[0].framework: unknown framework `C` (not under `frameworks`)",
            ),
            (
                "frameworks: [{ name: A }]\nrequests:\n  - framework: A\n    resources: \"cpus:1\"\n    count: -3\n",
                "s.yaml:5: requests[0].count: -3 is negative",
            ),
            (
                "frameworks: [{ name: A, weight: 0 }]\n",
                "s.yaml:1: frameworks[0].weight: weight must be a number greater than 0",
            ),
            (
                "rings:\n  mem: { bounds: [0, 4096, 1024] }\n",
                "s.yaml:2: rings.mem.bounds: bounds must be strictly increasing (1024 after 4096)",
            ),
            (
                "agents: []\nnodes: []\n",
                "s.yaml:2: unknown field `nodes`, expected one of `rings`, `balance`, `agents`, `frameworks`, `requests`, `batch`",
            ),
            (
                "agents:\n  - { id: a1, resources: \"cpus:1\", zone: z }\n",
                "s.yaml:2: agents[0]: unknown field `zone`, expected one of `id`, `resources`, `cpu_speed`, `net_rate`, `unit_cost`",
            ),
        ];
        for (text, expected) in cases {
            let err = Scenario::from_yaml(
                text,
                "s.yaml",
                RingsConfig::default(),
                BalanceSettings::default(),
            )
            .unwrap_err()
            .to_string();
            assert!(
                err.starts_with(expected),
                "{text:?}\n got: {err}\nwant: {expected}"
            );
        }
    }
}
