//! Issue 45, YAML bounds: every YAML text the components parse (the master's configuration,
//! the agent's config file, job specs) is refused past 64 levels of nesting before it is
//! parsed, with an error naming the file and line (the depth check's own error: the parser,
//! which took 15 s on a 100,000-deep document, never sees it).
//!
//! (The protocol bounds of issue 45 are tested where the server's internals can be observed:
//! `src/master/server/tests.rs` and `task.rs`.)

use std::path::Path;

use ringmaster::config::Config;
use ringmaster_proto::yaml_depth::MAX_DEPTH;

fn flow(depth: usize) -> String {
    format!("{}{}", "[".repeat(depth), "]".repeat(depth))
}

fn compact_block(depth: usize) -> String {
    format!("{}x\n", "- ".repeat(depth))
}

/// `a:` nested `depth` mappings deep, one space per level.
fn block(depth: usize) -> String {
    (0..depth)
        .map(|i| {
            format!(
                "{}{}",
                " ".repeat(i),
                if i + 1 == depth { "a: 1\n" } else { "a:\n" }
            )
        })
        .collect()
}

/// Runs `parse` on `text` and returns its error text.
fn refused<T, E: std::fmt::Display>(text: &str, parse: impl Fn(&str) -> Result<T, E>) -> String {
    match parse(text) {
        Ok(_) => panic!("a {}-byte deep document was accepted", text.len()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_100000_deep_master_config_is_refused_quickly_naming_the_line() {
    let text = format!(
        "master:\n  allocation_interval: 5ms\nrings:\n  {}\n",
        flow(100_000)
    );
    let error = refused(&text, |t| Config::from_yaml(t, "master.yaml"));
    assert!(
        error.starts_with("master.yaml:4: rings: nested more than 64 levels deep"),
        "{error}"
    );
    let error = refused(&compact_block(100_000), |t| {
        Config::from_yaml(t, "master.yaml")
    });
    assert!(error.starts_with("master.yaml:1:"), "{error}");
    let error = refused(&block(3_000), |t| Config::from_yaml(t, "master.yaml"));
    assert!(
        error.starts_with(&format!("master.yaml:{}:", MAX_DEPTH + 1)),
        "{error}"
    );
}

#[test]
fn depth_64_reaches_the_parser_and_65_does_not() {
    // 64 levels pass the depth check: the error is the config's own (an unknown key).
    let error = Config::from_yaml(&format!("x: {}\n", flow(MAX_DEPTH - 1)), "m.yaml")
        .unwrap_err()
        .to_string();
    assert!(!error.contains("nested more than"), "{error}");
    let error = Config::from_yaml(&format!("x: {}\n", flow(MAX_DEPTH)), "m.yaml")
        .unwrap_err()
        .to_string();
    assert!(error.contains("nested more than 64 levels"), "{error}");
}

#[test]
fn a_normal_master_config_still_loads() {
    let config = Config::from_yaml(
        "# comment [[[[\nmaster:\n  allocation_interval: 5ms\n  max_frame_bytes: 65536\n\
         limits: { burst: 7, messages_per_sec: 100 }\n",
        "master.yaml",
    )
    .unwrap();
    assert_eq!(config.limits.burst, 7);
    assert_eq!(config.master.max_frame_bytes, 65536);
}

#[test]
fn a_deep_agent_config_file_is_refused_quickly() {
    let text = format!("master: 127.0.0.1:5050\nresources: {}\n", flow(100_000));
    let error = refused(&text, |t| {
        ringmaster_agent::config_file::parse(t, "agent.yaml", Path::new("."))
    });
    assert!(
        error.starts_with("agent.yaml:2: resources: nested more"),
        "{error}"
    );
}

#[test]
fn a_deep_job_spec_is_refused_quickly() {
    let text = format!("name: deep\ntasks:\n  - {}\n", flow(100_000));
    let error = refused(&text, |t| {
        ringmaster::jobs::spec::parse_job_spec(t, "job.yaml")
    });
    assert!(
        error.starts_with("job.yaml:3: tasks[0]: nested more"),
        "{error}"
    );
    let error = refused(&block(3_000), |t| {
        ringmaster::jobs::spec::parse_job_spec(t, "job.yaml")
    });
    assert!(error.contains("nested more than 64"), "{error}");
}
