//! Trace files: the nodes of a cluster and the tasks that ran on it, read into plain records.
//!
//! Two formats, told apart by the CSV header (or a `.yaml`/`.yml` extension):
//! - **openb**, Alibaba's GPU-cluster trace (cluster-trace-gpu-v2023) used by the ATC'23
//!   "Beware of Fragmentation" paper: nodes `sn,cpu_milli,memory_mib,gpu,model`, tasks
//!   `name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,
//!   deletion_time,scheduled_time`;
//! - **generic**, for other traces, in units a person writes (`docs/simulator.md`): nodes
//!   `name,cpus,mem,gpus,gpu_model`, tasks
//!   `name,cpus,mem,gpus,gpu_milli,gpu_models,priority,arrival,departure`, as CSV or as a YAML
//!   list of the same records.
//!
//! Everything is checked here, so the simulator never meets a malformed record: errors name the
//! file, the line (CSV) or record (YAML) and the field.

use std::fmt;
use std::path::Path;

use ringmaster_core::resources::Resources;
use serde::Deserialize;

/// The most GPUs one node may have (a node's GPU choice is a 64-bit mask).
pub const MAX_GPUS_PER_NODE: u32 = 64;
/// A whole GPU in milli-GPU.
pub const GPU_MILLI: u32 = 1000;

/// One machine of the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub gpus: u32,
    /// GPU model (empty when unknown or without GPUs).
    pub model: String,
}

/// One task of the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    pub name: String,
    pub cpu_milli: u64,
    pub memory_mib: u64,
    /// GPUs asked for; 0 for a CPU-only task.
    pub num_gpu: u32,
    /// Milli-GPU wanted on each of the `num_gpu` GPUs (1..=1000; < 1000 shares a GPU); 0 when
    /// `num_gpu` is 0.
    pub gpu_milli: u32,
    /// GPU models the task may run on; empty = any.
    pub gpu_spec: Vec<String>,
    /// Priority (higher is more important): openb's `qos` mapped by [`qos_priority`].
    pub priority: i32,
    /// Seconds from the trace's start.
    pub creation: u64,
    /// When the task leaves (seconds); `None` = it never leaves.
    pub deletion: Option<u64>,
}

impl Task {
    /// GPU asked for in total, in milli-GPU.
    pub fn gpu_total_milli(&self) -> u64 {
        u64::from(self.num_gpu) * u64::from(self.gpu_milli)
    }
}

/// A trace file that cannot be used, with where and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceError {
    pub file: String,
    /// 1-based line of a CSV file, or record number of a YAML list.
    pub line: Option<u64>,
    pub message: String,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.file, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for TraceError {}

/// openb's quality-of-service classes as priorities: latency-sensitive and guaranteed pods above
/// burstable ones, best-effort lowest, anything else 0.
pub fn qos_priority(qos: &str) -> i32 {
    match qos {
        "LS" | "Guaranteed" => 3,
        "Burstable" => 2,
        "BE" => 1,
        _ => 0,
    }
}

#[derive(Deserialize)]
struct OpenbNode {
    sn: String,
    cpu_milli: u64,
    memory_mib: u64,
    gpu: u32,
    #[serde(default)]
    model: Option<String>,
}

#[derive(Deserialize)]
struct OpenbTask {
    name: String,
    cpu_milli: u64,
    memory_mib: u64,
    num_gpu: u32,
    gpu_milli: u32,
    #[serde(default)]
    gpu_spec: Option<String>,
    #[serde(default)]
    qos: Option<String>,
    #[serde(default)]
    creation_time: Option<u64>,
    #[serde(default)]
    deletion_time: Option<u64>,
}

/// Generic node record; amounts in units (`cpus: 1.5`, `mem` in MiB).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GenericNode {
    name: String,
    cpus: f64,
    mem: f64,
    #[serde(default)]
    gpus: Option<u32>,
    #[serde(default)]
    gpu_model: Option<String>,
}

/// Generic task record; `gpus` is a count, `gpu_milli` the share of each (default 1000).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GenericTask {
    name: String,
    cpus: f64,
    #[serde(default)]
    mem: Option<f64>,
    #[serde(default)]
    gpus: Option<u32>,
    #[serde(default)]
    gpu_milli: Option<u32>,
    #[serde(default)]
    gpu_models: Option<String>,
    #[serde(default)]
    priority: Option<i32>,
    #[serde(default)]
    arrival: Option<u64>,
    #[serde(default)]
    departure: Option<u64>,
}

