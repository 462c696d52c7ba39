//! What the operator surface shows: the serializable views of the master's state (the body of
//! `GET /state`, used by the dashboard and the status CLI) and the state-derived numbers copied
//! into `/metrics`.
//!
//! Reading only: this module builds views from `&MasterState` and never changes it. The state
//! does not know these types; [`super::http`] asks the actor for them through its event
//! channel.

use std::collections::BTreeMap;

use ringmaster_proto::resources::Resources;
use tokio::time::Instant;

use super::metrics::Total;
pub use super::model::{
    AgentView, FrameworkView, OfferView, RingBucketView, RingSetView, Snapshot, TaskView,
};
use crate::master::allocator::disk;
use crate::master::state::MasterState;

impl MasterState {
    pub(crate) fn snapshot(&self, now: Instant) -> Snapshot {
        let total = self.alloc.cluster().total().clone();
        let usage = self.cluster_usage();
        let empty = Resources::new();
        let mut agents: Vec<AgentView> = self
            .agents
            .values()
            .map(|a| {
                let entry = a.key.and_then(|k| self.alloc.cluster().agent(k));
                let free = entry.map(|e| &e.free).unwrap_or(&empty);
                let offered = usage.offered_on.get(a.id.as_str()).unwrap_or(&empty);
                let withheld = disk(a.key.map_or(0, |k| self.alloc.withheld(k)));
                let used = match entry {
                    Some(e) => e
                        .total
                        .saturating_sub(free)
                        .saturating_sub(offered)
                        .saturating_sub(&withheld),
                    None => Resources::new(),
                };
                let buckets = a
                    .key
                    .map(|k| {
                        a.total
                            .names()
                            .filter_map(|d| {
                                self.alloc
                                    .cluster()
                                    .bucket_of(k, d)
                                    .map(|b| (d.to_string(), b))
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                AgentView {
                    id: a.id.clone(),
                    hostname: a.hostname.clone(),
                    attributes: a.attributes.clone(),
                    total: a.total.to_string(),
                    free: if entry.is_some() {
                        free.to_string()
                    } else {
                        String::new()
                    },
                    used: used.to_string(),
                    offered: offered.to_string(),
                    withheld: withheld.to_string(),
                    reported_free: a.reported_free.to_string(),
                    state: match (a.lost, a.conn.is_some()) {
                        (true, _) => "lost",
                        (false, true) => "connected",
                        (false, false) => "disconnected",
                    }
                    .to_string(),
                    connected: a.conn.is_some(),
                    lost: a.lost,
                    tasks: a.tasks.len(),
                    buckets,
                    last_heartbeat_secs: now.duration_since(a.last_heartbeat).as_secs_f64(),
                    usage: self.agent_usage(&a.id),
                }
            })
            .collect();
        agents.sort_by(|a, b| a.id.cmp(&b.id));
        let mut frameworks: Vec<FrameworkView> = self
            .frameworks
            .values()
            .map(|f| FrameworkView {
                id: f.id.clone(),
                name: f.name.clone(),
                user: f.tenant.user.to_string(),
                weight: f.weight,
                connected: f.conn.is_some(),
                share: self.alloc.drf().share(f.key, &total),
                allocated: self
                    .alloc
                    .drf()
                    .allocation(f.key)
                    .map(|r| r.to_string())
                    .unwrap_or_default(),
                demand: f.demand.to_string(),
                demand_count: f.demand_count,
                suppressed: f.suppressed,
                offers: f.offers.len(),
                tasks: f.tasks.len(),
                tasks_by_state: BTreeMap::new(),
            })
            .collect();
        frameworks.sort_by(|a, b| a.id.cmp(&b.id));
        let mut tasks_by_state: BTreeMap<String, usize> = BTreeMap::new();
        for ((fw, _), t) in self.tasks.iter() {
            let state = t.state.short_name();
            *tasks_by_state.entry(state.to_string()).or_default() += 1;
            if let Ok(i) = frameworks.binary_search_by(|f| f.id.as_str().cmp(fw)) {
                *frameworks[i]
                    .tasks_by_state
                    .entry(state.to_string())
                    .or_default() += 1;
            }
        }
        let mut tasks: Vec<TaskView> = self
            .tasks
            .iter()
            .map(|((fw, id), t)| TaskView {
                id: id.to_string(),
                framework: fw.to_string(),
                agent: t.agent.to_string(),
                name: t.name.to_string(),
                resources: t.resources.to_string(),
                state: t.state.short_name().to_string(),
                reason: t.detail.reason().to_string(),
                priority: Some(t.priority),
                healthy: t.health.healthy(),
                devices: t
                    .devices
                    .devices
                    .iter()
                    .map(|d| {
                        ringmaster_proto::devices::DeviceBinding {
                            devices: vec![d.clone()],
                        }
                        .to_string()
                    })
                    .collect(),
                usage: self.usage.get(&(fw.clone(), id.clone())).map(|u| u.view()),
            })
            .collect();
        tasks.sort_by(|a, b| (&a.framework, &a.id).cmp(&(&b.framework, &b.id)));
        let mut offers: Vec<OfferView> = self
            .offers
            .values()
            .map(|o| OfferView {
                id: o.id.clone(),
                framework: o.framework.clone(),
                agent: o.agent.clone(),
                resources: o.resources.to_string(),
            })
            .collect();
        offers.sort_by(|a, b| a.id.cmp(&b.id));
        let rings = self
            .alloc
            .cluster()
            .rings()
            .into_iter()
            .map(|ring| RingSetView {
                dimension: ring.name,
                search_up: ring.search_up,
                buckets: ring
                    .buckets
                    .into_iter()
                    .enumerate()
                    .map(|(index, b)| RingBucketView {
                        index,
                        lower: b.lower,
                        upper: b.upper,
                        agents: b.agents,
                    })
                    .collect(),
            })
            .collect();
        Snapshot {
            master: concat!("ringmaster ", env!("CARGO_PKG_VERSION")).to_string(),
            placer: self.alloc.cluster().placer().to_string(),
            uptime_secs: now.duration_since(self.started).as_secs_f64(),
            agents,
            frameworks,
            tasks,
            offers,
            rings,
            pending: self.pending_frameworks(now),
            counters: self.counters.clone(),
            tasks_by_state,
            total: total.to_string(),
            used: usage.used.to_string(),
            offered: usage.offered.to_string(),
            withheld: usage.withheld.to_string(),
            free: self.alloc.cluster().free().to_string(),
            cluster: match &self.cluster_view {
                Some(view) => Some(view()),
                None => self.cluster.clone(),
            },
        }
    }
}

impl MasterState {
    /// Copies the state-derived numbers into the shared metrics registry (see
    /// [`super::metrics`]).
    pub(crate) fn publish_metrics(&self, now: Instant) {
        let m = &self.metrics;
        let (mut connected, mut disconnected, mut lost) = (0, 0, 0);
        for a in self.agents.values() {
            match (a.lost, a.conn.is_some()) {
                (true, _) => lost += 1,
                (false, true) => connected += 1,
                (false, false) => disconnected += 1,
            }
        }
        m.set_agents(connected, disconnected, lost);
        let fw_connected = self
            .frameworks
            .values()
            .filter(|f| f.conn.is_some())
            .count();
        m.set_frameworks(fw_connected, self.frameworks.len() - fw_connected);
        m.set_tasks(|state| self.tasks.values().filter(|t| t.state == state).count());
        m.set_offers_outstanding(self.offers.len());
        m.set_pending_demands(self.pending_frameworks(now).len());
        let usage = self.cluster_usage();
        m.set_resources(
            self.alloc.cluster().total(),
            &usage.used,
            &usage.offered,
            self.alloc.cluster().free(),
        );
        let c = &self.counters;
        for (which, value) in [
            (Total::OffersMade, c.offers_made),
            (Total::OffersAccepted, c.offers_accepted),
            (Total::OffersDeclined, c.offers_declined),
            (Total::OffersRescinded, c.offers_rescinded),
            (Total::TasksLaunched, c.tasks_launched),
            (Total::AllocationRuns, c.allocation_runs),
            (Total::AgentsLost, c.agents_lost),
            (Total::FrameworksRemoved, c.frameworks_removed),
            (Total::ErrorsSent, c.errors_sent),
        ] {
            m.set_total(which, value);
        }
    }
}
