//! GPU devices end to end over the real binaries: `ringmaster serve` (pack policy), a
//! `ringmaster-agent` with two fake 16 GiB GPUs from `--resources`, and `ringmaster-exec`
//! running three `gpu_milli:500` tasks at once: two share device 0, the third gets device 1,
//! and each task sees its binding in `CUDA_VISIBLE_DEVICES` and `RINGMASTER_DEVICES`.

mod processes;

use processes::*;

#[test]
fn half_gpu_tasks_see_their_devices() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("master.yaml");
    std::fs::write(
        &config,
        "master:\n  allocation_interval: 5ms\n  heartbeat_interval: 200ms\n\
         devices:\n  selection: most-used-that-fits\n",
    )
    .unwrap();
    let (_master, addr, logs) = start_master(&config);
    let _agent = start_agent(
        &addr,
        "gpu-agent",
        "cpus:4;mem:1024;disk:100;gpus:2x16384",
        &dir.path().join("agent"),
    );
    wait_registered(&logs, &["gpu-agent"]);
    let seen = dir.path().join("seen");
    std::fs::create_dir_all(&seen).unwrap();
    // Tasks run as the agent's task user (`nobody` under root): they reach `seen` and write in it.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(&seen, std::fs::Permissions::from_mode(0o777)).unwrap();
    // Each task records what it sees, then waits (bounded) until all three have, so the three
    // hold their devices at the same time.
    let command = format!(
        "echo \"$CUDA_VISIBLE_DEVICES $RINGMASTER_DEVICES\" > {seen}/$RINGMASTER_TASK_ID; \
         for i in $(seq 100); do [ $(ls {seen} | wc -l) -ge 3 ] && exit 0; sleep 0.05; done; exit 1",
        seen = seen.display()
    );
    let (code, out) = exec(
        &addr,
        &[
            "--name",
            "half",
            "--resources",
            "cpus:1;mem:64;gpu_milli:500",
            "--instances",
            "3",
            "--",
            &command,
        ],
    );
    assert_eq!(code, 0, "{out}");
    let mut views: Vec<String> = (0..3)
        .map(|i| {
            std::fs::read_to_string(seen.join(format!("half-{i}")))
                .unwrap()
                .trim()
                .to_string()
        })
        .collect();
    views.sort();
    assert_eq!(
        views,
        ["0 gpu:0:500:0", "0 gpu:0:500:0", "1 gpu:1:500:0"],
        "{out}"
    );
}
