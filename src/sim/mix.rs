//! `--mix`: variants of a task list with other workload mixes, made reproducibly in memory.
//!
//! The openb trace comes upstream with variants sampled from the default trace that emphasise
//! GPU-sharing, multi-GPU or CPU-only tasks, and `gpuspec` variants in which a share of the GPU
//! tasks require a GPU model. Those files are not shipped here; this module makes such variants
//! from whatever task list `--tasks` names, the same way:
//!
//! - **class shares** (`sharing`, `multi`, `cpu`, percent of all tasks): the task count is kept;
//!   each class's count is drawn with replacement from the input's tasks of that class, so the
//!   classes set hit their targets and the classes not set share the rest in the input's
//!   relative proportions. Classes: CPU-only (`num_gpu` = 0), sharing (`num_gpu` = 1 and
//!   `gpu_milli` < 1000), one whole GPU, multi-GPU (`num_gpu` ≥ 2). Without a class share the
//!   task list is kept as it is.
//! - **model constraints** (`spec`, percent of GPU tasks): any `gpu_spec` of the input is
//!   dropped, then a seeded random `spec` % of the GPU tasks is given one GPU model (or, with
//!   probability 1/3, two), drawn in proportion to the cluster's GPUs of each model among the
//!   models with a node the task fits when empty, so every constrained task fits somewhere.
//!
//! A mix is written `KEY=VALUE,…` (`sharing=40`, `spec=33,seed=2`) or named by a preset
//! ([`PRESETS`], the five mixes of issue 18); its name, used for file and directory names, is
//! canonical (`sharing=40` is `sharing40`, as the preset).

use std::path::Path;

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::trace::{Node, Task, GPU_MILLI};

/// The named mixes: issue 18's default trace, 40 % and 100 % GPU-sharing tasks, 50 % multi-GPU
/// tasks and 33 % model-constrained GPU tasks.
pub const PRESETS: [(&str, &str); 5] = [
    ("default", ""),
    ("sharing40", "sharing=40"),
    ("sharing100", "sharing=100"),
    ("multi50", "multi=50"),
    ("spec33", "spec=33"),
];

/// The seed of a mix that names none.
pub const DEFAULT_SEED: u64 = 1;
/// Mixed into the seed for the model constraints, a stream apart from the class draws'.
const SPEC_STREAM: u64 = 0x5bd1_e995_0000_0033;
/// Probability that a constrained task names a second model.
const SECOND_MODEL: f64 = 1.0 / 3.0;

/// The four task classes, in the order counts are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Cpu,
    Sharing,
    Whole,
    Multi,
}

impl Class {
    pub const ALL: [Class; 4] = [Class::Cpu, Class::Sharing, Class::Whole, Class::Multi];

    pub fn of(task: &Task) -> Class {
        match task.num_gpu {
            0 => Class::Cpu,
            1 if task.gpu_milli < GPU_MILLI => Class::Sharing,
            1 => Class::Whole,
            _ => Class::Multi,
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    fn describe(self) -> &'static str {
        match self {
            Class::Cpu => "CPU-only",
            Class::Sharing => "GPU-sharing",
            Class::Whole => "one-whole-GPU",
            Class::Multi => "multi-GPU",
        }
    }
}

/// One workload mix: target shares in percent (`None` = as in the input) and a seed.
#[derive(Clone, Debug, PartialEq)]
pub struct Mix {
    /// Canonical name: `default`, or `sharing40`, `multi50-cpu10`, `spec33-seed2`, …
    pub name: String,
    /// % of all tasks that share a GPU.
    pub sharing: Option<f64>,
    /// % of all tasks with two GPUs or more.
    pub multi: Option<f64>,
    /// % of all tasks without GPUs.
    pub cpu: Option<f64>,
    /// % of GPU tasks with a GPU model constraint.
    pub spec: Option<f64>,
    pub seed: u64,
}

/// A mix that cannot be parsed or made from this trace.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("--mix `{spec}`: {message}")]
pub struct MixError {
    pub spec: String,
    pub message: String,
}

fn mix_error(spec: &str, message: impl Into<String>) -> MixError {
    MixError {
        spec: spec.to_string(),
        message: message.into(),
    }
}

fn fmt_pct(v: f64) -> String {
    // `40` not `40.0`; fractions as written (`33.5`).
    format!("{v}")
}

impl Mix {
    /// The mix of the trace as it is.
    pub fn default_mix() -> Mix {
        Mix {
            name: "default".into(),
            sharing: None,
            multi: None,
            cpu: None,
            spec: None,
            seed: DEFAULT_SEED,
        }
    }

