//! Layering rules that the compiler does not enforce inside one crate (issue 44): the simulator
//! is a user of the core, so it takes the core's types from the core, never through the wire
//! crate's re-exports (which would tie the simulator to the protocol's version of them).

use std::path::Path;

/// Every `.rs` file under `dir`, with its text.
fn sources(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push((
                path.display().to_string(),
                std::fs::read_to_string(&path).unwrap(),
            ));
        }
    }
    out
}

#[test]
fn the_simulator_takes_nothing_from_the_wire_crate() {
    let sim = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/sim");
    let offenders: Vec<String> = sources(&sim)
        .into_iter()
        .filter(|(_, text)| text.contains("ringmaster_proto"))
        .map(|(path, _)| path)
        .collect();
    assert!(
        offenders.is_empty(),
        "the simulator imports from ringmaster_proto (take it from ringmaster_core): {offenders:?}"
    );
}
