//! `ringmaster job plan`: where a job's instances would go now, or why they cannot be placed,
//! with nothing launched. The master's own placer runs on a copy of its cluster, one instance
//! after another (each takes its resources on the copy), with the allocation step's agent
//! rules (connected, in the default partition the jobs framework uses, devices that fit); the
//! first instance that fits nowhere is explained like a pending demand ("why pending").

use ringmaster_core::placement::{AgentKey, Filter, WhyUnplaced};
use ringmaster_proto::resources::Resources;
use serde::{Deserialize, Serialize};

use super::state::MasterState;

/// The answer of a plan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The agent of each instance that fits, in instance order.
    pub placed: Vec<String>,
    /// Instances that fit nowhere (the rest, from the first that did not fit).
    pub unplaced: u32,
    /// Why the first unplaced instance fits nowhere.
    pub why: Option<String>,
}

impl MasterState {
    /// Places `count` instances of `demand` on a copy of the cluster (see the module docs).
    pub(crate) fn plan(&self, demand: &Resources, count: u32) -> Plan {
        let mut cluster = self.alloc.cluster().clone();
        let rules = |key: AgentKey| -> Result<(), Filter> {
            let agent = self.alloc.agent_id(key).and_then(|id| self.agents.get(id));
            let Some(agent) = agent else {
                return Err(Filter::Disconnected);
            };
            if agent.conn.is_none() {
                return Err(Filter::Disconnected);
            }
            if agent.partition() != ringmaster_core::placement::DEFAULT_PARTITION {
                return Err(Filter::Partition);
            }
            if !self.alloc.devices().fits(key, demand) {
                return Err(Filter::Devices);
            }
            Ok(())
        };
        let mut placed = Vec::new();
        for done in 0..count {
            let decision = cluster.place(demand, &|key| rules(key).is_ok());
            let Some(key) = decision.map(|d| d.agent) else {
                let why = WhyUnplaced::explain_rules(&cluster, demand, &rules);
                return Plan {
                    placed,
                    unplaced: count - done,
                    why: Some(why.to_string()),
                };
            };
            if cluster.take(key, demand).is_err() {
                break;
            }
            placed.push(self.alloc.agent_id(key).unwrap_or("?").to_string());
        }
        Plan {
            placed,
            unplaced: 0,
            why: None,
        }
    }
}