    /// Parses one mix: comma-separated `KEY=VALUE` (keys `sharing`, `multi`, `cpu`, `spec`
    /// in percent 0–100, `seed` an integer) and preset names.
    pub fn parse(text: &str) -> Result<Mix, MixError> {
        let text = text.trim();
        let mut mix = Mix::default_mix();
        let mut seen: Vec<&str> = Vec::new();
        if text.is_empty() {
            return Err(mix_error(text, "empty mix"));
        }
        for token in text.split(',').map(str::trim) {
            if token.is_empty() {
                return Err(mix_error(text, "empty item between commas"));
            }
            let pairs: Vec<(String, String)> = match token.split_once('=') {
                Some((k, v)) => vec![(k.trim().to_string(), v.trim().to_string())],
                None => {
                    let Some((_, body)) = PRESETS.iter().find(|(name, _)| *name == token) else {
                        return Err(mix_error(
                            text,
                            format!(
                                "unknown preset `{token}`; presets are {}, keys are \
                                 sharing=, multi=, cpu=, spec= (percent) and seed=",
                                PRESETS.map(|(n, _)| n).join(", ")
                            ),
                        ));
                    };
                    body.split(',')
                        .filter_map(|kv| kv.split_once('='))
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect()
                }
            };
            for (key, value) in pairs {
                let key: &str = match key.as_str() {
                    "sharing" => "sharing",
                    "multi" => "multi",
                    "cpu" => "cpu",
                    "spec" => "spec",
                    "seed" => "seed",
                    other => {
                        return Err(mix_error(
                            text,
                            format!(
                                "unknown key `{other}`; keys are sharing, multi, cpu, spec \
                                 (percent 0–100) and seed"
                            ),
                        ))
                    }
                };
                if seen.contains(&key) {
                    return Err(mix_error(text, format!("`{key}` is given twice")));
                }
                seen.push(key);
                if key == "seed" {
                    mix.seed = value.parse().map_err(|_| {
                        mix_error(
                            text,
                            format!("seed `{value}` is not a non-negative integer"),
                        )
                    })?;
                    continue;
                }
                let pct: f64 = value
                    .parse()
                    .ok()
                    .filter(|v: &f64| v.is_finite() && (0.0..=100.0).contains(v))
                    .ok_or_else(|| {
                        mix_error(
                            text,
                            format!("{key}={value}: a share must be a percentage 0–100"),
                        )
                    })?;
                let slot = match key {
                    "sharing" => &mut mix.sharing,
                    "multi" => &mut mix.multi,
                    "cpu" => &mut mix.cpu,
                    _ => &mut mix.spec,
                };
                *slot = Some(pct);
            }
        }
        let classes: f64 = [mix.sharing, mix.multi, mix.cpu].iter().flatten().sum();
        if classes > 100.0 + 1e-9 {
            return Err(mix_error(
                text,
                format!(
                    "sharing + multi + cpu = {} %, more than 100 %",
                    fmt_pct(classes)
                ),
            ));
        }
        mix.name = mix.canonical_name();
        Ok(mix)
    }

    fn canonical_name(&self) -> String {
        let mut parts: Vec<String> = [
            ("sharing", self.sharing),
            ("multi", self.multi),
            ("cpu", self.cpu),
            ("spec", self.spec),
        ]
        .iter()
        .filter_map(|(k, v)| v.map(|v| format!("{k}{}", fmt_pct(v))))
        .collect();
        if parts.is_empty() {
            parts.push("default".into());
        }
        if self.seed != DEFAULT_SEED {
            parts.push(format!("seed{}", self.seed));
        }
        parts.join("-")
    }

    /// Whether the mix changes the class shares (else the task list is kept as it is).
    pub fn resamples(&self) -> bool {
        self.sharing.is_some() || self.multi.is_some() || self.cpu.is_some()
    }

