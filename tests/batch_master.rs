//! Batches through the master over real TCP: validation, agents under offers left out, one
//! offer per matched agent carrying exactly the suggested tasks, the result, and the launch.

mod common;

use common::*;
use ringmaster_proto::{BatchTask, ErrorCode, Message, SubmitBatch};

fn batch_task(id: &str, resources: &str, deadline: f64, work: f64) -> BatchTask {
    BatchTask {
        task: Some(task(id, resources, "true")),
        deadline_secs: deadline,
        work,
        price: 1.0,
    }
}

#[tokio::test]
async fn a_bad_batch_is_refused_whole() {
    let master = start_master(test_config("")).await;
    let _agent = Client::agent(master.addr(), "a1", "cpus:4;mem:1024").await;
    let mut fw = Client::framework(master.addr(), "batcher").await;
    fw.send(Message::SubmitBatch(SubmitBatch {
        batch_id: "b1".into(),
        tasks: vec![
            batch_task("ok", "cpus:1", 5.0, 1.0),
            batch_task("bad", "cpus:1", 0.0, 1.0),
        ],
    }))
    .await;
    let error = fw.expect_error().await;
    assert_eq!(error.code, ErrorCode::InvalidRequest as i32);
    assert_eq!(
        error.message,
        "SubmitBatch \"b1\": task bad: deadline_secs must be a number > 0, got 0; nothing matched"
    );
    fw.send(Message::SubmitBatch(SubmitBatch {
        batch_id: "b2".into(),
        tasks: vec![],
    }))
    .await;
    assert!(fw
        .expect_error()
        .await
        .message
        .contains("the batch has no tasks"));
    let s = master.snapshot().await.unwrap();
    assert!(s.offers.is_empty());
}

#[tokio::test]
async fn batch_offers_carry_suggested_tasks_and_skip_offered_agents() {
    let master = start_master(test_config("")).await;
    let _busy = Client::agent(master.addr(), "busy", "cpus:4;mem:1024").await;
    // Another framework holds an offer of `busy`: the batch may not use it.
    let mut holder = Client::framework(master.addr(), "holder").await;
    holder.demand("cpus:1", 1).await;
    let held = holder.expect_offers().await;
    assert_eq!(held[0].agent_id, "busy");
    let mut free = Client::agent(master.addr(), "free", "cpus:2;mem:1024").await;

    let mut fw = Client::framework(master.addr(), "batcher").await;
    fw.send(Message::SubmitBatch(SubmitBatch {
        batch_id: "b1".into(),
        tasks: vec![
            batch_task("t1", "cpus:1;mem:100", 5.0, 1.0),
            batch_task("t2", "cpus:1;mem:100", 5.0, 1.0),
            batch_task("t3", "cpus:3", 5.0, 1.0),
        ],
    }))
    .await;
    let offers = fw.expect_offers().await;
    assert_eq!(offers.len(), 1);
    let offer = &offers[0];
    assert_eq!(offer.agent_id, "free");
    assert_eq!(offer.batch_id, "b1");
    assert_eq!(offered(offer).to_string(), "cpus:2;mem:200");
    let ids: Vec<&str> = offer.suggested.iter().map(|t| t.task_id.as_str()).collect();
    assert_eq!(ids, ["t1", "t2"]);
    let result = fw
        .expect("BatchResult", |m| match m {
            Message::BatchResult(r) => Some(r.clone()),
            _ => None,
        })
        .await;
    assert_eq!(result.batch_id, "b1");
    assert_eq!(result.matched, 2);
    assert_eq!(result.proposals, 2);
    assert_eq!(result.offer_ids, std::slice::from_ref(&offer.offer_id));
    assert_eq!(result.unmatched.len(), 1);
    assert_eq!(result.unmatched[0].task_id, "t3");
    assert_eq!(result.unmatched[0].reason, "no_agent_fits");

    // Accepting exactly the suggested tasks launches them on the agent.
    fw.accept(&offer.offer_id, offer.suggested.clone()).await;
    let run = free.expect_run().await;
    let ids: Vec<&str> = run.iter().map(|t| t.task_id.as_str()).collect();
    assert_eq!(ids, ["t1", "t2"]);
    let s = wait_for_state(&master, "batch tasks launched", |s| s.tasks.len() == 2).await;
    let agent = s.agents.iter().find(|a| a.id == "free").unwrap();
    assert_eq!(agent.free, "mem:824");
}