fn error(path: &Path, line: Option<u64>, message: impl Into<String>) -> TraceError {
    TraceError {
        file: path.display().to_string(),
        line,
        message: message.into(),
    }
}

/// A decimal amount in units to thousandths, exactly (at most 3 decimals), as resource text is.
fn milli(field: &str, value: f64) -> Result<u64, String> {
    let text = format!("x:{value}");
    Resources::parse(&text).map(|r| r.milli("x")).map_err(|_| {
        format!("`{field}` = {value} is not a non-negative number with at most 3 decimals")
    })
}

fn is_yaml(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    )
}

fn read(path: &Path) -> Result<String, TraceError> {
    std::fs::read_to_string(path).map_err(|e| error(path, None, format!("cannot read: {e}")))
}

/// Reads every CSV record of one shape; the line of a bad one is in the error.
fn csv_records<T: for<'de> Deserialize<'de>>(
    path: &Path,
    text: &str,
) -> Result<Vec<(u64, T)>, TraceError> {
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let mut out = Vec::new();
    for record in reader.deserialize::<T>() {
        match record {
            Ok(r) => out.push((out.len() as u64 + 2, r)),
            Err(e) => {
                let line = e.position().map(|p| p.line());
                return Err(error(path, line, csv_message(&e)));
            }
        }
    }
    Ok(out)
}

fn csv_message(e: &csv::Error) -> String {
    match e.kind() {
        csv::ErrorKind::Deserialize { err, .. } => match err.field() {
            Some(field) => format!("field {}: {}", field + 1, err.kind()),
            None => err.kind().to_string(),
        },
        _ => e.to_string(),
    }
}

fn yaml_records<T: for<'de> Deserialize<'de>>(
    path: &Path,
    text: &str,
) -> Result<Vec<(u64, T)>, TraceError> {
    crate::yaml_depth::check_depth(text, &path.display().to_string())
        .map_err(|e| error(path, None, e.to_string()))?;
    let values: Vec<serde_yaml::Value> = serde_yaml::from_str(text)
        .map_err(|e| error(path, None, format!("not a YAML list of records: {e}")))?;
    values
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let n = i as u64 + 1;
            serde_yaml::from_value(v)
                .map(|r| (n, r))
                .map_err(|e| error(path, Some(n), format!("record {n}: {e}")))
        })
        .collect()
}

fn header(text: &str) -> Vec<String> {
    let first = text.lines().next().unwrap_or("");
    first.split(',').map(|h| h.trim().to_string()).collect()
}

/// Reads a node list (openb or generic).
pub fn load_nodes(path: &Path) -> Result<Vec<Node>, TraceError> {
    let text = read(path)?;
    let nodes: Vec<(u64, Node)> = if is_yaml(path) {
        generic_nodes(path, yaml_records(path, &text)?)?
    } else if header(&text).iter().any(|h| h == "cpu_milli") {
        csv_records::<OpenbNode>(path, &text)?
            .into_iter()
            .map(|(line, n)| {
                (
                    line,
                    Node {
                        name: n.sn,
                        cpu_milli: n.cpu_milli,
                        memory_mib: n.memory_mib,
                        gpus: n.gpu,
                        model: n.model.unwrap_or_default(),
                    },
                )
            })
            .collect()
    } else if header(&text).iter().any(|h| h == "cpus") {
        generic_nodes(path, csv_records(path, &text)?)?
    } else {
        return Err(error(
            path,
            Some(1),
            "unknown node list header: expected openb (sn,cpu_milli,memory_mib,gpu,model) \
             or generic (name,cpus,mem,gpus,gpu_model)",
        ));
    };
    let mut names = std::collections::HashSet::new();
    for (line, node) in &nodes {
        if node.gpus > MAX_GPUS_PER_NODE {
            return Err(error(
                path,
                Some(*line),
                format!(
                    "node `{}` has {} GPUs; at most {MAX_GPUS_PER_NODE} are supported",
                    node.name, node.gpus
                ),
            ));
        }
        if node.cpu_milli == 0 {
            return Err(error(
                path,
                Some(*line),
                format!("node `{}` has no cpu", node.name),
            ));
        }
        if !names.insert(node.name.as_str()) {
            return Err(error(
                path,
                Some(*line),
                format!("node `{}` appears twice", node.name),
            ));
        }
    }
    if nodes.is_empty() {
        return Err(error(path, None, "no nodes"));
    }
    Ok(nodes.into_iter().map(|(_, n)| n).collect())
}