    fn target(&self, class: Class) -> Option<f64> {
        match class {
            Class::Cpu => self.cpu,
            Class::Sharing => self.sharing,
            Class::Whole => None,
            Class::Multi => self.multi,
        }
    }

    /// The variant of `tasks` on the cluster of `nodes`.
    pub fn apply(&self, tasks: &[Task], nodes: &[Node]) -> Result<Vec<Task>, MixError> {
        let mut out = if self.resamples() {
            self.resample(tasks)?
        } else {
            tasks.to_vec()
        };
        if let Some(spec) = self.spec {
            self.constrain(&mut out, nodes, spec)?;
        }
        Ok(out)
    }

    /// How many tasks of each class (in [`Class::ALL`] order) a list of `n` gets.
    fn class_counts(&self, pools: &[Vec<usize>; 4], n: usize) -> Result<[usize; 4], MixError> {
        let set: f64 = Class::ALL.iter().filter_map(|&c| self.target(c)).sum();
        let rest = (100.0 - set).max(0.0);
        let unset_pool: usize = Class::ALL
            .iter()
            .filter(|&&c| self.target(c).is_none())
            .map(|c| pools[c.index()].len())
            .sum();
        let mut shares = [0.0f64; 4];
        for c in Class::ALL {
            let pool = pools[c.index()].len();
            shares[c.index()] = match self.target(c) {
                Some(t) => {
                    if t > 0.0 && pool == 0 {
                        return Err(mix_error(
                            &self.name,
                            format!("the task list has no {} tasks to draw from", c.describe()),
                        ));
                    }
                    t / 100.0
                }
                None if unset_pool == 0 => 0.0,
                None => rest / 100.0 * pool as f64 / unset_pool as f64,
            };
        }
        if rest > 1e-9 && unset_pool == 0 {
            return Err(mix_error(
                &self.name,
                format!(
                    "the shares add up to {} %, and the task list has no tasks of the other \
                     classes for the rest",
                    fmt_pct(set)
                ),
            ));
        }
        // Largest remainder: the counts add up to n and each is within 1 of its share.
        let exact: Vec<f64> = shares.iter().map(|s| s * n as f64).collect();
        let mut counts = [0usize; 4];
        for i in 0..4 {
            counts[i] = exact[i].floor() as usize;
        }
        let mut order: Vec<usize> = (0..4).filter(|&i| shares[i] > 0.0).collect();
        order.sort_by(|&a, &b| {
            let fa = exact[a] - exact[a].floor();
            let fb = exact[b] - exact[b].floor();
            fb.total_cmp(&fa).then(a.cmp(&b))
        });
        let mut missing = n.saturating_sub(counts.iter().sum());
        for i in order.iter().cycle().take(order.len() * 2) {
            if missing == 0 {
                break;
            }
            counts[*i] += 1;
            missing -= 1;
        }
        Ok(counts)
    }

    fn resample(&self, tasks: &[Task]) -> Result<Vec<Task>, MixError> {
        let mut pools: [Vec<usize>; 4] = Default::default();
        for (i, t) in tasks.iter().enumerate() {
            pools[Class::of(t).index()].push(i);
        }
        let counts = self.class_counts(&pools, tasks.len())?;
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed);
        let mut drawn: Vec<usize> = Vec::with_capacity(tasks.len());
        for c in Class::ALL {
            let pool = &pools[c.index()];
            for _ in 0..counts[c.index()] {
                drawn.push(pool[rng.random_range(0..pool.len())]);
            }
        }
        // Mixed, then in the trace's time order (replay plays them at their own times).
        drawn.shuffle(&mut rng);
        drawn.sort_by_key(|&i| tasks[i].creation);
        Ok(drawn
            .iter()
            .enumerate()
            .map(|(k, &i)| Task {
                name: format!("{}-{k:05}", tasks[i].name),
                ..tasks[i].clone()
            })
            .collect())
    }

