use super::*;

fn gpus(spec: &[(u64, &str)]) -> Vec<Device> {
    spec.iter()
        .enumerate()
        .map(|(i, (mem, model))| Device {
            index: i as u32,
            model: model.to_string(),
            memory_mib: *mem,
        })
        .collect()
}

fn slice(share: u32, memory_mib: u64) -> DeviceRequest {
    DeviceRequest {
        demand: GpuDemand::Slice { share, memory_mib },
        models: vec![],
    }
}

#[test]
fn parses_task_text_into_canonical_scalars() {
    let (s, r) = parse_task_resources("cpus:1;mem:64;gpu_milli:500").unwrap();
    assert_eq!(s.to_string(), "cpus:1;gpu_milli:500;mem:64");
    assert_eq!(
        r.unwrap().demand,
        GpuDemand::Slice {
            share: 500,
            memory_mib: 0
        }
    );
    let (s, r) = parse_task_resources("gpus:2;gpu_model:V100M16|V100M32").unwrap();
    assert_eq!(s.to_string(), "gpus:2");
    let r = r.unwrap();
    assert_eq!(r.demand, GpuDemand::Whole { count: 2 });
    assert_eq!(r.models, ["V100M16", "V100M32"]);
    assert_eq!(
        DeviceRequest::from_scalars(&s, r.models.clone()).unwrap(),
        Some(r)
    );
    let (s, r) = parse_task_resources("gpu_mem:8192").unwrap();
    assert_eq!(s.to_string(), "gpu_mem:8192");
    assert_eq!(DeviceRequest::from_scalars(&s, vec![]).unwrap(), r);
    assert_eq!(parse_task_resources("cpus:1").unwrap().1, None);
}

#[test]
fn refuses_ambiguous_task_text_saying_why() {
    let cases = [
        ("gpus:1;gpu_milli:500", "either whole GPUs or a slice"),
        ("gpus:1.5", "not a whole number of devices"),
        ("gpu_milli:1500", "at most 1000"),
        ("gpu_milli:0.5", "whole numbers"),
        ("gpu_model:V100", "without any GPU amount"),
        ("gpu_milli:1;gpu_model:a b", "not a model name"),
        ("gpus:1;gpu_mem:100", "either whole GPUs"),
    ];
    for (text, expected) in cases {
        let err = parse_task_resources(text).unwrap_err().to_string();
        assert!(err.contains(expected), "{text}: {err}");
    }
}

#[test]
fn parses_agent_devices() {
    let (s, d) = parse_agent_resources("cpus:8;gpus:2x16384@V100M16+1x32768").unwrap();
    assert_eq!(s.to_string(), "cpus:8;gpu_mem:65536;gpu_milli:3000;gpus:3");
    assert_eq!(d.len(), 3);
    assert_eq!(
        (d[2].index, d[2].memory_mib, d[2].model.as_str()),
        (2, 32768, "")
    );
    assert_eq!(d[0].model, "V100M16");
    let (s, d) = parse_agent_resources("cpus:1;gpus:2").unwrap();
    assert!(d.is_empty());
    assert_eq!(s.milli("gpus"), 2000);
    for (text, expected) in [
        ("gpus:2x", "not a whole number of MiB"),
        ("gpus:0x10", "count of 0"),
        ("gpus:ax10", "whole device count"),
        ("gpus:1x10;gpu_milli:5", "device list says it all"),
        ("gpus:1x10@", "empty model"),
        ("gpus:200x1", "more than 128"),
    ] {
        let err = parse_agent_resources(text).unwrap_err().to_string();
        assert!(err.contains(expected), "{text}: {err}");
    }
}

