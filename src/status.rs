//! `ringmaster status`: the master's `/state` as readable tables, like `nomad status`.
//!
//! Fetching is a plain blocking HTTP GET (the CLI has nothing else to do meanwhile); rendering
//! is pure ([`render`]) so tests can check tables against a known snapshot.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::Duration;

use ringmaster_proto::masters::Asked;
use ringmaster_proto::resources::Resources;

use crate::master::ops::model::ClusterView;
use crate::master::{AgentView, Snapshot};

/// How long the CLI waits for the master's answer.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// What `ringmaster status` shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum StatusView {
    /// Counts and resources at a glance.
    #[default]
    Summary,
    Agents,
    Frameworks,
    Tasks,
    /// Ring buckets per dimension with their agents.
    Rings,
    /// Demands that cannot be served, with why.
    Pending,
}

/// The URL of `/state` for `--master` given as `HOST:PORT`, `http://HOST:PORT[/]` or
/// `https://HOST:PORT[/]` (a bare `HOST:PORT` is HTTPS with `--tls-ca`,
/// [`crate::leader_http::base`]).
pub fn state_url(master: &str) -> Result<String, String> {
    let master = master.trim().trim_end_matches('/');
    if master.is_empty() {
        return Err(
            "--master is empty; give the master's HTTP address, e.g. 127.0.0.1:5051".into(),
        );
    }
    Ok(format!("{}/state", crate::leader_http::base(master)))
}

/// Fetches and decodes the master's `/state`. `master` may list several masters
/// (`a:5050,b:5050`): they are asked in turn and the leader is followed ([`crate::leader_http`]).
pub fn fetch(master: &str) -> Result<Snapshot, String> {
    let agent = crate::jobs::cli::agent_with(Some(HTTP_TIMEOUT));
    crate::leader_http::with_leader(master, |address| {
        let url = match state_url(address) {
            Ok(url) => url,
            Err(e) => return Asked::Answer(Err(e)),
        };
        let unreachable = |e: &dyn std::fmt::Display, hint: &str| {
            format!(
                "cannot reach the master at {url}: {e}{hint}\n(is a master running at {address}? \
                 `ringmaster serve` serves HTTP on its --listen port and on --http (by default \
                 that port + 1), unless --http none; with `tls:` HTTPS on --http only; pass \
                 --master HOST:PORT[,HOST:PORT...] or set RINGMASTER_MASTER)"
            )
        };
        let mut response = match agent.get(&url).call() {
            Ok(response) => response,
            Err(e) => {
                let hint = crate::leader_http::unreachable_hint(&url, &e);
                return Asked::Unreachable(unreachable(&e, hint));
            }
        };
        let status = response.status().as_u16();
        let body = match response
            .body_mut()
            .with_config()
            .limit(256 * 1024 * 1024)
            .read_to_string()
        {
            Ok(body) => body,
            Err(e) => return Asked::Unreachable(unreachable(&e, "")),
        };
        if let Some((leader, message)) = crate::leader_http::not_leader(status, &body) {
            return Asked::NotLeader { leader, message };
        }
        if !(200..300).contains(&status) {
            // A refusal (401, 403) says why in `{"error": ...}`.
            let why = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v.get("error")?.as_str().map(str::to_string))
                .map(|e| format!(": {e}"))
                .unwrap_or_default();
            let hint = if status == 401 {
                " (give --principal and --secret-file, or RINGMASTER_PRINCIPAL and \
                 RINGMASTER_SECRET_FILE)"
            } else {
                ""
            };
            return Asked::Answer(Err(format!(
                "the master at {url} answered HTTP {status}{why}{hint}"
            )));
        }
        Asked::Answer(
            serde_json::from_str(&body).map_err(|e| {
                format!("the answer of {url} is not a ringmaster /state document: {e}")
            }),
        )
    })
    .and_then(|answer| answer)
}

