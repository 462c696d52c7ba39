//! Where a task runs: `<work_dir>/sandboxes/<framework_id>/<task_id>`.
//!
//! Ids come from frameworks over the network, so they are escaped before they become path
//! components: a task id like `../../etc` must never leave the sandbox tree.

use std::path::{Path, PathBuf};

/// Escapes an id into one safe path component. Letters, digits, `-`, `_` and `.` stay as they
/// are, except a leading `.` (no `.`, `..` or hidden names); every other byte becomes `%XX`.
/// The empty id becomes `%`, which no non-empty id escapes to. Distinct ids stay distinct.
pub fn escape_component(id: &str) -> String {
    if id.is_empty() {
        return "%".to_string();
    }
    let mut out = String::with_capacity(id.len());
    for (i, byte) in id.bytes().enumerate() {
        let plain = byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_' || byte == b'.';
        if plain && !(i == 0 && byte == b'.') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// The sandbox directory of one task (not created).
pub fn sandbox_dir(work_dir: &Path, framework_id: &str, task_id: &str) -> PathBuf {
    work_dir
        .join("sandboxes")
        .join(escape_component(framework_id))
        .join(escape_component(task_id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Component;

    #[test]
    fn plain_ids_are_kept() {
        assert_eq!(escape_component("web-1_a.b"), "web-1_a.b");
        assert_eq!(
            sandbox_dir(Path::new("/w"), "fw", "t1"),
            PathBuf::from("/w/sandboxes/fw/t1")
        );
    }

    #[test]
    fn hostile_ids_stay_inside_the_sandbox_tree() {
        for id in [
            "..",
            ".",
            "../../etc",
            "/abs",
            "a/b",
            ".hidden",
            "",
            "a b",
            "é",
        ] {
            let escaped = escape_component(id);
            let path = Path::new(&escaped);
            let components: Vec<_> = path.components().collect();
            assert_eq!(components.len(), 1, "{id:?} -> {escaped:?}");
            assert!(
                matches!(components[0], Component::Normal(_)),
                "{id:?} -> {escaped:?}"
            );
            assert!(!escaped.starts_with('.'), "{id:?} -> {escaped:?}");
        }
        assert_eq!(escape_component("../x"), "%2E.%2Fx");
        assert_eq!(escape_component(""), "%");
        assert_ne!(escape_component("a/b"), escape_component("a%2Fb"));
    }
}
