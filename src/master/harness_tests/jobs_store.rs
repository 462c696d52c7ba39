//! The jobs framework's records (`Event::SaveJobs`): written in the actor turn's group commit
//! and answered only once that commit is on disk; a commit that fails fails the answer.

use std::sync::atomic::Ordering;

use tokio::sync::oneshot;

use super::super::events::Event;
use super::super::registry::{JobsMeta, Registry};
use super::Harness;

type Reply = oneshot::Receiver<Result<(), String>>;

fn save(
    h: &mut Harness,
    job: &str,
    record: Option<serde_json::Value>,
    meta: Option<JobsMeta>,
) -> Reply {
    let (reply, answer) = oneshot::channel();
    let now = h.now();
    h.state.handle(
        Event::SaveJobs {
            jobs: vec![(job.to_string(), record)],
            meta,
            reply,
        },
        now,
    );
    answer
}

fn durable_harness(dir: &std::path::Path) -> Harness {
    let mut h = Harness::new();
    h.attach_registry(Registry::open(dir).unwrap());
    h
}

#[test]
fn a_job_save_is_answered_only_after_the_turn_is_committed_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = durable_harness(dir.path());
    let web = serde_json::json!({"spec": {"name": "web"}, "stopped": false, "outcomes": []});
    let meta = JobsMeta {
        framework_id: Some("1-F1".into()),
        generation: 2,
        ..JobsMeta::default()
    };
    let mut first = save(&mut h, "web", Some(web.clone()), Some(meta.clone()));
    let mut second = save(&mut h, "once", Some(serde_json::json!({"spec": {}})), None);
    // Not yet: the turn has not been committed.
    assert!(first.try_recv().is_err());
    assert!(second.try_recv().is_err());
    assert!(h.state.registry().unwrap().load().unwrap().jobs.is_empty());
    h.state.commit_turn().unwrap();
    assert_eq!(first.try_recv().unwrap(), Ok(()));
    assert_eq!(second.try_recv().unwrap(), Ok(()));

    // A purge deletes the record.
    let mut purged = save(&mut h, "once", None, None);
    h.state.commit_turn().unwrap();
    assert_eq!(purged.try_recv().unwrap(), Ok(()));
    drop(h);

    let registry = Registry::open(dir.path()).unwrap();
    let recovered = registry.load().unwrap();
    assert_eq!(recovered.jobs, vec![("web".to_string(), web)]);
    assert_eq!(recovered.jobs_meta, Some(meta));
}

#[test]
fn a_failed_commit_fails_the_answer_and_records_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut h = durable_harness(dir.path());
    let mut answer = save(&mut h, "web", Some(serde_json::json!({})), None);
    h.state
        .registry()
        .unwrap()
        .fail_commits
        .store(true, Ordering::Relaxed);
    assert!(h.state.commit_turn().is_err());
    let error = answer.try_recv().unwrap().unwrap_err();
    assert!(error.contains("failure injected"), "{error}");
    let registry = h.state.registry().unwrap();
    registry.fail_commits.store(false, Ordering::Relaxed);
    assert!(registry.load().unwrap().jobs.is_empty());
}

#[test]
fn without_a_registry_a_job_save_is_answered_at_once() {
    let mut h = Harness::new();
    let mut answer = save(&mut h, "web", Some(serde_json::json!({})), None);
    assert_eq!(answer.try_recv().unwrap(), Ok(()));
}
