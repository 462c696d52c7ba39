
#[tokio::test]
async fn log_entries_too_large_for_a_frame_are_sent_in_fewer_per_request() {
    use openraft::{CommittedLeaderId, Entry, EntryPayload, LogId};
    let max_frame = 64 * 1024;
    let mut network = TcpNetwork::new(1, ClientSecurity::default(), max_frame);
    // Nobody listens: the size check comes before connecting.
    let mut client = network.new_client(2, &"127.0.0.1:1".to_string()).await;
    let big = |index| {
        let mut batch = batch_adding("big");
        batch.jobs = vec![(
            "web".into(),
            Some(serde_json::json!({ "blob": "x".repeat(40 * 1024) })),
        )];
        Entry {
            log_id: LogId::new(CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(batch),
        }
    };
    let request = |entries| openraft::raft::AppendEntriesRequest {
        vote: Vote::new_committed(1, 1),
        prev_log_id: None,
        leader_commit: None,
        entries,
    };
    let option = || openraft::network::RPCOption::new(Duration::from_millis(500));
    let error = client
        .append_entries(request(vec![big(1), big(2), big(3), big(4)]), option())
        .await
        .unwrap_err();
    match error {
        openraft::error::RPCError::PayloadTooLarge(too_large) => {
            assert_eq!(too_large.entries_hint(), 2)
        }
        other => panic!("expected PayloadTooLarge, got {other:?}"),
    }
    let error = client
        .append_entries(request(vec![big(1), big(2)]), option())
        .await
        .unwrap_err();
    assert!(
        matches!(error, openraft::error::RPCError::PayloadTooLarge(_)),
        "{error:?}"
    );
    // One entry larger than a frame cannot be split: an error naming the limit.
    let mut huge = big(1);
    if let EntryPayload::Normal(batch) = &mut huge.payload {
        batch.jobs[0].1 = Some(serde_json::json!({ "blob": "x".repeat(100 * 1024) }));
    }
    let error = client
        .append_entries(request(vec![huge]), option())
        .await
        .unwrap_err();
    assert!(
        error.to_string().contains("master.max_frame_bytes"),
        "{error}"
    );
}
