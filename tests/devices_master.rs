//! GPU devices through the master over real TCP (docs/devices.md): agents register their
//! devices, the allocator offers only agents with a device that can hold the demand (not just
//! enough GPU in sum), Accept binds exact devices with the configured policy and sends them in
//! `TaskInfo.devices`, ended tasks give their devices back, and /state shows the bindings.

mod common;

use common::*;
use ringmaster_proto::devices::{DeviceBinding, DeviceSelection};
use ringmaster_proto::{ErrorCode, TaskState};

fn bound(task: &ringmaster_proto::TaskInfo) -> String {
    DeviceBinding::from_wire(&task.devices).unwrap().to_string()
}

#[tokio::test]
async fn devices_filter_offers_and_bind_tasks() {
    let master = start_master(test_config("")).await;
    let mut a = Client::agent(master.addr(), "a", "cpus:8;mem:4096;gpus:2x16384").await;
    let mut fw = Client::framework(master.addr(), "gpu").await;
    fw.demand("cpus:1;gpu_milli:600", 2).await;
    let offers = fw.expect_offers().await;
    assert_eq!(offers[0].agent_id, "a");
    // The ring search ran on the GPU share ring (the demand's dominant dimension).
    let placement = offers[0].placement.as_ref().unwrap();
    assert_eq!(
        (placement.dimension.as_str(), placement.phase.as_str()),
        ("gpu_milli", "down")
    );
    assert_eq!(
        offered(&offers[0]).to_string(),
        "cpus:8;gpu_mem:32768;gpu_milli:2000;gpus:2;mem:4096"
    );
    // The offer names the devices and what each has free.
    assert_eq!(offers[0].devices.len(), 2);
    let free: Vec<(u32, u32)> = offers[0]
        .free_devices
        .iter()
        .map(|d| (d.index, d.milli))
        .collect();
    assert_eq!(free, [(0, 1000), (1, 1000)]);
    fw.accept(
        &offers[0].offer_id,
        vec![
            task("t1", "cpus:1;gpu_milli:600", "true"),
            task("t2", "cpus:1;gpu_milli:600", "true"),
        ],
    )
    .await;
    // Spread (the default): one task per device.
    let run = a.expect_run().await;
    let bindings: Vec<String> = run.iter().map(bound).collect();
    assert_eq!(bindings, ["gpu:0:600:0", "gpu:1:600:0"]);
    let s = wait_for_state(&master, "bindings shown", |s| s.tasks.len() == 2).await;
    let t1 = s.tasks.iter().find(|t| t.id == "t1").unwrap();
    assert_eq!(t1.devices, ["gpu:0:600:0"]);
    assert_eq!(
        s.agents[0].free,
        "cpus:6;gpu_mem:32768;gpu_milli:800;gpus:2;mem:4096"
    );

    // 800 milli-GPU free in sum, but no device has 600: agent b gets the offer although best
    // fit by the gpu_milli sum alone would pick a.
    let _b = Client::agent(master.addr(), "b", "cpus:4;mem:64;gpus:2x32768@V100M32").await;
    fw.demand("cpus:1;gpu_milli:600", 1).await;
    let offers = fw.expect_offers().await;
    assert_eq!(offers.len(), 1);
    assert_eq!(offers[0].agent_id, "b", "{offers:?}");
    // 600 + 600 + 700 fit b's 2000 in sum but not its two devices: the Accept is refused.
    fw.accept(
        &offers[0].offer_id,
        vec![
            task("t3", "cpus:1;gpu_milli:600", "true"),
            task("t4", "cpus:1;gpu_milli:600", "true"),
            task("t5", "cpus:1;gpu_milli:700", "true"),
        ],
    )
    .await;
    let e = fw.expect_error().await;
    assert_eq!(e.code, ErrorCode::InvalidTask as i32);
    assert!(
        e.message.contains("task t5: no GPU of agent b"),
        "{}",
        e.message
    );

    // t1 ends: device 0 is free again, and a fits the demand.
    a.report(&run[0], TaskState::TaskFinished, "u1").await;
    fw.expect_state("t1", TaskState::TaskFinished).await;
    wait_for_state(&master, "device 0 returned", |s| {
        s.agents.iter().any(|ag| {
            ag.id == "a" && ag.free == "cpus:7;gpu_mem:32768;gpu_milli:1400;gpus:2;mem:4096"
        })
    })
    .await;
}

#[tokio::test]
async fn whole_gpus_hold_their_memory_and_pack_policy_shares_devices() {
    let mut config = test_config("");
    config.devices.selection = DeviceSelection::MostUsedThatFits;
    let master = start_master(config).await;
    let mut a = Client::agent(master.addr(), "a", "cpus:8;gpus:3x16384").await;
    let mut fw = Client::framework(master.addr(), "gpu").await;
    fw.demand("cpus:1;gpu_milli:500", 1).await;
    let offers = fw.expect_offers().await;
    let mut whole = task("w", "cpus:1;gpus:1", "true");
    whole.gpu_models = vec![];
    fw.accept(
        &offers[0].offer_id,
        vec![
            task("h1", "cpus:1;gpu_milli:500", "true"),
            task("h2", "cpus:1;gpu_milli:500", "true"),
            task("h3", "cpus:1;gpu_milli:500", "true"),
            whole,
        ],
    )
    .await;
    let run = a.expect_run().await;
    let bindings: Vec<String> = run.iter().map(bound).collect();
    // Pack: two halves share device 0, the third goes to device 1, the whole GPU takes 2.
    assert_eq!(
        bindings,
        [
            "gpu:0:500:0",
            "gpu:0:500:0",
            "gpu:1:500:0",
            "gpu:2:1000:16384"
        ]
    );
    let s = wait_for_state(&master, "launched", |s| s.tasks.len() == 4).await;
    // The whole GPU's memory is held too, so the gpu_mem sum stays true. The `gpus` scalar only
    // counts whole-GPU tasks (3 − 1), an upper bound on the entirely free devices; the device
    // book is exact (docs/devices.md).
    assert_eq!(
        s.agents[0].free,
        "cpus:4;gpu_mem:32768;gpu_milli:500;gpus:2"
    );
    // A model the agent does not have is refused at accept.
    fw.demand("gpu_milli:100", 1).await;
    let offers = fw.expect_offers().await;
    let mut picky = task("p", "gpu_milli:100", "true");
    picky.gpu_models = vec!["A100".into()];
    fw.accept(&offers[0].offer_id, vec![picky]).await;
    let e = fw.expect_error().await;
    assert!(e.message.contains("no GPU of agent a"), "{}", e.message);
}