fn generic_nodes(
    path: &Path,
    records: Vec<(u64, GenericNode)>,
) -> Result<Vec<(u64, Node)>, TraceError> {
    records
        .into_iter()
        .map(|(line, n)| {
            let cpu_milli = milli("cpus", n.cpus).map_err(|m| error(path, Some(line), m))?;
            let mem = milli("mem", n.mem).map_err(|m| error(path, Some(line), m))?;
            Ok((
                line,
                Node {
                    name: n.name,
                    cpu_milli,
                    memory_mib: mem / 1000,
                    gpus: n.gpus.unwrap_or(0),
                    model: n.gpu_model.unwrap_or_default(),
                },
            ))
        })
        .collect()
}

/// Reads a task list (openb or generic).
pub fn load_tasks(path: &Path) -> Result<Vec<Task>, TraceError> {
    let text = read(path)?;
    let tasks: Vec<(u64, Task)> = if is_yaml(path) {
        generic_tasks(path, yaml_records(path, &text)?)?
    } else if header(&text).iter().any(|h| h == "cpu_milli") {
        csv_records::<OpenbTask>(path, &text)?
            .into_iter()
            .map(|(line, t)| {
                let qos = t.qos.unwrap_or_default();
                (
                    line,
                    Task {
                        name: t.name,
                        cpu_milli: t.cpu_milli,
                        memory_mib: t.memory_mib,
                        num_gpu: t.num_gpu,
                        gpu_milli: t.gpu_milli,
                        gpu_spec: models(t.gpu_spec.as_deref()),
                        priority: qos_priority(&qos),
                        creation: t.creation_time.unwrap_or(0),
                        deletion: t.deletion_time,
                    },
                )
            })
            .collect()
    } else if header(&text).iter().any(|h| h == "cpus") {
        generic_tasks(path, csv_records(path, &text)?)?
    } else {
        return Err(error(
            path,
            Some(1),
            "unknown task list header: expected openb (name,cpu_milli,memory_mib,num_gpu,\
             gpu_milli,…) or generic (name,cpus,mem,gpus,gpu_milli,…)",
        ));
    };
    let mut out = Vec::with_capacity(tasks.len());
    for (line, mut task) in tasks {
        if task.num_gpu == 0 {
            task.gpu_milli = 0;
        } else if task.gpu_milli == 0 || task.gpu_milli > GPU_MILLI {
            return Err(error(
                path,
                Some(line),
                format!(
                    "task `{}`: gpu_milli {} must be 1..=1000 when GPUs are asked for",
                    task.name, task.gpu_milli
                ),
            ));
        }
        if task.num_gpu > MAX_GPUS_PER_NODE {
            return Err(error(
                path,
                Some(line),
                format!(
                    "task `{}` asks for {} GPUs; at most {MAX_GPUS_PER_NODE} fit a node",
                    task.name, task.num_gpu
                ),
            ));
        }
        if task.cpu_milli == 0 && task.num_gpu == 0 && task.memory_mib == 0 {
            return Err(error(
                path,
                Some(line),
                format!("task `{}` asks for nothing", task.name),
            ));
        }
        if task.deletion.is_some_and(|d| d < task.creation) {
            return Err(error(
                path,
                Some(line),
                format!("task `{}` leaves before it arrives", task.name),
            ));
        }
        out.push(task);
    }
    if out.is_empty() {
        return Err(error(path, None, "no tasks"));
    }
    Ok(out)
}

fn models(spec: Option<&str>) -> Vec<String> {
    spec.unwrap_or("")
        .split('|')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(str::to_string)
        .collect()
}

