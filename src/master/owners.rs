//! Which principal holds each framework id and agent id, so an authenticated client can never
//! take over another principal's framework (failover by id) or agent (re-registration by id).
//!
//! The first connection that registers an id owns it for the master's lifetime; a later
//! `Subscribe` or `RegisterAgent` naming that id must come from the same principal (anonymous
//! connections, allowed when `auth.required` is false, are one more "principal": `None`).
//! Everything else a framework does is already scoped to its own id by the actor: offers carry
//! their framework, and tasks are keyed by (framework, task id).

use std::collections::HashMap;

use ringmaster_proto::Message;

/// Who is on the other end of a connection.
#[derive(Clone, Debug)]
pub(crate) enum Peer {
    Agent(String),
    Framework(String),
}

/// Owners of ids, by kind.
#[derive(Debug, Default)]
pub(crate) struct IdOwners {
    frameworks: HashMap<String, Option<String>>,
    agents: HashMap<String, Option<String>>,
}

fn show(principal: Option<&str>) -> String {
    match principal {
        Some(p) => format!("principal {p:?}"),
        None => "an anonymous client".to_string(),
    }
}

impl IdOwners {
    /// `Err(message)` when `first` names an id another principal owns.
    pub(crate) fn check(&self, first: &Message, principal: Option<&str>) -> Result<(), String> {
        let (kind, owners, id) = match first {
            Message::Subscribe(s) => ("framework", &self.frameworks, &s.framework_id),
            Message::RegisterAgent(r) => ("agent", &self.agents, &r.agent_id),
            _ => return Ok(()),
        };
        match owners.get(id) {
            Some(owner) if owner.as_deref() != principal => Err(format!(
                "{kind} {id} belongs to {}; {} may not take it over",
                show(owner.as_deref()),
                show(principal)
            )),
            _ => Ok(()),
        }
    }

    /// The principal holding a framework id (`""` = anonymous or not recorded), for the
    /// registry.
    pub(crate) fn framework(&self, id: &str) -> String {
        self.frameworks
            .get(id)
            .cloned()
            .flatten()
            .unwrap_or_default()
    }

    /// The principal holding an agent id, as [`IdOwners::framework`].
    pub(crate) fn agent(&self, id: &str) -> String {
        self.agents.get(id).cloned().flatten().unwrap_or_default()
    }

    /// Restores a persisted owner after a master restart (`""` = anonymous).
    pub(crate) fn restore(&mut self, peer: &Peer, principal: &str) {
        let principal = (!principal.is_empty()).then(|| principal.to_string());
        self.record(peer, principal);
    }

    /// Records the owner of the id a connection registered; the first owner stays.
    pub(crate) fn record(&mut self, peer: &Peer, principal: Option<String>) {
        let (owners, id) = match peer {
            Peer::Framework(id) => (&mut self.frameworks, id),
            Peer::Agent(id) => (&mut self.agents, id),
        };
        owners.entry(id.clone()).or_insert(principal);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringmaster_proto::{RegisterAgent, Subscribe};

    fn subscribe(id: &str) -> Message {
        Message::Subscribe(Subscribe {
            framework_id: id.into(),
            ..Default::default()
        })
    }

    #[test]
    fn only_the_owner_may_reuse_an_id() {
        let mut owners = IdOwners::default();
        assert!(owners.check(&subscribe("f1"), Some("alice")).is_ok());
        owners.record(&Peer::Framework("f1".into()), Some("alice".into()));
        assert!(owners.check(&subscribe("f1"), Some("alice")).is_ok());
        let err = owners.check(&subscribe("f1"), Some("bob")).unwrap_err();
        assert!(err.contains("alice") && err.contains("bob"), "{err}");
        assert!(owners.check(&subscribe("f1"), None).is_err());
        // A new framework (empty id) is always fine.
        assert!(owners.check(&subscribe(""), Some("bob")).is_ok());
        assert_eq!(owners.framework("f1"), "alice");
        // What the registry kept comes back after a restart.
        let mut restored = IdOwners::default();
        restored.restore(&Peer::Framework("f1".into()), &owners.framework("f1"));
        assert!(restored.check(&subscribe("f1"), Some("bob")).is_err());
        assert!(restored.check(&subscribe("f1"), Some("alice")).is_ok());
        // The first owner stays.
        owners.record(&Peer::Framework("f1".into()), Some("bob".into()));
        assert!(owners.check(&subscribe("f1"), Some("bob")).is_err());

        let agent = Message::RegisterAgent(RegisterAgent {
            agent_id: "a1".into(),
            ..Default::default()
        });
        owners.record(&Peer::Agent("a1".into()), None);
        assert!(owners.check(&agent, None).is_ok());
        assert!(owners.check(&agent, Some("rack1")).is_err());
    }
}