    fn constrain(&self, tasks: &mut [Task], nodes: &[Node], spec: f64) -> Result<(), MixError> {
        // The cluster's GPU models, in node-list order, weighted by their GPUs.
        let mut models: Vec<(String, u64)> = Vec::new();
        for n in nodes.iter().filter(|n| n.gpus > 0 && !n.model.is_empty()) {
            match models.iter_mut().find(|(m, _)| *m == n.model) {
                Some((_, w)) => *w += u64::from(n.gpus),
                None => models.push((n.model.clone(), u64::from(n.gpus))),
            }
        }
        for t in tasks.iter_mut() {
            t.gpu_spec.clear();
        }
        let gpu_tasks: Vec<usize> = (0..tasks.len()).filter(|&i| tasks[i].num_gpu > 0).collect();
        let want = (spec / 100.0 * gpu_tasks.len() as f64).round() as usize;
        if want == 0 {
            return Ok(());
        }
        if models.is_empty() {
            return Err(mix_error(
                &self.name,
                "the node list names no GPU models to constrain tasks to",
            ));
        }
        // The models with a node each task fits when empty.
        let fits = |t: &Task, model: &str| {
            nodes.iter().any(|n| {
                n.model == model
                    && n.gpus >= t.num_gpu
                    && n.cpu_milli >= t.cpu_milli
                    && n.memory_mib >= t.memory_mib
            })
        };
        let mut eligible: Vec<(usize, Vec<usize>)> = gpu_tasks
            .iter()
            .map(|&i| {
                let ok = (0..models.len())
                    .filter(|&m| fits(&tasks[i], &models[m].0))
                    .collect();
                (i, ok)
            })
            .filter(|(_, ok): &(usize, Vec<usize>)| !ok.is_empty())
            .collect();
        let want = want.min(eligible.len());
        let mut rng = ChaCha8Rng::seed_from_u64(self.seed ^ SPEC_STREAM);
        let (chosen, _) = eligible.partial_shuffle(&mut rng, want);
        chosen.sort_by_key(|(i, _)| *i);
        for (i, ok) in chosen.iter() {
            let first = weighted(&mut rng, ok, &models);
            let mut picked = vec![first];
            if ok.len() > 1 && rng.random_bool(SECOND_MODEL) {
                let rest: Vec<usize> = ok.iter().copied().filter(|&m| m != first).collect();
                picked.push(weighted(&mut rng, &rest, &models));
                picked.sort_unstable();
            }
            tasks[*i].gpu_spec = picked.iter().map(|&m| models[m].0.clone()).collect();
        }
        Ok(())
    }
}

/// One of `among` (indices into `models`), in proportion to the models' GPUs.
fn weighted(rng: &mut ChaCha8Rng, among: &[usize], models: &[(String, u64)]) -> usize {
    let total: u64 = among.iter().map(|&m| models[m].1).sum();
    let mut r = rng.random_range(0..total.max(1));
    for &m in among {
        if r < models[m].1 {
            return m;
        }
        r -= models[m].1;
    }
    among[among.len() - 1]
}

/// Parses `--mix` values: each may hold several mixes separated by `;`. Names must differ
/// (each gets its own output directory).
pub fn parse_mixes(values: &[String]) -> Result<Vec<Mix>, MixError> {
    let mut mixes: Vec<Mix> = Vec::new();
    for value in values {
        for part in value.split(';').map(str::trim).filter(|p| !p.is_empty()) {
            let mix = Mix::parse(part)?;
            if mixes.iter().any(|m| m.name == mix.name) {
                return Err(mix_error(
                    part,
                    format!("mix `{}` is given twice", mix.name),
                ));
            }
            mixes.push(mix);
        }
    }
    if mixes.is_empty() && !values.is_empty() {
        return Err(mix_error("", "no mix given"));
    }
    Ok(mixes)
}

fn qos(priority: i32) -> &'static str {
    match priority {
        p if p >= 3 => "LS",
        2 => "Burstable",
        1 => "BE",
        _ => "",
    }
}

