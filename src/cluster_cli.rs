//! `ringmaster cluster members|add|remove`: clients of the leader's `/cluster/members` HTTP API
//! (docs/operations.md, "Adding or removing a master"). `--master a,b,c` follows the leader as
//! `ringmaster status` does. `ringmaster cluster init` is offline: it turns a stopped single
//! master's work dir into the first master's of a new group (docs/operations.md, "From one
//! master to three").

use std::path::Path;
use std::time::Duration;

use crate::jobs::cli::{call, call_with, failure, CliError};
use crate::master::ops::model::{MemberView, MembersView};

/// How long `cluster add` waits: the leader waits up to a minute for the new master to catch
/// up, then commits the change.
const ADD_TIMEOUT: Duration = Duration::from_secs(90);

fn read_members(text: &str) -> Result<MembersView, CliError> {
    serde_json::from_str(text).map_err(|e| {
        failure(format!(
            "the master answered something unexpected ({e}): {text}"
        ))
    })
}

/// The membership as a table: one line per master, its role and address.
pub fn render(members: &MembersView) -> String {
    let mut rows: Vec<(&MemberView, &str)> = members
        .voters
        .iter()
        .map(|m| (m, "voter"))
        .chain(members.learners.iter().map(|m| (m, "learner")))
        .collect();
    rows.sort_by_key(|(m, _)| m.id);
    let mut out = format!(
        "{:<4} {:<8} {:<7} {:<8} ADDRESS\n",
        "ID", "ROLE", "LEADER", "MATCHED"
    );
    for (member, role) in rows {
        let leads = if members.leader == Some(member.id) {
            "*"
        } else {
            ""
        };
        let matched = member.matched.map_or("-".to_string(), |i| i.to_string());
        out.push_str(&format!(
            "{:<4} {:<8} {:<7} {:<8} {}\n",
            member.id, role, leads, matched, member.address
        ));
    }
    out
}

/// `cluster members [--json]`.
pub fn members(master: &str, json: bool) -> Result<(), CliError> {
    let text = call(master, "GET", "/cluster/members", None)?;
    let members = read_members(&text)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&members).unwrap_or_default()
        );
    } else {
        print!("{}", render(&members));
    }
    Ok(())
}

/// `cluster add --id N --address HOST:PORT`.
pub fn add(master: &str, id: u64, address: &str) -> Result<(), CliError> {
    crate::config::check_host_port(address).map_err(|e| CliError {
        message: format!("--address: {e}"),
        code: 2,
    })?;
    if id == 0 {
        return Err(CliError {
            message: "--id: master ids start at 1".into(),
            code: 2,
        });
    }
    let body = serde_json::json!({ "id": id, "address": address }).to_string();
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(ADD_TIMEOUT))
        .http_status_as_error(false)
        .middleware(crate::jobs::cli::add_authorization)
        .build()
        .into();
    let text = call_with(&agent, master, "POST", "/cluster/members", Some(body))?;
    let answer: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    if answer["added"] == serde_json::Value::Bool(false) {
        println!("master {id} at {address} is a voter already; nothing changed");
    } else {
        println!("master {id} at {address} added: it caught up and votes");
    }
    if let Ok(members) = serde_json::from_value::<MembersView>(answer["members"].clone()) {
        print!("{}", render(&members));
    }
    Ok(())
}

/// `cluster remove --id N`.
pub fn remove(master: &str, id: u64) -> Result<(), CliError> {
    let text = call(master, "DELETE", &format!("/cluster/members/{id}"), None)?;
    println!("master {id} removed from the group; stop it (it takes no part any more)");
    let answer: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    if let Ok(members) = serde_json::from_value::<MembersView>(answer["members"].clone()) {
        print!("{}", render(&members));
    }
    Ok(())
}

/// `cluster init --from DIR --config GROUP.yaml`: seeds a new group from the stopped single
/// master's work dir `from`, in place. `config` is the config the master on `from` will run
/// with (its `cluster:` names it and every master of the group). Exit code 2 for a bad config,
/// 1 when the work dir is refused.
pub fn init(from: &Path, config_path: &Path) -> Result<(), CliError> {
    let config = crate::config::Config::load(config_path).map_err(|e| CliError {
        message: e.to_string(),
        code: 2,
    })?;
    let Some(cluster) = config.cluster else {
        return Err(CliError {
            message: format!(
                "--config: {} has no cluster: section; give the config the master on {} will \
                 run with in the group (cluster.id and every master in cluster.peers)",
                config_path.display(),
                from.display()
            ),
            code: 2,
        });
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| failure(format!("cannot start a runtime: {e}")))?;
    let seeded = runtime
        .block_on(crate::master::replication::seed::seed_from_single(
            from, &cluster,
        ))
        .map_err(|e| failure(e.to_string()))?;
    println!(
        "{} is now master {}'s work dir in a group of {} ({}): its registry (frameworks: {}, \
         agents: {}, tasks: {}, jobs: {}) is the group's first snapshot",
        from.display(),
        seeded.id,
        seeded.voters.len(),
        seeded
            .voters
            .iter()
            .map(|(id, address)| format!("{id} at {address}"))
            .collect::<Vec<_>>()
            .join(", "),
        seeded.frameworks,
        seeded.agents,
        seeded.tasks,
        seeded.jobs,
    );
    println!(
        "next: start master {} on it with this config, and every other master on an empty \
         work dir with cluster.join: true (docs/operations.md, \"From one master to three\")",
        seeded.id
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_render_as_a_table_with_the_leader_marked() {
        let members = MembersView {
            leader: Some(2),
            voters: vec![
                MemberView {
                    id: 2,
                    address: "b:5050".into(),
                    matched: Some(7),
                },
                MemberView {
                    id: 1,
                    address: "a:5050".into(),
                    matched: Some(7),
                },
            ],
            learners: vec![MemberView {
                id: 4,
                address: "d:5050".into(),
                matched: None,
            }],
            applied_index: Some(7),
            snapshot_index: None,
            purged_index: None,
        };
        assert_eq!(
            render(&members),
            "ID   ROLE     LEADER  MATCHED  ADDRESS\n\
             1    voter            7        a:5050\n\
             2    voter    *       7        b:5050\n\
             4    learner          -        d:5050\n"
        );
    }
}