/// The JSON `--json` prints for a view: the whole state or the view's part of it.
pub fn to_json(view: StatusView, s: &Snapshot) -> String {
    let value = match view {
        StatusView::Summary => serde_json::to_value(s),
        StatusView::Agents => serde_json::to_value(&s.agents),
        StatusView::Frameworks => serde_json::to_value(&s.frameworks),
        StatusView::Tasks => serde_json::to_value(&s.tasks),
        StatusView::Rings => serde_json::to_value(&s.rings),
        StatusView::Pending => serde_json::to_value(&s.pending),
    };
    value
        .and_then(|v| serde_json::to_string_pretty(&v))
        .unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// The view as text tables; `master` is shown in the summary.
pub fn render(view: StatusView, s: &Snapshot, master: &str) -> String {
    match view {
        StatusView::Summary => summary(s, master),
        StatusView::Agents => agents(s),
        StatusView::Frameworks => frameworks(s),
        StatusView::Tasks => tasks(s),
        StatusView::Rings => rings(s),
        StatusView::Pending => pending(s),
    }
}

/// Columns padded to their widest cell, two spaces apart; numeric columns right-aligned.
struct Table {
    headers: Vec<String>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new<S: AsRef<str>>(headers: &[S]) -> Table {
        Table {
            headers: headers.iter().map(|h| h.as_ref().to_string()).collect(),
            right: vec![false; headers.len()],
            rows: Vec::new(),
        }
    }

    fn right_align(mut self, columns: &[usize]) -> Table {
        for &c in columns {
            self.right[c] = true;
        }
        self
    }

    fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    fn render(&self, out: &mut String) {
        let n = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate().take(n) {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
        for row in std::iter::once(&self.headers).chain(&self.rows) {
            let mut line = String::new();
            for (i, cell) in row.iter().enumerate().take(n) {
                if i > 0 {
                    line.push_str("  ");
                }
                let pad = widths[i] - cell.chars().count();
                if self.right[i] {
                    line.push_str(&" ".repeat(pad));
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
                    line.push_str(&" ".repeat(pad));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
}

fn parse(bundle: &str) -> Resources {
    Resources::parse(bundle).unwrap_or_default()
}

/// An amount without needless decimals: `4`, `0.5`, `1.25`.
fn amount(x: f64) -> String {
    let text = format!("{x:.3}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Used against allocated, from a usage sample: `cpus 1.2/4 mem 300/8192 MiB` (`?` for cores
/// not known yet, after a task's first sample).
fn used_of_alloc(cpus: Option<f64>, mem_mib: f64, allocated: &Resources) -> String {
    let cpus = cpus.map_or("?".into(), |c| format!("{c:.2}"));
    format!(
        "cpus {}/{} mem {}/{} MiB",
        cpus.trim_end_matches('0').trim_end_matches('.'),
        amount(allocated.amount("cpus")),
        mem_mib.round(),
        amount(allocated.amount("mem")),
    )
}

fn dash_if_empty(text: &str) -> String {
    if text.is_empty() {
        "-".into()
    } else {
        text.to_string()
    }
}

/// `RUNNING 3, FINISHED 2` (or `-`).
fn by_state(counts: &BTreeMap<String, usize>) -> String {
    if counts.is_empty() {
        return "-".into();
    }
    counts
        .iter()
        .map(|(state, n)| format!("{state} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every dimension any agent has, sorted.
fn dimensions(agents: &[AgentView]) -> Vec<String> {
    let mut names = BTreeSet::new();
    for a in agents {
        names.extend(parse(&a.total).names().map(str::to_string));
    }
    names.into_iter().collect()
}

/// With a replication group: `Leader  master N at ADDR (term T)` and each master's role
/// (`Masters  1 leader 10.0.0.1:5050 · 2 follower 10.0.0.2:5050 …`; a master of the membership
/// that is not a voter is a `learner`). Nothing for a single master.
fn cluster_lines(cluster: Option<&ClusterView>) -> Vec<(&'static str, String)> {
    let Some(cluster) = cluster else {
        return Vec::new();
    };
    let leader = match cluster.leader {
        Some(id) => format!(
            "master {id} at {} (term {})",
            cluster.peers.get(&id).map_or("?", String::as_str),
            cluster.term
        ),
        None => format!("none known (term {})", cluster.term),
    };
    let roles: Vec<String> = cluster
        .peers
        .iter()
        .map(|(id, address)| {
            let role = if Some(*id) == cluster.leader {
                "leader"
            } else if cluster.voters.is_empty() || cluster.voters.contains(id) {
                "follower"
            } else {
                "learner"
            };
            format!("{id} {role} {address}")
        })
        .collect();
    vec![("Leader", leader), ("Masters", roles.join(" · "))]
}

fn summary(s: &Snapshot, master: &str) -> String {
    let count = |state: &str| s.agents.iter().filter(|a| a.state == state).count();
    let fw_connected = s.frameworks.iter().filter(|f| f.connected).count();
    let c = &s.counters;
    let mut out = String::new();
    let mut lines = Table::new(&["", ""]);
    lines.row(vec![
        "Master".into(),
        format!(
            "{} at {master}, placer {}, up {}",
            s.master,
            s.placer,
            humantime::format_duration(Duration::from_secs(s.uptime_secs as u64))
        ),
    ]);
    for (label, line) in cluster_lines(s.cluster.as_ref()) {
        lines.row(vec![label.into(), line]);
    }
    lines.row(vec![
        "Agents".into(),
        format!(
            "{} connected, {} disconnected, {} lost",
            count("connected"),
            count("disconnected"),
            count("lost")
        ),
    ]);
    lines.row(vec![
        "Frameworks".into(),
        format!(
            "{fw_connected} connected, {} disconnected",
            s.frameworks.len() - fw_connected
        ),
    ]);
    lines.row(vec!["Tasks".into(), by_state(&s.tasks_by_state)]);
    lines.row(vec![
        "Offers".into(),
        format!(
            "{} outstanding; {} made, {} accepted, {} declined, {} rescinded",
            s.offers.len(),
            c.offers_made,
            c.offers_accepted,
            c.offers_declined,
            c.offers_rescinded
        ),
    ]);
    lines.row(vec![
        "Pending".into(),
        match s.pending.len() {
            0 => "none".into(),
            n => format!(
                "{n} demand{} cannot be served (ringmaster status pending)",
                if n == 1 { "" } else { "s" }
            ),
        },
    ]);
    // The two-column block has no header line.
    let mut block = String::new();
    lines.render(&mut block);
    out.extend(block.lines().skip(1).map(|l| format!("{l}\n")));
    out.push('\n');
    let (total, used, offered, free) = (
        parse(&s.total),
        parse(&s.used),
        parse(&s.offered),
        parse(&s.free),
    );
    let mut table = Table::new(&["DIMENSION", "TOTAL", "USED", "OFFERED", "FREE", "USED%"])
        .right_align(&[1, 2, 3, 4, 5]);
    for name in total.names() {
        let t = total.amount(name);
        let u = used.amount(name);
        table.row(vec![
            name.to_string(),
            amount(t),
            amount(u),
            amount(offered.amount(name)),
            amount(free.amount(name)),
            if t > 0.0 {
                format!("{:.0}%", 100.0 * u / t)
            } else {
                "-".into()
            },
        ]);
    }
    if table.rows.is_empty() {
        out.push_str("No resources: no agent is registered.\n");
    } else {
        table.render(&mut out);
    }
    out
}

fn agents(s: &Snapshot) -> String {
    if s.agents.is_empty() {
        return "No agents.\n".into();
    }
    let dims = dimensions(&s.agents);
    let mut headers: Vec<String> = ["ID", "HOSTNAME", "STATE", "TASKS"]
        .map(String::from)
        .to_vec();
    headers.extend(
        dims.iter()
            .map(|d| format!("{} FREE/TOTAL", d.to_uppercase())),
    );
    // Used against allocated, once any agent reports usage.
    let show_usage = s.agents.iter().any(|a| a.usage.is_some());
    if show_usage {
        headers.push("USED/ALLOC".into());
    }
    headers.extend(["BUCKETS".into(), "HEARTBEAT".into()]);
    let mut right = vec![3];
    right.extend(4..4 + dims.len());
    let mut table = Table::new(&headers).right_align(&right);
    for a in &s.agents {
        let (total, free) = (parse(&a.total), parse(&a.free));
        let mut row = vec![
            a.id.clone(),
            dash_if_empty(&a.hostname),
            a.state.clone(),
            a.tasks.to_string(),
        ];
        for d in &dims {
            row.push(if total.milli(d) == 0 {
                "-".into()
            } else {
                format!("{}/{}", amount(free.amount(d)), amount(total.amount(d)))
            });
        }
        if show_usage {
            row.push(match &a.usage {
                Some(u) => used_of_alloc(Some(u.cpus), u.mem_mib, &parse(&a.used)),
                None => "-".into(),
            });
        }
        let buckets: Vec<String> = a.buckets.iter().map(|(d, b)| format!("{d}:{b}")).collect();
        row.push(dash_if_empty(&buckets.join(" ")));
        row.push(format!("{:.1}s ago", a.last_heartbeat_secs));
        table.row(row);
    }
    let mut out = String::new();
    table.render(&mut out);
    out
}

fn frameworks(s: &Snapshot) -> String {
    if s.frameworks.is_empty() {
        return "No frameworks.\n".into();
    }
    let mut table = Table::new(&[
        "ID", "NAME", "USER", "WEIGHT", "STATE", "SHARE", "OFFERS", "DEMAND", "TASKS",
    ])
    .right_align(&[3, 5, 6]);
    for f in &s.frameworks {
        table.row(vec![
            f.id.clone(),
            f.name.clone(),
            dash_if_empty(&f.user),
            amount(f.weight),
            if f.connected {
                "connected"
            } else {
                "disconnected"
            }
            .into(),
            format!("{:.3}", f.share),
            f.offers.to_string(),
            match (f.demand_count, f.suppressed) {
                (_, true) => "suppressed".into(),
                (0, false) => "-".into(),
                (n, false) => format!("{n} x {}", f.demand),
            },
            by_state(&f.tasks_by_state),
        ]);
    }
    let mut out = String::new();
    table.render(&mut out);
    out
}

fn tasks(s: &Snapshot) -> String {
    if s.tasks.is_empty() {
        return "No tasks.\n".into();
    }
    let names: BTreeMap<&str, &str> = s
        .frameworks
        .iter()
        .map(|f| (f.id.as_str(), f.name.as_str()))
        .collect();
    // Used against allocated, once any task has a usage sample.
    let show_usage = s.tasks.iter().any(|t| t.usage.is_some());
    let mut headers = vec!["FRAMEWORK", "ID", "NAME", "AGENT", "STATE", "RESOURCES"];
    if show_usage {
        headers.push("USED/ALLOC");
    }
    headers.push("REASON");
    let mut table = Table::new(&headers);
    for t in &s.tasks {
        let mut row = vec![
            names
                .get(t.framework.as_str())
                .map_or(t.framework.clone(), |n| n.to_string()),
            t.id.clone(),
            dash_if_empty(&t.name),
            t.agent.clone(),
            t.state.clone(),
            t.resources.clone(),
        ];
        if show_usage {
            row.push(match &t.usage {
                Some(u) => used_of_alloc(u.cpu_used, u.mem_rss_mib, &parse(&t.resources)),
                None => "-".into(),
            });
        }
        row.push(dash_if_empty(&t.reason));
        table.row(row);
    }
    let mut out = String::new();
    table.render(&mut out);
    out
}

fn rings(s: &Snapshot) -> String {
    if s.rings.is_empty() {
        return "No rings: no agent has registered yet.\n".into();
    }
    let mut out = String::new();
    for (i, ring) in s.rings.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let occupied: Vec<_> = ring.buckets.iter().filter(|b| b.agents > 0).collect();
        let agents: usize = occupied.iter().map(|b| b.agents).sum();
        let _ = writeln!(
            out,
            "{}: {} buckets, search_up {}, {agents} agent{} in {} bucket{}",
            ring.dimension,
            ring.buckets.len(),
            ring.search_up,
            if agents == 1 { "" } else { "s" },
            occupied.len(),
            if occupied.len() == 1 { "" } else { "s" },
        );
        if occupied.is_empty() {
            continue;
        }
        let widest = occupied.iter().map(|b| b.agents).max().unwrap_or(1);
        let mut table = Table::new(&["BUCKET", "FREE RANGE", "AGENTS", ""]).right_align(&[0, 2]);
        for b in occupied {
            let range = match b.upper {
                Some(upper) => format!("[{}, {})", amount(b.lower), amount(upper)),
                None => format!("[{}, ∞)", amount(b.lower)),
            };
            // Bars of at most 40 marks, scaled to the fullest bucket.
            let marks = (b.agents * 40).div_ceil(widest).max(1);
            table.row(vec![
                b.index.to_string(),
                range,
                b.agents.to_string(),
                "█".repeat(marks),
            ]);
        }
        table.render(&mut out);
    }
    out
}

fn pending(s: &Snapshot) -> String {
    if s.pending.is_empty() {
        return "No pending demands: every framework's demand is offered or being placed.\n".into();
    }
    let mut table = Table::new(&["FRAMEWORK", "NAME", "DEMAND", "COUNT", "WHY"]).right_align(&[3]);
    for p in &s.pending {
        table.row(vec![
            p.framework.clone(),
            p.name.clone(),
            p.demand.clone(),
            p.count.to_string(),
            p.why.clone(),
        ]);
    }
    let mut out = String::new();
    table.render(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_urls() {
        assert_eq!(
            state_url("127.0.0.1:5051").unwrap(),
            "http://127.0.0.1:5051/state"
        );
        assert_eq!(state_url("http://m:80/").unwrap(), "http://m:80/state");
        assert_eq!(state_url("https://m:80/").unwrap(), "https://m:80/state");
        assert!(state_url(" ").is_err());
    }

    #[test]
    fn tables_align_and_amounts_are_short() {
        let mut table = Table::new(&["A", "NUMBER"]).right_align(&[1]);
        table.row(vec!["long-name".into(), "5".into()]);
        table.row(vec!["x".into(), "12345678".into()]);
        let mut out = String::new();
        table.render(&mut out);
        assert_eq!(
            out,
            "A            NUMBER\nlong-name         5\nx          12345678\n"
        );
        assert_eq!(amount(4.0), "4");
        assert_eq!(amount(0.5), "0.5");
        assert_eq!(amount(1.25), "1.25");
        assert_eq!(amount(0.0), "0");
    }

    #[test]
    fn a_group_shows_its_leader_and_each_masters_role() {
        let view = ClusterView {
            id: 2,
            role: "leader".into(),
            leader: Some(2),
            term: 7,
            peers: [
                (1, "10.0.0.1:5050".to_string()),
                (2, "10.0.0.2:5050".to_string()),
                (3, "10.0.0.3:5050".to_string()),
                (4, "10.0.0.4:5050".to_string()),
            ]
            .into(),
            voters: vec![1, 2, 3],
            applied_index: None,
            snapshot_index: None,
            purged_index: None,
            snapshots_installed: 0,
        };
        assert_eq!(
            cluster_lines(Some(&view)),
            vec![
                ("Leader", "master 2 at 10.0.0.2:5050 (term 7)".to_string()),
                (
                    "Masters",
                    "1 follower 10.0.0.1:5050 · 2 leader 10.0.0.2:5050 · 3 follower \
                     10.0.0.3:5050 · 4 learner 10.0.0.4:5050"
                        .to_string()
                ),
            ]
        );
        assert!(cluster_lines(None).is_empty());
    }

    #[test]
    fn used_against_allocated() {
        let alloc = Resources::parse("cpus:4;mem:8192").unwrap();
        assert_eq!(
            used_of_alloc(Some(1.2), 300.4, &alloc),
            "cpus 1.2/4 mem 300/8192 MiB"
        );
        assert_eq!(used_of_alloc(None, 0.0, &alloc), "cpus ?/4 mem 0/8192 MiB");
        assert_eq!(
            used_of_alloc(Some(0.0), 1.0, &Resources::new()),
            "cpus 0/0 mem 1/0 MiB"
        );
    }
}
