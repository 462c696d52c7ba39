//! GPU devices through the master over real TCP (docs/devices.md): agents register their
//! devices, the allocator offers only agents with a device that can hold the demand (not just
//! enough GPU in sum), Accept binds exact devices with the configured policy and sends them in
//! `TaskInfo.devices`, ended tasks give their devices back, and /state shows the bindings.

mod common;

use common::*;
use ringmaster_proto::convert::BindingWire;
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

/// The id of the first offer of agent `want`; offers of other agents are declined (refused for
/// a minute).
async fn offer_of(fw: &mut Client, want: &str) -> String {
    loop {
        let mut chosen = None;
        for offer in fw.expect_offers().await {
            if offer.agent_id == want && chosen.is_none() {
                chosen = Some(offer.offer_id.clone());
            } else {
                fw.decline(&offer.offer_id, 60.0).await;
            }
        }
        if let Some(id) = chosen {
            return id;
        }
    }
}

/// Launches `tasks` on agent `want` through a fresh framework: offers of other agents are
/// declined (refused for a minute) until one of `want` comes; the demand is withdrawn before
/// the Accept so no further offer holds an agent.
async fn launch_on(
    master: &ringmaster::master::Master,
    agent: &mut Client,
    want: &str,
    tasks: &[&str],
) {
    let mut fw = Client::framework(master.addr(), &format!("setup-{want}")).await;
    fw.demand(tasks[0], 1).await;
    let offer_id = offer_of(&mut fw, want).await;
    fw.demand(tasks[0], 0).await;
    let infos = tasks
        .iter()
        .enumerate()
        .map(|(i, r)| task(&format!("{want}-{i}"), r, "sleep 60"))
        .collect();
    fw.accept(&offer_id, infos).await;
    assert_eq!(agent.expect_run().await.len(), tasks.len());
}

/// Two agents that look the same to the rings (cpus 6, 1000 milli-GPU free; the scalar `gpus`
/// counts devices and stays 2) after two launches each, but with GPUs free [600, 400] (`uneven`) and [500, 500]
/// (`even`). The master has learned shapes 0.4 ×2 (one pending), 0.5 ×2, 0.6 ×1. A 0.4 task
/// on `uneven` (spread: onto the 600 GPU) leaves [200, 400]: the expected fragment grows by
/// 1000; on `even` it leaves [100, 500]: no growth. Returns the agent offered the 0.4 demand.
async fn offered_for_a_fifth_of_a_gpu(candidates: usize, uneven: &str, even: &str) -> String {
    let mut config = test_config("");
    let mut rings = config.rings.clone();
    rings.set_search(
        ringmaster_core::placement::RingSearch::new(vec!["gpus".into()], candidates).unwrap(),
    );
    config.rings = rings;
    let master = start_master(config).await;
    let mut a = Client::agent(master.addr(), "a", "cpus:8;mem:4096;gpus:2x16384").await;
    let mut b = Client::agent(master.addr(), "b", "cpus:8;mem:4096;gpus:2x16384").await;
    let (uneven_agent, even_agent) = if uneven == "a" {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };
    let small = "cpus:1;gpu_milli:400";
    launch_on(
        &master,
        uneven_agent,
        uneven,
        &[small, "cpus:1;gpu_milli:600"],
    )
    .await;
    let half = "cpus:1;gpu_milli:500";
    launch_on(&master, even_agent, even, &[half, half]).await;
    let s = wait_for_state(&master, "both agents used", |s| s.tasks.len() == 4).await;
    let free: Vec<&str> = s.agents.iter().map(|a| a.free.as_str()).collect();
    assert_eq!(free[0], free[1], "the rings see two equal agents");
    assert_eq!(
        free[0],
        "cpus:6;gpu_mem:32768;gpu_milli:1000;gpus:2;mem:4096"
    );
    let mut fw = Client::framework(master.addr(), "small").await;
    fw.demand(small, 1).await;
    let offers = fw.expect_offers().await;
    assert_eq!(offers.len(), 1);
    offers[0].agent_id.clone()
}

#[tokio::test]
async fn ring_tie_break_avoids_stranding_a_gpu_share_of_the_learned_workload() {
    // With the default tie-break the master offers the agent that strands nothing, whichever
    // of the two it is.
    assert_eq!(offered_for_a_fifth_of_a_gpu(16, "a", "b").await, "b");
    assert_eq!(offered_for_a_fifth_of_a_gpu(16, "b", "a").await, "a");
    // Without it, the ring cannot tell them apart: it takes the same agent in both layouts,
    // so in one of them the one that strands a share.
    let blind = offered_for_a_fifth_of_a_gpu(1, "a", "b").await;
    assert_eq!(offered_for_a_fifth_of_a_gpu(1, "b", "a").await, blind);
}

/// Packed (`most-used-that-fits`), the master binds a GPU slice where the expected slices can
/// still fill what it leaves (the share fill of its learned target, docs/devices.md), not by
/// best fit. The master has learned 0.32, 0.47 (on agent b) and 0.65 (on agent a, whose GPUs
/// are then free [350, 1000]); a 0.23 on a's 350 would leave 120 that no sum of those sizes
/// fills (30 was unfillable before: +90), on the whole GPU 770 = 230 + 470 + 70 (+70).
#[tokio::test]
async fn packed_slices_go_where_the_learned_slices_can_fill_the_rest() {
    let mut config = test_config("");
    config.devices.selection = DeviceSelection::MostUsedThatFits;
    let master = start_master(config).await;
    let mut a = Client::agent(master.addr(), "a", "cpus:8;mem:4096;gpus:2x16384").await;
    let mut b = Client::agent(master.addr(), "b", "cpus:8;mem:4096;gpus:2x16384").await;
    launch_on(
        &master,
        &mut b,
        "b",
        &["cpus:1;gpu_milli:320", "cpus:1;gpu_milli:470"],
    )
    .await;
    launch_on(&master, &mut a, "a", &["cpus:1;gpu_milli:650"]).await;
    let s = wait_for_state(&master, "three launched", |s| s.tasks.len() == 3).await;
    assert!(s
        .agents
        .iter()
        .any(|x| x.id == "a" && x.free.contains("gpu_milli:1350")));

    let slice = "cpus:1;gpu_milli:230";
    let mut fw = Client::framework(master.addr(), "slice").await;
    fw.demand(slice, 1).await;
    let offer_id = offer_of(&mut fw, "a").await;
    fw.demand(slice, 0).await;
    fw.accept(&offer_id, vec![task("s", slice, "true")]).await;
    let run = a.expect_run().await;
    // Best fit would have bound GPU 0 ("gpu:0:230:0").
    assert_eq!(run.iter().map(bound).collect::<Vec<_>>(), ["gpu:1:230:0"]);
}
