//! The `ringmaster` command line. Thin: parse arguments, call the library, print, set the exit code.
//!
//! Exit codes: 0 success; 2 bad input (arguments, config or scenario), with one line on stderr
//! naming the file, line and field.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use ringmaster::placement::PlacerKind;

#[derive(Debug, Parser)]
#[command(name = "ringmaster", version, about = "Ringmaster cluster manager")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Dry-run placement: where would a scenario's requests go? One JSON object per line.
    Place(PlaceArgs),
}

#[derive(Debug, Args)]
struct PlaceArgs {
    /// Scenario YAML: agents, frameworks, requests (and optionally rings).
    #[arg(long, value_name = "FILE")]
    scenario: PathBuf,
    /// Master config YAML (placer and rings); defaults apply without it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Placer overriding the config's: ring, linear-best-fit or first-fit.
    #[arg(long, value_name = "NAME")]
    placer: Option<PlacerKind>,
}

/// Exit code for input the user must fix (same as clap's usage errors).
const BAD_INPUT: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Place(args) => {
            match ringmaster::dry_run::place(&args.scenario, args.config.as_deref(), args.placer) {
                Ok(lines) => {
                    let mut out = std::io::stdout().lock();
                    for line in lines {
                        if writeln!(out, "{line}").is_err() {
                            break; // stdout closed (e.g. piped into head): nothing more to say
                        }
                    }
                    ExitCode::SUCCESS
                }
                Err(err) => {
                    eprintln!("error: {err}");
                    ExitCode::from(BAD_INPUT)
                }
            }
        }
    }
}