/// Writes tasks as an openb pod list (`qos` from the priority, `pod_phase` and
/// `scheduled_time` empty), which `--tasks` reads back as the same tasks.
pub fn write_tasks_csv(path: &Path, tasks: &[Task]) -> Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| format!("cannot write {}: {e}", path.display());
    let mut w = csv::Writer::from_path(path).map_err(|e| fail(&e))?;
    w.write_record([
        "name",
        "cpu_milli",
        "memory_mib",
        "num_gpu",
        "gpu_milli",
        "gpu_spec",
        "qos",
        "pod_phase",
        "creation_time",
        "deletion_time",
        "scheduled_time",
    ])
    .map_err(|e| fail(&e))?;
    for t in tasks {
        w.write_record([
            t.name.clone(),
            t.cpu_milli.to_string(),
            t.memory_mib.to_string(),
            t.num_gpu.to_string(),
            t.gpu_milli.to_string(),
            t.gpu_spec.join("|"),
            qos(t.priority).to_string(),
            String::new(),
            t.creation.to_string(),
            t.deletion.map(|d| d.to_string()).unwrap_or_default(),
            String::new(),
        ])
        .map_err(|e| fail(&e))?;
    }
    w.flush().map_err(|e| fail(&e))
}

/// Shares of a task list in percent: (CPU-only, sharing, one whole GPU, multi-GPU) of all
/// tasks, and model-constrained of GPU tasks.
pub fn shares(tasks: &[Task]) -> ([f64; 4], f64) {
    let mut counts = [0usize; 4];
    for t in tasks {
        counts[Class::of(t).index()] += 1;
    }
    let n = tasks.len().max(1) as f64;
    let gpu = tasks.iter().filter(|t| t.num_gpu > 0).count();
    let spec = tasks
        .iter()
        .filter(|t| t.num_gpu > 0 && !t.gpu_spec.is_empty())
        .count();
    (
        counts.map(|c| c as f64 * 100.0 / n),
        spec as f64 * 100.0 / gpu.max(1) as f64,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::trace::{load_nodes, load_tasks};

    fn openb() -> (Vec<Node>, Vec<Task>) {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/openb");
        (
            load_nodes(&dir.join("openb_node_list_all_node.csv")).unwrap(),
            load_tasks(&dir.join("openb_pod_list_default.csv")).unwrap(),
        )
    }

    fn mix(text: &str) -> Mix {
        Mix::parse(text).unwrap()
    }

    #[test]
    fn parses_presets_keys_and_names() {
        assert_eq!(mix("sharing=40"), mix("sharing40"));
        assert_eq!(mix("sharing40").name, "sharing40");
        assert_eq!(mix("default").name, "default");
        assert_eq!(mix("default"), Mix::default_mix());
        assert_eq!(mix("spec33,seed=2").name, "spec33-seed2");
        assert_eq!(mix(" multi=50 , cpu=10.5 ").name, "multi50-cpu10.5");
        let m = mix("sharing=100");
        assert_eq!((m.sharing, m.seed), (Some(100.0), DEFAULT_SEED));
        let all = parse_mixes(&[
            "default;sharing40; sharing100".into(),
            "multi50".into(),
            "spec33".into(),
        ])
        .unwrap();
        let names: Vec<&str> = all.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            ["default", "sharing40", "sharing100", "multi50", "spec33"]
        );
    }

    #[test]
    fn bad_mixes_are_clear_errors() {
        let e = |t: &str| Mix::parse(t).unwrap_err().to_string();
        assert!(e("gpu=3").contains("unknown key `gpu`"), "{}", e("gpu=3"));
        assert!(e("sharing=140").contains("percentage 0–100"));
        assert!(e("sharing=-1").contains("percentage 0–100"));
        assert!(e("sharing=abc").contains("percentage 0–100"));
        assert!(e("spec=NaN").contains("percentage 0–100"));
        assert!(e("sharing=60,multi=50").contains("more than 100 %"));
        assert!(e("sharing50").contains("unknown preset `sharing50`"));
        assert!(e("seed=x").contains("seed `x`"));
        assert!(e("sharing=1,sharing=2").contains("twice"));
        assert!(e("sharing40,sharing=2").contains("twice"));
        assert!(e("sharing=1,,cpu=2").contains("empty item"));
        assert!(parse_mixes(&["sharing40;sharing=40".into()])
            .unwrap_err()
            .to_string()
            .contains("given twice"));
        assert!(parse_mixes(&[";".into()]).is_err());
    }

    #[test]
    fn shares_hit_their_targets() {
        let (nodes, tasks) = openb();
        let (base, _) = shares(&tasks);
        for (text, class, target) in [
            ("sharing=40", Class::Sharing, 40.0),
            ("sharing=100", Class::Sharing, 100.0),
            ("multi=50", Class::Multi, 50.0),
            ("cpu=30", Class::Cpu, 30.0),
        ] {
            let out = mix(text).apply(&tasks, &nodes).unwrap();
            assert_eq!(out.len(), tasks.len(), "{text}");
            let (got, spec) = shares(&out);
            assert!(
                (got[class.index()] - target).abs() < 0.05,
                "{text}: {got:?}"
            );
            assert_eq!(spec, 0.0);
            // The other classes keep the default trace's relative proportions.
            let rest_base: f64 = (0..4)
                .filter(|&i| i != class.index())
                .map(|i| base[i])
                .sum();
            let rest_got: f64 = 100.0 - got[class.index()];
            for i in (0..4).filter(|&i| i != class.index()) {
                let expect = base[i] / rest_base * rest_got;
                assert!((got[i] - expect).abs() < 0.05, "{text}: class {i} {got:?}");
            }
        }
        let out = mix("spec=33").apply(&tasks, &nodes).unwrap();
        let (got, spec) = shares(&out);
        assert_eq!(got, base, "spec keeps the classes");
        assert!((spec - 33.0).abs() < 0.05, "{spec}");
        assert_eq!(mix("default").apply(&tasks, &nodes).unwrap(), tasks);
    }

    #[test]
    fn seeds_decide_the_draw() {
        let (nodes, tasks) = openb();
        for text in ["sharing=40", "spec=33"] {
            let a = mix(text).apply(&tasks, &nodes).unwrap();
            let b = mix(text).apply(&tasks, &nodes).unwrap();
            let c = mix(&format!("{text},seed=2"))
                .apply(&tasks, &nodes)
                .unwrap();
            assert_eq!(a, b, "{text}");
            assert_ne!(a, c, "{text}");
        }
    }

    #[test]
    fn spec_names_only_models_a_task_fits() {
        let (nodes, tasks) = openb();
        let out = mix("spec=33,multi=20").apply(&tasks, &nodes).unwrap();
        let mut two = 0;
        for t in out.iter().filter(|t| !t.gpu_spec.is_empty()) {
            assert!(t.num_gpu > 0);
            assert!(t.gpu_spec.len() <= 2);
            two += usize::from(t.gpu_spec.len() == 2);
            assert!(
                nodes.iter().any(|n| t.gpu_spec.contains(&n.model)
                    && n.gpus >= t.num_gpu
                    && n.cpu_milli >= t.cpu_milli
                    && n.memory_mib >= t.memory_mib),
                "{t:?} fits no node of its models"
            );
        }
        assert!(two > 0, "some tasks name two models");
    }

    #[test]
    fn impossible_mixes_say_why() {
        let (nodes, tasks) = openb();
        let gpu_only: Vec<Task> = tasks.iter().filter(|t| t.num_gpu > 0).cloned().collect();
        let e = mix("cpu=10").apply(&gpu_only, &nodes).unwrap_err();
        assert!(e.message.contains("no CPU-only tasks"), "{e}");
        let sharing: Vec<Task> = tasks
            .iter()
            .filter(|t| Class::of(t) == Class::Sharing)
            .cloned()
            .collect();
        let e = mix("sharing=50").apply(&sharing, &nodes).unwrap_err();
        assert!(e.message.contains("no tasks of the other classes"), "{e}");
        let plain: Vec<Node> = nodes
            .iter()
            .map(|n| Node {
                model: String::new(),
                ..n.clone()
            })
            .collect();
        let e = mix("spec=10").apply(&tasks, &plain).unwrap_err();
        assert!(e.message.contains("no GPU models"), "{e}");
    }

    #[test]
    fn written_csv_reads_back_the_same() {
        let (nodes, tasks) = openb();
        let out = mix("spec=33,sharing=40").apply(&tasks, &nodes).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tasks_x.csv");
        write_tasks_csv(&path, &out).unwrap();
        assert_eq!(load_tasks(&path).unwrap(), out);
    }
}
