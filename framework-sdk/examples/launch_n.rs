//! A small scheduler: launch N copies of a command, one per offer slot, and exit when all of
//! them have finished.
//!
//! ```text
//! cargo run -p ringmaster-sdk --example launch_n -- 127.0.0.1:5050 4 'cpus:0.5;mem:64' 'sleep 1'
//! ```

use ringmaster_proto::convert::ResourcesWire;
use std::process::ExitCode;
use std::time::Duration;

use async_trait::async_trait;
use ringmaster_sdk::{run, task, Driver, FrameworkConfig, Offer, Resources, Scheduler, TaskStatus};

/// Launches `total` tasks of size `unit` and counts how they end.
struct LaunchN {
    unit: Resources,
    command: String,
    total: u32,
    launched: u32,
    finished: u32,
    failed: u32,
}

#[async_trait]
impl Scheduler for LaunchN {
    async fn registered(&mut self, driver: &Driver, framework_id: &str) {
        println!("registered as {framework_id}");
        let _ = driver.request(&self.unit, self.total - self.launched);
    }

    async fn offers(&mut self, driver: &Driver, offers: Vec<Offer>) {
        for offer in offers {
            let offered = Resources::from_wire(offer.resources.as_ref()).unwrap_or_default();
            let room = offered
                .copies_of(&self.unit)
                .min(u64::from(self.total - self.launched));
            if room == 0 {
                let _ = driver.decline(&[offer.offer_id], Duration::from_secs(5));
                continue;
            }
            let tasks = (self.launched..self.launched + room as u32)
                .map(|i| task(&format!("launch-n-{i}"), &self.command, &self.unit))
                .collect();
            self.launched += room as u32;
            let _ = driver.accept(&offer.offer_id, tasks);
        }
        let _ = driver.request(&self.unit, self.total - self.launched);
        if self.launched == self.total {
            let _ = driver.suppress();
        }
    }

    async fn status_update(&mut self, driver: &Driver, status: TaskStatus) {
        let state = status.state();
        println!("{} {}", status.task_id, state.short_name());
        // A task LOST with its agent may come back RUNNING: count only final states.
        if status.is_final() {
            if state == ringmaster_sdk::TaskState::TaskFinished {
                self.finished += 1;
            } else {
                self.failed += 1;
            }
        }
        if self.finished + self.failed == self.total {
            let _ = driver.stop();
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [master, count, resources, command] = args.as_slice() else {
        eprintln!("usage: launch_n MASTER COUNT RESOURCES COMMAND");
        return ExitCode::from(2);
    };
    let (Ok(total), Ok(unit)) = (count.parse::<u32>(), Resources::parse(resources)) else {
        eprintln!("launch_n: COUNT must be a whole number and RESOURCES like 'cpus:1;mem:128'");
        return ExitCode::from(2);
    };
    if total == 0 || unit.is_empty() {
        eprintln!("launch_n: COUNT must be at least 1 and RESOURCES must not be empty");
        return ExitCode::from(2);
    }
    let scheduler = LaunchN {
        unit,
        command: command.clone(),
        total,
        launched: 0,
        finished: 0,
        failed: 0,
    };
    match run(FrameworkConfig::new(master.as_str(), "launch-n"), scheduler).await {
        Ok(done) => {
            println!("{} finished, {} did not", done.finished, done.failed);
            if done.failed == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("launch_n: {e}");
            ExitCode::FAILURE
        }
    }
}
