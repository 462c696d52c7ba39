//! `ringmaster-stress` end to end, small: the fault run's ledger accounts for every task while
//! agents and frameworks (and, with `serve --work-dir`, the master) are killed and restarted,
//! and the fuzz run against a child master finds no panic. The full-size runs and their figures are in docs/reliability.md.

use std::path::PathBuf;
use std::process::Command;

/// `ringmaster serve` is a binary of the root package, which Cargo does not build for this
/// package's tests: it is found next to `ringmaster-stress` (same target directory), where
/// `cargo test --workspace` puts it.
fn master_bin() -> PathBuf {
    let stress = std::path::Path::new(env!("CARGO_BIN_EXE_ringmaster-stress"));
    let bin = stress.with_file_name(format!("ringmaster{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.is_file(),
        "{} is missing: the stress tests run the master binary of the root package; \
         build it first: cargo build --workspace (or run cargo test --workspace)",
        bin.display()
    );
    bin
}

/// A port for the child master whose successor (its HTTP port) is free too: picked by the
/// kernel, so parallel test runs do not collide on fixed ports. The stress tool binds them
/// again itself (and again after each master kill), so they are released here.
fn free_port_pair() -> String {
    loop {
        let first = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        let port = first.local_addr().unwrap().port();
        if port < u16::MAX && std::net::TcpListener::bind(("127.0.0.1", port + 1)).is_ok() {
            return port.to_string();
        }
    }
}

fn stress(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ringmaster-stress"))
        .args(args)
        .arg("--master-bin")
        .arg(master_bin())
        .output()
        .expect("ringmaster-stress runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The number after `key ` in the ledger line.
fn figure(text: &str, key: &str) -> u64 {
    let line = text
        .lines()
        .find(|l| l.starts_with("ledger:"))
        .unwrap_or_else(|| panic!("no ledger in\n{text}"));
    let at = line
        .find(&format!("{key} "))
        .unwrap_or_else(|| panic!("no {key} in {line}"));
    line[at + key.len() + 1..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after {key} in {line}"))
}

#[test]
fn fault_run_accounts_for_every_task() {
    let port = free_port_pair();
    let (ok, text) = stress(&[
        "faults",
        "--port",
        &port,
        "--agents",
        "60",
        "--frameworks",
        "4",
        "--tasks-per-framework",
        "20",
        "--task-lifetime",
        "200ms",
        "--duration",
        "4s",
        "--fault-every",
        "50ms",
        "--down-for",
        "500ms",
        "--drain",
        "40s",
    ]);
    assert!(ok, "{text}");
    assert_eq!(figure(&text, "unaccounted"), 0, "{text}");
    assert_eq!(figure(&text, "conflicting"), 0, "{text}");
    // Not vacuous: tasks did run through the faults.
    assert!(figure(&text, "launched") > 0, "{text}");
    assert!(figure(&text, "finished") > 0, "{text}");
    let kills = text
        .lines()
        .find(|l| l.starts_with("faults:"))
        .expect("a faults line");
    assert!(!kills.starts_with("faults: 0 agent kills"), "{text}");
}

#[test]
fn fuzz_run_against_a_child_master_finds_no_panic() {
    let port = free_port_pair();
    let (ok, text) = stress(&[
        "fuzz",
        "--port",
        &port,
        "--frames",
        "4000",
        "--connections",
        "8",
    ]);
    assert!(ok, "{text}");
    assert!(text.contains("panics in master stderr: 0"), "{text}");
}

#[test]
fn fault_run_with_master_kills_accounts_for_every_task() {
    let work = tempfile::tempdir().unwrap();
    let port = free_port_pair();
    let (ok, text) = stress(&[
        "faults",
        "--port",
        &port,
        "--agents",
        "40",
        "--frameworks",
        "3",
        "--tasks-per-framework",
        "20",
        "--task-lifetime",
        "200ms",
        "--duration",
        "5s",
        "--fault-every",
        "50ms",
        "--down-for",
        "500ms",
        "--drain",
        "60s",
        "--kill-master",
        "--master-kill-percent",
        "10",
        "--work-dir",
        work.path().to_str().unwrap(),
    ]);
    assert!(ok, "{text}");
    assert_eq!(figure(&text, "unaccounted"), 0, "{text}");
    assert_eq!(figure(&text, "conflicting"), 0, "{text}");
    let kills = text
        .lines()
        .find(|l| l.starts_with("faults:"))
        .expect("a faults line");
    assert!(!kills.contains(" 0 master kills"), "{text}");
}
