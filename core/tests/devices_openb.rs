//! The openb trace (testdata/openb, both files whole) maps onto agent and task resources with
//! GPU devices with no loss: every field of every row is recovered from the mapping.

use ringmaster_core::devices::{DeviceRequest, DeviceState, GpuDemand};
use ringmaster_core::placement::devices::{openb_node, openb_task};

fn rows(file: &str) -> Vec<csv::StringRecord> {
    let path = format!("{}/../testdata/openb/{file}", env!("CARGO_MANIFEST_DIR"));
    let mut reader = csv::Reader::from_path(&path).unwrap();
    reader.records().map(|r| r.unwrap()).collect()
}

#[test]
fn every_openb_node_maps_without_loss() {
    let nodes = rows("openb_node_list_all_node.csv");
    assert_eq!(nodes.len(), 1523);
    let (mut gpu_nodes, mut gpus) = (0, 0);
    for row in &nodes {
        let cpu_milli: u64 = row[1].parse().unwrap();
        let memory_mib: u64 = row[2].parse().unwrap();
        let gpu: u32 = row[3].parse().unwrap();
        let model = &row[4];
        let (resources, devices) = openb_node(cpu_milli, memory_mib, gpu, model).unwrap();
        assert_eq!(resources.milli("cpus"), cpu_milli, "{row:?}");
        assert_eq!(resources.milli("mem"), memory_mib * 1000, "{row:?}");
        assert_eq!(devices.len() as u32, gpu, "{row:?}");
        assert!(devices.iter().all(|d| d.model == model), "{row:?}");
        assert_eq!(resources.milli("gpu_milli"), u64::from(gpu) * 1_000_000);
        // The node's devices, all free, serve a whole-node GPU request and nothing more.
        let state = DeviceState::new(devices).unwrap();
        if gpu > 0 {
            gpu_nodes += 1;
            gpus += gpu;
            let all = DeviceRequest {
                demand: GpuDemand::Whole { count: gpu },
                models: vec![model.to_string()],
            };
            assert!(state.fits(&all) && state.packed().unwrap().fits(&all));
            let more = DeviceRequest {
                demand: GpuDemand::Whole { count: gpu + 1 },
                models: vec![],
            };
            assert!(!state.fits(&more));
        }
    }
    // The figures of SPEC "Comparing with the ATC'23 paper".
    assert_eq!((gpu_nodes, gpus), (1213, 6212));
}

#[test]
fn every_openb_task_maps_without_loss() {
    let tasks = rows("openb_pod_list_default.csv");
    assert_eq!(tasks.len(), 8152);
    let mut shared = 0;
    for row in &tasks {
        let cpu_milli: u64 = row[1].parse().unwrap();
        let memory_mib: u64 = row[2].parse().unwrap();
        let num_gpu: u32 = row[3].parse().unwrap();
        let gpu_milli: u32 = row[4].parse().unwrap();
        let gpu_spec = &row[5];
        let (resources, request) =
            openb_task(cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec).unwrap();
        assert_eq!(resources.milli("cpus"), cpu_milli, "{row:?}");
        assert_eq!(resources.milli("mem"), memory_mib * 1000, "{row:?}");
        let (back_num, back_milli, back_spec) = match &request {
            None => (0, 0, String::new()),
            Some(r) => {
                let spec = r.models.join("|");
                match r.demand {
                    GpuDemand::Whole { count } => (count, 1000, spec),
                    GpuDemand::Slice { share, memory_mib } => {
                        assert_eq!(memory_mib, 0);
                        shared += 1;
                        (1, share, spec)
                    }
                }
            }
        };
        assert_eq!(
            (back_num, back_milli, back_spec.as_str()),
            (num_gpu, gpu_milli, gpu_spec)
        );
        // The canonical scalars give the same request back (what the agent does).
        let models = request
            .as_ref()
            .map(|r| r.models.clone())
            .unwrap_or_default();
        assert_eq!(
            DeviceRequest::from_scalars(&resources, models).unwrap(),
            request,
            "{row:?}"
        );
    }
    assert!(shared > 3000, "{shared} shared-GPU tasks");
}

#[test]
fn openb_specs_and_unmappable_rows() {
    let (_, r) = openb_task(1000, 10, 1, 500, "V100M16|V100M32").unwrap();
    assert_eq!(r.unwrap().models, ["V100M16", "V100M32"]);
    assert!(openb_task(1000, 10, 2, 500, "").is_err());
    assert!(openb_task(1000, 10, 0, 500, "").is_err());
    assert!(openb_task(1000, 10, 0, 0, "T4").is_err());
    let (_, d) = openb_node(1000, 10, 2, "V100M32").unwrap();
    assert_eq!(d[1].memory_mib, 32768);
    let (_, d) = openb_node(1000, 10, 1, "T4").unwrap();
    assert_eq!(d[0].memory_mib, 0);
}
