//! A full agent disk: the free `disk` an agent reports in its heartbeats bounds what the master
//! offers there (docs/protocol.md, "Agents"); the rest is withheld until the agent reports room.

use ringmaster_proto::convert::ResourcesWire;
use ringmaster_proto::{AgentHeartbeat, Message, Offer, Placement, TaskState};
use tokio::time::Duration;

use super::super::harness::{register, res, Fw, Harness, Out};
use super::super::ConnId;
use super::running;

/// The agent `id` on `conn` reports `free` in a heartbeat.
fn heartbeat(h: &mut Harness, conn: ConnId, id: &str, free: &str) {
    h.send(
        conn,
        Message::AgentHeartbeat(AgentHeartbeat {
            agent_id: id.into(),
            free: Some(res(free).to_wire()),
            ..Default::default()
        }),
    );
}

/// The whole-agent offer the ring placer makes on `a1` (cpus in bucket 4).
fn offer(fw: &Fw, id: &str, resources: &str) -> Offer {
    Offer {
        offer_id: id.into(),
        framework_id: fw.id.clone(),
        agent_id: "a1".into(),
        hostname: "a1".into(),
        resources: Some(res(resources).to_wire()),
        placement: Some(Placement {
            placer: "ring".into(),
            phase: "down".into(),
            bucket: 4,
            dimension: "cpus".into(),
        }),
        ..Offer::default()
    }
}

/// Every admitted agent's free and withheld (as `/state` shows them) fit in its total.
fn within_total(h: &Harness) {
    for a in h.snapshot().agents {
        if a.free.is_empty() && a.withheld.is_empty() {
            continue;
        }
        let total = res(&a.total);
        let mut both = res(&a.free);
        both.saturating_add_assign(&res(&a.withheld));
        assert!(
            total.contains(&both),
            "agent {}: free {} and withheld {} above total {total}",
            a.id,
            a.free,
            a.withheld
        );
    }
}

#[test]
fn a_full_disk_is_withheld_from_offers_until_the_agent_reports_room() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;disk:1000;mem:1024");
    h.settle();
    // The agent's disk is full: it reports no free disk, the books say 1000.
    heartbeat(&mut h, agent, "a1", "cpus:4;mem:1024");
    let snap = h.snapshot();
    let a = &snap.agents[0];
    assert_eq!(
        (a.free.as_str(), a.used.as_str(), a.withheld.as_str()),
        ("cpus:4;mem:1024", "", "disk:1000")
    );
    assert_eq!(a.reported_free, "cpus:4;mem:1024");
    assert_eq!(
        (
            snap.free.as_str(),
            snap.used.as_str(),
            snap.withheld.as_str()
        ),
        ("cpus:4;mem:1024", "", "disk:1000")
    );
    // Nothing to offer again: no allocation run is asked for.
    assert!(h.allocation_due().is_none());
    // A demand with disk gets no offer there, and says why.
    let web = h.framework("web");
    h.demand(&web, "cpus:1;disk:10", 1);
    h.settle();
    h.expect_nothing(web.conn);
    assert_eq!(
        h.snapshot().pending[0].why,
        "no agent fits cpus:1;disk:10: 1 agent short of disk"
    );
    // The agent has room again: the disk is offered at once (the heartbeat asks for a run).
    heartbeat(&mut h, agent, "a1", "cpus:4;disk:1000;mem:1024");
    assert!(h.allocation_due().is_some());
    assert_eq!(h.snapshot().agents[0].withheld, "");
    h.settle();
    assert_eq!(
        h.expect_offers(&web),
        vec![offer(&web, "0-O2", "cpus:4;disk:1000;mem:1024")]
    );
    // The heartbeat that follows the offer withholds nothing: the offered disk is not free.
    heartbeat(&mut h, agent, "a1", "cpus:4;disk:1000;mem:1024");
    let a = &h.snapshot().agents[0];
    assert_eq!((a.free.as_str(), a.withheld.as_str()), ("", ""));
}

#[test]
fn cpus_and_memory_of_a_full_agent_are_still_offered_without_disk() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;disk:1000;mem:1024");
    heartbeat(&mut h, agent, "a1", "cpus:4;mem:1024");
    let batch = h.framework("batch");
    h.demand(&batch, "cpus:1;mem:128", 1);
    h.settle();
    assert_eq!(
        h.expect_offers(&batch),
        vec![offer(&batch, "0-O2", "cpus:4;mem:1024")]
    );
    // Later heartbeats with the disk still full change nothing.
    heartbeat(&mut h, agent, "a1", "cpus:4;mem:1024");
    let a = &h.snapshot().agents[0];
    assert_eq!(
        (a.free.as_str(), a.offered.as_str(), a.withheld.as_str()),
        ("", "cpus:4;mem:1024", "disk:1000")
    );
    assert!(h.allocation_due().is_none());
}