fn generic_tasks(
    path: &Path,
    records: Vec<(u64, GenericTask)>,
) -> Result<Vec<(u64, Task)>, TraceError> {
    records
        .into_iter()
        .map(|(line, t)| {
            let cpu_milli = milli("cpus", t.cpus).map_err(|m| error(path, Some(line), m))?;
            let mem = milli("mem", t.mem.unwrap_or(0.0)).map_err(|m| error(path, Some(line), m))?;
            let num_gpu = t.gpus.unwrap_or(0);
            Ok((
                line,
                Task {
                    name: t.name,
                    cpu_milli,
                    memory_mib: mem.div_ceil(1000),
                    num_gpu,
                    gpu_milli: t.gpu_milli.unwrap_or(GPU_MILLI),
                    gpu_spec: models(t.gpu_models.as_deref()),
                    priority: t.priority.unwrap_or(0),
                    creation: t.arrival.unwrap_or(0),
                    deletion: t.departure,
                },
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file(name: &str, text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::File::create(&path)
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        (dir, path)
    }

    #[test]
    fn openb_records() {
        let (_d, p) = file(
            "n.csv",
            "sn,cpu_milli,memory_mib,gpu,model\na,32000,262144,0,\nb,96000,786432,8,V100M32\n",
        );
        let nodes = load_nodes(&p).unwrap();
        assert_eq!(nodes[1].gpus, 8);
        assert_eq!(nodes[1].model, "V100M32");
        assert_eq!(nodes[0].model, "");
        let (_d, p) = file(
            "t.csv",
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
             p0,6000,12288,1,460,,LS,Running,427061,12902960,427061\n\
             p1,4000,100,2,1000,V100M16|V100M32,BE,Failed,5,9,\n",
        );
        let tasks = load_tasks(&p).unwrap();
        assert_eq!(tasks[0].gpu_total_milli(), 460);
        assert_eq!(tasks[0].priority, 3);
        assert_eq!(tasks[1].gpu_spec, ["V100M16", "V100M32"]);
        assert_eq!((tasks[1].creation, tasks[1].deletion), (5, Some(9)));
    }

    #[test]
    fn generic_csv_and_yaml() {
        let (_d, p) = file(
            "n.csv",
            "name,cpus,mem,gpus,gpu_model\nx,1.5,1024,2,T4\ny,4,2048,,\n",
        );
        let nodes = load_nodes(&p).unwrap();
        assert_eq!((nodes[0].cpu_milli, nodes[0].memory_mib), (1500, 1024));
        assert_eq!(nodes[1].gpus, 0);
        let (_d, p) = file(
            "t.yaml",
            "- {name: a, cpus: 0.5, mem: 10, gpus: 1, gpu_milli: 250, arrival: 3, departure: 7}\n\
             - {name: b, cpus: 2}\n",
        );
        let tasks = load_tasks(&p).unwrap();
        assert_eq!(tasks[0].cpu_milli, 500);
        assert_eq!(tasks[0].gpu_total_milli(), 250);
        assert_eq!(tasks[1].num_gpu, 0);
        assert_eq!(tasks[1].deletion, None);
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let (_d, p) = file(
            "n.csv",
            "sn,cpu_milli,memory_mib,gpu,model\na,32000,262144,0,\nb,lots,1,0,\n",
        );
        let e = load_nodes(&p).unwrap_err();
        assert_eq!(e.line, Some(3), "{e}");
        assert!(e.to_string().contains("field 2"), "{e}");
        let (_d, p) = file("t.csv", "name,cpus,gpus,gpu_milli\na,1,1,1500\n");
        let e = load_tasks(&p).unwrap_err();
        assert!(
            e.to_string()
                .ends_with(":2: task `a`: gpu_milli 1500 must be 1..=1000 when GPUs are asked for"),
            "{e}"
        );
        let (_d, p) = file("t.csv", "what,ever\n1,2\n");
        assert!(load_tasks(&p)
            .unwrap_err()
            .message
            .contains("unknown task list header"));
        let (_d, p) = file("n.yaml", "- {name: a, cpus: -1, mem: 1}\n");
        assert!(load_nodes(&p).unwrap_err().message.contains("`cpus` = -1"));
        let e = load_nodes(Path::new("/nonexistent/nodes.csv")).unwrap_err();
        assert!(e.message.starts_with("cannot read"), "{e}");
    }
}