#[test]
fn selection_spreads_or_packs_with_exact_indices() {
    let devices = gpus(&[(16384, "A"), (16384, "A"), (16384, "A"), (32768, "B")]);
    let state = DeviceState::with_free(
        devices,
        vec![300, 700, 1000, 600],
        vec![16384; 3].into_iter().chain([32768]).collect(),
    )
    .unwrap();
    let pick = |r: &DeviceRequest, p| {
        state
            .select(r, p)
            .map(|b| b.devices.iter().map(|d| d.index).collect::<Vec<_>>())
    };
    use DeviceSelection::*;
    assert_eq!(pick(&slice(250, 0), LeastUsed), Some(vec![2]));
    assert_eq!(pick(&slice(250, 0), MostUsedThatFits), Some(vec![0]));
    assert_eq!(pick(&slice(500, 0), MostUsedThatFits), Some(vec![3]));
    assert_eq!(pick(&slice(800, 0), MostUsedThatFits), Some(vec![2]));
    assert_eq!(pick(&slice(100, 20000), LeastUsed), Some(vec![3]));
    let whole = |count, models: &[&str]| DeviceRequest {
        demand: GpuDemand::Whole { count },
        models: models.iter().map(|m| m.to_string()).collect(),
    };
    assert_eq!(pick(&whole(1, &[]), LeastUsed), Some(vec![2]));
    assert_eq!(pick(&whole(2, &[]), LeastUsed), None);
    assert_eq!(pick(&whole(1, &["B"]), LeastUsed), None);
    let mut b_only = slice(500, 0);
    b_only.models = vec!["B".into()];
    assert_eq!(pick(&b_only, LeastUsed), Some(vec![3]));
}

#[test]
fn two_half_gpu_tasks_share_a_device_and_a_third_goes_elsewhere() {
    let mut state = DeviceState::new(gpus(&[(16384, ""), (16384, "")])).unwrap();
    let half = slice(500, 0);
    let mut indices = Vec::new();
    for _ in 0..3 {
        let b = state
            .select(&half, DeviceSelection::MostUsedThatFits)
            .unwrap();
        state.check_binding(&half, &b).unwrap();
        state.bind(&b).unwrap();
        indices.push(b.devices[0].index);
    }
    assert_eq!(indices, [0, 0, 1]);
    assert_eq!(state.free_share(), [0, 500]);
    let b = DeviceBinding::parse("gpu:0:500:0").unwrap();
    assert!(state
        .bind(&b)
        .unwrap_err()
        .to_string()
        .contains("has 0 milli-GPU"));
    state.release(&b);
    assert_eq!(state.free_share(), [500, 500]);
    assert_eq!(
        state.free_scalars().to_string(),
        "gpu_mem:32768;gpu_milli:1000"
    );
    state.release(&DeviceBinding::parse("gpu:0:500:0").unwrap());
    assert_eq!(
        state.free_scalars().to_string(),
        "gpu_mem:32768;gpu_milli:1500;gpus:1"
    );
}

#[test]
fn binding_text_round_trips_and_bad_text_is_refused() {
    let b = DeviceBinding {
        devices: vec![
            BoundDevice {
                index: 0,
                share: 1000,
                memory_mib: 16384,
            },
            BoundDevice {
                index: 3,
                share: 1000,
                memory_mib: 16384,
            },
        ],
    };
    assert_eq!(b.to_string(), "gpu:0:1000:16384,gpu:3:1000:16384");
    assert_eq!(b.cuda_visible_devices(), "0,3");
    assert_eq!(DeviceBinding::parse(&b.to_string()).unwrap(), b);
    assert!(DeviceBinding::parse("gpu:x:1:1").is_err());
    assert!(DeviceBinding::parse("fpga:0:1:1").is_err());
}

#[test]
fn packed_word_is_the_seed_sum_and_refuses_what_does_not_fit() {
    let layout = LaneLayout::new(10, 4, 64).unwrap();
    let packed = PackedLanes::encode(layout, &[1000, 500, 0, 1]).unwrap();
    assert_eq!(packed.word(), 1000 | 500 << 10 | 1 << 30);
    assert_eq!(packed.decode(), [1000, 500, 0, 1]);
    assert_eq!(packed.count_at_least(500), 2);
    assert_eq!(packed.lanes_at_least(1), 0b1011);
    assert!(LaneLayout::new(10, 7, 64)
        .unwrap_err()
        .to_string()
        .contains("70 bits"));
    assert!(LaneLayout::new(0, 1, 64).is_err());
    assert!(LaneLayout::new(8, 1, 32).is_err());
    let err = PackedLanes::encode(layout, &[1024]).unwrap_err();
    assert_eq!(
        err,
        DeviceError::ValueTooWide {
            lane: 0,
            value: 1024,
            bits: 10
        }
    );
    assert!(PackedLanes::encode(layout, &[0; 5]).is_err());
    // Eight 80 GiB devices need 17-bit memory lanes: 136 bits do not fit.
    let big = DeviceState::new(gpus(&[(81920, ""); 8])).unwrap();
    assert!(big.packed().unwrap_err().to_string().contains("136 bits"));
}
