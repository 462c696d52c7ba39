//! `ringmaster-agent`: the agent daemon binary. All behaviour lives in the `ringmaster-agent`
//! library so that `ringmaster local` can run the very same code in-process.

use std::io::IsTerminal as _;
use std::process::ExitCode;

use clap::Parser as _;
use ringmaster_agent::AgentArgs;

fn main() -> ExitCode {
    let args = AgentArgs::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("ringmaster-agent: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(ringmaster_agent::main_with_args(args))
}
