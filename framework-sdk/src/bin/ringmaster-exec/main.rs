//! `ringmaster-exec`: run a shell command as N tasks on a Ringmaster cluster.
//!
//! A command-line framework built on the SDK's public API: [`exec`] is the plain mode (one
//! command as N tasks), [`batch`] the `--batch FILE` mode, [`report`] the exit codes and state
//! lines both print. Unit tests live with each module; `framework-sdk/tests/exec*.rs` run the
//! binary against the SDK's fake master.

mod batch;
mod exec;
mod interrupt;
mod logs;
mod report;
mod state_file;
mod waiting;

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::Parser;
use exec::{run_exec, ExecArgs};
use report::EXIT_FAILURE;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    let args = ExecArgs::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("ringmaster-exec: cannot start the async runtime: {e}");
            return ExitCode::from(EXIT_FAILURE as u8);
        }
    };
    let code = runtime.block_on(run_exec(args, std::io::stdout()));
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