#[test]
fn withheld_disk_is_charged_to_no_framework() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;disk:1000;mem:1024");
    let fw = h.framework("web");
    running(&mut h, &fw, agent, "t1", "cpus:1;disk:100;mem:128");
    let share = h.snapshot().frameworks[0].share;
    assert_eq!(share, 0.25);
    heartbeat(&mut h, agent, "a1", "cpus:3;mem:896");
    let snap = h.snapshot();
    let f = &snap.frameworks[0];
    assert_eq!(
        (f.allocated.as_str(), f.share),
        ("cpus:1;disk:100;mem:128", share)
    );
    let a = &snap.agents[0];
    assert_eq!(
        (a.free.as_str(), a.used.as_str(), a.withheld.as_str()),
        ("cpus:3;mem:896", "cpus:1;disk:100;mem:128", "disk:900")
    );
    assert_eq!(
        (
            snap.free.as_str(),
            snap.used.as_str(),
            snap.withheld.as_str()
        ),
        ("cpus:3;mem:896", "cpus:1;disk:100;mem:128", "disk:900")
    );
}

#[test]
fn an_agent_withholding_disk_stays_consistent_through_task_ends_disconnects_and_reregistration() {
    let mut h = Harness::new();
    let agent = h.agent("a1", "cpus:4;disk:1000;mem:1024");
    let fw = h.framework("web");
    running(&mut h, &fw, agent, "t1", "cpus:1;disk:100;mem:128");
    heartbeat(&mut h, agent, "a1", "cpus:3;mem:896");
    let a = &h.snapshot().agents[0];
    assert_eq!(
        (a.free.as_str(), a.withheld.as_str()),
        ("cpus:3;mem:896", "disk:900")
    );
    // The task ends: its disk comes back to the books, and the agent's next heartbeat (sent
    // right after the task end) withholds it too while the disk is still full.
    h.status(agent, &fw, "t1", TaskState::TaskFinished);
    h.sent(agent);
    let done = h.expect_update(&fw);
    h.ack(&fw, &done);
    let a = &h.snapshot().agents[0];
    assert_eq!(
        (a.free.as_str(), a.withheld.as_str()),
        ("cpus:4;disk:100;mem:1024", "disk:900")
    );
    within_total(&h);
    heartbeat(&mut h, agent, "a1", "cpus:4;mem:1024");
    let a = &h.snapshot().agents[0];
    assert_eq!(
        (a.free.as_str(), a.withheld.as_str()),
        ("cpus:4;mem:1024", "disk:1000")
    );
    // Disconnected while withholding: nothing is offered, the books stand.
    h.disconnect(agent);
    let a = &h.snapshot().agents[0];
    assert_eq!(
        (a.state.as_str(), a.withheld.as_str()),
        ("disconnected", "disk:1000")
    );
    within_total(&h);
    // Re-registered with a smaller total: it starts from its new total, nothing withheld.
    let again = h.agent_with(register("a1", "cpus:4;disk:500;mem:1024"));
    let a = &h.snapshot().agents[0];
    assert_eq!(
        (a.free.as_str(), a.used.as_str(), a.withheld.as_str()),
        ("cpus:4;disk:500;mem:1024", "", "")
    );
    heartbeat(&mut h, again, "a1", "cpus:4;disk:200;mem:1024");
    let a = &h.snapshot().agents[0];
    assert_eq!(
        (a.free.as_str(), a.withheld.as_str()),
        ("cpus:4;disk:200;mem:1024", "disk:300")
    );
    heartbeat(&mut h, again, "a1", "cpus:4;disk:500;mem:1024");
    let a = &h.snapshot().agents[0];
    assert_eq!(
        (a.free.as_str(), a.withheld.as_str()),
        ("cpus:4;disk:500;mem:1024", "")
    );
    within_total(&h);
    // Lost while withholding: it leaves the books; the agent admitted next (under the same
    // key) withholds nothing.
    heartbeat(&mut h, again, "a1", "cpus:4;mem:1024");
    h.advance_and_tick(Duration::from_secs(15));
    assert!(matches!(h.sent(again).pop(), Some(Out::Close(_))));
    let snap = h.snapshot();
    assert_eq!(
        (
            snap.agents[0].state.as_str(),
            snap.agents[0].withheld.as_str()
        ),
        ("lost", "")
    );
    assert_eq!((snap.total.as_str(), snap.withheld.as_str()), ("", ""));
    h.agent("a2", "cpus:2;disk:300;mem:512");
    let snap = h.snapshot();
    let a2 = &snap.agents[1];
    assert_eq!(
        (a2.free.as_str(), a2.withheld.as_str()),
        ("cpus:2;disk:300;mem:512", "")
    );
    assert_eq!(
        (snap.free.as_str(), snap.withheld.as_str()),
        ("cpus:2;disk:300;mem:512", "")
    );
    within_total(&h);
}
